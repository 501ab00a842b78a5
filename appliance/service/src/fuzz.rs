//! The fuzz body for the protocol: arbitrary bytes become what three client
//! connections send (any bytes, split anywhere, EOFs and disconnects at any
//! point) to a [`Service`] over the fake engine; the service is polled between
//! events. Used by the `protocol` cargo-fuzz target (`fuzz/`) and by a plain
//! test.
//!
//! Whatever clients send, the service must not panic, must answer only in
//! complete JSON lines, and must go idle once every client has gone.

use alloc::vec::Vec;

use crate::fake::{Behaviour, FakeCodec, FakeEngine, ManualClock};
use crate::{Config, ConnId, Service};

/// Polls allowed after the last client left before "never went idle" fails.
const IDLE_POLLS: usize = 100_000;

/// Runs one case. Each event is a control byte (`c`) and, for sends, a length
/// byte and that many bytes: `c % 3` picks the connection, `c / 3 % 4` the
/// action (0, 1 send; 2 EOF; 3 disconnect and reconnect).
pub fn run(data: &[u8]) {
    let mut engine = FakeEngine::new(Behaviour::Echo, 512);
    engine.max_sequences = 2;
    let config = Config { max_line_bytes: 512, ..Config::default() };
    let mut svc = Service::new(engine, FakeCodec, ManualClock::new(1_000), config);
    let mut conns: Vec<ConnId> = (0..3).map(|_| svc.open()).collect();
    let mut rest = data;
    while let Some((&c, tail)) = rest.split_first() {
        rest = tail;
        let k = (c % 3) as usize;
        match c / 3 % 4 {
            0 | 1 => {
                let n = rest.first().map_or(0, |&n| n as usize).min(rest.len().saturating_sub(1));
                let bytes = rest.get(1..1 + n).unwrap_or(&[]);
                svc.on_bytes(conns[k], bytes);
                rest = &rest[(1 + n).min(rest.len())..];
            }
            2 => svc.on_eof(conns[k]),
            _ => {
                svc.on_closed(conns[k]);
                conns[k] = svc.open();
            }
        }
        for _ in 0..4 {
            svc.poll();
        }
        for &conn in &conns {
            check_lines(&svc.take_output(conn));
        }
    }
    for conn in conns {
        svc.on_closed(conn);
    }
    let mut polls = 0;
    while svc.poll() {
        polls += 1;
        assert!(polls < IDLE_POLLS, "the service never went idle after every client left");
    }
}

/// Every byte the service sends is part of a complete JSON line.
fn check_lines(out: &[u8]) {
    if out.is_empty() {
        return;
    }
    assert_eq!(out.last(), Some(&b'\n'), "output ends mid-line");
    for line in out[..out.len() - 1].split(|&b| b == b'\n') {
        let v: Result<serde_json::Value, _> = serde_json::from_slice(line);
        assert!(v.is_ok(), "not a JSON line: {:?}", core::str::from_utf8(line));
    }
}

#[cfg(test)]
mod tests {
    use super::run;

    /// Plausible requests cut at random places, mixed with random bytes.
    #[test]
    fn fuzz_body_survives_random_clients() {
        let pieces: [&[u8]; 6] = [
            br#"{"id":1,"prompt":"hello there","max_tokens":5}"#,
            br#"{"id":"c","op":"cancel","target":1}"#,
            br#"{"id":2,"messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            br#"{"op":"info","id":3}"#,
            b"\n",
            b"\xff{\"id\":",
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..300 {
            let mut data = alloc::vec::Vec::new();
            for _ in 0..next() % 12 {
                let c = (next() % 12) as u8;
                data.push(c);
                if c / 3 % 4 < 2 {
                    let piece = pieces[(next() % 6) as usize];
                    let cut = piece.len().min(1 + (next() % 64) as usize);
                    data.push(cut as u8);
                    data.extend_from_slice(&piece[..cut]);
                }
            }
            run(&data);
        }
    }
}
