//! Deterministic stand-ins for the engine, tokenizer and clock, used by this
//! crate's tests and usable by other crates' tests (launcher, e2e) that need
//! a service without a model.
//!
//! The fake tokenizer is byte-level: ids 0..=255 are bytes, followed by five
//! special tokens. The fake engine either echoes the prompt's bytes back or
//! plays a script, then repeats a filler token forever.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::Cell;

use crate::codec::{Codec, CodecError, StreamDecode};
use crate::engine::{
    BenchReport, BenchRequest, Clock, Engine, EngineError, EngineInfo, GenParams, SeqId, StepOut,
    TokenLogprobs,
};
use kore_protocol::{Message, RawJson};

/// `<|endoftext|>`.
pub const END_OF_TEXT: u32 = 256;
/// `<|im_start|>`.
pub const IM_START: u32 = 257;
/// `<|im_end|>`.
pub const IM_END: u32 = 258;
/// `<think>`.
pub const THINK_OPEN: u32 = 259;
/// `</think>`.
pub const THINK_CLOSE: u32 = 260;
/// Vocabulary size of the fake tokenizer.
pub const FAKE_VOCAB: u32 = 261;

const SPECIALS: [(u32, &str); 5] = [
    (END_OF_TEXT, "<|endoftext|>"),
    (IM_START, "<|im_start|>"),
    (IM_END, "<|im_end|>"),
    (THINK_OPEN, "<think>"),
    (THINK_CLOSE, "</think>"),
];

/// Byte-level tokenizer with a Qwen-style chat template.
#[derive(Debug, Default, Clone)]
pub struct FakeCodec;

impl FakeCodec {
    /// Ids of `s` as plain bytes (no special tokens).
    pub fn text_ids(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }
}

impl Codec for FakeCodec {
    type Decoder = FakeDecoder;

    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        let mut out = Vec::new();
        let mut rest = text;
        'outer: while !rest.is_empty() {
            for (id, s) in SPECIALS {
                if let Some(tail) = rest.strip_prefix(s) {
                    out.push(id);
                    rest = tail;
                    continue 'outer;
                }
            }
            let n = rest.chars().next().map_or(1, char::len_utf8);
            out.extend(Self::text_ids(&rest[..n]));
            rest = &rest[n..];
        }
        Ok(out)
    }

    fn render_chat(
        &self,
        messages: &[Message],
        tools: Option<&RawJson>,
        thinking: bool,
    ) -> Result<Vec<u32>, CodecError> {
        let mut out = Vec::new();
        if let Some(t) = tools {
            out.push(IM_START);
            out.extend(Self::text_ids("tools\n"));
            out.extend(Self::text_ids(t.get()));
            out.push(IM_END);
        }
        for m in messages {
            out.push(IM_START);
            out.extend(Self::text_ids(m.role.as_str()));
            out.extend(Self::text_ids("\n"));
            out.extend(Self::text_ids(&m.content));
            for c in &m.tool_calls {
                out.extend(Self::text_ids(&c.name));
                out.extend(Self::text_ids(&c.arguments));
            }
            out.push(IM_END);
            out.extend(Self::text_ids("\n"));
        }
        out.push(IM_START);
        out.extend(Self::text_ids("assistant\n"));
        out.push(THINK_OPEN);
        out.extend(Self::text_ids("\n"));
        if !thinking {
            out.extend(Self::text_ids("\n"));
            out.push(THINK_CLOSE);
            out.extend(Self::text_ids("\n\n"));
        }
        Ok(out)
    }

    fn decoder(&self) -> FakeDecoder {
        FakeDecoder::default()
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        match SPECIALS.iter().find(|(s, _)| *s == id) {
            Some((_, text)) => text.as_bytes().to_vec(),
            None => u8::try_from(id).map(|b| alloc::vec![b]).unwrap_or_default(),
        }
    }

    fn stop_ids(&self) -> &[u32] {
        &[IM_END, END_OF_TEXT]
    }

    fn think_ids(&self) -> Option<(u32, u32)> {
        Some((THINK_OPEN, THINK_CLOSE))
    }
}

/// Streaming decoder of [`FakeCodec`]: releases complete UTF-8 only.
#[derive(Debug, Default)]
pub struct FakeDecoder {
    bytes: Vec<u8>,
}

impl StreamDecode for FakeDecoder {
    fn push(&mut self, id: u32) -> String {
        match SPECIALS.iter().find(|(s, _)| *s == id) {
            Some((_, text)) => self.bytes.extend_from_slice(text.as_bytes()),
            None => self.bytes.push(u8::try_from(id).unwrap_or(b'?')),
        }
        let valid = match core::str::from_utf8(&self.bytes) {
            Ok(_) => self.bytes.len(),
            // An incomplete sequence at the end waits; an invalid one is flushed lossily.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => return self.flush(),
        };
        let out: Vec<u8> = self.bytes.drain(..valid).collect();
        String::from_utf8(out).unwrap_or_default()
    }

    fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.bytes).into_owned();
        self.bytes.clear();
        out
    }
}

/// What the fake engine generates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behaviour {
    /// The last user message's text (chat) or the prompt's plain bytes
    /// (raw), then `<|im_end|>`.
    Echo,
    /// These tokens, then `filler` forever.
    Script(Vec<u32>),
}

/// The fake engine's log-probabilities of token `t`: `-t/1000`, and as the
/// `k` alternatives `t` itself then `t+1, t+2, ...`.
pub fn fake_logprobs(t: u32, k: u8) -> TokenLogprobs {
    let logprob = -(t as f32) / 1000.0;
    let top = (0..u32::from(k)).map(|i| (t + i, logprob - i as f32)).collect();
    TokenLogprobs { token: t, logprob, top }
}

/// A deterministic engine that records how it was driven.
#[derive(Debug)]
pub struct FakeEngine {
    /// What to generate.
    pub behaviour: Behaviour,
    /// Token repeated after the script runs out.
    pub filler: u32,
    /// Steps without tokens before the first token (simulated chunked prefill).
    pub prefill_steps: u32,
    /// Return an internal error at this step index (0-based) of a request.
    pub fail_at_step: Option<u32>,
    /// Requests run together at most (default 1: one at a time).
    pub max_sequences: usize,
    /// Most requests seen running in one step.
    pub peak_batch: usize,
    /// Context limit reported by `info`.
    pub context_limit: u32,
    /// Prompt and parameters of every started request.
    pub started: Vec<(Vec<u32>, GenParams)>,
    /// Number of `finish` calls.
    pub finished: u32,
    /// Total `step` calls.
    pub steps: u64,
    runs: BTreeMap<SeqId, Run>,
}

#[derive(Debug)]
struct Run {
    output: Vec<u32>,
    pos: usize,
    step: u32,
    per_step: usize,
    logprobs: Option<u8>,
    taken: Vec<TokenLogprobs>,
}

impl FakeEngine {
    /// An engine generating `behaviour` with a context limit of `context_limit`.
    pub fn new(behaviour: Behaviour, context_limit: u32) -> Self {
        Self {
            behaviour,
            filler: u32::from(b'.'),
            prefill_steps: 0,
            fail_at_step: None,
            max_sequences: 1,
            peak_batch: 0,
            context_limit,
            started: Vec::new(),
            finished: 0,
            steps: 0,
            runs: BTreeMap::new(),
        }
    }

    /// The echo output: the last user message's text in a chat prompt, or
    /// the plain-byte tokens of a raw prompt, then `<|im_end|>`.
    fn echo(prompt: &[u32]) -> Vec<u32> {
        let user = FakeCodec::text_ids("user\n");
        let start = prompt
            .windows(user.len() + 1)
            .rposition(|w| w[0] == IM_START && w[1..] == user[..])
            .map(|i| i + 1 + user.len());
        let mut body: Vec<u32> = match start {
            Some(s) => prompt[s..].iter().copied().take_while(|&t| t != IM_END).collect(),
            None => prompt.iter().copied().filter(|&t| t < 256).collect(),
        };
        body.push(IM_END);
        body
    }
}

impl Engine for FakeEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            model: String::from("fake"),
            context_limit: self.context_limit,
            vocab_size: FAKE_VOCAB,
        }
    }

    fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    fn start(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        params: &GenParams,
    ) -> Result<u32, EngineError> {
        if self.runs.len() >= self.max_sequences || self.runs.contains_key(&seq) {
            return Err(EngineError::Internal(String::from("start past the sequence limit")));
        }
        self.started.push((prompt.to_vec(), params.clone()));
        let output = match &self.behaviour {
            Behaviour::Echo => Self::echo(prompt),
            Behaviour::Script(s) => s.clone(),
        };
        let per_step = 1 + params.mtp.unwrap_or(0) as usize;
        let logprobs = params.logprobs;
        let run = Run { output, pos: 0, step: 0, per_step, logprobs, taken: Vec::new() };
        self.runs.insert(seq, run);
        Ok(0)
    }

    fn step(&mut self, out: &mut Vec<StepOut>) {
        self.steps += 1;
        self.peak_batch = self.peak_batch.max(self.runs.len());
        let filler = self.filler;
        let (prefill, fail) = (self.prefill_steps, self.fail_at_step);
        for (&seq, run) in self.runs.iter_mut() {
            let step = run.step;
            run.step += 1;
            let result = if fail == Some(step) {
                Err(EngineError::Internal(String::from("injected failure")))
            } else {
                // The first token comes from prefill alone; drafting starts after it.
                let n = match step {
                    s if s < prefill => 0,
                    s if s == prefill => 1,
                    _ => run.per_step,
                };
                let mut tokens = Vec::with_capacity(n);
                for _ in 0..n {
                    let t = run.output.get(run.pos).copied().unwrap_or(filler);
                    tokens.push(t);
                    run.pos += 1;
                    if let Some(k) = run.logprobs {
                        run.taken.push(fake_logprobs(t, k));
                    }
                }
                Ok(tokens)
            };
            out.push(StepOut { seq, result });
        }
    }

    fn take_logprobs(&mut self, seq: SeqId) -> Vec<TokenLogprobs> {
        self.runs.get_mut(&seq).map_or_else(Vec::new, |r| core::mem::take(&mut r.taken))
    }

    fn finish(&mut self, seq: SeqId) {
        self.finished += 1;
        self.runs.remove(&seq);
    }

    fn bench(&mut self, request: &BenchRequest) -> Result<BenchReport, EngineError> {
        Ok(BenchReport {
            threads: request.threads.unwrap_or(1),
            concurrency: request.concurrency.unwrap_or(1),
            tokens_per_step: 1.0 + f64::from(request.mtp.unwrap_or(0)),
            ..BenchReport::default()
        })
    }
}

/// A clock that advances by a fixed tick at every reading.
#[derive(Debug)]
pub struct ManualClock {
    now: Cell<u64>,
    /// Nanoseconds added per reading.
    pub tick_ns: u64,
}

impl ManualClock {
    /// A clock starting at 0 advancing `tick_ns` per reading.
    pub fn new(tick_ns: u64) -> Self {
        Self { now: Cell::new(0), tick_ns }
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        let t = self.now.get() + self.tick_ns;
        self.now.set(t);
        t
    }
}
