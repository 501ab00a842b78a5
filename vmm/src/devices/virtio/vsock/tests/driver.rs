//! The fake guest driver the device tests drive: split rings in plain
//! memory, written from the virtio 1.2 layout, and a `Guest` around the
//! device backend with real Unix sockets on the host side.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::epoll::{Epoll, EpollEvent};
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::BusDevice;
use crate::devices::virtio::mmio::{reg, status, MmioTransport};
use crate::devices::virtio::vsock::muxer::{Muxer, TOKEN_LISTENER};
use crate::devices::virtio::vsock::packet::{Header, HDR_LEN};
use crate::devices::virtio::vsock::{VsockBackend, DEVICE_ID, F_STREAM, QUEUE_MAX};

pub(super) const CID: u64 = 3;
pub(super) const QSIZE: u16 = 16;
pub(super) const WRITE: u16 = 2;
pub(super) const NEXT: u16 = 1;
/// Guest memory size.
pub(super) const MEM: u64 = 2 << 20;
/// Receive buffers live in [RX_AREA, TX_AREA); transmit buffers are carved
/// from [TX_AREA, MEM) round-robin (each is consumed within one pump).
pub(super) const RX_AREA: u64 = 0x1_0000;
pub(super) const TX_AREA: u64 = 0x8_0000;

/// Driver side of one split queue in guest memory.
pub(super) struct DriverQueue {
    pub(super) base: u64,
    pub(super) free: Vec<u16>,
    /// Descriptor ids of each chain in flight, by head.
    pub(super) chains: HashMap<u16, Vec<u16>>,
    pub(super) avail_idx: u16,
    pub(super) last_used: u16,
}

impl DriverQueue {
    pub(super) fn new(base: u64) -> Self {
        Self {
            base,
            free: (0..QSIZE).rev().collect(),
            chains: HashMap::new(),
            avail_idx: 0,
            last_used: 0,
        }
    }

    pub(super) fn desc(&self) -> u64 {
        self.base
    }
    pub(super) fn avail(&self) -> u64 {
        self.base + 0x100
    }
    pub(super) fn used(&self) -> u64 {
        self.base + 0x200
    }

    pub(super) fn write_desc(
        mem: &GuestMemoryMmap,
        at: u64,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        mem.write_slice(&d, GuestAddress(at)).unwrap();
    }

    /// Adds a chain of (addr, len, flags) and publishes it; returns the head.
    pub(super) fn add(&mut self, mem: &GuestMemoryMmap, bufs: &[(u64, u32, u16)]) -> u16 {
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
    pub(super) fn add_raw(
        &mut self,
        mem: &GuestMemoryMmap,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let id = self.free.pop().expect("free desc");
        Self::write_desc(mem, self.desc() + 16 * id as u64, addr, len, flags, next);
        self.chains.insert(id, vec![id]);
        self.publish(mem, id);
    }

    pub(super) fn publish(&mut self, mem: &GuestMemoryMmap, head: u16) {
        let slot = self.avail() + 4 + 2 * (self.avail_idx % QSIZE) as u64;
        mem.write_obj(head, GuestAddress(slot)).unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, GuestAddress(self.avail() + 2)).unwrap();
    }

    /// Pops used entries (id, len) and frees their descriptors.
    pub(super) fn pop_used(&mut self, mem: &GuestMemoryMmap) -> Vec<(u16, u32)> {
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
pub(super) struct Guest {
    pub(super) mem: GuestMemoryMmap,
    pub(super) transport: Arc<Mutex<MmioTransport>>,
    pub(super) backend: VsockBackend,
    pub(super) rx: DriverQueue,
    pub(super) tx: DriverQueue,
    pub(super) ev: DriverQueue,
    /// Receive buffers: head -> address.
    pub(super) rx_bufs: Vec<(u16, u64)>,
    pub(super) next_rx_buf: u64,
    pub(super) next_buf: u64,
    pub(super) dir: PathBuf,
    pub(super) uds: PathBuf,
    pub(super) irq: EventFd,
}

pub(super) fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kore-vsock-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl Guest {
    pub(super) fn new(name: &str) -> Self {
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

    pub(super) fn w(&self, off: u64, v: u32) {
        self.transport.lock().unwrap().write(off, &v.to_le_bytes());
    }

    pub(super) fn r(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.transport.lock().unwrap().read(off, &mut b);
        u32::from_le_bytes(b)
    }

    /// virtio 1.2 §3.1.1 driver initialisation through the registers.
    pub(super) fn init_device(&mut self) {
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
    pub(super) fn reinit(&mut self) {
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
    pub(super) fn alloc(&mut self, len: u64) -> u64 {
        if self.next_buf + len > MEM {
            self.next_buf = TX_AREA;
        }
        let a = self.next_buf;
        self.next_buf += len.div_ceil(64) * 64;
        a
    }

    pub(super) fn alloc_rx(&mut self) -> u64 {
        let a = self.next_rx_buf;
        self.next_rx_buf += 4096;
        assert!(self.next_rx_buf <= TX_AREA);
        a
    }

    /// Posts `n` receive buffers of `len` bytes (header included, one descriptor each).
    pub(super) fn post_rx(&mut self, n: usize, len: u32) {
        assert!(len <= 4096);
        for _ in 0..n {
            let a = self.alloc_rx();
            let head = self.rx.add(&self.mem, &[(a, len, WRITE)]);
            self.rx_bufs.push((head, a));
        }
    }

    /// Sends a packet on the tx queue (header descriptor, then a data descriptor).
    pub(super) fn send(&mut self, h: Header, data: &[u8]) {
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
    pub(super) fn pump(&mut self) {
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
    pub(super) fn recv(&mut self) -> Vec<(Header, Vec<u8>)> {
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

    pub(super) fn host_connect(&self, port: u32) -> UnixStream {
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
