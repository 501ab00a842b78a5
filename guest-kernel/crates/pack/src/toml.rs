//! A reader for the subset of TOML that `pack.toml` uses: `[table]` headers, `key = value`
//! lines whose values are strings (basic, literal, and multi-line, which are skipped over
//! correctly), integers, floats, booleans and (possibly multi-line) arrays of those.
//! Inline tables and dates are rejected with an error naming the line.
//!
//! Keys are flattened to `table.key` (root keys have no prefix); quoted key parts keep their
//! text without the quotes.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

/// One TOML value of the supported subset.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// An array.
    Array(Vec<Value>),
}

/// A syntax error, with the 1-based line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TomlError {
    /// Line number (1-based).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for TomlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

/// Parses `text` into a flat map from `table.key` to value.
pub fn parse(text: &str) -> Result<BTreeMap<String, Value>, TomlError> {
    let mut p = Parser { s: text.as_bytes(), i: 0, line: 1 };
    let mut out = BTreeMap::new();
    let mut table = String::new();
    loop {
        p.skip_ws_lines();
        let Some(c) = p.peek() else { break };
        let start_line = p.line;
        if c == b'[' {
            p.i += 1;
            if p.peek() == Some(b'[') {
                return Err(p.err("arrays of tables are not supported"));
            }
            table = p.key_path(b']')?;
            p.expect(b']')?;
        } else {
            let key = p.key_path(b'=')?;
            p.expect(b'=')?;
            p.skip_ws();
            let v = p.value()?;
            let full = if table.is_empty() { key } else { alloc::format!("{table}.{key}") };
            if out.insert(full.clone(), v).is_some() {
                return Err(TomlError {
                    line: start_line,
                    reason: alloc::format!("key `{full}` defined twice"),
                });
            }
        }
        p.end_of_line()?;
    }
    Ok(out)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    line: usize,
}

impl Parser<'_> {
    fn err(&self, reason: &str) -> TomlError {
        TomlError { line: self.line, reason: reason.to_string() }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn starts(&self, pat: &[u8]) -> bool {
        self.s[self.i..].starts_with(pat)
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        if c == b'\n' {
            self.line += 1;
        }
        Some(c)
    }

    fn expect(&mut self, c: u8) -> Result<(), TomlError> {
        self.skip_ws();
        if self.peek() != Some(c) {
            return Err(self.err(&alloc::format!("expected `{}`", c as char)));
        }
        self.i += 1;
        Ok(())
    }

    /// Spaces and tabs.
    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    fn skip_comment(&mut self) {
        if self.peek() == Some(b'#') {
            while !matches!(self.peek(), None | Some(b'\n')) {
                self.i += 1;
            }
        }
    }

    /// Whitespace, newlines and comments.
    fn skip_ws_lines(&mut self) {
        loop {
            self.skip_ws();
            self.skip_comment();
            match self.peek() {
                Some(b'\n' | b'\r') => {
                    self.bump();
                }
                _ => return,
            }
        }
    }

    fn end_of_line(&mut self) -> Result<(), TomlError> {
        self.skip_ws();
        self.skip_comment();
        match self.peek() {
            None | Some(b'\n') => Ok(()),
            Some(b'\r') if self.s.get(self.i + 1) == Some(&b'\n') => Ok(()),
            _ => Err(self.err("unexpected text after the value")),
        }
    }

    /// A dotted key (bare or quoted parts) up to `stop`.
    fn key_path(&mut self, stop: u8) -> Result<String, TomlError> {
        let mut key = String::new();
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'"') => key.push_str(&self.basic_string()?),
                Some(b'\'') => key.push_str(&self.literal_string()?),
                _ => {
                    let start = self.i;
                    while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
                    {
                        self.i += 1;
                    }
                    if start == self.i {
                        return Err(self.err("expected a key"));
                    }
                    key.push_str(core::str::from_utf8(&self.s[start..self.i]).unwrap_or(""));
                }
            }
            self.skip_ws();
            match self.peek() {
                Some(b'.') => {
                    self.i += 1;
                    key.push('.');
                }
                Some(c) if c == stop => return Ok(key),
                _ => {
                    return Err(
                        self.err(&alloc::format!("expected `.` or `{}` after a key", stop as char))
                    )
                }
            }
        }
    }

    fn value(&mut self) -> Result<Value, TomlError> {
        match self.peek() {
            Some(b'"') if self.starts(b"\"\"\"") => self.multiline(b"\"\"\"", true).map(Value::Str),
            Some(b'\'') if self.starts(b"'''") => self.multiline(b"'''", false).map(Value::Str),
            Some(b'"') => self.basic_string().map(Value::Str),
            Some(b'\'') => self.literal_string().map(Value::Str),
            Some(b'[') => self.array(),
            Some(b'{') => Err(self.err("inline tables are not supported")),
            Some(b't') if self.starts(b"true") => {
                self.i += 4;
                Ok(Value::Bool(true))
            }
            Some(b'f') if self.starts(b"false") => {
                self.i += 5;
                Ok(Value::Bool(false))
            }
            Some(_) => self.number(),
            None => Err(self.err("missing value")),
        }
    }

    fn array(&mut self) -> Result<Value, TomlError> {
        self.i += 1; // '['
        let mut items = Vec::new();
        loop {
            self.skip_ws_lines();
            if self.peek() == Some(b']') {
                self.i += 1;
                return Ok(Value::Array(items));
            }
            items.push(self.value()?);
            self.skip_ws_lines();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {}
                _ => return Err(self.err("expected `,` or `]` in an array")),
            }
        }
    }

    fn basic_string(&mut self) -> Result<String, TomlError> {
        self.i += 1; // '"'
        let mut out = Vec::new();
        loop {
            match self.peek() {
                None | Some(b'\n') => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    break;
                }
                Some(b'\\') => {
                    self.i += 1;
                    self.escape(&mut out)?;
                }
                Some(c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
        String::from_utf8(out).map_err(|_| self.err("string is not UTF-8"))
    }

    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), TomlError> {
        let c = self.bump().ok_or_else(|| self.err("unterminated escape"))?;
        let simple = match c {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'n' => Some(b'\n'),
            b't' => Some(b'\t'),
            b'r' => Some(b'\r'),
            b'b' => Some(8),
            b'f' => Some(12),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            return Ok(());
        }
        let digits = match c {
            b'u' => 4,
            b'U' => 8,
            _ => return Err(self.err("unknown escape in a string")),
        };
        let hex =
            self.s.get(self.i..self.i + digits).ok_or_else(|| self.err("short \\u escape"))?;
        let hex = core::str::from_utf8(hex).map_err(|_| self.err("bad \\u escape"))?;
        let cp = u32::from_str_radix(hex, 16).map_err(|_| self.err("bad \\u escape"))?;
        let ch = char::from_u32(cp).ok_or_else(|| self.err("\\u escape is not a character"))?;
        self.i += digits;
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        Ok(())
    }

    fn literal_string(&mut self) -> Result<String, TomlError> {
        self.i += 1; // '\''
        let start = self.i;
        while self.peek() != Some(b'\'') {
            if matches!(self.peek(), None | Some(b'\n')) {
                return Err(self.err("unterminated literal string"));
            }
            self.i += 1;
        }
        let s = core::str::from_utf8(&self.s[start..self.i])
            .map_err(|_| self.err("string is not UTF-8"))?;
        self.i += 1;
        Ok(s.to_string())
    }

    /// A multi-line string delimited by `delim` (basic strings process escapes).
    fn multiline(&mut self, delim: &[u8], basic: bool) -> Result<String, TomlError> {
        self.i += 3;
        // A newline right after the opening delimiter is trimmed.
        if self.starts(b"\r\n") {
            self.i += 1;
        }
        if self.peek() == Some(b'\n') {
            self.bump();
        }
        let mut out = Vec::new();
        loop {
            if self.starts(delim) {
                // Up to two quotes right before the closing delimiter belong to the string.
                let mut extra = 0;
                while extra < 2 && self.s.get(self.i + 3 + extra) == Some(&delim[0]) {
                    extra += 1;
                }
                out.extend_from_slice(&self.s[self.i..self.i + extra]);
                self.i += 3 + extra;
                break;
            }
            match self.bump() {
                None => return Err(self.err("unterminated multi-line string")),
                Some(b'\\') if basic => self.escape_multiline(&mut out)?,
                Some(c) => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| self.err("string is not UTF-8"))
    }

    /// After a backslash in a multi-line basic string: a line-ending backslash trims the
    /// newline and the whitespace after it; anything else is an ordinary escape.
    fn escape_multiline(&mut self, out: &mut Vec<u8>) -> Result<(), TomlError> {
        let save = self.i;
        self.skip_ws();
        if matches!(self.peek(), Some(b'\n' | b'\r')) {
            while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
                self.bump();
            }
            return Ok(());
        }
        self.i = save;
        self.escape(out)
    }

    fn number(&mut self) -> Result<Value, TomlError> {
        let start = self.i;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.' | b'_'))
        {
            self.i += 1;
        }
        let raw = core::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
        let text: String = raw.chars().filter(|&c| c != '_').collect();
        if text.is_empty() {
            return Err(self.err("expected a value"));
        }
        match text.as_str() {
            "inf" | "+inf" => return Ok(Value::Float(f64::INFINITY)),
            "-inf" => return Ok(Value::Float(f64::NEG_INFINITY)),
            "nan" | "+nan" | "-nan" => return Ok(Value::Float(f64::NAN)),
            _ => {}
        }
        let is_float =
            text.bytes().any(|c| matches!(c, b'.' | b'e' | b'E')) && !text.starts_with("0x");
        if is_float {
            text.parse::<f64>()
                .map(Value::Float)
                .map_err(|_| self.err(&alloc::format!("`{raw}` is not a number")))
        } else {
            let (neg, digits) = match text.strip_prefix('-') {
                Some(d) => (true, d),
                None => (false, text.strip_prefix('+').unwrap_or(&text)),
            };
            let v = if let Some(h) = digits.strip_prefix("0x") {
                i64::from_str_radix(h, 16)
            } else if let Some(o) = digits.strip_prefix("0o") {
                i64::from_str_radix(o, 8)
            } else if let Some(b) = digits.strip_prefix("0b") {
                i64::from_str_radix(b, 2)
            } else {
                digits.parse::<i64>()
            }
            .map_err(|_| self.err(&alloc::format!("`{raw}` is not a supported value")))?;
            Ok(Value::Int(if neg { -v } else { v }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_pack_subset() {
        let t = parse(
            "a = 1 # c\nname = \"x\\ty\\u00e9\"\n[config]\nf = 1e-6\nb = false\nl = [\"p\", 'q',\n  \"r\",]\n\
             [tokenizer]\nt = '''\nline1\n''x'' # not a comment\n'''\nu = \"\"\"a\\\n   b\"\"\"\n\
             [quantization.modules]\n\"model.x\" = \"nvfp4\"\nn = -1_000\nh = 0x1f\n",
        )
        .unwrap();
        assert_eq!(t["a"], Value::Int(1));
        assert_eq!(t["name"], Value::Str("x\ty\u{e9}".into()));
        assert_eq!(t["config.f"], Value::Float(1e-6));
        assert_eq!(t["config.b"], Value::Bool(false));
        assert_eq!(
            t["config.l"],
            Value::Array(alloc::vec![
                Value::Str("p".into()),
                Value::Str("q".into()),
                Value::Str("r".into())
            ])
        );
        assert_eq!(t["tokenizer.t"], Value::Str("line1\n''x'' # not a comment\n".into()));
        assert_eq!(t["tokenizer.u"], Value::Str("ab".into()));
        assert_eq!(t["quantization.modules.model.x"], Value::Str("nvfp4".into()));
        assert_eq!(t["quantization.modules.n"], Value::Int(-1000));
        assert_eq!(t["quantization.modules.h"], Value::Int(31));
    }

    #[test]
    fn rejects_what_it_does_not_read() {
        for (text, line) in [
            ("a = {x = 1}", 1),
            ("\n[[t]]", 2),
            ("a = 1\na = 2", 2),
            ("a = \"open", 1),
            ("a = 1 2", 1),
            ("a = [1, 2", 1),
            ("= 3", 1),
            ("a = 1979-05-27", 1),
            ("x = '''never closed", 1),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
        }
    }
}
