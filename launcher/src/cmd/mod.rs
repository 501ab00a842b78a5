//! One module per command; `run` dispatches.

mod batch;
mod bench;
mod chat;
mod completions;
mod doctor;
mod generate;
mod pack;
mod session;
mod session_fake;
mod setup;
mod tokenize;

use crate::cli::{ChatArgs, Cli, Command};
use crate::error::{LaunchError, Result};

/// Runs the parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => chat::run(ChatArgs::default()),
        Some(Command::Generate(args)) => generate::run(args),
        Some(Command::Chat(args)) => chat::run(args),
        Some(Command::Tokenize(args)) => tokenize::run(args),
        Some(Command::Batch(args)) => batch::run(args),
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
