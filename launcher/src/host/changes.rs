//! [`Changes`]: every write `setup` makes goes through here, so each one is
//! printed (as the shell command that does the same), refused without root,
//! and only printed with `--dry-run`.

use super::{HostError, Sys};
use std::io::Write;

/// One write made (or planned) to a kernel file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The file, as a host path ("/sys/...").
    pub path: String,
    /// The value written.
    pub value: String,
    /// Why, in a few words.
    pub why: String,
}

/// Makes, prints and records changes to the host.
pub struct Changes<'a> {
    sys: &'a dyn Sys,
    dry_run: bool,
    is_root: bool,
    out: &'a mut dyn Write,
    made: Vec<Change>,
}

impl<'a> Changes<'a> {
    /// Changes through `sys`, printed to `out`; with `dry_run` nothing is written.
    /// Without `is_root` any real write fails with [`HostError::NotRoot`].
    pub fn new(sys: &'a dyn Sys, dry_run: bool, is_root: bool, out: &'a mut dyn Write) -> Self {
        Changes { sys, dry_run, is_root, out, made: Vec::new() }
    }

    /// The filesystem the changes go to.
    pub fn sys(&self) -> &'a dyn Sys {
        self.sys
    }

    /// Whether this is a dry run.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// Writes `value` to `path` (or only prints it in a dry run).
    pub fn write(&mut self, path: &str, value: &str, why: &str) -> Result<(), HostError> {
        let shown = self.sys.shown(path);
        if self.dry_run {
            writeln!(self.out, "[dry-run] echo {value} > {shown}   # {why}")?;
        } else {
            if !self.is_root {
                return Err(HostError::NotRoot { what: format!("writing {shown} ({why})") });
            }
            writeln!(self.out, "[change] echo {value} > {shown}   # {why}")?;
            self.sys.write(path, value)?;
            tracing::info!(path = %shown, value, why, "changed");
        }
        self.made.push(Change {
            path: path.to_string(),
            value: value.to_string(),
            why: why.to_string(),
        });
        Ok(())
    }

    /// Runs `program args` (or only prints it in a dry run); fails when it fails.
    pub fn command(&mut self, program: &str, args: &[&str], why: &str) -> Result<(), HostError> {
        let shown = format!("{program} {}", args.join(" "));
        if self.dry_run {
            writeln!(self.out, "[dry-run] {shown}   # {why}")?;
        } else {
            if !self.is_root {
                return Err(HostError::NotRoot { what: format!("running `{shown}` ({why})") });
            }
            writeln!(self.out, "[change] {shown}   # {why}")?;
            let failed = |detail: String| HostError::Command { command: shown.clone(), detail };
            let status = std::process::Command::new(program)
                .args(args)
                .status()
                .map_err(|e| failed(e.to_string()))?;
            if !status.success() {
                return Err(failed(status.to_string()));
            }
            tracing::info!(command = %shown, why, "changed");
        }
        self.made.push(Change { path: shown, value: String::new(), why: why.to_string() });
        Ok(())
    }

    /// Creates or replaces the file `path` with `contents`, making its directory (or only
    /// prints it in a dry run). Printed as `write PATH: LINE` with the file's non-comment lines.
    pub fn create_file(&mut self, path: &str, contents: &str, why: &str) -> Result<(), HostError> {
        let real = self.sys.locate(path);
        let shown = real.display().to_string();
        let body: Vec<&str> = contents.lines().filter(|l| !l.starts_with('#')).collect();
        let body = body.join(" / ");
        let tag = if self.dry_run { "dry-run" } else { "change" };
        if !self.dry_run && !self.is_root {
            return Err(HostError::NotRoot { what: format!("writing {shown} ({why})") });
        }
        writeln!(self.out, "[{tag}] write {shown}: {body}   # {why}")?;
        if !self.dry_run {
            let failed =
                |source| HostError::Write { path: shown.clone(), value: body.clone(), source };
            if let Some(dir) = real.parent() {
                std::fs::create_dir_all(dir).map_err(failed)?;
            }
            std::fs::write(&real, contents).map_err(failed)?;
            tracing::info!(path = %shown, why, "changed");
        }
        self.made.push(Change { path: shown, value: body, why: why.to_string() });
        Ok(())
    }

    /// Prints a line that is not a change (a check passed, a fact found).
    pub fn note(&mut self, text: &str) -> Result<(), HostError> {
        writeln!(self.out, "{text}")?;
        Ok(())
    }

    /// The changes made (or, in a dry run, planned) so far.
    pub fn made(&self) -> &[Change] {
        &self.made
    }
}

/// Whether this process runs with an effective user id of 0.
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() == 0 }
}
