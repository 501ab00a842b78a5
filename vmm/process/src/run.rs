//! The process body: read the spec, boot, confine, supervise.
//!
//! Order matters: while the process has one thread and its privileges, it
//! enters new network and mount namespaces; the VM is built (it opens
//! `/dev/kvm`, the hugepage memory, the pack and binds the vsock socket), its
//! threads install their seccomp filters as they start; then the process
//! drops root (the filters allow exactly that switch), asks to die with its
//! parent, and filters its main thread too. From then on it only waits for
//! the guest to exit or for SIGTERM.

use std::io::Write;
use std::time::Duration;

use kore_vmm::memory::MemoryError;
use kore_vmm::sandbox::{self, ThreadFilters, ThreadKind};
use kore_vmm::{GuestCpu, HugePageSize, RunningVm, Vm, VmConfig, VmError};

use crate::spec::{Confinement, VmmEvent, VmmSpec};

/// Why the process could not run a VM at all (a VM that fails to boot is
/// reported as an [`VmmEvent::Exit`] instead).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The spec on stdin is not a [`VmmSpec`].
    #[error("cannot read the VMM spec on stdin (kore-launch writes it): {0}")]
    Spec(#[source] serde_json::Error),
}

/// Writes one event line to stdout (the parent reads it).
fn emit(ev: &VmmEvent) {
    let mut out = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut out, ev);
    let _ = out.write_all(b"\n").and_then(|_| out.flush());
}

fn warn(message: String) {
    emit(&VmmEvent::Warning { message });
}

/// Runs the VMM process with the spec read from `input`; returns when the
/// guest exits or on SIGTERM (having reported it on stdout).
pub fn run(input: impl std::io::Read) -> Result<(), ProcessError> {
    let spec: VmmSpec = serde_json::from_reader(input).map_err(ProcessError::Spec)?;
    let stop_signals = block_stop_signals();
    let root = euid_is_root();
    let ids = (spec.confine && root).then(sandbox::privileges::unprivileged_ids);
    // An ordinary user's ids, read before a user namespace would show them
    // as the overflow id (the kernel still checks the real ones).
    let (uid, gid) = current_ids();
    let mut confinement = Confinement { pid: std::process::id(), uid, gid, ..Default::default() };
    if spec.confine {
        confinement.namespaces = enter_namespaces(root);
        confinement.seccomp = seccomp_available();
    }
    let filters = ThreadFilters { allow_setid_to: ids, vfio: spec.vf.is_some() };
    let vm = match start(&spec, confinement.seccomp.then_some(filters)) {
        Ok(vm) => vm,
        Err(e) => {
            // The parent says it (one line); this process only reports and ends.
            emit(&VmmEvent::Exit { status: None, error: Some(start_error(&e)), console: vec![] });
            std::process::exit(1);
        }
    };
    if spec.confine {
        confine_process(ids, &mut confinement, filters);
    }
    if root {
        (confinement.uid, confinement.gid) = current_ids();
    }
    emit(&VmmEvent::Started(confinement));
    supervise(vm, &stop_signals);
    Ok(())
}

/// Builds and starts the VM; hugepages short falls back to ordinary pages.
fn start(
    spec: &VmmSpec,
    filters: Option<ThreadFilters>,
) -> std::result::Result<RunningVm, VmError> {
    let pages = match spec.hugepages.as_str() {
        "1G" => HugePageSize::Size1G,
        "off" => HugePageSize::Off,
        _ => HugePageSize::Size2M,
    };
    let config = |pages| {
        let mut c = VmConfig::new(&spec.kernel)
            .user_image(&spec.image)
            .vcpus(spec.vcpus)
            .memory_mib(spec.memory_mib)
            .hugepages(pages)
            .guest_cpu(spec.guest_cpu.parse().unwrap_or(GuestCpu::Host))
            .vsock_uds(&spec.socket)
            .cmdline(spec.cmdline.clone());
        for f in &spec.preload {
            c = c.preload(f);
        }
        if spec.drop_preload_cache {
            c = c.preload_cache(kore_vmm::preload::CacheAfterRead::Drop);
        }
        if let Some(vf) = &spec.vf {
            c = c.vf(vf);
        }
        match filters {
            Some(f) => c.thread_filters(f),
            None => c,
        }
    };
    let mut progress = |p: kore_vmm::Progress| {
        emit(&VmmEvent::Progress { done: p.done, total: p.total });
    };
    match Vm::start(config(pages), &mut progress) {
        // No hugepages reserved (e.g. the first run on a fresh machine): ordinary
        // pages work, only slower to fill and with more TLB misses.
        Err(VmError::Memory(short @ MemoryError::HugepagesShort { .. }))
            if pages != HugePageSize::Off =>
        {
            warn(format!(
                "{short}; booting on ordinary pages this time (`sudo kore-launch setup` reserves hugepages)"
            ));
            Vm::start(config(HugePageSize::Off), &mut progress)
        }
        other => other,
    }
}

/// A start failure in one line; a /dev/kvm this user may not open names the fix.
fn start_error(e: &VmError) -> String {
    match e {
        VmError::Kvm { what: "open /dev/kvm", source }
            if matches!(source.errno(), libc::EACCES | libc::EPERM) =>
        {
            format!(
                "{e}; `sudo kore-launch setup` lets group kvm open /dev/kvm and adds you to \
                 the group (log in again afterwards)"
            )
        }
        _ => e.to_string(),
    }
}

/// Leaves the host's file tree, drops root, dies with the parent, filters
/// the main thread.
fn confine_process(ids: Option<(u32, u32)>, c: &mut Confinement, filters: ThreadFilters) {
    if c.namespaces {
        match sandbox::empty_root() {
            Ok(()) => c.empty_root = true,
            Err(e) => warn(format!("the VMM keeps the host's file tree as its root ({e})")),
        }
    }
    match sandbox::drop_privileges(ids) {
        Ok(d) => d.warnings.into_iter().for_each(warn),
        Err(e) => warn(format!("the VMM keeps its privileges: {e}")),
    }
    // The death signal is cleared by a uid change, so it is set after it.
    // SAFETY: prctl/getppid take integers only.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() == 1 {
            libc::_exit(1);
        }
    }
    if c.seccomp {
        if let Err(e) = filters.apply(ThreadKind::Main) {
            c.seccomp = false;
            warn(format!("the VMM's main thread runs unfiltered: {e}"));
        }
    }
}

/// Waits for the guest to exit or a stop signal; reports the end.
fn supervise(vm: RunningVm, stop_signals: &libc::sigset_t) {
    loop {
        if let Some(outcome) = vm.wait_timeout(Duration::from_millis(50)) {
            let console = tail(vm.console_lines());
            let (status, error) = match outcome {
                Ok(s) => (Some(s), None),
                Err(e) => (None, Some(e.to_string())),
            };
            emit(&VmmEvent::Exit { status, error, console });
            return;
        }
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid signal set and timespec; no siginfo wanted.
        let sig = unsafe { libc::sigtimedwait(stop_signals, std::ptr::null_mut(), &zero) };
        if sig > 0 {
            let console = tail(vm.console_lines());
            vm.stop();
            let error = Some(format!("stopped by signal {sig}"));
            emit(&VmmEvent::Exit { status: None, error, console });
            return;
        }
    }
}

fn tail(mut lines: Vec<String>) -> Vec<String> {
    lines.drain(..lines.len().saturating_sub(15));
    lines
}

/// Blocks SIGTERM, SIGINT and SIGHUP in this thread (and so in every thread
/// it starts): [`supervise`] takes them with `sigtimedwait`.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: sigset operations on a zeroed, then initialised, local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn euid_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn current_ids() -> (u32, u32) {
    // SAFETY: getuid/getgid have no preconditions.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// New network and mount namespaces while the process has one thread (a
/// user namespace too for an ordinary user); a warning when refused.
fn enter_namespaces(root: bool) -> bool {
    match sandbox::enter_namespaces(!root) {
        Ok(()) => true,
        Err(e) => {
            warn(format!("the VMM keeps the host's network and mount namespaces (unshare: {e})"));
            false
        }
    }
}

/// Whether the kernel has seccomp filters (`PR_GET_SECCOMP` answers).
fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no arguments.
    let ok = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0;
    if !ok {
        warn("this kernel has no seccomp: the VMM's threads run unfiltered".into());
    }
    ok
}
