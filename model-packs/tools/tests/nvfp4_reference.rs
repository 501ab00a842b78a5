//! kore-pack's NVFP4 quantizer against the committed reference fixture
//! (scripts/packs/nvfp4_reference.py, itself checked against ModelOpt), and
//! the dequantization error bound.

use kore_pack::nvfp4::{dequantize, e4m3_to_f32, quantize, GROUP};
use kore_pack::safetensors::SafetensorsFile;
use kore_pack::synth::Rng;
use std::path::Path;

#[test]
fn quantizer_bytes_equal_the_reference() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvfp4_reference.safetensors");
    let f = SafetensorsFile::open(&path).unwrap();
    let mut cases = 0;
    for i in 0.. {
        let Some(input) = f.tensor(&format!("case{i}.input")) else { break };
        let (rows, cols) = (input.shape[0] as usize, input.shape[1] as usize);
        let q = quantize("fixture", &input.to_f32().unwrap(), rows, cols).unwrap();
        let w = f.tensor(&format!("case{i}.weight")).unwrap();
        let s = f.tensor(&format!("case{i}.weight_scale")).unwrap();
        let s2 = f.tensor(&format!("case{i}.weight_scale_2")).unwrap();
        assert_eq!(q.weight, w.data, "case {i}: packed codes differ");
        assert_eq!(q.weight_scale, s.data, "case {i}: block scales differ");
        assert_eq!(q.weight_scale_2.to_le_bytes(), s2.data, "case {i}: global scale differs");
        cases += 1;
    }
    assert_eq!(cases, 8, "the fixture should hold 8 cases");
}

#[test]
fn dequantize_error_is_bounded_by_the_block_step() {
    let mut rng = Rng::new(7);
    let (rows, cols) = (64, 256);
    // Heavy-tailed values over several magnitudes.
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let u = rng.unit() * 2.0 - 1.0;
            let scale = 10f32.powi(-((i / cols) as i32 % 4));
            u * u * u * scale
        })
        .collect();
    let q = quantize("bound", &x, rows, cols).unwrap();
    let y = dequantize(&q);
    let (mut err2, mut sig2) = (0.0f64, 0.0f64);
    for (b, (xb, yb)) in x.chunks(GROUP).zip(y.chunks(GROUP)).enumerate() {
        // Largest E2M1 gap is 2 (between 4 and 6): error <= one block step d;
        // a block scale rounded down lets |q| reach 6·(1+1/15) < 7, still within d.
        let d = e4m3_to_f32(q.weight_scale[b]) * q.weight_scale_2;
        for (&a, &c) in xb.iter().zip(yb) {
            assert!((a - c).abs() <= d * 1.0001, "block {b}: {a} -> {c}, step {d}");
            err2 += ((a - c) as f64).powi(2);
            sig2 += (a as f64).powi(2);
        }
    }
    let rel = (err2 / sig2).sqrt();
    assert!(rel < 0.2, "relative RMS error {rel}");
}
