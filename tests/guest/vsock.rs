//! Boots kore-test-image with `echo=PORT` and echoes 1 MiB through the guest's ring-3 vsock driver,
//! from the host side of the VMM's hybrid vsock (Unix socket, `CONNECT <port>`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use kore_e2e::boot::{config, images};
use kore_vmm::Vm;

const PORT: u32 = 5000;

/// Connects to the guest port, retrying while the guest is not listening yet.
fn connect(uds: &std::path::Path, deadline: Instant) -> UnixStream {
    loop {
        assert!(Instant::now() < deadline, "guest never accepted on port {PORT}");
        if let Ok(mut s) = UnixStream::connect(uds) {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            if s.write_all(format!("CONNECT {PORT}\n").as_bytes()).is_ok() {
                let mut line = String::new();
                let mut r = BufReader::new(s.try_clone().unwrap());
                if r.read_line(&mut line).is_ok() && line.starts_with("OK ") {
                    assert!(r.buffer().is_empty());
                    return s;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn guest_echoes_a_megabyte_over_vsock() {
    let img = images().unwrap();
    let dir = std::env::temp_dir().join(format!("kore-boot-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let uds = dir.join("vsock.sock");
    let cfg = config(&img, 2, &format!("echo={PORT}")).vsock_uds(&uds);
    let vm = Vm::start(cfg, &mut |_| {}).unwrap();
    let s = connect(&uds, Instant::now() + Duration::from_secs(60));
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let mut w = s.try_clone().unwrap();
    let to_send = data.clone();
    let writer = std::thread::spawn(move || {
        for chunk in to_send.chunks(10_000) {
            w.write_all(chunk).unwrap();
        }
        w.shutdown(std::net::Shutdown::Write).unwrap();
    });
    let mut got = Vec::new();
    let mut r = s;
    r.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    r.read_to_end(&mut got).unwrap();
    writer.join().unwrap();
    assert_eq!(got.len(), data.len());
    assert!(got == data, "echoed bytes differ");
    let status = vm.wait_timeout(Duration::from_secs(60));
    let console = vm.console_lines().join("\n");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(matches!(status, Some(Ok(0))), "guest exit {status:?}\nconsole:\n{console}");
    assert!(console.contains(&format!("echoed {} bytes", data.len())), "{console}");
}
