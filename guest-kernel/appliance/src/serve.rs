//! The chat service on vsock: kore-service's sans-I/O `Service` driven by kore-rt's vsock
//! driver on CPU 0 (the device interrupt goes there).
//!
//! One loop: move packets (`dev.poll`), accept new connections, feed received bytes to the
//! service, run at most one engine step, send what the service produced (as far as the
//! peer's credit allows), close connections the service is done with. When nothing moved and
//! no request is running, the vCPU halts in the kernel's WAIT until the device interrupts; a
//! running request is never put to sleep.

use alloc::collections::BTreeMap;
use alloc::vec;

use kore_rt::vsock::{self, ConnId as VConn, Device, Error as VError};
use kore_rt::{clock, kcall, println};

use kore_service::{Clock, Codec, ConnId, Engine, Service};

use crate::cache::{Link, Offer, CACHE_PORT};

/// kore-rt's TSC clock for the service.
#[derive(Debug, Clone, Copy, Default)]
pub struct TscClock;

impl Clock for TscClock {
    fn now_ns(&self) -> u64 {
        clock::now_ns()
    }
}

/// A connection as both layers name it.
struct Conn {
    svc: ConnId,
    /// `on_eof` was reported.
    eof: bool,
}

/// Listens on `port` (and with a `link`, on the prefix cache's [`CACHE_PORT`]), calls
/// `ready` once listening, and serves forever (returns only on a device error).
pub fn run<E: Engine + Offer, C: Codec>(
    dev: &mut Device,
    svc: &mut Service<E, C, TscClock>,
    port: u32,
    mut link: Option<Link>,
    ready: impl FnOnce(),
) -> vsock::DriverError {
    for p in core::iter::once(port).chain(link.as_ref().map(|_| CACHE_PORT)) {
        if let Err(e) = dev.sockets.listen(p) {
            println!("kore-appliance: cannot listen on vsock port {p}: {e:?}");
        }
    }
    ready();
    let mut conns: BTreeMap<VConn, Conn> = BTreeMap::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let mut moved = false;
        loop {
            match dev.poll() {
                Ok(true) => moved = true,
                Ok(false) => break,
                Err(e) => return e,
            }
        }
        while let Some(v) = dev.sockets.accept() {
            match link.as_mut() {
                Some(l) if dev.sockets.addr(v).is_some_and(|a| a.0 == CACHE_PORT) => {
                    l.attach(dev, v)
                }
                _ => drop(conns.insert(v, Conn { svc: svc.open(), eof: false })),
            }
            moved = true;
        }
        moved |= receive(dev, svc, &mut conns, &mut buf);
        if let Some(l) = link.as_mut() {
            moved |= l.receive(dev, svc.engine_mut());
        }
        if svc.has_work() {
            svc.poll();
            moved = true;
        }
        moved |= send(dev, svc, &mut conns);
        if let Some(l) = link.as_mut() {
            moved |= l.flush(dev);
        }
        if !moved && !svc.has_work() && !dev.sockets.has_transmit() {
            kcall::wait();
            dev.ack_interrupt();
        }
    }
}

/// Feeds every readable connection's bytes to the service; reports ends of stream and
/// resets. Returns whether anything happened.
fn receive<E: Engine, C: Codec>(
    dev: &mut Device,
    svc: &mut Service<E, C, TscClock>,
    conns: &mut BTreeMap<VConn, Conn>,
    buf: &mut [u8],
) -> bool {
    let mut moved = false;
    let mut gone = alloc::vec::Vec::new();
    for (v, c) in conns.iter_mut() {
        loop {
            match dev.sockets.read(*v, buf) {
                Ok(0) => {
                    if !c.eof {
                        c.eof = true;
                        svc.on_eof(c.svc);
                        moved = true;
                    }
                    break;
                }
                Ok(n) => {
                    svc.on_bytes(c.svc, &buf[..n]);
                    moved = true;
                }
                Err(VError::WouldBlock) => break,
                Err(_) => {
                    gone.push(*v);
                    break;
                }
            }
        }
    }
    // The peer reset the connection: its running or queued request is cancelled.
    close_all(dev, svc, conns, gone) || moved
}

/// Sends pending output as far as credit allows; closes connections the service finished.
fn send<E: Engine, C: Codec>(
    dev: &mut Device,
    svc: &mut Service<E, C, TscClock>,
    conns: &mut BTreeMap<VConn, Conn>,
) -> bool {
    let mut moved = false;
    let mut gone = alloc::vec::Vec::new();
    for (v, c) in conns.iter() {
        loop {
            let out = svc.output(c.svc);
            if out.is_empty() {
                break;
            }
            match dev.sockets.write(*v, out) {
                Ok(0) | Err(VError::WouldBlock) => break,
                Ok(n) => {
                    svc.consume_output(c.svc, n);
                    moved = true;
                }
                Err(_) => {
                    gone.push(*v);
                    break;
                }
            }
        }
        if svc.output(c.svc).is_empty() && svc.should_close(c.svc) {
            gone.push(*v);
        }
    }
    close_all(dev, svc, conns, gone) || moved
}

/// Closes the connections in `gone` (service side and socket); true if any was open.
fn close_all<E: Engine, C: Codec>(
    dev: &mut Device,
    svc: &mut Service<E, C, TscClock>,
    conns: &mut BTreeMap<VConn, Conn>,
    gone: alloc::vec::Vec<VConn>,
) -> bool {
    let mut closed = false;
    for v in gone {
        if let Some(c) = conns.remove(&v) {
            let (queued, active) = (svc.queued(), svc.active());
            svc.on_closed(c.svc);
            // Requests of this connection that were waiting or running (others may run on).
            let cancelled = (queued + active).saturating_sub(svc.queued() + svc.active());
            if cancelled > 0 {
                println!("kore-appliance: connection closed: cancelled {cancelled} request(s)");
            }
            dev.sockets.close(v);
            closed = true;
        }
    }
    closed
}
