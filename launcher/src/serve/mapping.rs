//! OpenAI requests to Kore protocol requests (docs/protocol.md) and the
//! protocol's `done` events back to OpenAI answers. Pure functions: the
//! handlers and the unit tests share them.

use kore_protocol::tools::MAX_TOP_LOGPROBS;
use kore_protocol::{Finish, GenerateRequest, Message, MessageCall, Role, Stats};
use serde_json::Value;

use super::error::ApiError;
use super::tools::{answer_calls, chat_logprobs, completion_logprobs};
use super::wire::{
    Answer, AnswerMessage, ChatChoice, ChatMessage, ChatRequest, CompletionRequest, Content,
    OneOrMany, Options, Ordered, PromptDetails, TextChoice, Usage,
};
use crate::client::Done;

/// Checks `model` against the served name.
pub fn check_model(asked: &str, served: &str) -> Result<(), ApiError> {
    match asked == served {
        true => Ok(()),
        false => Err(ApiError::unknown_model(asked, served)),
    }
}

/// The protocol request for a chat request (without `id`); `ordered`: its
/// `tools` and `response_format` as written (key order kept);
/// `fallback_seed` is used when sampling without a `seed`.
pub fn chat_request(
    req: &ChatRequest,
    ordered: &Ordered,
    fallback_seed: u64,
) -> Result<GenerateRequest, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty"));
    }
    let messages = req.messages.iter().map(message).collect::<Result<Vec<Message>, ApiError>>()?;
    let mut out = GenerateRequest::chat(messages);
    let kwargs = req.chat_template_kwargs.as_ref().and_then(|k| k.enable_thinking);
    out.thinking = kwargs.or(req.enable_thinking);
    add_options(&mut out, &req.options, fallback_seed)?;
    add_tools(&mut out, &req.options, ordered)?;
    out.logprobs = chat_logprobs_wanted(&req.options)?;
    out.validate().map_err(|m| ApiError::bad_param(param_of(&m), m))?;
    Ok(out)
}

/// An OpenAI chat body's text (`model` optional here) as a protocol request,
/// greedy: what `tokenize --chat` renders. The error says what is wrong.
pub fn chat_body(text: &str) -> Result<GenerateRequest, String> {
    let mut value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    if let Value::Object(o) = &mut value {
        o.entry("model").or_insert_with(|| Value::from(""));
    }
    let req: ChatRequest =
        serde_json::from_value(value).map_err(|e| format!("not a chat request: {e}"))?;
    let ordered: Ordered = serde_json::from_str(text).map_err(|e| e.to_string())?;
    chat_request(&req, &ordered, 0).map_err(|e| e.message)
}

/// One OpenAI message as a protocol message.
fn message(m: &ChatMessage) -> Result<Message, ApiError> {
    let role = match m.role.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        other => {
            return Err(ApiError::bad_param(
                "messages",
                format!("message role `{other}` is not served (system, user, assistant, tool)"),
            ))
        }
    };
    let mut out = Message::new(role, content_text(m.content.as_ref())?);
    out.reasoning_content = m.reasoning_content.clone().filter(|r| !r.is_empty());
    out.tool_call_id = m.tool_call_id.clone();
    for c in m.tool_calls.iter().flatten() {
        let (name, arguments) = match (&c.function, &c.name) {
            (Some(f), _) => (f.name.clone(), f.arguments.clone()),
            (None, Some(n)) => (n.clone(), c.arguments.clone().unwrap_or_default()),
            (None, None) => {
                return Err(ApiError::bad_param("messages", "a tool call needs a function name"))
            }
        };
        out.tool_calls.push(MessageCall { id: c.id.clone(), name, arguments });
    }
    Ok(out)
}

/// `tools`, `tool_choice`, `parallel_tool_calls` and `response_format`.
fn add_tools(out: &mut GenerateRequest, o: &Options, ordered: &Ordered) -> Result<(), ApiError> {
    let empty =
        |t: &kore_protocol::RawJson| matches!(t.value(), Ok(Value::Array(a)) if a.is_empty());
    out.tools = ordered.tools.clone().filter(|t| !empty(t));
    out.tool_choice = o.tool_choice.clone().filter(|v| !v.is_null());
    out.parallel_tool_calls = o.parallel_tool_calls;
    if let Some(f) = &ordered.response_format {
        f.format().map_err(|m| ApiError::bad_param("response_format", m))?;
        out.response_format = Some(f.clone()).filter(|f| f.kind != "text");
    }
    // `tool_choice` `auto` or `none` without tools changes nothing.
    let idle =
        matches!(out.choice(), Ok(kore_protocol::Choice::None | kore_protocol::Choice::Auto));
    if out.tools.is_none() && idle {
        out.tool_choice = None;
    }
    Ok(())
}

/// Chat's `logprobs: true` and `top_logprobs: n` as the protocol's count.
fn chat_logprobs_wanted(o: &Options) -> Result<Option<u8>, ApiError> {
    let on = match &o.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(ApiError::bad_param("logprobs", "`logprobs` must be a boolean")),
    };
    let top = top_logprobs(o.top_logprobs, "top_logprobs")?;
    match (on, top) {
        (true, n) => Ok(Some(n)),
        (false, 0) => Ok(None),
        (false, _) => {
            Err(ApiError::bad_param("top_logprobs", "`top_logprobs` needs `logprobs: true`"))
        }
    }
}

fn top_logprobs(n: Option<u64>, name: &str) -> Result<u8, ApiError> {
    match n {
        None => Ok(0),
        Some(n) if n <= u64::from(MAX_TOP_LOGPROBS) => Ok(n as u8),
        Some(n) => Err(ApiError::bad_param(
            name,
            format!("`{name}` is {n}; at most {MAX_TOP_LOGPROBS} are served"),
        )),
    }
}

/// The request field a protocol validation message is about.
fn param_of(message: &str) -> &'static str {
    for p in ["tool_choice", "tools", "response_format", "logprobs", "messages"] {
        if message.contains(p) {
            return p;
        }
    }
    "messages"
}

/// The text of a message's content (text parts joined).
fn content_text(content: Option<&Content>) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(t)) => Ok(t.clone()),
        Some(Content::Parts(parts)) => parts
            .iter()
            .map(|p| match (p.kind.as_str(), &p.text) {
                ("text", Some(t)) => Ok(t.as_str()),
                (kind, _) => Err(ApiError::bad_param(
                    "messages",
                    format!("content part `{kind}` is not served (text only)"),
                )),
            })
            .collect::<Result<Vec<&str>, ApiError>>()
            .map(|v| v.concat()),
    }
}

/// The protocol request for a completion request (without `id`).
pub fn completion_request(
    req: &CompletionRequest,
    ordered: &Ordered,
    fallback_seed: u64,
) -> Result<GenerateRequest, ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::bad_param("echo", "`echo` is not served"));
    }
    let bad = || {
        ApiError::bad_param(
            "prompt",
            "`prompt` must be a non-empty string, a list of one string, or a list of token ids",
        )
    };
    let mut out = match &req.prompt {
        Value::String(s) if !s.is_empty() => GenerateRequest::completion(s.clone()),
        Value::Array(items) => match items.as_slice() {
            [Value::String(s)] if !s.is_empty() => GenerateRequest::completion(s.clone()),
            [] => return Err(bad()),
            ids if ids.iter().all(|v| v.as_u64().is_some_and(|n| n <= u64::from(u32::MAX))) => {
                GenerateRequest::completion_ids(
                    ids.iter().filter_map(Value::as_u64).map(|n| n as u32).collect(),
                )
            }
            [_, _, ..] if items.iter().all(Value::is_string) => {
                return Err(ApiError::bad_param("prompt", "one prompt per request is served"))
            }
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    add_options(&mut out, &req.options, fallback_seed)?;
    for (name, set) in [
        ("tools", req.options.tools.as_ref().is_some_and(|t| !t.is_empty())),
        ("tool_choice", req.options.tool_choice.as_ref().is_some_and(|v| !v.is_null())),
        ("top_logprobs", req.options.top_logprobs.is_some()),
    ] {
        if set {
            let m = format!("`{name}` applies to chat completions only");
            return Err(ApiError::bad_param(name, m));
        }
    }
    if let Some(f) = &ordered.response_format {
        f.format().map_err(|m| ApiError::bad_param("response_format", m))?;
        out.response_format = Some(f.clone()).filter(|f| f.kind != "text");
    }
    out.logprobs = match &req.options.logprobs {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(top_logprobs(n.as_u64(), "logprobs")?),
        Some(_) => {
            return Err(ApiError::bad_param("logprobs", "`logprobs` must be an integer 0..=20"))
        }
    };
    Ok(out)
}

/// Length, sampling and stop options onto a protocol request. Absent
/// options keep the protocol's defaults (greedy, up to the context limit).
fn add_options(out: &mut GenerateRequest, o: &Options, fallback_seed: u64) -> Result<(), ApiError> {
    refuse_unserved(o)?;
    let small = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    match o.max_completion_tokens.or(o.max_tokens) {
        Some(0) => {
            return Err(ApiError::bad_param("max_tokens", "`max_tokens` must be at least 1"))
        }
        n => out.max_tokens = n.map(small),
    }
    out.temperature = o.temperature.map(|t| t as f32);
    out.top_p = o.top_p.map(|p| p as f32);
    out.top_k = o.top_k.map(small);
    out.min_p = o.min_p.map(|p| p as f32);
    let sampling = o.temperature.is_some_and(|t| t > 0.0);
    out.seed = o.seed.or(sampling.then_some(fallback_seed));
    out.stop = match &o.stop {
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
        None => Vec::new(),
    };
    Ok(())
}

/// A 400 naming a field whose value would change the answer but is not
/// served (never silently ignored); defaults of such fields pass.
fn refuse_unserved(o: &Options) -> Result<(), ApiError> {
    if o.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_param("n", "only n = 1 is served"));
    }
    let nonzero = |v: &Option<f64>| v.is_some_and(|x| x != 0.0);
    for (name, set) in [
        ("presence_penalty", nonzero(&o.presence_penalty)),
        ("frequency_penalty", nonzero(&o.frequency_penalty)),
        ("repetition_penalty", o.repetition_penalty.is_some_and(|x| x != 1.0)),
        ("logit_bias", o.logit_bias.as_ref().is_some_and(|m| !m.is_empty())),
        ("functions", o.functions.as_ref().is_some_and(|t| !t.is_empty())),
        ("suffix", o.suffix.as_ref().is_some_and(|s| !s.is_empty())),
        ("best_of", o.best_of.is_some_and(|n| n != 1)),
    ] {
        if set {
            return Err(ApiError::bad_param(
                name,
                format!("`{name}` is not served yet: this server would ignore it, so it refuses"),
            ));
        }
    }
    Ok(())
}

/// OpenAI's `finish_reason` for the protocol's `finish` (`tool_calls` when
/// the answer ended with calls).
pub fn finish_reason(finish: Finish, calls: bool) -> String {
    match finish {
        Finish::Stop if calls => "tool_calls".into(),
        Finish::Length => "length".into(),
        Finish::Stop | Finish::Cancelled => "stop".into(),
    }
}

/// `usage` from the protocol's `stats`.
pub fn usage(stats: &Stats) -> Usage {
    let (prompt, completion) = (u64::from(stats.prompt_tokens), u64::from(stats.generated_tokens));
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: PromptDetails { cached_tokens: u64::from(stats.cached_tokens) },
    }
}

/// Names and times an answer.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// The answer's id.
    pub id: String,
    /// Unix time of the request.
    pub created: u64,
    /// The model's name.
    pub model: String,
}

impl Envelope {
    /// An answer of kind `object` with `choices`.
    pub fn answer<C>(&self, object: &'static str, choices: Vec<C>) -> Answer<C> {
        Answer {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
            kore_stats: None,
        }
    }
}

/// The non-streamed chat answer.
pub fn chat_answer(env: &Envelope, done: &Done) -> Answer<ChatChoice> {
    let thinking = done.thinking.as_deref().filter(|t| !t.is_empty()).map(str::to_owned);
    let calls = !done.tool_calls.is_empty();
    let text = done.text.to_string();
    let message = AnswerMessage {
        role: "assistant",
        content: if calls && text.trim().is_empty() { None } else { Some(text) },
        reasoning_content: thinking,
        tool_calls: answer_calls(&done.tool_calls),
    };
    let choice = ChatChoice {
        index: 0,
        message,
        logprobs: done.logprobs.as_deref().map(chat_logprobs),
        finish_reason: finish_reason(done.finish, calls),
    };
    let mut a = env.answer("chat.completion", vec![choice]);
    a.usage = Some(usage(&done.stats));
    a.kore_stats = Some(done.stats.clone().into_owned());
    a
}

/// The non-streamed completion answer.
pub fn completion_answer(env: &Envelope, done: &Done) -> Answer<TextChoice> {
    let choice = TextChoice {
        index: 0,
        text: done.text.to_string(),
        logprobs: done.logprobs.as_deref().map(|l| completion_logprobs(l, 0)),
        finish_reason: Some(finish_reason(done.finish, false)),
    };
    let mut a = env.answer("text_completion", vec![choice]);
    a.usage = Some(usage(&done.stats));
    a.kore_stats = Some(done.stats.clone().into_owned());
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use kore_protocol::Id;
    use serde_json::json;
    use std::borrow::Cow;

    fn chat_text(text: &str) -> Result<GenerateRequest, ApiError> {
        let req: ChatRequest = serde_json::from_str(text).expect("parses");
        let ordered: Ordered = serde_json::from_str(text).expect("parses");
        chat_request(&req, &ordered, 77)
    }

    fn chat(body: Value) -> Result<GenerateRequest, ApiError> {
        chat_text(&body.to_string())
    }

    fn completion(body: Value) -> Result<GenerateRequest, ApiError> {
        let text = body.to_string();
        let req: CompletionRequest = serde_json::from_str(&text).expect("parses");
        let ordered: Ordered = serde_json::from_str(&text).expect("parses");
        completion_request(&req, &ordered, 77)
    }

    #[test]
    fn chat_maps_roles_parts_thinking_and_options() {
        let p = chat(json!({
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": null},
            ],
            "chat_template_kwargs": {"enable_thinking": false},
            "max_tokens": 9, "max_completion_tokens": 5, "temperature": 0.5, "top_p": 0.9,
            "top_k": 20, "min_p": 0.05, "stop": "\n", "presence_penalty": 0, "user": "x",
        }))
        .unwrap();
        let messages = vec![
            Message::new(Role::System, "Be brief."),
            Message::new(Role::User, "Hi there"),
            Message::new(Role::Assistant, ""),
        ];
        assert_eq!(p.messages, Some(messages));
        assert_eq!((p.thinking, p.max_tokens, p.temperature), (Some(false), Some(5), Some(0.5)));
        assert_eq!((p.top_p, p.top_k, p.min_p), (Some(0.9), Some(20), Some(0.05)));
        assert!(p.validate().is_ok());
        assert_eq!((p.seed, p.stop), (Some(77), vec![String::from("\n")]));
    }

    #[test]
    fn greedy_requests_keep_protocol_defaults_and_explicit_seeds_win() {
        let p =
            chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})).unwrap();
        assert_eq!(p, GenerateRequest::chat(vec![Message::new(Role::User, "x")]));
        let p = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                            "temperature": 1.0, "seed": 3, "enable_thinking": true}))
        .unwrap();
        assert_eq!((p.seed, p.thinking), (Some(3), Some(true)));
    }

    #[test]
    fn chat_refuses_what_it_cannot_serve() {
        let user = json!([{"role": "user", "content": "x"}]);
        let param = |r: Result<GenerateRequest, ApiError>| r.unwrap_err().param;
        assert_eq!(param(chat(json!({"model": "m", "messages": []}))).as_deref(), Some("messages"));
        let robot = json!([{"role": "robot", "content": "x"}]);
        assert_eq!(
            param(chat(json!({"model": "m", "messages": robot}))).as_deref(),
            Some("messages")
        );
        let image = json!([{"role": "user", "content": [{"type": "image_url"}]}]);
        assert_eq!(
            param(chat(json!({"model": "m", "messages": image}))).as_deref(),
            Some("messages")
        );
        for (field, value) in [
            ("n", json!(2)),
            ("max_tokens", json!(0)),
            ("presence_penalty", json!(0.5)),
            ("logit_bias", json!({"5": 10})),
            ("logprobs", json!(3)),
            ("top_logprobs", json!(21)),
            ("tool_choice", json!("required")),
            ("tool_choice", json!("sometimes")),
            ("response_format", json!({"type": "xml"})),
            ("response_format", json!({"type": "json_schema"})),
            ("functions", json!([{"name": "f"}])),
        ] {
            let mut body = json!({"model": "m", "messages": user});
            body[field] = value;
            assert_eq!(param(chat(body)).as_deref(), Some(field), "{field}");
        }
        let defaults = json!({"model": "m", "messages": user, "tool_choice": "auto",
            "response_format": {"type": "text"}, "logprobs": false, "frequency_penalty": 0});
        assert_eq!(chat(defaults).unwrap(), chat(json!({"model": "m", "messages": user})).unwrap());
    }

    #[test]
    fn chat_maps_tools_turns_formats_and_logprobs_keeping_key_order() {
        let p = chat_text(
            r#"{"model":"m","messages":[{"role":"user","content":"w?"},
            {"role":"assistant","content":null,"reasoning_content":"hm","tool_calls":[
              {"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"z\":1,\"a\":2}"}}]},
            {"role":"tool","tool_call_id":"call_1","content":"sunny"}],
            "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
              "properties":{"z":{"type":"integer"},"a":{"type":"integer"}}}}}],
            "tool_choice":"required","parallel_tool_calls":false,"logprobs":true,"top_logprobs":4}"#,
        )
        .unwrap();
        let m = p.messages.as_ref().unwrap();
        assert_eq!((m[1].tool_calls[0].name.as_str(), m[2].role), ("f", Role::Tool));
        assert_eq!(m[1].tool_calls[0].arguments, r#"{"z":1,"a":2}"#);
        assert_eq!(m[1].reasoning_content.as_deref(), Some("hm"));
        assert_eq!(m[2].tool_call_id.as_deref(), Some("call_1"));
        let tools = p.tools.as_ref().unwrap().get();
        assert!(tools.find("\"z\"").unwrap() < tools.find("\"a\"").unwrap(), "{tools}");
        assert_eq!((p.tool_choice, p.parallel_tool_calls), (Some(json!("required")), Some(false)));
        assert_eq!(p.logprobs, Some(4));
        let p = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
            "schema": {"type": "object"}}}}))
        .unwrap();
        assert_eq!(p.response_format.unwrap().kind, "json_schema");
        let p = completion(json!({"model": "m", "prompt": "x", "logprobs": 2,
            "response_format": {"type": "json_object"}}))
        .unwrap();
        assert_eq!(
            (p.logprobs, p.response_format.unwrap().kind.as_str()),
            (Some(2), "json_object")
        );
        let e = completion(json!({"model": "m", "prompt": "x", "tools": [{"type": "function"}]}));
        assert_eq!(e.unwrap_err().param.as_deref(), Some("tools"));
    }

    #[test]
    fn completion_prompts_text_list_or_ids() {
        let p = completion(json!({"model": "m", "prompt": "Once", "stop": ["a", "b"]})).unwrap();
        assert_eq!((p.prompt.as_deref(), p.stop.len()), (Some("Once"), 2));
        let p = completion(json!({"model": "m", "prompt": ["Once"]})).unwrap();
        assert_eq!(p.prompt.as_deref(), Some("Once"));
        let p = completion(json!({"model": "m", "prompt": [1, 2, 3]})).unwrap();
        assert_eq!(p.prompt_ids, Some(vec![1, 2, 3]));
        for bad in
            [json!(""), json!([]), json!(["a", "b"]), json!([1, -2]), json!(7), json!({"x": 1})]
        {
            let e = completion(json!({"model": "m", "prompt": bad})).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("prompt")), "{bad}");
        }
        let e = completion(json!({"model": "m", "prompt": "x", "echo": true})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("echo"));
    }

    #[test]
    fn done_events_become_openai_answers() {
        let env = Envelope { id: "chatcmpl-1".into(), created: 5, model: "tiny".into() };
        let stats =
            Stats { prompt_tokens: 7, generated_tokens: 2, cached_tokens: 3, ..Stats::default() };
        let done = Done {
            id: Cow::Owned(Id::from(1)),
            done: true,
            finish: Finish::Length,
            token_ids: Cow::Owned(vec![4, 5]),
            text: "Hello".into(),
            thinking: Some("hmm".into()),
            stats: Cow::Owned(stats),
            tool_calls: Cow::Owned(Vec::new()),
            logprobs: None,
            stop_sequence: None,
        };
        let a = serde_json::to_value(chat_answer(&env, &done)).unwrap();
        assert_eq!(a["object"], "chat.completion");
        assert_eq!(
            a["choices"][0]["message"],
            json!({"role": "assistant", "content": "Hello", "reasoning_content": "hmm"})
        );
        assert_eq!(a["choices"][0]["finish_reason"], "length");
        assert_eq!(
            a["usage"],
            json!({"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                   "prompt_tokens_details": {"cached_tokens": 3}})
        );
        let c =
            serde_json::to_value(completion_answer(&env, &Done { finish: Finish::Stop, ..done }))
                .unwrap();
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["choices"][0]["text"], "Hello");
        assert_eq!(c["choices"][0]["finish_reason"], "stop");
        assert_eq!(check_model("tiny", "tiny"), Ok(()));
        assert_eq!(check_model("gpt-4o", "tiny").unwrap_err().status.as_u16(), 404);
    }
}

#[cfg(test)]
mod call_tests {
    use super::*;
    use kore_protocol::{CallOut, Id, TokenLogprob, TopLogprob};
    use serde_json::json;
    use std::borrow::Cow;

    #[test]
    fn calls_and_logprobs_become_openai_fields() {
        let env = Envelope { id: "chatcmpl-1".into(), created: 5, model: "tiny".into() };
        let call =
            CallOut { id: "call_0_0".into(), name: "f".into(), arguments: "{\"a\":1}".into() };
        let top = TopLogprob { id: 98, token: "b".into(), bytes: vec![98], logprob: -2.0 };
        let lp = TokenLogprob {
            id: 97,
            token: "a".into(),
            bytes: vec![97],
            logprob: -0.5,
            top: vec![top],
        };
        let done = Done {
            id: Cow::Owned(Id::from(1)),
            done: true,
            finish: Finish::Stop,
            token_ids: Cow::Owned(vec![97]),
            text: "".into(),
            thinking: None,
            stats: Cow::Owned(Stats::default()),
            tool_calls: Cow::Owned(vec![call]),
            logprobs: Some(Cow::Owned(vec![lp])),
            stop_sequence: None,
        };
        let a = serde_json::to_value(chat_answer(&env, &done)).unwrap();
        let c = &a["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["message"]["content"], Value::Null);
        assert_eq!(
            c["message"]["tool_calls"],
            json!([{"id": "call_0_0", "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\":1}"}}])
        );
        assert_eq!(c["logprobs"]["content"][0]["token"], "a");
        assert_eq!(c["logprobs"]["content"][0]["logprob"], -0.5);
        assert_eq!(c["logprobs"]["content"][0]["top_logprobs"][0]["bytes"], json!([98]));
        let t = serde_json::to_value(completion_answer(&env, &done)).unwrap();
        assert_eq!(t["choices"][0]["logprobs"]["tokens"], json!(["a"]));
        assert_eq!(t["choices"][0]["logprobs"]["top_logprobs"], json!([{"b": -2.0}]));
        assert_eq!(t["choices"][0]["finish_reason"], "stop");
    }
}
