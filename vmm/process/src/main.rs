//! `kore-vmm`: the confined VMM process. `kore-launch` starts it with a spec on
//! stdin; see the library ([`kore_vmm_process`]) and docs/vmm.md.

use std::io::IsTerminal;

fn main() {
    if std::env::args_os().len() > 1 || std::io::stdin().is_terminal() {
        eprintln!(
            "kore-vmm is the VMM process that kore-launch starts: it takes no arguments and \
             reads its spec (JSON) on stdin; run `kore-launch` instead"
        );
        std::process::exit(2);
    }
    init_tracing();
    if let Err(e) = kore_vmm_process::run(std::io::stdin().lock()) {
        eprintln!("kore-vmm: error: {e}");
        std::process::exit(2);
    }
}

/// Logs go to stderr (shared with kore-launch): `RUST_LOG` or warnings only,
/// colour codes only on a terminal.
fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}
