//! Preloading leaves the host's page cache as asked: a dropped pack's pages
//! are gone once it is in guest RAM, a kept one's stay, and guest RAM holds
//! the file either way. Needs a filesystem with a page cache (the target
//! directory; tmpfs keeps its pages whatever one advises).

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use kore_vmm::preload::{self, CacheAfterRead};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const SIZE: usize = 24 << 20;

/// Fraction of `path`'s pages in the page cache (mincore on a fresh mapping).
fn cached_fraction(path: &Path) -> f64 {
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let mut pages = vec![0u8; len.div_ceil(4096)];
    // SAFETY: a fresh read-only shared mapping of an open file, never touched:
    // mincore only writes residency into `pages` (a byte per 4 KiB page, sized
    // above), and the mapping is removed before returning.
    unsafe {
        let at = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(at, libc::MAP_FAILED, "mmap {}", path.display());
        assert_eq!(libc::mincore(at, len, pages.as_mut_ptr()), 0, "mincore");
        libc::munmap(at, len);
    }
    pages.iter().filter(|&&b| b & 1 == 1).count() as f64 / pages.len() as f64
}

fn contents() -> Vec<u8> {
    (0..SIZE).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// A pack file on disk, written back (clean pages, which DONTNEED can drop).
fn pack_file() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("preload_cache");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("weights-{}.bin", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&contents()).unwrap();
    f.sync_all().unwrap();
    path
}

/// Preloads `path` into fresh guest RAM and checks what it holds.
fn preload(path: &Path, cache: CacheAfterRead) {
    let (slots, reserved) = preload::plan(&[path.to_path_buf()]).unwrap();
    let base = GuestAddress(slots[0].gpa);
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(base, reserved as usize)]).unwrap();
    assert_eq!(preload::load(&mem, &slots, cache, &mut |_| {}).unwrap(), SIZE as u64);
    let mut got = vec![0u8; SIZE];
    mem.read_slice(&mut got, base).unwrap();
    assert!(got == contents(), "guest RAM differs from the file");
}

#[test]
fn a_dropped_pack_leaves_the_page_cache_and_a_kept_one_stays() {
    let path = pack_file();
    std::fs::read(&path).unwrap();
    let before = cached_fraction(&path);
    assert!(before > 0.9, "the file just read should be cached; {before:.2} of it is");

    preload(&path, CacheAfterRead::Drop);
    let dropped = cached_fraction(&path);
    assert!(dropped < 0.1, "after a dropping preload {dropped:.2} of the file is still cached");

    preload(&path, CacheAfterRead::Keep);
    let kept = cached_fraction(&path);
    assert!(kept > 0.9, "after a keeping preload only {kept:.2} of the file is cached");
    std::fs::remove_file(&path).unwrap();
}
