//! An order-keeping JSON value, a strict parser, and the writers chat
//! templates and grammars need: Python's `json.dumps` (what transformers'
//! `tojson` filter prints: `", "` and `": "` separators, non-ASCII kept, floats
//! as Python's `repr`), Python's `str()` of a scalar (Jinja's `|string`), and
//! compact JSON.
//!
//! Objects keep their keys in document order (JSON Schema property order and
//! a tool's JSON must be printed as they came); a repeated key keeps its first
//! position and its last value, as Python's `json.loads` does. Numbers keep
//! their text, so a big integer or `1.0` prints as Python would print it.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Write};

/// Deepest nesting the parser accepts.
pub const MAX_DEPTH: usize = 128;

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number, as written (valid JSON number syntax).
    Number(String),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object, keys in order.
    Object(Vec<(String, Value)>),
}

/// Why text is not JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What was wrong.
    pub what: &'static str,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSON at byte {}: {}", self.offset, self.what)
    }
}

#[cfg(feature = "std")]
impl std::error::Error for JsonError {}

impl Value {
    /// Parses one JSON document (surrounding whitespace allowed).
    pub fn parse(text: &str) -> Result<Value, JsonError> {
        let mut p = Parser { b: text.as_bytes(), at: 0 };
        p.ws();
        let v = p.value(0)?;
        p.ws();
        if p.at != p.b.len() {
            return Err(p.err("trailing characters after the value"));
        }
        Ok(v)
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The members, if this is an object.
    pub fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// The items, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Whether the number is written as an integer (no fraction or exponent).
    pub fn is_integer_literal(&self) -> bool {
        matches!(self, Value::Number(n) if !n.contains(['.', 'e', 'E']))
    }

    /// Python's `json.dumps(value, ensure_ascii=False)`.
    pub fn to_python_json(&self) -> String {
        let mut out = String::new();
        write_python(self, &mut out);
        out
    }

    /// Python's `str(value)` for scalars (`True`, `None`, `1.0`, the raw
    /// string); containers print as [`Value::to_python_json`] (what the Qwen
    /// template does for them).
    pub fn to_python_str(&self) -> String {
        match self {
            Value::Null => String::from("None"),
            Value::Bool(true) => String::from("True"),
            Value::Bool(false) => String::from("False"),
            Value::Number(n) => python_number(n),
            Value::String(s) => s.clone(),
            _ => self.to_python_json(),
        }
    }

    /// Compact JSON (`{"a":1}`), strings escaped minimally, numbers as written.
    pub fn to_compact_json(&self) -> String {
        let mut out = String::new();
        write_compact(self, &mut out);
        out
    }
}

fn write_python(v: &Value, out: &mut String) {
    match v {
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_string(k, out);
                out.push_str(": ");
                write_python(x, out);
            }
            out.push('}');
        }
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&python_number(n)),
        Value::String(s) => write_string(s, out),
    }
}

fn write_compact(v: &Value, out: &mut String) {
    match v {
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_compact(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_compact(x, out);
            }
            out.push('}');
        }
        Value::Number(n) => out.push_str(n),
        other => write_python(other, out),
    }
}

/// A JSON string literal as Python's `json.dumps` writes it with
/// `ensure_ascii=False` (which is also the minimal escaping).
pub fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number literal as Python prints the value `json.loads` makes of it: an
/// integer as `int` (`-0` is `0`), anything else as a float's `repr`.
pub fn python_number(n: &str) -> String {
    if !n.contains(['.', 'e', 'E']) {
        return if n == "-0" { String::from("0") } else { String::from(n) };
    }
    python_float_repr(n.parse::<f64>().unwrap_or(f64::NAN))
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional
/// for decimal exponents -4..16, else `d.ddde+XX`; `inf` as JSON's `Infinity`.
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return String::from("NaN");
    }
    if x.is_infinite() {
        return String::from(if x > 0.0 { "Infinity" } else { "-Infinity" });
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "-1.2345e-7".
    let sci = alloc::format!("{x:e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            (0..(-exp - 1)).for_each(|_| out.push('0'));
            out.push_str(&digits);
        } else {
            let point = exp as usize + 1;
            if digits.len() <= point {
                out.push_str(&digits);
                (digits.len()..point).for_each(|_| out.push('0'));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

struct Parser<'a> {
    b: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn err(&self, what: &'static str) -> JsonError {
        JsonError { offset: self.at, what }
    }

    fn ws(&mut self) {
        while matches!(self.b.get(self.at), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.b[self.at..].starts_with(lit) {
            self.at += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth >= MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        match self.b.get(self.at) {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ if self.eat(b"true") => Ok(Value::Bool(true)),
            _ if self.eat(b"false") => Ok(Value::Bool(false)),
            _ if self.eat(b"null") => Ok(Value::Null),
            None => Err(self.err("unexpected end, expected a value")),
            _ => Err(self.err("expected a value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.at += 1;
        let mut members: Vec<(String, Value)> = Vec::new();
        // Position of each key in `members`: a repeated key is found in
        // O(log n), so a body of many keys cannot cost O(n²).
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        self.ws();
        if self.eat(b"}") {
            return Ok(Value::Object(members));
        }
        loop {
            self.ws();
            if self.b.get(self.at) != Some(&b'"') {
                return Err(self.err("expected a string key"));
            }
            let key = self.string()?;
            self.ws();
            if !self.eat(b":") {
                return Err(self.err("expected ':'"));
            }
            self.ws();
            let v = self.value(depth + 1)?;
            match index.get(&key) {
                Some(&i) => members[i].1 = v,
                None => {
                    index.insert(key.clone(), members.len());
                    members.push((key, v));
                }
            }
            self.ws();
            if self.eat(b"}") {
                return Ok(Value::Object(members));
            }
            if !self.eat(b",") {
                return Err(self.err("expected ',' or '}'"));
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        self.at += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat(b"]") {
            return Ok(Value::Array(items));
        }
        loop {
            self.ws();
            items.push(self.value(depth + 1)?);
            self.ws();
            if self.eat(b"]") {
                return Ok(Value::Array(items));
            }
            if !self.eat(b",") {
                return Err(self.err("expected ',' or ']'"));
            }
        }
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.at;
        let digits = |p: &mut Self| {
            let s = p.at;
            while matches!(p.b.get(p.at), Some(b'0'..=b'9')) {
                p.at += 1;
            }
            p.at - s
        };
        self.eat(b"-");
        match self.b.get(self.at) {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(self.err("expected a digit")),
        }
        if self.eat(b".") && digits(self) == 0 {
            return Err(self.err("expected a digit after '.'"));
        }
        if self.eat(b"e") || self.eat(b"E") {
            let _ = self.eat(b"+") || self.eat(b"-");
            if digits(self) == 0 {
                return Err(self.err("expected an exponent digit"));
            }
        }
        let text = core::str::from_utf8(&self.b[start..self.at]).unwrap_or("0");
        Ok(Value::Number(String::from(text)))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let h = self.b.get(self.at..self.at + 4).ok_or_else(|| self.err("short \\u escape"))?;
        let mut v = 0;
        for &c in h {
            let d = (c as char).to_digit(16).ok_or_else(|| self.err("bad hex digit in \\u"))?;
            v = v * 16 + d;
        }
        self.at += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let start = self.at;
            while let Some(&c) = self.b.get(self.at) {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.at += 1;
            }
            // The input is a &str, so any run between ASCII stops is UTF-8.
            out.push_str(core::str::from_utf8(&self.b[start..self.at]).unwrap_or(""));
            match self.b.get(self.at) {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    let c = self.escape()?;
                    out.push(c);
                }
                Some(_) => return Err(self.err("control character in a string")),
                None => return Err(self.err("unterminated string")),
            }
        }
    }

    fn escape(&mut self) -> Result<char, JsonError> {
        let e = *self.b.get(self.at).ok_or_else(|| self.err("unterminated escape"))?;
        self.at += 1;
        Ok(match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                let code = match hi {
                    0xD800..=0xDBFF => {
                        if !self.eat(b"\\u") {
                            return Err(self.err("lone high surrogate"));
                        }
                        let lo = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return Err(self.err("high surrogate without a low one"));
                        }
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return Err(self.err("lone low surrogate")),
                    c => c,
                };
                char::from_u32(code).ok_or_else(|| self.err("bad \\u escape"))?
            }
            _ => return Err(self.err("unknown escape")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr_matches_python() {
        for (x, want) in [
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123.456, "123.456"),
            (-0.0, "-0.0"),
            (2.5, "2.5"),
            (1e-7, "1e-07"),
            (1e100, "1e+100"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (0.1, "0.1"),
        ] {
            assert_eq!(python_float_repr(x), want, "{x}");
        }
        assert_eq!(python_number("-0"), "0");
        assert_eq!(python_number("1E400"), "Infinity");
        assert_eq!(
            python_number("123456789012345678901234567890"),
            "123456789012345678901234567890"
        );
    }

    #[test]
    fn keeps_order_and_last_duplicate_in_first_place() {
        let v = Value::parse(r#"{"b": 1, "a": [true, null, "x\u00e9\n"], "b": 2.0}"#).unwrap();
        assert_eq!(v.to_python_json(), "{\"b\": 2.0, \"a\": [true, null, \"xé\\n\"]}");
        assert_eq!(v.to_compact_json(), "{\"b\":2.0,\"a\":[true,null,\"xé\\n\"]}");
        assert_eq!(Value::Bool(true).to_python_str(), "True");
    }

    #[test]
    fn rejects_what_is_not_json() {
        for bad in [
            "",
            "{",
            "[1,]",
            "01",
            "1.",
            "-",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"a\u{1}\"",
            "nul",
            "{\"a\" 1}",
            "1 2",
            "\"\\x\"",
        ] {
            assert!(Value::parse(bad).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1);
        assert!(Value::parse(&deep).is_err());
        let ok = Value::parse("\"\\ud83d\\ude00\"").unwrap();
        assert_eq!(ok, Value::String(String::from("😀")));
    }
}
