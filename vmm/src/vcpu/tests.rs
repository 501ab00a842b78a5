//! Stopping a vCPU with one kick: while it runs a guest that never exits,
//! and when the kick lands before it enters `KVM_RUN`.

use std::sync::mpsc;
use std::time::Duration;

use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap};

use super::*;

/// A one-vCPU VM in real mode spinning on `jmp $` at 0x1000 (it never exits).
fn spinning_vcpu() -> (VmFd, GuestMemoryMmap, VcpuFd) {
    let kvm = Kvm::new().expect("/dev/kvm");
    let vm = kvm.create_vm().unwrap();
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
    mem.write_slice(&[0xeb, 0xfe], GuestAddress(0x1000)).unwrap();
    let region = kvm_bindings::kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: 0x10000,
        userspace_addr: mem.iter().next().unwrap().as_ptr() as u64,
    };
    // SAFETY: `mem` maps the whole region and outlives the VM in every test.
    unsafe { vm.set_user_memory_region(region) }.unwrap();
    let vcpu = vm.create_vcpu(0).unwrap();
    let mut sregs = vcpu.get_sregs().unwrap();
    (sregs.cs.base, sregs.cs.selector) = (0, 0);
    vcpu.set_sregs(&sregs).unwrap();
    let regs = kvm_bindings::kvm_regs { rip: 0x1000, rflags: 2, ..Default::default() };
    vcpu.set_regs(&regs).unwrap();
    (vm, mem, vcpu)
}

/// What one `KVM_RUN` returned: the errno, or 0 for an exit.
fn run_once(runner: &mut Runner) -> i32 {
    match runner.run() {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

#[test]
fn one_kick_stops_a_vcpu_inside_kvm_run() {
    install_kick_handler();
    let (_vm, _mem, vcpu) = spinning_vcpu();
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut runner = Runner::new(vcpu);
        tx.send(0).unwrap();
        let r = run_once(&mut runner);
        tx.send(r).unwrap();
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(0));
    // The guest spins forever: without the kick KVM_RUN never returns.
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "the guest exited by itself");
    kick(&t);
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(libc::EINTR));
    t.join().unwrap();
}

#[test]
fn a_kick_before_kvm_run_is_not_lost() {
    install_kick_handler();
    let (_vm, _mem, vcpu) = spinning_vcpu();
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let mut runner = Runner::new(vcpu);
        ready_tx.send(()).unwrap();
        go_rx.recv().unwrap(); // the kick has been handled by now
        done_tx.send(run_once(&mut runner)).unwrap();
        // Cleared, the next run enters the guest again (and is kicked out again).
        runner.clear_kick();
        done_tx.send(0).unwrap();
        done_tx.send(run_once(&mut runner)).unwrap();
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    kick(&t);
    std::thread::sleep(Duration::from_millis(50)); // let the handler run on that thread
    go_tx.send(()).unwrap();
    assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(libc::EINTR));
    assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(0));
    assert!(done_rx.recv_timeout(Duration::from_millis(300)).is_err(), "ran without a kick");
    kick(&t);
    assert_eq!(done_rx.recv_timeout(Duration::from_secs(5)), Ok(libc::EINTR));
    t.join().unwrap();
}
