//! Host adapter (`std` feature): runs a [`Service`] on its own thread and
//! serves it to in-process clients ([`ServiceHandle::connect`], a duplex byte
//! pipe — what `kore-launch --native` chat/batch can use to share the guest's
//! exact protocol code) and to Unix-socket clients ([`serve_unix`]).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Instant;

use crate::codec::Codec;
use crate::engine::{Clock, Engine};
use crate::service::{ConnId, Service};

/// A [`Clock`] over `std::time::Instant`.
#[derive(Debug, Clone, Copy)]
pub struct StdClock(Instant);

impl StdClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self(Instant::now())
    }
}

impl Default for StdClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for StdClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Messages from clients to the service thread.
enum Msg {
    Open(u64, Sender<Vec<u8>>),
    Bytes(u64, Vec<u8>),
    Eof(u64),
    Closed(u64),
    Shutdown,
}

/// Owner of the service thread; dropping it stops the service.
#[derive(Debug)]
pub struct ServiceHandle {
    tx: Sender<Msg>,
    next: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Msg")
    }
}

impl ServiceHandle {
    /// Builds the service with `make` on a new thread (so the engine need not
    /// be `Send`) and runs its event loop there.
    pub fn spawn<E, C, K, F>(make: F) -> io::Result<Self>
    where
        E: Engine,
        C: Codec,
        K: Clock,
        F: FnOnce() -> Service<E, C, K> + Send + 'static,
    {
        let (tx, rx) = channel();
        let thread = thread::Builder::new()
            .name(String::from("kore-service"))
            .spawn(move || run(make(), &rx))?;
        Ok(Self { tx, next: Arc::new(AtomicU64::new(0)), thread: Some(thread) })
    }

    /// Runs `body` on a new service thread with a [`Runner`]; `body` builds
    /// the service there and calls [`Runner::run`]. Unlike [`Self::spawn`],
    /// whatever the service borrows (a model borrowing its memory-mapped
    /// weights) can live on that thread's stack. If `body` returns without
    /// running, the handle's connections read EOF at once.
    pub fn spawn_with<F>(body: F) -> io::Result<Self>
    where
        F: FnOnce(Runner) + Send + 'static,
    {
        let (tx, rx) = channel();
        let thread = thread::Builder::new()
            .name(String::from("kore-service"))
            .spawn(move || body(Runner { rx }))?;
        Ok(Self { tx, next: Arc::new(AtomicU64::new(0)), thread: Some(thread) })
    }

    /// Opens an in-process connection.
    pub fn connect(&self) -> PipeStream {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let (out_tx, out_rx) = channel();
        let _ = self.tx.send(Msg::Open(key, out_tx));
        PipeStream {
            reader: PipeReader { key, tx: self.tx.clone(), rx: out_rx, buf: Vec::new(), pos: 0 },
            writer: PipeWriter { key, tx: self.tx.clone() },
        }
    }

    /// Stops the service thread (in-flight requests are dropped).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.tx.send(Msg::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServiceHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The service side of a [`ServiceHandle::spawn_with`] thread.
#[derive(Debug)]
pub struct Runner {
    rx: Receiver<Msg>,
}

impl Runner {
    /// Serves the handle's connections with `svc` until the handle shuts down.
    pub fn run<E: Engine, C: Codec, K: Clock>(self, svc: Service<E, C, K>) {
        run(svc, &self.rx);
    }
}

/// A client connection: write request lines, read response lines. Dropping
/// it is a disconnect (its requests are cancelled).
#[derive(Debug)]
pub struct PipeStream {
    reader: PipeReader,
    writer: PipeWriter,
}

impl PipeStream {
    /// Splits into a reading half (dropping it disconnects) and a writing
    /// half (dropping it is EOF: requests already sent still complete).
    pub fn into_split(self) -> (PipeReader, PipeWriter) {
        (self.reader, self.writer)
    }

    /// Signals EOF on the sending side; responses keep coming.
    pub fn shutdown_write(&mut self) {
        let _ = self.writer.tx.send(Msg::Eof(self.writer.key));
    }
}

impl Read for PipeStream {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        self.reader.read(out)
    }
}

impl Write for PipeStream {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.writer.write(data)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reading half of a [`PipeStream`]; reads return 0 once the service closed
/// the connection.
#[derive(Debug)]
pub struct PipeReader {
    key: u64,
    tx: Sender<Msg>,
    rx: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for PipeReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.buf = chunk;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Drop for PipeReader {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Closed(self.key));
    }
}

/// Writing half of a [`PipeStream`].
#[derive(Debug)]
pub struct PipeWriter {
    key: u64,
    tx: Sender<Msg>,
}

impl Write for PipeWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.tx
            .send(Msg::Bytes(self.key, data.to_vec()))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the service has stopped"))?;
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for PipeWriter {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Eof(self.key));
    }
}

/// The service thread's event loop.
fn run<E: Engine, C: Codec, K: Clock>(mut svc: Service<E, C, K>, rx: &Receiver<Msg>) {
    let mut conns: HashMap<u64, (ConnId, Sender<Vec<u8>>)> = HashMap::new();
    loop {
        let msg = if svc.has_work() {
            match rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => return,
            }
        };
        match msg {
            Some(Msg::Shutdown) => return,
            Some(m) => {
                apply(&mut svc, &mut conns, m);
                // Take every message already waiting before the next step.
                while let Ok(m) = rx.try_recv() {
                    if matches!(m, Msg::Shutdown) {
                        return;
                    }
                    apply(&mut svc, &mut conns, m);
                }
            }
            None => {}
        }
        if svc.has_work() {
            svc.poll();
        }
        flush(&mut svc, &mut conns);
    }
}

fn apply<E: Engine, C: Codec, K: Clock>(
    svc: &mut Service<E, C, K>,
    conns: &mut HashMap<u64, (ConnId, Sender<Vec<u8>>)>,
    msg: Msg,
) {
    match msg {
        Msg::Open(key, out) => {
            let id = svc.open();
            conns.insert(key, (id, out));
        }
        Msg::Bytes(key, bytes) => {
            if let Some((id, _)) = conns.get(&key) {
                svc.on_bytes(*id, &bytes);
            }
        }
        Msg::Eof(key) => {
            if let Some((id, _)) = conns.get(&key) {
                svc.on_eof(*id);
            }
        }
        Msg::Closed(key) => {
            if let Some((id, _)) = conns.remove(&key) {
                svc.on_closed(id);
            }
        }
        Msg::Shutdown => {}
    }
}

fn flush<E: Engine, C: Codec, K: Clock>(
    svc: &mut Service<E, C, K>,
    conns: &mut HashMap<u64, (ConnId, Sender<Vec<u8>>)>,
) {
    let mut gone = Vec::new();
    for (key, (id, out)) in conns.iter() {
        let bytes = svc.take_output(*id);
        let delivered = bytes.is_empty() || out.send(bytes).is_ok();
        if !delivered || svc.should_close(*id) {
            gone.push(*key);
        }
    }
    for key in gone {
        if let Some((id, _)) = conns.remove(&key) {
            svc.on_closed(id);
        }
    }
}

/// Serves `listener` with two threads per accepted connection (socket to
/// service, service to socket) until accepting fails. A client whose socket
/// closes is cancelled at the service's next write to it.
pub fn serve_unix(listener: UnixListener, handle: &ServiceHandle) -> io::Result<()> {
    for stream in listener.incoming() {
        let stream = stream?;
        let (reader, writer) = handle.connect().into_split();
        spawn_pumps(stream, reader, writer)?;
    }
    Ok(())
}

fn spawn_pumps(
    stream: UnixStream,
    mut from_service: PipeReader,
    mut to_service: PipeWriter,
) -> io::Result<()> {
    let mut inbound = stream.try_clone()?;
    let mut outbound = stream;
    thread::Builder::new().name(String::from("kore-service-in")).spawn(move || {
        let _ = io::copy(&mut inbound, &mut to_service);
    })?;
    thread::Builder::new().name(String::from("kore-service-out")).spawn(move || {
        let _ = io::copy(&mut from_service, &mut outbound);
        let _ = outbound.shutdown(std::net::Shutdown::Both);
    })?;
    Ok(())
}
