//! One module per command; `run` dispatches.

mod bench;
mod completions;
mod doctor;
mod generate;
mod pack;
mod setup;
mod tokenize;

use crate::cli::{Cli, Command};
use crate::error::{LaunchError, Result};

/// Runs the parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => Err(not_yet("chat (default command)")),
        Some(Command::Generate(args)) => generate::run(args),
        Some(Command::Chat(_)) => Err(not_yet("chat")),
        Some(Command::Tokenize(args)) => tokenize::run(args),
        Some(Command::Batch(_)) => Err(not_yet("batch")),
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::Pack(cmd)) => pack::run(cmd),
        Some(Command::Up(_)) | Some(Command::Down) | Some(Command::Status(_)) => {
            Err(not_yet("up/down/status"))
        }
        Some(Command::Setup(args)) => setup::run(&args),
        Some(Command::Doctor(flag)) => doctor::run(flag),
        Some(Command::Completions { shell }) => completions::run(shell),
    }
}

fn not_yet(what: &str) -> LaunchError {
    LaunchError::Other(format!("`{what}` is not available in this build yet"))
}
