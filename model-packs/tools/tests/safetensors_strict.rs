//! The strict safetensors parser rejects every malformed header with a typed
//! error naming the file and tensor; the writer's output is standard.

use kore_pack::safetensors::{parse_header, DType, HeaderLimits, SafetensorsWriter, TensorSpec};
use kore_pack::PackError;
use std::path::Path;

fn file(header: &str, data_len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, data_len));
    v
}

fn parse(bytes: &[u8]) -> Result<(), PackError> {
    let file = Path::new("w.safetensors");
    parse_header(bytes, HeaderLimits::default()).map(|_| ()).map_err(|e| PackError::header(file, e))
}

const GOOD: &str = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}}"#;

#[test]
fn accepts_a_good_file() {
    let h = parse_header(&file(GOOD, 16), HeaderLimits::default()).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.get("b").unwrap().shape, vec![2, 2]);
}

#[test]
fn truncated_data_names_the_tensor() {
    let err = parse(&file(GOOD, 12)).unwrap_err();
    assert!(matches!(err, PackError::Truncated { ref what, .. } if what.contains("`b`")), "{err}");
    assert!(err.to_string().contains("w.safetensors"));
}

#[test]
fn truncated_header_and_length() {
    assert!(matches!(parse(&[1, 2, 3]).unwrap_err(), PackError::Truncated { .. }));
    let mut v = file(GOOD, 16);
    v.truncate(20);
    assert!(matches!(parse(&v).unwrap_err(), PackError::Truncated { .. }));
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    assert!(matches!(parse(&huge).unwrap_err(), PackError::BadHeader { .. }));
}

#[test]
fn overlapping_offsets_are_rejected() {
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let err = parse(&file(h, 12)).unwrap_err();
    assert!(
        matches!(err, PackError::Overlap { ref tensor, ref other, .. } if tensor == "b" && other == "a"),
        "{err}"
    );
}

#[test]
fn offsets_that_lie_about_sizes_are_rejected() {
    let h = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    let err = parse(&file(h, 8)).unwrap_err();
    assert!(matches!(err, PackError::BadTensor { ref tensor, .. } if tensor == "a"), "{err}");
    let back = r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}"#;
    assert!(matches!(parse(&file(back, 8)).unwrap_err(), PackError::BadTensor { .. }));
}

#[test]
fn offsets_beyond_the_file_are_rejected() {
    let h = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[1000000,1000004]}}"#;
    assert!(matches!(parse(&file(h, 4)).unwrap_err(), PackError::Truncated { .. }));
}

#[test]
fn gaps_and_trailing_bytes_are_rejected() {
    let gap = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
    assert!(matches!(parse(&file(gap, 8)).unwrap_err(), PackError::BadTensor { .. }));
    assert!(matches!(parse(&file(GOOD, 20)).unwrap_err(), PackError::BadHeader { .. }));
}

#[test]
fn malformed_headers_are_rejected() {
    let bad = [
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#,
        r#"{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}}"#,
        r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#,
        r#"[1,2]"#,
        r#"{"a":"#,
        r#"{"__metadata__":{"k":1}}"#,
    ];
    for h in bad {
        let err = parse(&file(h, 16)).unwrap_err();
        assert!(
            matches!(err, PackError::BadHeader { .. } | PackError::BadTensor { .. }),
            "{h}: {err}"
        );
    }
}

#[test]
fn writer_aligns_every_tensor_and_the_official_parser_accepts_it() {
    let specs = vec![
        TensorSpec::new("s", DType::F32, vec![]),
        TensorSpec::new("w", DType::U8, vec![3, 5]),
        TensorSpec::new("b", DType::BF16, vec![7]),
    ];
    let mut w = SafetensorsWriter::new(
        Vec::new(),
        Path::new("mem"),
        &specs,
        64,
        &[("k".into(), "v".into())],
    )
    .unwrap();
    w.write_tensor("s", &1.5f32.to_le_bytes()).unwrap();
    w.write_tensor("w", &[9u8; 15]).unwrap();
    w.write_tensor("b", &[1u8; 14]).unwrap();
    let (bytes, digest, len) = w.finish().unwrap();
    assert_eq!(len as usize, bytes.len());
    assert_eq!(digest.len(), 64);
    let h = parse_header(&bytes, HeaderLimits::default()).unwrap();
    for name in ["s", "w", "b"] {
        assert_eq!((h.data_start + h.get(name).unwrap().start) % 64, 0, "{name}");
    }
    assert_eq!(h.metadata("k"), Some("v"));
    let official = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(official.tensor("w").unwrap().data(), &[9u8; 15]);
    assert_eq!(official.tensor("s").unwrap().data(), &1.5f32.to_le_bytes());
}

#[test]
fn writer_rejects_misuse() {
    let specs =
        vec![TensorSpec::new("a", DType::U8, vec![4]), TensorSpec::new("b", DType::U8, vec![4])];
    let mut w = SafetensorsWriter::new(Vec::new(), Path::new("mem"), &specs, 64, &[]).unwrap();
    assert!(w.begin("b").is_err());
    w.begin("a").unwrap();
    assert!(w.write(&[0; 5]).is_err());
    let dup =
        vec![TensorSpec::new("a", DType::U8, vec![1]), TensorSpec::new("a", DType::U8, vec![1])];
    assert!(SafetensorsWriter::new(Vec::new(), Path::new("mem"), &dup, 64, &[]).is_err());
}
