//! One module per command; `run` dispatches.

mod batch;
pub mod bench;
mod cache;
mod chat;
mod completions;
mod daemon;
mod doctor;
mod down;
mod generate;
pub(crate) mod pack;
mod serve;
mod session;
mod setup;
mod status;
mod tokenize;
mod up;

use crate::cli::{ChatArgs, Cli, Command};
use crate::error::Result;

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
        Some(Command::Up(args)) => up::run(args, cli.verbose),
        Some(Command::Down(args)) => down::run(args),
        Some(Command::Status(args)) => status::run(args),
        Some(Command::Daemon(args)) => daemon::run(args),
        Some(Command::Serve(args)) => serve::run(args),
        Some(Command::Setup(args)) => setup::run(&args),
        Some(Command::Doctor(flag)) => doctor::run(flag),
        Some(Command::Cache(args)) => cache::run(&args),
        Some(Command::Completions { shell }) => completions::run(shell),
    }
}
