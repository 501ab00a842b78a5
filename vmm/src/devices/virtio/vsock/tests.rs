//! Device tests against a fake guest driver in plain memory (no VM): the
//! driver side is written here from the virtio 1.2 split-ring layout, the
//! host side is real Unix sockets. Modelled on Firecracker's vsock device
//! tests: connect, data both ways, credit stall and resume, RST on unknown
//! ports, shutdown, garbage descriptors.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::epoll::{Epoll, EpollEvent};
use vmm_sys_util::eventfd::EventFd;

use super::muxer::{Muxer, TOKEN_LISTENER};
use super::packet::{op, Header, HDR_LEN, SHUTDOWN_RCV, SHUTDOWN_SEND, TYPE_STREAM};
use super::{VsockBackend, DEVICE_ID, F_STREAM, QUEUE_MAX};
use crate::devices::bus::BusDevice;
use crate::devices::virtio::mmio::{reg, status, MmioTransport, F_VERSION_1, INT_USED_RING};

const CID: u64 = 3;
const QSIZE: u16 = 16;
const WRITE: u16 = 2;
const NEXT: u16 = 1;
/// Guest memory size.
const MEM: u64 = 2 << 20;
/// Receive buffers live in [RX_AREA, TX_AREA); transmit buffers are carved
/// from [TX_AREA, MEM) round-robin (each is consumed within one pump).
const RX_AREA: u64 = 0x1_0000;
const TX_AREA: u64 = 0x8_0000;

/// Driver side of one split queue in guest memory.
struct DriverQueue {
    base: u64,
    free: Vec<u16>,
    /// Descriptor ids of each chain in flight, by head.
    chains: HashMap<u16, Vec<u16>>,
    avail_idx: u16,
    last_used: u16,
}

impl DriverQueue {
    fn new(base: u64) -> Self {
        Self {
            base,
            free: (0..QSIZE).rev().collect(),
            chains: HashMap::new(),
            avail_idx: 0,
            last_used: 0,
        }
    }

    fn desc(&self) -> u64 {
        self.base
    }
    fn avail(&self) -> u64 {
        self.base + 0x100
    }
    fn used(&self) -> u64 {
        self.base + 0x200
    }

    fn write_desc(mem: &GuestMemoryMmap, at: u64, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&d, GuestAddress(at)).unwrap();
    }

    /// Adds a chain of (addr, len, flags) and publishes it; returns the head.
    fn add(&mut self, mem: &GuestMemoryMmap, bufs: &[(u64, u32, u16)]) -> u16 {
        let ids: Vec<u16> = (0..bufs.len()).map(|_| self.free.pop().expect("free desc")).collect();
        for (k, &(addr, len, flags)) in bufs.iter().enumerate() {
            let (flags, next) = match ids.get(k + 1) {
                Some(&n) => (flags | NEXT, n),
                None => (flags, 0),
            };
            Self::write_desc(mem, self.desc() + 16 * ids[k] as u64, addr, len, flags, next);
        }
        self.publish(mem, ids[0]);
        self.chains.insert(ids[0], ids.clone());
        ids[0]
    }

    /// Publishes one raw descriptor (any flags/next) as a chain head.
    fn add_raw(&mut self, mem: &GuestMemoryMmap, addr: u64, len: u32, flags: u16, next: u16) {
        let id = self.free.pop().expect("free desc");
        Self::write_desc(mem, self.desc() + 16 * id as u64, addr, len, flags, next);
        self.chains.insert(id, vec![id]);
        self.publish(mem, id);
    }

    fn publish(&mut self, mem: &GuestMemoryMmap, head: u16) {
        let slot = self.avail() + 4 + 2 * (self.avail_idx % QSIZE) as u64;
        mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, GuestAddress(self.avail() + 2)).unwrap();
    }

    /// Pops used entries (id, len) and frees their descriptors.
    fn pop_used(&mut self, mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
        let idx: u16 = mem.read_obj(GuestAddress(self.used() + 2)).unwrap();
        let mut out = Vec::new();
        while self.last_used != idx {
            let e = self.used() + 4 + 8 * (self.last_used % QSIZE) as u64;
            let id: u32 = mem.read_obj(GuestAddress(e)).unwrap();
            let len: u32 = mem.read_obj(GuestAddress(e + 4)).unwrap();
            self.last_used = self.last_used.wrapping_add(1);
            let ids = self.chains.remove(&(id as u16)).expect("device returned a head in flight");
            self.free.extend(ids);
            out.push((id as u16, len));
        }
        out
    }
}

/// The fake guest: memory, the transport (driven through its registers),
/// the backend and the driver queues.
struct Guest {
    mem: GuestMemoryMmap,
    transport: Arc<Mutex<MmioTransport>>,
    backend: VsockBackend,
    rx: DriverQueue,
    tx: DriverQueue,
    ev: DriverQueue,
    /// Receive buffers: head -> address.
    rx_bufs: Vec<(u16, u64)>,
    next_rx_buf: u64,
    next_buf: u64,
    dir: PathBuf,
    uds: PathBuf,
    irq: EventFd,
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kore-vsock-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl Guest {
    fn new(name: &str) -> Self {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let wake = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let t = MmioTransport::new(
            DEVICE_ID,
            F_STREAM,
            &[QUEUE_MAX; 3],
            CID.to_le_bytes().to_vec(),
            mem.clone(),
            irq.try_clone().unwrap(),
            wake,
        )
        .unwrap();
        let transport = Arc::new(Mutex::new(t));
        let dir = tmpdir(name);
        let uds = dir.join("v.sock");
        let listener = UnixListener::bind(&uds).unwrap();
        let muxer = Muxer::new(CID, &uds, Some(listener), Epoll::new().unwrap()).unwrap();
        let backend = VsockBackend::new(transport.clone(), muxer);
        let q = DriverQueue::new;
        let mut g = Guest {
            mem,
            transport,
            backend,
            rx: q(0x1000),
            tx: q(0x2000),
            ev: q(0x3000),
            rx_bufs: Vec::new(),
            next_rx_buf: RX_AREA,
            next_buf: TX_AREA,
            dir,
            uds,
            irq,
        };
        g.init_device();
        g
    }

    fn w(&self, off: u64, v: u32) {
        self.transport.lock().unwrap().write(off, &v.to_le_bytes());
    }

    fn r(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.transport.lock().unwrap().read(off, &mut b);
        u32::from_le_bytes(b)
    }

    /// virtio 1.2 §3.1.1 driver initialisation through the registers.
    fn init_device(&mut self) {
        assert_eq!(self.r(reg::MAGIC), 0x7472_6976);
        assert_eq!(self.r(reg::VERSION), 2);
        assert_eq!(self.r(reg::DEVICE_ID), 19);
        self.w(reg::STATUS, 0);
        self.w(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
        self.w(reg::DEVICE_FEATURES_SEL, 1);
        assert_eq!(self.r(reg::DEVICE_FEATURES), 1, "VERSION_1 offered");
        self.w(reg::DRIVER_FEATURES_SEL, 1);
        self.w(reg::DRIVER_FEATURES, 1);
        self.w(reg::STATUS, status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK);
        assert_ne!(self.r(reg::STATUS) & status::FEATURES_OK, 0);
        for (i, base) in [(0u32, 0x1000u64), (1, 0x2000), (2, 0x3000)] {
            self.w(reg::QUEUE_SEL, i);
            assert_eq!(self.r(reg::QUEUE_NUM_MAX), QUEUE_MAX as u32);
            self.w(reg::QUEUE_NUM, QSIZE as u32);
            self.w(reg::QUEUE_DESC_LOW, base as u32);
            self.w(reg::QUEUE_DRIVER_LOW, base as u32 + 0x100);
            self.w(reg::QUEUE_DEVICE_LOW, base as u32 + 0x200);
            self.w(reg::QUEUE_READY, 1);
        }
        let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK | status::DRIVER_OK;
        self.w(reg::STATUS, s);
        assert_eq!(self.r(reg::STATUS), s);
        let cid = self.r(reg::CONFIG) as u64 | (self.r(reg::CONFIG + 4) as u64) << 32;
        assert_eq!(cid, CID);
        assert!(self.transport.lock().unwrap().activated());
    }

    /// The driver resets the device and sets it up again (fresh rings, no
    /// receive buffers posted), as a guest driver does on (re)probe.
    fn reinit(&mut self) {
        self.rx = DriverQueue::new(0x1000);
        self.tx = DriverQueue::new(0x2000);
        self.ev = DriverQueue::new(0x3000);
        self.rx_bufs.clear();
        self.next_rx_buf = RX_AREA;
        // Fresh, zeroed rings, as a driver allocates them.
        self.mem.write_slice(&[0u8; 0x4000], GuestAddress(0x1000)).unwrap();
        self.init_device();
    }

    /// A transmit-side buffer (reused round-robin).
    fn alloc(&mut self, len: u64) -> u64 {
        if self.next_buf + len > MEM {
            self.next_buf = TX_AREA;
        }
        let a = self.next_buf;
        self.next_buf += len.div_ceil(64) * 64;
        a
    }

    fn alloc_rx(&mut self) -> u64 {
        let a = self.next_rx_buf;
        self.next_rx_buf += 4096;
        assert!(self.next_rx_buf <= TX_AREA);
        a
    }

    /// Posts `n` receive buffers of `len` bytes (header included, one descriptor each).
    fn post_rx(&mut self, n: usize, len: u32) {
        assert!(len <= 4096);
        for _ in 0..n {
            let a = self.alloc_rx();
            let head = self.rx.add(&self.mem, &[(a, len, WRITE)]);
            self.rx_bufs.push((head, a));
        }
    }

    /// Sends a packet on the tx queue (header descriptor, then a data descriptor).
    fn send(&mut self, h: Header, data: &[u8]) {
        let h = Header { len: data.len() as u32, ..h };
        let ha = self.alloc(HDR_LEN as u64);
        self.mem.write_slice(&h.encode(), GuestAddress(ha)).unwrap();
        if data.is_empty() {
            self.tx.add(&self.mem, &[(ha, HDR_LEN as u32, 0)]);
        } else {
            let da = self.alloc(data.len() as u64);
            self.mem.write_slice(data, GuestAddress(da)).unwrap();
            self.tx.add(&self.mem, &[(ha, HDR_LEN as u32, 0), (da, data.len() as u32, 0)]);
        }
    }

    /// Runs the device: host socket events, then queue processing, a few rounds.
    fn pump(&mut self) {
        let mut events = vec![EpollEvent::default(); 32];
        for _ in 0..6 {
            let n = self.backend.muxer.epoll().wait(5, &mut events).unwrap();
            for ev in &events[..n] {
                match ev.data() {
                    TOKEN_LISTENER => self.backend.muxer.accept(),
                    t => self.backend.muxer.host_event(t, ev.event_set()),
                }
            }
            self.backend.process();
        }
        let used: Vec<_> = self.tx.pop_used(&self.mem);
        drop(used);
    }

    /// Received packets (header, payload), re-posting each buffer.
    fn recv(&mut self) -> Vec<(Header, Vec<u8>)> {
        let mut out = Vec::new();
        for (id, len) in self.rx.pop_used(&self.mem) {
            let Some(i) = self.rx_bufs.iter().position(|b| b.0 == id) else {
                assert_eq!(len, 0, "a bad receive chain comes back empty");
                continue;
            };
            let (_, a) = self.rx_bufs.remove(i);
            assert!(len as usize >= HDR_LEN, "used length {len} covers a header");
            let mut b = vec![0u8; len as usize];
            self.mem.read_slice(&mut b, GuestAddress(a)).unwrap();
            let h = Header::decode(&b).unwrap();
            assert_eq!(h.len as usize, len as usize - HDR_LEN);
            out.push((h, b[HDR_LEN..].to_vec()));
            let head = self.rx.add(&self.mem, &[(a, 4096, WRITE)]);
            self.rx_bufs.push((head, a));
        }
        out
    }

    fn host_connect(&self, port: u32) -> UnixStream {
        let mut s = UnixStream::connect(&self.uds).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
        s
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

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
