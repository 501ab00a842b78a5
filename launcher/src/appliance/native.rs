//! The in-process appliance: kore-service with the kore-appliance adapters
//! on a thread of this process, reached through in-memory pipes. Same
//! protocol code, same assembly (`kore_appliance::service`) as the guest;
//! only the transport, the clock and the thread pool differ.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use kore_service::host::{ServiceHandle, StdClock};

use crate::error::{LaunchError, Result};
use crate::model;

/// What the in-process appliance is started with besides its model.
#[derive(Debug, Clone, Default)]
pub struct NativeOptions {
    /// The engine's context limit (prompt + generated tokens).
    pub context: Option<u64>,
    /// Worker threads of the engine's pool (default: every core).
    pub threads: Option<usize>,
    /// The prefix cache's memory budget in bytes (default: the engine's).
    pub cache: Option<u64>,
    /// The prefix cache's disk budget in bytes under
    /// `$XDG_CACHE_HOME/kore` (`None` or 0: no disk tier).
    pub cache_disk: Option<u64>,
}

/// Starts the service thread for the model at `path` and waits until the
/// model is loaded (its errors come back here, not as a dead connection).
pub fn spawn(path: &Path, opts: &NativeOptions) -> Result<ServiceHandle> {
    let path: PathBuf = path.to_path_buf();
    let opts = opts.clone();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
    let handle = ServiceHandle::spawn_with(move |runner| {
        // Everything the model borrows lives on this thread's stack.
        let mut files = match model::open(Some(&path)) {
            Ok(f) => f,
            Err(e) => return drop(ready_tx.send(Err(e))),
        };
        // Without one (a bare reference checkpoint) the service takes token ids only.
        let tokenizer = files.tokenizer.take().map(Arc::new);
        // Rows of every matrix product split across the pool (bit-identical to one thread).
        let pool = match opts.threads {
            Some(n) => kore_engine::pool::ThreadPool::new(n),
            None => kore_engine::pool::ThreadPool::with_all_cores(),
        };
        let mut model = match files.model() {
            Ok(m) => m,
            Err(e) => return drop(ready_tx.send(Err(e))),
        };
        model.set_pool(&pool);
        tracing::info!(model = %path.display(), weights = %files.residency(), "model loaded");
        let settings = kore_appliance::Settings {
            name: model_name(&path),
            eos_token: files.eos_token.clone(),
            extra_eos_ids: files.extra_eos_ids.clone(),
            context: opts.context.map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
            bench_alloc: Some(hugepage_buffer),
            cache_bytes: opts.cache.map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
            ..kore_appliance::Settings::default()
        };
        let store = opts.cache_disk.filter(|&b| b > 0).and_then(|b| disk_store(&path, &model, b));
        let service = kore_appliance::service(&model, tokenizer, &settings, StdClock::new(), store);
        let _ = ready_tx.send(Ok(()));
        runner.run(service);
    })
    .map_err(|source| LaunchError::Start { what: "the service thread", source })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            Err(LaunchError::Model("the service thread stopped while loading the model".into()))
        }
    }
}

/// The identity of the pack at `path` for the prefix cache's files: the
/// SHA-256 of its pack.toml (which holds every file's digest, so a changed
/// weight or tokenizer is another pack). `None` for a directory without one.
pub fn pack_digest(path: &Path) -> Option<[u8; 32]> {
    use sha2::Digest;
    let manifest = std::fs::read(path.join("pack.toml")).ok()?;
    Some(sha2::Sha256::digest(&manifest).into())
}

/// The disk tier for the pack at `path` under the user's cache directory,
/// `budget` bytes; `None` (logged) when it cannot be opened.
fn disk_store<'m>(
    path: &Path,
    model: &kore_engine::Model<'_>,
    budget: u64,
) -> Option<kore_appliance::Store<'m>> {
    let Some(pack) = pack_digest(path) else {
        tracing::info!(
            "prefix cache: {} has no pack.toml, keeping nothing on disk",
            path.display()
        );
        return None;
    };
    let root = kore_appliance::disk::default_root()?;
    let identity = kore_engine::snapshot::file::Identity {
        pack,
        shape: kore_engine::snapshot::Shape::of(&model.config),
        kv: model.options().kv,
    };
    match kore_appliance::disk::DiskTier::open(&root, identity, budget) {
        Ok(tier) => {
            tracing::info!(dir = %tier.dir().display(), budget, "prefix cache: disk tier");
            Some(kore_appliance::Store { store: Box::new(tier), pack })
        }
        Err(e) => {
            tracing::warn!(
                "prefix cache: cannot open {} ({e}); keeping nothing on disk",
                root.display()
            );
            None
        }
    }
}

/// The name `info` reports: a pack's `name` (as the guest reports it), else
/// the directory's name.
pub fn model_name(path: &Path) -> String {
    let manifest = std::fs::read_to_string(path.join("pack.toml")).ok();
    let pack_name = manifest
        .and_then(|t| t.parse::<toml::Table>().ok())
        .and_then(|t| t.get("name").and_then(|n| n.as_str()).map(str::to_owned));
    pack_name.unwrap_or_else(|| {
        let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        canonical.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    })
}

/// The read-bandwidth buffer of the in-process benchmark, advised for
/// transparent 2 MiB pages before its first touch: the weights are read from
/// 2 MiB pages too (a resident copy here, guest RAM in the VM), so the
/// bandwidth fraction compares like with like.
pub fn hugepage_buffer(bytes: usize) -> Option<Vec<u64>> {
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(bytes / 8).ok()?;
    let base = buf.as_mut_ptr() as usize;
    let start = base.next_multiple_of(4096);
    let end = (base + bytes) & !4095;
    if end > start {
        // SAFETY: [start, end) is page-aligned and lies inside `buf`'s
        // allocation of `bytes`; MADV_HUGEPAGE only changes how the kernel
        // backs those pages, never their contents.
        let _ =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
    buf.resize(bytes / 8, 0);
    let huge = kore_pack::safetensors::anon_huge_bytes(start).unwrap_or(0);
    tracing::debug!("bench buffer: {huge} of {bytes} bytes on 2 MiB pages");
    Some(buf)
}
