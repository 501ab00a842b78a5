//! [`TokenizerCodec`]: `kore_service::Codec` over kore-tokenizer (or, for a
//! model directory without one, over token ids alone).
//!
//! The tokenizer is shared through an [`Arc`], so the streaming decoder the
//! service keeps per request ([`OwnedDecoder`]) holds its own handle instead
//! of borrowing the codec (the service stores decoders next to the codec, so
//! a borrow would make it self-referential).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;

use kore_grammar::json::Value;
use kore_service::protocol::RawJson;
use kore_service::{Codec, CodecError, Message, Role, StreamDecode};
use kore_tokenizer::{ChatOptions, ChatTemplate, Tokenizer, ToolCall, Utf8Stream};

/// The served model's tokenizer, chat template and stop ids.
#[derive(Debug, Clone)]
pub struct TokenizerCodec {
    tokenizer: Option<Arc<Tokenizer>>,
    /// The chat template, or why the tokenizer cannot render chats.
    template: Result<ChatTemplate, String>,
    stop_ids: Vec<u32>,
    think: Option<(u32, u32)>,
    /// `<|im_start|>`, where every chat message begins.
    im_start: Option<u32>,
}

impl TokenizerCodec {
    /// A codec over `tokenizer` whose generations end at `stop_ids` (see
    /// [`crate::stop_ids`]). A tokenizer without the Qwen3.5 chat tokens still
    /// serves raw prompts; chat requests then fail with a clear message.
    pub fn new(tokenizer: Arc<Tokenizer>, stop_ids: Vec<u32>) -> Self {
        let template = ChatTemplate::new(&tokenizer).map_err(|e| e.to_string());
        let think = tokenizer.token_to_id("<think>").zip(tokenizer.token_to_id("</think>"));
        let im_start = tokenizer.token_to_id("<|im_start|>");
        Self { tokenizer: Some(tokenizer), template, stop_ids, think, im_start }
    }

    /// A codec for a model without a tokenizer: it serves `prompt_ids` only
    /// (text prompts and chats are refused, saying so) and streams no text.
    pub fn ids_only(stop_ids: Vec<u32>) -> Self {
        let template = Err(String::from("the model has no tokenizer"));
        Self { tokenizer: None, template, stop_ids, think: None, im_start: None }
    }

    /// The shared tokenizer, if the model has one.
    pub fn tokenizer(&self) -> Option<&Arc<Tokenizer>> {
        self.tokenizer.as_ref()
    }
}

fn role(r: Role) -> kore_tokenizer::Role {
    match r {
        Role::System => kore_tokenizer::Role::System,
        Role::User => kore_tokenizer::Role::User,
        Role::Assistant => kore_tokenizer::Role::Assistant,
        Role::Tool => kore_tokenizer::Role::Tool,
    }
}

/// A request's tools and its messages' call arguments, parsed keeping key
/// order (the template prints them as written).
struct Parsed {
    tools: Vec<Value>,
    /// Per message, its calls' (name, arguments).
    args: Vec<Vec<Value>>,
}

fn bad(what: &str, e: impl core::fmt::Display) -> CodecError {
    CodecError::Unsupported(format!("{what}: {e}"))
}

fn parse_parts(messages: &[Message], tools: Option<&RawJson>) -> Result<Parsed, CodecError> {
    let tools = match tools {
        None => Vec::new(),
        Some(t) => match Value::parse(t.get()).map_err(|e| bad("\"tools\"", e))? {
            Value::Array(list) => list,
            _ => return Err(bad("\"tools\"", "must be an array")),
        },
    };
    let mut args = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let mut calls = Vec::with_capacity(m.tool_calls.len());
        for (j, c) in m.tool_calls.iter().enumerate() {
            let what = format!("messages[{i}].tool_calls[{j}].arguments");
            match Value::parse(&c.arguments).map_err(|e| bad(&what, e))? {
                v @ Value::Object(_) => calls.push(v),
                _ => return Err(bad(&what, "must be the JSON text of an object")),
            }
        }
        args.push(calls);
    }
    Ok(Parsed { tools, args })
}

impl Codec for TokenizerCodec {
    type Decoder = OwnedDecoder;

    fn encode(&self, text: &str) -> Result<Vec<u32>, CodecError> {
        let tokenizer = self.tokenizer.as_ref().ok_or_else(|| {
            CodecError::Unsupported(String::from(
                "the model has no tokenizer (no tokenizer.json), so text cannot be tokenized; \
                 send token ids (`prompt_ids`, `--prompt-ids`)",
            ))
        })?;
        Ok(tokenizer.encode(text))
    }

    fn render_chat(
        &self,
        messages: &[Message],
        tools: Option<&RawJson>,
        thinking: bool,
    ) -> Result<Vec<u32>, CodecError> {
        let (Some(tokenizer), Ok(template)) = (&self.tokenizer, &self.template) else {
            let why = self.template.as_ref().err().map_or("", String::as_str);
            return Err(CodecError::Unsupported(format!(
                "this model cannot chat ({why}); send a raw `prompt` or `prompt_ids` instead"
            )));
        };
        let parsed = parse_parts(messages, tools)?;
        let calls: Vec<Vec<ToolCall<'_>>> = messages
            .iter()
            .zip(&parsed.args)
            .map(|(m, args)| {
                let named = m.tool_calls.iter().zip(args);
                named.map(|(c, a)| ToolCall { name: &c.name, arguments: Some(a) }).collect()
            })
            .collect();
        let msgs: Vec<kore_tokenizer::ChatMessage<'_>> = messages
            .iter()
            .zip(&calls)
            .map(|(m, calls)| kore_tokenizer::ChatMessage {
                role: role(m.role),
                content: &m.content,
                reasoning: m.reasoning_content.as_deref(),
                tool_calls: calls,
            })
            .collect();
        let options = ChatOptions { add_generation_prompt: true, thinking };
        // The template's own refusals (a system message not first, a call
        // whose arguments are no object) are the request's fault.
        template
            .render_with_tools(tokenizer, &msgs, &parsed.tools, options)
            .map_err(|e| CodecError::Unsupported(e.to_string()))
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        let t = self.tokenizer.as_ref();
        t.and_then(|t| t.token_bytes(id)).map(<[u8]>::to_vec).unwrap_or_default()
    }

    fn decoder(&self) -> OwnedDecoder {
        OwnedDecoder { tokenizer: self.tokenizer.clone(), bytes: Utf8Stream::default() }
    }

    fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    fn think_ids(&self) -> Option<(u32, u32)> {
        self.think
    }

    /// Every `<|im_start|>` after the first token opens a message (the
    /// template's, or one written into a raw prompt): the previous message
    /// ends just before it.
    fn boundaries(&self, prompt: &[u32]) -> Vec<u32> {
        let Some(open) = self.im_start else { return Vec::new() };
        let at = prompt.iter().enumerate().skip(1).filter(|&(_, &t)| t == open);
        at.filter_map(|(i, _)| u32::try_from(i).ok()).collect()
    }
}

/// Streaming decoder owning a handle to the tokenizer: text comes out in
/// whole UTF-8 characters, and everything pushed and flushed concatenates to
/// [`Tokenizer::decode`] of the same ids (special tokens included, as
/// `decode` keeps them; the service never pushes think markers or stop ids).
#[derive(Debug)]
pub struct OwnedDecoder {
    tokenizer: Option<Arc<Tokenizer>>,
    bytes: Utf8Stream,
}

impl OwnedDecoder {
    /// A decoder with nothing buffered.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        Self { tokenizer: Some(tokenizer), bytes: Utf8Stream::default() }
    }
}

impl StreamDecode for OwnedDecoder {
    fn push(&mut self, id: u32) -> String {
        // Ids past the tokenizer (a model vocabulary padded beyond it)
        // decode to nothing, as `Tokenizer::decode` does.
        let bytes = self.tokenizer.as_ref().and_then(|t| t.token_bytes(id)).unwrap_or_default();
        self.bytes.push(bytes).unwrap_or_default()
    }

    fn flush(&mut self) -> String {
        self.bytes.flush().unwrap_or_default()
    }
}
