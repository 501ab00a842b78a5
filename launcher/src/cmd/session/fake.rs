//! The launcher's test backend (`KORE_LAUNCH_FAKE`): kore-service's real
//! protocol code in-process on its byte-level fake tokenizer and a scripted
//! engine, so chat and batch can be tested without a model or a VM.
//!
//! - `echo`: answers with the last user message (or the raw prompt); with
//!   thinking on it first thinks `Thinking about: <message>`.
//! - `KORE_LAUNCH_FAKE_DELAY_MS=N` sleeps N ms per engine step, and a message
//!   starting with `forever` makes the answer repeat until `max_tokens`
//!   (for Ctrl-C tests).

use std::time::Duration;

use kore_service::fake::{
    Behaviour, FakeCodec, FakeEngine, IM_END, IM_START, THINK_CLOSE, THINK_OPEN,
};
use kore_service::host::{ServiceHandle, StdClock};
use kore_service::{Config, Engine, EngineError, EngineInfo, GenParams, SeqId, Service, StepOut};

use super::{Backend, Streams};
use crate::error::{LaunchError, Result};

/// Context limit the fake reports.
const FAKE_CONTEXT: u32 = 65536;

/// Opens the fake backend named `kind`.
pub fn open(kind: &str) -> Result<Box<dyn Backend>> {
    if kind != "echo" {
        return Err(LaunchError::Usage(format!("KORE_LAUNCH_FAKE={kind}: only `echo` exists")));
    }
    let delay = crate::env::get("KORE_LAUNCH_FAKE_DELAY_MS")
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_millis);
    let handle = ServiceHandle::spawn(move || {
        let engine =
            ScriptedEngine { inner: FakeEngine::new(Behaviour::Echo, FAKE_CONTEXT), delay };
        Service::new(engine, FakeCodec, StdClock::new(), Config::default())
    })
    .map_err(|source| LaunchError::Start { what: "the fake service", source })?;
    Ok(Box::new(FakeBackend { handle }))
}

struct FakeBackend {
    handle: ServiceHandle,
}

impl Backend for FakeBackend {
    fn streams(&self) -> Result<Streams> {
        let (reader, writer) = self.handle.connect().into_split();
        Ok((Box::new(reader), Box::new(writer)))
    }

    fn describe(&self) -> String {
        "fake engine (KORE_LAUNCH_FAKE, tests only)".into()
    }

    fn shutdown(self: Box<Self>) -> Result<()> {
        self.handle.shutdown();
        Ok(())
    }
}

/// Decides each request's script, then lets [`FakeEngine`] play it.
struct ScriptedEngine {
    inner: FakeEngine,
    delay: Duration,
}

impl ScriptedEngine {
    fn script(prompt: &[u32]) -> Vec<u32> {
        let text = |s: &str| FakeCodec::text_ids(s);
        let user = text("user\n");
        let start = prompt
            .windows(user.len() + 1)
            .rposition(|w| w[0] == IM_START && w[1..] == user[..])
            .map(|i| i + 1 + user.len());
        let Some(start) = start else {
            let mut out: Vec<u32> = prompt.iter().copied().filter(|&t| t < 256).collect();
            out.push(IM_END);
            return out;
        };
        let msg: Vec<u32> = prompt[start..].iter().copied().take_while(|&t| t != IM_END).collect();
        let thinking = prompt.ends_with(&[THINK_OPEN, u32::from(b'\n')]);
        let mut out = Vec::new();
        if thinking {
            out.extend(text("Thinking about: "));
            out.extend(&msg);
            out.push(THINK_CLOSE);
            out.extend(text("\n\n"));
        }
        if msg.starts_with(&text("forever")) {
            for _ in 0..100_000 {
                out.extend(&msg);
                out.push(u32::from(b' '));
            }
        } else {
            out.extend(&msg);
        }
        out.push(IM_END);
        out
    }
}

impl Engine for ScriptedEngine {
    fn info(&self) -> EngineInfo {
        self.inner.info()
    }

    fn start(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        params: &GenParams,
    ) -> std::result::Result<u32, EngineError> {
        self.inner.behaviour = Behaviour::Script(Self::script(prompt));
        self.inner.start(seq, prompt, params)
    }

    fn step(&mut self, out: &mut Vec<StepOut>) {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        self.inner.step(out)
    }

    fn finish(&mut self, seq: SeqId) {
        self.inner.finish(seq);
    }
}
