//! Hugepage reservation and memory sizing against fake sysfs trees.

#[allow(dead_code, unused_imports)]
#[path = "../src/host/mod.rs"]
mod host;
#[allow(dead_code)]
mod host_support;

use host::hugepages::{pages_for, read_pool, reserve, HugepageSize, Pool};
use host::sizing::{Budget, HEAP_BYTES, KERNEL_BYTES};
use host::{Changes, HostError};
use host_support::{w, FakeKernel, Tree};
use kore_engine::state::KvPrecision::{self, F32};

const MIB: u64 = 1 << 20;
const NR_2M: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
const NR_1G: &str = "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages";

#[test]
fn sizes_parse_and_round() {
    assert_eq!("2M".parse::<HugepageSize>(), Ok(HugepageSize::M2));
    assert_eq!("1gib".parse::<HugepageSize>(), Ok(HugepageSize::G1));
    assert_eq!("OFF".parse::<HugepageSize>(), Ok(HugepageSize::Off));
    let err = "3M".parse::<HugepageSize>().unwrap_err();
    assert!(err.contains("2M, 1G or off"), "{err}");
    assert_eq!(pages_for(0, HugepageSize::M2), 0);
    assert_eq!(pages_for(1, HugepageSize::M2), 1);
    assert_eq!(pages_for(2 * MIB, HugepageSize::M2), 1);
    assert_eq!(pages_for(2 * MIB + 1, HugepageSize::M2), 2);
    assert_eq!(pages_for(3 << 30, HugepageSize::G1), 3);
    assert_eq!(pages_for(1 << 40, HugepageSize::Off), 0);
}

#[test]
fn reads_pools() {
    let tree = Tree::new();
    tree.pool(2048, 10, 6, 2);
    let kernel = FakeKernel::new(&tree);
    let pool = read_pool(&kernel, HugepageSize::M2).unwrap().unwrap();
    assert_eq!(pool, Pool { size: HugepageSize::M2, total: 10, free: 6, reserved: 2 });
    assert_eq!(pool.available(), 4);
    assert_eq!(read_pool(&kernel, HugepageSize::G1).unwrap(), None);
}

#[test]
fn grows_the_pool_by_what_is_missing_and_confirms() {
    let tree = Tree::new();
    // 10 pages, 6 free of which 2 are promised: 4 available; 100 MiB = 50 pages needed.
    tree.pool(2048, 10, 6, 2);
    let kernel = FakeKernel::new(&tree);
    let mut out = Vec::new();
    let r = reserve(&mut Changes::new(&kernel, false, true, &mut out), HugepageSize::M2, 100 * MIB)
        .unwrap();
    assert_eq!(kernel.writes(), w(&[(NR_2M, "56")]));
    assert_eq!(tree.read(NR_2M), "56\n");
    assert_eq!((r.needed, r.total_after), (50, 56));
    let out = String::from_utf8(out).unwrap();
    let nr_real = tree.real(NR_2M);
    assert!(out.contains(&format!("[change] echo 56 > {}", nr_real.display())), "{out}");
    assert!(out.contains("granted 56"), "{out}");
    assert!(out.contains("hugepagesz=2M hugepages=56"), "{out}");
}

#[test]
fn leaves_a_big_enough_pool_alone() {
    let tree = Tree::new();
    tree.pool(2048, 100, 80, 0);
    let kernel = FakeKernel::new(&tree);
    let mut out = Vec::new();
    reserve(&mut Changes::new(&kernel, false, true, &mut out), HugepageSize::M2, 160 * MIB)
        .unwrap();
    assert!(kernel.writes().is_empty());
    assert!(String::from_utf8(out).unwrap().contains("[ok] 2 MiB hugepages: 80 available"));
}

#[test]
fn a_short_grant_is_an_error_and_is_given_back() {
    let tree = Tree::new();
    tree.pool(1048576, 1, 1, 0);
    let mut kernel = FakeKernel::new(&tree);
    kernel.pool_limit.insert("/sys/kernel/mm/hugepages/hugepages-1048576kB".into(), 3);
    let mut out = Vec::new();
    let err = reserve(&mut Changes::new(&kernel, false, true, &mut out), HugepageSize::G1, 6 << 30)
        .unwrap_err();
    match &err {
        HostError::PoolShort { wanted, granted, needed_mib, boot_param, .. } => {
            assert_eq!((*wanted, *granted, *needed_mib), (6, 3, 6144));
            assert_eq!(boot_param, "default_hugepagesz=1G hugepagesz=1G hugepages=6");
        }
        other => panic!("expected PoolShort, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("only 3 of 6") && msg.contains("hugepagesz=1G hugepages=6"), "{msg}");
    // Asked for 6, got 3, gave the partial grant back to the old size.
    assert_eq!(kernel.writes(), w(&[(NR_1G, "6"), (NR_1G, "1")]));
    assert_eq!(tree.read(NR_1G), "1\n");
}

#[test]
fn dry_run_prints_and_writes_nothing() {
    let tree = Tree::new();
    tree.pool(2048, 0, 0, 0);
    let kernel = FakeKernel::new(&tree);
    let mut out = Vec::new();
    let r = reserve(&mut Changes::new(&kernel, true, false, &mut out), HugepageSize::M2, 3 * MIB)
        .unwrap();
    assert_eq!(r.total_after, 2);
    assert!(kernel.writes().is_empty());
    assert_eq!(tree.read(NR_2M), "0\n");
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains(&format!("[dry-run] echo 2 > {}", tree.real(NR_2M).display())), "{out}");
}

#[test]
fn refuses_without_root_before_writing() {
    let tree = Tree::new();
    tree.pool(2048, 0, 0, 0);
    let kernel = FakeKernel::new(&tree);
    let mut out = Vec::new();
    let err = reserve(&mut Changes::new(&kernel, false, false, &mut out), HugepageSize::M2, MIB)
        .unwrap_err();
    assert!(matches!(err, HostError::NotRoot { .. }), "{err:?}");
    assert!(err.to_string().contains("sudo kore-launch setup"), "{err}");
    assert!(kernel.writes().is_empty());
    assert_eq!(tree.read(NR_2M), "0\n");
}

#[test]
fn a_missing_pool_says_what_to_use_instead() {
    let tree = Tree::new();
    tree.pool(2048, 0, 0, 0);
    let kernel = FakeKernel::new(&tree);
    let mut out = Vec::new();
    let err = reserve(&mut Changes::new(&kernel, false, true, &mut out), HugepageSize::G1, MIB)
        .unwrap_err();
    assert!(matches!(err, HostError::NoPool { .. }), "{err:?}");
    assert!(err.to_string().contains("--hugepage-size 2M"), "{err}");
}

#[test]
fn off_reserves_nothing() {
    let tree = Tree::new();
    let kernel = FakeKernel::new(&tree);
    let mut out = Vec::new();
    let r = reserve(&mut Changes::new(&kernel, false, false, &mut out), HugepageSize::Off, 1 << 40)
        .unwrap();
    assert_eq!(r.needed, 0);
    assert!(kernel.writes().is_empty());
}

#[test]
fn an_unreadable_pool_is_an_error_naming_the_file() {
    let tree = Tree::new();
    tree.pool(2048, 0, 0, 0);
    // nr_hugepages replaced by a directory: the write fails like a rejected sysfs write.
    std::fs::remove_file(tree.real(NR_2M)).unwrap();
    tree.dir(NR_2M);
    let kernel = FakeKernel::new(&tree);
    let err = read_pool(&kernel, HugepageSize::M2).unwrap_err();
    assert!(matches!(err, HostError::Read { .. }), "{err:?}");
    assert!(err.to_string().contains(&tree.real(NR_2M).display().to_string()), "{err}");
}

/// A Qwen3.5-style config.json with a known shape.
fn write_model(tree: &Tree, name: &str, config: &str) -> std::path::PathBuf {
    tree.file(
        &format!("/{name}/{}", if config.starts_with('{') { "config.json" } else { "pack.toml" }),
        config,
    );
    tree.file(&format!("/{name}/weights.safetensors"), &"x".repeat(10_000));
    tree.real(&format!("/{name}"))
}

const CONFIG: &str = r#"{"architectures": ["Qwen3_5ForConditionalGeneration"],
 "vision_config": {"num_hidden_layers": 99, "head_dim": 999},
 "text_config": {"num_hidden_layers": 4, "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "mtp_num_hidden_layers": 1,
   "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
   "linear_conv_kernel_dim": 4, "max_position_embeddings": 2048}}"#;

#[test]
fn budget_follows_the_documented_formula() {
    let tree = Tree::new();
    let dir = write_model(&tree, "m", CONFIG);
    let weights = 10_000 + CONFIG.len() as u64;
    let b = Budget::compute(&dir, 1000, F32).unwrap();
    assert_eq!(b.weights, weights);
    // 8 sequences of 1000 positions share the cache; room to double x (1 full + 1 MTP layer)
    // x K,V x 2 heads x 64 dims x 4 bytes per position.
    assert_eq!(b.kv_tokens, 8000);
    assert_eq!(b.kv_cache, 2 * 8000 * 2 * 2 * 2 * 64 * 4);
    assert!(b.lines()[1].contains("f32, room to double"), "{:?}", b.lines());
    // The default f16 cache (what the appliance runs without KORE_KV) needs half.
    let f16 = Budget::compute(&dir, 1000, KvPrecision::default()).unwrap();
    assert_eq!(f16.kv_cache, b.kv_cache / 2);
    assert!(f16.lines()[1].contains("f16, room to double"), "{:?}", f16.lines());
    assert_eq!(b.sessions, b.kv_cache, "kept sessions: at most the KV cache, at most 512 MiB");
    // 3 linear layers x (4 x 32 x 32 state + 3 x (2x2x32 + 4x32) conv) x 4 bytes.
    assert_eq!(b.recurrent_state, 3 * (4 * 32 * 32 + 3 * (2 * 2 * 32 + 4 * 32)) * 4);
    let own = b.kv_cache + b.recurrent_state + b.sessions + HEAP_BYTES + KERNEL_BYTES;
    assert_eq!(b.total(), weights + own);
    assert!(b.notes.is_empty(), "{:?}", b.notes);
    // The VMM's layout rounds each part (own memory, the pack) up to 2 MiB pages.
    assert_eq!(b.guest_bytes() % (2 * MIB), 0);
    assert!(b.guest_bytes() >= b.total() && b.guest_bytes() < b.total() + 4 * MIB);
    assert_eq!(b.own_memory(), own);
}

#[test]
fn budget_caps_the_context_and_honours_memory() {
    let tree = Tree::new();
    let dir = write_model(&tree, "m", CONFIG);
    let b = Budget::compute(&dir, 100_000, F32).unwrap();
    assert_eq!(b.context, 2048);
    assert!(b.notes[0].contains("above the model's maximum 2048"));
    let small = b.clone().with_memory(Some(64 * MIB));
    assert_eq!(small.own_memory(), 64 * MIB);
    assert!(small.notes.iter().any(|n| n.contains("below")));
}

#[test]
fn budget_reads_a_pack_toml_and_falls_back_without_a_shape() {
    let tree = Tree::new();
    let toml = "format_version = 1\nname = \"t\"\n[config]\nnum_hidden_layers = 8\nfull_attention_interval = 4\nnum_key_value_heads = 1\nhead_dim = 16\n";
    let dir = write_model(&tree, "p", toml);
    let b = Budget::compute(&dir, 10, F32).unwrap();
    let shape = b.shape.unwrap();
    assert_eq!((shape.full_layers, shape.linear_layers), (2, 6));
    assert_eq!(b.kv_cache, 2 * 80 * 2 * 2 * 16 * 4);
    // A pack counts the files the VMM preloads, each on its own 2 MiB pages.
    assert_eq!(b.weights, 2 * 2 * MIB);

    let bare = tree.real("/bare");
    tree.file("/bare/weights.bin", &"y".repeat(4000));
    let b = Budget::compute(&bare, 10, F32).unwrap();
    assert_eq!((b.kv_cache, b.shape), (1000, None));
    assert_eq!(b.weights, 4000);
    assert!(b.notes[0].contains("no model shape"));

    let err = Budget::compute(&tree.real("/missing"), 10, F32).unwrap_err();
    assert!(matches!(err, HostError::Pack { .. }) && err.to_string().contains("--model"), "{err}");
}

#[test]
fn an_moe_pack_sizes_its_grouped_activations_and_says_it_holds_every_expert() {
    let tree = Tree::new();
    let toml = "format_version = 1\nname = \"t\"\n[config]\nnum_hidden_layers = 4\nhidden_size = 2048\nnum_key_value_heads = 2\nhead_dim = 256\n[config.moe]\nnum_experts = 256\nnum_experts_per_tok = 8\nmoe_intermediate_size = 512\nshared_expert_intermediate_size = 512\n";
    let dir = write_model(&tree, "moe", toml);
    let b = Budget::compute(&dir, 10, F32).unwrap();
    // 512 chunk tokens x 8 experts x (2 x 2048 + 2 x 512) x 4 bytes.
    assert_eq!(b.heap, HEAP_BYTES + 512 * 8 * (2 * 2048 + 2 * 512) * 4);
    assert!(b.notes.iter().any(|n| n.contains("every expert")), "{:?}", b.notes);
    let dense = write_model(&tree, "dense", CONFIG);
    assert_eq!(Budget::compute(&dense, 10, F32).unwrap().heap, HEAP_BYTES);
}

/// `doctor`/`setup` count exactly the RAM the VMM allocates at boot: the
/// boot's own memory (`appliance::boot_options` uses `Budget::own_memory`)
/// and the pack as `kore_vmm::preload::plan` places it, laid out by the
/// VMM's `RamPlan`, for the committed default pack.
#[test]
fn budget_equals_what_the_vmm_allocates_for_the_default_pack() {
    let pack = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-packs/tiny");
    let files: Vec<_> = ["pack.toml", "weights.safetensors", "tokenizer.json"]
        .iter()
        .map(|f| pack.join(f))
        .collect();
    let (_, pack_bytes) = kore_vmm::preload::plan(&files).unwrap();
    for context in [512, 4096, 65536] {
        let b = Budget::compute(&pack, context, F32).unwrap();
        assert_eq!(b.weights, pack_bytes);
        let own = b.own_memory().div_ceil(2 * MIB) * 2 * MIB;
        for (size, page) in [(HugepageSize::M2, 2 * MIB), (HugepageSize::G1, 1 << 30)] {
            let plan = kore_vmm::memory::RamPlan::new(own, pack_bytes, page).unwrap();
            assert_eq!(b.guest_bytes_for(size), plan.total(), "context {context}, {size:?}");
        }
    }
}
