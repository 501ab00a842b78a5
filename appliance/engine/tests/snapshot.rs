//! Checkpoints change nothing: a prompt cut into calls anywhere (short
//! calls past 2048 positions, where decode attention cuts the context into
//! pieces, included), or resumed from a checkpoint (kept in memory or written
//! to a checkpoint file and read back), gives logits bit for bit equal to one
//! call over the whole prompt, on every kernel path this CPU runs
//! (model-packs/tiny-hf); decode steps equal a prefill, across the 2048-key
//! piece boundary too. The file format refuses truncated, corrupt, foreign-pack,
//! other-shape and other-version files.

use std::path::Path as FsPath;

use kore_engine::hf::HfModelDir;
use kore_engine::simd::Path;
use kore_engine::snapshot::file::{self, FileError, Identity};
use kore_engine::snapshot::{self, Fixed, KvSpan, Shape};
use kore_engine::state::KvPrecision;
use kore_engine::{Model, SeqInput, State};

fn tiny() -> HfModelDir {
    HfModelDir::open(&FsPath::new(env!("CARGO_MANIFEST_DIR")).join("../../model-packs/tiny-hf"))
        .unwrap()
}

fn prompt(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// Runs `tokens` in one call; the last token's logits.
fn run(model: &Model<'_>, state: &mut State, tokens: &[u32]) -> Vec<f32> {
    let mut input = [SeqInput { state, tokens, logits: true }];
    model.forward_batch(&mut input).unwrap().remove(0)
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn id(model: &Model<'_>) -> Identity {
    Identity { pack: [7; 32], shape: Shape::of(&model.config), kv: model.options().kv }
}

/// Every path but the opt-in AMX one (where results depend on the cut).
fn each_path<'a>(model: &mut Model<'a>, mut f: impl FnMut(&Model<'a>, Path)) {
    for p in Path::ALL.into_iter().filter(|p| p.supported() && *p != Path::Amx) {
        model.set_kernels(p).unwrap();
        assert!(snapshot::cuts_exact(model), "{}", p.name());
        f(model, p);
    }
}

#[test]
fn cut_and_resumed_prefills_equal_one_call_on_every_path() {
    let hf = tiny();
    let mut model = hf.model().unwrap();
    let tokens = prompt(2300, 11, model.config.vocab_size);
    each_path(&mut model, |model, p| {
        let mut one = model.new_state();
        let whole = run(model, &mut one, &tokens);
        // Cuts a cache makes: the prefill grid, a message boundary at 1000,
        // a 10-token call past 2048 and a 17-token one.
        let cuts = [0, 512, 1000, 1024, 2048, 2273, 2283, 2300];
        let mut state = model.new_state();
        let mut last = Vec::new();
        let mut at_1000 = None;
        for w in cuts.windows(2) {
            last = run(model, &mut state, &tokens[w[0]..w[1]]);
            if w[1] == 1000 {
                at_1000 = Some((KvSpan::capture(&state, 0..1000), Fixed::capture(&state)));
            }
        }
        assert_eq!(bits(&last), bits(&whole), "{}: cut prefill", p.name());
        let (kv, fixed) = at_1000.unwrap();
        // Kept as two spans (as a radix tree does), restored into a used state.
        let mut head = kv.clone();
        let tail = head.split_off(600);
        let mut resumed = one.clone();
        snapshot::restore(&mut resumed, &[&head, &tail], &fixed).unwrap();
        assert_eq!(resumed.position(), 1000);
        let got = run(model, &mut resumed, &tokens[1000..]);
        assert_eq!(bits(&got), bits(&whole), "{}: resumed from memory", p.name());
        // Through a checkpoint file.
        let bytes = file::encode_to_vec(&id(model), &tokens[..1000], &[&head, &tail], &fixed);
        assert_eq!(bytes.len(), file::file_bytes(&id(model), 1000));
        let d = file::decode(&bytes, &id(model)).unwrap();
        assert_eq!(d.tokens, tokens[..1000]);
        let mut from_file = model.new_state();
        snapshot::restore(&mut from_file, &[&d.kv], &d.fixed).unwrap();
        let got = run(model, &mut from_file, &tokens[1000..]);
        assert_eq!(bits(&got), bits(&whole), "{}: resumed from a file", p.name());
    });
}

#[test]
fn decode_steps_equal_a_prefill_across_the_piece_boundary() {
    // Decode attention cuts a context past 2048 keys into pieces that
    // workers take and merges them; prefill merges its rows' pieces the same
    // way, so one-token steps from 2040 to 2100 end where one call does.
    let hf = tiny();
    let mut model = hf.model().unwrap();
    let tokens = prompt(2100, 5, model.config.vocab_size);
    each_path(&mut model, |model, p| {
        let mut one = model.new_state();
        let whole = run(model, &mut one, &tokens);
        let mut state = model.new_state();
        let mut last = run(model, &mut state, &tokens[..2040]);
        for (i, t) in tokens[2040..].iter().enumerate() {
            last = run(model, &mut state, std::slice::from_ref(t));
            if i == 7 {
                let mut at_2048 = model.new_state();
                let prefill = run(model, &mut at_2048, &tokens[..2048]);
                assert_eq!(bits(&last), bits(&prefill), "{}: at 2048", p.name());
            }
        }
        assert_eq!(bits(&last), bits(&whole), "{}", p.name());
    });
}

fn sample_file(model: &Model<'_>) -> (Vec<u8>, Vec<u32>) {
    let tokens = prompt(40, 9, model.config.vocab_size);
    let mut state = model.new_state();
    run(model, &mut state, &tokens);
    let kv = KvSpan::capture(&state, 0..40);
    let bytes = file::encode_to_vec(&id(model), &tokens, &[&kv], &Fixed::capture(&state));
    (bytes, tokens)
}

#[test]
fn bad_checkpoint_files_are_refused() {
    let hf = tiny();
    let model = hf.model().unwrap();
    let (bytes, tokens) = sample_file(&model);
    let me = id(&model);
    assert_eq!(file::decode(&bytes, &me).unwrap().tokens, tokens);
    assert_eq!(file::peek_tokens(&bytes[..file::HEADER_BYTES + 160], &me), Ok(tokens.clone()));
    for n in [0, 7, 50, file::HEADER_BYTES, file::HEADER_BYTES + 100, bytes.len() - 1] {
        let e = file::decode(&bytes[..n], &me).unwrap_err();
        assert!(matches!(e, FileError::Truncated | FileError::BadMagic), "{n}: {e:?}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(file::decode(&longer, &me).unwrap_err(), FileError::TrailingBytes);
    // One flipped bit anywhere after the header fields is caught.
    for at in (file::HEADER_BYTES - 8..bytes.len()).step_by(997).chain([bytes.len() - 1]) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        assert_eq!(file::decode(&bad, &me).unwrap_err(), FileError::Checksum, "byte {at}");
    }
    let foreign = Identity { pack: [8; 32], ..me };
    assert_eq!(file::decode(&bytes, &foreign).unwrap_err(), FileError::ForeignPack);
    let shape = Identity { shape: Shape { kv_row: me.shape.kv_row + 1, ..me.shape }, ..me };
    assert_eq!(file::decode(&bytes, &shape).unwrap_err(), FileError::Shape);
    let other_kv = if me.kv == KvPrecision::F16 { KvPrecision::F32 } else { KvPrecision::F16 };
    let kv = Identity { kv: other_kv, ..me };
    assert_eq!(file::decode(&bytes, &kv).unwrap_err(), FileError::Shape);
    let mut version = bytes.clone();
    version[8] = 9;
    assert_eq!(file::decode(&version, &me).unwrap_err(), FileError::Version(9));
    let mut engine = bytes.clone();
    engine[12] ^= 1;
    assert_eq!(file::decode(&engine, &me).unwrap_err(), FileError::Engine);
    let mut magic = bytes;
    magic[0] = b'X';
    assert_eq!(file::decode(&magic, &me).unwrap_err(), FileError::BadMagic);
}

#[test]
fn the_sizing_counts_what_states_hold() {
    let hf = tiny();
    let model = hf.model().unwrap();
    let shape = Shape::of(&model.config);
    let mut state = model.new_state();
    run(&model, &mut state, &prompt(100, 1, model.config.vocab_size));
    let kv = state.kv_bytes();
    assert_eq!(shape.kv_bytes(100, model.options().kv), kv);
    assert_eq!(shape.fixed_bytes() + kv, state.bytes());
    assert_eq!(KvSpan::capture(&state, 0..100).bytes(), kv);
    assert_eq!(Fixed::capture(&state).bytes(), shape.fixed_bytes());
}

#[test]
fn a_file_encoded_piece_by_piece_equals_the_whole() {
    let hf = tiny();
    let model = hf.model().unwrap();
    let mut state = model.new_state();
    let tokens = prompt(37, 5, model.config.vocab_size);
    run(&model, &mut state, &tokens);
    let (head, tail) = (KvSpan::capture(&state, 0..20), KvSpan::capture(&state, 20..37));
    let fixed = Fixed::capture(&state);
    let whole = file::encode_to_vec(&id(&model), &tokens, &[&head, &tail], &fixed);
    for budget in [1, 3, 92, 1000, 65_536, 1 << 20] {
        let (mut out, mut cursor, mut calls) = (Vec::new(), file::EncodeCursor::default(), 0);
        while !file::encode_some(
            &id(&model),
            &tokens,
            &[&head, &tail],
            &fixed,
            &mut cursor,
            budget,
            &mut |b| out.extend_from_slice(b),
        ) {
            calls += 1;
            assert!(
                out.len() <= calls * (budget + 4),
                "budget {budget}: {} bytes after {calls} calls",
                out.len()
            );
        }
        assert!(cursor.done());
        assert_eq!(out, whole, "budget {budget}");
        assert!(
            calls + 1 >= whole.len() / (budget + 4).max(1) / 2,
            "budget {budget}: {calls} calls"
        );
    }
    assert!(file::decode(&whole, &id(&model)).is_ok());
}
