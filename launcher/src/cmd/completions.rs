//! `kore-launch completions SHELL`: prints a completion script for the shell.

use crate::cli::Cli;
use crate::error::Result;
use clap::CommandFactory;

/// Writes the completion script for `shell` to stdout.
pub fn run(shell: clap_complete::Shell) -> Result<()> {
    let mut command = Cli::command();
    clap_complete::generate(shell, &mut command, "kore-launch", &mut std::io::stdout());
    Ok(())
}
