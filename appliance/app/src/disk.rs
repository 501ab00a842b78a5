//! The disk tier of the prefix cache (feature `std`): checkpoint files
//! (kore-engine's `snapshot::file` format) under
//! `$XDG_CACHE_HOME/kore/<pack identity>/<KV precision>/` (else `~/.cache/kore/...`),
//! directories 0700 and files 0600, found again by any later process.
//!
//! - Writing is off the engine's thread: [`DiskTier::persist`] queues the
//!   checkpoint (which shares its KV rows with the memory tier, no copy) for
//!   a writer thread that encodes it to a temporary file and renames it into
//!   place; when the queue is full the checkpoint is dropped (counted), the
//!   engine never waits for the disk.
//! - The directory is bounded in size: past the budget the least recently
//!   used files (file modification time, set on every use) are deleted.
//! - [`DiskTier::fetch`] reads the deepest usable file whose tokens prefix
//!   the prompt and checks all of it (`snapshot::file::decode`); a file that
//!   is truncated, corrupt, from another pack or another engine version is
//!   ignored and deleted with one warning, so it can never change an answer.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::SystemTime;

use kore_engine::snapshot::file::{self, Decoded, Identity};

use crate::cache::{Checkpoint, CheckpointStore, StoreStats};

/// Checkpoints the writer thread may have queued before new ones are dropped.
pub const QUEUE: usize = 4;

/// Counters of the disk tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Checkpoint files kept now.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The size budget.
    pub budget: u64,
    /// Files written.
    pub written: u64,
    /// Checkpoints not written because the writer was behind.
    pub dropped: u64,
    /// Files that failed to write (I/O errors).
    pub write_errors: u64,
    /// Files read back and used.
    pub loaded: u64,
    /// Files found bad (truncated, corrupt, foreign, other version) and deleted.
    pub rejected: u64,
    /// Warnings logged (one per bad file).
    pub warnings: u64,
    /// Files deleted for the size budget.
    pub evictions: u64,
}

struct Entry {
    tokens: Vec<u32>,
    path: PathBuf,
    bytes: u64,
    used: u64,
}

struct Index {
    entries: Vec<Entry>,
    clock: u64,
    stats: DiskStats,
    warned: HashSet<PathBuf>,
}

enum Job {
    Write(Item),
    Flush(SyncSender<()>),
    Stop,
}

/// What the writer writes: a checkpoint of this process's engine, or a
/// checked file another one made (a guest's, handed over).
enum Item {
    Checkpoint(Checkpoint),
    File { tokens: Vec<u32>, bytes: Vec<u8> },
}

impl Item {
    fn tokens(&self) -> &[u32] {
        match self {
            Item::Checkpoint(cp) => cp.tokens(),
            Item::File { tokens, .. } => tokens,
        }
    }
}

/// The disk tier of one pack: a directory of checkpoint files, an index of
/// their token prefixes, and the writer thread.
pub struct DiskTier {
    dir: PathBuf,
    identity: Identity,
    index: Arc<Mutex<Index>>,
    jobs: Option<SyncSender<Job>>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// `$XDG_CACHE_HOME/kore` (an absolute `XDG_CACHE_HOME`), else `$HOME/.cache/kore`.
pub fn default_root() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
    let base = xdg.or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("kore"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn lock(index: &Mutex<Index>) -> MutexGuard<'_, Index> {
    index.lock().unwrap_or_else(|e| e.into_inner())
}

impl Index {
    /// Logs one warning per bad file and deletes it.
    fn reject(&mut self, path: &Path, why: &dyn std::fmt::Display) {
        self.stats.rejected += 1;
        if self.warned.insert(path.to_path_buf()) {
            self.stats.warnings += 1;
            tracing::warn!(
                file = %path.display(),
                "prefix cache: ignoring and deleting checkpoint file ({why}); the prompt is \
                 prefilled instead"
            );
        }
        let _ = fs::remove_file(path);
        self.forget(path);
    }

    fn forget(&mut self, path: &Path) {
        if let Some(i) = self.entries.iter().position(|e| e.path == path) {
            let e = self.entries.swap_remove(i);
            self.stats.files -= 1;
            self.stats.bytes -= e.bytes;
        }
    }

    fn add(&mut self, tokens: Vec<u32>, path: PathBuf, bytes: u64, used: u64) {
        self.forget(&path);
        self.stats.files += 1;
        self.stats.bytes += bytes;
        self.entries.push(Entry { tokens, path, bytes, used });
    }

    /// Deletes least recently used files while over budget.
    fn evict(&mut self) {
        while self.stats.bytes > self.stats.budget {
            let Some(lru) = self.entries.iter().min_by_key(|e| e.used) else { return };
            let path = lru.path.clone();
            let _ = fs::remove_file(&path);
            self.forget(&path);
            self.stats.evictions += 1;
        }
    }
}

impl DiskTier {
    /// Opens (creating, 0700) `root/<hex of identity.pack>/<f32|f16>/` (the
    /// KV precision: files of the other one stay for when it is back), indexes the
    /// checkpoint files there (bad ones are ignored and deleted with a
    /// warning), keeps at most `budget` bytes, and starts the writer.
    pub fn open(root: &Path, identity: Identity, budget: u64) -> io::Result<DiskTier> {
        let dir = root.join(hex(&identity.pack)).join(identity.kv.name());
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        let stats = DiskStats { budget, ..DiskStats::default() };
        let mut index = Index { entries: Vec::new(), clock: 0, stats, warned: HashSet::new() };
        scan(&dir, &identity, &mut index)?;
        index.evict();
        let index = Arc::new(Mutex::new(index));
        let (jobs, rx) = mpsc::sync_channel(QUEUE);
        let writer = {
            let (dir, index) = (dir.clone(), Arc::clone(&index));
            std::thread::Builder::new()
                .name("kore-cache-writer".into())
                .spawn(move || write_loop(&dir, &index, &rx))?
        };
        Ok(DiskTier { dir, identity, index, jobs: Some(jobs), writer: Some(writer) })
    }

    /// The pack's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The counters.
    pub fn stats(&self) -> DiskStats {
        lock(&self.index).stats.clone()
    }

    /// A handle that reads the counters from another thread (or after the
    /// tier moved into an engine).
    pub fn stats_handle(&self) -> DiskStatsHandle {
        DiskStatsHandle(Arc::clone(&self.index))
    }

    /// Waits until every checkpoint queued so far is written.
    pub fn flush(&self) {
        flush(self.jobs.as_ref());
    }

    /// A handle that waits for the writer from elsewhere (see [`Self::flush`]).
    pub fn flusher(&self) -> Flusher {
        Flusher(self.jobs.clone())
    }
}

fn flush(jobs: Option<&SyncSender<Job>>) {
    let (tx, rx) = mpsc::sync_channel(1);
    if jobs.is_some_and(|j| j.send(Job::Flush(tx)).is_ok()) {
        let _ = rx.recv();
    }
}

/// Reads a [`DiskTier`]'s counters.
#[derive(Clone)]
pub struct DiskStatsHandle(Arc<Mutex<Index>>);

impl DiskStatsHandle {
    /// The counters now.
    pub fn get(&self) -> DiskStats {
        lock(&self.0).stats.clone()
    }
}

impl std::fmt::Debug for DiskStatsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("DiskStatsHandle").finish()
    }
}

/// Waits for a [`DiskTier`]'s writer.
#[derive(Clone, Debug)]
pub struct Flusher(Option<SyncSender<Job>>);

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Job::Write(_) => "Write",
            Job::Flush(_) => "Flush",
            Job::Stop => "Stop",
        })
    }
}

impl Flusher {
    /// Returns once everything queued before the call is written.
    pub fn flush(&self) {
        flush(self.0.as_ref());
    }
}

impl Drop for DiskTier {
    /// Writes what is queued, then stops the writer ([`Flusher`]s left
    /// behind return at once from then on).
    fn drop(&mut self) {
        if let Some(jobs) = self.jobs.take() {
            let _ = jobs.send(Job::Stop);
        }
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Reads the header and tokens of every `*.ckpt` in `dir` into `index`;
/// removes leftover temporary files.
fn scan(dir: &Path, id: &Identity, index: &mut Index) -> io::Result<()> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(".tmp-") {
            let _ = fs::remove_file(&path);
            continue;
        }
        if !name.ends_with(".ckpt") {
            continue;
        }
        let meta = fs::metadata(&path)?;
        match read_tokens(&path, id) {
            Ok(tokens) => found.push((
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                tokens,
                path,
                meta.len(),
            )),
            Err(e) => index.reject(&path, &e),
        }
    }
    found.sort_by_key(|f| f.0);
    for (_, tokens, path, bytes) in found {
        index.clock += 1;
        let used = index.clock;
        index.add(tokens, path, bytes, used);
    }
    Ok(())
}

/// The tokens of a checkpoint file, from its header and token list only
/// (the rest is checked when it is used); its length must be the one the
/// header implies.
fn read_tokens(path: &Path, id: &Identity) -> Result<Vec<u32>, String> {
    let f = File::open(path).map_err(|e| e.to_string())?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    let mut head = Vec::new();
    (&f).take(file::HEADER_BYTES as u64).read_to_end(&mut head).map_err(|e| e.to_string())?;
    let n = head.get(80..84).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    // Never more than the file holds, whatever the count says.
    let more = (4 * u64::from(n)).min(len.saturating_sub(head.len() as u64));
    (&f).take(more).read_to_end(&mut head).map_err(|e| e.to_string())?;
    let tokens = file::peek_tokens(&head, id).map_err(|e| e.to_string())?;
    let want = file::file_bytes(id, tokens.len()) as u64;
    if len != want {
        let e =
            if len < want { file::FileError::Truncated } else { file::FileError::TrailingBytes };
        return Err(e.to_string());
    }
    Ok(tokens)
}

fn write_loop(dir: &Path, index: &Mutex<Index>, jobs: &Receiver<Job>) {
    let mut n = 0u64;
    for job in jobs {
        let item = match job {
            Job::Write(item) => item,
            Job::Flush(done) => {
                let _ = done.send(());
                continue;
            }
            Job::Stop => return,
        };
        if lock(index).entries.iter().any(|e| e.tokens == item.tokens()) {
            continue;
        }
        n += 1;
        let tmp = dir.join(format!(".tmp-{}-{n}", std::process::id()));
        let name =
            format!("{}-{:016x}.ckpt", item.tokens().len(), file::tokens_hash(item.tokens()));
        let path = dir.join(name);
        let result = write_file(&tmp, &item).and_then(|bytes| {
            fs::rename(&tmp, &path)?;
            Ok(bytes)
        });
        let mut ix = lock(index);
        match result {
            Ok(bytes) => {
                ix.clock += 1;
                let used = ix.clock;
                ix.add(item.tokens().to_vec(), path, bytes, used);
                ix.stats.written += 1;
                ix.evict();
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                ix.stats.write_errors += 1;
                tracing::warn!(dir = %dir.display(), "prefix cache: cannot write a checkpoint: {e}");
            }
        }
    }
}

/// Writes `item`'s file at `path` (mode 0600); its size.
fn write_file(path: &Path, item: &Item) -> io::Result<u64> {
    let f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut err = None;
    let mut bytes = 0u64;
    let mut sink = |b: &[u8]| {
        if err.is_none() {
            bytes += b.len() as u64;
            err = w.write_all(b).err();
        }
    };
    match item {
        Item::Checkpoint(cp) => cp.encode(&mut sink),
        Item::File { bytes, .. } => sink(bytes),
    }
    if let Some(e) = err {
        return Err(e);
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_data()?;
    Ok(bytes)
}

impl DiskTier {
    fn queue(&self, item: Item) {
        let Some(jobs) = &self.jobs else { return };
        if let Err(TrySendError::Full(_)) = jobs.try_send(Job::Write(item)) {
            lock(&self.index).stats.dropped += 1;
        }
    }

    /// Keeps a checkpoint file another engine made (a guest's, handed to
    /// the host): checked whole against this tier's identity first, then
    /// queued for the writer like [`CheckpointStore::persist`].
    pub fn persist_bytes(&self, bytes: Vec<u8>) -> Result<(), file::FileError> {
        let tokens = file::decode(&bytes, &self.identity)?.tokens;
        self.queue(Item::File { tokens, bytes });
        Ok(())
    }

    /// The file [`CheckpointStore::fetch`] would use for `prompt`, as bytes
    /// (checked whole), to hand to an engine elsewhere (`ModelEngine::offer`).
    pub fn fetch_bytes(
        &self,
        prompt: &[u32],
        deeper_than: usize,
        usable: &dyn Fn(usize) -> bool,
    ) -> Option<Vec<u8>> {
        self.find(prompt, deeper_than, usable).map(|(bytes, _)| bytes)
    }

    /// The files for a guest's memory tier at boot, sizes adding up to at
    /// most `budget` bytes, in the order to hand them over (what the guest
    /// takes last stays longest). The checkpoints where conversations part
    /// come first (a system prompt's end that two questions share), then
    /// the rest, most recently used first. So a restarted guest keeps the
    /// point where a new question can start even when the newest files, each
    /// a whole copy of its prefix, would fill the budget alone.
    pub fn newest(&self, budget: u64) -> Vec<PathBuf> {
        let ix = lock(&self.index);
        let taken = hand_over(&ix.entries, budget);
        taken.iter().rev().map(|e| e.path.clone()).collect()
    }

    /// The file at `path` (one of [`Self::newest`]), read and checked whole;
    /// a bad one is rejected (deleted, one warning) and `None`.
    pub fn read_checked(&self, path: &Path) -> Option<Vec<u8>> {
        let bytes = fs::read(path).ok()?;
        let mut ix = lock(&self.index);
        match file::decode(&bytes, &self.identity) {
            Ok(_) => {
                ix.stats.loaded += 1;
                Some(bytes)
            }
            Err(e) => {
                ix.reject(path, &e);
                None
            }
        }
    }

    /// The deepest usable file for `prompt`, read and checked; bad files
    /// met on the way are rejected.
    fn find(
        &self,
        prompt: &[u32],
        deeper_than: usize,
        usable: &dyn Fn(usize) -> bool,
    ) -> Option<(Vec<u8>, Decoded)> {
        loop {
            let path = {
                let ix = lock(&self.index);
                let fits = |e: &&Entry| {
                    let n = e.tokens.len();
                    n > deeper_than && usable(n) && prompt.starts_with(&e.tokens)
                };
                ix.entries.iter().filter(fits).max_by_key(|e| e.tokens.len())?.path.clone()
            };
            let Ok(bytes) = fs::read(&path) else {
                // Gone (another process's budget): not a bad file.
                lock(&self.index).forget(&path);
                continue;
            };
            let mut ix = lock(&self.index);
            match file::decode(&bytes, &self.identity) {
                Ok(d) => {
                    ix.clock += 1;
                    let now = ix.clock;
                    if let Some(e) = ix.entries.iter_mut().find(|e| e.path == path) {
                        e.used = now;
                    }
                    ix.stats.loaded += 1;
                    drop(ix);
                    if let Ok(f) = File::options().write(true).open(&path) {
                        let _ = f.set_modified(SystemTime::now());
                    }
                    return Some((bytes, d));
                }
                Err(e) => ix.reject(&path, &e),
            }
        }
    }
}

impl CheckpointStore for DiskTier {
    fn persist(&mut self, checkpoint: Checkpoint) {
        self.queue(Item::Checkpoint(checkpoint));
    }

    fn fetch(
        &mut self,
        prompt: &[u32],
        deeper_than: usize,
        usable: &dyn Fn(usize) -> bool,
        identity: &Identity,
    ) -> Option<Decoded> {
        if *identity != self.identity {
            return None;
        }
        self.find(prompt, deeper_than, usable).map(|(_, d)| d)
    }

    fn stats(&self) -> Option<StoreStats> {
        Some(self.stats().into())
    }
}

impl From<DiskStats> for StoreStats {
    fn from(d: DiskStats) -> StoreStats {
        StoreStats {
            files: d.files as u64,
            bytes: d.bytes,
            budget: d.budget,
            evictions: d.evictions,
            written: d.written,
            rejected: d.rejected,
        }
    }
}

/// One pack's checkpoint files (all KV precisions), for `kore-launch cache`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackUsage {
    /// The pack identity in hex (the directory's name).
    pub pack: String,
    /// Checkpoint files.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// When the most recently used one was last used (written or read).
    pub newest: Option<SystemTime>,
}

/// The checkpoint files under `root` (e.g. [`default_root`]) per pack,
/// largest first; nothing when `root` does not exist.
pub fn usage(root: &Path) -> io::Result<Vec<PackUsage>> {
    let mut out = Vec::new();
    let Ok(packs) = fs::read_dir(root) else { return Ok(out) };
    for pack in packs {
        let pack = pack?;
        if !pack.file_type()?.is_dir() {
            continue;
        }
        let mut u = PackUsage {
            pack: pack.file_name().to_string_lossy().into_owned(),
            files: 0,
            bytes: 0,
            newest: None,
        };
        for f in checkpoint_files(&pack.path())? {
            let meta = fs::metadata(&f)?;
            u.files += 1;
            u.bytes += meta.len();
            u.newest = u.newest.max(meta.modified().ok());
        }
        out.push(u);
    }
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.pack.cmp(&b.pack)));
    Ok(out)
}

/// Deletes the checkpoint files under `root` (only those of `pack`, a
/// directory name from [`usage`], when given) and the directories they
/// leave empty; the bytes freed.
pub fn clear(root: &Path, pack: Option<&str>) -> io::Result<u64> {
    let mut freed = 0;
    for u in usage(root)? {
        if pack.is_some_and(|p| p != u.pack) {
            continue;
        }
        let dir = root.join(&u.pack);
        for f in checkpoint_files(&dir)? {
            freed += fs::metadata(&f)?.len();
            fs::remove_file(&f)?;
        }
        for sub in fs::read_dir(&dir)? {
            let _ = fs::remove_dir(sub?.path());
        }
        let _ = fs::remove_dir(&dir);
    }
    Ok(freed)
}

/// `*.ckpt` files in the precision directories under a pack directory.
fn checkpoint_files(pack_dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for kv in fs::read_dir(pack_dir)? {
        let kv = kv?;
        if !kv.file_type()?.is_dir() {
            continue;
        }
        for f in fs::read_dir(kv.path())? {
            let p = f?.path();
            if p.extension().is_some_and(|e| e == "ckpt") {
                out.push(p);
            }
        }
    }
    Ok(out)
}

/// [`DiskTier::newest`]'s choice, most wanted first: the divergence
/// checkpoints ([`divergences`]), deepest first, then the rest, most
/// recently used first, while they fit `budget`.
fn hand_over(entries: &[Entry], budget: u64) -> Vec<&Entry> {
    let mut recent: Vec<&Entry> = entries.iter().collect();
    recent.sort_by_key(|e| std::cmp::Reverse(e.used));
    let mut wanted = divergences(&recent[..recent.len().min(DIVERGENCE_FILES)]);
    wanted.sort_by_key(|f| std::cmp::Reverse(f.tokens.len()));
    let (mut total, mut taken) = (0u64, Vec::<&Entry>::new());
    for e in wanted.into_iter().chain(recent) {
        if total + e.bytes <= budget && !taken.iter().any(|t| core::ptr::eq(*t, e)) {
            total += e.bytes;
            taken.push(e);
        }
    }
    taken
}

/// How many of the most recent files [`divergences`] compares pairwise.
const DIVERGENCE_FILES: usize = 256;

/// The checkpoints where conversations part: for every two files neither
/// of which extends the other (two questions behind one system prompt, two
/// branches of a chat), the deepest file that is a prefix of both.
fn divergences<'e>(files: &[&'e Entry]) -> Vec<&'e Entry> {
    let prefix = |f: &Entry, a: &Entry| a.tokens.starts_with(&f.tokens);
    // Each file's proper prefixes among the files, deepest first.
    let ancestors: Vec<Vec<usize>> = files
        .iter()
        .map(|a| {
            let mut v: Vec<usize> = (0..files.len())
                .filter(|&i| files[i].tokens.len() < a.tokens.len() && prefix(files[i], a))
                .collect();
            v.sort_by_key(|&i| std::cmp::Reverse(files[i].tokens.len()));
            v
        })
        .collect();
    let mut found = vec![false; files.len()];
    for (i, a) in files.iter().enumerate() {
        for b in &files[i + 1..] {
            if prefix(a, b) || prefix(b, a) {
                continue;
            }
            let shared = common_prefix(&a.tokens, &b.tokens);
            if let Some(&f) = ancestors[i].iter().find(|&&f| files[f].tokens.len() <= shared) {
                found[f] = true;
            }
        }
    }
    files.iter().zip(found).filter(|(_, f)| *f).map(|(e, _)| *e).collect()
}

/// The length of the longest common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
