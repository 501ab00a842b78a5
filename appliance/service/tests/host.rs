//! The host adapter end to end: real threads, in-process pipes and Unix
//! sockets, with the fake engine.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::thread;

use kore_service::fake::{Behaviour, FakeCodec, FakeEngine};
use kore_service::host::{serve_unix, ServiceHandle, StdClock};
use kore_service::{Config, Service};
use serde_json::{json, Value};

fn spawn(behaviour: Behaviour) -> ServiceHandle {
    ServiceHandle::spawn(move || {
        Service::new(
            FakeEngine::new(behaviour, 1 << 20),
            FakeCodec,
            StdClock::new(),
            Config::default(),
        )
    })
    .expect("spawn service thread")
}

/// Reads events until the terminal one for `id`; returns all of them.
fn until_done(reader: &mut impl BufRead, id: &Value) -> Vec<Value> {
    let mut evs = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).expect("read");
        assert!(n > 0, "connection closed before the answer to {id}: {evs:?}");
        let ev: Value = serde_json::from_str(&line).expect("JSON line");
        let terminal = &ev["id"] == id && (ev.get("done").is_some() || ev.get("error").is_some());
        evs.push(ev);
        if terminal {
            return evs;
        }
    }
}

#[test]
fn in_process_pipe_round_trip_and_eof() {
    let handle = spawn(Behaviour::Echo);
    let mut pipe = handle.connect();
    pipe.write_all(b"{\"op\":\"info\",\"id\":0}\n{\"id\":1,\"prompt\":\"over a pipe\"}\n").unwrap();
    pipe.shutdown_write();
    let mut reader = BufReader::new(pipe);
    let evs = until_done(&mut reader, &json!(1));
    assert_eq!(evs[0]["info"]["model"], "fake");
    assert_eq!(evs.last().unwrap()["text"], "over a pipe");
    // After EOF and the last answer the service closes the connection.
    let mut rest = String::new();
    assert_eq!(reader.read_line(&mut rest).unwrap(), 0);
    handle.shutdown();
}

#[test]
fn twenty_concurrent_unix_clients_none_lost() {
    let dir = std::env::temp_dir().join(format!("kore-service-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("svc.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let handle = Arc::new(spawn(Behaviour::Echo));
    let server = Arc::clone(&handle);
    thread::spawn(move || serve_unix(listener, &server));
    let clients: Vec<_> = (0..20)
        .map(|i| {
            let path = path.clone();
            thread::spawn(move || {
                let mut s = UnixStream::connect(&path).unwrap();
                let req = json!({"id": i, "thinking": "off", "messages": [{"role":"user","content": format!("client {i} says hello")}]});
                // Garbage first: the connection must survive it.
                s.write_all(b"\x00\xffnot json\n").unwrap();
                s.write_all(format!("{req}\n").as_bytes()).unwrap();
                let mut r = BufReader::new(s);
                let mut first = String::new();
                r.read_line(&mut first).unwrap();
                let err: Value = serde_json::from_str(&first).unwrap();
                assert_eq!(err["error"]["code"], "bad_json");
                let evs = until_done(&mut r, &json!(i));
                let done = evs.last().unwrap().clone();
                assert_eq!(done["text"], format!("client {i} says hello"));
                assert!(evs.iter().all(|e| e["id"] == i));
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client thread");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn disconnect_frees_the_engine_for_others() {
    // The script never ends: only a cancel on disconnect lets request 2 run.
    let handle = spawn(Behaviour::Script(vec![]));
    let mut a = handle.connect();
    a.write_all(b"{\"id\":1,\"prompt\":\"forever\"}\n").unwrap();
    let mut b = handle.connect();
    b.write_all(b"{\"id\":2,\"prompt\":\"next\",\"max_tokens\":3}\n").unwrap();
    let mut ra = BufReader::new(a);
    let mut line = String::new();
    ra.read_line(&mut line).unwrap();
    let ev: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(ev["id"], 1);
    assert!(ev.get("delta").is_some());
    drop(ra);
    let mut rb = BufReader::new(b);
    let evs = until_done(&mut rb, &json!(2));
    assert_eq!(evs.last().unwrap()["finish"], "length");
}

#[test]
fn spawn_with_builds_on_the_thread_and_eofs_when_it_gives_up() {
    // The service is built on its own thread and served through the runner.
    let handle = ServiceHandle::spawn_with(|runner| {
        let engine = FakeEngine::new(Behaviour::Echo, 4096);
        runner.run(Service::new(engine, FakeCodec, StdClock::new(), Config::default()));
    })
    .expect("spawn");
    let mut pipe = handle.connect();
    pipe.write_all(b"{\"id\":\"x\",\"prompt\":\"borrowed\"}\n").unwrap();
    pipe.shutdown_write();
    let evs = until_done(&mut BufReader::new(pipe), &json!("x"));
    assert_eq!(evs.last().unwrap()["text"], "borrowed");
    handle.shutdown();
    // A body that returns without running: clients read EOF instead of hanging.
    let handle = ServiceHandle::spawn_with(|_runner| {}).expect("spawn");
    let mut pipe = handle.connect();
    let _ = pipe.write_all(b"{\"op\":\"info\",\"id\":0}\n");
    let mut line = String::new();
    assert_eq!(BufReader::new(pipe).read_line(&mut line).unwrap(), 0);
}
