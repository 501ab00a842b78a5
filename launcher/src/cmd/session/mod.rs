//! The seam between the chat/batch commands and whatever runs the engine: a
//! [`Backend`] opens protocol connections ([`Client`]s) that speak the
//! JSON-lines protocol of `docs/protocol.md`, whether the service runs in the
//! Kore guest (over the VM's vsock socket), in-process (`--native`), or — for
//! the launcher's own tests — on kore-service's fake engine (`KORE_LAUNCH_FAKE`).

mod appliance;
mod fake;

use std::io::{Read, Write};

use kore_protocol::{GenerateRequest, Stats};

use crate::cli::SamplingArgs;
use crate::client::{Client, Connection};
use crate::error::Result;

/// The two byte streams of one protocol connection (from / to the service).
pub type Streams = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// Something that serves the protocol: a booted VM, an attached background
/// appliance, an in-process engine, or the test fake.
pub trait Backend {
    /// Opens a new connection's byte streams (the daemon relays them).
    fn streams(&self) -> Result<Streams>;
    /// Opens a new protocol connection.
    fn connect(&self) -> Result<Client> {
        let (reader, writer) = self.streams()?;
        Ok(Client::new(Connection { reader, writer }))
    }
    /// One line saying what serves the requests (for `status` and logs).
    fn describe(&self) -> String;
    /// The VMM process's confinement, when this backend booted a VM.
    fn vmm(&self) -> Option<serde_json::Value> {
        None
    }
    /// Stops what this backend started (shuts a booted VM down cleanly);
    /// leaves an attached background appliance running.
    fn shutdown(self: Box<Self>) -> Result<()>;
}

/// Where the engine should run, from the command line.
#[derive(Debug, Clone)]
pub struct Placement {
    /// `--native`: in-process on the host.
    pub native: bool,
    /// `--model PATH`, if given.
    pub model: Option<std::path::PathBuf>,
}

/// Opens the backend for `placement`: with `--native` the engine in-process;
/// otherwise the background appliance of `kore-launch up` if one answers,
/// else the Kore VM booted for this command (`Appliance::open_for`).
/// `KORE_LAUNCH_FAKE=echo` (with an optional `KORE_LAUNCH_FAKE_DELAY_MS` per
/// engine step) selects the fake engine of the launcher's tests instead,
/// whatever the placement.
pub fn open(placement: &Placement) -> Result<Box<dyn Backend>> {
    open_with(placement, true)
}

/// Like [`open`] but never attaches to a background appliance (what the
/// `up` daemon itself runs).
pub fn open_fresh(placement: &Placement) -> Result<Box<dyn Backend>> {
    open_with(placement, false)
}

fn open_with(placement: &Placement, attach: bool) -> Result<Box<dyn Backend>> {
    let backend = match crate::env::get("KORE_LAUNCH_FAKE") {
        Some(kind) => fake::open(&kind)?,
        None => appliance::open(placement, attach)?,
    };
    tracing::info!("engine: {}", backend.describe());
    Ok(backend)
}

/// Sets the sampling flags that were given on a request that does not set
/// them itself.
pub fn add_sampling(req: &mut GenerateRequest, s: &SamplingArgs) {
    let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    req.max_tokens = req.max_tokens.or(s.max_tokens.map(small));
    req.temperature = req.temperature.or(s.temperature);
    req.top_p = req.top_p.or(s.top_p);
    req.top_k = req.top_k.or(s.top_k.map(small));
    req.min_p = req.min_p.or(s.min_p);
    req.seed = req.seed.or(s.seed);
    req.mtp = req.mtp.or(s.mtp.map(small));
    if let Some(schema) = &s.json_schema {
        let format = kore_protocol::tools::JsonSchemaFormat {
            name: None,
            description: None,
            schema: Some(schema.clone()),
            strict: Some(true),
        };
        req.response_format = Some(kore_protocol::ResponseFormat {
            kind: "json_schema".into(),
            json_schema: Some(format),
        });
    }
}

/// The status line after an answer:
/// `806 tokens at 37.9 tok/s · context 2055 of 65536 · 3.88 tokens a step`.
pub fn status_line(stats: &Stats) -> String {
    let line = format!(
        "{} tokens at {:.1} tok/s · context {} of {} · {:.2} tokens a step",
        stats.generated_tokens,
        stats.decode_tok_per_s,
        stats.context_used,
        stats.context_limit,
        stats.tokens_per_step,
    );
    match stats.cached_tokens {
        0 => line,
        c => format!("{line} · {c} of {} prompt tokens reused", stats.prompt_tokens),
    }
}
