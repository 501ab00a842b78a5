//! Qwen3.5's chat template (ChatML with `<think>` blocks), rendered straight to
//! token ids.
//!
//! The layout follows the model's published Jinja template:
//! - a leading system message: `<|im_start|>system\n{content}<|im_end|>\n`;
//! - user turns: `<|im_start|>user\n{content}<|im_end|>\n`;
//! - assistant turns after the last user query keep their reasoning as
//!   `<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>\n`;
//!   earlier assistant turns drop it: `<|im_start|>assistant\n{content}<|im_end|>\n`;
//! - consecutive tool results form one user turn of
//!   `\n<tool_response>\n{content}\n</tool_response>` blocks;
//! - the generation prompt is `<|im_start|>assistant\n<think>\n` with thinking on
//!   and `<|im_start|>assistant\n<think>\n\n</think>\n\n` with thinking off.
//!
//! Message text is stripped (as the template's `trim` does) and tokenized with
//! [`Tokenizer::encode_ordinary`]-equivalent rules: special tokens come only from
//! the template, never from what a user typed.

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Tokenizer, TokenizerError};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions; only allowed as the first message.
    System,
    /// The person.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// One chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatMessage<'a> {
    /// Who wrote it.
    pub role: Role,
    /// Its text. For an assistant message without `reasoning`, a leading
    /// `<think>...</think>` block in the text is taken as the reasoning.
    pub content: &'a str,
    /// The assistant's reasoning (`reasoning_content`), if kept separately.
    pub reasoning: Option<&'a str>,
}

impl<'a> ChatMessage<'a> {
    /// A message without separate reasoning.
    pub fn new(role: Role, content: &'a str) -> ChatMessage<'a> {
        ChatMessage { role, content, reasoning: None }
    }
}

/// Rendering options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatOptions {
    /// End with the assistant's turn opening, ready for generation.
    pub add_generation_prompt: bool,
    /// Let the model think (`<think>\n`) or skip it (`<think>\n\n</think>\n\n`).
    pub thinking: bool,
}

impl Default for ChatOptions {
    fn default() -> ChatOptions {
        ChatOptions { add_generation_prompt: true, thinking: true }
    }
}

/// One piece of the rendered chat: template text (may contain special tokens) or
/// message text (never parsed for them).
enum Part<'a> {
    Template(&'static str),
    Text(&'a str),
}

/// The Qwen3.5 chat template bound to a tokenizer's special-token ids.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    specials: Vec<(&'static str, u32)>,
}

/// Template tokens that must exist in the vocabulary as added tokens.
const TEMPLATE_TOKENS: [&str; 6] =
    ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_response>", "</tool_response>"];

impl ChatTemplate {
    /// Looks up the template's special tokens in `tokenizer`.
    pub fn new(tokenizer: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        let mut specials = Vec::new();
        for t in TEMPLATE_TOKENS {
            let id = tokenizer.token_to_id(t).ok_or_else(|| {
                TokenizerError::Chat(alloc::format!(
                    "the tokenizer has no {t} token (not a Qwen3.5 tokenizer?)"
                ))
            })?;
            specials.push((t, id));
        }
        Ok(ChatTemplate { specials })
    }

    /// Id of `<|im_end|>`, the end-of-turn token.
    pub fn im_end(&self) -> u32 {
        self.specials[1].1
    }

    /// Renders `messages` to token ids.
    pub fn render(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage<'_>],
        options: ChatOptions,
    ) -> Result<Vec<u32>, TokenizerError> {
        let holder = Owned::new(messages);
        let parts = layout(&holder, options)?;
        let mut ids = Vec::new();
        let mut text = String::new();
        for part in parts {
            match part {
                Part::Text(t) => text.push_str(t),
                Part::Template(mut t) => {
                    while !t.is_empty() {
                        let hit = self
                            .specials
                            .iter()
                            .filter_map(|&(s, id)| t.find(s).map(|at| (at, s, id)))
                            .min();
                        let Some((at, s, id)) = hit else {
                            text.push_str(t);
                            break;
                        };
                        text.push_str(&t[..at]);
                        if !text.is_empty() {
                            ids.extend(tokenizer.encode_ordinary(&text));
                            text.clear();
                        }
                        ids.push(id);
                        t = &t[at + s.len()..];
                    }
                }
            }
        }
        if !text.is_empty() {
            ids.extend(tokenizer.encode_ordinary(&text));
        }
        Ok(ids)
    }

    /// Renders `messages` as text, special tokens written out (for display and logs).
    pub fn render_text(
        messages: &[ChatMessage<'_>],
        options: ChatOptions,
    ) -> Result<String, TokenizerError> {
        let holder = Owned::new(messages);
        let mut out = String::new();
        for part in layout(&holder, options)? {
            out.push_str(match part {
                Part::Template(t) => t,
                Part::Text(t) => t,
            });
        }
        Ok(out)
    }
}

/// Messages after the template's text processing (stripping, reasoning split).
struct Owned<'a> {
    messages: Vec<(Role, &'a str, &'a str)>,
}

impl<'a> Owned<'a> {
    fn new(messages: &[ChatMessage<'a>]) -> Owned<'a> {
        let messages = messages
            .iter()
            .map(|m| {
                let content = py_strip(m.content);
                if m.role != Role::Assistant {
                    return (m.role, content, "");
                }
                match m.reasoning {
                    Some(r) => (m.role, content, py_strip(r)),
                    None => {
                        let (r, c) = split_think(content);
                        (m.role, c, py_strip(r))
                    }
                }
            })
            .collect();
        Owned { messages }
    }
}

/// `content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')` and
/// `content.split('</think>')[-1].lstrip('\n')` when the content has `</think>`.
fn split_think(content: &str) -> (&str, &str) {
    let Some(first) = content.find("</think>") else { return ("", content) };
    let before = content[..first].trim_end_matches('\n');
    let reasoning = before.rsplit("<think>").next().unwrap_or(before).trim_start_matches('\n');
    let last = content.rfind("</think>").map_or(first, |k| k);
    let after = content[last + "</think>".len()..].trim_start_matches('\n');
    (reasoning, after)
}

/// Python's `str.strip()` (Jinja's `trim`): removes the characters Python calls space.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || matches!(c, '\u{1c}'..='\u{1f}'))
}

/// Whether a user message is a wrapped tool result rather than a real query.
fn is_tool_wrapper(content: &str) -> bool {
    content.starts_with("<tool_response>") && content.ends_with("</tool_response>")
}

fn layout<'a>(m: &Owned<'a>, options: ChatOptions) -> Result<Vec<Part<'a>>, TokenizerError> {
    let msgs = &m.messages;
    if msgs.is_empty() {
        return Err(TokenizerError::Chat("no messages provided".to_string()));
    }
    let last_query = msgs
        .iter()
        .rposition(|(role, content, _)| *role == Role::User && !is_tool_wrapper(content))
        .ok_or_else(|| TokenizerError::Chat("no user query found in messages".to_string()))?;
    let mut parts = Vec::new();
    for (i, &(role, content, reasoning)) in msgs.iter().enumerate() {
        match role {
            Role::System if i != 0 => {
                return Err(TokenizerError::Chat(
                    "a system message must be the first message".to_string(),
                ))
            }
            Role::System | Role::User => {
                parts.push(Part::Template(if role == Role::System {
                    "<|im_start|>system\n"
                } else {
                    "<|im_start|>user\n"
                }));
                parts.push(Part::Text(content));
                parts.push(Part::Template("<|im_end|>\n"));
            }
            Role::Assistant => {
                if i > last_query {
                    parts.push(Part::Template("<|im_start|>assistant\n<think>\n"));
                    parts.push(Part::Text(reasoning));
                    parts.push(Part::Template("\n</think>\n\n"));
                } else {
                    parts.push(Part::Template("<|im_start|>assistant\n"));
                }
                parts.push(Part::Text(content));
                parts.push(Part::Template("<|im_end|>\n"));
            }
            Role::Tool => {
                if i == 0 || msgs[i - 1].0 != Role::Tool {
                    parts.push(Part::Template("<|im_start|>user"));
                }
                parts.push(Part::Template("\n<tool_response>\n"));
                parts.push(Part::Text(content));
                parts.push(Part::Template("\n</tool_response>"));
                if i + 1 == msgs.len() || msgs[i + 1].0 != Role::Tool {
                    parts.push(Part::Template("<|im_end|>\n"));
                }
            }
        }
    }
    if options.add_generation_prompt {
        parts.push(Part::Template(if options.thinking {
            "<|im_start|>assistant\n<think>\n"
        } else {
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        }));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_reasoning_like_the_template() {
        assert_eq!(split_think("<think>\nhmm\n</think>\n\nHi"), ("hmm", "Hi"));
        assert_eq!(split_think("plain"), ("", "plain"));
        assert_eq!(py_strip("\u{1f} x \u{3000}"), "x");
    }

    #[test]
    fn renders_text_layout() {
        let msgs = [
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, " Hi "),
            ChatMessage::new(Role::Assistant, "<think>\nplan\n</think>\n\nHello"),
            ChatMessage::new(Role::User, "Bye"),
        ];
        let off = ChatOptions { add_generation_prompt: true, thinking: false };
        assert_eq!(
            ChatTemplate::render_text(&msgs, off).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
             <|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        assert!(ChatTemplate::render_text(&msgs[..1], off).is_err());
        assert!(ChatTemplate::render_text(&[], off).is_err());
        let late_system = [msgs[1], msgs[0]];
        assert!(ChatTemplate::render_text(&late_system, off).is_err());
    }
}
