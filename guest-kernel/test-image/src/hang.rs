//! `fault=hang-answer`: a guest that hangs in the middle of an answer. It serves the
//! appliance's protocol port just enough for the launcher (an `info` answer, as the real
//! service gives it), answers the first other request with one delta, then spins forever
//! without serving vsock again, as a guest stuck in an engine step would. The launcher's
//! watchdog must notice (tests/vm/faults.rs).

use alloc::vec::Vec;

use kore_rt::println;
use kore_rt::vsock::{self, ConnId};

/// The appliance's protocol port (guest-kernel/appliance `SERVICE_PORT`).
const SERVICE_PORT: u32 = 1025;

/// Serves until the first generate request, then never returns.
pub fn run() -> ! {
    let Ok(mut dev) = vsock::open() else {
        println!("kore-test-image: no usable virtio-vsock device");
        spin()
    };
    if dev.sockets.listen(SERVICE_PORT).is_err() {
        println!("kore-test-image: listen failed");
        spin()
    }
    let mut conns: Vec<(ConnId, Vec<u8>)> = Vec::new();
    let mut buf = alloc::vec![0u8; 4096];
    let served = vsock::run_until(&mut dev, |d| {
        while let Some(id) = d.sockets.accept() {
            conns.push((id, Vec::new()));
        }
        let mut hang = false;
        for (id, line) in conns.iter_mut() {
            while let Ok(n @ 1..) = d.sockets.read(*id, &mut buf) {
                line.extend_from_slice(&buf[..n]);
            }
            while let Some(end) = line.iter().position(|&b| b == b'\n') {
                let request: Vec<u8> = line.drain(..=end).collect();
                let reply = answer(&request);
                let _ = d.sockets.write(*id, reply.as_bytes());
                hang |= !contains(&request, b"\"info\"");
            }
        }
        hang
    });
    if served.is_err() {
        println!("kore-test-image: device error while serving");
    }
    println!("kore-test-image: hanging mid-answer as the command line asks");
    spin()
}

fn spin() -> ! {
    loop {
        core::hint::spin_loop();
    }
}

/// The reply line: `info` for an info request, else one delta of the answer.
fn answer(request: &[u8]) -> alloc::string::String {
    let id = id_of(request).unwrap_or("0");
    if contains(request, b"\"info\"") {
        alloc::format!(
            "{{\"id\":{id},\"info\":{{\"model\":\"hang-answer\",\"context_limit\":4096,\
             \"vocab_size\":256,\"version\":\"0.1.0\",\"protocol\":1,\"scheduling\":\"batched\",\
             \"max_active\":1,\"active\":0,\"max_line_bytes\":1048576,\"queue_limit\":64,\
             \"queued\":0,\"busy\":false,\"connections\":1}}}}\n"
        )
    } else {
        alloc::format!("{{\"id\":{id},\"delta\":\"Once\",\"phase\":\"answer\"}}\n")
    }
}

/// The raw JSON value of the request's `"id"` (a number or a string without commas).
fn id_of(request: &[u8]) -> Option<&str> {
    let text = core::str::from_utf8(request).ok()?;
    let start = text.find("\"id\":")? + 5;
    let rest = text[start..].trim_start();
    let end = rest.find([',', '}'])?;
    Some(rest[..end].trim_end())
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
