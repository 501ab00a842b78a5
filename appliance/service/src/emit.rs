//! Turns generated tokens into streamed text: decodes incrementally, splits
//! chat output into thinking and answer phases at the `<think>`/`</think>`
//! markers (which are never emitted as text), trims the whitespace around
//! phase boundaries in chat mode, and applies stop strings without ever
//! streaming text that a stop string later cuts off.

use alloc::string::String;
use alloc::vec::Vec;

use crate::calls::Calls;
use crate::codec::StreamDecode;
use kore_protocol::{CallDelta, CallOut, Phase};

/// How a request's output is presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Raw completion: all text is `answer`, exactly the decoded tokens.
    Raw,
    /// Chat: think markers split phases; leading whitespace of each phase and
    /// trailing whitespace of each phase are not emitted.
    Chat {
        /// `<think>` and `</think>` ids, if the model has them.
        think: Option<(u32, u32)>,
        /// The prompt ends inside an open `<think>` block.
        start_thinking: bool,
    },
}

impl Mode {
    /// Chat mode for `prompt`: output starts in the thinking phase when the
    /// last think marker in the prompt is an opening one.
    pub fn chat(think: Option<(u32, u32)>, prompt: &[u32]) -> Mode {
        let start_thinking = think.is_some_and(|(open, close)| {
            prompt.iter().rev().find(|&&t| t == open || t == close) == Some(&open)
        });
        Mode::Chat { think, start_thinking }
    }
}

/// Whitespace trimming state of one phase.
#[derive(Debug, Default)]
struct Trim {
    started: bool,
    pending: String,
}

impl Trim {
    /// Returns the part of `s` that can be emitted now.
    fn apply(&mut self, s: &str) -> String {
        let s = if self.started { s } else { s.trim_start() };
        if s.is_empty() {
            return String::new();
        }
        self.started = true;
        let t = s.trim_end();
        if t.is_empty() {
            self.pending.push_str(s);
            return String::new();
        }
        let mut out = core::mem::take(&mut self.pending);
        out.push_str(t);
        self.pending.push_str(&s[t.len()..]);
        out
    }
}

/// Deltas produced by one call, merged per phase, in order.
pub type Deltas = Vec<(Phase, String)>;

fn emit(out: &mut Deltas, phase: Phase, s: &str) {
    if s.is_empty() {
        return;
    }
    match out.last_mut() {
        Some((p, text)) if *p == phase => text.push_str(s),
        _ => out.push((phase, String::from(s))),
    }
}

/// Streaming text state of one request.
#[derive(Debug)]
pub struct Emitter<D> {
    decoder: D,
    mode: Mode,
    phase: Phase,
    stop: Vec<String>,
    think_trim: Trim,
    answer_trim: Trim,
    held: String,
    text: String,
    thinking: String,
    stopped: bool,
    /// Which of `stop` ended the answer.
    matched: Option<usize>,
    calls: Option<Calls>,
}

impl<D: StreamDecode> Emitter<D> {
    /// A new emitter decoding with `decoder`.
    pub fn new(decoder: D, mode: Mode, stop: Vec<String>) -> Self {
        let phase = match mode {
            Mode::Chat { start_thinking: true, .. } => Phase::Thinking,
            _ => Phase::Answer,
        };
        Self {
            decoder,
            mode,
            phase,
            stop,
            think_trim: Trim::default(),
            answer_trim: Trim::default(),
            held: String::new(),
            text: String::new(),
            thinking: String::new(),
            stopped: false,
            matched: None,
            calls: None,
        }
    }

    /// Parses the answer as text followed by tool calls (requests with
    /// `tools`): the calls leave the answer text and come out as
    /// [`Emitter::take_calls`] pieces and [`Emitter::calls`].
    pub fn with_calls(mut self, calls: Calls) -> Self {
        self.calls = Some(calls);
        self
    }

    /// Tool-call pieces produced since the last call (streamed after the
    /// text deltas of the same push).
    pub fn take_calls(&mut self) -> Vec<CallDelta<'static>> {
        self.calls.as_mut().map_or_else(Vec::new, Calls::take_pending)
    }

    /// The complete tool calls.
    pub fn calls(&self) -> &[CallOut] {
        self.calls.as_ref().map_or(&[], Calls::calls)
    }

    /// The answer text emitted so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The thinking text emitted so far.
    pub fn thinking(&self) -> &str {
        &self.thinking
    }

    /// Whether a stop string ended the answer.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The stop string that ended the answer, if one did.
    pub fn stop_match(&self) -> Option<&str> {
        self.matched.map(|i| self.stop[i].as_str())
    }

    /// Adds one generated token; returns true once a stop string matched
    /// (the request must then end; later tokens are ignored).
    pub fn push(&mut self, id: u32, out: &mut Deltas) -> bool {
        if self.stopped {
            return true;
        }
        if let Mode::Chat { think: Some((open, close)), .. } = self.mode {
            if id == open || id == close {
                let rest = self.decoder.flush();
                self.add(&rest, out);
                if self.phase == Phase::Thinking {
                    self.think_trim = Trim::default();
                }
                self.phase = if id == open { Phase::Thinking } else { Phase::Answer };
                return self.stopped;
            }
        }
        let s = self.decoder.push(id);
        self.add(&s, out);
        self.stopped
    }

    /// Flushes everything still held back at the end of the request.
    pub fn finish(&mut self, out: &mut Deltas) {
        if !self.stopped {
            let rest = self.decoder.flush();
            self.add(&rest, out);
        }
        if !self.stopped && !self.held.is_empty() {
            let held = core::mem::take(&mut self.held);
            self.release(&held, out);
        }
        if let Some(c) = self.calls.as_mut() {
            let rest = c.finish();
            self.text.push_str(&rest);
            emit(out, Phase::Answer, &rest);
        }
    }

    /// Answer text that no stop string can cut any more.
    fn release(&mut self, s: &str, out: &mut Deltas) {
        let plain;
        let s = match self.calls.as_mut() {
            Some(c) => {
                plain = c.push(s);
                plain.as_str()
            }
            None => s,
        };
        self.text.push_str(s);
        emit(out, Phase::Answer, s);
    }

    fn add(&mut self, s: &str, out: &mut Deltas) {
        if s.is_empty() || self.stopped {
            return;
        }
        let chat = matches!(self.mode, Mode::Chat { .. });
        match self.phase {
            Phase::Thinking => {
                let e = self.think_trim.apply(s);
                self.thinking.push_str(&e);
                emit(out, Phase::Thinking, &e);
            }
            Phase::Answer if chat => {
                let e = self.answer_trim.apply(s);
                self.answer(&e, out);
            }
            Phase::Answer => self.answer(s, out),
        }
    }

    fn answer(&mut self, s: &str, out: &mut Deltas) {
        self.held.push_str(s);
        if let Some((pos, which)) = self.first_stop_match() {
            let before = String::from(&self.held[..pos]);
            self.held.clear();
            self.release(&before, out);
            self.stopped = true;
            self.matched = Some(which);
            return;
        }
        let keep_from = self.stop_prefix_start();
        let ready: String = self.held.drain(..keep_from).collect();
        self.release(&ready, out);
    }

    /// The earliest stop match in `held`: its position and which string.
    fn first_stop_match(&self) -> Option<(usize, usize)> {
        self.stop
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((self.held.find(s.as_str())?, i)))
            .min()
    }

    /// Start of the longest suffix of `held` that could still grow into a
    /// stop string (`held.len()` if none).
    fn stop_prefix_start(&self) -> usize {
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        let lo = self.held.len().saturating_sub(longest.saturating_sub(1));
        (lo..self.held.len())
            .filter(|&i| self.held.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.held[i..];
                self.stop.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeCodec, FakeDecoder, THINK_CLOSE, THINK_OPEN};
    use alloc::vec;

    fn run(mode: Mode, stop: &[&str], ids: &[u32]) -> (Deltas, String, String, bool) {
        let mut e = Emitter::new(
            FakeDecoder::default(),
            mode,
            stop.iter().map(|s| String::from(*s)).collect(),
        );
        let mut out = Deltas::new();
        for &id in ids {
            if e.push(id, &mut out) {
                break;
            }
        }
        e.finish(&mut out);
        (out, e.text.clone(), e.thinking.clone(), e.stopped)
    }

    fn ids(s: &str) -> Vec<u32> {
        FakeCodec::text_ids(s)
    }

    #[test]
    fn raw_mode_is_exact() {
        let (out, text, _, _) = run(Mode::Raw, &[], &ids("  a b \n"));
        assert_eq!(text, "  a b \n");
        assert_eq!(out, vec![(Phase::Answer, String::from("  a b \n"))]);
    }

    #[test]
    fn chat_splits_phases_and_drops_markers() {
        let mut t = vec![THINK_OPEN];
        t.extend(ids("\nhmm\n"));
        t.push(THINK_CLOSE);
        t.extend(ids("\n\nAnswer. "));
        let mode = Mode::chat(Some((THINK_OPEN, THINK_CLOSE)), &[1, 2]);
        let (out, text, thinking, _) = run(mode, &[], &t);
        assert_eq!(thinking, "hmm");
        assert_eq!(text, "Answer.");
        let phases: Vec<Phase> = out.iter().map(|d| d.0).collect();
        assert_eq!(phases, [Phase::Thinking, Phase::Answer]);
    }

    #[test]
    fn prompt_ending_in_think_starts_thinking() {
        let mode = Mode::chat(Some((THINK_OPEN, THINK_CLOSE)), &[5, THINK_OPEN, 10]);
        let mut t = ids("x");
        t.push(THINK_CLOSE);
        t.extend(ids("y"));
        let (_, text, thinking, _) = run(mode, &[], &t);
        assert_eq!((thinking.as_str(), text.as_str()), ("x", "y"));
        let closed = Mode::chat(Some((THINK_OPEN, THINK_CLOSE)), &[THINK_OPEN, THINK_CLOSE, 10]);
        assert_eq!(
            closed,
            Mode::Chat { think: Some((THINK_OPEN, THINK_CLOSE)), start_thinking: false }
        );
    }

    #[test]
    fn stop_strings_cut_and_never_leak() {
        let (out, text, _, stopped) = run(Mode::Raw, &["END"], &ids("abcENDxyz"));
        assert!(stopped);
        assert_eq!(text, "abc");
        let streamed: String = out.iter().map(|d| d.1.as_str()).collect();
        assert_eq!(streamed, "abc");
        // A partial match at the end is released when generation ends.
        let (_, text, _, stopped) = run(Mode::Raw, &["END"], &ids("abcEN"));
        assert!(!stopped);
        assert_eq!(text, "abcEN");
        // Multi-byte text next to stop strings.
        let (_, text, _, _) = run(Mode::Raw, &["é!"], &ids("ééé!z"));
        assert_eq!(text, "éé");
    }

    #[test]
    fn the_earliest_stop_match_is_reported() {
        let stop = vec![String::from("ZZ"), String::from("cE"), String::from("none")];
        let mut e = Emitter::new(FakeDecoder::default(), Mode::Raw, stop);
        let mut out = Deltas::new();
        assert_eq!(e.stop_match(), None);
        for id in ids("abcEZZ") {
            if e.push(id, &mut out) {
                break;
            }
        }
        assert_eq!((e.text(), e.stop_match()), ("ab", Some("cE")));
    }
}
