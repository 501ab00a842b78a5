//! NVFP4 (ModelOpt layout) linears against torch's dequantization
//! (fixture from scripts/reference/gen_fixtures.py; E4M3 decoded by torch).

use std::path::Path;

use kore_engine::kernels::{matmul_with, q8_activations};
use kore_engine::pool::Serial;
use kore_engine::safetensors::Safetensors;
use kore_engine::simd::Path as KernelPath;
use kore_engine::weights::{Linear, WeightLoader};

fn f32s(st: &Safetensors<'_>, name: &str) -> Vec<f32> {
    let t = st.get(name).unwrap();
    (0..t.numel()).map(|i| t.get_f32(i).unwrap()).collect()
}

#[test]
fn nvfp4_dequantizes_and_multiplies_like_torch() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvfp4/nvfp4.safetensors");
    let bytes = std::fs::read(path).unwrap();
    let st = Safetensors::parse(&bytes).unwrap();
    let deq = f32s(&st, "dequantized");
    let (n, k) = (12, 64);
    let w = WeightLoader::new(&st).linear("linear", n, k).unwrap();
    assert!(matches!(w, Linear::Nvfp4 { .. }));
    let mut row = vec![0.0; k];
    for r in 0..n {
        w.decode_row(r, &mut row);
        for (c, (a, b)) in row.iter().zip(&deq[r * k..(r + 1) * k]).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-3), "row {r} col {c}: {a} vs {b}");
        }
    }
    let x = f32s(&st, "x");
    let want = f32s(&st, "y");
    // A path that quantizes activations to int8 per 16-column block moves
    // each one by at most half a step (amax / 254): that bounds its error.
    let step: Vec<f32> =
        x.chunks(16).map(|b| b.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 254.0).collect();
    for path in KernelPath::ALL.into_iter().filter(|p| p.supported()) {
        let mut y = vec![0.0; n];
        matmul_with(path, &Serial, &w, &x, 1, &mut y);
        let q8 = q8_activations(path, &w);
        for (r, (a, b)) in y.iter().zip(&want).enumerate() {
            let quant: f32 =
                if q8 { (0..k).map(|c| deq[r * k + c].abs() * step[c / 16]).sum() } else { 0.0 };
            let what = format!("{} row {r}: {a} vs {b} (quantization bound {quant})", path.name());
            assert!((a - b).abs() <= 1e-4 + quant, "{what}");
        }
    }
    // Wrong shapes of the scale tensors are rejected, not misread.
    let err = WeightLoader::new(&st).linear("linear", n, 2 * k).unwrap_err();
    assert!(err.to_string().contains("linear.weight"), "{err}");
}
