//! `kore-launch serve`: the OpenAI-compatible HTTP server and web chat over
//! the appliance (booted for it, the one `kore-launch up` runs, or the
//! service in-process with `--native`). Loopback by default; any other
//! address needs `--api-key`.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use crate::appliance::Appliance;
use crate::cli::ServeArgs;
use crate::error::{LaunchError, Result};
use crate::serve::{self, AppState};

/// Runs `serve` until Ctrl-C or SIGTERM; then stops what it started.
pub fn run(args: ServeArgs) -> Result<()> {
    let addr = address(&args.host, args.port)?;
    let key = args.api_key.clone().filter(|k| !k.is_empty());
    if serve::needs_key(&addr) && key.is_none() {
        return Err(LaunchError::Usage(format!(
            "--host {}: not a loopback address, so the API needs a key: give --api-key KEY \
             (or KORE_API_KEY); clients send it as `Authorization: Bearer KEY`",
            args.host
        )));
    }
    let (appliance, _path) = Appliance::open_for(args.model.as_deref(), args.native, true)?;
    tracing::info!("serving the {} appliance", appliance.placement());
    let state = AppState::new(appliance, key)?;
    serve::run(state, addr)
}

/// `host:port` as a socket address (`localhost` and names resolve).
fn address(host: &str, port: u16) -> Result<SocketAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| LaunchError::Usage(format!("--host {host}: not an address or a known name")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_only_loopback_goes_without_key() {
        assert!(!serve::needs_key(&address("127.0.0.1", 8080).unwrap()));
        assert!(!serve::needs_key(&address("::1", 8080).unwrap()));
        assert!(!serve::needs_key(&address("localhost", 1).unwrap()));
        assert!(serve::needs_key(&address("0.0.0.0", 8080).unwrap()));
        assert!(serve::needs_key(&address("192.0.2.7", 8080).unwrap()));
        assert!(address("no such host.invalid", 1).is_err());
    }
}
