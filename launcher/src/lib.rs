//! `kore-launch`: the host tool that checks the host, boots the Kore appliance
//! and lets a person or a script talk to it. The command-line surface follows the
//! contract in docs/contract.md; each command lives in `cmd/`.
//!
//! A library with one entry, [`main`], so that the fuzz targets (`fuzz/`) can reach the HTTP
//! server's parsing ([`fuzz`]); the binary (`src/main.rs`) only calls it.

mod appliance;
mod bundle;
mod cli;
mod client;
mod cmd;
mod config;
mod engine_options;
mod env;
mod error;
mod host;
mod model;
mod pack_check;
mod serve;
mod term;

#[doc(hidden)]
pub mod fuzz;
pub mod huge_alloc;

use clap::Parser;

/// Runs `kore-launch` with the process's arguments and exits on error (the binary's `main`).
pub fn main() {
    let cli = cli::Cli::parse();
    init_tracing(cli.verbose);
    env::log_set();
    config::set_cache_flags(cli.cache, cli.cache_disk);
    if let Err(err) = config::init(cli.config.as_deref(), cli.guest_cpu, cli.vf.clone()) {
        let err = error::LaunchError::from(err);
        eprintln!("kore-launch: error: {err}");
        std::process::exit(err.exit_code());
    }
    if let Err(err) = engine_options::init().and_then(|()| cmd::run(cli)) {
        eprintln!("kore-launch: error: {err}");
        std::process::exit(err.exit_code());
    }
}

/// Logs go to stderr; `-v` turns on info, `-vv` debug, `RUST_LOG` overrides.
/// Colour codes only when stderr is a terminal (a log file or a pipe gets plain text).
fn init_tracing(verbose: u8) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

// Here rather than in either module: error.rs does not import config (no
// circle), and config.rs compiles alone in launcher/tests/host_config.rs.
impl From<config::ConfigError> for error::LaunchError {
    fn from(err: config::ConfigError) -> Self {
        error::LaunchError::Usage(err.to_string())
    }
}
