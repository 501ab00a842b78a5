//! The attention kernels (`kernels::attn`) agree with their generic twins on
//! every supported path across odd head dims, group sizes, lengths and row
//! strides, for f32 and f16 caches; the polynomial exp is within 1 ulp of
//! the true value everywhere and exact at the edges; and long-context
//! attention (pieces merged across workers) agrees with the unsplit
//! computation and does not depend on the number of workers.

use std::path::PathBuf;

use kore_engine::hf::HfModelDir;
use kore_engine::kernels::attn::{accumulate, exp_shift_sum, scores};
use kore_engine::kernels::KvElem;
use kore_engine::ops::exp;
use kore_engine::pool::ThreadPool;
use kore_engine::simd::Path;
use kore_engine::state::KvPrecision;
use kore_engine::{Logits, State};

mod common;

use common::{Paths, Rng};

/// `|a - b| <= 1e-5 * scale` elementwise.
fn close(a: &[f32], b: &[f32], scale: f32, what: &str) {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-5 * scale, "{what}: [{i}] {x} vs {y}");
    }
}

fn check_kernels<E: KvElem>(rng: &mut Rng, rec: &mut Paths) {
    for hd in [1, 7, 8, 9, 15, 16, 17, 33, 64, 100, 256] {
        for g in [1, 2, 3, 4, 5, 6, 8] {
            for n in [1, 2, 15, 16, 17, 70] {
                let stride = hd * 3 + n % 3;
                let keys: Vec<E> = (0..n * stride).map(|_| E::from_f32(rng.f())).collect();
                let q: Vec<f32> = (0..g * hd).map(|_| rng.f()).collect();
                let p: Vec<f32> = (0..g * (n + 5)).map(|_| rng.f().abs()).collect();
                let o0: Vec<f32> = (0..g * hd).map(|_| rng.f()).collect();
                let scale = 0.3;
                let mut want = vec![f32::NAN; g * (n + 2)];
                for gi in 0..g {
                    want[gi * (n + 2) + n..(gi + 1) * (n + 2)].fill(7.0);
                }
                let mut want_o = o0.clone();
                scores(Path::Generic, &q, g, hd, &keys, stride, n, &mut want, n + 2, scale);
                accumulate(Path::Generic, &p, n + 5, g, hd, &keys, stride, n, &mut want_o);
                for path in rec.list() {
                    rec.ran(path);
                    let what = format!("{} f16={} hd={hd} g={g} n={n}", path.name(), E::F16);
                    let mut got = vec![f32::NAN; g * (n + 2)];
                    for gi in 0..g {
                        got[gi * (n + 2) + n..(gi + 1) * (n + 2)].fill(7.0);
                    }
                    scores(path, &q, g, hd, &keys, stride, n, &mut got, n + 2, scale);
                    close(&got, &want, hd as f32 * scale, &format!("{what} scores"));
                    let mut got_o = o0.clone();
                    accumulate(path, &p, n + 5, g, hd, &keys, stride, n, &mut got_o);
                    close(&got_o, &want_o, n as f32, &format!("{what} accumulate"));
                }
            }
        }
    }
}

#[test]
fn scores_and_value_sums_agree_with_generic_on_every_path() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut rec = Paths::new("attn_kernels::scores_and_value_sums", true);
    check_kernels::<f32>(&mut rng, &mut rec);
    check_kernels::<u16>(&mut rng, &mut rec);
    rec.finish();
}

/// Distance in units in the last place (same sign, finite).
fn ulps(a: f32, b: f32) -> u32 {
    (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
}

#[test]
fn exp_is_within_one_ulp_and_exact_at_the_edges() {
    let mut x = -104.0f32;
    let (mut n, mut exact) = (0u32, 0u32);
    while x < 89.0 {
        let truth = (x as f64).exp() as f32;
        let got = exp(x);
        assert!(ulps(got, truth) <= 1, "exp({x}) = {got}, want {truth}");
        exact += u32::from(got == truth);
        n += 1;
        x += 0.000_913;
    }
    assert!(exact as f64 >= 0.999 * n as f64, "{exact} of {n} correctly rounded");
    assert_eq!(exp(0.0), 1.0);
    for (x, want) in [
        (f32::NEG_INFINITY, 0.0),
        (-1e30, 0.0),
        (-104.0, 0.0),
        (88.8, f32::INFINITY),
        (1e30, f32::INFINITY),
        (f32::INFINITY, f32::INFINITY),
    ] {
        assert_eq!(exp(x), want, "exp({x})");
    }
    assert!(exp(f32::NAN).is_nan());
    // Gradual underflow: e^-100 is a subnormal f32.
    assert_eq!(exp(-100.0), (-100f64).exp() as f32);
}

#[test]
fn vectorised_exp_agrees_with_the_scalar_one_on_every_path() {
    let mut xs: Vec<f32> = (0..20_011).map(|i| -110.0 + i as f32 * 0.01).collect();
    xs.extend([f32::NEG_INFINITY, -1e30, 88.72, 88.73, 1e30, f32::INFINITY, 0.0, -0.0]);
    let mut rec = Paths::new("attn_kernels::vectorised_exp", false);
    for path in rec.list() {
        rec.ran(path);
        for len in [xs.len(), 1, 7, 8, 15, 17, 33] {
            let mut got = xs[..len].to_vec();
            let sum = exp_shift_sum(path, &mut got, 0.5);
            let mut want_sum = 0.0f64;
            for (g, x) in got.iter().zip(&xs) {
                let want = exp(x - 0.5);
                assert!(!g.is_nan(), "{}: exp({x}) is NaN", path.name());
                assert!(
                    ulps(*g, want) <= 1 || g == &want,
                    "{}: exp({x}) {g} vs {want}",
                    path.name()
                );
                want_sum += f64::from(want);
            }
            if want_sum.is_finite() {
                assert!(
                    (f64::from(sum) - want_sum).abs() <= 1e-5 * want_sum,
                    "{}: sum",
                    path.name()
                );
            } else {
                assert!(sum.is_infinite());
            }
        }
        let mut nan = [1.0, f32::NAN, 2.0];
        exp_shift_sum(path, &mut nan, 0.0);
        assert!(nan[1].is_nan() && !nan[0].is_nan() && !nan[2].is_nan(), "{}", path.name());
    }
    rec.finish();
}

fn fixture() -> HfModelDir {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mixed_f32_untied");
    HfModelDir::open(&dir).unwrap()
}

/// After 3000 synthetic positions (two decode pieces of 2048), 17 tokens run
/// as one call (one piece per token, blocks of keys) and one by one
/// (pieces merged); threaded runs equal serial ones bit for bit. Serial
/// decode steps take both KV heads in one work item (two pieces keep its one
/// worker busy), threaded ones a head an item (two pieces for three
/// workers): the span of an item does not change a bit.
#[test]
fn long_context_pieces_merge_to_the_unsplit_result() {
    let hf = fixture();
    let mut model = hf.model().unwrap();
    let tokens: Vec<u32> =
        (0..17u32).map(|i| (i * 31 + 5) % model.config.vocab_size as u32).collect();
    let pool = ThreadPool::new(3);
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        let mut base = State::with_kv(&model.config, kv);
        base.push_synthetic_context(&model.config, 3000, 7);
        let mut runs = Vec::new();
        for threaded in [false, true] {
            if threaded {
                model.set_pool(&pool);
            }
            let mut one = base.clone();
            let all = model.forward(&mut one, &tokens, Logits::All).unwrap();
            let mut step = base.clone();
            let mut each = Vec::new();
            for t in &tokens {
                each.extend(model.forward(&mut step, &[*t], Logits::Last).unwrap());
            }
            let scale = all.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            close(&each, &all, scale * 10.0, &format!("{kv:?} one call vs one by one"));
            runs.push((all, each));
        }
        assert!(runs[0] == runs[1], "{kv:?}: threaded differs from serial");
    }
}

#[test]
fn f16_cache_halves_the_bytes_and_stays_near_f32() {
    let hf = fixture();
    let model = hf.model().unwrap();
    let prompt: Vec<u32> =
        (0..40u32).map(|i| (i * 7919) % model.config.vocab_size as u32).collect();
    let mut a = State::with_kv(&model.config, KvPrecision::F32);
    let mut b = State::with_kv(&model.config, KvPrecision::F16);
    let la = model.forward(&mut a, &prompt, Logits::All).unwrap();
    let lb = model.forward(&mut b, &prompt, Logits::All).unwrap();
    assert_eq!(a.kv_bytes(), 2 * b.kv_bytes());
    assert!(b.kv_bytes() > 0);
    let worst = la.iter().zip(&lb).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(worst > 0.0 && worst < 1e-2, "f16 vs f32 KV: max |diff| {worst}");
}

/// Prefill attention runs in tiles of tokens (each block of keys read once
/// per tile); below one decode piece (2048 keys) a token's logits are the
/// same bits whether it runs in a 45-token prefill (three tiles, several
/// blocks of keys each) or alone as a decode step, serial and threaded.
#[test]
fn prefill_tiles_equal_token_by_token_bit_for_bit() {
    let hf = fixture();
    let mut model = hf.model().unwrap();
    let tokens: Vec<u32> =
        (0..45u32).map(|i| (i * 131 + 7) % model.config.vocab_size as u32).collect();
    let pool = ThreadPool::new(2);
    for kv in [KvPrecision::F32, KvPrecision::F16] {
        for threaded in [false, true] {
            if threaded {
                model.set_pool(&pool);
            }
            let mut base = State::with_kv(&model.config, kv);
            base.push_synthetic_context(&model.config, 600, 3);
            let all = model.forward(&mut base.clone(), &tokens, Logits::All).unwrap();
            let mut step = base.clone();
            let mut each = Vec::new();
            for t in &tokens {
                each.extend(model.forward(&mut step, &[*t], Logits::Last).unwrap());
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(&all) == bits(&each), "{kv:?} threaded={threaded}");
        }
    }
}
