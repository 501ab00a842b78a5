//! Strict rejection: each defect the format forbids gets its own typed error.

use super::*;
use alloc::string::ToString;
use alloc::{format, vec};

fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn err(header: &str, data: &[u8]) -> HeaderError {
    Safetensors::parse(&file(header, data)).unwrap_err()
}

const ONE: &str =
    r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}}"#;

#[test]
fn parses_a_tensor_in_place() {
    let f = file(ONE, &[0, 0, 128, 63, 0, 0, 0, 64]);
    let st = Safetensors::parse(&f).unwrap();
    let t = st.get("a").unwrap();
    assert_eq!(t.shape, &[2]);
    assert_eq!(t.get_f32(1), Some(2.0));
    assert_eq!(t.get_f32(2), None);
    assert_eq!(t.data.as_ptr(), f[f.len() - 8..].as_ptr(), "a view, not a copy");
    assert_eq!(st.header().metadata("format"), Some("pt"));
    assert!(st.get("b").is_none());
}

#[test]
fn short_or_oversized_headers_are_rejected() {
    assert!(matches!(
        Safetensors::parse(&[1, 2, 3]),
        Err(HeaderError::Truncated { needed: 8, .. })
    ));
    let mut f = file("{}", &[]);
    f[0] = 200;
    assert!(matches!(Safetensors::parse(&f), Err(HeaderError::Truncated { needed: 208, .. })));
    f[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(Safetensors::parse(&f), Err(HeaderError::BadHeader(_))));
    assert!(matches!(err("[1]", &[]), HeaderError::BadHeader(_)));
    assert!(matches!(err("{\"a\":", &[]), HeaderError::BadHeader(_)));
}

#[test]
fn lying_entries_are_rejected() {
    let cases = [
        (r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, "needs 12"),
        (r#"{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}"#, "header"),
        (r#"{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,8]}}"#, "unsupported dtype"),
        (r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}"#, "backwards"),
        (
            r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}"#,
            "overflows",
        ),
        (r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}}"#, "unknown field"),
        (r#"{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}}"#, "rank 9"),
    ];
    for (h, want) in cases {
        let e = err(h, &[0; 8]).to_string();
        assert!(e.contains(want), "{want:?} not in {e:?}");
    }
    let past = err(r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#, &[0; 8]);
    assert!(matches!(past, HeaderError::Truncated { .. }), "{past}");
}

#[test]
fn the_data_area_must_be_tiled_exactly() {
    let two = |a: [u64; 2], b: [u64; 2]| {
        let h = format!(
            r#"{{"a":{{"dtype":"U8","shape":[4],"data_offsets":{a:?}}},"b":{{"dtype":"U8","shape":[4],"data_offsets":{b:?}}}}}"#
        );
        err(&h, &[0; 8])
    };
    assert!(matches!(two([0, 4], [2, 6]), HeaderError::Overlap { .. }));
    assert!(matches!(two([0, 4], [0, 4]), HeaderError::Overlap { .. }));
    let gap = err(r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#, &[0; 8]);
    assert!(gap.to_string().contains("contiguous"), "{gap}");
    let trailing = err(r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#, &[0; 8]);
    assert!(trailing.to_string().contains("4 bytes follow"), "{trailing}");
}

#[test]
fn duplicate_names_and_metadata_are_rejected() {
    let h = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}}"#;
    assert!(err(h, &[0; 8]).to_string().contains("`a` appears twice"));
    let m = r#"{"__metadata__":{"k":"1","k":"2"}}"#;
    assert!(err(m, &[]).to_string().contains("`k` appears twice"));
    let m = r#"{"__metadata__":{"k":1}}"#;
    assert!(matches!(err(m, &[]), HeaderError::BadHeader(_)));
    let _ = vec![0u8];
}
