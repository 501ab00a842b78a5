//! The appliance in the Kore VM: boots kore-vmm, in its own confined process
//! ([`super::vmm_process`]), with the Kore kernel and the ring-3 appliance
//! image, the pack preloaded into guest memory (progress bar on stderr), and
//! the vsock device's host socket in a runtime directory; waits until the
//! guest service accepts on port 1025.
//! The guest images come from [`super::images`].

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kore_vmm::vsock::{self, ConnectError};
use kore_vmm::HugePageSize;

use super::vmm_process::{Confinement, VmmProcess, VmmSpec};

use crate::error::{ApplianceError, LaunchError, Result};

/// The chat service's vsock port (docs/protocol.md).
pub const SERVICE_PORT: u32 = 1025;
/// How long a boot may take until the service accepts.
pub const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// [`READY_TIMEOUT`], or `KORE_BOOT_TIMEOUT_S` seconds (slow hosts; tests of a hung guest).
pub fn ready_timeout() -> Duration {
    crate::env::seconds("KORE_BOOT_TIMEOUT_S", READY_TIMEOUT)
}
/// How to boot.
#[derive(Debug, Clone)]
pub struct BootOptions {
    /// vCPUs.
    pub vcpus: u32,
    /// Guest RAM besides the preloaded pack, bytes.
    pub memory_bytes: u64,
    /// Page size backing guest RAM.
    pub hugepages: HugePageSize,
    /// Where the VMM creates the vsock Unix socket.
    pub socket: PathBuf,
    /// Guest images.
    pub images: super::GuestImages,
    /// Guest command line (empty: serve the protocol).
    pub cmdline: String,
    /// The CPU level the guest sees.
    pub guest_cpu: kore_vmm::GuestCpu,
    /// Host PCI function passed through with VFIO (normalised address).
    pub vf: Option<String>,
    /// The prefix cache's (memory, disk) budgets for the link to the guest
    /// (`cache_link`); `None`: the guest keeps checkpoints in memory only.
    pub cache: Option<(u64, u64)>,
}

/// Measured while booting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BootReport {
    /// From starting the VMM until the service accepted on vsock port 1025.
    pub boot_to_ready: Duration,
    /// Bytes preloaded (the pack files).
    pub preload_bytes: u64,
    /// Preload time (first to last byte, as the VMM reported progress).
    pub preload_time: Duration,
    /// vCPUs booted.
    pub vcpus: u32,
}

impl BootReport {
    /// Preload throughput in GB/s (10^9 bytes per second).
    pub fn preload_gbps(&self) -> f64 {
        let s = self.preload_time.as_secs_f64();
        if s > 0.0 {
            self.preload_bytes as f64 / s / 1e9
        } else {
            0.0
        }
    }
}

/// A booted appliance VM.
pub struct VmAppliance {
    vmm: Option<VmmProcess>,
    socket: PathBuf,
    report: BootReport,
    /// The prefix cache's link to the guest (drained before the VM stops).
    cache: Option<super::cache_link::Link>,
}

impl std::fmt::Debug for VmAppliance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmAppliance").field("socket", &self.socket).finish_non_exhaustive()
    }
}

/// Tracks preload progress for the bar and the throughput figure.
struct PreloadMeter {
    bar: ProgressBar,
    start: Instant,
    first: Option<(Instant, u64)>,
    last: Option<Instant>,
    total: u64,
}

impl PreloadMeter {
    fn new() -> Self {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "preloading pack {bar:30} {bytes}/{total_bytes} ({binary_bytes_per_sec})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self { bar, start: Instant::now(), first: None, last: None, total: 0 }
    }

    fn update(&mut self, done: u64, total: u64) {
        let now = Instant::now();
        self.first.get_or_insert((now, done));
        self.last = Some(now);
        self.total = total;
        self.bar.set_length(total);
        self.bar.set_position(done);
    }

    /// Bytes and time from the start of loading to the last byte. The first
    /// report comes after the first chunk; the time before it is counted
    /// from `start` only when there was a single report.
    fn finish(&self) -> (u64, Duration) {
        self.bar.finish_and_clear();
        match (self.first, self.last) {
            (Some((t0, d0)), Some(t1)) if t1 > t0 && d0 < self.total => {
                (self.total - d0, t1.duration_since(t0))
            }
            (_, Some(t1)) => (self.total, t1.duration_since(self.start)),
            _ => (0, Duration::ZERO),
        }
    }
}

impl VmAppliance {
    /// Boots the VM with `pack` preloaded and waits until the service accepts.
    pub fn boot(opts: &BootOptions, pack: &Path) -> Result<VmAppliance> {
        check_pack(pack)?;
        if let Some(dir) = opts.socket.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|source| LaunchError::Io { path: dir.display().to_string(), source })?;
        }
        remove_stale_socket(&opts.socket)?;
        let mut meter = PreloadMeter::new();
        let started = Instant::now();
        let vmm =
            VmmProcess::spawn(&vmm_spec(opts, pack), &mut |done, total| meter.update(done, total));
        let (preload_bytes, preload_time) = meter.finish();
        let vmm = vmm?;
        let mut me = VmAppliance {
            vmm: Some(vmm),
            socket: opts.socket.clone(),
            report: BootReport {
                boot_to_ready: Duration::ZERO,
                preload_bytes,
                preload_time,
                vcpus: opts.vcpus,
            },
            cache: None,
        };
        let first = me.wait_ready(started)?;
        if let Some((memory, disk)) = opts.cache {
            me.cache = super::cache_link::start(&opts.socket, pack, memory, disk);
        }
        me.report.boot_to_ready = started.elapsed();
        drop(first);
        tracing::info!(
            boot_to_ready_ms = me.report.boot_to_ready.as_secs_f64() * 1e3,
            preload_gbps = me.report.preload_gbps(),
            "the Kore appliance is ready"
        );
        Ok(me)
    }

    /// Polls port 1025 until the guest accepts; fails with the console tail
    /// if the guest exits first or the timeout passes.
    fn wait_ready(&mut self, started: Instant) -> Result<UnixStream> {
        loop {
            match vsock::connect(&self.socket, SERVICE_PORT) {
                Ok(s) => return Ok(s),
                Err(e) if is_not_yet(&e) => {}
                Err(e) => return Err(ApplianceError::Vsock(e).into()),
            }
            let vmm = self.vmm.as_mut().ok_or(ApplianceError::Gone)?;
            if let Some(ended) = vmm.wait_timeout(Duration::from_millis(10)) {
                let tail = ended.console.join("\n");
                let how = match (ended.status, &ended.error) {
                    (Some(status), _) => format!("exited with status {status}"),
                    (None, Some(e)) => e.clone(),
                    (None, None) => "ended".to_string(),
                };
                return Err(ApplianceError::EndedEarly { how, console: tail }.into());
            }
            let limit = ready_timeout();
            if started.elapsed() > limit {
                return Err(ApplianceError::BootTimeout { port: SERVICE_PORT, limit }.into());
            }
        }
    }

    /// The vsock socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Boot measurements.
    pub fn report(&self) -> BootReport {
        self.report
    }

    /// What the VMM process confined (pid, uid, seccomp, namespaces).
    pub fn confinement(&self) -> Option<&Confinement> {
        self.vmm.as_ref().map(VmmProcess::confinement)
    }

    /// Stops the VM and removes its socket.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(link) = self.cache.take() {
            link.drain();
        }
        if let Some(mut vmm) = self.vmm.take() {
            vmm.stop();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for VmAppliance {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the VMM process boots for `opts`.
fn vmm_spec(opts: &BootOptions, pack: &Path) -> VmmSpec {
    let hugepages = match opts.hugepages {
        HugePageSize::Size2M => "2M",
        HugePageSize::Size1G => "1G",
        HugePageSize::Off => "off",
    };
    let preload: Vec<_> = crate::host::sizing::PRELOADED.iter().map(|f| pack.join(f)).collect();
    VmmSpec {
        kernel: opts.images.kernel.clone(),
        image: opts.images.image.clone(),
        vcpus: opts.vcpus,
        memory_mib: opts.memory_bytes.div_ceil(1 << 20),
        hugepages: hugepages.into(),
        guest_cpu: opts.guest_cpu.to_string(),
        socket: opts.socket.clone(),
        cmdline: opts.cmdline.clone(),
        drop_preload_cache: drop_preload_cache(&preload, kore_pack::safetensors::mem_available()),
        preload,
        vf: opts.vf.clone(),
        confine: true,
    }
}

/// Whether the VMM drops the pack from the host's page cache as it preloads
/// it: when the pack is over half of the host's available memory (guest RAM
/// already reserved is not available), a cached copy beside the one in guest
/// RAM would crowd out everything else, and a later boot reads the file again.
/// A smaller pack stays cached, so a restart reads it from memory.
fn drop_preload_cache(files: &[PathBuf], available: Option<u64>) -> bool {
    let bytes: u64 = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    let drop = available.is_some_and(|a| bytes.saturating_mul(2) > a);
    if drop {
        tracing::info!(
            "the pack ({bytes} bytes) is over half the available memory: it leaves the page \
             cache as it is preloaded"
        );
    }
    drop
}

/// Fails unless `pack` has every file the guest reads.
pub fn check_pack(pack: &Path) -> Result<()> {
    match crate::host::sizing::PRELOADED.iter().find(|f| !pack.join(f).is_file()) {
        None => Ok(()),
        Some(f) => Err(LaunchError::Model(format!(
            "{}: not a model pack (no {f}); the appliance boots packs — import a Hugging Face \
             directory with `kore-launch pack import DIR -o PACK`",
            pack.display()
        ))),
    }
}

/// A socket file nobody serves is removed so the VMM can bind it; a live one
/// is an error (another appliance uses it).
fn remove_stale_socket(socket: &Path) -> Result<()> {
    if !socket.exists() {
        return Ok(());
    }
    if UnixStream::connect(socket).is_ok() {
        return Err(ApplianceError::SocketInUse(socket.display().to_string()).into());
    }
    std::fs::remove_file(socket)
        .map_err(|source| LaunchError::Io { path: socket.display().to_string(), source })
}

/// Connects to the service through the VM's vsock socket
/// ([`kore_vmm::vsock::connect`]).
pub fn connect_service(socket: &Path) -> Result<UnixStream> {
    vsock::connect(socket, SERVICE_PORT).map_err(|e| ApplianceError::Vsock(e).into())
}

/// Whether a connect failure means "not yet": the socket is not there, the
/// guest does not listen on the port yet, or it has not answered the
/// handshake in time (a busy or hung guest: the boot timeout decides).
fn is_not_yet(e: &ConnectError) -> bool {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    match e {
        ConnectError::Socket { .. } | ConnectError::Refused { .. } => true,
        ConnectError::Io(io) => matches!(io.kind(), WouldBlock | TimedOut),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pack_over_half_the_available_memory_leaves_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = ["a", "b"].iter().map(|n| dir.path().join(n)).collect();
        std::fs::write(&files[0], vec![0u8; 3000]).unwrap();
        std::fs::write(&files[1], vec![0u8; 1000]).unwrap();
        // 4,000 bytes in all: dropped under 8,000 available, kept from 8,000 on.
        assert!(drop_preload_cache(&files, Some(7_999)));
        assert!(!drop_preload_cache(&files, Some(8_000)));
        assert!(!drop_preload_cache(&files, None), "unknown memory: keep");
        assert!(!drop_preload_cache(&[dir.path().join("missing")], Some(1)));
    }
}
