//! The disk tier (feature `std`): checkpoints written by one engine are
//! found by a new one (a new process: a new `DiskTier` over the same
//! directory) and serve the same prompts with the uncached engine's tokens;
//! directories are 0700 and files 0600; the directory stays within its
//! size budget; a truncated, corrupt or foreign file is ignored with one
//! warning and the answer is the uncached one.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kore_appliance::disk::{DiskStatsHandle, DiskTier, Flusher};
use kore_appliance::{stop_ids, Checkpoint, CheckpointStore, ModelEngine, TokenizerCodec};
use kore_engine::hf::HfModelDir;
use kore_engine::snapshot::file::Decoded;
use kore_engine::snapshot::file::Identity;
use kore_engine::snapshot::Shape;
use kore_engine::state::KvPrecision;
use kore_engine::Model;
use kore_service::host::StdClock;
use kore_service::{Config, Service};
use kore_tokenizer::Tokenizer;
use serde_json::{json, Value};

type Svc<'m> = Service<ModelEngine<'m>, TokenizerCodec, StdClock>;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny-hf")
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kore-disk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn identity(model: &Model<'_>, pack: u8) -> Identity {
    Identity { pack: [pack; 32], shape: Shape::of(&model.config), kv: model.options().kv }
}

/// A service whose engine keeps checkpoints on disk under `root`; also
/// the tier's counters and writer.
fn service<'m>(
    model: &'m Model<'m>,
    root: Option<&Path>,
    pack: u8,
    budget: u64,
) -> (Svc<'m>, Option<(DiskStatsHandle, Flusher)>) {
    let tok = Arc::new(Tokenizer::from_file(tiny_dir().join("tokenizer.json")).unwrap());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let mut engine = ModelEngine::new(model, "tiny", stops.clone());
    let mut handles = None;
    match root {
        Some(root) => {
            let tier = DiskTier::open(root, identity(model, pack), budget).unwrap();
            handles = Some((tier.stats_handle(), tier.flusher()));
            engine = engine.with_store(Box::new(tier), [pack; 32]);
        }
        None => engine = engine.with_cache_budget(0),
    }
    let svc =
        Service::new(engine, TokenizerCodec::new(tok, stops), StdClock::new(), Config::default());
    (svc, handles)
}

fn ask(svc: &mut Svc<'_>, req: &Value) -> Value {
    let c = svc.open();
    svc.on_bytes(c, format!("{req}\n").as_bytes());
    while svc.poll() {}
    let text = String::from_utf8(svc.take_output(c)).unwrap();
    svc.on_closed(c);
    let done = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).find(|e| {
        assert!(e.get("error").is_none(), "{e}");
        e["done"] == true
    });
    done.expect("a done event")
}

fn chat(user: &str) -> Value {
    let system = "Thou art a player in a Shakespeare play; speak in verse. ".repeat(8);
    let msgs = json!([{"role": "system", "content": system}, {"role": "user", "content": user}]);
    json!({"messages": msgs, "thinking": false, "max_tokens": 8})
}

fn cached(done: &Value) -> u64 {
    done["stats"]["cached_tokens"].as_u64().unwrap()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .collect();
    v.sort();
    v
}

/// Writes the checkpoints of one conversation with a fresh engine; the pack directory.
fn populate(model: &Model<'_>, root: &Path, pack: u8) -> PathBuf {
    let (mut svc, handles) = service(model, Some(root), pack, 1 << 30);
    ask(&mut svc, &chat("Who art thou?"));
    let (stats, flusher) = handles.unwrap();
    flusher.flush();
    assert!(stats.get().written >= 2, "{:?}", stats.get());
    root.join(format!("{:02x}", pack).repeat(32)).join(KvPrecision::default().name())
}

#[test]
fn a_new_engine_finds_the_checkpoints_on_disk() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let root = scratch("again");
    let dir = populate(&model, &root, 1);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(dir.parent().unwrap()), 0o700);
    assert!(files(&dir).iter().all(|f| mode(f) == 0o600));
    let (mut uncached, _) = service(&model, None, 1, 0);
    let (mut svc, handles) = service(&model, Some(&root), 1, 1 << 30);
    let req = chat("What news?");
    let a = ask(&mut svc, &req);
    assert_eq!(a["token_ids"], ask(&mut uncached, &req)["token_ids"]);
    assert!(cached(&a) > 100, "the system turn came from disk: {a}");
    let stats = svc.engine().cache_stats();
    assert_eq!((stats.hits_disk, stats.tokens_disk), (1, cached(&a)), "{stats:?}");
    assert_eq!(handles.unwrap().0.get().loaded, 1);
    assert_eq!(a["stats"]["cache_tier"], "disk", "{a}");
    // The same conversation again: now from memory.
    let b = ask(&mut svc, &req);
    assert_eq!(b["token_ids"], a["token_ids"]);
    assert_eq!(svc.engine().cache_stats().hits_memory, 1);
    assert_eq!(b["stats"]["cache_tier"], "memory", "{b}");
    // `info` reports both tiers (what /metrics shows).
    let c = svc.open();
    svc.on_bytes(c, b"{\"op\":\"info\",\"id\":1}\n");
    let info: Value = serde_json::from_slice(&svc.take_output(c)).unwrap();
    let cache = &info["info"]["cache"];
    assert_eq!((cache["hits_disk"].as_u64(), cache["hits_memory"].as_u64()), (Some(1), Some(1)));
    assert!(cache["bytes_disk"].as_u64() > Some(0) && cache["bytes_memory"].as_u64() > Some(0));
    assert_eq!(cache["budget_disk"].as_u64(), Some(1 << 30), "{info}");
    let _ = std::fs::remove_dir_all(&root);
}

/// What a restarted guest gets when the newest files alone would fill its
/// budget: the checkpoint where conversations diverge (the system turn's
/// end, a prefix of every other file) is handed over, so a new question
/// behind the same system prompt starts from it.
#[test]
fn the_shared_checkpoint_is_handed_over_before_newer_whole_conversations() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let root = scratch("divergence");
    let (mut svc, handles) = service(&model, Some(&root), 7, 1 << 30);
    for q in ["Who art thou?", "What news from Padua?", "Where is the king?"] {
        ask(&mut svc, &chat(q));
    }
    handles.unwrap().1.flush();
    drop(svc);
    let host = DiskTier::open(&root, identity(&model, 7), 1 << 30).unwrap();
    let all = host.newest(1 << 30);
    let size = |p: &PathBuf| std::fs::metadata(p).unwrap().len();
    // Room for the two largest files: fewer than every file.
    let mut sizes: Vec<u64> = all.iter().map(size).collect();
    sizes.sort_unstable();
    let budget = sizes[sizes.len() - 1] + sizes[sizes.len() - 2];
    let chosen = host.newest(budget);
    assert!(chosen.len() < all.len(), "{chosen:?} of {all:?}");
    let empty = scratch("divergence-guest");
    let (mut guest, _) = service(&model, Some(&empty), 7, 1 << 30);
    for p in &chosen {
        guest.engine_mut().offer(&host.read_checked(p).unwrap()).unwrap();
    }
    let (mut uncached, _) = service(&model, None, 7, 0);
    let req = chat("Whither goest thou?");
    let a = ask(&mut guest, &req);
    assert_eq!(a["token_ids"], ask(&mut uncached, &req)["token_ids"]);
    assert!(cached(&a) > 100, "the system turn was not handed over: {a}");
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&empty);
}

/// The guest's path (no disk): the host reads the newest files and the
/// guest's engine takes them with `offer`; what the guest persists comes
/// back as bytes the host keeps with `persist_bytes`. Answers are the
/// uncached engine's, and a corrupt file is not handed over.
#[test]
fn files_handed_to_an_engine_without_disk_serve_the_same_answers() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let root = scratch("handover");
    let dir = populate(&model, &root, 5);
    let host = DiskTier::open(&root, identity(&model, 5), 1 << 30).unwrap();
    let paths = host.newest(1 << 30);
    assert_eq!(paths.len(), files(&dir).len());
    let empty = scratch("handover-guest");
    let (mut uncached, _) = service(&model, None, 5, 0);
    // The guest's store: anything but the host's files (here an empty directory).
    let (mut guest, _) = service(&model, Some(&empty), 5, 1 << 30);
    for p in &paths {
        let bytes = host.read_checked(p).expect("a good file");
        assert!(guest.engine_mut().offer(&bytes).unwrap() > 0);
    }
    let req = chat("What news?");
    let a = ask(&mut guest, &req);
    assert_eq!(a["token_ids"], ask(&mut uncached, &req)["token_ids"]);
    assert!(cached(&a) > 100 && a["stats"]["cache_tier"] == "disk", "{a}");
    // A corrupt file is rejected (deleted, one warning), never handed over.
    let mut b = std::fs::read(&paths[0]).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 1;
    std::fs::write(&paths[0], b).unwrap();
    assert!(host.read_checked(&paths[0]).is_none());
    assert!(!paths[0].exists());
    assert_eq!(host.stats().rejected, 1);
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&empty);
}

#[test]
fn bad_files_are_ignored_with_one_warning_each() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let root = scratch("bad");
    let dir = populate(&model, &root, 2);
    let written = files(&dir);
    assert!(written.len() >= 2);
    // Corrupt one byte in the middle of every file, truncate the deepest.
    for f in &written {
        let mut b = std::fs::read(f).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0x40;
        std::fs::write(f, b).unwrap();
    }
    let last = written.last().unwrap();
    let len = std::fs::metadata(last).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(last).unwrap().set_len(len - 100).unwrap();
    // A foreign pack's file copied in, and garbage.
    let foreign = populate(&model, &root, 3);
    std::fs::copy(&files(&foreign)[0], dir.join("1-foreign.ckpt")).unwrap();
    std::fs::write(dir.join("2-garbage.ckpt"), b"not a checkpoint").unwrap();
    let bad = written.len() + 2;
    let (mut uncached, _) = service(&model, None, 2, 0);
    let (mut svc, handles) = service(&model, Some(&root), 2, 1 << 30);
    let (stats, _) = handles.unwrap();
    let req = chat("Who art thou?");
    for _ in 0..2 {
        let a = ask(&mut svc, &req);
        assert_eq!(a["token_ids"], ask(&mut uncached, &req)["token_ids"]);
    }
    let s = stats.get();
    assert_eq!((s.rejected, s.warnings, s.loaded), (bad as u64, bad as u64, 0), "{s:?}");
    assert_eq!(svc.engine().cache_stats().hits_disk, 0);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_directory_stays_within_its_budget() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let root = scratch("budget");
    let one = {
        let dir = populate(&model, &root, 4);
        let sizes: Vec<u64> =
            files(&dir).iter().map(|f| std::fs::metadata(f).unwrap().len()).collect();
        *sizes.iter().max().unwrap()
    };
    let budget = one * 3;
    let (mut svc, handles) = service(&model, Some(&root), 4, budget);
    let (stats, flusher) = handles.unwrap();
    for user in ["What news?", "Speak.", "Whither?", "Hark!", "Why so?"] {
        ask(&mut svc, &chat(user));
        flusher.flush();
        let s = stats.get();
        assert!(s.bytes <= budget, "{s:?}");
    }
    let s = stats.get();
    assert!(s.evictions > 0 && s.written > 3, "{s:?}");
    // What `kore-launch cache` shows and clears.
    let listed = kore_appliance::disk::usage(&root).unwrap();
    let mine = listed.iter().find(|u| u.pack == "04".repeat(32)).unwrap();
    assert_eq!(
        (mine.files as u64, mine.bytes),
        (
            files(&root.join("04".repeat(32)).join(KvPrecision::default().name())).len() as u64,
            s.bytes
        )
    );
    assert!(mine.newest.is_some());
    let on_disk: u64 = files(&root.join("04".repeat(32)).join(KvPrecision::default().name()))
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(on_disk, s.bytes);
    drop(svc);
    assert_eq!(kore_appliance::disk::clear(&root, Some(&"04".repeat(32))).unwrap(), on_disk);
    assert!(kore_appliance::disk::usage(&root).unwrap().is_empty());
    let _ = std::fs::remove_dir_all(&root);
}

/// A guest's side of the hand-over: checkpoints become bytes to send.
struct Outbox(Arc<Mutex<Vec<Vec<u8>>>>);

impl CheckpointStore for Outbox {
    fn persist(&mut self, checkpoint: Checkpoint) {
        self.0.lock().unwrap().push(checkpoint.to_bytes());
    }

    fn fetch(
        &mut self,
        _: &[u32],
        _: usize,
        _: &dyn Fn(usize) -> bool,
        _: &Identity,
    ) -> Option<Decoded> {
        None
    }
}

#[test]
fn checkpoint_bytes_go_to_disk_and_back_to_another_engine() {
    let hf = HfModelDir::open(&tiny_dir()).unwrap();
    let model = hf.model().unwrap();
    let root = scratch("bytes");
    let tok = Arc::new(Tokenizer::from_file(tiny_dir().join("tokenizer.json")).unwrap());
    let stops = stop_ids(Some(&*tok), &model.config.eos_token_ids, None, model.config.vocab_size);
    let outbox = Arc::new(Mutex::new(Vec::new()));
    let engine = ModelEngine::new(&model, "tiny", stops.clone())
        .with_store(Box::new(Outbox(Arc::clone(&outbox))), [5; 32]);
    let codec = TokenizerCodec::new(Arc::clone(&tok), stops.clone());
    let mut guest = Service::new(engine, codec.clone(), StdClock::new(), Config::default());
    let prompt: Vec<u32> = (0..300).map(|i| (i * 31 % 4000) as u32).collect();
    ask(&mut guest, &json!({"prompt_ids": prompt, "max_tokens": 4}));
    let files = outbox.lock().unwrap().clone();
    assert!(!files.is_empty());
    // The host keeps them.
    let host = DiskTier::open(&root, identity(&model, 5), 1 << 30).unwrap();
    for f in files {
        host.persist_bytes(f).unwrap();
    }
    let mut bad = host_file_bytes(&host);
    bad[100] ^= 2;
    assert!(host.persist_bytes(bad).is_err(), "a damaged file is refused");
    host.flush();
    drop(host);
    // A later boot: the host finds the deepest file for a longer prompt and hands it over.
    let host = DiskTier::open(&root, identity(&model, 5), 1 << 30).unwrap();
    let mut longer = prompt.clone();
    longer.extend([7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]);
    let usable = |n: usize| n < longer.len();
    let bytes = host.fetch_bytes(&longer, 0, &usable).expect("a file for the prompt");
    let mut engine = ModelEngine::new(&model, "tiny", stops.clone())
        .with_store(Box::new(Outbox(Arc::new(Mutex::new(Vec::new())))), [5; 32]);
    assert!(engine.offer(&bytes).unwrap() >= 300);
    let mut svc = Service::new(engine, codec, StdClock::new(), Config::default());
    let req = json!({"prompt_ids": longer, "max_tokens": 4});
    let a = ask(&mut svc, &req);
    let (mut uncached, _) = service(&model, None, 5, 0);
    assert_eq!(a["token_ids"], ask(&mut uncached, &req)["token_ids"]);
    assert!(cached(&a) >= 300, "{a}");
    let _ = std::fs::remove_dir_all(&root);
}

/// Any one file of `host`'s directory.
fn host_file_bytes(host: &DiskTier) -> Vec<u8> {
    host.flush();
    std::fs::read(&files(host.dir())[0]).unwrap()
}
