//! OpenAI tools (`tools`, `tool_choice`) and their Qwen3-Coder call grammar:
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...
//! </function>\n</tool_call>`, parameters in schema order, required ones
//! always present; a value is raw text when its schema is a plain string (or
//! a string enum), else JSON of its schema. [`value_kind`] is the one rule the
//! grammar and the parser share.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::grammar::{Grammar, ParamValue, ToolGrammar, END_PARAMS};
use crate::json::Value;
use crate::schema::{Compiler, MAX_PROPERTIES};
use crate::trie::Trie;
use crate::GrammarError;

/// One function tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name.
    pub name: String,
    /// Its parameters' JSON Schema (an object schema; `{}` when absent).
    pub parameters: Value,
    /// `function.strict`.
    pub strict: bool,
}

/// The tools of a request, in order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolSet {
    /// The tools.
    pub tools: Vec<Tool>,
}

/// Which calls the model may make (OpenAI `tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Text, or calls after text (`auto`): unconstrained until `<tool_call>`.
    Auto,
    /// At least one call, nothing before it but whitespace (`required`).
    Required,
    /// Calls of this function only (`{"type":"function","function":{"name":..}}`).
    Named(String),
}

fn invalid(what: impl Into<String>, at: String) -> GrammarError {
    GrammarError::Invalid { what: what.into(), at }
}

impl ToolSet {
    /// Reads OpenAI `tools` (`[{"type":"function","function":{"name",
    /// "parameters", "strict"}}]`; the bare `{"name",...}` form too).
    pub fn from_openai(tools: &Value) -> Result<ToolSet, GrammarError> {
        let list =
            tools.as_array().ok_or_else(|| invalid("tools must be an array", String::new()))?;
        let mut out = Vec::new();
        let mut names = alloc::collections::BTreeSet::new();
        for (i, t) in list.iter().enumerate() {
            let at = format!("/tools/{i}");
            if let Some(kind) = t.get("type") {
                if kind.as_str() != Some("function") {
                    return Err(invalid("only tools of type \"function\" are supported", at));
                }
            }
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name").and_then(Value::as_str);
            let name = name.ok_or_else(|| invalid("a function needs a string name", at.clone()))?;
            if name.is_empty() || name.contains(['>', '<', '\n']) {
                return Err(invalid(
                    "a function name must be non-empty, without <, > or newlines",
                    at,
                ));
            }
            if !names.insert(name) {
                return Err(invalid(format!("two tools are named {name:?}"), at));
            }
            let parameters = f.get("parameters").cloned().unwrap_or(Value::Object(Vec::new()));
            let strict = f.get("strict") == Some(&Value::Bool(true));
            out.push(Tool { name: name.to_string(), parameters, strict });
        }
        Ok(ToolSet { tools: out })
    }

    /// The tool named `name`.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// How a parameter with schema `s` is written in a call: raw text for a plain
/// string schema (`{"type":"string"}`, maybe with an enum of strings), JSON
/// otherwise.
pub fn value_kind(s: &Value) -> ValueKind {
    let string_type = matches!(s.get("type"), Some(Value::String(t)) if t == "string")
        || matches!(s.get("type"), Some(Value::Array(a)) if a.len() == 1 && a[0].as_str() == Some("string"));
    let strings_only = |v: &Value| match v {
        Value::Array(a) => a.iter().all(|x| matches!(x, Value::String(_))),
        _ => false,
    };
    let enum_of_strings =
        s.get("enum").is_some_and(strings_only) || matches!(s.get("const"), Some(Value::String(_)));
    if (string_type || (s.get("type").is_none() && enum_of_strings)) && s.get("anyOf").is_none() {
        ValueKind::Raw
    } else {
        ValueKind::Json
    }
}

/// See [`value_kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// The text between the tags is the string.
    Raw,
    /// The text between the tags is JSON.
    Json,
}

/// The parameters of a tool: `(name, schema, required)` in order.
pub(crate) fn params(tool: &Tool) -> Vec<(&str, &Value, bool)> {
    let required: Vec<&str> = tool
        .parameters
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let props = tool.parameters.get("properties").and_then(Value::as_object).unwrap_or(&[]);
    props.iter().map(|(k, s)| (k.as_str(), s, required.contains(&k.as_str()))).collect()
}

/// Builds the call grammar's tries and parameter nodes into `g`.
pub(crate) fn compile(
    g: &mut Grammar,
    set: ToolSet,
    choice: ToolChoice,
    parallel: bool,
) -> Result<ToolGrammar, GrammarError> {
    if set.tools.is_empty() {
        return Err(invalid("tools is empty", String::from("/tools")));
    }
    if let ToolChoice::Named(n) = &choice {
        if set.get(n).is_none() {
            return Err(invalid(
                format!("tool_choice names {n:?}, which is not in tools"),
                String::new(),
            ));
        }
    }
    let callable: Vec<(usize, String)> = set
        .tools
        .iter()
        .enumerate()
        .filter(|(_, t)| !matches!(&choice, ToolChoice::Named(n) if *n != t.name))
        .map(|(i, t)| (i, format!("{}>\n", t.name)))
        .collect();
    let names = Trie::new(callable.iter().map(|(i, s)| (s.as_bytes(), *i as u32)));
    let names = g.push_trie(names);
    let (mut headers, mut values) = (Vec::new(), Vec::new());
    for (ti, tool) in set.tools.iter().enumerate() {
        let at = format!("/tools/{ti}/function/parameters");
        let ps = params(tool);
        if ps.len() > MAX_PROPERTIES {
            return Err(GrammarError::Unsupported {
                keyword: format!("parameters (more than {MAX_PROPERTIES})"),
                at,
            });
        }
        if let Some(Value::Array(req)) = tool.parameters.get("required") {
            if let Some(r) =
                req.iter().filter_map(Value::as_str).find(|r| !ps.iter().any(|p| p.0 == *r))
            {
                return Err(invalid(format!("required parameter {r:?} is not in properties"), at));
            }
        }
        let mut vs = Vec::new();
        let mut c = Compiler::new(g, &tool.parameters);
        for (name, schema, _) in &ps {
            if name.is_empty() || name.contains(['>', '<', '\n']) {
                return Err(invalid(
                    "a parameter name must be non-empty, without <, > or newlines",
                    at,
                ));
            }
            let pat = format!("{at}/properties/{name}");
            vs.push(param_value(&mut c, schema, &pat)?);
        }
        let ignored = c.finish(&at)?;
        g.ignored.extend(ignored);
        let mut per_next = Vec::new();
        for next in 0..=ps.len() {
            let first_req = (next..ps.len()).find(|&j| ps[j].2).unwrap_or(ps.len());
            let mut entries: Vec<(String, u32)> = (next..ps.len().min(first_req + 1))
                .map(|j| (format!("<parameter={}>\n", ps[j].0), j as u32))
                .collect();
            if first_req == ps.len() {
                entries.push((String::from("</function>\n"), END_PARAMS));
            }
            let trie = Trie::new(entries.iter().map(|(s, o)| (s.as_bytes(), *o)));
            per_next.push(g.push_trie(trie));
        }
        headers.push(per_next);
        values.push(vs);
    }
    Ok(ToolGrammar { set, choice, parallel, names, headers, values })
}

fn param_value(
    c: &mut Compiler<'_, '_>,
    schema: &Value,
    at: &str,
) -> Result<ParamValue, GrammarError> {
    // The schema is compiled whole either way, so unsupported keywords are refused alike.
    let node = c.compile(schema, at)?;
    if value_kind(schema) == ValueKind::Json {
        return Ok(ParamValue::Json(node));
    }
    let lits = match schema.get("enum").or(schema.get("const")) {
        None => return Ok(ParamValue::Raw),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect::<Vec<_>>(),
        Some(Value::String(s)) => alloc::vec![s.as_str()],
        Some(_) => Vec::new(),
    };
    if lits.is_empty() || lits.iter().any(|s| s.contains("</parameter>")) {
        return Err(invalid("a string enum needs values without </parameter>", at.to_string()));
    }
    let texts: Vec<String> = lits.iter().map(|s| format!("{s}\n</parameter>\n")).collect();
    let trie = Trie::new(texts.iter().map(|t| (t.as_bytes(), 0)));
    Ok(ParamValue::RawEnum(c.grammar().push_trie(trie)))
}
