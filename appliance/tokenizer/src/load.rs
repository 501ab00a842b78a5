//! Reading a Hugging Face `tokenizer.json`: checks that it describes what this
//! crate implements (byte-level BPE, NFC or no normalizer, the Qwen3.5 split
//! regex, the ByteLevel decoder) and extracts vocabulary, merges and added tokens.

use alloc::borrow::Cow;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use crate::pretok::QWEN35_PATTERN;
use crate::TokenizerError;

/// The parts of a `tokenizer.json` the tokenizer is built from.
pub(crate) struct Parsed<'a> {
    pub vocab: Vec<(Cow<'a, str>, u32)>,
    pub merges: Vec<(Cow<'a, str>, Cow<'a, str>)>,
    pub added: Vec<AddedJson<'a>>,
    pub ignore_merges: bool,
    pub unk_token: Option<String>,
    pub nfc: bool,
}

#[derive(Deserialize)]
struct FileJson<'a> {
    #[serde(default)]
    truncation: Option<Value>,
    #[serde(default)]
    padding: Option<Value>,
    #[serde(borrow, default)]
    added_tokens: Vec<AddedJson<'a>>,
    #[serde(default)]
    normalizer: Option<Value>,
    #[serde(default)]
    pre_tokenizer: Option<Value>,
    #[serde(default)]
    post_processor: Option<Value>,
    #[serde(default)]
    decoder: Option<Value>,
    #[serde(borrow)]
    model: ModelJson<'a>,
}

/// One entry of `added_tokens`.
#[derive(Deserialize)]
pub(crate) struct AddedJson<'a> {
    pub id: u32,
    #[serde(borrow)]
    pub content: Cow<'a, str>,
    #[serde(default)]
    pub single_word: bool,
    #[serde(default)]
    pub lstrip: bool,
    #[serde(default)]
    pub rstrip: bool,
    #[serde(default = "yes")]
    pub normalized: bool,
    #[serde(default)]
    pub special: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct ModelJson<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    dropout: Option<f64>,
    #[serde(default)]
    unk_token: Option<String>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    #[serde(borrow)]
    vocab: VocabJson<'a>,
    #[serde(borrow, default)]
    merges: Vec<MergeJson<'a>>,
}

#[derive(Deserialize)]
struct CowStr<'a>(#[serde(borrow)] Cow<'a, str>);

/// `model.vocab`: a JSON object from token to id, kept as a list.
struct VocabJson<'a>(Vec<(Cow<'a, str>, u32)>);

impl<'de: 'a, 'a> Deserialize<'de> for VocabJson<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = VocabJson<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object from token to id")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((k, v)) = map.next_entry::<CowStr<'de>, u32>()? {
                    out.push((k.0, v));
                }
                Ok(VocabJson(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// One merge: `"a b"` (older files) or `["a", "b"]`.
struct MergeJson<'a>(Cow<'a, str>, Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for MergeJson<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        fn split<'a, E: de::Error>(s: Cow<'a, str>) -> Result<MergeJson<'a>, E> {
            let bad = || E::custom(format!("merge {s:?} is not two tokens separated by one space"));
            let (a, b) = match &s {
                Cow::Borrowed(s) => {
                    let (a, b) = s.split_once(' ').ok_or_else(bad)?;
                    (Cow::Borrowed(a), Cow::Borrowed(b))
                }
                Cow::Owned(s) => {
                    let (a, b) = s.split_once(' ').ok_or_else(bad)?;
                    (Cow::Owned(a.to_string()), Cow::Owned(b.to_string()))
                }
            };
            if b.contains(' ') {
                return Err(bad());
            }
            Ok(MergeJson(a, b))
        }
        impl<'de> Visitor<'de> for V {
            type Value = MergeJson<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a merge, \"a b\" or [\"a\", \"b\"]")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                split(Cow::Borrowed(s))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                split(Cow::Owned(s.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let a: CowStr<'de> =
                    seq.next_element()?.ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let b: CowStr<'de> =
                    seq.next_element()?.ok_or_else(|| de::Error::invalid_length(1, &self))?;
                if seq.next_element::<de::IgnoredAny>()?.is_some() {
                    return Err(de::Error::invalid_length(3, &self));
                }
                Ok(MergeJson(a.0, b.0))
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses and checks `json`.
pub(crate) fn parse(json: &[u8]) -> Result<Parsed<'_>, TokenizerError> {
    let file: FileJson<'_> =
        serde_json::from_slice(json).map_err(|e| TokenizerError::Json(e.to_string()))?;
    if file.truncation.is_some() || file.padding.is_some() {
        return Err(unsupported("truncation and padding must be null"));
    }
    let nfc = check_normalizer(file.normalizer.as_ref())?;
    check_pre_tokenizer(file.pre_tokenizer.as_ref())?;
    check_named(file.decoder.as_ref(), "decoder", false)?;
    check_named(file.post_processor.as_ref(), "post_processor", true)?;
    let m = file.model;
    if m.kind.as_deref().is_some_and(|k| k != "BPE") {
        return Err(unsupported(&format!(
            "model type {:?} (only BPE)",
            m.kind.unwrap_or_default()
        )));
    }
    if m.dropout.is_some_and(|p| p != 0.0) {
        return Err(unsupported("BPE dropout"));
    }
    if m.continuing_subword_prefix.as_deref().is_some_and(|s| !s.is_empty())
        || m.end_of_word_suffix.as_deref().is_some_and(|s| !s.is_empty())
    {
        return Err(unsupported("continuing_subword_prefix / end_of_word_suffix"));
    }
    if m.byte_fallback {
        return Err(unsupported("byte_fallback"));
    }
    for a in &file.added_tokens {
        if a.single_word || a.lstrip || a.rstrip {
            return Err(unsupported(&format!(
                "added token {:?} with single_word/lstrip/rstrip",
                a.content
            )));
        }
        if a.content.is_empty() {
            return Err(TokenizerError::Invalid(format!("added token {} is empty", a.id)));
        }
    }
    Ok(Parsed {
        vocab: m.vocab.0,
        merges: m.merges.into_iter().map(|MergeJson(a, b)| (a, b)).collect(),
        added: file.added_tokens,
        ignore_merges: m.ignore_merges,
        unk_token: m.unk_token,
        nfc,
    })
}

fn unsupported(what: &str) -> TokenizerError {
    TokenizerError::Unsupported(what.to_string())
}

fn type_of(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

/// `null`, `NFC`, or a `Sequence` of at most one `NFC`. Returns whether NFC applies.
fn check_normalizer(n: Option<&Value>) -> Result<bool, TokenizerError> {
    let Some(n) = n.filter(|v| !v.is_null()) else { return Ok(false) };
    match type_of(n) {
        Some("NFC") => Ok(true),
        Some("Sequence") => {
            let list =
                n.get("normalizers").and_then(Value::as_array).map_or(&[][..], |v| v.as_slice());
            match list {
                [] => Ok(false),
                [one] => check_normalizer(Some(one)),
                _ => Err(unsupported("a normalizer sequence of more than NFC")),
            }
        }
        other => Err(unsupported(&format!("normalizer {other:?} (only NFC)"))),
    }
}

/// The Qwen3.5 `Split` regex (isolated) followed by `ByteLevel` without its own regex.
fn check_pre_tokenizer(p: Option<&Value>) -> Result<(), TokenizerError> {
    let bad = || {
        unsupported("pre_tokenizer must be Sequence[Split(Qwen3.5 regex, Isolated), ByteLevel(use_regex=false)]")
    };
    let p = p.ok_or_else(bad)?;
    let list = match type_of(p) {
        Some("Sequence") => p.get("pretokenizers").and_then(Value::as_array).ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    let [split, byte_level] = list.as_slice() else { return Err(bad()) };
    let pattern = split.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str);
    let split_ok = type_of(split) == Some("Split")
        && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
        && split.get("invert").and_then(Value::as_bool) != Some(true);
    if !split_ok {
        return Err(bad());
    }
    if pattern != Some(QWEN35_PATTERN) {
        return Err(unsupported(&format!(
            "split regex {pattern:?} (only Qwen3.5's is implemented)"
        )));
    }
    let bl_ok = type_of(byte_level) == Some("ByteLevel")
        && byte_level.get("add_prefix_space").and_then(Value::as_bool) != Some(true)
        && byte_level.get("use_regex").and_then(Value::as_bool) == Some(false);
    if !bl_ok {
        return Err(bad());
    }
    Ok(())
}

/// The decoder must be `ByteLevel`; the post-processor `ByteLevel` or null.
fn check_named(v: Option<&Value>, what: &str, null_ok: bool) -> Result<(), TokenizerError> {
    match v.filter(|v| !v.is_null()) {
        None if null_ok => Ok(()),
        Some(v) if type_of(v) == Some("ByteLevel") => Ok(()),
        other => Err(unsupported(&format!(
            "{what} {:?} (only ByteLevel)",
            other.and_then(type_of).unwrap_or("null")
        ))),
    }
}
