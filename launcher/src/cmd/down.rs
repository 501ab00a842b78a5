//! `kore-launch down`: stops the background appliance (SIGTERM: the daemon
//! shuts the engine/VM down and removes its files) and cleans stale files.

use std::time::{Duration, Instant};

use super::daemon::{Probe, Runtime};
use crate::cli::RuntimeArgs;
use crate::error::Result;

/// How long the daemon gets to shut down before it is killed.
const GRACE: Duration = Duration::from_secs(60);

/// Runs `down`.
pub fn run(args: RuntimeArgs) -> Result<()> {
    let rt = Runtime::from_settings(args.runtime_dir)?;
    match rt.probe() {
        Probe::Absent => println!("no appliance is up (runtime directory {})", rt.dir.display()),
        Probe::Stale(what) => {
            rt.clean();
            println!("no appliance is up; removed stale files ({what})");
        }
        Probe::Running(pid) => {
            let pid_t = pid as libc::pid_t;
            // SAFETY: kill only sends a signal to the pid we read and checked is our daemon.
            unsafe { libc::kill(pid_t, libc::SIGTERM) };
            let start = Instant::now();
            // Until the process has exited (its files go just before that).
            while is_alive(pid) {
                if start.elapsed() > GRACE {
                    eprintln!(
                        "kore-launch: the appliance did not stop within {GRACE:?}; killing it"
                    );
                    // SAFETY: as above; SIGKILL to the same checked pid.
                    unsafe { libc::kill(pid_t, libc::SIGKILL) };
                    std::thread::sleep(Duration::from_millis(200));
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            rt.clean();
            println!("appliance stopped (pid {pid})");
        }
    }
    Ok(())
}

/// Whether `pid` exists and has not exited (a zombie waiting for its parent
/// to reap it has exited).
pub fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}
