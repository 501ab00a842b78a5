//! Per-thread seccomp-bpf allowlists of the VMM.
//!
//! Each VMM thread installs the filter of its [`ThreadKind`] itself, once its
//! setup is done and before it touches anything the guest controls. Filters
//! are inherited by threads created later and can never be removed or
//! widened. A call outside the list kills the process (`SIGSYS`, exit status
//! 159 from a shell); opening and unlinking files fail with `EACCES` instead
//! ([`DENIED`]): glibc's allocator may probe `/proc/sys/vm/overcommit_memory`
//! on any thread, and the vsock device removes its socket file when it stops.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The kinds of VMM thread, each with its own allowlist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// Runs one vCPU: `KVM_RUN`, register reads for crash reports, device
    /// register accesses (eventfd writes), console writes.
    Vcpu,
    /// The virtio-vsock event loop: epoll, accepting on the host's Unix
    /// socket and moving bytes, eventfds.
    EventLoop,
    /// The VMM's main thread after start: waits for the vCPUs, forwards
    /// signals, stops the VM (kicks vCPUs with `tgkill`).
    Main,
}

/// What a VM's threads install when they start ([`crate::VmConfig::thread_filters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadFilters {
    /// The uid/gid the process will drop to after its threads started: the
    /// filters then also allow `setgroups` and `setresgid`/`setresuid` to
    /// exactly these ids (glibc runs them on every thread), and nothing else.
    pub allow_setid_to: Option<(u32, u32)>,
    /// A VFIO device is passed through: vCPU and main threads may also make
    /// any `ioctl` and `pread64`/`pwrite64` (VFIO's config space, trapped
    /// BARs, interrupt setup and teardown).
    pub vfio: bool,
}

impl ThreadFilters {
    /// Installs the filters of `kind` on the calling thread.
    pub fn apply(&self, kind: ThreadKind) -> Result<(), SeccompError> {
        for program in filter(kind, *self)? {
            seccompiler::apply_filter(&program)?;
        }
        tracing::debug!(?kind, "seccomp filter installed");
        Ok(())
    }
}

/// Why a filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The rule set is invalid (a bug).
    #[error("building the seccomp filter failed: {0}")]
    Build(#[from] seccompiler::BackendError),
    /// The kernel refused the filter (no seccomp support, or no permission).
    #[error(
        "installing the seccomp filter failed: {0}; run on a kernel with CONFIG_SECCOMP_FILTER"
    )]
    Install(#[from] seccompiler::Error),
}

// KVM ioctl request numbers (linux/kvm.h).
vmm_sys_util::ioctl_io_nr!(KVM_RUN, 0xAE, 0x80);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_REGS, 0xAE, 0x81, kvm_bindings::kvm_regs);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_REGS, 0xAE, 0x82, kvm_bindings::kvm_regs);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_SREGS, 0xAE, 0x83, kvm_bindings::kvm_sregs);
vmm_sys_util::ioctl_ior_nr!(KVM_GET_LAPIC, 0xAE, 0x8e, kvm_bindings::kvm_lapic_state);
vmm_sys_util::ioctl_iow_nr!(KVM_SET_GSI_ROUTING, 0xAE, 0x6a, kvm_bindings::kvm_irq_routing);
vmm_sys_util::ioctl_iow_nr!(KVM_IRQFD, 0xAE, 0x76, kvm_bindings::kvm_irqfd);

/// Calls that fail with `EACCES` instead of killing the process. `socket`
/// among them refuses guest-initiated vsock streams (the muxer answers the
/// guest with a reset): nothing in the appliance uses them, and a confined
/// VMM must not reach the host's Unix sockets (D-Bus and the like).
const DENIED: &[i64] =
    &[libc::SYS_openat, libc::SYS_open, libc::SYS_unlink, libc::SYS_unlinkat, libc::SYS_socket];

/// System calls every VMM thread needs: memory, futexes, signals, time,
/// thread exit, writes to already-open descriptors.
const COMMON: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    // Rust's debug builds check a descriptor with F_GETFD when dropping it.
    libc::SYS_fcntl,
    libc::SYS_futex,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_mremap,
    libc::SYS_brk,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_gettid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// Extra calls of the event loop.
const EVENT_LOOP: &[i64] = &[
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_ctl,
    libc::SYS_accept4,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
];

/// Extra calls of the main thread.
const MAIN: &[i64] = &[
    libc::SYS_tgkill,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_wait4,
];

fn cond(index: u8, value: u64) -> SeccompCondition {
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .expect("valid condition")
}

fn arg_eq(index: u8, value: u64) -> SeccompRule {
    SeccompRule::new(vec![cond(index, value)]).expect("non-empty rule")
}

/// `setgroups(0, _)`, `setresgid(g, g, g)` and `setresuid(u, u, u)`.
fn setid_rules(uid: u32, gid: u32) -> [(i64, Vec<SeccompRule>); 3] {
    let all3 = |v: u32| {
        SeccompRule::new((0..3).map(|i| cond(i, v as u64)).collect()).expect("non-empty rule")
    };
    [
        (libc::SYS_setgroups, vec![arg_eq(0, 0)]),
        (libc::SYS_setresgid, vec![all3(gid)]),
        (libc::SYS_setresuid, vec![all3(uid)]),
    ]
}

fn ioctls(requests: &[u64]) -> Vec<SeccompRule> {
    requests.iter().map(|&r| arg_eq(1, r)).collect()
}

/// The allowlist of `kind`: system call number -> rules (empty: any arguments).
fn rules(kind: ThreadKind, f: ThreadFilters) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut m: BTreeMap<i64, Vec<SeccompRule>> =
        COMMON.iter().chain(DENIED).map(|&s| (s, vec![])).collect();
    match kind {
        ThreadKind::Vcpu => {
            let kvm = [KVM_RUN(), KVM_GET_REGS(), KVM_SET_REGS(), KVM_GET_SREGS(), KVM_GET_LAPIC()];
            m.insert(libc::SYS_ioctl, ioctls(&kvm.map(u64::from)));
        }
        ThreadKind::EventLoop => {
            m.extend(EVENT_LOOP.iter().map(|&s| (s, vec![])));
            m.insert(libc::SYS_ioctl, ioctls(&[libc::FIONBIO]));
        }
        ThreadKind::Main => m.extend(MAIN.iter().map(|&s| (s, vec![]))),
    }
    if let Some((uid, gid)) = f.allow_setid_to {
        m.extend(setid_rules(uid, gid));
    }
    if f.vfio && kind != ThreadKind::EventLoop {
        m.insert(libc::SYS_ioctl, vec![]);
        m.extend([libc::SYS_pread64, libc::SYS_pwrite64].map(|s| (s, vec![])));
    }
    m
}

/// The compiled filters for `kind`, in installation order: [`DENIED`] ->
/// `EACCES`, then the allowlist (anything else kills the process; installing
/// it last matters: it forbids the `prctl` and `seccomp` calls that install
/// filters). The kernel runs every installed filter and takes the strictest
/// answer.
pub fn filter(kind: ThreadKind, f: ThreadFilters) -> Result<Vec<BpfProgram>, SeccompError> {
    let allow = SeccompFilter::new(
        rules(kind, f),
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )?;
    let no_open = SeccompFilter::new(
        DENIED.iter().map(|&s| (s, vec![])).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        TargetArch::x86_64,
    )?;
    Ok(vec![no_open.try_into()?, allow.try_into()?])
}

/// Installs the filters of `kind` on the calling thread (and sets its
/// `NO_NEW_PRIVS`). Irreversible.
pub fn apply(kind: ThreadKind) -> Result<(), SeccompError> {
    ThreadFilters::default().apply(kind)
}
