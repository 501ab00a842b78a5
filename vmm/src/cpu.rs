//! Per-vCPU state at entry: CPUID, XCR0, control registers, segments, MSRs,
//! FPU and LAPIC, following [`kore_boot_abi::entry`].

use kore_boot_abi::entry as abi;
use kore_boot_abi::layout;
use kvm_bindings::{
    kvm_cpuid_entry2, kvm_fpu, kvm_msr_entry, kvm_regs, kvm_segment, kvm_xcrs, CpuId, Msrs,
    KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
};
use kvm_ioctls::VcpuFd;

pub use crate::cpu_level::GuestCpu;

/// Errors setting up a vCPU.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// A KVM ioctl failed.
    #[error(
        "KVM {what} failed: {source} (is /dev/kvm usable and the host CPU x86-64 with XSAVE?)"
    )]
    Kvm {
        /// The operation.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// Building a KVM structure failed.
    #[error("building KVM {0} failed")]
    Build(&'static str),
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> CpuError {
    move |source| CpuError::Kvm { what, source }
}

/// The host's CPUID for `leaf`/`sub` as (eax, ebx, ecx, edx).
pub fn host_cpuid(leaf: u32, sub: u32) -> [u32; 4] {
    let r = std::arch::x86_64::__cpuid_count(leaf, sub);
    [r.eax, r.ebx, r.ecx, r.edx]
}

/// Leaf 1 ECX bits taken from the host: SSE3, PCLMULQDQ, SSSE3, FMA, CX16,
/// SSE4.1, SSE4.2, MOVBE, POPCNT, AES, XSAVE, AVX, F16C, RDRAND.
pub const LEAF1_ECX: u32 = (1 << 0)
    | (1 << 1)
    | (1 << 9)
    | (1 << 12)
    | (1 << 13)
    | (1 << 19)
    | (1 << 20)
    | (1 << 22)
    | (1 << 23)
    | (1 << 25)
    | (1 << 26)
    | (1 << 28)
    | (1 << 29)
    | (1 << 30);
/// Leaf 7.0 EBX bits from the host: FSGSBASE, BMI1, AVX2, BMI2, ERMS,
/// AVX512F, AVX512DQ, RDSEED, ADX, AVX512_IFMA, CLFLUSHOPT, AVX512CD, SHA,
/// AVX512BW, AVX512VL.
pub const LEAF7_EBX: u32 = 1
    | (1 << 3)
    | (1 << 5)
    | (1 << 8)
    | (1 << 9)
    | (1 << 16)
    | (1 << 17)
    | (1 << 18)
    | (1 << 19)
    | (1 << 21)
    | (1 << 23)
    | (1 << 28)
    | (1 << 29)
    | (1 << 30)
    | (1 << 31);
/// Leaf 7.0 ECX bits from the host: AVX512_VBMI, AVX512_VBMI2, GFNI, VAES,
/// VPCLMULQDQ, AVX512_VNNI, AVX512_BITALG, AVX512_VPOPCNTDQ.
pub const LEAF7_ECX: u32 =
    (1 << 1) | (1 << 6) | (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12) | (1 << 14);
/// Leaf 7.0 EDX bits from the host: AVX512_4VNNIW, AVX512_4FMAPS,
/// AVX512_VP2INTERSECT, AVX512_FP16.
pub const LEAF7_EDX: u32 = (1 << 2) | (1 << 3) | (1 << 8) | (1 << 23);
/// Leaf 7.1 EAX bits from the host: AVX_VNNI, AVX512_BF16.
pub const LEAF7_1_EAX: u32 = (1 << 4) | (1 << 5);

fn set_entry(
    cpuid: &mut CpuId,
    function: u32,
    index: u32,
    f: impl FnOnce(&mut kvm_cpuid_entry2),
) -> Result<(), CpuError> {
    if let Some(e) =
        cpuid.as_mut_slice().iter_mut().find(|e| e.function == function && e.index == index)
    {
        f(e);
        return Ok(());
    }
    let mut e = kvm_cpuid_entry2 { function, index, ..Default::default() };
    if function == 7 || function == 0xd {
        e.flags = KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
    }
    f(&mut e);
    cpuid.push(e).map_err(|_| CpuError::Build("cpuid (too many entries)"))
}

/// XCR0 the guest gets at `level`: [`abi::XCR0_WANTED`] masked by the host's
/// XCR0 support and by what the level allows.
pub fn guest_xcr0(level: GuestCpu) -> u64 {
    let [eax, _, _, edx] = host_cpuid(0xd, 0);
    abi::XCR0_WANTED & (eax as u64 | ((edx as u64) << 32)) & level.xcr0_mask()
}

/// Patches KVM's supported CPUID with the host's SIMD feature bits (KVM's
/// list lacks them on nested hosts although the guest can run them), the
/// XSAVE state leaves and `cpu`'s APIC id, then hides what `level` excludes.
pub fn patch_cpuid(cpuid: &mut CpuId, cpu: u32, level: GuestCpu) -> Result<(), CpuError> {
    let h1 = host_cpuid(1, 0);
    let max_leaf = host_cpuid(0, 0)[0];
    let hide = level.hidden();
    set_entry(cpuid, 1, 0, |e| {
        e.ecx |= h1[2] & LEAF1_ECX;
        e.ecx &= !hide.leaf1_ecx;
        e.ecx |= 1 << 31; // hypervisor
        e.ebx = (e.ebx & 0x00ff_ffff) | (cpu << 24);
    })?;
    if max_leaf >= 7 {
        let h7 = host_cpuid(7, 0);
        let h71 = host_cpuid(7, 1);
        set_entry(cpuid, 7, 0, |e| {
            e.eax = e.eax.max(h7[0].min(1));
            e.ebx = (e.ebx | (h7[1] & LEAF7_EBX)) & !hide.leaf7_ebx;
            e.ecx = (e.ecx | (h7[2] & LEAF7_ECX)) & !hide.leaf7_ecx;
            e.edx = (e.edx | (h7[3] & LEAF7_EDX)) & !hide.leaf7_edx;
        })?;
        if h7[0] >= 1 {
            set_entry(cpuid, 7, 1, |e| {
                e.eax = (e.eax | (h71[0] & LEAF7_1_EAX)) & !hide.leaf7_1_eax
            })?;
        }
    }
    if max_leaf >= 0xd && h1[2] & (1 << 26) != 0 {
        let xcr0 = guest_xcr0(level);
        let h = host_cpuid(0xd, 0);
        set_entry(cpuid, 0xd, 0, |e| {
            e.eax = xcr0 as u32;
            e.edx = (xcr0 >> 32) as u32;
            e.ebx = h[1].max(e.ebx);
            e.ecx = h[2].max(e.ecx);
        })?;
        let h = host_cpuid(0xd, 1);
        set_entry(cpuid, 0xd, 1, |e| e.eax |= h[0] & 0x7)?;
        for comp in [2u32, 5, 6, 7] {
            if xcr0 & (1 << comp) != 0 {
                let h = host_cpuid(0xd, comp);
                set_entry(cpuid, 0xd, comp, |e| {
                    e.eax = h[0];
                    e.ebx = h[1];
                    e.ecx = h[2] & 1;
                    e.edx = 0;
                })?;
            }
        }
    }
    for e in cpuid.as_mut_slice() {
        // XSAVE components the level hides are not described either.
        if e.function == 0xd
            && (2..64).contains(&e.index)
            && level.xcr0_mask() & (1 << e.index) == 0
        {
            (e.eax, e.ebx, e.ecx, e.edx) = (0, 0, 0, 0);
        }
        if e.function == 0xb || e.function == 0x1f {
            e.edx = cpu;
        }
        if e.function == 0x8000_0001 {
            e.edx &= !(1 << 26); // no 1 GiB pages: they fault on nested hosts
        }
    }
    Ok(())
}

fn code_seg() -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: abi::KERNEL_CS,
        type_: 11,
        present: 1,
        dpl: 0,
        db: 0,
        s: 1,
        l: 1,
        g: 1,
        ..Default::default()
    }
}

fn data_seg(selector: u16) -> kvm_segment {
    kvm_segment { selector, type_: 3, db: 1, l: 0, ..code_seg() }
}

/// Whether the guest gets CR4.FSGSBASE (the host CPU has it).
pub fn has_fsgsbase() -> bool {
    host_cpuid(7, 0)[1] & 1 != 0
}

/// Sets `vcpu` (index `cpu` of `ncpus`) to the entry state at `rip`.
pub fn setup_vcpu(
    vcpu: &VcpuFd,
    cpuid: &CpuId,
    level: GuestCpu,
    cpu: u32,
    ncpus: u32,
    rip: u64,
) -> Result<(), CpuError> {
    let mut cpuid = cpuid.clone();
    patch_cpuid(&mut cpuid, cpu, level)?;
    vcpu.set_cpuid2(&cpuid).map_err(kvm("SET_CPUID2"))?;

    let mut sregs = vcpu.get_sregs().map_err(kvm("GET_SREGS"))?;
    sregs.cs = code_seg();
    let ds = data_seg(abi::KERNEL_DS);
    (sregs.ds, sregs.es, sregs.ss) = (ds, ds, ds);
    let null = kvm_segment { unusable: 1, ..data_seg(0) };
    (sregs.fs, sregs.gs) =
        (kvm_segment { unusable: 0, ..null }, kvm_segment { unusable: 0, ..null });
    sregs.tr = kvm_segment {
        base: layout::tss(cpu),
        limit: abi::TSS_LIMIT,
        selector: abi::TSS_SELECTOR,
        type_: 11,
        present: 1,
        s: 0,
        ..Default::default()
    };
    sregs.ldt = kvm_segment { type_: 2, present: 1, unusable: 1, ..Default::default() };
    sregs.gdt.base = layout::gdt(cpu);
    sregs.gdt.limit = (layout::GDT_ENTRIES * 8 - 1) as u16;
    sregs.idt.base = layout::IDT;
    sregs.idt.limit = 4095;
    sregs.cr0 = abi::CR0;
    sregs.cr3 = layout::PML4;
    sregs.cr4 = abi::CR4 | if has_fsgsbase() { abi::CR4_FSGSBASE } else { 0 };
    sregs.efer = abi::EFER;
    vcpu.set_sregs(&sregs).map_err(kvm("SET_SREGS"))?;

    let mut xcrs = kvm_xcrs { nr_xcrs: 1, ..Default::default() };
    xcrs.xcrs[0].xcr = 0;
    xcrs.xcrs[0].value = guest_xcr0(level);
    vcpu.set_xcrs(&xcrs).map_err(kvm("SET_XCRS"))?;
    tracing::debug!(cpu, %level, xcr0 = xcrs.xcrs[0].value, "guest CPU level");

    let fpu = kvm_fpu { fcw: 0x37f, mxcsr: 0x1f80, ..Default::default() };
    vcpu.set_fpu(&fpu).map_err(kvm("SET_FPU"))?;

    let msr = |index, data| kvm_msr_entry { index, data, ..Default::default() };
    let msrs = Msrs::from_entries(&[
        msr(0xc000_0081, abi::STAR),
        msr(0xc000_0082, 0),
        msr(0xc000_0083, 0),
        msr(0xc000_0084, 0),
        msr(0xc000_0102, 0),
        msr(0x1a0, 1),
        msr(0x277, 0x0007_0406_0007_0406),
    ])
    .map_err(|_| CpuError::Build("msrs"))?;
    vcpu.set_msrs(&msrs).map_err(kvm("SET_MSRS"))?;

    set_regs(vcpu, cpu, ncpus, rip)?;
    setup_lapic(vcpu)?;
    // With the in-kernel irqchip, APs start waiting for INIT/SIPI; ours start at `rip`.
    let runnable = kvm_bindings::kvm_mp_state { mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE };
    vcpu.set_mp_state(runnable).map_err(kvm("SET_MP_STATE"))
}

/// Sets the general registers for the entry contract.
pub fn set_regs(vcpu: &VcpuFd, cpu: u32, ncpus: u32, rip: u64) -> Result<(), CpuError> {
    let regs = kvm_regs {
        rip,
        rsp: layout::stack_top(cpu),
        rdi: layout::BOOT_INFO,
        rsi: cpu as u64,
        rdx: ncpus as u64,
        rflags: abi::RFLAGS,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(kvm("SET_REGS"))
}

fn setup_lapic(vcpu: &VcpuFd) -> Result<(), CpuError> {
    let mut lapic = vcpu.get_lapic().map_err(kvm("GET_LAPIC"))?;
    let mut put = |off: usize, v: u32| {
        for (i, b) in v.to_le_bytes().iter().enumerate() {
            lapic.regs[off + i] = *b as _;
        }
    };
    put(0xf0, 0x1ff); // spurious vector 0xff, APIC software-enabled
                      // LINT0 masked: KVM also routes GSIs 0-15 to its 8259 PIC, whose
                      // uninitialised vector base would deliver e.g. GSI 5 as vector 5.
    put(0x350, 0x1_0700); // LINT0: ExtINT, masked
    put(0x360, 0x400); // LINT1: NMI
    vcpu.set_lapic(&lapic).map_err(kvm("SET_LAPIC"))
}

/// These open /dev/kvm: feature `kvm-tests` (scripts/test.sh), so that plain
/// `cargo test` stays hermetic.
#[cfg(all(test, feature = "kvm-tests"))]
mod tests {
    use super::*;

    /// The guest CPUID must expose every SIMD bit the host has.
    #[test]
    fn cpuid_has_host_simd_bits() {
        let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm");
        let mut cpuid = kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES).unwrap();
        patch_cpuid(&mut cpuid, 3, GuestCpu::Host).unwrap();
        let get = |f: u32, i: u32| {
            cpuid.as_slice().iter().find(|e| e.function == f && e.index == i).copied().unwrap()
        };
        let h1 = host_cpuid(1, 0);
        let h7 = host_cpuid(7, 0);
        let g1 = get(1, 0);
        let g7 = get(7, 0);
        assert_eq!(g1.ecx & h1[2] & LEAF1_ECX, h1[2] & LEAF1_ECX);
        assert_eq!(g1.ebx >> 24, 3);
        assert_eq!(g7.ebx & h7[1] & LEAF7_EBX, h7[1] & LEAF7_EBX);
        assert_eq!(g7.ecx & h7[2] & LEAF7_ECX, h7[2] & LEAF7_ECX);
        assert_eq!(g7.edx & h7[3] & LEAF7_EDX, h7[3] & LEAF7_EDX);
        // This machine's host has AVX-512F/BW/VL, AVX2, FMA, F16C: check them by name.
        if h7[1] & (1 << 16) != 0 {
            assert_ne!(g7.ebx & (1 << 16), 0, "AVX512F");
            assert_eq!(get(0xd, 0).eax as u64 & 0xe0, 0xe0, "XSAVE AVX-512 state");
            assert_ne!(get(0xd, 6).eax, 0, "ZMM_Hi256 state size");
        }
        if h1[2] & (1 << 28) != 0 {
            assert_ne!(g1.ecx & (1 << 28), 0, "AVX");
            assert_ne!(g7.ebx & (1 << 5), 0, "AVX2");
            assert_ne!(g1.ecx & (1 << 12), 0, "FMA");
            assert_ne!(g1.ecx & (1 << 29), 0, "F16C");
            assert_eq!(guest_xcr0(GuestCpu::Host) & 0x7, 0x7);
        }
        assert_eq!(get(0x8000_0001, 0).edx & (1 << 26), 0, "no Page1GB");
    }

    /// The lower levels hide AVX-512 (and AVX) in CPUID and in XCR0.
    #[test]
    fn levels_hide_simd_bits_and_state() {
        let kvm = kvm_ioctls::Kvm::new().expect("/dev/kvm");
        let base = kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES).unwrap();
        for level in [GuestCpu::X86_64V3, GuestCpu::X86_64V2] {
            let mut cpuid = base.clone();
            patch_cpuid(&mut cpuid, 0, level).unwrap();
            let get = |f: u32, i: u32| {
                cpuid.as_slice().iter().find(|e| e.function == f && e.index == i).copied()
            };
            let (g1, g7) = (get(1, 0).unwrap(), get(7, 0).unwrap());
            assert_eq!(g7.ebx & (1 << 16), 0, "{level}: AVX512F hidden");
            assert_eq!(g7.ecx & (1 << 11), 0, "{level}: AVX512_VNNI hidden");
            assert_eq!(guest_xcr0(level) & 0xe0, 0, "{level}: no opmask/ZMM state");
            if let Some(d) = get(0xd, 0) {
                assert_eq!(d.eax & 0xe0, 0, "{level}: leaf 0xd lists no AVX-512 state");
            }
            if level == GuestCpu::X86_64V2 {
                assert_eq!(g1.ecx & (1 << 28), 0, "AVX hidden");
                assert_eq!(g7.ebx & (1 << 5), 0, "AVX2 hidden");
                assert_eq!(guest_xcr0(level), 0x3);
            } else if host_cpuid(1, 0)[2] & (1 << 28) != 0 {
                assert_ne!(g7.ebx & (1 << 5), 0, "v3 keeps AVX2");
                assert_eq!(guest_xcr0(level), 0x7);
            }
        }
    }
}
