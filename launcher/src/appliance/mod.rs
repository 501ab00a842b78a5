//! The appliance the commands talk to, wherever it runs:
//!
//! - [`Appliance::native`]: kore-service with the kore-appliance adapters on a
//!   thread of this process (`--native`, and tests), reached through pipes;
//! - [`Appliance::boot`]: the Kore VM under kore-vmm with the pack preloaded,
//!   reached through the vsock device's Unix socket (guest port 1025);
//! - [`Appliance::attach`]: a VM started earlier by `kore-launch up`, found by
//!   its socket `RUNTIME_DIR/vsock.sock` ([`socket_path`]).
//!
//! All three speak the same protocol (docs/protocol.md) through
//! [`Appliance::connect`] / [`Appliance::client`], so a command is written
//! once. Dropping an appliance (or [`Appliance::shutdown`]) stops what it
//! started; an attached appliance keeps running.

mod cache_link;
pub mod images;
pub mod import;
pub mod native;
pub mod vm;
pub mod vmm_process;
pub mod watchdog;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use kore_service::host::ServiceHandle;

pub use images::GuestImages;
pub use vm::{BootOptions, BootReport};

use crate::client::{Client, Connection};
use crate::config::Settings;
use crate::error::{ApplianceError, LaunchError, Result};
use crate::host::sizing::Budget;
use crate::host::{HostError, HugepageSize};

/// File name of the vsock socket in a runtime directory.
pub const SOCKET_NAME: &str = "kore.sock";
const MIB: u64 = 1 << 20;

/// The vsock socket of the appliance kept in `runtime_dir`.
pub fn socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(SOCKET_NAME)
}

enum Kind {
    Native(ServiceHandle),
    Vm(vm::VmAppliance),
    Attached(PathBuf),
}

/// A running appliance (see the module docs).
pub struct Appliance {
    kind: Kind,
    /// A per-boot runtime directory to remove at the end.
    own_dir: Option<PathBuf>,
}

impl std::fmt::Debug for Appliance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.kind {
            Kind::Native(_) => "native",
            Kind::Vm(_) => "vm",
            Kind::Attached(_) => "attached",
        };
        f.debug_struct("Appliance").field("kind", &what).finish_non_exhaustive()
    }
}

impl Appliance {
    /// The service in-process over the model at `model` (pack or Hugging Face
    /// directory); returns once the model is loaded (the tests' shorthand).
    #[cfg(test)]
    pub fn native(model: &Path) -> Result<Appliance> {
        Self::native_with(model, &native::NativeOptions::default())
    }

    /// [`Appliance::native`] with the engine's context limit (the configured
    /// `context`; never above the model's own) and thread count.
    pub fn native_with(model: &Path, opts: &native::NativeOptions) -> Result<Appliance> {
        Ok(Appliance { kind: Kind::Native(native::spawn(model, opts)?), own_dir: None })
    }

    /// An appliance over a service already running on a thread of this process (the fuzz
    /// harness's service over the fake engine).
    pub fn in_process(service: ServiceHandle) -> Appliance {
        Appliance { kind: Kind::Native(service), own_dir: None }
    }

    /// Boots the Kore VM for one command: `pack` preloaded, vCPUs, memory and
    /// page size from `settings`, the socket in a private directory under
    /// `settings.runtime_dir` (removed on shutdown). Returns once the guest
    /// service accepts.
    pub fn boot(settings: &Settings, pack: &Path) -> Result<Appliance> {
        let dir = settings.runtime_dir.join(format!("boot-{}", std::process::id()));
        let opts = boot_options(settings, pack, socket_path(&dir))?;
        let result = Self::boot_with(&opts, pack);
        match result {
            Ok(mut a) => {
                a.own_dir = Some(dir);
                Ok(a)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    /// Boots the Kore VM exactly as `opts` say (`kore-launch up` puts the
    /// socket at [`socket_path`] of its runtime directory).
    /// The pack's files are checked against its pack.toml first.
    pub fn boot_with(opts: &BootOptions, pack: &Path) -> Result<Appliance> {
        crate::pack_check::ensure_intact(pack)?;
        Ok(Appliance { kind: Kind::Vm(vm::VmAppliance::boot(opts, pack)?), own_dir: None })
    }

    /// The appliance a command uses for `model` (default: the configured
    /// pack): `native` (or `KORE_APPLIANCE=native`) runs the service
    /// in-process (same protocol and adapters as the guest); otherwise the
    /// appliance running in the runtime directory (`kore-launch up`) if
    /// `attach` and one answers, else the Kore VM booted for this command.
    /// Also returns the model path the settings resolved.
    pub fn open_for(
        model: Option<&Path>,
        native: bool,
        attach: bool,
    ) -> Result<(Appliance, PathBuf)> {
        let overrides =
            crate::config::Overrides { model: model.map(Path::to_path_buf), ..Default::default() };
        Self::open_with(&overrides, native, attach)
    }

    /// [`Appliance::open_for`] with more settings from the command line
    /// (e.g. `vcpus` for `bench --threads`).
    pub fn open_with(
        overrides: &crate::config::Overrides,
        native: bool,
        attach: bool,
    ) -> Result<(Appliance, PathBuf)> {
        let settings = crate::config::effective(overrides)?;
        // The default pack is searched for (cwd up, the executable's checkout).
        let path = crate::model::effective_path(&settings)?;
        if native || crate::env::get("KORE_APPLIANCE").is_some_and(|v| v == "native") {
            let opts = native::NativeOptions {
                context: Some(settings.context),
                threads: overrides.vcpus.map(|n| n as usize),
                cache: Some(settings.cache),
                cache_disk: Some(settings.cache_disk),
            };
            return Ok((Appliance::native_with(&path, &opts)?, path));
        }
        // The guest boots packs: a Hugging Face directory is imported first.
        let path = match import::is_hf_dir(&path) {
            true => import::pack_for(&path, &settings.runtime_dir)?,
            false => path,
        };
        if attach && Appliance::is_running(&settings.runtime_dir) {
            let attached = Appliance::attach(&settings.runtime_dir)?;
            let serves = Some(attached.client()?.info()?.model);
            let wanted = native::model_name(&path);
            if settings.model_is_default || serves.as_deref() == Some(wanted.as_str()) {
                tracing::info!("attaching to the appliance in {}", settings.runtime_dir.display());
                return Ok((attached, path));
            }
            tracing::info!(
                "the appliance in {} serves {serves:?}, not {wanted}: booting a VM for {wanted}",
                settings.runtime_dir.display()
            );
        }
        Ok((Appliance::boot(&settings, &path)?, path))
    }

    /// Attaches to the appliance of `kore-launch up` in `runtime_dir`; fails
    /// with a hint when none answers there.
    pub fn attach(runtime_dir: &Path) -> Result<Appliance> {
        let socket = socket_path(runtime_dir);
        if !socket.exists() {
            let dir = runtime_dir.display().to_string();
            return Err(ApplianceError::NotRunning { dir, socket: SOCKET_NAME }.into());
        }
        let me = Appliance { kind: Kind::Attached(socket), own_dir: None };
        me.client()?.info()?;
        Ok(me)
    }

    /// Whether an appliance answers in `runtime_dir` (for `up`/`status`).
    pub fn is_running(runtime_dir: &Path) -> bool {
        vm::connect_service(&socket_path(runtime_dir)).is_ok()
    }

    /// A new connection to the service.
    pub fn connect(&self) -> Result<Connection> {
        match &self.kind {
            Kind::Native(h) => {
                let (reader, writer) = h.connect().into_split();
                Ok(Connection { reader: Box::new(reader), writer: Box::new(writer) })
            }
            Kind::Vm(v) => unix_connection(v.socket()),
            Kind::Attached(socket) => unix_connection(socket),
        }
    }

    /// A protocol client on a new connection.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::new(self.connect()?))
    }

    /// Boot measurements (VMs this process booted).
    pub fn boot_report(&self) -> Option<BootReport> {
        match &self.kind {
            Kind::Vm(v) => Some(v.report()),
            _ => None,
        }
    }

    /// Where the engine runs: `native`, `vm` or `attached`.
    pub fn placement(&self) -> &'static str {
        match &self.kind {
            Kind::Native(_) => "native",
            Kind::Vm(_) => "vm",
            Kind::Attached(_) => "attached",
        }
    }

    /// What the VMM process of a booted VM confined.
    pub fn confinement(&self) -> Option<&vmm_process::Confinement> {
        match &self.kind {
            Kind::Vm(v) => v.confinement(),
            _ => None,
        }
    }

    /// Stops what this appliance started (the service thread or the VM).
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for Appliance {
    fn drop(&mut self) {
        // Stop the VM / service before removing the socket's directory.
        let kind = std::mem::replace(&mut self.kind, Kind::Attached(PathBuf::new()));
        match kind {
            Kind::Native(h) => h.shutdown(),
            Kind::Vm(v) => v.shutdown(),
            Kind::Attached(_) => {}
        }
        if let Some(dir) = self.own_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A new connection to the service behind `socket`, split into the client's
/// halves; dropping the writer shuts down the write side (end-of-stream for
/// the service). A busy guest's late handshake is waited for up to the
/// watchdog's limit ([`watchdog::Watchdog::connect`]); the reading half is
/// watched: a long silence makes it probe whether the appliance still
/// answers, and a hung one ends the read with an error ([`watchdog`]).
fn unix_connection(socket: &Path) -> Result<Connection> {
    let io = |source| LaunchError::Io { path: "vsock socket".into(), source };
    let watchdog = watchdog::Watchdog::for_socket(socket);
    let stream = watchdog.connect()?;
    let reader = stream.try_clone().map_err(io)?;
    let reader = watchdog::WatchedReader::new(reader, watchdog).map_err(io)?;
    Ok(Connection { reader: Box::new(reader), writer: Box::new(ShutOnDrop(stream)) })
}

struct ShutOnDrop(UnixStream);

impl std::io::Write for ShutOnDrop {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Drop for ShutOnDrop {
    fn drop(&mut self) {
        let _ = self.0.shutdown(std::net::Shutdown::Write);
    }
}

/// The guest memory budget the appliance boots with: `settings`' context,
/// prefix cache and memory, and the KV precision it runs (`engine_options`,
/// which the guest is also told). The boot, `setup` and `doctor` size with this.
pub fn budget(pack: &Path, settings: &Settings) -> std::result::Result<Budget, HostError> {
    Ok(Budget::compute(pack, settings.context, crate::engine_options::current().kv)?
        .with_cache(settings.cache)
        .with_memory(settings.memory))
}

/// Boot options from the effective settings: guest RAM is `settings.memory`
/// or enough for the pack's state at `settings.context` tokens
/// (`host::sizing::Budget::own_memory` of [`budget`], the sizing `setup` and `doctor` use).
pub fn boot_options(settings: &Settings, pack: &Path, socket: PathBuf) -> Result<BootOptions> {
    vm::check_pack(pack)?;
    let hugepages = match settings.hugepage_size {
        HugepageSize::M2 => kore_vmm::HugePageSize::Size2M,
        HugepageSize::G1 => kore_vmm::HugePageSize::Size1G,
        HugepageSize::Off => kore_vmm::HugePageSize::Off,
    };
    // One sizing (host::sizing) gives the guest's memory and what it is told on its command line.
    let budget = budget(pack, settings).map_err(|e| LaunchError::Model(e.to_string()))?;
    if crate::engine_options::current().kernels == Some(kore_engine::simd::Path::Amx) {
        return Err(LaunchError::Usage(
            "KORE_KERNELS=amx runs with --native only: the guest does not enable the AMX tile \
             state; unset it or use avx512vnni"
                .into(),
        ));
    }
    // The link to the host's disk tier: with a memory and a disk budget and a pack.toml.
    let linked = settings.cache > 0 && settings.cache_disk > 0;
    let cache = linked
        .then_some((budget.sessions, settings.cache_disk))
        .filter(|_| cache_link::pack_hex(pack).is_some());
    Ok(BootOptions {
        vcpus: settings.vcpus.max(1),
        memory_bytes: budget.own_memory().div_ceil(2 * MIB) * 2 * MIB,
        hugepages,
        socket,
        images: GuestImages::locate()?,
        cmdline: guest_cmdline(&budget, cache.is_some()),
        guest_cpu: settings.guest_cpu,
        vf: settings.vf.clone(),
        cache,
    })
}

/// The guest's command line: the engine's context limit, the KV positions its
/// running sequences share and the kept-session budget, all from the sizing
/// the guest's memory was made with, then the engine options this process
/// runs with (`KORE_KERNELS`, ...: the same as `--native`), then the words of
/// `KORE_GUEST_CMDLINE_APPEND` (debugging and fault tests).
fn guest_cmdline(b: &crate::host::sizing::Budget, linked: bool) -> String {
    let extra = crate::env::get("KORE_GUEST_CMDLINE_APPEND").unwrap_or_default();
    let extra = extra.split_whitespace().fold(String::new(), |s, w| s + " " + w);
    let link = match linked.then(|| cache_link::pack_hex(&b.pack)).flatten() {
        Some(hex) => format!(" cache_pack={hex}"),
        None => String::new(),
    };
    format!(
        "context={} kv_tokens={} sessions_mib={}{link}{}{extra}",
        b.context.min(u64::from(u32::MAX)),
        b.kv_tokens,
        b.sessions >> 20,
        crate::engine_options::current().cmdline_words()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kore_protocol::{Event, Finish, GenerateRequest, Id, Request};

    fn tiny_hf() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny-hf")
    }

    #[test]
    fn native_appliance_serves_info_generation_and_cancel() {
        let a = Appliance::native(&tiny_hf()).expect("native appliance");
        assert_eq!(a.placement(), "native");
        assert!(a.boot_report().is_none());
        let mut c = a.client().unwrap();
        let info = c.info().unwrap();
        assert_eq!((info.model.as_str(), info.context_limit), ("tiny-hf", 4096));
        // A second connection works while the first one is open.
        let mut c2 = a.client().unwrap();
        let mut req = GenerateRequest::completion("ROMEO:");
        req.max_tokens = Some(5);
        let done = c2.generate(req, |_| {}).unwrap();
        assert_eq!((done.token_ids.len(), done.finish), (5, Finish::Length));
        // A cancelled request ends with "cancelled".
        let mut req = GenerateRequest::completion("JULIET:");
        (req.id, req.max_tokens) = (Id::from("c"), Some(4000));
        c.send(&Request::Generate(req)).unwrap();
        c.send(&Request::Cancel(Id::from("c"))).unwrap();
        match c.wait(&Id::from("c"), |_| {}).unwrap() {
            Event::Done(d) => assert_eq!(d.finish, Finish::Cancelled),
            other => panic!("{other:?}"),
        }
        a.shutdown();
    }

    #[test]
    fn native_appliance_reports_a_bad_model_directory() {
        let err = Appliance::native(Path::new("/nonexistent/model")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/model"), "{err}");
    }

    #[test]
    fn attach_without_an_appliance_says_how_to_start_one() {
        let dir = std::env::temp_dir().join(format!("kore-attach-test-{}", std::process::id()));
        let err = Appliance::attach(&dir).unwrap_err().to_string();
        assert!(err.contains("kore-launch up"), "{err}");
        assert!(!Appliance::is_running(&dir));
    }
}
