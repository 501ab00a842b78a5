//! The fuzz targets' bodies on their committed seeds and on mutations of
//! them (byte flips, truncations), as plain tests.

use std::path::Path;

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert!(!out.is_empty());
    let base = out.clone();
    let mut x = 0x2545_F491u64;
    for s in &base {
        for _ in 0..40 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut m = s.clone();
            let at = (x as usize) % m.len();
            match x % 3 {
                0 => m[at] ^= 1 << (x % 8),
                1 => m.truncate(at),
                _ => m.insert(at, b"\"{[<\\\n"[(x % 6) as usize]),
            }
            out.push(m);
        }
    }
    out
}

#[test]
fn schema_target_survives_its_seeds_and_mutations() {
    seeds("grammar_schema").iter().for_each(|s| kore_grammar::fuzz::schema(s));
}

#[test]
fn tool_call_target_survives_its_seeds_and_mutations() {
    seeds("grammar_tool_calls").iter().for_each(|s| kore_grammar::fuzz::tool_calls(s));
}
