//! Qwen3.5's chat template (ChatML with `<think>` blocks and Qwen3-Coder tool
//! calls), rendered straight to token ids or to text.
//!
//! The layout is the model's published Jinja template (checked byte for byte
//! against transformers' rendering of it: tests/chat_template.rs), in short:
//! - tools, when given, open the system turn: `# Tools` ... `<tools>`, one
//!   `tojson` object per line, `</tools>` and fixed instructions, then the
//!   system message's text after a blank line (if it has any);
//! - a leading system message otherwise: `<|im_start|>system\n{content}<|im_end|>\n`;
//! - user turns: `<|im_start|>user\n{content}<|im_end|>\n`;
//! - assistant turns after the last user query keep their reasoning as
//!   `<think>\n{reasoning}\n</think>\n\n` before the content; earlier ones drop
//!   it; `tool_calls` follow as `<tool_call>\n<function=NAME>\n<parameter=KEY>\n
//!   VALUE\n</parameter>\n...</function>\n</tool_call>` (strings raw, Python's
//!   `str()` of other scalars, `tojson` of objects and arrays);
//! - consecutive tool results form one user turn of
//!   `\n<tool_response>\n{content}\n</tool_response>` blocks;
//! - the generation prompt is `<|im_start|>assistant\n<think>\n` with thinking on
//!   and `<|im_start|>assistant\n<think>\n\n</think>\n\n` with thinking off.
//!
//! Message text is stripped (as the template's `trim` does) and tokenized with
//! [`Tokenizer::encode_ordinary`]-equivalent rules: special tokens come only from
//! the template, never from what a user typed, a tool's JSON or a call's values.

use alloc::string::String;
use alloc::vec::Vec;

use kore_grammar::json::Value;

use crate::chat_layout::{layout, Part};
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

/// A call the assistant made (an OpenAI `tool_calls[].function`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolCall<'a> {
    /// The function's name.
    pub name: &'a str,
    /// Its arguments: a JSON object, keys in the order they came (`None`: no
    /// parameters are rendered). Anything but an object is an error, as in
    /// the template.
    pub arguments: Option<&'a Value>,
}

/// One chat message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChatMessage<'a> {
    /// Who wrote it.
    pub role: Role,
    /// Its text. For an assistant message without `reasoning`, a leading
    /// `<think>...</think>` block in the text is taken as the reasoning.
    pub content: &'a str,
    /// The assistant's reasoning (`reasoning_content`), if kept separately.
    pub reasoning: Option<&'a str>,
    /// The assistant's tool calls, in order.
    pub tool_calls: &'a [ToolCall<'a>],
}

impl<'a> ChatMessage<'a> {
    /// A message without separate reasoning or tool calls.
    pub fn new(role: Role, content: &'a str) -> ChatMessage<'a> {
        ChatMessage { role, content, reasoning: None, tool_calls: &[] }
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

/// The Qwen3.5 chat template bound to a tokenizer's special-token ids.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    specials: Vec<(&'static str, u32)>,
}

/// Template tokens that must exist in the vocabulary as added tokens.
const TEMPLATE_TOKENS: [&str; 6] =
    ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_response>", "</tool_response>"];

/// Template tokens used when the vocabulary has them (else they are text).
const OPTIONAL_TOKENS: [&str; 2] = ["<tool_call>", "</tool_call>"];

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
        for t in OPTIONAL_TOKENS {
            if let Some(id) = tokenizer.token_to_id(t) {
                specials.push((t, id));
            }
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
        self.render_with_tools(tokenizer, messages, &[], options)
    }

    /// Renders `messages` with `tools` (each an OpenAI tool object, printed as
    /// the template's `tojson` does; none: no tools block) to token ids.
    pub fn render_with_tools(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage<'_>],
        tools: &[Value],
        options: ChatOptions,
    ) -> Result<Vec<u32>, TokenizerError> {
        let parts = layout(messages, tools, options)?;
        let mut ids = Vec::new();
        let mut text = String::new();
        for part in &parts {
            match part {
                Part::Text(t) => text.push_str(t),
                Part::Template(t) => {
                    let mut t: &str = t;
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
        Self::render_text_with_tools(messages, &[], options)
    }

    /// [`ChatTemplate::render_text`] with `tools` (see [`ChatTemplate::render_with_tools`]).
    pub fn render_text_with_tools(
        messages: &[ChatMessage<'_>],
        tools: &[Value],
        options: ChatOptions,
    ) -> Result<String, TokenizerError> {
        let mut out = String::new();
        for part in layout(messages, tools, options)? {
            out.push_str(match &part {
                Part::Template(t) => t,
                Part::Text(t) => t,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat_layout::{py_strip, split_think};

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
