//! `simd::limit_xcr0`: a guest told its XCR0 by the VMM never picks a kernel
//! path that needs register state outside it (its own process: the limit is global).

use kore_engine::simd::{self, Path};

#[test]
fn a_limited_xcr0_caps_the_kernel_path() {
    let host = simd::best();
    simd::limit_xcr0(0x7); // x87 | SSE | AVX: no opmask/ZMM state
    assert!(!Path::Avx512.supported() && !Path::Avx512Vnni.supported() && !Path::Amx.supported());
    let want = if host == Path::Generic { Path::Generic } else { Path::Avx2 };
    assert_eq!(simd::best(), want);
    assert_eq!(simd::active(), want);
    simd::limit_xcr0(0x3); // x87 | SSE
    assert_eq!(simd::best(), Path::Generic);
    assert!(simd::force(Some(Path::Avx2)).is_err(), "AVX2 cannot be forced without YMM state");
    simd::limit_xcr0(u64::MAX);
    assert_eq!(simd::best(), host);
}
