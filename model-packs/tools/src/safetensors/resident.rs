//! Weights copied into anonymous memory on 2 MiB pages, as the VMM backs guest RAM.
//!
//! Decode streams every weight once per token. Read through a file mapping, the
//! weights sit on 4 KiB page-cache pages, and each 4 KiB costs a TLB miss; under
//! nested virtualization a miss walks two page tables. Copying the file once into
//! hugetlb pages (the reserved pool, when it has room) or into memory advised for
//! transparent hugepages removes most of those misses. When neither fits in the
//! available memory the file stays mapped.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use memmap2::{Advice, Mmap, MmapOptions};

use crate::error::{PackError, Result};
use crate::progress::Progress;

/// 2 MiB, the hugepage size the copy asks for.
const HUGE: u64 = 2 << 20;
/// Bytes read per `read` call (and per progress tick).
const CHUNK: usize = 64 << 20;
/// Memory the copy leaves to everything else when it checks `MemAvailable`.
const MARGIN: u64 = 1 << 30;

/// Where a weights file's bytes live while the model runs.
///
/// ```
/// use kore_pack::safetensors::Residency;
/// assert_eq!(Residency::Mapped.to_string(), "mapped from the file (4 KiB pages)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// A read-only mapping of the file itself (page cache).
    Mapped,
    /// A copy on 2 MiB pages from the hugetlb pool.
    Hugetlb,
    /// A copy in memory advised for transparent hugepages; `huge_bytes` of it
    /// were on 2 MiB pages after the copy (from /proc/self/smaps, 0 if unknown).
    Transparent {
        /// Bytes of the copy on transparent hugepages.
        huge_bytes: u64,
    },
}

impl core::fmt::Display for Residency {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Residency::Mapped => write!(f, "mapped from the file (4 KiB pages)"),
            Residency::Hugetlb => write!(f, "copied to 2 MiB hugetlb pages"),
            Residency::Transparent { huge_bytes } => write!(
                f,
                "copied to anonymous memory, {:.2} GB on transparent 2 MiB pages",
                *huge_bytes as f64 / 1e9
            ),
        }
    }
}

/// Copies the `len`-byte file at `path` into hugepage-backed memory, or maps it
/// when the copy does not fit in the available memory. Returns the read-only
/// bytes (the file is the first `len` of them; a copy is padded to 2 MiB) and
/// where they live.
pub(crate) fn load(path: &Path, len: u64, progress: &dyn Progress) -> Result<(Mmap, Residency)> {
    let file = File::open(path).map_err(|e| PackError::io(path, e))?;
    if len == 0 || len.saturating_add(MARGIN) > mem_available().unwrap_or(u64::MAX) {
        tracing::warn!(
            file = %path.display(),
            len,
            "not enough free memory to copy the weights; reading them through the file mapping"
        );
        return map_file(path, &file).map(|m| (m, Residency::Mapped));
    }
    let rounded = len.div_ceil(HUGE) * HUGE;
    let (mut map, mut residency) =
        match MmapOptions::new().len(rounded as usize).huge(Some(21)).map_anon() {
            Ok(m) => (m, Residency::Hugetlb),
            Err(e) => {
                tracing::debug!(error = %e, "hugetlb pool short; using transparent hugepages");
                let m = MmapOptions::new()
                    .len(rounded as usize)
                    .map_anon()
                    .map_err(|e| PackError::io(path, e))?;
                // Advice only: without THP the copy still works, on 4 KiB pages.
                let _ = m.advise(Advice::HugePage);
                (m, Residency::Transparent { huge_bytes: 0 })
            }
        };
    progress.start("loading weights", len);
    let mut file = file;
    for chunk in map[..len as usize].chunks_mut(CHUNK) {
        file.read_exact(chunk).map_err(|e| PackError::io(path, e))?;
        progress.inc(chunk.len() as u64);
    }
    progress.finish();
    if let Residency::Transparent { huge_bytes } = &mut residency {
        *huge_bytes = anon_huge_bytes(map.as_ptr() as usize).unwrap_or(0);
    }
    let map = map.make_read_only().map_err(|e| PackError::io(path, e))?;
    Ok((map, residency))
}

/// A read-only mapping of `file`.
pub(crate) fn map_file(path: &Path, file: &File) -> Result<Mmap> {
    // SAFETY: the map is read-only and private to this process. Packs and
    // checkpoints are treated as immutable while open; a concurrent writer
    // truncating the file could fault, which is the documented contract of
    // every mmap-based model loader (nothing here writes through the map).
    unsafe { Mmap::map(file) }.map_err(|e| PackError::io(path, e))
}

/// `MemAvailable` from /proc/meminfo, in bytes (`None` if it cannot be read).
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `AnonHugePages` (bytes on transparent 2 MiB pages) of the mapping that
/// contains `addr`, from /proc/self/smaps; `None` if it cannot be read.
///
/// ```
/// let v = vec![1u8; 1 << 20];
/// let huge = kore_pack::safetensors::anon_huge_bytes(v.as_ptr() as usize);
/// assert!(huge.unwrap_or(0) <= 2 << 20);
/// ```
pub fn anon_huge_bytes(addr: usize) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    smaps_anon_huge(&text, addr)
}

/// The value of `field` (e.g. `VmFlags`, `AnonHugePages`) in this process's
/// `/proc/self/smaps` entry whose range holds `addr`, trimmed.
pub fn smaps_field(addr: usize, field: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    smaps_entry_field(&text, addr, field).map(str::to_owned)
}

/// The `AnonHugePages` field (bytes) of the smaps entry whose range holds `addr`.
fn smaps_anon_huge(smaps: &str, addr: usize) -> Option<u64> {
    let kib: u64 =
        smaps_entry_field(smaps, addr, "AnonHugePages")?.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

/// `field`'s value in the smaps entry whose range holds `addr`.
fn smaps_entry_field<'a>(smaps: &'a str, addr: usize, field: &str) -> Option<&'a str> {
    let mut inside = false;
    for line in smaps.lines() {
        let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
        if let Some((start, end)) = range {
            if let (Ok(s), Ok(e)) =
                (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16))
            {
                inside = (s..e).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(value) = line.strip_prefix(field).and_then(|r| r.strip_prefix(':')) {
                return Some(value.trim());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::NoProgress;

    #[test]
    fn smaps_field_of_the_right_mapping() {
        let smaps = "7f00-7f10 rw-p 00000000 00:00 0\nSize: 64 kB\nAnonHugePages: 0 kB\n\
                     7f20-7f80 rw-p 00000000 00:00 0\nSize: 4096 kB\nAnonHugePages: 2048 kB\n";
        assert_eq!(smaps_anon_huge(smaps, 0x7f20), Some(2048 * 1024));
        assert_eq!(smaps_anon_huge(smaps, 0x7f00), Some(0));
        assert_eq!(smaps_anon_huge(smaps, 0x7f40), Some(2048 * 1024));
        assert_eq!(smaps_anon_huge(smaps, 0x7f10), None);
    }

    #[test]
    fn copy_holds_the_file_bytes() {
        let dir = std::env::temp_dir().join(format!("kore-resident-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.bin");
        // Not a multiple of the chunk or page size: the tail must come through too.
        let data: Vec<u8> =
            (0..(3 << 20) + 12345).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let (map, residency) = load(&path, data.len() as u64, &NoProgress).unwrap();
        assert_eq!(&map[..data.len()], &data[..], "{residency}");
        assert_ne!(residency, Residency::Mapped, "3 MiB fits in memory");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn truncated_file_is_an_io_error() {
        let dir = std::env::temp_dir().join(format!("kore-resident-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.bin");
        std::fs::write(&path, [1u8; 100]).unwrap();
        let err = load(&path, 200, &NoProgress).unwrap_err();
        assert!(matches!(err, PackError::Io { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
