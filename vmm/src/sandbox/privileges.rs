//! Process-wide privileges the VMM gives up once its files are open: core
//! dumps and ptrace (guest memory must not end up on disk or in another
//! process), file-descriptor and core rlimits, the host's network and mount
//! namespaces, and root.
//!
//! Every step that the host does not allow is reported in
//! [`Dropped::warnings`], never skipped silently; only a failed uid/gid
//! change is an error, because running on as root would be a surprise.

use std::ffi::CStr;

/// Open files the VMM may hold after the drop (the vsock connections are the
/// only thing that grows).
pub const MAX_OPEN_FILES: u64 = 4096;

/// Why privileges could not be dropped.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// `setgroups`/`setresgid`/`setresuid` failed.
    #[error("dropping root to uid {uid} gid {gid} failed at {step}: {source}")]
    Setid {
        /// The uid asked for.
        uid: u32,
        /// The gid asked for.
        gid: u32,
        /// The call that failed.
        step: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The uid changed but root could be regained: never run like that.
    #[error("after dropping to uid {0} the process could still become root again")]
    Regainable(u32),
}

/// What [`drop_privileges`] did.
#[derive(Debug, Default, Clone)]
pub struct Dropped {
    /// The uid and gid the process runs as now.
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// Steps the host did not allow, one line each.
    pub warnings: Vec<String>,
}

/// The account an unprivileged VMM runs as: `nobody`, else 65534/65534.
pub fn unprivileged_ids() -> (u32, u32) {
    let name: &CStr = c"nobody";
    // SAFETY: getpwnam takes a NUL-terminated string and returns a pointer to
    // static storage or null; the fields are read before any other NSS call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return (65534, 65534);
    }
    // SAFETY: `pw` is non-null and points to a valid `passwd`.
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

fn os_err(ret: libc::c_int) -> Result<(), std::io::Error> {
    match ret {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Enters new network and mount namespaces (inside a new user namespace
/// when `user`, for an ordinary user). Only possible while the process has
/// one thread; file access keeps the caller's own ids and groups.
pub fn enter_namespaces(user: bool) -> std::io::Result<()> {
    let user = if user { libc::CLONE_NEWUSER } else { 0 };
    // SAFETY: unshare takes flags only and fails cleanly when not allowed.
    os_err(unsafe { libc::unshare(user | libc::CLONE_NEWNET | libc::CLONE_NEWNS) })
}

/// Replaces the process's root by an empty, read-only tmpfs: after this no
/// path names a host file (the VMM works on descriptors it already holds).
/// Needs its own mount namespace ([`enter_namespaces`]) and the right to
/// mount in it, so it runs before [`drop_privileges`]. Mounts are made
/// private first, so nothing here reaches the host's namespace.
pub fn empty_root() -> std::io::Result<()> {
    let c = |s: &'static CStr| s.as_ptr();
    let none = std::ptr::null::<libc::c_char>();
    let hardened = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    // Each step's error names the step, so a warning says which one the
    // host refused.
    let step = |what: &str, ret: libc::c_int| {
        os_err(ret).map_err(|e| std::io::Error::new(e.kind(), format!("{what}: {e}")))
    };
    // SAFETY: mount, chdir, pivot_root and umount2 take NUL-terminated
    // strings (static literals here) or null where the kernel allows it; the
    // calls change this process's mount namespace only.
    unsafe {
        let private = libc::MS_REC | libc::MS_PRIVATE;
        step("making mounts private", libc::mount(none, c(c"/"), none, private, std::ptr::null()))?;
        // /tmp exists on every Linux host; the tmpfs hides it in this
        // namespace only and becomes the new root.
        let opts = c"size=4k,mode=0555".as_ptr().cast();
        let tmpfs = libc::mount(c(c"tmpfs"), c(c"/tmp"), c(c"tmpfs"), hardened, opts);
        step("mounting an empty tmpfs on /tmp", tmpfs)?;
        step("chdir /tmp", libc::chdir(c(c"/tmp")))?;
        // pivot_root(".", ".") stacks the old root on the new one; detaching
        // it leaves the tmpfs alone (pivot_root(2), NOTES).
        let pivot = libc::syscall(libc::SYS_pivot_root, c(c"."), c(c".")) as libc::c_int;
        step("pivot_root", pivot)?;
        step("detaching the old root", libc::umount2(c(c"."), libc::MNT_DETACH))?;
        step("chdir /", libc::chdir(c(c"/")))?;
        let ro = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | hardened;
        step(
            "remounting the root read-only",
            libc::mount(none, c(c"/"), none, ro, std::ptr::null()),
        )
    }
}

/// Gives up what the VMM no longer needs. When the effective uid is root,
/// switches to `ids` (default [`unprivileged_ids`]) for all threads; an
/// ordinary user keeps its uid (that is no degradation, so no warning).
pub fn drop_privileges(ids: Option<(u32, u32)>) -> Result<Dropped, PrivilegeError> {
    let mut out = Dropped::default();
    // SAFETY: prctl with PR_SET_DUMPABLE takes an integer argument only.
    if let Err(e) = os_err(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }) {
        out.warnings.push(format!("core dumps and ptrace stay possible (PR_SET_DUMPABLE: {e})"));
    }
    set_limit(libc::RLIMIT_CORE, 0, &mut out);
    set_limit(libc::RLIMIT_NOFILE, MAX_OPEN_FILES, &mut out);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let (uid, gid) = ids.unwrap_or_else(unprivileged_ids);
        become_user(uid, gid)?;
    }
    // SAFETY: getuid/getgid have no preconditions.
    (out.uid, out.gid) = unsafe { (libc::getuid(), libc::getgid()) };
    Ok(out)
}

fn set_limit(resource: libc::__rlimit_resource_t, max: u64, out: &mut Dropped) {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `cur` is a valid rlimit to fill.
    let got = os_err(unsafe { libc::getrlimit(resource, &mut cur) });
    let hard = if got.is_ok() { cur.rlim_max.min(max) } else { max };
    let lim = libc::rlimit { rlim_cur: hard, rlim_max: hard };
    // SAFETY: `lim` is a valid rlimit; lowering limits is always allowed.
    if let Err(e) = os_err(unsafe { libc::setrlimit(resource, &lim) }) {
        out.warnings.push(format!("rlimit {resource} stays as it is ({e})"));
    }
}

fn become_user(uid: u32, gid: u32) -> Result<(), PrivilegeError> {
    let err = |step, source| PrivilegeError::Setid { uid, gid, step, source };
    // SAFETY: setgroups with size 0 ignores the list pointer; glibc's set*id
    // wrappers apply the change to every thread of the process.
    unsafe {
        os_err(libc::setgroups(0, std::ptr::null())).map_err(|e| err("setgroups", e))?;
        os_err(libc::setresgid(gid, gid, gid)).map_err(|e| err("setresgid", e))?;
        os_err(libc::setresuid(uid, uid, uid)).map_err(|e| err("setresuid", e))?;
        // The raw call tests this thread only (glibc's setuid would ask every
        // thread to try, and filtered threads may not).
        if uid != 0 && libc::syscall(libc::SYS_setuid, 0) == 0 {
            return Err(PrivilegeError::Regainable(uid));
        }
    }
    tracing::info!(uid, gid, "VMM dropped root");
    Ok(())
}
