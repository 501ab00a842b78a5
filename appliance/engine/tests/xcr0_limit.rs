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
    let forced = kore_engine::EngineOptions { kernels: Some(Path::Avx512), ..Default::default() };
    assert!(forced.check().is_err(), "AVX-512 cannot be chosen without ZMM state");
    simd::limit_xcr0(0x3); // x87 | SSE
    assert_eq!(simd::best(), Path::Generic);
    let forced = kore_engine::EngineOptions { kernels: Some(Path::Avx2), ..Default::default() };
    assert!(forced.check().is_err(), "AVX2 cannot be chosen without YMM state");
    simd::limit_xcr0(u64::MAX);
    assert_eq!(simd::best(), host);
}
