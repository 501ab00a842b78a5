//! Each case runs in a child process (this test binary again, running only
//! [`child`] with `KORE_SANDBOX_CASE` set), because filters cannot be removed
//! and a violation kills the whole process.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

use super::{apply, drop_privileges, enter_namespaces, ThreadKind};

const CASE: &str = "KORE_SANDBOX_CASE";

fn run_case(case: &str) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "sandbox::tests::child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CASE, case)
        .output()
        .unwrap()
}

fn killed_by_sigsys(out: &Output) -> bool {
    out.status.signal() == Some(libc::SIGSYS)
}

/// Reads `Seccomp:` and `NoNewPrivs:` of thread `tid` of this process.
fn thread_status(tid: i32) -> (String, String) {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    let field = |k: &str| {
        s.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim().to_owned()).unwrap_or_default()
    };
    (field("Seccomp:"), field("NoNewPrivs:"))
}

/// The body of every case; only runs in the child.
#[test]
#[ignore = "the child process of the sandbox tests; run by them"]
fn child() {
    let case = std::env::var(CASE).expect("run by the sandbox tests");
    if case == "drop" {
        return drop_case();
    }
    let (pair_a, pair_b) = std::os::unix::net::UnixStream::pair().unwrap();
    let filtered = std::thread::spawn(move || {
        let kind = match case.as_str() {
            "vcpu-socket" | "vcpu-ok" => ThreadKind::Vcpu,
            _ => ThreadKind::EventLoop,
        };
        apply(kind).unwrap();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        match case.as_str() {
            "vcpu-socket" => {
                // SAFETY: socket() takes integers only; it fails with EACCES.
                let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
                assert_eq!(fd, -1, "sockets are refused");
                // SAFETY: bind on a bad fd takes a null address of length 0; the filter kills us first.
                let r = unsafe { libc::bind(-1, std::ptr::null(), 0) };
                println!("bind returned {r}: the filter did not stop it");
            }
            "loop-listen" => {
                // SAFETY: listen() takes integers only; the filter kills us first.
                let r = unsafe { libc::listen(-1, 1) };
                println!("listen returned {r}: the filter did not stop it");
            }
            "loop-ok" => {
                use std::io::Write;
                (&pair_a).write_all(b"ping").unwrap();
                let opened = std::fs::File::open("/etc/hostname").map_err(|e| e.kind());
                assert_eq!(opened.err(), Some(std::io::ErrorKind::PermissionDenied));
                // SAFETY: socket() takes integers only.
                let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
                let err = std::io::Error::last_os_error().raw_os_error();
                assert_eq!((fd, err), (-1, Some(libc::EACCES)), "new sockets are refused");
            }
            _ => {}
        }
        tid
    });
    let tid = filtered.join().unwrap();
    let _ = pair_b;
    // The filtered thread has exited; report what its siblings see of it
    // through a fresh thread of the same kind that stays alive while read.
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        apply(ThreadKind::Vcpu).unwrap();
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        done_rx.recv().unwrap();
    });
    let live = rx.recv().unwrap();
    let (seccomp, nnp) = thread_status(live);
    let (main_seccomp, _) = thread_status(std::process::id() as i32);
    println!("CASE-OK tid={tid} seccomp={seccomp} nnp={nnp} main={main_seccomp}");
    done_tx.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn a_forbidden_call_on_a_vcpu_thread_kills_the_process() {
    let out = run_case("vcpu-socket");
    assert!(
        killed_by_sigsys(&out),
        "status {:?}, stdout {}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_event_loop_moves_bytes_but_opens_no_files_or_sockets() {
    let out = run_case("loop-listen");
    assert!(killed_by_sigsys(&out), "status {:?}", out.status);
    let out = run_case("loop-ok");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "status {:?}, stdout {stdout}", out.status);
}

#[test]
fn filtered_threads_show_seccomp_2_and_no_new_privs_and_others_stay_free() {
    let out = run_case("vcpu-ok");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "status {:?}, stdout {stdout}", out.status);
    assert!(stdout.contains("seccomp=2 nnp=1 main=0"), "{stdout}");
}

/// Drops privileges, then reports uid, whether root can be regained, the
/// dumpable flag and the core rlimit.
fn drop_case() {
    // SAFETY: geteuid has no preconditions.
    let ns = enter_namespaces(unsafe { libc::geteuid() } != 0).map_err(|e| e.to_string());
    let d = drop_privileges(None).unwrap();
    // SAFETY: these calls take integers or a valid rlimit pointer.
    let (uid, regained, dumpable, core) = unsafe {
        let mut core = libc::rlimit { rlim_cur: 1, rlim_max: 1 };
        libc::getrlimit(libc::RLIMIT_CORE, &mut core);
        (libc::getuid(), libc::setuid(0) == 0, libc::prctl(libc::PR_GET_DUMPABLE), core.rlim_max)
    };
    println!(
        "DROP uid={uid} regained={regained} dumpable={dumpable} core={core} ns={ns:?} warnings={:?}",
        d.warnings
    );
}

#[test]
fn dropping_privileges_leaves_no_way_back_to_root() {
    let out = run_case("drop");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "status {:?}, stdout {stdout}", out.status);
    let line =
        stdout.lines().find_map(|l| l.find("DROP ").map(|i| &l[i..])).expect("the child reports");
    assert!(line.contains("regained=false dumpable=0 core=0"), "{line}");
    // SAFETY: geteuid has no preconditions.
    match unsafe { libc::geteuid() } {
        0 => {
            let (uid, _) = super::privileges::unprivileged_ids();
            assert!(line.contains(&format!("uid={uid} ")), "{line}");
        }
        me => {
            assert!(line.contains(&format!("uid={me} ")), "{line}");
        }
    }
}
