//! SIMD kernel paths and runtime CPU feature dispatch that works in `no_std`:
//! CPUID and XGETBV through `core::arch`, the result cached in an atomic.
//!
//! Each path implements the same per-row kernels as `kernels::generic` (its
//! twin); `tests/kernels_agree.rs` checks every path against it. [`attn`]:
//! the attention kernels (scores, weighted value sums, exp) on the same paths.

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub mod attn;
#[cfg(target_arch = "x86_64")]
mod attn_x86;
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
pub mod silu;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_q8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_tile;

/// A global scale as the vector E4M3 decoders (`avx512::e4m3x16`,
/// `avx2_q8::e4m3x8`) apply it. They place a sign-extended E4M3 byte's
/// bits in an f32 that reads 2^120 below its value; multiplying by `2^120 *
/// gs` at once equals multiplying by 2^120 (exact) and then by `gs` whenever
/// `2^120 * gs` is itself exact (a normal float), so one multiply serves
/// and every scale stays bit-identical to `E4M3_TABLE[b] * gs`; other `gs`
/// (zero, not finite) take the two multiplies.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
pub(crate) struct E4m3Scale {
    /// `2^120 * gs` when `folded`, else 2^120.
    pub(super) k: f32,
    /// `gs`, applied separately unless `folded`.
    pub(super) gs: f32,
    /// Whether `k` already holds `gs`.
    pub(super) folded: bool,
}

#[cfg(target_arch = "x86_64")]
impl E4m3Scale {
    /// 2^120: how much too small an E4M3 byte's bits read in an f32.
    pub(super) const RESCALE: f32 = f32::from_bits(0x7B80_0000);

    /// Keeps the sign (bit 31) and the exponent and mantissa (bits 20-26) of
    /// a sign-extended E4M3 byte shifted left by 20.
    pub(super) const BITS: i32 = 0x87F0_0000u32 as i32;

    /// `gs` prepared for the decoders.
    pub(crate) fn new(gs: f32) -> Self {
        let k = Self::RESCALE * gs;
        let folded = k.is_normal();
        E4m3Scale { k: if folded { k } else { Self::RESCALE }, gs, folded }
    }
}

/// How far ahead of the weight line being read the row kernels prefetch.
/// The rows are read front to back and one after another, so the stream is
/// one long sequential read; the hardware prefetchers stop at every 4 KiB
/// boundary, the software prefetch does not (`benches/kernels.rs` measured
/// 1.3-1.5x on one thread for distances of 2-8 KiB). 3 KiB into L2 (T1)
/// rather than 4 KiB into L1 (T0): 2b decode 1.06x (median of 10 alternating
/// pairs, 0.98-1.16) on an Intel Xeon host, prefill unchanged.
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_BYTES: usize = 3072;

/// Hints the cache line `PREFETCH_BYTES` after `p` into L2. A prefetch never
/// faults, so the address may lie past the end of the weights.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    // SAFETY: PREFETCH has no architectural effect and never faults; SSE is
    // part of x86_64.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_BYTES) as *const i8) }
}

/// [`prefetch_ahead`] for a row's block scales, 8 times shorter than its codes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_scales_ahead(p: *const u8) {
    use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    // SAFETY: as in `prefetch_ahead`.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PREFETCH_BYTES / 8) as *const i8) }
}

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

    /// Whether this CPU (and its OS/VMM-enabled register state) can run the path.
    pub fn supported(self) -> bool {
        match self {
            Path::Generic => true,
            Path::Avx2 => features().avx2,
            Path::Avx512 => features().avx512,
            Path::Avx512Vnni => features().avx512vnni,
            Path::Amx => features().amx && amx::tile_state_granted(),
        }
    }

    fn code(self) -> u8 {
        match self {
            Path::Generic => 1,
            Path::Avx2 => 2,
            Path::Avx512 => 3,
            Path::Avx512Vnni => 4,
            Path::Amx => 5,
        }
    }

    fn from_code(c: u8) -> Option<Path> {
        match c {
            1 => Some(Path::Generic),
            2 => Some(Path::Avx2),
            3 => Some(Path::Avx512),
            4 => Some(Path::Avx512Vnni),
            5 => Some(Path::Amx),
            _ => None,
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
/// `AUTO` (the best supported path) or a forced `Path::code`.
static FORCED: AtomicU8 = AtomicU8::new(AUTO);
/// XCR0 bits detection may count (see [`limit_xcr0`]); all by default.
static XCR0_LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);
const AUTO: u8 = 255;

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
/// without opmask/ZMM state nothing above [`Path::Avx2`]. A path forced
/// earlier is dropped if it is no longer supported.
pub fn limit_xcr0(xcr0: u64) {
    XCR0_LIMIT.store(xcr0, Ordering::Relaxed);
    FEATURES.store(0, Ordering::Relaxed);
    let forced = Path::from_code(FORCED.load(Ordering::Relaxed));
    if forced.is_some_and(|p| !p.supported()) {
        FORCED.store(AUTO, Ordering::Relaxed);
    }
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

/// The path `kernels::matmul` uses: the one forced with [`force`] (the
/// engine's caller does that, see [`crate::EngineOptions`]), else [`best`].
pub fn active() -> Path {
    Path::from_code(FORCED.load(Ordering::Relaxed)).unwrap_or_else(best)
}

/// The requested path is not supported by this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported(pub Path);

impl core::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "this CPU cannot run the {} kernels; use generic or automatic", self.0.name())
    }
}

/// Forces `path` for every later kernel call in this process (`None` = automatic).
pub fn force(path: Option<Path>) -> Result<(), Unsupported> {
    match path {
        Some(p) if !p.supported() => Err(Unsupported(p)),
        Some(p) => {
            FORCED.store(p.code(), Ordering::Relaxed);
            Ok(())
        }
        None => {
            FORCED.store(AUTO, Ordering::Relaxed);
            Ok(())
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use core::arch::x86_64::*;

    use super::E4m3Scale;
    use crate::weights::e4m3_to_f32;

    /// Global scales that fold (a normal `2^120 gs`) and that do not.
    const SCALES: [f32; 10] =
        [1.0, 0.0123, 3.0e-7, 255.9, 1.0e-38, 256.0, 1.0e30, 1.0e-40, 0.0, f32::NAN];

    /// Runs `decode` over every byte in groups of `width`, for every scale,
    /// against the scalar decode times the scale, bit for bit (the 0x7F and
    /// 0xFF NaN codes, which `pack verify` rejects, are not special-cased by
    /// the vector decoders and are skipped).
    fn check(width: usize, decode: impl Fn(&[u8], E4m3Scale) -> Vec<f32>) {
        let bytes: Vec<u8> = (0..=255).collect();
        for gs in SCALES {
            for group in bytes.chunks_exact(width) {
                let got = decode(group, E4m3Scale::new(gs));
                for (&b, g) in group.iter().zip(got).filter(|(b, _)| **b & 0x7F != 0x7F) {
                    let want = e4m3_to_f32(b) * gs;
                    let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
                    assert!(same, "byte {b:#04x} gs {gs:e}: {g:e} vs {want:e}");
                }
            }
        }
    }

    #[test]
    fn e4m3x16_is_bit_identical_to_the_scalar_decode_for_every_byte_and_scale() {
        if !std::is_x86_feature_detected!("avx512bw") || !std::is_x86_feature_detected!("avx512vl")
        {
            eprintln!("no AVX-512 here: nothing to compare");
            return;
        }
        check(16, |sixteen, gs| {
            let mut got = vec![0f32; 16];
            // SAFETY: AVX-512 F/BW/VL checked above; 16 bytes at the pointer,
            // 16 floats in `got`.
            unsafe {
                _mm512_storeu_ps(got.as_mut_ptr(), super::avx512::e4m3x16(sixteen.as_ptr(), gs))
            };
            got
        });
    }

    #[test]
    fn e4m3x8_is_bit_identical_to_the_scalar_decode_for_every_byte_and_scale() {
        if !std::is_x86_feature_detected!("avx2") || !std::is_x86_feature_detected!("fma") {
            eprintln!("no AVX2 here: nothing to compare");
            return;
        }
        check(8, |eight, gs| {
            let mut got = vec![0f32; 8];
            // SAFETY: AVX2 + FMA checked above; 8 bytes at the pointer, 8
            // floats in `got`.
            unsafe {
                let b = _mm256_cvtepi8_epi32(_mm_loadl_epi64(eight.as_ptr() as *const __m128i));
                _mm256_storeu_ps(got.as_mut_ptr(), super::avx2_q8::e4m3x8(b, gs));
            }
            got
        });
    }
}
