//! The prefix cache never changes an answer: 64 raw prompts that share
//! prefixes in many ways (prefixes of one another, extensions, divergence at
//! a chunk edge, message boundaries, short and long continuations past 2048
//! positions), greedy and seeded sampling, 8 at a time, get exactly the
//! tokens of the uncached engine (cache budget 0): on first sight (requests
//! waiting for each other's checkpoints), from warm memory, and with other
//! prefill chunks and checkpoint intervals; on the tiny bf16 model and the
//! NVFP4 default pack (the first 32 prompts: every way of sharing), on every
//! kernel path this CPU runs (the first 16 on each).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use kore_appliance::{stop_ids, CacheStats, ModelEngine, TokenizerCodec};
use kore_engine::hf::HfModelDir;
use kore_engine::simd::Path;
use kore_engine::Model;
use kore_service::host::StdClock;
use kore_service::{Config, Service};
use kore_tokenizer::Tokenizer;
use serde_json::{json, Value};

type Svc<'m> = Service<ModelEngine<'m>, TokenizerCodec, StdClock>;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny-hf")
}

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_file(tiny_dir().join("tokenizer.json")).unwrap())
}

/// `n` pseudo-random ordinary token ids from `seed`.
fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 4000) as u32
        })
        .collect()
}

fn cat(parts: &[&[u32]]) -> Vec<u32> {
    parts.concat()
}

/// 64 prompts sharing prefixes in many ways.
fn prompts() -> Vec<Vec<u32>> {
    let open = tokenizer().token_to_id("<|im_start|>").unwrap();
    let (a, b, c) = (tokens(1, 700), tokens(2, 2200), tokens(3, 40));
    (0..64usize)
        .map(|i| {
            let tail = |n: usize| tokens(100 + i as u64, n);
            match i % 8 {
                0 => a[..300 + 7 * i].to_vec(),
                1 => cat(&[&a, &tail(20 + i)]),
                2 => b[..2049 + i].to_vec(),
                3 => cat(&[&b, &tail(3 + i % 12)]),
                4 => cat(&[&c, &[open], &a[..100], &[open], &tail(30)]),
                5 => tail(50),
                6 => cat(&[&a[..512], &tail(40)]),
                _ => cat(&[&b[..1000], &[open], &tail(1100 + i)]),
            }
        })
        .collect()
}

fn requests(prompts: &[Vec<u32>]) -> Vec<Value> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = json!({"id": i, "prompt_ids": p, "max_tokens": 6});
            if i % 2 == 1 {
                r["temperature"] = json!(0.9);
                r["top_p"] = json!(0.9);
                r["seed"] = json!(i);
            }
            r
        })
        .collect()
}

fn service<'m>(model: &'m Model<'m>, budget: usize, chunk: usize, every: usize) -> Svc<'m> {
    let tok = tokenizer();
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let engine = ModelEngine::new(model, "tiny", stops.clone())
        .with_cache_budget(budget)
        .with_prefill_chunk(chunk)
        .with_checkpoint_interval(every);
    Service::new(engine, TokenizerCodec::new(tok, stops), StdClock::new(), Config::default())
}

/// Runs every request (all queued at once); token ids by request id.
fn run(svc: &mut Svc<'_>, reqs: &[Value]) -> BTreeMap<u64, Value> {
    let c = svc.open();
    for r in reqs {
        svc.on_bytes(c, format!("{r}\n").as_bytes());
    }
    while svc.poll() {}
    let text = String::from_utf8(svc.take_output(c)).unwrap();
    svc.on_closed(c);
    let mut out = BTreeMap::new();
    for e in text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()) {
        assert!(e.get("error").is_none(), "{e}");
        if e["done"] == true {
            out.insert(e["id"].as_u64().unwrap(), e["token_ids"].clone());
        }
    }
    assert_eq!(out.len(), reqs.len());
    out
}

fn check(model: &Model<'_>, reqs: &[Value], label: &str) -> CacheStats {
    let reference = run(&mut service(model, 0, 512, 2048), reqs);
    let mut svc = service(model, 1 << 30, 512, 2048);
    assert_eq!(run(&mut svc, reqs), reference, "{label}: first sight");
    let first = svc.engine().cache_stats();
    assert_eq!(run(&mut svc, reqs), reference, "{label}: warm");
    let mut small = service(model, 1 << 30, 96, 300);
    assert_eq!(run(&mut small, reqs), reference, "{label}: chunk 96, checkpoints every 300");
    assert_eq!(run(&mut small, reqs), reference, "{label}: chunk 96, warm");
    eprintln!("{label}: first {first:?}\nwarm {:?}", svc.engine().cache_stats());
    first
}

#[test]
fn sixty_four_prompts_sharing_prefixes_get_the_uncached_tokens() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let stats = check(&model, &requests(&prompts()), "tiny-hf");
    assert!(stats.hits_memory > 20 && stats.followed > 0, "{stats:?}");
}

#[test]
fn the_default_pack_gets_the_uncached_tokens() {
    let pack = kore_pack::Pack::open(tiny_dir().join("../tiny")).unwrap();
    let model = pack.model().unwrap();
    let reqs: Vec<Value> = requests(&prompts()).into_iter().take(32).collect();
    check(&model, &reqs, "default pack");
}

#[test]
fn every_kernel_path_gets_the_uncached_tokens() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let reqs: Vec<Value> = requests(&prompts()).into_iter().take(16).collect();
    for p in Path::ALL.into_iter().filter(|p| p.supported() && *p != Path::Amx) {
        let mut model = hf.model().unwrap();
        model.set_kernels(p).unwrap();
        check(&model, &reqs, p.name());
    }
}
