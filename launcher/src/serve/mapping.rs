//! OpenAI requests to Kore protocol requests (docs/protocol.md) and the
//! protocol's `done` events back to OpenAI answers. Pure functions: the
//! handlers and the unit tests share them.

use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::wire::{
    Answer, AnswerMessage, ChatChoice, ChatRequest, CompletionRequest, Content, OneOrMany, Options,
    PromptDetails, TextChoice, Usage,
};
use crate::client::Done;

/// Checks `model` against the served name.
pub fn check_model(asked: &str, served: &str) -> Result<(), ApiError> {
    match asked == served {
        true => Ok(()),
        false => Err(ApiError::unknown_model(asked, served)),
    }
}

/// The protocol request for a chat request (without `id`); `fallback_seed`
/// is used when sampling without a `seed`.
pub fn chat_request(req: &ChatRequest, fallback_seed: u64) -> Result<Value, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty"));
    }
    let messages = req
        .messages
        .iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                other => {
                    return Err(ApiError::bad_param(
                        "messages",
                        format!("message role `{other}` is not served (system, user, assistant)"),
                    ))
                }
            };
            Ok(json!({"role": role, "content": content_text(m.content.as_ref())?}))
        })
        .collect::<Result<Vec<Value>, ApiError>>()?;
    let mut out = Map::new();
    out.insert("messages".into(), Value::Array(messages));
    let kwargs = req.chat_template_kwargs.as_ref().and_then(|k| k.enable_thinking);
    if let Some(thinking) = kwargs.or(req.enable_thinking) {
        out.insert("thinking".into(), thinking.into());
    }
    add_options(&mut out, &req.options, fallback_seed)?;
    Ok(Value::Object(out))
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
pub fn completion_request(req: &CompletionRequest, fallback_seed: u64) -> Result<Value, ApiError> {
    if req.echo == Some(true) {
        return Err(ApiError::bad_param("echo", "`echo` is not served"));
    }
    let bad = || {
        ApiError::bad_param(
            "prompt",
            "`prompt` must be a non-empty string, a list of one string, or a list of token ids",
        )
    };
    let mut out = Map::new();
    match &req.prompt {
        Value::String(s) if !s.is_empty() => out.insert("prompt".into(), s.clone().into()),
        Value::Array(items) => match items.as_slice() {
            [Value::String(s)] if !s.is_empty() => out.insert("prompt".into(), s.clone().into()),
            [] => return Err(bad()),
            ids if ids.iter().all(|v| v.as_u64().is_some_and(|n| n <= u64::from(u32::MAX))) => {
                out.insert("prompt_ids".into(), Value::Array(ids.to_vec()))
            }
            [_, _, ..] if items.iter().all(Value::is_string) => {
                return Err(ApiError::bad_param("prompt", "one prompt per request is served"))
            }
            _ => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    add_options(&mut out, &req.options, fallback_seed)?;
    Ok(Value::Object(out))
}

/// Length, sampling and stop options onto a protocol request. Absent
/// options keep the protocol's defaults (greedy, up to the context limit).
fn add_options(
    out: &mut Map<String, Value>,
    o: &Options,
    fallback_seed: u64,
) -> Result<(), ApiError> {
    if o.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_param("n", "only n = 1 is served"));
    }
    match o.max_completion_tokens.or(o.max_tokens) {
        Some(0) => {
            return Err(ApiError::bad_param("max_tokens", "`max_tokens` must be at least 1"))
        }
        Some(n) => drop(out.insert("max_tokens".into(), n.into())),
        None => {}
    }
    if let Some(t) = o.temperature {
        out.insert("temperature".into(), t.into());
    }
    if let Some(p) = o.top_p {
        out.insert("top_p".into(), p.into());
    }
    if let Some(k) = o.top_k {
        out.insert("top_k".into(), k.into());
    }
    if let Some(p) = o.min_p {
        out.insert("min_p".into(), p.into());
    }
    let sampling = o.temperature.is_some_and(|t| t > 0.0);
    match o.seed {
        Some(s) => drop(out.insert("seed".into(), s.into())),
        None if sampling => drop(out.insert("seed".into(), fallback_seed.into())),
        None => {}
    }
    match &o.stop {
        Some(OneOrMany::One(s)) => drop(out.insert("stop".into(), s.clone().into())),
        Some(OneOrMany::Many(v)) if !v.is_empty() => {
            drop(out.insert("stop".into(), v.clone().into()))
        }
        _ => {}
    }
    Ok(())
}

/// OpenAI's `finish_reason` for the protocol's `finish`.
pub fn finish_reason(finish: &str) -> String {
    match finish {
        "length" => "length".into(),
        _ => "stop".into(),
    }
}

/// `usage` from the protocol's `stats`.
pub fn usage(stats: &Value) -> Usage {
    let n = |k: &str| stats.get(k).and_then(Value::as_u64).unwrap_or(0);
    let (prompt, completion) = (n("prompt_tokens"), n("generated_tokens"));
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: PromptDetails { cached_tokens: n("cached_tokens") },
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
    let thinking = done.thinking.clone().filter(|t| !t.is_empty());
    let message = AnswerMessage {
        role: "assistant",
        content: done.text.clone(),
        reasoning_content: thinking,
    };
    let choice = ChatChoice { index: 0, message, finish_reason: finish_reason(&done.finish) };
    let mut a = env.answer("chat.completion", vec![choice]);
    a.usage = Some(usage(&done.stats));
    a.kore_stats = Some(done.stats.clone());
    a
}

/// The non-streamed completion answer.
pub fn completion_answer(env: &Envelope, done: &Done) -> Answer<TextChoice> {
    let choice = TextChoice {
        index: 0,
        text: done.text.clone(),
        logprobs: None,
        finish_reason: Some(finish_reason(&done.finish)),
    };
    let mut a = env.answer("text_completion", vec![choice]);
    a.usage = Some(usage(&done.stats));
    a.kore_stats = Some(done.stats.clone());
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(body: Value) -> Result<Value, ApiError> {
        let req: ChatRequest = serde_json::from_value(body).expect("parses");
        chat_request(&req, 77)
    }

    fn completion(body: Value) -> Result<Value, ApiError> {
        let req: CompletionRequest = serde_json::from_value(body).expect("parses");
        completion_request(&req, 77)
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
        assert_eq!(
            p,
            json!({
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hi there"},
                    {"role": "assistant", "content": ""},
                ],
                "thinking": false, "max_tokens": 5, "temperature": 0.5, "top_p": 0.9,
                "top_k": 20, "min_p": 0.05, "seed": 77, "stop": "\n",
            })
        );
    }

    #[test]
    fn greedy_requests_keep_protocol_defaults_and_explicit_seeds_win() {
        let p =
            chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})).unwrap();
        assert_eq!(p, json!({"messages": [{"role": "user", "content": "x"}]}));
        let p = chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
                            "temperature": 1.0, "seed": 3, "enable_thinking": true}))
        .unwrap();
        assert_eq!((p["seed"].clone(), p["thinking"].clone()), (json!(3), json!(true)));
    }

    #[test]
    fn chat_refuses_what_it_cannot_serve() {
        let user = json!([{"role": "user", "content": "x"}]);
        let param = |r: Result<Value, ApiError>| r.unwrap_err().param;
        assert_eq!(param(chat(json!({"model": "m", "messages": []}))).as_deref(), Some("messages"));
        let tool = json!([{"role": "tool", "content": "x"}]);
        assert_eq!(
            param(chat(json!({"model": "m", "messages": tool}))).as_deref(),
            Some("messages")
        );
        let image = json!([{"role": "user", "content": [{"type": "image_url"}]}]);
        assert_eq!(
            param(chat(json!({"model": "m", "messages": image}))).as_deref(),
            Some("messages")
        );
        assert_eq!(
            param(chat(json!({"model": "m", "messages": user, "n": 2}))).as_deref(),
            Some("n")
        );
        let zero = json!({"model": "m", "messages": user, "max_tokens": 0});
        assert_eq!(param(chat(zero)).as_deref(), Some("max_tokens"));
    }

    #[test]
    fn completion_prompts_text_list_or_ids() {
        let p = completion(json!({"model": "m", "prompt": "Once", "stop": ["a", "b"]})).unwrap();
        assert_eq!(p, json!({"prompt": "Once", "stop": ["a", "b"]}));
        let p = completion(json!({"model": "m", "prompt": ["Once"]})).unwrap();
        assert_eq!(p["prompt"], "Once");
        let p = completion(json!({"model": "m", "prompt": [1, 2, 3]})).unwrap();
        assert_eq!(p["prompt_ids"], json!([1, 2, 3]));
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
        let done = Done {
            id: json!(1),
            finish: "length".into(),
            token_ids: vec![4, 5],
            text: "Hello".into(),
            thinking: Some("hmm".into()),
            stats: json!({"prompt_tokens": 7, "generated_tokens": 2, "cached_tokens": 3}),
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
            serde_json::to_value(completion_answer(&env, &Done { finish: "stop".into(), ..done }))
                .unwrap();
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["choices"][0]["text"], "Hello");
        assert_eq!(c["choices"][0]["finish_reason"], "stop");
        assert_eq!(check_model("tiny", "tiny"), Ok(()));
        assert_eq!(check_model("gpt-4o", "tiny").unwrap_err().status.as_u16(), 404);
    }
}
