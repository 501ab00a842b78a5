//! JSON Schema to [`Node`]s: the subset constrained decoding enforces.
//!
//! Supported: `type` (one or several), `properties` (generated in schema
//! order), `required`, `additionalProperties` (`false` when absent, as
//! OpenAI's strict mode requires; `true` or a schema allows other keys after
//! the declared ones), `items`, `minItems`, `maxItems`, `enum`, `const`,
//! `anyOf`, a one-element `allOf`, `$ref` to `#`, `#/$defs/..` and
//! `#/definitions/..` (recursion included); annotations (`title`,
//! `description`, `default`, `examples`, ...) and unknown keywords are
//! ignored. Assertions not enforced (`pattern`, `format`, `minLength`,
//! `minimum`, `oneOf`, ...) are a [`GrammarError::Unsupported`] naming them;
//! so are more than [`MAX_ALTERNATIVES`] shapes for one value and nesting
//! past [`MAX_NESTING`]. A `$ref` loop that never reaches a value is invalid.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::grammar::{Grammar, Node, NodeId, ObjectNode};
use crate::json::{write_string, Value};
use crate::trie::Trie;
use crate::GrammarError;

/// Assertions this crate does not enforce.
const UNSUPPORTED: [&str; 27] = [
    "pattern",
    "format",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
    "prefixItems",
    "contains",
    "additionalItems",
    "contentEncoding",
    "dependencies",
];

/// Most properties one object may declare.
pub const MAX_PROPERTIES: usize = 62;

/// Most schemas nested inside one another, `$ref`s followed included: the
/// compiler recurses once per level, so a long `$ref` chain in an HTTP body
/// cannot exhaust the stack.
pub const MAX_NESTING: usize = 256;

/// Most shapes one value may fork into through nested `anyOf`s, `$ref`s and
/// type lists (each one is a thread the matcher advances on every byte).
pub const MAX_ALTERNATIVES: u64 = 1024;

/// Compiles one schema document into a grammar's nodes.
pub(crate) struct Compiler<'g, 'v> {
    g: &'g mut Grammar,
    doc: &'v Value,
    /// Node of each `$ref` target compiled so far.
    refs: BTreeMap<String, NodeId>,
    ignored: Vec<String>,
    /// Schemas being compiled, one inside the other.
    depth: usize,
    /// The first node this compiler added.
    first: usize,
    /// Members by key of each object a `$ref` went through, built once, so
    /// many `$ref`s into a large `$defs` cost O(log n) each.
    members: BTreeMap<*const Value, BTreeMap<&'v str, &'v Value>>,
}

fn invalid(what: impl Into<String>, at: &str) -> GrammarError {
    GrammarError::Invalid { what: what.into(), at: at.to_string() }
}

fn is_type(v: &Value, t: &str) -> bool {
    match (t, v) {
        ("null", Value::Null) | ("boolean", Value::Bool(_)) | ("number", Value::Number(_)) => true,
        ("integer", n @ Value::Number(_)) => n.is_integer_literal(),
        ("string", Value::String(_)) | ("array", Value::Array(_)) => true,
        ("object", Value::Object(_)) => true,
        _ => false,
    }
}

impl<'g, 'v> Compiler<'g, 'v> {
    pub(crate) fn new(g: &'g mut Grammar, doc: &'v Value) -> Self {
        let first = g.nodes.len();
        let (refs, members) = (BTreeMap::new(), BTreeMap::new());
        Compiler { g, doc, refs, ignored: Vec::new(), depth: 0, first, members }
    }

    pub(crate) fn grammar(&mut self) -> &mut Grammar {
        self.g
    }

    /// The keywords ignored, once the alternatives are checked
    /// ([`check_alternatives`]); `at` names the document in errors.
    pub(crate) fn finish(self, at: &str) -> Result<Vec<String>, GrammarError> {
        check_alternatives(&self.g.nodes, self.first, at)?;
        Ok(self.ignored)
    }

    pub(crate) fn compile_root(&mut self) -> Result<NodeId, GrammarError> {
        self.reference("#", "")
    }

    /// Compiles the schema at `pointer` (a `$ref`), once.
    fn reference(&mut self, pointer: &str, at: &str) -> Result<NodeId, GrammarError> {
        if let Some(&id) = self.refs.get(pointer) {
            return Ok(id);
        }
        let target = self.resolve(pointer).ok_or_else(|| {
            invalid(format!("$ref {pointer:?} does not resolve in this document"), at)
        })?;
        // Reserve the node first so that recursion refers to it.
        let id = self.g.push(Node::Any);
        self.refs.insert(pointer.to_string(), id);
        let path = pointer.trim_start_matches('#');
        let node = self.node(target, path)?;
        self.g.nodes[id as usize] = node;
        Ok(id)
    }

    /// The value at a `$ref` pointer (`#`, `#/a/b`, with `~0`/`~1` escapes).
    fn resolve(&mut self, pointer: &str) -> Option<&'v Value> {
        let path = pointer.strip_prefix('#')?;
        let mut at = self.doc;
        if path.is_empty() {
            return Some(at);
        }
        for part in path.strip_prefix('/')?.split('/') {
            let key = part.replace("~1", "/").replace("~0", "~");
            at = match at {
                Value::Object(m) => {
                    let index = self
                        .members
                        .entry(at as *const Value)
                        .or_insert_with(|| m.iter().map(|(k, v)| (k.as_str(), v)).collect());
                    *index.get(key.as_str())?
                }
                Value::Array(a) => a.get(key.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        Some(at)
    }

    /// Compiles `schema` at `at` to a new node id.
    pub(crate) fn compile(&mut self, schema: &Value, at: &str) -> Result<NodeId, GrammarError> {
        let node = self.node(schema, at)?;
        Ok(self.g.push(node))
    }

    fn node(&mut self, schema: &Value, at: &str) -> Result<Node, GrammarError> {
        if self.depth == MAX_NESTING {
            return Err(GrammarError::Unsupported {
                keyword: format!("schemas nested more than {MAX_NESTING} deep ($refs followed)"),
                at: at.to_string(),
            });
        }
        self.depth += 1;
        let node = self.node_at_depth(schema, at);
        self.depth -= 1;
        node
    }

    fn node_at_depth(&mut self, schema: &Value, at: &str) -> Result<Node, GrammarError> {
        let m = match schema {
            Value::Bool(true) => return Ok(Node::Any),
            Value::Bool(false) => return Err(invalid("the schema `false` allows nothing", at)),
            Value::Object(m) => m,
            _ => return Err(invalid("a schema must be an object or a boolean", at)),
        };
        for (k, v) in m {
            let trivially_off = k == "uniqueItems" && *v == Value::Bool(false);
            if UNSUPPORTED.contains(&k.as_str()) || (k == "uniqueItems" && !trivially_off) {
                if self.g.options.ignore_unsupported {
                    self.ignored.push(k.clone());
                } else {
                    return Err(GrammarError::Unsupported {
                        keyword: k.clone(),
                        at: at.to_string(),
                    });
                }
            }
        }
        if let Some(r) = schema.get("$ref") {
            let r = r.as_str().ok_or_else(|| invalid("$ref must be a string", at))?;
            return Ok(Node::AnyOf(alloc::vec![self.reference(r, at)?]));
        }
        if let Some(all) = schema.get("allOf") {
            match all.as_array() {
                Some([one]) => return self.node(one, &format!("{at}/allOf/0")),
                _ => {
                    return Err(GrammarError::Unsupported {
                        keyword: String::from("allOf (more than one schema)"),
                        at: at.to_string(),
                    })
                }
            }
        }
        let types = self.types(schema, at)?;
        if let Some(values) = literal_values(schema, at)? {
            let fits = |v: &Value| types.is_empty() || types.iter().any(|t| is_type(v, t));
            let kept: Vec<&Value> = values.into_iter().filter(|v| fits(v)).collect();
            if kept.is_empty() {
                return Err(invalid("no enum/const value matches the schema's type", at));
            }
            let texts: Vec<String> = kept.iter().map(|v| v.to_compact_json()).collect();
            let trie = Trie::new(texts.iter().map(|t| (t.as_bytes(), 0)));
            return Ok(Node::Literals(self.g.push_trie(trie)));
        }
        if let Some(any) = schema.get("anyOf") {
            let list = any.as_array().filter(|l| !l.is_empty());
            let list = list.ok_or_else(|| invalid("anyOf must be a non-empty array", at))?;
            let mut alts = Vec::new();
            for (i, s) in list.iter().enumerate() {
                alts.push(self.compile(s, &format!("{at}/anyOf/{i}"))?);
            }
            if schema.get("type").is_some() {
                return Err(GrammarError::Unsupported {
                    keyword: String::from("type beside anyOf"),
                    at: at.to_string(),
                });
            }
            return Ok(Node::AnyOf(alts));
        }
        if types.is_empty() {
            return Ok(Node::Any);
        }
        let mut alts = Vec::new();
        for t in &types {
            let node = self.typed(schema, t, at)?;
            alts.push(node);
        }
        if alts.len() == 1 {
            return Ok(alts.pop().unwrap_or(Node::Any));
        }
        let ids = alts.into_iter().map(|n| self.g.push(n)).collect();
        Ok(Node::AnyOf(ids))
    }

    /// The schema's types: `type`, else inferred from its keywords, else none
    /// (any value).
    fn types(&self, schema: &Value, at: &str) -> Result<Vec<&'static str>, GrammarError> {
        const ALL: [&str; 7] =
            ["object", "array", "string", "number", "integer", "boolean", "null"];
        let named = |s: &str| ALL.iter().copied().find(|t| *t == s);
        match schema.get("type") {
            Some(Value::String(s)) => {
                Ok(alloc::vec![named(s).ok_or_else(|| invalid(format!("unknown type {s:?}"), at))?])
            }
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .map(|t| {
                    t.as_str().and_then(named).ok_or_else(|| invalid("unknown type in list", at))
                })
                .collect(),
            Some(_) => Err(invalid("type must be a string or a non-empty array", at)),
            None if schema.get("properties").is_some() || schema.get("required").is_some() => {
                Ok(alloc::vec!["object"])
            }
            None if schema.get("items").is_some() => Ok(alloc::vec!["array"]),
            None => Ok(Vec::new()),
        }
    }

    fn typed(&mut self, schema: &Value, t: &str, at: &str) -> Result<Node, GrammarError> {
        Ok(match t {
            "object" => Node::Object(self.object(schema, at)?),
            "array" => {
                let items = match schema.get("items") {
                    None => self.g.push(Node::Any),
                    Some(s) => self.compile(s, &format!("{at}/items"))?,
                };
                let min = count(schema, "minItems", at)?.unwrap_or(0);
                let max = count(schema, "maxItems", at)?.unwrap_or(u32::MAX);
                if min > max {
                    return Err(invalid("minItems is above maxItems", at));
                }
                Node::Array { items, min, max }
            }
            "string" => Node::String,
            "number" => Node::Number { integer: false },
            "integer" => Node::Number { integer: true },
            "boolean" => {
                let trie = Trie::new([(&b"true"[..], 0), (&b"false"[..], 0)]);
                Node::Literals(self.g.push_trie(trie))
            }
            _ => Node::Literals(crate::grammar::lit::NULL),
        })
    }

    fn object(&mut self, schema: &Value, at: &str) -> Result<ObjectNode, GrammarError> {
        let empty = Vec::new();
        let props_v = match schema.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(invalid("properties must be an object", at)),
        };
        if props_v.len() > MAX_PROPERTIES {
            return Err(GrammarError::Unsupported {
                keyword: format!("properties (more than {MAX_PROPERTIES} in one object)"),
                at: at.to_string(),
            });
        }
        let required: Vec<&str> = match schema.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|v| v.as_str().ok_or_else(|| invalid("required: not a string", at)))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(invalid("required must be an array", at)),
        };
        if let Some(missing) = required.iter().find(|r| !props_v.iter().any(|(k, _)| k == *r)) {
            return Err(invalid(
                format!("required property {missing:?} is not in properties (it could not be generated)"),
                at,
            ));
        }
        let mut props = Vec::new();
        for (name, s) in props_v {
            let id = self.compile(s, &format!("{at}/properties/{name}"))?;
            props.push((name.clone(), id, required.contains(&name.as_str())));
        }
        let additional = match schema.get("additionalProperties") {
            // An object schema that declares nothing means any object.
            None if schema.get("properties").is_none() => Some(self.g.push(Node::Any)),
            None | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some(self.g.push(Node::Any)),
            Some(s) => Some(self.compile(s, &format!("{at}/additionalProperties"))?),
        };
        let mut first_required = alloc::vec![props.len() as u16; props.len() + 1];
        for i in (0..props.len()).rev() {
            first_required[i] = if props[i].2 { i as u16 } else { first_required[i + 1] };
        }
        let quoted: Vec<String> = props
            .iter()
            .map(|(n, _, _)| {
                let mut q = String::new();
                write_string(n, &mut q);
                String::from(&q[1..q.len() - 1])
            })
            .collect();
        let keys = Trie::new(quoted.iter().enumerate().map(|(i, q)| (q.as_bytes(), i as u32)));
        let keys = self.g.push_trie(keys);
        Ok(ObjectNode { props, keys, first_required, additional })
    }
}

/// Refuses `anyOf` / `$ref` alternatives that lead back to themselves
/// before any value is read (`{"$ref":"#"}`: the schema never says what the
/// value is, and a matcher would fork forever), and a value that forks into
/// more than [`MAX_ALTERNATIVES`] shapes, among the nodes from `first` on
/// (one compiler's: they refer to no node before `first` but the shared
/// ones, which are not `anyOf`). Iterative: chains may be long.
fn check_alternatives(nodes: &[Node], first: usize, at: &str) -> Result<(), GrammarError> {
    const NEW: u64 = u64::MAX;
    const OPEN: u64 = u64::MAX - 1;
    let alts_of = |id: usize| match &nodes[id] {
        Node::AnyOf(alts) if id >= first => &alts[..],
        _ => &[],
    };
    // Per node from `first`: NEW, OPEN (on the path being walked), else its shape count.
    let mut shapes = alloc::vec![NEW; nodes.len() - first];
    let shape = |shapes: &[u64], id: usize| if id < first { 1 } else { shapes[id - first] };
    for start in first..nodes.len() {
        if shapes[start - first] != NEW {
            continue;
        }
        let mut path: Vec<(usize, usize)> = alloc::vec![(start, 0)];
        shapes[start - first] = OPEN;
        while let Some(&(id, next)) = path.last() {
            let alts = alts_of(id);
            if let Some(&alt) = alts.get(next) {
                if let Some(top) = path.last_mut() {
                    top.1 += 1;
                }
                match shape(&shapes, alt as usize) {
                    OPEN => {
                        return Err(invalid(
                            "anyOf/$ref alternatives lead back to themselves before any value \
                             (e.g. {\"$ref\":\"#\"}), so the schema never says what the value is",
                            at,
                        ))
                    }
                    NEW => {
                        shapes[alt as usize - first] = OPEN;
                        path.push((alt as usize, 0));
                    }
                    _ => {}
                }
                continue;
            }
            let count = match alts {
                [] => 1,
                _ => alts.iter().fold(0u64, |n, &a| n.saturating_add(shape(&shapes, a as usize))),
            };
            if count > MAX_ALTERNATIVES {
                return Err(GrammarError::Unsupported {
                    keyword: format!(
                        "anyOf (one value forks into more than {MAX_ALTERNATIVES} shapes)"
                    ),
                    at: at.to_string(),
                });
            }
            shapes[id - first] = count;
            path.pop();
        }
    }
    Ok(())
}

/// `enum` / `const` values, if the schema has them.
fn literal_values<'v>(schema: &'v Value, at: &str) -> Result<Option<Vec<&'v Value>>, GrammarError> {
    if let Some(c) = schema.get("const") {
        return Ok(Some(alloc::vec![c]));
    }
    match schema.get("enum") {
        None => Ok(None),
        Some(Value::Array(v)) if !v.is_empty() => Ok(Some(v.iter().collect())),
        Some(_) => Err(invalid("enum must be a non-empty array", at)),
    }
}

fn count(schema: &Value, key: &str, at: &str) -> Result<Option<u32>, GrammarError> {
    match schema.get(key) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .parse::<u32>()
            .map(Some)
            .map_err(|_| invalid(format!("{key} must be a non-negative integer"), at)),
        Some(_) => Err(invalid(format!("{key} must be a number"), at)),
    }
}
