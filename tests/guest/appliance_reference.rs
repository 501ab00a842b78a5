//! The appliance against transformers: kore-engine's reference fixtures with bf16 weights
//! (`appliance/engine/tests/fixtures`, made by scripts/reference/gen_fixtures.py with
//! transformers) imported into packs without quantization (bf16 is lossless for them), served
//! by the appliance on 2 vCPUs, asked over vsock for greedy continuations of every reference
//! prompt: the ids equal the ones transformers generated.
//!
//! The fixtures have no tokenizer; the packs borrow the tiny model's (`model-packs/tiny-hf`),
//! which only the codec's stop ids see (ids beyond the fixtures' 256-token vocabulary are
//! dropped), since the requests send `prompt_ids`.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kore_engine::safetensors::Safetensors;
use kore_engine::{DType, TensorView};
use serde_json::json;

use common::client::{ids, Appliance, Client};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../appliance/engine/tests/fixtures")
}

fn i32s(t: TensorView<'_>) -> Vec<u32> {
    assert_eq!(t.dtype, DType::I32);
    t.data.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as u32).collect()
}

/// (prompt, generated) pairs transformers recorded for `fixture`.
fn cases(fixture: &Path) -> Vec<(Vec<u32>, Vec<u32>)> {
    let bytes = std::fs::read(fixture.join("reference.safetensors")).unwrap();
    let st = Safetensors::parse(&bytes).unwrap();
    (0..)
        .map_while(|i| {
            let p = st.get(&format!("prompt_{i}"))?;
            Some((i32s(p), i32s(st.get(&format!("generated_{i}"))?)))
        })
        .collect()
}

/// A pack of `fixture` (bf16, no quantization) with the tiny model's tokenizer files.
fn pack_of(fixture: &Path) -> PathBuf {
    let name = fixture.file_name().unwrap().to_str().unwrap();
    let work = std::env::temp_dir().join(format!("kore-ref-{}-{name}", std::process::id()));
    let (view, pack) = (work.join("hf"), work.join("pack"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&view).unwrap();
    for e in std::fs::read_dir(fixture).unwrap() {
        let p = e.unwrap().path();
        let n = p.file_name().unwrap().to_str().unwrap();
        if !n.starts_with("reference") {
            std::os::unix::fs::symlink(&p, view.join(n)).unwrap();
        }
    }
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny-hf");
    for n in ["tokenizer.json", "tokenizer_config.json"] {
        std::os::unix::fs::symlink(tiny.join(n), view.join(n)).unwrap();
    }
    let opts = kore_pack::import::ImportOptions {
        quant: kore_pack::import::QuantMode::Bf16,
        ..Default::default()
    };
    kore_pack::import::import(&view, &pack, &opts, &kore_pack::progress::NoProgress)
        .unwrap_or_else(|e| panic!("import {name}: {e}"));
    pack
}

#[test]
fn guest_greedy_ids_equal_transformers_on_the_bf16_reference_fixtures() {
    let mut checked = 0;
    for name in ["linear_bf16_tied", "mixed_bf16_mm_sharded_mtp"] {
        let fixture = fixtures().join(name);
        let pack = pack_of(&fixture);
        let app = Appliance::boot_pack(name, 2, &pack);
        let mut c = Client::connect(&app.uds, Instant::now() + Duration::from_secs(120));
        let cases = cases(&fixture);
        assert!(!cases.is_empty(), "{name}: no reference cases");
        for (i, (prompt, want)) in cases.iter().enumerate() {
            let req = json!({"id": i, "prompt_ids": prompt, "max_tokens": want.len(), "mtp": 0});
            c.send(&req.to_string());
            let (_, done) = c.until_done(&json!(i));
            assert_eq!(
                ids(&done["token_ids"]),
                *want,
                "{name} case {i}: {done}\n{}",
                app.console()
            );
            checked += 1;
        }
        let _ = std::fs::remove_dir_all(pack.parent().unwrap());
    }
    eprintln!("{checked} transformers continuations reproduced in the guest");
}
