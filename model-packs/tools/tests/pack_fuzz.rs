//! The pack fuzz body (`kore_pack::fuzz`, also behind the cargo-fuzz targets in fuzz/)
//! on random bytes, and real packs truncated at random lengths or with random bytes
//! flipped in each file: loading and verifying must end in `Ok` or a typed error, never a
//! panic, and `verify` must reject every pack that differs from the original.

mod common;

use common::{temp_dir, tiny_config};
use kore_pack::fuzz;
use kore_pack::pack::verify;
use kore_pack::synth::Rng;
use kore_pack::NoProgress;

fn below(rng: &mut Rng, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

#[test]
fn random_bytes_in_every_target() {
    let mut rng = Rng::new(0x6b6f_7265);
    for i in 0..600 {
        let len = below(&mut rng, 4096);
        let mut b = vec![0u8; len + 1];
        rng.fill(&mut b);
        b[0] = (i % 3) as u8;
        fuzz::run(&b);
    }
}

/// True if two manifests differ only inside the free-text `source = "..."` line (which no
/// check covers, by design).
fn only_free_text_changed(a: &[u8], b: &[u8]) -> bool {
    let strip = |t: &[u8]| -> Vec<u8> {
        let t = String::from_utf8_lossy(t);
        t.lines()
            .filter(|l| !l.starts_with("source = \""))
            .collect::<Vec<_>>()
            .join("\n")
            .into_bytes()
    };
    a != b && a.len() == b.len() && strip(a) == strip(b)
}

#[test]
fn truncated_and_mutated_packs_fail_cleanly() {
    let good = temp_dir("fuzz-good");
    kore_pack::synth::synth_config("fuzz", tiny_config(), &good, 9, &NoProgress).unwrap();
    let read = |f: &str| std::fs::read(good.join(f)).unwrap();
    let files = [read("pack.toml"), read("weights.safetensors"), read("tokenizer.json")];
    let dir = temp_dir("fuzz-case");
    let mut rng = Rng::new(7);
    let (mut failed, mut changed) = (0, 0);
    for _ in 0..150 {
        let mut f = files.clone();
        let which = below(&mut rng, 3);
        match below(&mut rng, 3) {
            0 => {
                let n = below(&mut rng, f[which].len());
                f[which].truncate(n);
            }
            1 => {
                for _ in 0..1 + below(&mut rng, 8) {
                    let at = below(&mut rng, f[which].len());
                    f[which][at] ^= 1 << below(&mut rng, 8);
                }
            }
            _ => {
                // A flip inside the safetensors JSON header or the manifest text keeps the
                // file's framing, so parsing goes further before it finds the defect.
                let w = if which == 2 { 1 } else { which };
                let hdr_end = if w == 1 {
                    8 + u64::from_le_bytes(f[1][..8].try_into().unwrap()) as usize
                } else {
                    f[0].len()
                };
                let lo = if w == 1 { 8 } else { 0 };
                let at = lo + below(&mut rng, hdr_end - lo);
                f[w][at] = b"0123456789,:[]{}\"abcxyz "[below(&mut rng, 24)];
            }
        }
        fuzz::write_pack(&dir, &f[0], &f[1], &f[2]);
        fuzz::open_and_verify(&dir);
        if f != files && !only_free_text_changed(&f[0], &files[0]) {
            changed += 1;
            let rejected = verify(&dir, &NoProgress).is_err();
            failed += rejected as usize;
        }
    }
    // Every changed file changes a checksum (or the manifest holding them), so verify
    // must reject every changed pack.
    assert!(changed > 100, "{changed} of 150 cases changed a file");
    assert_eq!(failed, changed, "verify accepted a changed pack");
    let _ = std::fs::remove_dir_all(&good);
    let _ = std::fs::remove_dir_all(&dir);
}
