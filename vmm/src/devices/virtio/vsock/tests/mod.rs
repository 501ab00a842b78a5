//! Device tests against a fake guest driver in plain memory (no VM): the
//! driver side is written here from the virtio 1.2 split-ring layout, the
//! host side is real Unix sockets. Modelled on Firecracker's vsock device
//! tests: connect, data both ways, credit stall and resume, RST on unknown
//! ports, shutdown, garbage descriptors.

mod driver;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress};

use super::packet::{op, Header, HDR_LEN, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use super::QUEUE_MAX;
use crate::devices::bus::BusDevice;
use crate::devices::virtio::mmio::{reg, status, F_VERSION_1, INT_USED_RING};

use driver::*;

/// A header from the guest (CID 3) to the host (CID 2).
fn g2h(src_port: u32, dst_port: u32, op: u16) -> Header {
    Header {
        src_cid: CID,
        dst_cid: 2,
        src_port,
        dst_port,
        type_: TYPE_STREAM,
        op,
        buf_alloc: 64 * 1024,
        ..Header::default()
    }
}

/// Host connects to guest port 1234; the guest accepts. Returns the host
/// stream and the host port the device chose.
fn establish(g: &mut Guest, buf_alloc: u32) -> (UnixStream, u32) {
    g.post_rx(8, 4096);
    let mut s = g.host_connect(1234);
    g.pump();
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1, "{pkts:?}");
    let (req, _) = &pkts[0];
    assert_eq!((req.op, req.src_cid, req.dst_cid, req.dst_port), (op::REQUEST, 2, CID, 1234));
    assert!((1 << 30..1 << 31).contains(&req.src_port), "host port {}", req.src_port);
    g.send(Header { buf_alloc, ..g2h(1234, req.src_port, op::RESPONSE) }, &[]);
    g.pump();
    let mut line = [0u8; 64];
    let want = format!("OK {}\n", req.src_port);
    let n = s.read(&mut line).unwrap();
    assert_eq!(&line[..n], want.as_bytes());
    (s, req.src_port)
}

#[test]
fn connect_and_data_both_ways() {
    let mut g = Guest::new("data");
    let (mut s, hp) = establish(&mut g, 64 * 1024);
    s.write_all(b"hello guest").unwrap();
    g.pump();
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].0.op, op::RW);
    assert_eq!(pkts[0].1, b"hello guest");
    g.send(g2h(1234, hp, op::RW), b"hello host");
    g.pump();
    let mut b = [0u8; 32];
    let n = s.read(&mut b).unwrap();
    assert_eq!(&b[..n], b"hello host");
    assert_ne!(g.r(reg::INTERRUPT_STATUS) & INT_USED_RING, 0);
    g.w(reg::INTERRUPT_ACK, INT_USED_RING);
    assert_eq!(g.r(reg::INTERRUPT_STATUS), 0);
    assert!(g.irq.read().unwrap() > 0, "irqfd kicked");
}

#[test]
fn credit_stall_and_resume() {
    let mut g = Guest::new("credit");
    let (mut s, hp) = establish(&mut g, 1000);
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    s.write_all(&data).unwrap();
    g.pump();
    let pkts = g.recv();
    let got: Vec<u8> = pkts.iter().filter(|p| p.0.op == op::RW).flat_map(|p| p.1.clone()).collect();
    assert_eq!(got, data[..1000], "exactly the guest's credit arrives");
    assert!(
        pkts.iter().any(|p| p.0.op == op::CREDIT_REQUEST),
        "device asks for credit when stalled"
    );
    g.pump();
    assert!(g.recv().iter().all(|p| p.0.op != op::RW), "nothing more without credit");
    // The guest consumed 1000 bytes: a credit update lets the next 1000 through.
    g.send(Header { buf_alloc: 1000, fwd_cnt: 1000, ..g2h(1234, hp, op::CREDIT_UPDATE) }, &[]);
    g.pump();
    let more: Vec<u8> =
        g.recv().iter().filter(|p| p.0.op == op::RW).flat_map(|p| p.1.clone()).collect();
    assert_eq!(more, data[1000..2000]);
}

#[test]
fn device_advertises_and_honours_its_own_credit() {
    let mut g = Guest::new("owncredit");
    let (_s, hp) = establish(&mut g, 64 * 1024);
    // Host does not read: the guest may send buf_alloc bytes; past that the
    // connection is reset (the guest broke flow control), never buffered.
    let chunk = vec![5u8; 60 * 1024];
    let mut reset = false;
    for _ in 0..16 {
        g.send(g2h(1234, hp, op::RW), &chunk);
        g.pump();
        let pkts = g.recv();
        for (h, _) in &pkts {
            assert_eq!(h.buf_alloc, super::conn::BUF_ALLOC);
        }
        if pkts.iter().any(|p| p.0.op == op::RST) {
            reset = true;
            break;
        }
    }
    assert!(reset, "overrunning the device's buffer resets the connection");
}

#[test]
fn rst_for_unknown_connections_and_refused_ports() {
    let mut g = Guest::new("rst");
    g.post_rx(8, 4096);
    g.send(g2h(50, 99, op::RW), b"nobody");
    g.send(g2h(51, 77, op::REQUEST), &[]); // no <uds>_77 listener
    g.send(g2h(52, 99, op::RST), &[]); // RST never answered
    g.pump();
    let pkts = g.recv();
    let rst: Vec<(u32, u32)> =
        pkts.iter().filter(|p| p.0.op == op::RST).map(|p| (p.0.src_port, p.0.dst_port)).collect();
    assert_eq!(rst, vec![(99, 50), (77, 51)], "{pkts:?}");
    // A host listener at <uds>_78 takes a guest connection.
    let l = UnixListener::bind(format!("{}_78", g.uds.display())).unwrap();
    g.send(g2h(53, 78, op::REQUEST), &[]);
    g.pump();
    let (mut hs, _) = l.accept().unwrap();
    let pkts = g.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!((pkts[0].0.op, pkts[0].0.src_port, pkts[0].0.dst_port), (op::RESPONSE, 78, 53));
    g.send(g2h(53, 78, op::RW), b"to host");
    g.pump();
    let mut b = [0u8; 16];
    hs.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let n = hs.read(&mut b).unwrap();
    assert_eq!(&b[..n], b"to host");
}

#[test]
fn bad_handshakes_are_closed() {
    let mut g = Guest::new("handshake");
    g.post_rx(4, 4096);
    for line in ["CONNECT\n", "BIND 5\n", "CONNECT -1\n", "CONNECT 99999999999\n", &"x".repeat(40)]
    {
        let mut s = UnixStream::connect(&g.uds).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(line.as_bytes()).unwrap();
        g.pump();
        // Closed: end of file, or ECONNRESET when the device closed with
        // bytes of the line still unread (Linux's Unix sockets do that).
        let mut b = [0u8; 8];
        match s.read(&mut b) {
            Ok(n) => assert_eq!(n, 0, "{line:?} closes the client"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{line:?}: {e}"),
        }
    }
    assert!(g.recv().is_empty(), "no request reached the guest");
    assert_eq!(g.backend.muxer.len(), 0);
}

#[test]
fn shutdown_both_ways() {
    let mut g = Guest::new("shutdown");
    let (mut s, hp) = establish(&mut g, 64 * 1024);
    s.write_all(b"last words").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    g.pump();
    let pkts = g.recv();
    let ops: Vec<u16> = pkts.iter().map(|p| p.0.op).collect();
    assert_eq!(ops, vec![op::RW, op::SHUTDOWN], "data, then end of stream");
    assert_eq!(pkts[1].0.flags, SHUTDOWN_SEND);
    g.send(g2h(1234, hp, op::RW), b"reply");
    g.send(Header { flags: SHUTDOWN_RCV | SHUTDOWN_SEND, ..g2h(1234, hp, op::SHUTDOWN) }, &[]);
    g.pump();
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"reply", "host reads the reply, then end of stream");
    let pkts = g.recv();
    assert_eq!(pkts.iter().map(|p| p.0.op).collect::<Vec<_>>(), vec![op::RST]);
    assert_eq!(g.backend.muxer.len(), 0);
}

#[test]
fn host_hangup_resets_the_guest_side() {
    let mut g = Guest::new("hangup");
    let (s, _) = establish(&mut g, 64 * 1024);
    drop(s);
    g.pump();
    let ops: Vec<u16> = g.recv().iter().map(|p| p.0.op).collect();
    assert_eq!(ops.last(), Some(&op::RST), "{ops:?}");
    assert_eq!(g.backend.muxer.len(), 0);
}

#[test]
fn garbage_descriptors_cost_only_their_packet() {
    let mut g = Guest::new("garbage");
    let (mut s, hp) = establish(&mut g, 64 * 1024);
    let good = g2h(1234, hp, op::RW);
    let ha = g.alloc(64);
    g.mem.write_slice(&Header { len: 8, ..good }.encode(), GuestAddress(ha)).unwrap();
    let cases: Vec<Vec<(u64, u32, u16)>> = vec![
        vec![(ha, HDR_LEN as u32, WRITE)],   // device-writable tx header
        vec![(ha, 20, 0)],                   // header too short
        vec![(1 << 40, HDR_LEN as u32, 0)],  // outside guest memory
        vec![(MEM - 10, HDR_LEN as u32, 0)], // runs off the end of memory
        vec![(ha, HDR_LEN as u32, 0)],       // len 8 but no data descriptor
        vec![(ha, HDR_LEN as u32, 0), (ha + 64, 4, 0)], // data shorter than len
        vec![(ha, HDR_LEN as u32, 0), (ha + 64, 8, WRITE)], // writable data descriptor
        vec![(ha, HDR_LEN as u32, 0), (u64::MAX - 3, 8, 0)], // data address wraps
    ];
    let before = g.tx.last_used;
    for c in &cases {
        g.tx.add(&g.mem, c);
    }
    // A descriptor chain that loops on itself, and one whose next is out of range.
    let id = *g.tx.free.last().unwrap();
    g.tx.add_raw(&g.mem, ha, HDR_LEN as u32, NEXT, id);
    g.tx.add_raw(&g.mem, ha, HDR_LEN as u32, NEXT, 999);
    // A header claiming a huge payload.
    let hb = g.alloc(64);
    g.mem.write_slice(&Header { len: u32::MAX, ..good }.encode(), GuestAddress(hb)).unwrap();
    g.tx.add(&g.mem, &[(hb, HDR_LEN as u32, 0), (hb, 64, 0)]);
    // Read-only and too-small receive buffers (returned unused once the device has data).
    let ra = g.alloc(4096);
    g.rx.add(&g.mem, &[(ra, 4096, 0)]);
    g.rx.add(&g.mem, &[(ra, 10, WRITE)]);
    g.pump();
    let returned = g.tx.last_used.wrapping_sub(before) as usize;
    assert_eq!(returned, cases.len() + 3, "every garbage chain was returned");
    assert!(g.recv().is_empty(), "no garbage produced a packet for the guest");
    // The connection still works both ways.
    g.send(good, b"still ok");
    s.write_all(b"and back").unwrap();
    g.pump();
    let mut b = [0u8; 16];
    let n = s.read(&mut b).unwrap();
    assert_eq!(&b[..n], b"still ok", "no garbage reached the host");
    let pkts = g.recv();
    let data: Vec<u8> =
        pkts.iter().filter(|p| p.0.op == op::RW).flat_map(|p| p.1.clone()).collect();
    assert_eq!(data, b"and back");
}

#[test]
fn transport_rejects_bad_setup() {
    let mut g = Guest::new("transport");
    // Unknown features make FEATURES_OK fail.
    g.w(reg::STATUS, 0);
    assert!(!g.transport.lock().unwrap().activated(), "reset deactivates");
    g.w(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    g.w(reg::DRIVER_FEATURES_SEL, 0);
    g.w(reg::DRIVER_FEATURES, 1 << 5);
    g.w(reg::DRIVER_FEATURES_SEL, 1);
    g.w(reg::DRIVER_FEATURES, 1);
    g.w(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    assert_eq!(g.r(reg::STATUS) & status::FEATURES_OK, 0);
    // Queue sizes that are not powers of two or exceed the maximum are ignored;
    // rings outside guest memory make DRIVER_OK fail with NEEDS_RESET.
    g.w(reg::STATUS, 0);
    g.w(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    g.w(reg::DRIVER_FEATURES_SEL, 1);
    g.w(reg::DRIVER_FEATURES, (F_VERSION_1 >> 32) as u32);
    g.w(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
    g.w(reg::QUEUE_SEL, 0);
    for bad in [0u32, 3, 512, 70000] {
        g.w(reg::QUEUE_NUM, bad);
        assert_eq!(g.transport.lock().unwrap().queues[0].size(), QUEUE_MAX, "size {bad} ignored");
    }
    g.w(reg::QUEUE_SEL, 7); // no such queue
    assert_eq!(g.r(reg::QUEUE_NUM_MAX), 0);
    for q in 0..3 {
        g.w(reg::QUEUE_SEL, q);
        g.w(reg::QUEUE_DESC_LOW, 0);
        g.w(reg::QUEUE_DESC_HIGH, 0x10);
        g.w(reg::QUEUE_READY, 1);
    }
    let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    g.w(reg::STATUS, s | status::DRIVER_OK);
    let st = g.r(reg::STATUS);
    assert_eq!(st & status::DRIVER_OK, 0);
    assert_ne!(st & status::DEVICE_NEEDS_RESET, 0);
    assert!(!g.transport.lock().unwrap().activated());
    // Odd-sized register accesses are ignored, config reads work at any width.
    let mut b = [0xaau8; 2];
    g.transport.lock().unwrap().read(reg::MAGIC, &mut b);
    assert_eq!(b, [0, 0]);
    let mut c = [0u8; 1];
    g.transport.lock().unwrap().read(reg::CONFIG, &mut c);
    assert_eq!(c[0], CID as u8);
    g.pump(); // processing a device that is not activated does nothing
}

#[test]
fn reset_drops_the_guests_connections_and_keeps_waiting_clients() {
    let mut g = Guest::new("reset");
    let (mut old, _) = establish(&mut g, 64 * 1024);
    // A client that connects while the driver resets the device (the device
    // notices the reset at its next pass, after accepting the client).
    let mut late = g.host_connect(4321);
    g.reinit();
    g.post_rx(4, 4096);
    g.pump();
    let mut b = [0u8; 8];
    old.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(old.read(&mut b).unwrap(), 0, "the old driver's connection is closed");
    let pkts = g.recv();
    let reqs: Vec<u32> =
        pkts.iter().filter(|p| p.0.op == op::REQUEST).map(|p| p.0.dst_port).collect();
    assert_eq!(reqs, vec![4321], "the waiting client's REQUEST reaches the new driver: {pkts:?}");
    assert!(pkts.iter().all(|p| p.0.dst_port == 4321), "nothing for the old connection: {pkts:?}");
    let hp = pkts[0].0.src_port;
    g.send(g2h(4321, hp, op::RESPONSE), &[]);
    g.pump();
    let mut line = [0u8; 64];
    let n = late.read(&mut line).unwrap();
    assert_eq!(&line[..n], format!("OK {hp}\n").as_bytes());
    assert_eq!(g.backend.muxer.len(), 1);
}

#[test]
fn transport_reset_drops_everything_and_sends_the_event() {
    let mut g = Guest::new("evreset");
    let (mut s, _) = establish(&mut g, 64 * 1024);
    // No event buffer yet: the event waits; then the driver posts a read-only one
    // (returned unused) and a good one (gets the event).
    g.backend.transport_reset();
    let mut b = [0u8; 8];
    assert_eq!(s.read(&mut b).unwrap(), 0, "the host client's stream is closed");
    assert_eq!(g.backend.muxer.len(), 0);
    assert!(g.ev.pop_used(&g.mem).is_empty(), "no buffer, no event yet");
    let bad = g.alloc(8);
    let good = g.alloc(8);
    g.mem.write_obj(0xffff_ffffu32, GuestAddress(good)).unwrap();
    g.ev.add(&g.mem, &[(bad, 8, 0)]);
    g.ev.add(&g.mem, &[(good, 8, WRITE)]);
    g.pump();
    let used = g.ev.pop_used(&g.mem);
    assert_eq!(used.iter().map(|u| u.1).collect::<Vec<_>>(), vec![0, 4], "{used:?}");
    let id: u32 = g.mem.read_obj(GuestAddress(good)).unwrap();
    assert_eq!(id, super::EVENT_TRANSPORT_RESET);
    assert!(g.recv().is_empty(), "nothing for the dropped connection");
    // One event per reset: a second buffer stays unused.
    let more = g.alloc(8);
    g.ev.add(&g.mem, &[(more, 8, WRITE)]);
    g.pump();
    assert!(g.ev.pop_used(&g.mem).is_empty());
}
