//! The VM: creation, boot, vCPU threads, exits and teardown.

use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kore_boot_abi::{layout, ports, BootInfo, ImageInfo};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::boot::{self, BootError, BootParams};
use crate::config::VmConfig;
use crate::cpu::{self, CpuError};
use crate::devices::serial::{ConsoleLog, IrqTrigger, SerialDevice, Sink};
use crate::loader::{self, LoaderError};
use crate::memory::{GuestRam, MemoryError, RamPlan};
use crate::preload::{self, PreloadError, Progress};

/// Errors starting or running a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The configuration is invalid.
    #[error("invalid VM configuration: {0}")]
    Config(String),
    /// `/dev/kvm` or a KVM call failed.
    #[error("KVM {what} failed: {source} (check that /dev/kvm exists and is accessible)")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Guest memory.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// Preloading a file.
    #[error(transparent)]
    Preload(#[from] PreloadError),
    /// Loading the kernel or user image.
    #[error(transparent)]
    Loader(#[from] LoaderError),
    /// Writing boot structures.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// Setting up a vCPU.
    #[error(transparent)]
    Cpu(#[from] CpuError),
    /// A device failed to start.
    #[error("device setup failed: {0}")]
    Device(String),
    /// The guest crashed (triple fault, internal error, failed entry...).
    #[error("{0}")]
    GuestCrashed(Box<CrashReport>),
    /// The VM was stopped (by [`RunningVm::stop`] or a signal) before the guest exited.
    #[error("the VM was stopped before the guest exited")]
    Stopped,
    /// Spawning a thread failed.
    #[error("spawning a VMM thread failed: {0}")]
    Thread(std::io::Error),
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// What the guest's crash looked like.
#[derive(Debug, Clone)]
pub struct CrashReport {
    /// The exit reason, e.g. `shutdown (triple fault)`.
    pub reason: String,
    /// The vCPU that saw it.
    pub cpu: u32,
    /// Register dump.
    pub registers: String,
    /// Last console lines.
    pub console: Vec<String>,
}

impl std::fmt::Display for CrashReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "guest crashed on vCPU {}: {}", self.cpu, self.reason)?;
        writeln!(f, "registers: {}", self.registers)?;
        writeln!(f, "last console lines:")?;
        for l in &self.console {
            writeln!(f, "  | {l}")?;
        }
        Ok(())
    }
}

/// How the VM ended.
#[derive(Debug, Clone)]
enum Outcome {
    Exited(u32),
    Stopped,
    Crashed(Box<CrashReport>),
}

/// A device on the MMIO bus.
pub trait MmioDevice: Send {
    /// A read of `data.len()` bytes at `offset` in the device window.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// A write at `offset` in the device window.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// An MMIO window: base, size and the device behind it.
pub(crate) type MmioSlot = (u64, u64, Arc<Mutex<dyn MmioDevice>>);

pub(crate) struct Shared {
    outcome: Mutex<Option<Outcome>>,
    done: Condvar,
    stop: AtomicBool,
    pub(crate) console: Arc<Mutex<ConsoleLog>>,
    markers: Mutex<Vec<(u32, Instant)>>,
    released: Mutex<bool>,
    release_cv: Condvar,
    serial: Mutex<SerialDevice>,
    mmio: Vec<MmioSlot>,
}

impl Shared {
    fn finish(&self, o: Outcome) {
        let mut g = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(o);
        }
        self.stop.store(true, Ordering::SeqCst);
        self.done.notify_all();
        *self.released.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.release_cv.notify_all();
    }

    fn console_lines(&self) -> Vec<String> {
        self.console.lock().map(|c| c.lines()).unwrap_or_default()
    }
}

/// Starts VMs.
pub struct Vm;

/// A running VM. Dropping it stops the VM and frees its memory.
pub struct RunningVm {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    started: Instant,
    entered: Instant,
    _vm: Arc<VmFd>,
    mem: GuestMemoryMmap,
    extra: Vec<Box<dyn std::any::Any + Send>>,
}

fn vcpu_signal() -> i32 {
    vmm_sys_util::signal::SIGRTMIN()
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

fn install_kick_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Err(e) = vmm_sys_util::signal::register_signal_handler(vcpu_signal(), kick_handler) {
            tracing::warn!("cannot install the vCPU kick signal handler: {e}");
        }
    });
}

/// Pieces a VM is built from before its vCPUs start (used by devices).
pub(crate) struct Setup {
    pub vm: Arc<VmFd>,
    pub mem: GuestMemoryMmap,
}

impl Vm {
    /// Creates, loads and starts a VM. `progress` sees preload progress.
    ///
    /// ```no_run
    /// use kore_vmm::{Vm, VmConfig};
    /// let vm = Vm::start(VmConfig::new("kernel.elf").memory_mib(512), &mut |_p| {})?;
    /// let status = vm.wait()?; // the guest's debug-exit status
    /// # Ok::<(), kore_vmm::VmError>(())
    /// ```
    pub fn start(
        config: VmConfig,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<RunningVm, VmError> {
        let started = Instant::now();
        if config.vcpus == 0 || config.vcpus > layout::MAX_VCPUS {
            return Err(VmError::Config(format!(
                "vcpus must be 1..={}, got {}",
                layout::MAX_VCPUS,
                config.vcpus
            )));
        }
        let (slots, pack_bytes) = preload::plan(&config.preload)?;
        let plan = RamPlan::new(config.memory_bytes, pack_bytes, config.hugepages.bytes())?;
        let ram = GuestRam::new(plan.clone(), config.hugepages)?;
        let mem = ram.mem.clone();

        let kvm = Kvm::new().map_err(kvm_err("open /dev/kvm"))?;
        let vm = Arc::new(kvm.create_vm().map_err(kvm_err("CREATE_VM"))?);
        vm.set_tss_address(0xfffb_d000).map_err(kvm_err("SET_TSS_ADDR"))?;
        vm.create_irq_chip().map_err(kvm_err("CREATE_IRQCHIP"))?;
        for (slot, (r, host)) in plan.ranges.iter().zip(&ram.host_addrs).enumerate() {
            let region = kvm_bindings::kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: r.base,
                memory_size: r.size,
                userspace_addr: *host,
            };
            // SAFETY: the host range is a live mapping owned by `mem`, which
            // RunningVm keeps alive for as long as the VM fd exists.
            unsafe { vm.set_user_memory_region(region) }
                .map_err(kvm_err("SET_USER_MEMORY_REGION"))?;
        }

        let kernel =
            loader::load(&mem, &config.kernel, layout::KERNEL_BASE, layout::USER_IMAGE_LIMIT)?;
        let user_image = match &config.user_image {
            Some(p) => loader::load(&mem, p, layout::USER_IMAGE_BASE, layout::USER_IMAGE_LIMIT)?,
            None => ImageInfo::default(),
        };
        let pack_end = layout::PACK_BASE + plan.pack_bytes;
        boot::write_page_tables(&mem, &plan, pack_end)?;
        for cpu in 0..config.vcpus {
            boot::write_cpu_tables(&mem, cpu)?;
        }

        let console = Arc::new(Mutex::new(ConsoleLog::new(config.console_lines)));
        let serial_evt = EventFd::new(libc::EFD_NONBLOCK)
            .map_err(|e| VmError::Device(format!("eventfd: {e}")))?;
        vm.register_irqfd(&serial_evt, ports::SERIAL_GSI).map_err(kvm_err("IRQFD (serial)"))?;
        let serial = SerialDevice::new(IrqTrigger(serial_evt), Sink(console.clone()));

        let setup = Setup { vm: vm.clone(), mem: mem.clone() };
        let (devices, mmio, extra) = crate::attach_devices(&setup, &config)?;

        let vcpu0 = vm.create_vcpu(0).map_err(kvm_err("CREATE_VCPU"))?;
        let tsc_khz = vcpu0.get_tsc_khz().unwrap_or(0) as u64;
        let files = slots.iter().map(|s| (s.name.clone(), s.gpa, s.size)).collect();
        let params = BootParams {
            plan: &plan,
            vcpus: config.vcpus,
            tsc_khz,
            xcr0: cpu::guest_xcr0(config.guest_cpu),
            kernel,
            user_image,
            files,
            devices,
            cmdline: &config.cmdline,
        };
        let info = boot::boot_info(&params)?;
        boot::write_boot_info(&mem, &info)?;
        if !slots.is_empty() {
            let t = Instant::now();
            let n = preload::load(&mem, &slots, progress)?;
            let s = t.elapsed().as_secs_f64();
            tracing::info!("preloaded {n} bytes in {s:.3} s ({:.2} GB/s)", n as f64 / s / 1e9);
        }

        let cpuid = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(kvm_err("GET_SUPPORTED_CPUID"))?;
        let mut vcpus = vec![vcpu0];
        for i in 1..config.vcpus {
            vcpus.push(vm.create_vcpu(i as u64).map_err(kvm_err("CREATE_VCPU"))?);
        }
        for (i, v) in vcpus.iter().enumerate() {
            cpu::setup_vcpu(v, &cpuid, config.guest_cpu, i as u32, config.vcpus, kernel.entry)?;
        }

        let shared = Arc::new(Shared {
            outcome: Mutex::new(None),
            done: Condvar::new(),
            stop: AtomicBool::new(false),
            console,
            markers: Mutex::new(Vec::new()),
            released: Mutex::new(false),
            release_cv: Condvar::new(),
            serial: Mutex::new(serial),
            mmio,
        });
        install_kick_handler();
        let mut threads = Vec::new();
        let ncpus = config.vcpus;
        let entered = Instant::now();
        for (i, vcpu) in vcpus.into_iter().enumerate() {
            let sh = shared.clone();
            let m = mem.clone();
            let entry = kernel.entry;
            let t = std::thread::Builder::new()
                .name(format!("kore-vcpu{i}"))
                .spawn(move || vcpu_thread(vcpu, i as u32, ncpus, entry, sh, m))
                .map_err(VmError::Thread)?;
            threads.push(t);
        }
        Ok(RunningVm { shared, threads, started, entered, _vm: vm, mem, extra })
    }
}

fn vcpu_thread(
    mut vcpu: VcpuFd,
    cpu: u32,
    ncpus: u32,
    entry: u64,
    sh: Arc<Shared>,
    mem: GuestMemoryMmap,
) {
    if cpu != 0 {
        let mut r = sh.released.lock().unwrap_or_else(|e| e.into_inner());
        while !*r {
            r = sh.release_cv.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        drop(r);
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let ap: u64 = mem
            .read_obj(GuestAddress(layout::BOOT_INFO + BootInfo::AP_ENTRY_OFFSET as u64))
            .unwrap_or(0);
        let rip = if ap != 0 { ap } else { entry };
        if let Err(e) = cpu::set_regs(&vcpu, cpu, ncpus, rip) {
            sh.finish(Outcome::Crashed(Box::new(report(
                &vcpu,
                cpu,
                format!("AP setup failed: {e}"),
                &sh,
            ))));
            return;
        }
    }
    while !sh.stop.load(Ordering::SeqCst) {
        let exit = match vcpu.run() {
            Ok(e) => e,
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => continue,
            Err(e) => {
                let r = report(&vcpu, cpu, format!("KVM_RUN failed: {e}"), &sh);
                sh.finish(Outcome::Crashed(Box::new(r)));
                return;
            }
        };
        let crash = match exit {
            VcpuExit::IoOut(port, data) => {
                io_out(&sh, port, data);
                None
            }
            VcpuExit::IoIn(port, data) => {
                io_in(&sh, port, data);
                None
            }
            VcpuExit::MmioRead(addr, data) => {
                mmio(&sh, addr, |d, off| d.read(off, data));
                None
            }
            VcpuExit::MmioWrite(addr, data) => {
                mmio(&sh, addr, |d, off| d.write(off, data));
                None
            }
            VcpuExit::Hlt => Some("hlt with interrupts off in userspace-handled HLT".to_string()),
            VcpuExit::Shutdown => Some("shutdown (triple fault)".to_string()),
            VcpuExit::FailEntry(reason, c) => Some(format!("VM entry failed (hardware reason {reason:#x}, cpu {c})")),
            VcpuExit::InternalError => Some(
                "KVM internal error (on nested PVM hosts: SIMD/AVX/XSAVE at CPL0, or an unemulatable instruction)"
                    .to_string(),
            ),
            VcpuExit::SystemEvent(t, _) => Some(format!("system event {t}")),
            other => Some(format!("unexpected exit {other:?}")),
        };
        if let Some(reason) = crash {
            let r = report(&vcpu, cpu, reason, &sh);
            sh.finish(Outcome::Crashed(Box::new(r)));
            return;
        }
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug!("vcpu{cpu} stopped: {}; {}", registers(&vcpu), lapic_summary(&vcpu));
    }
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

fn io_out(sh: &Shared, port: u16, data: &[u8]) {
    let mut v = [0u8; 4];
    let n = data.len().min(4);
    v[..n].copy_from_slice(&data[..n]);
    let value = u32::from_le_bytes(v);
    match port {
        p if (ports::SERIAL_COM1..ports::SERIAL_COM1 + ports::SERIAL_PORTS).contains(&p) => {
            let mut s = sh.serial.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = s.write((p - ports::SERIAL_COM1) as u8, data[0]) {
                tracing::warn!("serial write failed: {e:?}");
            }
        }
        ports::DEBUG_EXIT => sh.finish(Outcome::Exited(value)),
        ports::MARKER => {
            sh.markers.lock().unwrap_or_else(|e| e.into_inner()).push((value, Instant::now()))
        }
        ports::SMP_RELEASE => {
            *sh.released.lock().unwrap_or_else(|e| e.into_inner()) = true;
            sh.release_cv.notify_all();
        }
        _ => tracing::trace!("ignored out {port:#x} <- {value:#x}"),
    }
}

fn io_in(sh: &Shared, port: u16, data: &mut [u8]) {
    data.fill(0xff);
    if (ports::SERIAL_COM1..ports::SERIAL_COM1 + ports::SERIAL_PORTS).contains(&port) {
        data[0] = sh
            .serial
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .read((port - ports::SERIAL_COM1) as u8);
    }
}

fn mmio(sh: &Shared, addr: u64, f: impl FnOnce(&mut dyn MmioDevice, u64)) {
    for (base, size, dev) in &sh.mmio {
        if addr >= *base && addr < base + size {
            let mut d = dev.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut *d, addr - base);
            return;
        }
    }
    tracing::trace!("unclaimed MMIO access at {addr:#x}");
}

fn report(vcpu: &VcpuFd, cpu: u32, reason: String, sh: &Shared) -> CrashReport {
    let registers = format!("{}; {}", registers(vcpu), lapic_summary(vcpu));
    let r = CrashReport { reason, cpu, registers, console: sh.console_lines() };
    tracing::error!("{r}");
    r
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

impl RunningVm {
    /// Waits until the guest exits, then returns its debug-exit status.
    pub fn wait(mut self) -> Result<u32, VmError> {
        let o = {
            let mut g = self.shared.outcome.lock().unwrap_or_else(|e| e.into_inner());
            while g.is_none() {
                g = self.shared.done.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            g.clone()
        };
        self.teardown();
        outcome_result(o)
    }

    /// Like [`RunningVm::wait`] but gives up after `timeout`, returning `None`
    /// (the VM keeps running).
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<u32, VmError>> {
        let g = self.shared.outcome.lock().unwrap_or_else(|e| e.into_inner());
        let (g, _) = self
            .shared
            .done
            .wait_timeout_while(g, timeout, |o| o.is_none())
            .unwrap_or_else(|e| e.into_inner());
        g.clone().map(|o| outcome_result(Some(o)))
    }

    /// Stops the VM (if still running) and frees its resources.
    pub fn stop(mut self) {
        self.shared.finish(Outcome::Stopped);
        self.teardown();
    }

    /// A handle that can stop the VM from another thread or a signal watcher.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.shared.clone())
    }

    /// The last console lines.
    pub fn console_lines(&self) -> Vec<String> {
        self.shared.console_lines()
    }

    /// Values written to [`ports::MARKER`], with the time since
    /// [`Vm::start`] was called.
    pub fn markers(&self) -> Vec<(u32, Duration)> {
        let m = self.shared.markers.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(v, t)| (*v, t.duration_since(self.started))).collect()
    }

    /// Time from [`Vm::start`] until the vCPU threads were spawned.
    pub fn setup_time(&self) -> Duration {
        self.entered.duration_since(self.started)
    }

    /// Drops every vsock connection (host clients see their streams close) and sends the
    /// guest a `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` event. Fails if the VM has no vsock.
    pub fn vsock_transport_reset(&self) -> Result<(), VmError> {
        let h = self
            .extra
            .iter()
            .find_map(|e| e.downcast_ref::<crate::devices::virtio::vsock::VsockHandle>())
            .ok_or_else(|| VmError::Device("this VM has no vsock device".into()))?;
        h.transport_reset().map_err(|e| VmError::Device(format!("vsock reset: {e}")))
    }

    /// Guest memory (e.g. for tests that inspect it).
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    fn teardown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in &self.threads {
            let _ = t;
        }
        while !self.threads.is_empty() {
            for t in &self.threads {
                if !t.is_finished() {
                    // SAFETY: pthread_kill on a live (not yet joined) thread of ours
                    // with a signal whose handler is installed and does nothing.
                    unsafe {
                        libc::pthread_kill(t.as_pthread_t(), vcpu_signal());
                    }
                }
            }
            let (done, running): (Vec<_>, Vec<_>) =
                self.threads.drain(..).partition(|t| t.is_finished());
            for t in done {
                let _ = t.join();
            }
            self.threads = running;
            if !self.threads.is_empty() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.extra.clear();
    }
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        self.shared.finish(Outcome::Stopped);
        self.teardown();
    }
}

fn outcome_result(o: Option<Outcome>) -> Result<u32, VmError> {
    match o {
        Some(Outcome::Exited(s)) => Ok(s),
        Some(Outcome::Crashed(r)) => Err(VmError::GuestCrashed(r)),
        Some(Outcome::Stopped) | None => Err(VmError::Stopped),
    }
}

/// Stops a VM from anywhere (cloneable, `Send`).
#[derive(Clone)]
pub struct Stopper(Arc<Shared>);

impl Stopper {
    /// Asks the VM to stop; [`RunningVm::wait`] then returns [`VmError::Stopped`].
    pub fn stop(&self) {
        self.0.finish(Outcome::Stopped);
    }
}
