//! Admission of generate requests: tokenizing, the context check, the
//! sampling parameters and session fields, duplicate ids and the queue limit.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use super::{Job, JobKind, Service};
use crate::codec::{Codec, CodecError};
use crate::emit::Mode;
use crate::engine::{Clock, Engine, GenParams};
use crate::service::ConnId;
use kore_protocol::{ErrorCode, GenerateRequest, Id, Input, Message, RawJson, Role};

use super::constraint;

impl<E: Engine, C: Codec, K: Clock> Service<E, C, K> {
    /// Where a chat prompt that opens with a system message stops sharing
    /// tokens with that system message followed by an empty user message
    /// (its turn and the user turn's opening): the prefix other
    /// conversations with the same system prompt share.
    fn system_prefix(
        &self,
        m: &[Message],
        tools: Option<&RawJson>,
        thinking: bool,
        prompt: &[u32],
    ) -> Option<u32> {
        if m.len() < 2 || m[0].role != Role::System {
            return None;
        }
        let empty = Message::new(Role::User, String::new());
        let alone = self.codec.render_chat(&[m[0].clone(), empty], tools, thinking).ok()?;
        let common = alone.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        u32::try_from(common).ok().filter(|&c| c > 0 && (c as usize) < prompt.len())
    }

    pub(super) fn handle_generate(&mut self, conn: ConnId, g: GenerateRequest) {
        let key = g.id.key();
        if !self.admit(conn, &g.id, &key) {
            return;
        }
        let prompt = match self.tokenize(&g) {
            Ok(p) => p,
            Err((code, message)) => return self.send_error(conn, &g.id, code, &message),
        };
        let limit = self.info.context_limit;
        let len = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
        if len >= limit {
            let message = format!(
                "prompt is {len} tokens but the context limit is {limit} \
                 (prompt plus at least one generated token); shorten the prompt"
            );
            return self.send_error(conn, &g.id, ErrorCode::PromptTooLong, &message);
        }
        let room = limit - len;
        let input = g.input();
        let mode = match input {
            Some(Input::Messages(_)) => Mode::chat(self.codec.think_ids(), &prompt),
            _ => Mode::Raw,
        };
        let think = matches!(mode, Mode::Chat { start_thinking: true, .. });
        let constraint = match constraint::build(&g, think) {
            Ok(c) => c,
            Err(message) => return self.send_error(conn, &g.id, ErrorCode::BadRequest, &message),
        };
        let checkpoint_at = match (&mode, self.codec.think_ids()) {
            (Mode::Chat { .. }, Some((open, _))) => generation_think(&prompt, open),
            _ => None,
        };
        let params = GenParams {
            max_tokens: g.max_tokens.map_or(room, |m| m.min(room)),
            temperature: g.temperature.unwrap_or(0.0),
            top_p: g.top_p.unwrap_or(1.0),
            top_k: g.top_k.unwrap_or(0),
            min_p: g.min_p.unwrap_or(0.0),
            seed: g.seed.unwrap_or(0),
            mtp: g.mtp,
            shared_at: match (input, &g.session) {
                (Some(Input::Messages(m)), Some(_)) => {
                    self.system_prefix(m, g.tools.as_ref(), g.thinking_on(), &prompt)
                }
                _ => None,
            },
            session: g.session,
            checkpoint_at,
            boundaries: self.codec.boundaries(&prompt),
            constraint: constraint.grammar,
            logprobs: g.logprobs,
        };
        let tools = constraint.tools;
        let kind = JobKind::Generate { prompt, params, mode, stop: g.stop, tools };
        self.push_job(conn, g.id, key, kind);
    }

    /// Duplicate-id and queue-capacity checks; sends the error on refusal.
    fn admit(&mut self, conn: ConnId, id: &Id, key: &str) -> bool {
        let duplicate =
            !id.is_null() && self.conns.get(&conn).is_some_and(|c| c.has_in_flight(key));
        if duplicate {
            let message = "a request with this id is already queued or running on this \
                           connection; use a new id";
            self.send_error(conn, id, ErrorCode::DuplicateId, message);
            return false;
        }
        if self.queue.len() >= self.config.queue_limit {
            let message = format!(
                "request queue is full ({} waiting); retry after a request finishes",
                self.config.queue_limit
            );
            self.send_error(conn, id, ErrorCode::Overloaded, &message);
            return false;
        }
        true
    }

    pub(super) fn enqueue(&mut self, conn: ConnId, id: Id, kind: JobKind) {
        let key = id.key();
        if self.admit(conn, &id, &key) {
            self.push_job(conn, id, key, kind);
        }
    }

    fn push_job(&mut self, conn: ConnId, id: Id, key: String, kind: JobKind) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.add_in_flight(key.clone());
            self.queue.push_back(Job { conn, id, key, kind });
        }
    }

    fn tokenize(&self, g: &GenerateRequest) -> Result<Vec<u32>, (ErrorCode, String)> {
        let ids = match g.input() {
            Some(Input::Messages(m)) => {
                self.codec.render_chat(m, g.tools.as_ref(), g.thinking_on())
            }
            Some(Input::Prompt(p)) => self.codec.encode(p),
            None => Err(CodecError::Unsupported(String::from("the request has no single input"))),
            Some(Input::PromptIds(ids)) => {
                let vocab = self.info.vocab_size;
                if let Some(bad) = ids.iter().find(|&&t| t >= vocab) {
                    let m = format!("prompt_ids contains {bad}, outside the vocabulary 0..{vocab}");
                    return Err((ErrorCode::BadRequest, m));
                }
                Ok(ids.to_vec())
            }
        };
        match ids {
            Ok(ids) if ids.is_empty() => {
                Err((ErrorCode::BadRequest, String::from("the prompt encodes to no tokens")))
            }
            Ok(ids) => Ok(ids),
            Err(CodecError::Unsupported(e)) => Err((ErrorCode::BadRequest, e)),
            Err(CodecError::Failed(e)) => {
                Err((ErrorCode::Internal, format!("tokenizer failed: {e}")))
            }
        }
    }
}

/// Where a chat prompt's generation prompt opens its `<think>` block (within
/// its last 8 tokens): earlier turns render without it, so a session keeps a
/// checkpoint just before it.
fn generation_think(prompt: &[u32], open: u32) -> Option<u32> {
    let from = prompt.len().saturating_sub(8);
    let at = prompt[from..].iter().rposition(|&t| t == open)?;
    u32::try_from(from + at).ok().filter(|&p| p > 0)
}
