//! Element types of stored tensors, spelled as safetensors headers spell them.

use core::fmt;

/// Element type of a stored tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE binary64.
    F64,
    /// FP8 E4M3 (`float8_e4m3fn`; NVFP4 block scales).
    F8E4M3,
    /// FP8 E5M2.
    F8E5M2,
    /// Unsigned bytes (packed NVFP4 codes).
    U8,
    /// Signed bytes.
    I8,
    /// 16-bit signed integers.
    I16,
    /// 16-bit unsigned integers.
    U16,
    /// 32-bit signed integers.
    I32,
    /// 32-bit unsigned integers.
    U32,
    /// 64-bit signed integers.
    I64,
    /// 64-bit unsigned integers.
    U64,
    /// Booleans, one byte each.
    Bool,
}

/// Every dtype with its header spelling.
const NAMES: [(DType, &str); 15] = [
    (DType::F32, "F32"),
    (DType::F16, "F16"),
    (DType::BF16, "BF16"),
    (DType::F64, "F64"),
    (DType::F8E4M3, "F8_E4M3"),
    (DType::F8E5M2, "F8_E5M2"),
    (DType::U8, "U8"),
    (DType::I8, "I8"),
    (DType::I16, "I16"),
    (DType::U16, "U16"),
    (DType::I32, "I32"),
    (DType::U32, "U32"),
    (DType::I64, "I64"),
    (DType::U64, "U64"),
    (DType::Bool, "BOOL"),
];

impl DType {
    /// Parses the header spelling (`"BF16"`, `"F8_E4M3"`...); `None` for names this
    /// crate does not know.
    pub fn parse(name: &str) -> Option<DType> {
        NAMES.iter().find(|(_, n)| *n == name).map(|(d, _)| *d)
    }

    /// The header spelling.
    pub fn name(self) -> &'static str {
        NAMES.iter().find(|(d, _)| *d == self).map_or("?", |(_, n)| n)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F8E4M3 | DType::F8E5M2 | DType::U8 | DType::I8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// True for the floating-point types a model's plain weights may use.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_the_spec() {
        for (d, n) in NAMES {
            assert_eq!(DType::parse(n), Some(d));
            assert_eq!(d.name(), n);
        }
        assert_eq!(DType::parse("F4"), None);
        assert_eq!(DType::parse("bf16"), None, "spellings are case-sensitive");
        let sizes = [(DType::BF16, 2), (DType::F8E4M3, 1), (DType::F64, 8), (DType::U32, 4)];
        for (d, s) in sizes {
            assert_eq!(d.size(), s, "{d}");
        }
    }
}
