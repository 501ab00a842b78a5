//! The appliance's chat service under load and with its optional features, over the VMM's
//! vsock: MTP drafting gives the same greedy ids as plain decoding, `{"op":"bench"}` runs
//! kore-engine's benchmark on every vCPU, 20 requests over 5 concurrent connections are all
//! answered correctly, and a client that disconnects mid-answer cancels its request.

mod common;

use std::net::Shutdown;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::client::{ids, Appliance, Client};
use common::host_generate;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(120)
}

#[test]
fn mtp_greedy_ids_equal_plain_decoding_and_bench_runs_on_every_vcpu() {
    let app = Appliance::boot("mtp", 2);
    let mut c = Client::connect(&app.uds, deadline());
    let prompt = [4071u32, 882, 198, 11, 300, 17];
    let (want, _) = host_generate(&prompt, 40);
    let mut per_step = Vec::new();
    for mtp in [0, 1, 3] {
        let id = json!(format!("mtp{mtp}"));
        c.send(&json!({"id": id, "prompt_ids": prompt, "max_tokens": 40, "mtp": mtp}).to_string());
        let (_, done) = c.until_done(&id);
        assert_eq!(ids(&done["token_ids"]), want, "mtp {mtp}: {done}\n{}", app.console());
        per_step.push(done["stats"]["tokens_per_step"].as_f64().unwrap());
    }
    eprintln!("tokens_per_step at mtp 0, 1, 3: {per_step:?}");
    assert_eq!(per_step[0], 1.0);
    assert!(per_step[1] > 1.0 && per_step[2] > 1.0, "drafts were accepted: {per_step:?}");

    c.send(
        &json!({"op": "bench", "id": "b", "prompt_tokens": 32, "decode_tokens": 16}).to_string(),
    );
    let ev = c.event();
    let b = &ev["bench"];
    eprintln!("guest bench: {b}");
    for k in kore_service::protocol::BENCH_POSITIVE_FIELDS {
        assert!(b[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {ev}\n{}", app.console());
    }
    assert_eq!(b["threads"], json!(2), "{ev}");
    assert_eq!(b["tokens_per_step"], json!(1.0), "{ev}");
    // The service goes on after a benchmark.
    c.send(&json!({"id": "after", "prompt_ids": prompt, "max_tokens": 5}).to_string());
    let (_, done) = c.until_done(&json!("after"));
    assert_eq!(ids(&done["token_ids"]), want[..5].to_vec(), "{done}");
}

#[test]
fn twenty_requests_over_five_concurrent_connections_are_all_answered() {
    const CONNS: u32 = 5;
    const PER_CONN: u32 = 4;
    let app = Appliance::boot("twenty", 2);
    let prompt = |c: u32, r: u32| vec![4071u32, 882 + c, 198, 300 + r];
    let max = |c: u32, r: u32| 4 + (c + r) % 5;
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CONNS)
            .map(|conn| {
                let uds = app.uds.clone();
                s.spawn(move || {
                    let mut c = Client::connect(&uds, deadline());
                    // All four pipelined before reading: the service queues them.
                    for r in 0..PER_CONN {
                        let req = json!({"id": format!("{conn}-{r}"), "prompt_ids": prompt(conn, r),
                                         "max_tokens": max(conn, r)});
                        c.send(&req.to_string());
                    }
                    let mut done = Vec::new();
                    while done.len() < PER_CONN as usize {
                        let ev = c.event();
                        assert!(ev.get("error").is_none(), "connection {conn}: {ev}");
                        if ev["done"] == json!(true) {
                            done.push(ev);
                        }
                    }
                    done
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client thread")).collect::<Vec<_>>()
    });
    let mut answered = 0;
    for (conn, dones) in results.iter().enumerate() {
        let conn = conn as u32;
        // Requests run batched, so one connection's requests may finish in any order;
        // each is matched by its id (docs/protocol.md), and each id is answered once.
        let mut dones: Vec<&Value> = dones.iter().collect();
        dones.sort_by_key(|d| d["id"].as_str().map(str::to_owned));
        for (r, done) in dones.into_iter().enumerate() {
            let r = r as u32;
            assert_eq!(done["id"], json!(format!("{conn}-{r}")), "{done}");
            let (want, finish) = host_generate(&prompt(conn, r), max(conn, r) as usize);
            assert_eq!(ids(&done["token_ids"]), want, "{done}\n{}", app.console());
            assert_eq!(done["finish"], json!(finish), "{done}");
            answered += 1;
        }
    }
    assert_eq!(answered, CONNS * PER_CONN);
}

#[test]
fn a_client_that_disconnects_mid_answer_cancels_its_request() {
    let app = Appliance::boot("cancel", 2);
    let mut gone = Client::connect(&app.uds, deadline());
    // Far longer than the test waits for: only a cancellation ends it early.
    gone.send(&json!({"id": "long", "prompt_ids": [4071, 882], "max_tokens": 4000}).to_string());
    let first: Value = gone.event();
    assert_eq!(first["id"], json!("long"), "{first}");
    assert!(first.get("delta").is_some(), "streaming started: {first}");
    gone.w.shutdown(Shutdown::Both).unwrap();
    drop(gone);

    // Another client is served with a clean sequence state, and the console says the
    // disconnected client's request was cancelled.
    let mut c = Client::connect(&app.uds, deadline());
    let prompt = [4071u32, 882, 198, 11];
    c.send(&json!({"id": 1, "prompt_ids": prompt, "max_tokens": 8}).to_string());
    let (_, done) = c.until_done(&json!(1));
    let (want, _) = host_generate(&prompt, 8);
    assert_eq!(ids(&done["token_ids"]), want, "{done}\n{}", app.console());
    let said = "kore-appliance: connection closed: cancelled 1 request(s)";
    let end = deadline();
    while !app.console().contains(said) {
        assert!(Instant::now() < end, "no cancellation reported:\n{}", app.console());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn garbage_of_every_kind_leaves_the_service_serving() {
    let app = Appliance::boot("garbage", 2);
    let mut c = Client::connect(&app.uds, deadline());
    // Deterministic junk: random bytes (newlines included), invalid UTF-8, deep nesting, an
    // over-long line (1.5 MiB; the limit is 1 MiB), wrong types and unknown ops.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut junk: Vec<u8> = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    junk.push(b'\n');
    junk.extend_from_slice(b"{\"id\": \"\xff\xfe\", \"prompt\": \"\xc3\x28\"}\n");
    junk.extend(std::iter::repeat_n(b'[', 100_000));
    junk.push(b'\n');
    junk.extend(std::iter::repeat_n(b'x', 3 << 19));
    junk.push(b'\n');
    for line in [
        r#"{"id": 1, "prompt_ids": [99999999999]}"#,
        r#"{"id": 2, "prompt_ids": "abc"}"#,
        r#"{"id": 3, "prompt": "hi", "max_tokens": -5}"#,
        r#"{"id": 4, "op": "format_disk"}"#,
        r#"{"id": 5, "prompt_ids": [1, 2], "temperature": 1e999}"#,
        r#"{"id": 6, "messages": [{"role": "wizard", "content": 7}]}"#,
        r#"{"cancel": {"nested": true}}"#,
        r#"{"id": 7, "op": "bench", "prompt_tokens": 4000, "decode_tokens": 4000}"#,
    ] {
        junk.extend_from_slice(line.as_bytes());
        junk.push(b'\n');
    }
    std::io::Write::write_all(&mut c.w, &junk).unwrap();
    let prompt = [4071u32, 882, 198, 11];
    c.send(&json!({"id": "ok", "prompt_ids": prompt, "max_tokens": 6}).to_string());
    let (want, _) = host_generate(&prompt, 6);
    let mut errors = 0;
    let done = loop {
        let ev = c.event();
        if ev["id"] == json!("ok") {
            if ev.get("delta").is_some() {
                continue;
            }
            break ev;
        }
        assert!(ev.get("error").is_some(), "only errors answer the junk: {ev}");
        errors += 1;
    };
    eprintln!("{errors} error events for the junk");
    assert!(errors >= 9, "every junk line got its error ({errors})");
    assert_eq!(ids(&done["token_ids"]), want, "{done}\n{}", app.console());
    // A fresh connection is served too, and nothing panicked in the guest.
    let mut c2 = Client::connect(&app.uds, deadline());
    c2.send(&json!({"op": "info", "id": "i"}).to_string());
    assert_eq!(c2.event()["info"]["vocab_size"], json!(4096));
    assert!(!app.console().contains("panic"), "{}", app.console());
}
