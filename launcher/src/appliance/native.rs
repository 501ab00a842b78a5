//! The in-process appliance: kore-service with the kore-appliance adapters
//! on a thread of this process, reached through in-memory pipes. Same
//! protocol code, same engine adapters as the guest; only the transport and
//! the clock differ.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use kore_appliance::{ModelEngine, TokenizerCodec};
use kore_service::host::{ServiceHandle, StdClock};
use kore_service::{Config, Service};

use crate::error::{LaunchError, Result};
use crate::model;

/// Starts the service thread for the model at `path` and waits until the
/// model is loaded (its errors come back here, not as a dead connection).
/// `context` limits the engine's context (prompt + generated tokens).
pub fn spawn(path: &Path, context: Option<u64>) -> Result<ServiceHandle> {
    let path: PathBuf = path.to_path_buf();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
    let handle = ServiceHandle::spawn_with(move |runner| {
        // Everything the model borrows lives on this thread's stack.
        let mut files = match model::open(Some(&path)) {
            Ok(f) => f,
            Err(e) => return drop(ready_tx.send(Err(e))),
        };
        let Some(tokenizer) = files.tokenizer.take() else {
            let e = LaunchError::Model(format!(
                "{}: no tokenizer.json; the appliance needs the model's tokenizer",
                path.display()
            ));
            return drop(ready_tx.send(Err(e)));
        };
        // Rows of every matrix product split across all cores, as `generate --native`.
        let pool = kore_engine::pool::ThreadPool::with_all_cores();
        let mut model = match files.model() {
            Ok(m) => m,
            Err(e) => return drop(ready_tx.send(Err(e))),
        };
        model.set_pool(&pool);
        let name = model_name(&path);
        let stops = files.stop_tokens.clone();
        let mut engine = ModelEngine::new(&model, name, stops.clone());
        if let Some(limit) = context {
            engine = engine.with_context_limit(u32::try_from(limit).unwrap_or(u32::MAX));
        }
        let codec = TokenizerCodec::new(Arc::new(tokenizer), stops);
        let service = Service::new(engine, codec, StdClock::new(), Config::default());
        let _ = ready_tx.send(Ok(()));
        runner.run(service);
    })
    .map_err(|e| LaunchError::Other(format!("cannot start the service thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            Err(LaunchError::Other("the service thread stopped while loading the model".into()))
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
