//! Hugepages taken by someone else before the VMM maps guest RAM (its own test binary: it
//! holds most of the host's free 2 MiB pages while it runs, which would slow other VM tests
//! down). The VMM reserves every page when it maps RAM, so this is the one moment pages can
//! go missing; a shortage there boots on ordinary pages with one warning naming the fix (one
//! line, no colour codes on a pipe),
//! the answer is the same, every page goes back, and the next boot uses hugepages again.
//!
//! Needs /dev/kvm, the guest images and at least 64 free 2 MiB hugepages (CI reserves them).

use std::fs::File;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::process::{Command, Output};

const PAGE: u64 = 2 << 20;
const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn count(file: &str) -> u64 {
    let s = std::fs::read_to_string(format!("{POOL}/{file}"));
    s.ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// Pages a new mapping can still reserve.
fn available() -> u64 {
    count("free_hugepages").saturating_sub(count("resv_hugepages"))
}

/// A hugetlb memfd of `pages` pages, mapped shared so the kernel reserves them all (what
/// another VM or program would hold); they return when it is dropped.
struct Thief {
    _file: File,
    addr: *mut libc::c_void,
    len: usize,
}

impl Thief {
    fn take(pages: u64) -> Thief {
        let flags = libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
        // SAFETY: a valid NUL-terminated name and valid flags.
        let fd = unsafe { libc::memfd_create(c"kore-test-thief".as_ptr(), flags) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: fd was just created and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        let len = (pages * PAGE) as usize;
        file.set_len(len as u64).expect("sizing the hugetlb memfd");
        // SAFETY: a fresh shared mapping of the whole memfd at an address the kernel picks.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert!(addr != libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        Thief { _file: file, addr, len }
    }
}

impl Drop for Thief {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `take`, not used after this.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

fn generate(rt: &Path) -> Output {
    let pack = kore_e2e::tiny_pack();
    let args =
        ["generate", "--model", pack.to_str().unwrap(), "--prompt", "KING.", "--max-tokens", "4"];
    let out = Command::new(kore_e2e::kore_launch())
        .args(args)
        .env_remove("KORE_APPLIANCE")
        .env("KORE_RUNTIME_DIR", rt)
        .output()
        .unwrap();
    assert!(out.status.success(), "generate failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn fell_back(out: &Output) -> bool {
    String::from_utf8_lossy(&out.stderr).contains("booting on ordinary pages this time")
}

#[test]
fn hugepages_taken_before_the_vmm_maps_ram_boot_on_ordinary_pages() {
    kore_e2e::require_kvm();
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let before = available();
    assert!(before >= 64, "needs >= 64 free 2 MiB hugepages, {before} are");

    let normal = generate(&rt);
    assert!(!fell_back(&normal), "a boot with free hugepages fell back");

    // Leave two pages: far less than guest RAM plus the pack.
    let thief = Thief::take(before - 2);
    assert!(available() <= 2, "the thief holds the pool ({} still free)", available());
    let short = generate(&rt);
    let said = String::from_utf8_lossy(&short.stderr);
    assert!(fell_back(&short), "no fallback warning: {said}");
    assert!(said.contains("not enough free hugepages-2048kB hugepages"), "{said}");
    assert!(said.contains("nr_hugepages"), "the warning names the fix: {said}");
    // One warning for the one problem, and no colour codes on a stderr that is a pipe.
    let about_pages = said.lines().filter(|l| l.contains("hugepages")).count();
    assert_eq!(about_pages, 1, "the shortage is said once: {said}");
    assert!(!said.contains('\x1b'), "colour codes on a non-terminal stderr: {said:?}");
    assert_eq!(short.stdout, normal.stdout, "the same answer on ordinary pages");
    assert!(available() <= 2, "the fallback boot kept hugepages");
    drop(thief);

    assert_eq!(available(), before, "every hugepage back once the thief lets go");
    let again = generate(&rt);
    assert!(!fell_back(&again), "the next boot still on ordinary pages");
    assert_eq!(again.stdout, normal.stdout);
    assert!(std::fs::read_dir(&rt).map(|mut d| d.next().is_none()).unwrap_or(true));
}
