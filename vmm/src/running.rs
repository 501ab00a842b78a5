//! A started VM: the state its vCPU threads share, how it ended, and the
//! [`RunningVm`] handle that waits for it, stops it and tears it down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::VmFd;
use vm_memory::GuestMemoryMmap;

use crate::devices::bus::Bus;
use crate::devices::serial::ConsoleLog;
use crate::devices::virtio::vsock::VsockHandle;
use crate::vcpu;
use crate::vm::VmError;

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
pub(crate) enum Outcome {
    Exited(u32),
    Stopped,
    Crashed(Box<CrashReport>),
}

/// State shared by the vCPU threads and the VM handle.
pub(crate) struct Shared {
    outcome: Mutex<Option<Outcome>>,
    done: Condvar,
    /// Set once the VM must stop; vCPU threads check it after every exit.
    pub(crate) stop: AtomicBool,
    pub(crate) console: Arc<Mutex<ConsoleLog>>,
    pub(crate) markers: Mutex<Vec<(u32, Instant)>>,
    released: Mutex<bool>,
    release_cv: Condvar,
    /// Port-I/O bus.
    pub(crate) pio: Bus,
    /// MMIO bus.
    pub(crate) mmio: Bus,
}

impl Shared {
    pub(crate) fn new(console: Arc<Mutex<ConsoleLog>>, pio: Bus, mmio: Bus) -> Self {
        Self {
            outcome: Mutex::new(None),
            done: Condvar::new(),
            stop: AtomicBool::new(false),
            console,
            markers: Mutex::new(Vec::new()),
            released: Mutex::new(false),
            release_cv: Condvar::new(),
            pio,
            mmio,
        }
    }

    /// Records the outcome (the first one wins), stops the vCPUs' loops and
    /// releases APs still waiting to start.
    pub(crate) fn finish(&self, o: Outcome) {
        let mut g = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(o);
        }
        self.stop.store(true, Ordering::SeqCst);
        self.done.notify_all();
        self.release_aps();
    }

    /// Lets the application processors start (`SMP_RELEASE`, or a stop).
    pub(crate) fn release_aps(&self) {
        *self.released.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.release_cv.notify_all();
    }

    /// Blocks until [`Shared::release_aps`].
    pub(crate) fn wait_release(&self) {
        let mut r = self.released.lock().unwrap_or_else(|e| e.into_inner());
        while !*r {
            r = self.release_cv.wait(r).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub(crate) fn console_lines(&self) -> Vec<String> {
        self.console.lock().map(|c| c.lines()).unwrap_or_default()
    }
}

/// A running VM. Dropping it stops the VM and frees its memory.
pub struct RunningVm {
    pub(crate) shared: Arc<Shared>,
    pub(crate) threads: Vec<JoinHandle<()>>,
    pub(crate) started: Instant,
    pub(crate) entered: Instant,
    pub(crate) vsock: Option<VsockHandle>,
    // Dropped after the vCPU threads are joined (teardown), fd before memory.
    pub(crate) _vm: Arc<VmFd>,
    pub(crate) mem: GuestMemoryMmap,
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

    /// Values written to [`kore_boot_abi::ports::MARKER`], with the time since
    /// [`crate::Vm::start`] was called.
    pub fn markers(&self) -> Vec<(u32, Duration)> {
        let m = self.shared.markers.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(v, t)| (*v, t.duration_since(self.started))).collect()
    }

    /// Time from [`crate::Vm::start`] until the vCPU threads were spawned.
    pub fn setup_time(&self) -> Duration {
        self.entered.duration_since(self.started)
    }

    /// Drops every vsock connection (host clients see their streams close) and sends the
    /// guest a `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET` event. Fails if the VM has no vsock.
    pub fn vsock_transport_reset(&self) -> Result<(), VmError> {
        let h = self.vsock.as_ref().ok_or(VmError::NoSuchDevice("vsock"))?;
        h.transport_reset().map_err(VmError::VsockReset)
    }

    /// Guest memory (e.g. for tests that inspect it).
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    /// Stops every vCPU (one kick each, see [`vcpu::kick`]), joins them, then
    /// stops the device backends.
    fn teardown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.release_aps();
        for t in &self.threads {
            if !t.is_finished() {
                vcpu::kick(t);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.vsock = None;
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
pub struct Stopper(pub(crate) Arc<Shared>);

impl Stopper {
    /// Asks the VM to stop; [`RunningVm::wait`] then returns [`VmError::Stopped`].
    pub fn stop(&self) {
        self.0.finish(Outcome::Stopped);
    }
}
