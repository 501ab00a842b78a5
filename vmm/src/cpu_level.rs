//! [`GuestCpu`]: the CPU the VMM presents to the guest. `Host` passes the
//! host's SIMD features; the x86-64 micro-architecture levels hide what lies
//! above them, in CPUID and in XCR0, so the guest behaves as it would on a
//! smaller CPU (an AVX2-only laptop, or one without AVX at all): with XCR0
//! lacking the opmask/ZMM state every EVEX instruction raises #UD, and
//! without the YMM state every VEX instruction does.

use std::fmt;
use std::str::FromStr;

/// The CPU level the guest sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GuestCpu {
    /// The host's features (AVX-512 where the host has it).
    #[default]
    Host,
    /// x86-64-v3: AVX, AVX2, FMA, F16C, BMI1/2 (and AVX-VNNI where the host has
    /// it); no AVX-512. XCR0 = x87 | SSE | AVX.
    X86_64V3,
    /// x86-64-v2: SSE up to 4.2 and POPCNT; no AVX of any kind. XCR0 = x87 | SSE.
    X86_64V2,
}

/// CPUID bits one level hides (each mask is cleared from the guest's leaf).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hidden {
    /// Leaf 1 ECX.
    pub leaf1_ecx: u32,
    /// Leaf 7.0 EBX.
    pub leaf7_ebx: u32,
    /// Leaf 7.0 ECX.
    pub leaf7_ecx: u32,
    /// Leaf 7.0 EDX.
    pub leaf7_edx: u32,
    /// Leaf 7.1 EAX.
    pub leaf7_1_eax: u32,
}

/// Leaf 7.0 EBX AVX-512 bits: F, DQ, IFMA, CD, BW, VL.
const AVX512_EBX: u32 = (1 << 16) | (1 << 17) | (1 << 21) | (1 << 28) | (1 << 30) | (1 << 31);
/// Leaf 7.0 ECX AVX-512 bits: VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ.
const AVX512_ECX: u32 = (1 << 1) | (1 << 6) | (1 << 11) | (1 << 12) | (1 << 14);
/// Leaf 7.0 EDX AVX-512 bits: 4VNNIW, 4FMAPS, VP2INTERSECT, FP16.
const AVX512_EDX: u32 = (1 << 2) | (1 << 3) | (1 << 8) | (1 << 23);
/// Leaf 7.1 EAX AVX512_BF16.
const AVX512_BF16: u32 = 1 << 5;
/// Leaf 1 ECX bits above x86-64-v2: FMA, MOVBE, AVX, F16C.
const V3_LEAF1_ECX: u32 = (1 << 12) | (1 << 22) | (1 << 28) | (1 << 29);
/// Leaf 7.0 EBX bits above x86-64-v2: BMI1, AVX2, BMI2.
const V3_LEAF7_EBX: u32 = (1 << 3) | (1 << 5) | (1 << 8);
/// Leaf 7.0 ECX VEX-encoded extensions that need AVX: VAES, VPCLMULQDQ.
const V3_LEAF7_ECX: u32 = (1 << 9) | (1 << 10);
/// Leaf 7.1 EAX AVX-VNNI.
const AVX_VNNI: u32 = 1 << 4;

impl GuestCpu {
    /// Every level, the host first.
    pub const ALL: [GuestCpu; 3] = [GuestCpu::Host, GuestCpu::X86_64V3, GuestCpu::X86_64V2];

    /// The name used on the command line and in configs.
    pub fn name(self) -> &'static str {
        match self {
            GuestCpu::Host => "host",
            GuestCpu::X86_64V3 => "x86-64-v3",
            GuestCpu::X86_64V2 => "x86-64-v2",
        }
    }

    /// The XCR0 bits this level may have (intersected with the host's).
    pub fn xcr0_mask(self) -> u64 {
        match self {
            GuestCpu::Host => u64::MAX,
            GuestCpu::X86_64V3 => 0x7,
            GuestCpu::X86_64V2 => 0x3,
        }
    }

    /// The CPUID bits this level hides.
    pub fn hidden(self) -> Hidden {
        let no_avx512 = Hidden {
            leaf1_ecx: 0,
            leaf7_ebx: AVX512_EBX,
            leaf7_ecx: AVX512_ECX,
            leaf7_edx: AVX512_EDX,
            leaf7_1_eax: AVX512_BF16,
        };
        match self {
            GuestCpu::Host => Hidden::default(),
            GuestCpu::X86_64V3 => no_avx512,
            GuestCpu::X86_64V2 => Hidden {
                leaf1_ecx: V3_LEAF1_ECX,
                leaf7_ebx: no_avx512.leaf7_ebx | V3_LEAF7_EBX,
                leaf7_ecx: no_avx512.leaf7_ecx | V3_LEAF7_ECX,
                leaf7_edx: no_avx512.leaf7_edx,
                leaf7_1_eax: no_avx512.leaf7_1_eax | AVX_VNNI,
            },
        }
    }
}

impl fmt::Display for GuestCpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`GuestCpu`] level.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown guest CPU `{0}`: use host, x86-64-v3 or x86-64-v2")]
pub struct UnknownGuestCpu(pub String);

impl FromStr for GuestCpu {
    type Err = UnknownGuestCpu;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GuestCpu::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| UnknownGuestCpu(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for l in GuestCpu::ALL {
            assert_eq!(l.name().parse::<GuestCpu>().unwrap(), l);
        }
        assert_eq!("X86-64-V3".parse::<GuestCpu>().unwrap(), GuestCpu::X86_64V3);
        let err = "v4".parse::<GuestCpu>().unwrap_err().to_string();
        assert!(err.contains("x86-64-v2"), "{err}");
    }

    #[test]
    fn lower_levels_hide_more() {
        let v3 = GuestCpu::X86_64V3.hidden();
        let v2 = GuestCpu::X86_64V2.hidden();
        assert_eq!(GuestCpu::Host.hidden(), Hidden::default());
        assert_ne!(v3.leaf7_ebx & (1 << 16), 0, "v3 hides AVX512F");
        assert_eq!(v3.leaf7_ebx & (1 << 5), 0, "v3 keeps AVX2");
        assert_eq!(v3.leaf1_ecx & (1 << 28), 0, "v3 keeps AVX");
        assert_ne!(v2.leaf7_ebx & (1 << 5), 0, "v2 hides AVX2");
        assert_ne!(v2.leaf1_ecx & (1 << 28), 0, "v2 hides AVX");
        assert_eq!(v2.leaf7_ebx & v3.leaf7_ebx, v3.leaf7_ebx);
        assert_eq!(GuestCpu::X86_64V3.xcr0_mask() & 0xe0, 0, "no opmask/ZMM state");
        assert_eq!(GuestCpu::X86_64V2.xcr0_mask() & 0x4, 0, "no YMM state");
    }
}
