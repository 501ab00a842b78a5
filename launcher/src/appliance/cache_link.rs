//! The host's end of the guest's prefix-cache link (vsock port 1026; the
//! guest's end is guest-kernel/appliance/src/cache.rs, the design is in
//! docs/architecture.md, "Prefix cache"). The guest has no disk: after boot
//! the host hands it the pack's checkpoint files that matter most
//! (`DiskTier::newest`: where conversations part, then the most recent; up to
//! the guest's memory-tier budget), waits for its acknowledgement, then keeps
//! every checkpoint file the guest sends in the disk tier under
//! `$XDG_CACHE_HOME/kore/...`, as the native engine would.
//!
//! Frames: a little-endian `u64` length, then a checkpoint file; a zero
//! length ends the host's hand-over and is the guest's acknowledgement.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kore_appliance::disk::DiskTier;
use kore_engine::snapshot::file::Identity;

/// The guest's vsock port for checkpoint files.
pub const CACHE_PORT: u32 = 1026;
/// How long the hand-over may take before the boot goes on without it.
const HANDOVER: Duration = Duration::from_secs(600);
/// How long [`Link::drain`] waits without a byte from the guest before it gives up.
const DRAIN_SILENCE: Duration = Duration::from_secs(5);

/// The running link: what [`Link::drain`] needs before the VM stops.
#[derive(Debug)]
pub struct Link {
    conn: UnixStream,
    drained: Receiver<()>,
    /// Milliseconds since `epoch` when the guest last sent a byte.
    last: Arc<AtomicU64>,
    epoch: Instant,
}

impl Link {
    /// Asks the guest for the checkpoints it still holds and waits until it
    /// says all are sent (or it is silent for a few seconds), so that the
    /// files of a one-shot command's last request are kept.
    pub fn drain(mut self) {
        // Silence counts from now.
        self.last.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        if self.conn.write_all(&0u64.to_le_bytes()).is_err() {
            return;
        }
        loop {
            match self.drained.recv_timeout(Duration::from_millis(200)) {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            let now = self.epoch.elapsed().as_millis() as u64;
            let silent = now.saturating_sub(self.last.load(Ordering::Relaxed));
            if silent > DRAIN_SILENCE.as_millis() as u64 {
                tracing::warn!("prefix cache: the guest did not finish sending its checkpoints");
                return;
            }
        }
    }
}

/// The pack identity in hex for the guest's `cache_pack=` word, `None` for
/// a directory without pack.toml (then the guest keeps checkpoints in memory only).
pub fn pack_hex(pack: &Path) -> Option<String> {
    let d = super::native::pack_digest(pack)?;
    Some(d.iter().map(|b| format!("{b:02x}")).collect())
}

/// The identity of the guest's checkpoint files for `pack` (its digest, its
/// model's shape, the KV precision this process passes the guest).
fn identity(pack: &Path) -> Option<Identity> {
    let text = std::fs::read_to_string(pack.join("pack.toml")).ok()?;
    let manifest = kore_pack::manifest::Manifest::parse(&text).ok()?;
    Some(Identity {
        pack: super::native::pack_digest(pack)?,
        shape: kore_engine::snapshot::Shape::of(&manifest.model_config()),
        kv: crate::engine_options::current().kv,
    })
}

/// Connects to the guest behind `socket`, hands it the files of `pack`'s
/// disk tier (at most `memory` bytes) and starts the thread that keeps
/// what the guest sends (at most `disk` bytes on disk); `None` (logged)
/// when there is no disk tier or no link.
pub fn start(socket: &Path, pack: &Path, memory: u64, disk: u64) -> Option<Link> {
    let id = identity(pack)?;
    let root = kore_appliance::disk::default_root()?;
    let tier = match DiskTier::open(&root, id, disk) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(
                "prefix cache: cannot open {} ({e}); guest checkpoints stay in memory",
                root.display()
            );
            return None;
        }
    };
    let mut conn = match kore_vmm::vsock::connect(socket, CACHE_PORT) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(
                "prefix cache: no link to the guest ({e}); its checkpoints stay in memory"
            );
            return None;
        }
    };
    if let Err(e) = hand_over(&mut conn, &tier, memory) {
        tracing::warn!("prefix cache: handing checkpoints to the guest failed: {e}");
        return None;
    }
    let (tx, drained) = mpsc::channel();
    let (epoch, last) = (Instant::now(), Arc::new(AtomicU64::new(0)));
    let reader = conn.try_clone().ok()?;
    let progress = Progress { last: Arc::clone(&last), epoch };
    std::thread::Builder::new()
        .name("kore-cache-link".into())
        .spawn(move || keep(reader, &tier, &tx, &progress))
        .ok()?;
    Some(Link { conn, drained, last, epoch })
}

/// Where the keeping thread notes that the guest sent something.
struct Progress {
    last: Arc<AtomicU64>,
    epoch: Instant,
}

impl Progress {
    fn touch(&self) {
        self.last.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Sends the chosen files (least wanted first), the end frame, and waits
/// for the guest's acknowledgement.
fn hand_over(conn: &mut UnixStream, tier: &DiskTier, memory: u64) -> std::io::Result<()> {
    let started = Instant::now();
    let (mut files, mut bytes) = (0, 0u64);
    for path in tier.newest(memory) {
        let Some(file) = tier.read_checked(&path) else { continue };
        conn.write_all(&(file.len() as u64).to_le_bytes())?;
        conn.write_all(&file)?;
        files += 1;
        bytes += file.len() as u64;
    }
    conn.write_all(&0u64.to_le_bytes())?;
    conn.set_read_timeout(Some(HANDOVER))?;
    let mut ack = [0u8; 8];
    conn.read_exact(&mut ack)?;
    conn.set_read_timeout(None)?;
    if ack != [0; 8] {
        return Err(std::io::Error::other(
            "the guest answered something else than its acknowledgement",
        ));
    }
    tracing::info!(files, bytes, ms = started.elapsed().as_millis() as u64, dir = %tier.dir().display(),
        "prefix cache: checkpoint files handed to the guest");
    Ok(())
}

/// Keeps each checkpoint file the guest sends until it closes the link; a
/// zero-length frame answers [`Link::drain`].
fn keep(mut conn: UnixStream, tier: &DiskTier, drained: &Sender<()>, progress: &Progress) {
    loop {
        let mut len = [0u8; 8];
        if conn.read_exact(&mut len).is_err() {
            return;
        }
        progress.touch();
        let len = u64::from_le_bytes(len);
        if len == 0 {
            let _ = drained.send(());
            continue;
        }
        if len > tier.stats().budget {
            tracing::warn!("prefix cache: the guest sent a {len}-byte frame, over the disk budget; link closed");
            return;
        }
        let Some(file) = read_frame(&mut conn, len, progress) else { return };
        match tier.persist_bytes(file) {
            // Written before the next is read: the writer's queue never drops the guest's.
            Ok(()) => tier.flush(),
            Err(e) => tracing::warn!("prefix cache: ignoring a checkpoint from the guest: {e}"),
        }
    }
}

/// `len` bytes from `conn`, noting progress as they come; `None` if the link ends first.
fn read_frame(conn: &mut UnixStream, len: u64, progress: &Progress) -> Option<Vec<u8>> {
    let mut file = Vec::with_capacity(usize::try_from(len).ok()?);
    let mut chunk = vec![0u8; 1 << 20];
    while (file.len() as u64) < len {
        let want = chunk.len().min((len - file.len() as u64) as usize);
        match conn.read(&mut chunk[..want]) {
            Ok(0) | Err(_) => return None,
            Ok(n) => file.extend_from_slice(&chunk[..n]),
        }
        progress.touch();
    }
    Some(file)
}
