//! A compiled constraint: JSON value nodes, literal tries, and what the whole
//! output looks like (a JSON value, or Qwen3-Coder tool calls, optionally
//! after free reasoning that ends at `</think>`).

use alloc::string::String;
use alloc::vec::Vec;

use crate::json::Value;
use crate::schema::Compiler;
use crate::tools::{ToolChoice, ToolSet};
use crate::trie::Trie;
use crate::GrammarError;

/// Index of a [`Node`].
pub type NodeId = u32;

/// Whitespace bytes allowed in one gap between JSON tokens by default: one
/// line feed and indentation, as llama.cpp's JSON grammar allows (`\n` then
/// up to 20 spaces or tabs).
pub const DEFAULT_MAX_WS: u8 = 21;

/// One JSON value shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// Any JSON value.
    Any,
    /// An object (properties in schema order).
    Object(ObjectNode),
    /// An array of `items`, `min..=max` of them.
    Array {
        /// The item shape.
        items: NodeId,
        /// Fewest items.
        min: u32,
        /// Most items.
        max: u32,
    },
    /// Any string.
    String,
    /// Any number (`integer`: no fraction or exponent).
    Number {
        /// Integers only.
        integer: bool,
    },
    /// One of a fixed set of JSON texts (`enum`, `const`, `true`, `null`...).
    Literals(u32),
    /// Any of these shapes.
    AnyOf(Vec<NodeId>),
}

/// An object's properties.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectNode {
    /// `(name, shape, required)`, in schema order.
    pub props: Vec<(String, NodeId, bool)>,
    /// Trie of the names as written inside quotes, outcome = property index.
    pub keys: u32,
    /// For each `next` in `0..=props.len()`: index of the first required
    /// property at or after it (`props.len()` when none).
    pub first_required: Vec<u16>,
    /// Shape of properties not declared, when they are allowed.
    pub additional: Option<NodeId>,
}

/// What the whole output is.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// One JSON value.
    Json(NodeId),
    /// Tool calls in the Qwen3-Coder XML form.
    Tools(ToolGrammar),
}

/// The tool-call part of a grammar.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolGrammar {
    /// The tools.
    pub set: ToolSet,
    /// Which calls are allowed.
    pub choice: ToolChoice,
    /// More than one call.
    pub parallel: bool,
    /// Trie of `NAME>\n` of the tools that may be called, outcome = tool index.
    pub names: u32,
    /// Per tool, per `next` parameter index: trie of `<parameter=KEY>\n`
    /// (outcome = parameter index) and `</function>\n` (outcome [`END_PARAMS`]).
    pub headers: Vec<Vec<u32>>,
    /// Per tool, per parameter: how its value is written.
    pub values: Vec<Vec<ParamValue>>,
}

/// Outcome of the `</function>\n` entry of a parameter-header trie.
pub const END_PARAMS: u32 = 63;

/// How a tool parameter's value is written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamValue {
    /// Raw text (the schema is a plain string).
    Raw,
    /// One of the raw texts of trie `.0` (a string enum), followed by `\n</parameter>\n`.
    RawEnum(u32),
    /// JSON of this shape.
    Json(NodeId),
}

/// Options of a constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The output starts with free reasoning that ends at the `</think>`
    /// token (a chat with thinking on); the constraint applies after it.
    pub think: bool,
    /// Whitespace bytes allowed in each gap between JSON tokens (0: compact),
    /// of which at most one line feed.
    pub max_ws: u8,
    /// Ignore the JSON Schema keywords that are not enforced instead of
    /// refusing the schema (their names are in [`Grammar::ignored`]).
    pub ignore_unsupported: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { think: false, max_ws: DEFAULT_MAX_WS, ignore_unsupported: false }
    }
}

/// Fixed literal tries every grammar has, by index.
pub(crate) mod lit {
    pub const TRUE: u32 = 0;
    pub const FALSE: u32 = 1;
    pub const NULL: u32 = 2;
    pub const FUNCTION: u32 = 3;
    pub const PARAM_END: u32 = 4;
    pub const NEWLINE: u32 = 5;
    pub const TEXTS: [&[u8]; 6] =
        [b"true", b"false", b"null", b"\n<function=", b"\n</parameter>\n", b"\n"];
}

/// A compiled constraint, shared by every sequence that uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Grammar {
    pub(crate) nodes: Vec<Node>,
    pub(crate) tries: Vec<Trie>,
    pub(crate) body: Body,
    pub(crate) options: Options,
    pub(crate) ignored: Vec<String>,
}

/// Nodes every grammar has: any value, any object, any array.
pub(crate) const ANY: NodeId = 0;
pub(crate) const ANY_OBJECT: NodeId = 1;
pub(crate) const ANY_ARRAY: NodeId = 2;

impl Grammar {
    fn empty(options: Options) -> Grammar {
        let tries = lit::TEXTS.iter().map(|t| Trie::literal(t)).collect();
        let mut g =
            Grammar { nodes: Vec::new(), tries, body: Body::Json(0), options, ignored: Vec::new() };
        g.push(Node::Any);
        let keys = g.push_trie(Trie::new([]));
        let first_required = alloc::vec![0];
        let obj = ObjectNode { props: Vec::new(), keys, first_required, additional: Some(ANY) };
        g.push(Node::Object(obj));
        g.push(Node::Array { items: ANY, min: 0, max: u32::MAX });
        g
    }

    /// Output that is one JSON value valid under `schema` (OpenAI's
    /// `response_format: json_schema`). Unsupported keywords are an error
    /// naming them unless [`Options::ignore_unsupported`].
    pub fn json_schema(schema: &Value, options: Options) -> Result<Grammar, GrammarError> {
        let mut g = Grammar::empty(options);
        let mut c = Compiler::new(&mut g, schema);
        let root = c.compile_root()?;
        let ignored = c.finish("")?;
        g.body = Body::Json(root);
        g.ignored.extend(ignored);
        Ok(g)
    }

    /// Output that is any JSON object (`response_format: json_object`).
    pub fn json_object(options: Options) -> Grammar {
        let mut g = Grammar::empty(options);
        g.body = Body::Json(ANY_OBJECT);
        g
    }

    /// Output of Qwen3-Coder tool calls of `tools` as `choice` allows (with
    /// `Auto`, free text first, constrained from the `<tool_call>` token on).
    pub fn tools(
        tools: ToolSet,
        choice: ToolChoice,
        parallel: bool,
        options: Options,
    ) -> Result<Grammar, GrammarError> {
        let mut g = Grammar::empty(options);
        let tg = crate::tools::compile(&mut g, tools, choice, parallel)?;
        g.body = Body::Tools(tg);
        Ok(g)
    }

    /// Keywords that were ignored ([`Options::ignore_unsupported`]).
    pub fn ignored(&self) -> &[String] {
        &self.ignored
    }

    /// The options it was built with.
    pub fn options(&self) -> Options {
        self.options
    }

    /// The tools, for a tool-call grammar.
    pub fn tool_set(&self) -> Option<&ToolSet> {
        match &self.body {
            Body::Tools(t) => Some(&t.set),
            Body::Json(_) => None,
        }
    }

    pub(crate) fn push(&mut self, n: Node) -> NodeId {
        self.nodes.push(n);
        (self.nodes.len() - 1) as NodeId
    }

    pub(crate) fn push_trie(&mut self, t: Trie) -> u32 {
        self.tries.push(t);
        (self.tries.len() - 1) as u32
    }
}
