//! The header JSON as written, read in file order with duplicate names detected
//! (serde_json's maps would silently keep the last of two equal keys).

use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

/// One raw header entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntry {
    pub dtype: String,
    pub shape: Vec<u64>,
    pub data_offsets: [u64; 2],
}

/// The header object.
#[derive(Debug, Default)]
pub(super) struct RawHeader {
    pub entries: Vec<(String, RawEntry)>,
    pub metadata: Vec<(String, String)>,
    /// The first tensor name that appears twice, if any.
    pub duplicate: Option<String>,
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(RawHeaderVisitor)
    }
}

struct RawHeaderVisitor;

impl<'de> Visitor<'de> for RawHeaderVisitor {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a safetensors header object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let mut out = RawHeader::default();
        let mut seen = BTreeSet::new();
        let mut seen_meta = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "__metadata__" {
                if seen_meta {
                    return Err(de::Error::custom("`__metadata__` appears twice"));
                }
                seen_meta = true;
                let m: Option<Metadata> = map.next_value()?;
                out.metadata = m.map(|m| m.0).unwrap_or_default();
                continue;
            }
            let entry: RawEntry = map.next_value()?;
            if !seen.insert(key.clone()) && out.duplicate.is_none() {
                out.duplicate = Some(key.clone());
            }
            out.entries.push((key, entry));
        }
        Ok(out)
    }
}

/// `__metadata__`: string to string, order kept, no key twice.
struct Metadata(Vec<(String, String)>);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MetadataVisitor)
    }
}

struct MetadataVisitor;

impl<'de> Visitor<'de> for MetadataVisitor {
    type Value = Metadata;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string-to-string map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
        let mut v = Vec::new();
        let mut seen = BTreeSet::new();
        while let Some((k, val)) = map.next_entry::<String, String>()? {
            if !seen.insert(k.clone()) {
                return Err(de::Error::custom(format!("metadata key `{k}` appears twice")));
            }
            v.push((k, val));
        }
        Ok(Metadata(v))
    }
}
