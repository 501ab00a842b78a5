//! Driving `kore-launch` in a real terminal: a detached tmux session whose
//! screen the test reads with `capture-pane`. Waits poll the screen for
//! expected text (with a generous limit, so a slow machine only waits longer).

use std::process::Command;
use std::time::{Duration, Instant};

/// Longest wait for expected text before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(180);

/// A tmux session running one command; killed on drop.
pub struct Tmux {
    name: String,
}

fn tmux(args: &[&str]) -> std::process::Output {
    Command::new("tmux").arg("-u").args(args).output().expect(
        "tmux is needed for the interactive tests (apt-get install tmux; .ci/run installs it)",
    )
}

impl Tmux {
    /// Starts `shell_command` in a 120x40 terminal. The command runs under
    /// `sh -c`; after it ends the pane shows `EXITED:<code>` and stays open.
    pub fn start(tag: &str, shell_command: &str) -> Self {
        let name = format!("kore-test-{tag}-{}", std::process::id());
        let cmd = format!("{shell_command}; echo EXITED:$?; sleep 600");
        let out = tmux(&["new-session", "-d", "-s", &name, "-x", "120", "-y", "40", &cmd]);
        assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
        Self { name }
    }

    /// The visible screen plus scrollback.
    pub fn screen(&self) -> String {
        let out = tmux(&["capture-pane", "-p", "-J", "-S", "-2000", "-t", &self.name]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` literally, then presses Enter.
    pub fn type_line(&self, text: &str) {
        let out = tmux(&["send-keys", "-t", &self.name, "-l", text]);
        assert!(out.status.success());
        self.key("Enter");
    }

    /// Presses a key by tmux name (`Enter`, `C-c`, `C-d`).
    pub fn key(&self, key: &str) {
        let out = tmux(&["send-keys", "-t", &self.name, key]);
        assert!(out.status.success());
    }

    /// Waits until `pred(screen)` holds; returns that screen. Panics with the
    /// last screen after [`PATIENCE`].
    pub fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if start.elapsed() > PATIENCE {
                panic!("waited {PATIENCE:?} for {what}; the screen was:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the screen contains `text` `n` times.
    pub fn wait_count(&self, text: &str, n: usize) -> String {
        self.wait_for(&format!("{n} x {text:?}"), |s| s.matches(text).count() >= n)
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", &self.name]);
    }
}

/// Quotes `s` for `sh`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
