//! The per-ISA layer: the kernel paths ([`Path`]) and the CPU features that
//! decide which ones run (CPUID and XGETBV through `core::arch`, `no_std`,
//! the result cached in an atomic), the types every kernel shares
//! ([`types`], a leaf), and one module per instruction set (`x86` holds what
//! the x86 ones share). The per-ISA modules import only [`types`], `x86`,
//! the formats and `exp`, never each other or the layers above;
//! `kernels::dispatch` is the one place that maps a path to them, and
//! `kernels::generic` holds their portable twins (`tests/kernels_agree.rs`
//! checks every path against those).
//!
//! Which path a model runs is the model's choice (`Model::set_kernels`,
//! [`crate::EngineOptions`]); this module only says which paths the CPU can
//! run and which is the fastest ([`best`]).

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

pub mod types;

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod attn_x86;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_q8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512vnni;
#[cfg(target_arch = "x86_64")]
pub(crate) mod q8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod silu;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_q8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_tile;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// A kernel implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// Portable Rust (the reference twin of every SIMD kernel).
    Generic,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL.
    Avx512,
    /// AVX-512 plus VNNI and VBMI: NVFP4 products on int8 activations
    /// (quantized per 16-column block, as llama.cpp's 4-bit types do); every
    /// other product as [`Path::Avx512`].
    Avx512Vnni,
    /// [`Path::Avx512Vnni`], except that NVFP4 products over at least
    /// `kernels::AMX_MIN_TOKENS` tokens (prefill chunks) run as AMX-BF16
    /// tiles on bf16 activations (`simd::amx`). Opt-in only: a prompt's
    /// result then differs in the last bits from the same tokens run one by
    /// one. Native Linux only (the OS must grant the tile state).
    Amx,
}

impl Path {
    /// Every path, fastest last ([`Path::Amx`] is never chosen automatically).
    pub const ALL: [Path; 5] =
        [Path::Generic, Path::Avx2, Path::Avx512, Path::Avx512Vnni, Path::Amx];

    /// Lower-case name (`generic`, `avx2`, `avx512`).
    pub fn name(self) -> &'static str {
        match self {
            Path::Generic => "generic",
            Path::Avx2 => "avx2",
            Path::Avx512 => "avx512",
            Path::Avx512Vnni => "avx512vnni",
            Path::Amx => "amx",
        }
    }

    /// Whether the path runs the AVX-512 kernels (`avx512` and above).
    pub fn avx512(self) -> bool {
        matches!(self, Path::Avx512 | Path::Avx512Vnni | Path::Amx)
    }

    /// Whether the path runs the VNNI int8 kernels (`avx512vnni`, and `amx`
    /// outside its AMX products).
    pub fn vnni(self) -> bool {
        matches!(self, Path::Avx512Vnni | Path::Amx)
    }

    /// Parses [`Path::name`].
    pub fn from_name(s: &str) -> Option<Path> {
        Path::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether this CPU (and its OS/VMM-enabled register state) can run the
    /// path; for [`Path::Amx`] this asks the OS for the tile state once.
    pub fn supported(self) -> bool {
        match self {
            Path::Generic => true,
            Path::Avx2 => features().avx2,
            Path::Avx512 => features().avx512,
            Path::Avx512Vnni => features().avx512vnni,
            Path::Amx => features().amx && amx::tile_state_granted(),
        }
    }
}

/// The CPU features the kernels use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// AVX2, FMA and F16C, with YMM state enabled in XCR0.
    pub avx2: bool,
    /// AVX-512 F, BW, VL (and `avx2`), with ZMM state enabled in XCR0.
    pub avx512: bool,
    /// AVX512-VNNI and AVX512-VBMI (and `avx512`).
    pub avx512vnni: bool,
    /// AMX-TILE and AMX-BF16 with the tile state enabled in XCR0 (and
    /// `avx512vnni`); [`Path::Amx`] also needs the OS's grant, asked for
    /// only when that path is.
    pub amx: bool,
}

/// 0 = not detected yet; else bit 0 set plus bit 1 avx2, bit 2 avx512, bit 3
/// avx512vnni, bit 4 amx.
static FEATURES: AtomicU8 = AtomicU8::new(0);
/// XCR0 bits detection may count (see [`limit_xcr0`]); all by default.
static XCR0_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// The detected features (CPUID runs once; later calls read the cache).
pub fn features() -> Features {
    let mut bits = FEATURES.load(Ordering::Relaxed);
    if bits == 0 {
        let f = detect();
        bits = 1
            | (u8::from(f.avx2) << 1)
            | (u8::from(f.avx512) << 2)
            | (u8::from(f.avx512vnni) << 3)
            | (u8::from(f.amx) << 4);
        FEATURES.store(bits, Ordering::Relaxed);
    }
    Features {
        avx2: bits & 2 != 0,
        avx512: bits & 4 != 0,
        avx512vnni: bits & 8 != 0,
        amx: bits & 16 != 0,
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)] // CPUID is a safe intrinsic since Rust 1.87; the MSRV is 1.85.
fn detect() -> Features {
    use core::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: CPUID exists on every x86_64 CPU.
    let max = unsafe { __cpuid(0) }.eax;
    if max < 7 {
        return Features::default();
    }
    // SAFETY: leaves 1 and 7 exist (max >= 7).
    let (l1, l7) = unsafe { (__cpuid(1), __cpuid_count(7, 0)) };
    let osxsave = l1.ecx & (1 << 27) != 0;
    if !osxsave {
        return Features::default();
    }
    // SAFETY: OSXSAVE is set, so XGETBV is enabled.
    let xcr0 = unsafe { xgetbv0() } & XCR0_LIMIT.load(Ordering::Relaxed);
    let ymm = xcr0 & 0x6 == 0x6;
    let zmm = ymm && xcr0 & 0xe0 == 0xe0;
    let fma = l1.ecx & (1 << 12) != 0;
    let f16c = l1.ecx & (1 << 29) != 0;
    let avx = l1.ecx & (1 << 28) != 0;
    let avx2 = ymm && avx && fma && f16c && l7.ebx & (1 << 5) != 0;
    let f = l7.ebx & (1 << 16) != 0;
    let bw = l7.ebx & (1 << 30) != 0;
    let vl = l7.ebx & (1 << 31) != 0;
    let avx512 = avx2 && zmm && f && bw && vl;
    let (vbmi, vnni) = (l7.ecx & (1 << 1) != 0, l7.ecx & (1 << 11) != 0);
    let avx512vnni = avx512 && vbmi && vnni;
    // AMX-BF16 (EDX bit 22) and AMX-TILE (24), XTILECFG and XTILEDATA in
    // XCR0 (bits 17, 18).
    let tiles = l7.edx & (1 << 22) != 0 && l7.edx & (1 << 24) != 0 && xcr0 & (3 << 17) == 3 << 17;
    let amx = avx512vnni && tiles;
    Features { avx2, avx512, avx512vnni, amx }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features::default()
}

/// XCR0 via XGETBV(0).
///
/// # Safety
/// CPUID.1:ECX.OSXSAVE must be set.
#[cfg(target_arch = "x86_64")]
unsafe fn xgetbv0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller checked OSXSAVE; xgetbv reads XCR0 without side effects.
    unsafe {
        core::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
            options(nomem, nostack, preserves_flags));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Counts only the register state in `xcr0` from now on (and detects the
/// features again): for a guest whose VMM says which XCR0 it set, on hosts
/// where ring 3's XGETBV reports the host's XCR0 instead (nested hypervisors
/// of the PVM kind). Without YMM state only [`Path::Generic`] remains,
/// without opmask/ZMM state nothing above [`Path::Avx2`]. Call it before
/// loading models: a model keeps the path it was given.
pub fn limit_xcr0(xcr0: u64) {
    XCR0_LIMIT.store(xcr0, Ordering::Relaxed);
    FEATURES.store(0, Ordering::Relaxed);
}

/// The fastest path this CPU supports.
pub fn best() -> Path {
    let f = features();
    if f.avx512vnni {
        Path::Avx512Vnni
    } else if f.avx512 {
        Path::Avx512
    } else if f.avx2 {
        Path::Avx2
    } else {
        Path::Generic
    }
}

/// The requested path is not supported by this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported(pub Path);

impl core::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "this CPU cannot run the {} kernels; use generic or automatic", self.0.name())
    }
}
