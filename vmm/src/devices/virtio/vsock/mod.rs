//! The virtio-vsock device (virtio 1.2 §5.10) with a Unix-socket backend.
//!
//! * [`packet`]: the header and constants.
//! * [`conn`]: one connection's state, credit accounting and host stream.
//! * [`muxer`]: the connection table, the listener and Firecracker's hybrid
//!   `CONNECT <port>` protocol.
//! * this module: moving packets between the guest's queues (rx 0, tx 1,
//!   event 2) and the muxer, and the event-loop thread that serves queue
//!   notifications (ioeventfd) and the host sockets (epoll).
//!
//! Guest memory is untrusted. Each descriptor chain is parsed by
//! [`virtio_vsock::packet::VsockPacket`] (direction, lengths, memory ranges)
//! on top of [`virtio_queue`]'s chain walk (index bounds, loops cut after
//! `queue size` descriptors); the header is copied out once and checked here
//! (CIDs, type, op, `len` against [`packet::MAX_PKT_PAYLOAD`]). A bad chain is
//! returned to the guest unused and costs only that packet.

pub mod conn;
#[doc(hidden)]
pub mod fuzz;
pub mod muxer;
pub mod packet;
#[cfg(test)]
mod tests;

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use virtio_queue::{Queue, QueueOwnedT, QueueT};
use virtio_vsock::packet::VsockPacket;
use vm_memory::{Bytes, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use self::muxer::Muxer;
use self::packet::{op, Header, HDR_LEN, MAX_PKT_PAYLOAD};
use super::mmio::MmioTransport;

pub use kore_boot_abi::virtio::vsock::{DEVICE_ID, EVENT_TRANSPORT_RESET, F_STREAM};
/// Largest queue size offered for each queue.
pub const QUEUE_MAX: u16 = 256;
/// Receive queue index.
pub const RXQ: usize = kore_boot_abi::virtio::vsock::RX_QUEUE as usize;
/// Transmit queue index.
pub const TXQ: usize = kore_boot_abi::virtio::vsock::TX_QUEUE as usize;
/// Event queue index.
pub const EVQ: usize = kore_boot_abi::virtio::vsock::EVENT_QUEUE as usize;

const TOKEN_STOP: u64 = 0;
const TOKEN_NOTIFY: u64 = 1;
const TOKEN_WAKE: u64 = 2;
const TOKEN_RESET: u64 = 4;

/// Errors setting the device up.
#[derive(Debug, thiserror::Error)]
pub enum VsockError {
    /// The Unix socket path cannot be bound.
    #[error("cannot listen on vsock socket {path}: {source} (is another VM using it? remove the stale file)")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// An eventfd, epoll or thread could not be created.
    #[error("vsock device setup: {0}")]
    Io(#[from] std::io::Error),
    /// The queues could not be created.
    #[error("vsock queues: {0}")]
    Queue(#[from] virtio_queue::Error),
}

/// Moves the guest's transmit chains to the muxer. Returns true if any chain
/// was used (the guest should be interrupted).
pub fn process_tx(q: &mut Queue, mem: &GuestMemoryMmap, mux: &mut Muxer) -> bool {
    let mut used = false;
    while let Some(mut chain) = q.pop_descriptor_chain(mem) {
        let head = chain.head_index();
        if !well_formed(&chain) {
            tracing::debug!("vsock: dropped tx chain {head}: loops, is cut or too long");
        } else {
            match VsockPacket::from_tx_virtq_chain(mem, &mut chain, MAX_PKT_PAYLOAD) {
                Ok(pkt) => {
                    let h = packet::header_of(&pkt);
                    tracing::trace!("vsock: from guest {h:?}");
                    match read_payload(&pkt, &h) {
                        Some(payload) => mux.on_guest_packet(&h, &payload),
                        None => tracing::debug!("vsock: dropped malformed tx packet {h:?}"),
                    }
                }
                Err(e) => tracing::debug!("vsock: dropped bad tx chain {head}: {e}"),
            }
        }
        if let Err(e) = q.add_used(mem, head, 0) {
            tracing::warn!("vsock: tx used ring update failed: {e}");
            return used;
        }
        used = true;
    }
    used
}

/// True if the chain ends properly: `virtio_queue` stops walking a chain
/// that loops (after `queue size` descriptors), points past the table, or
/// sums to more than 4 GiB, but yields its first descriptors, which could
/// pass for a packet. Like Linux's vhost (`vhost_get_vq_desc`), such a
/// chain is refused as a whole.
fn well_formed<M>(chain: &virtio_queue::DescriptorChain<M>) -> bool
where
    M: std::ops::Deref + Clone,
    M::Target: vm_memory::GuestMemory,
{
    let mut last_had_next = false;
    for d in chain.clone() {
        last_had_next = d.has_next();
    }
    !last_had_next
}

/// The payload of an RW packet (`None` for a malformed packet: a payload on
/// a control packet, or a data slice shorter than `len`).
fn read_payload<B: vm_memory::bitmap::BitmapSlice>(
    pkt: &VsockPacket<'_, B>,
    h: &Header,
) -> Option<Vec<u8>> {
    if h.len == 0 {
        return Some(Vec::new());
    }
    if h.op != op::RW || h.len > MAX_PKT_PAYLOAD {
        return None;
    }
    let s = pkt.data_slice()?;
    let mut buf = vec![0u8; h.len as usize];
    (s.len() >= buf.len() && s.copy_to(&mut buf[..]) == buf.len()).then_some(buf)
}

/// Fills the guest's receive chains with packets from the muxer. Returns
/// true if any chain was used.
pub fn process_rx(q: &mut Queue, mem: &GuestMemoryMmap, mux: &mut Muxer) -> bool {
    let mut used = false;
    while mux.has_rx() {
        let Some(mut chain) = q.pop_descriptor_chain(mem) else { break };
        let head = chain.head_index();
        let parsed = if well_formed(&chain) {
            VsockPacket::from_rx_virtq_chain(mem, &mut chain, MAX_PKT_PAYLOAD)
                .map_err(|e| e.to_string())
        } else {
            Err("it loops, is cut or is too long".to_string())
        };
        let len = match parsed {
            Ok(pkt) => {
                let room = pkt.data_slice().map_or(0, |s| s.len()).min(MAX_PKT_PAYLOAD as usize);
                let Some((h, data)) = mux.next_rx(room) else {
                    // Nothing to send after all: give the chain back.
                    q.go_to_previous_position();
                    break;
                };
                tracing::trace!("vsock: to guest {:?} len {}", h, data.len());
                write_packet(&pkt, &h, &data)
            }
            Err(e) => {
                tracing::debug!("vsock: bad rx chain {head}: {e}");
                0
            }
        };
        if let Err(e) = q.add_used(mem, head, len) {
            tracing::warn!("vsock: rx used ring update failed: {e}");
            return used;
        }
        used = true;
    }
    used
}

/// Writes header and data into a parsed receive chain; returns the used length.
fn write_packet<B: vm_memory::bitmap::BitmapSlice>(
    pkt: &VsockPacket<'_, B>,
    h: &Header,
    data: &[u8],
) -> u32 {
    let hdr = Header { len: data.len() as u32, ..*h };
    if pkt.header_slice().write_slice(&hdr.encode(), 0).is_err() {
        return 0;
    }
    if !data.is_empty() {
        match pkt.data_slice() {
            Some(s) if s.write_slice(data, 0).is_ok() => {}
            _ => return 0,
        }
    }
    (HDR_LEN + data.len()) as u32
}

/// The device's backend: the transport's queues plus the muxer.
pub struct VsockBackend {
    transport: Arc<Mutex<MmioTransport>>,
    /// The connections.
    pub muxer: Muxer,
    generation: u64,
    /// A transport-reset event waits for an event-queue buffer.
    event_pending: bool,
}

impl VsockBackend {
    /// A backend serving `transport`'s queues with `muxer`.
    pub fn new(transport: Arc<Mutex<MmioTransport>>, muxer: Muxer) -> Self {
        Self { transport, muxer, generation: 0, event_pending: false }
    }

    /// Processes the queues: guest packets out, pending packets in, and
    /// interrupts the guest if any buffer was used.
    pub fn process(&mut self) {
        let mut t = self.transport.lock().unwrap_or_else(|e| e.into_inner());
        if t.generation() != self.generation {
            self.generation = t.generation();
            self.muxer.reset();
            self.event_pending = false; // A fresh driver has no connections to drop.
        }
        if !t.activated() {
            return;
        }
        let mem = t.mem().clone();
        let mut used = process_tx(&mut t.queues[TXQ], &mem, &mut self.muxer);
        used |= process_rx(&mut t.queues[RXQ], &mem, &mut self.muxer);
        if self.event_pending && post_event(&mut t.queues[EVQ], &mem, EVENT_TRANSPORT_RESET) {
            self.event_pending = false;
            used = true;
        }
        if used {
            t.signal_used();
        }
    }
}

impl VsockBackend {
    /// A host-side transport reset (e.g. the host side of every connection is gone after
    /// a restart of the host service): drops every connection, host clients included, and
    /// tells the driver with a `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` event as soon as the
    /// event queue has a buffer.
    pub fn transport_reset(&mut self) {
        self.muxer.drop_all();
        self.event_pending = true;
        self.process();
    }

    /// Logs the queues' and connections' state (debug level; for hung-guest reports).
    pub fn log_state(&self) {
        use std::sync::atomic::Ordering;
        let t = self.transport.lock().unwrap_or_else(|e| e.into_inner());
        let mem = t.mem();
        for (i, q) in t.queues.iter().enumerate() {
            let avail = q.avail_idx(mem, Ordering::Acquire).map(|w| w.0).ok();
            let used = q.used_idx(mem, Ordering::Acquire).map(|w| w.0).ok();
            tracing::debug!(
                "vsock queue {i}: next_avail {} next_used {} avail.idx {avail:?} used.idx {used:?}",
                q.next_avail(),
                q.next_used()
            );
        }
        tracing::debug!("vsock: activated {} status {:#x}", t.activated(), t.status());
        self.muxer.log_state();
    }
}

/// Puts event `id` (`struct virtio_vsock_event`, one le32) into the next event-queue
/// buffer. False if the driver posted none (or only unusable ones: those are returned
/// unused and the event waits).
fn post_event(q: &mut Queue, mem: &GuestMemoryMmap, id: u32) -> bool {
    while let Some(chain) = q.pop_descriptor_chain(mem) {
        let head = chain.head_index();
        let ok = well_formed(&chain)
            && chain.clone().next().is_some_and(|d| {
                d.is_write_only() && d.len() >= 4 && mem.write_obj(id.to_le(), d.addr()).is_ok()
            });
        if let Err(e) = q.add_used(mem, head, if ok { 4 } else { 0 }) {
            tracing::warn!("vsock: event used ring update failed: {e}");
            return false;
        }
        if ok {
            return true;
        }
        tracing::debug!("vsock: unusable event buffer {head} returned");
    }
    false
}

/// The running device: its event-loop thread. Dropping it stops the thread
/// and removes the Unix socket file.
pub struct VsockHandle {
    stop: EventFd,
    reset: EventFd,
    thread: Option<JoinHandle<()>>,
    uds: PathBuf,
}

impl VsockHandle {
    /// Asks the event loop for a [`VsockBackend::transport_reset`].
    pub fn transport_reset(&self) -> std::io::Result<()> {
        self.reset.write(1)
    }
}

impl Drop for VsockHandle {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.uds);
    }
}

/// Binds `uds` (replacing a stale socket file, never any other file).
pub fn bind(uds: &Path) -> Result<UnixListener, VsockError> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(uds) {
        if m.file_type().is_socket() {
            let _ = std::fs::remove_file(uds);
        }
    }
    UnixListener::bind(uds).map_err(|source| VsockError::Bind { path: uds.to_path_buf(), source })
}

/// Starts the event loop serving `transport` for guest `cid`: `notify` is the
/// queue-notify ioeventfd, `wake` the transport's activation/reset eventfd.
/// With `filters`, the loop installs its seccomp filter before it runs (and
/// does not run if that fails).
pub fn spawn(
    transport: Arc<Mutex<MmioTransport>>,
    cid: u64,
    uds: &Path,
    notify: EventFd,
    wake: EventFd,
    filters: Option<crate::sandbox::ThreadFilters>,
) -> Result<VsockHandle, VsockError> {
    let listener = bind(uds)?;
    let epoll = Epoll::new()?;
    let stop = EventFd::new(libc::EFD_NONBLOCK)?;
    let reset = EventFd::new(libc::EFD_NONBLOCK)?;
    for (fd, token) in [
        (stop.as_raw_fd(), TOKEN_STOP),
        (reset.as_raw_fd(), TOKEN_RESET),
        (notify.as_raw_fd(), TOKEN_NOTIFY),
        (wake.as_raw_fd(), TOKEN_WAKE),
    ] {
        epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(EventSet::IN, token))?;
    }
    let muxer = Muxer::new(cid, uds, Some(listener), epoll)?;
    let mut backend = VsockBackend::new(transport, muxer);
    let thread = std::thread::Builder::new().name("kore-vsock".into()).spawn({
        let reset = reset.try_clone()?;
        move || {
            if let Some(Err(e)) = filters.map(|f| f.apply(crate::sandbox::ThreadKind::EventLoop)) {
                tracing::error!(
                    "vsock: confining the event loop failed ({e}); the device stays off"
                );
                return;
            }
            event_loop(&mut backend, &notify, &wake, &reset)
        }
    })?;
    Ok(VsockHandle { stop, reset, thread: Some(thread), uds: uds.to_path_buf() })
}

fn event_loop(b: &mut VsockBackend, notify: &EventFd, wake: &EventFd, reset: &EventFd) {
    let mut events = vec![EpollEvent::default(); 64];
    loop {
        let n = match b.muxer.epoll().wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!("vsock: epoll_wait failed: {e}; the vsock device stops");
                return;
            }
        };
        for ev in &events[..n] {
            match ev.data() {
                TOKEN_STOP => {
                    if tracing::enabled!(tracing::Level::DEBUG) {
                        b.log_state();
                    }
                    return;
                }
                TOKEN_NOTIFY => {
                    let _ = notify.read();
                }
                TOKEN_WAKE => {
                    let _ = wake.read();
                }
                TOKEN_RESET => {
                    let _ = reset.read();
                    b.transport_reset();
                }
                muxer::TOKEN_LISTENER => b.muxer.accept(),
                t => b.muxer.host_event(t, ev.event_set()),
            }
        }
        b.process();
    }
}
