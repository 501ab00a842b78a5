//! vCPU threads: the `KVM_RUN` loop, exit dispatch to the buses and the
//! lifecycle ports, crash reports, and stopping a vCPU with one kick.
//!
//! Stopping follows Firecracker: each vCPU thread publishes its `kvm_run`
//! area's `immediate_exit` byte in a thread-local; [`kick`] sends the thread
//! one signal whose handler sets that byte. A vCPU inside `KVM_RUN` leaves it
//! with `EINTR`; one about to enter returns at once, so a kick that lands
//! between the loop's stop check and `KVM_RUN` is not lost.

use std::cell::Cell;
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::Instant;

use kore_boot_abi::{layout, ports, BootInfo};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::cpu;
use crate::running::{CrashReport, Outcome, Shared};

thread_local! {
    /// This thread's vCPU `immediate_exit` byte (null when the thread runs no vCPU).
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal that kicks a vCPU thread out of `KVM_RUN`.
pub fn kick_signal() -> i32 {
    vmm_sys_util::signal::SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only a thread-local read and a byte store: async-signal-safe.
    let p = IMMEDIATE_EXIT.with(Cell::get);
    if !p.is_null() {
        // SAFETY: `p` points into this thread's live `kvm_run` mapping; it is
        // published by `Runner::new` and cleared before the VcpuFd is dropped.
        unsafe { p.write_volatile(1) };
    }
}

/// Installs the kick handler once per process.
pub fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = vmm_sys_util::signal::register_signal_handler(kick_signal(), on_kick) {
            tracing::warn!("cannot install the vCPU kick signal handler: {e}");
        }
    });
}

/// Sends `thread` the kick signal once (see the module doc).
pub fn kick<T>(thread: &JoinHandle<T>) {
    // SAFETY: the thread is not joined (we hold its handle), so its pthread_t
    // is valid; the signal's handler is installed and only stores a byte.
    let r = unsafe { libc::pthread_kill(thread.as_pthread_t(), kick_signal()) };
    if r != 0 && r != libc::ESRCH {
        tracing::warn!("kicking a vCPU thread failed: errno {r}");
    }
}

/// A vCPU fd whose `immediate_exit` byte the kick handler can reach while it lives.
pub struct Runner {
    vcpu: VcpuFd,
}

impl Runner {
    /// Publishes `vcpu`'s `immediate_exit` byte for this thread's kick handler.
    pub fn new(mut vcpu: VcpuFd) -> Self {
        let p = std::ptr::addr_of_mut!(vcpu.get_kvm_run().immediate_exit);
        IMMEDIATE_EXIT.with(|c| c.set(p));
        Self { vcpu }
    }

    /// One `KVM_RUN`. After it fails with `EINTR` (a kick), call
    /// [`Runner::clear_kick`] before running again.
    pub fn run(&mut self) -> Result<VcpuExit<'_>, kvm_ioctls::Error> {
        self.vcpu.run()
    }

    /// Clears `immediate_exit` so the next [`Runner::run`] enters the guest.
    pub fn clear_kick(&mut self) {
        self.vcpu.set_kvm_immediate_exit(0);
    }

    /// The vCPU fd.
    pub fn fd(&self) -> &VcpuFd {
        &self.vcpu
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        IMMEDIATE_EXIT.with(|c| c.set(std::ptr::null_mut()));
    }
}

/// Runs vCPU `cpu` of `ncpus` until the VM stops. APs (cpu > 0) first wait
/// for the BSP's `SMP_RELEASE` and enter at the AP entry it wrote.
pub(crate) fn run(
    vcpu: VcpuFd,
    cpu: u32,
    ncpus: u32,
    entry: u64,
    sh: Arc<Shared>,
    mem: GuestMemoryMmap,
    filters: Option<crate::sandbox::ThreadFilters>,
) {
    let mut runner = Runner::new(vcpu);
    if let Some(Err(e)) = filters.map(|f| f.apply(crate::sandbox::ThreadKind::Vcpu)) {
        crash(&runner, cpu, format!("vCPU thread confinement failed: {e}"), &sh);
        return;
    }
    if cpu != 0 {
        sh.wait_release();
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let ap_entry = GuestAddress(layout::BOOT_INFO + BootInfo::AP_ENTRY_OFFSET as u64);
        let ap: u64 = mem.read_obj(ap_entry).unwrap_or(0);
        let rip = if ap != 0 { ap } else { entry };
        if let Err(e) = cpu::set_regs(runner.fd(), cpu, ncpus, rip) {
            crash(&runner, cpu, format!("AP setup failed: {e}"), &sh);
            return;
        }
    }
    while !sh.stop.load(Ordering::SeqCst) {
        let (reason, kicked) = match runner.run() {
            Ok(exit) => (handle_exit(&sh, exit), false),
            Err(e) if e.errno() == libc::EINTR => (None, true),
            Err(e) if e.errno() == libc::EAGAIN => (None, false),
            Err(e) => (Some(format!("KVM_RUN failed: {e}")), false),
        };
        if kicked {
            // The stop flag was set before the kick: the loop check sees it.
            runner.clear_kick();
        }
        if let Some(reason) = reason {
            crash(&runner, cpu, reason, &sh);
            return;
        }
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        let fd = runner.fd();
        tracing::debug!("vcpu{cpu} stopped: {}; {}", registers(fd), lapic_summary(fd));
    }
}

/// Serves one exit; `Some(reason)` if it ends the VM as a crash.
fn handle_exit(sh: &Shared, exit: VcpuExit<'_>) -> Option<String> {
    match exit {
        VcpuExit::IoOut(port, data) => io_out(sh, port, data),
        VcpuExit::IoIn(port, data) => {
            if !sh.pio.read(port.into(), data) {
                data.fill(0xff);
            }
        }
        VcpuExit::MmioRead(addr, data) => {
            if !sh.mmio.read(addr, data) {
                data.fill(0);
                tracing::trace!("unclaimed MMIO read at {addr:#x}");
            }
        }
        VcpuExit::MmioWrite(addr, data) => {
            if !sh.mmio.write(addr, data) {
                tracing::trace!("unclaimed MMIO write at {addr:#x}");
            }
        }
        VcpuExit::Hlt => return Some("hlt with interrupts off in userspace-handled HLT".into()),
        VcpuExit::Shutdown => return Some("shutdown (triple fault)".into()),
        VcpuExit::FailEntry(reason, c) => {
            return Some(format!("VM entry failed (hardware reason {reason:#x}, cpu {c})"))
        }
        VcpuExit::InternalError => {
            return Some(
                "KVM internal error (on nested PVM hosts: SIMD/AVX/XSAVE at CPL0, or an \
                 unemulatable instruction)"
                    .into(),
            )
        }
        VcpuExit::SystemEvent(t, _) => return Some(format!("system event {t}")),
        other => return Some(format!("unexpected exit {other:?}")),
    }
    None
}

/// Port writes: the lifecycle ports are the VM's own, the rest go to the bus.
fn io_out(sh: &Shared, port: u16, data: &[u8]) {
    let mut v = [0u8; 4];
    let n = data.len().min(4);
    v[..n].copy_from_slice(&data[..n]);
    let value = u32::from_le_bytes(v);
    match port {
        ports::DEBUG_EXIT => sh.finish(Outcome::Exited(value)),
        ports::MARKER => {
            sh.markers.lock().unwrap_or_else(|e| e.into_inner()).push((value, Instant::now()))
        }
        ports::SMP_RELEASE => sh.release_aps(),
        _ => {
            if !sh.pio.write(port.into(), data) {
                tracing::trace!("ignored out {port:#x} <- {value:#x}");
            }
        }
    }
}

fn crash(runner: &Runner, cpu: u32, reason: String, sh: &Shared) {
    let fd = runner.fd();
    let registers = format!("{}; {}", registers(fd), lapic_summary(fd));
    let r = CrashReport { reason, cpu, registers, console: sh.console_lines() };
    tracing::error!("{r}");
    sh.finish(Outcome::Crashed(Box::new(r)));
}

/// The local APIC's pending (IRR) and in-service (ISR) vectors and its TPR,
/// for reports of stopped or hung guests (a vector stuck in service blocks
/// every interrupt of its priority class and below).
fn lapic_summary(vcpu: &VcpuFd) -> String {
    let Ok(l) = vcpu.get_lapic() else { return "lapic unavailable".to_string() };
    let reg = |off: usize| {
        let b = &l.regs[off..off + 4];
        u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
    };
    let vectors = |base: usize| {
        (0..256u32)
            .filter(|v| reg(base + 16 * (*v as usize / 32)) >> (v % 32) & 1 == 1)
            .collect::<Vec<_>>()
    };
    format!("lapic tpr={:#x} isr={:?} irr={:?}", reg(0x80), vectors(0x100), vectors(0x200))
}

/// The vCPU's general and control registers, formatted.
fn registers(vcpu: &VcpuFd) -> String {
    match (vcpu.get_regs(), vcpu.get_sregs()) {
        (Ok(r), Ok(s)) => format!(
            "rip={:#x} rsp={:#x} rflags={:#x} rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rsi={:#x} rdi={:#x} \
             rbp={:#x} r8={:#x} r9={:#x} cs={:#x} ss={:#x} cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x}",
            r.rip, r.rsp, r.rflags, r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.r8, r.r9,
            s.cs.selector, s.ss.selector, s.cr0, s.cr2, s.cr3, s.cr4, s.efer
        ),
        _ => "registers unavailable".to_string(),
    }
}

/// They run real vCPUs: feature `kvm-tests` (scripts/test.sh), so that plain
/// `cargo test` stays hermetic.
#[cfg(all(test, feature = "kvm-tests"))]
mod tests;
