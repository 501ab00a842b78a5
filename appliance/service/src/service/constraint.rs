//! The constraint of a generate request: `tools` (unless `tool_choice` is
//! `none`) become a kore-grammar tool-call grammar (free text then calls for
//! `auto`, calls only for `required` or a named function), `response_format`
//! a JSON object or JSON Schema grammar. Errors name what to fix (an
//! unsupported schema keyword, a bad tool) and are answered `bad_request`.

use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;

use kore_grammar::json::Value;
use kore_grammar::{Grammar, Options, ToolChoice, ToolSet};
use kore_protocol::{Choice, Format, GenerateRequest};

/// What a request constrains: the grammar, and the tools whose calls its
/// answer is parsed for.
#[derive(Debug, Default)]
pub(super) struct Constraint {
    pub(super) grammar: Option<Arc<Grammar>>,
    pub(super) tools: Option<ToolSet>,
}

fn parse(what: &str, text: &str) -> Result<Value, String> {
    Value::parse(text).map_err(|e| format!("{what}: {e}"))
}

/// Builds the constraint of `g`; `think`: the output opens with free
/// reasoning up to `</think>` (a chat prompt ending inside `<think>`).
pub(super) fn build(g: &GenerateRequest, think: bool) -> Result<Constraint, String> {
    let options = Options { think, ..Options::default() };
    let choice = g.choice()?;
    if let Some(tools) = g.tools.as_ref().filter(|_| choice != Choice::None) {
        let set = ToolSet::from_openai(&parse("\"tools\"", tools.get())?)
            .map_err(|e| format!("\"tools\": {e}"))?;
        let kind = match choice {
            Choice::Required => ToolChoice::Required,
            Choice::Named(n) if set.get(&n).is_none() => {
                return Err(format!("\"tool_choice\" names {n:?}, which is not in \"tools\""))
            }
            Choice::Named(n) => ToolChoice::Named(n),
            Choice::Auto | Choice::None => ToolChoice::Auto,
        };
        let parallel = g.parallel_tool_calls.unwrap_or(true);
        let grammar = Grammar::tools(set.clone(), kind, parallel, options)
            .map_err(|e| format!("\"tools\": {e}"))?;
        return Ok(Constraint { grammar: Some(Arc::new(grammar)), tools: Some(set) });
    }
    let format = match &g.response_format {
        Some(f) => f.format()?,
        None => Format::Text,
    };
    let grammar = match format {
        Format::Text => return Ok(Constraint::default()),
        Format::JsonObject => Grammar::json_object(options),
        Format::JsonSchema(None) => {
            Grammar::json_schema(&Value::Object(Default::default()), options)
                .map_err(|e| format!("\"response_format\": {e}"))?
        }
        Format::JsonSchema(Some(s)) => {
            let schema = parse("\"response_format.json_schema.schema\"", s.get())?;
            Grammar::json_schema(&schema, options)
                .map_err(|e| format!("\"response_format.json_schema.schema\": {e}"))?
        }
    };
    Ok(Constraint { grammar: Some(Arc::new(grammar)), tools: None })
}
