//! Preloading files (the model pack) into guest RAM before boot.
//!
//! Files are read with large `read` calls straight into the guest-memory
//! mapping, each at a 2 MiB-aligned guest-physical address from
//! [`kore_boot_abi::layout::PACK_BASE`] on. With [`CacheAfterRead::Drop`]
//! each chunk's pages leave the host's page cache once copied, so a pack
//! that fills much of the host's memory is not held twice (guest RAM plus a
//! clean page-cache copy that only memory pressure would reclaim).

use std::fs::File;
use std::path::{Path, PathBuf};

use kore_boot_abi::layout::{align_up_huge, PACK_BASE};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

/// Errors preloading files.
#[derive(Debug, thiserror::Error)]
pub enum PreloadError {
    /// A file could not be opened or read.
    #[error("cannot read preload file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file changed size while being read.
    #[error("preload file {path} shrank while being read (expected {expected} bytes): do not modify the pack while a VM starts")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Size at planning time.
        expected: u64,
    },
    /// Guest memory rejected the destination range (a bug in the plan).
    #[error("preload destination for {path} is outside guest RAM")]
    Destination {
        /// The file.
        path: PathBuf,
    },
}

/// Progress of a preload, passed to the callback after every chunk.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Bytes loaded so far over all files.
    pub done: u64,
    /// Bytes to load over all files.
    pub total: u64,
}

/// Where one file goes.
#[derive(Clone, Debug)]
pub struct PreloadSlot {
    /// The file.
    pub path: PathBuf,
    /// Its base name, as the guest sees it.
    pub name: String,
    /// Guest-physical address.
    pub gpa: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Plans slots for `paths`: stats each file, assigns 2 MiB-aligned addresses.
/// Returns the slots and the total bytes reserved.
pub fn plan(paths: &[PathBuf]) -> Result<(Vec<PreloadSlot>, u64), PreloadError> {
    let mut gpa = PACK_BASE;
    let mut slots = Vec::new();
    for p in paths {
        let size = std::fs::metadata(p)
            .map_err(|e| PreloadError::Io { path: p.clone(), source: e })?
            .len();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        slots.push(PreloadSlot { path: p.clone(), name, gpa, size });
        gpa = align_up_huge(gpa + size.max(1));
    }
    Ok((slots, gpa - PACK_BASE))
}

/// Chunk size of each read.
const CHUNK: usize = 32 << 20;

/// What happens to a file's pages in the host's page cache once read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CacheAfterRead {
    /// Left cached: the next boot of the same pack reads from memory.
    #[default]
    Keep,
    /// Dropped chunk by chunk (`POSIX_FADV_DONTNEED`): for a pack large
    /// against the host's memory, whose copy in guest RAM is the only one needed.
    Drop,
}

/// Reads every slot's file into `mem`, calling `progress` after each chunk.
pub fn load<M: GuestMemory>(
    mem: &M,
    slots: &[PreloadSlot],
    cache: CacheAfterRead,
    progress: &mut dyn FnMut(Progress),
) -> Result<u64, PreloadError> {
    let total: u64 = slots.iter().map(|s| s.size).sum();
    let mut done = 0u64;
    for s in slots {
        load_one(mem, s, cache, &mut |n| {
            done += n;
            progress(Progress { done, total });
        })?;
    }
    Ok(done)
}

fn load_one<M: GuestMemory>(
    mem: &M,
    s: &PreloadSlot,
    cache: CacheAfterRead,
    on_chunk: &mut dyn FnMut(u64),
) -> Result<(), PreloadError> {
    let io = |e| PreloadError::Io { path: s.path.clone(), source: e };
    let mut f = File::open(&s.path).map_err(io)?;
    advise(&f, 0, 0, libc::POSIX_FADV_SEQUENTIAL);
    let mut off = 0u64;
    while off < s.size {
        let n = ((s.size - off) as usize).min(CHUNK);
        let mut got = 0usize;
        while got < n {
            let addr = GuestAddress(s.gpa + off + got as u64);
            match mem.read_volatile_from(addr, &mut f, n - got) {
                Ok(0) => {
                    return Err(PreloadError::Truncated { path: s.path.clone(), expected: s.size })
                }
                Ok(k) => got += k,
                Err(vm_memory::GuestMemoryError::IOError(e))
                    if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(vm_memory::GuestMemoryError::IOError(e)) => return Err(io(e)),
                Err(_) => return Err(PreloadError::Destination { path: s.path.clone() }),
            }
        }
        if cache == CacheAfterRead::Drop {
            advise(&f, off, n as u64, libc::POSIX_FADV_DONTNEED);
        }
        off += n as u64;
        on_chunk(n as u64);
    }
    Ok(())
}

/// A hint about `len` bytes of `f` from `off` (0: to the end). Hints change
/// no data: one the kernel refuses only costs what it would have saved.
fn advise(f: &File, off: u64, len: u64, advice: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only reads the fd number; the file stays open.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), off as libc::off_t, len as libc::off_t, advice);
    }
}

/// Bytes a plan reserves for `paths` (for sizing hugepage pools).
pub fn reserved_bytes(paths: &[PathBuf]) -> Result<u64, PreloadError> {
    plan(paths).map(|(_, b)| b)
}

/// The base name used for `path` in the boot info.
pub fn guest_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
