//! The checkpoint file: one checkpoint (token prefix, fixed part, the keys
//! and values of every position), self-contained, in little-endian order:
//!
//! ```text
//! header (92 bytes)
//!   magic "KORECKPT" | format version u32 | engine version [u8; 16] (zero-padded)
//!   pack identity [u8; 32] | shape: layers, attention layers, kv row, fixed floats (u32 each)
//!   kv precision u8 (0 f32, 1 f16) + 3 zero bytes | token count n u32 | tokens hash u64
//! tokens      n x u32
//! fixed part  fixed floats x f32
//! keys/values per attention layer: keys n x kv row, values n x kv row (f32 or f16)
//! checksum    u64 over everything before it
//! ```
//!
//! [`decode`] accepts a file only when every header field matches what the
//! reader expects ([`Identity`]), the length is exact, the checksum and the
//! tokens hash agree: a truncated, corrupt, foreign-pack, other-shape or
//! other-version file is an error, never a state.

use alloc::vec::Vec;

use super::{Fixed, KvSpan, Shape};
use crate::state::{Kv, KvPrecision};

/// The first bytes of every checkpoint file.
pub const MAGIC: [u8; 8] = *b"KORECKPT";
/// Version of this layout.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the tokens.
pub const HEADER_BYTES: usize = 92;
/// The engine version written to and expected in every file.
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What a reader expects of a checkpoint: the pack it belongs to (any 32
/// bytes naming the weights, e.g. the pack's digest), the model's shape
/// and the KV precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The weights' identity.
    pub pack: [u8; 32],
    /// The model's checkpoint shape.
    pub shape: Shape,
    /// Precision of the keys and values.
    pub kv: KvPrecision,
}

/// Why a checkpoint file was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileError {
    /// Shorter than its header says.
    Truncated,
    /// Longer than its header says.
    TrailingBytes,
    /// Not a checkpoint file.
    BadMagic,
    /// Another format version.
    Version(u32),
    /// Written by another engine version.
    Engine,
    /// Belongs to other weights.
    ForeignPack,
    /// Another model shape or KV precision.
    Shape,
    /// The checksum or the tokens hash does not match the content.
    Checksum,
}

impl core::fmt::Display for FileError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            FileError::Truncated => "truncated",
            FileError::TrailingBytes => "longer than its header says",
            FileError::BadMagic => "not a Kore checkpoint (bad magic)",
            FileError::Version(_) => "another checkpoint format version",
            FileError::Engine => "written by another engine version",
            FileError::ForeignPack => "belongs to another pack",
            FileError::Shape => "another model shape or KV precision",
            FileError::Checksum => "checksum mismatch (corrupt)",
        };
        f.write_str(s)
    }
}

/// A decoded checkpoint: its tokens, fixed part and keys and values
/// (positions `0..tokens.len()`).
#[derive(Clone, Debug)]
pub struct Decoded {
    /// The token prefix it covers.
    pub tokens: Vec<u32>,
    /// The fixed part at `tokens.len()`.
    pub fixed: Fixed,
    /// Keys and values of every position.
    pub kv: KvSpan,
}

/// Bytes of a file of `tokens` tokens.
pub fn file_bytes(id: &Identity, tokens: usize) -> usize {
    HEADER_BYTES + tokens * 4 + id.shape.fixed_bytes() + id.shape.kv_bytes(tokens, id.kv) + 8
}

/// Hash of a token prefix (the files' key).
pub fn tokens_hash(tokens: &[u32]) -> u64 {
    let mut h = Checksum::new(0x6b6f_7265_746f_6b73);
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.finish()
}

fn engine_field() -> [u8; 16] {
    let mut e = [0u8; 16];
    let v = ENGINE_VERSION.as_bytes();
    let n = v.len().min(16);
    e[..n].copy_from_slice(&v[..n]);
    e
}

fn header(id: &Identity, tokens: &[u32]) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_BYTES);
    h.extend_from_slice(&MAGIC);
    h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    h.extend_from_slice(&engine_field());
    h.extend_from_slice(&id.pack);
    let s = &id.shape;
    for x in [s.layers, s.attention_layers, s.kv_row, s.fixed_floats] {
        h.extend_from_slice(&(x as u32).to_le_bytes());
    }
    h.extend_from_slice(&[u8::from(id.kv == KvPrecision::F16), 0, 0, 0]);
    h.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    h.extend_from_slice(&tokens_hash(tokens).to_le_bytes());
    h
}

/// One run of the file's body: raw bytes (the header) or little-endian words.
enum Part<'a> {
    Bytes(Vec<u8>),
    U32(&'a [u32]),
    F32(&'a [f32]),
    F16(&'a [u16]),
}

impl Part<'_> {
    fn len(&self) -> usize {
        match self {
            Part::Bytes(b) => b.len(),
            Part::U32(x) => x.len(),
            Part::F32(x) => x.len(),
            Part::F16(x) => x.len(),
        }
    }

    fn elem_bytes(&self) -> usize {
        match self {
            Part::Bytes(_) => 1,
            Part::U32(_) | Part::F32(_) => 4,
            Part::F16(_) => 2,
        }
    }

    /// Appends elements `from..to` to `out`, little-endian.
    fn put(&self, from: usize, to: usize, out: &mut Vec<u8>) {
        match self {
            Part::Bytes(b) => out.extend_from_slice(&b[from..to]),
            Part::U32(x) => put_words(&x[from..to], u32::to_le_bytes, out),
            Part::F32(x) => put_words(&x[from..to], f32::to_le_bytes, out),
            Part::F16(x) => put_words(&x[from..to], u16::to_le_bytes, out),
        }
    }
}

fn put_words<T: Copy, const N: usize>(xs: &[T], le: fn(T) -> [u8; N], out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + xs.len() * N, 0);
    for (d, &x) in out[at..].chunks_exact_mut(N).zip(xs) {
        d.copy_from_slice(&le(x));
    }
}

/// The file's body in order (everything before the checksum), its first
/// part `head` (the header, or nothing once it is written: building it
/// hashes every token).
fn parts<'a>(
    id: &Identity,
    head: Vec<u8>,
    tokens: &'a [u32],
    spans: &[&'a KvSpan],
    fixed: &'a Fixed,
) -> Vec<Part<'a>> {
    let mut parts = Vec::with_capacity(3 + 2 * id.shape.attention_layers * spans.len());
    parts.push(Part::Bytes(head));
    parts.push(Part::U32(tokens));
    parts.push(Part::F32(fixed.floats()));
    for layer in 0..id.shape.attention_layers {
        for side in 0..2 {
            for s in spans {
                let (k, v) = &s.layers()[layer];
                parts.push(match if side == 0 { k } else { v } {
                    Kv::F32(x) => Part::F32(x),
                    Kv::F16(x) => Part::F16(x),
                });
            }
        }
    }
    parts
}

/// How far an encoding has gone: [`encode_some`] goes on from it, so that a
/// writer that must not stall (the guest, between engine steps) sends a large
/// file a piece at a time, holding only the piece.
#[derive(Clone, Debug)]
pub struct EncodeCursor {
    part: usize,
    elem: usize,
    sum: Checksum,
    done: bool,
}

impl Default for EncodeCursor {
    fn default() -> Self {
        EncodeCursor { part: 0, elem: 0, sum: Checksum::new(0), done: false }
    }
}

impl EncodeCursor {
    /// Whether the whole file, checksum included, has been written.
    pub fn done(&self) -> bool {
        self.done
    }
}

/// Pieces handed to a sink at most (the writer's buffer).
const PIECE: usize = 1 << 16;

/// Writes about `budget` more bytes (at least one element, whole elements
/// only) of the checkpoint file `tokens` + `spans` + `fixed` to `sink`, in
/// pieces of at most 64 KiB, going on from `cursor`; true once the file is
/// complete. The same arguments must be given at every call; `spans` must
/// cover `0..tokens.len()` in order, and with `fixed` have `id`'s shape
/// (the cache that built them has).
pub fn encode_some(
    id: &Identity,
    tokens: &[u32],
    spans: &[&KvSpan],
    fixed: &Fixed,
    cursor: &mut EncodeCursor,
    budget: usize,
    sink: &mut dyn FnMut(&[u8]),
) -> bool {
    if cursor.done {
        return true;
    }
    let head = if cursor.part == 0 { header(id, tokens) } else { Vec::new() };
    let parts = parts(id, head, tokens, spans, fixed);
    let mut buf = Vec::with_capacity(PIECE.min(budget.max(8)));
    let mut written = 0usize;
    while cursor.part < parts.len() {
        if written >= budget {
            return false;
        }
        let part = &parts[cursor.part];
        let room = (budget - written).min(PIECE) / part.elem_bytes();
        let to = part.len().min(cursor.elem + room.max(1));
        buf.clear();
        part.put(cursor.elem, to, &mut buf);
        if !buf.is_empty() {
            cursor.sum.update(&buf);
            sink(&buf);
        }
        written += buf.len();
        cursor.elem = to;
        if to == part.len() {
            (cursor.part, cursor.elem) = (cursor.part + 1, 0);
        }
    }
    sink(&cursor.sum.finish().to_le_bytes());
    cursor.done = true;
    true
}

/// Writes the whole checkpoint file to `sink` in pieces (see [`encode_some`]).
pub fn encode(
    id: &Identity,
    tokens: &[u32],
    spans: &[&KvSpan],
    fixed: &Fixed,
    sink: &mut dyn FnMut(&[u8]),
) {
    let mut cursor = EncodeCursor::default();
    encode_some(id, tokens, spans, fixed, &mut cursor, usize::MAX, sink);
}

/// The checkpoint as one buffer (see [`encode`]).
pub fn encode_to_vec(id: &Identity, tokens: &[u32], spans: &[&KvSpan], fixed: &Fixed) -> Vec<u8> {
    let mut v = Vec::with_capacity(file_bytes(id, tokens.len()));
    encode(id, tokens, spans, fixed, &mut |b| v.extend_from_slice(b));
    v
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FileError> {
        if self.0.len() < n {
            return Err(FileError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, FileError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, FileError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
}

/// The token prefix a file covers, read from its header and token list
/// only (no checksum check: [`decode`] does that); `bytes` may be just the
/// file's first `HEADER_BYTES + 4 n` bytes.
pub fn peek_tokens(bytes: &[u8], id: &Identity) -> Result<Vec<u32>, FileError> {
    let mut r = Reader(bytes);
    let n = check_header(&mut r, id)?;
    let hash = r.u64()?;
    let raw = r.take(n.checked_mul(4).ok_or(FileError::Truncated)?)?;
    let tokens: Vec<u32> =
        raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    if tokens_hash(&tokens) != hash {
        return Err(FileError::Checksum);
    }
    Ok(tokens)
}

/// Checks the header up to the token count (returned).
fn check_header(r: &mut Reader<'_>, id: &Identity) -> Result<usize, FileError> {
    if r.take(8).map_err(|_| FileError::Truncated)? != MAGIC {
        return Err(FileError::BadMagic);
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(FileError::Version(version));
    }
    if r.take(16)? != engine_field() {
        return Err(FileError::Engine);
    }
    if r.take(32)? != id.pack {
        return Err(FileError::ForeignPack);
    }
    let s = &id.shape;
    for x in [s.layers, s.attention_layers, s.kv_row, s.fixed_floats] {
        if r.u32()? as usize != x {
            return Err(FileError::Shape);
        }
    }
    if r.take(4)? != [u8::from(id.kv == KvPrecision::F16), 0, 0, 0] {
        return Err(FileError::Shape);
    }
    Ok(r.u32()? as usize)
}

/// Reads a whole checkpoint file, checking everything (see the module doc).
pub fn decode(bytes: &[u8], id: &Identity) -> Result<Decoded, FileError> {
    let tokens = peek_tokens(bytes, id)?;
    let n = tokens.len();
    let want = file_bytes(id, n);
    if bytes.len() < want {
        return Err(FileError::Truncated);
    }
    if bytes.len() > want {
        return Err(FileError::TrailingBytes);
    }
    let (body, tail) = bytes.split_at(want - 8);
    let mut sum = Checksum::new(0);
    sum.update(body);
    if sum.finish().to_le_bytes() != tail {
        return Err(FileError::Checksum);
    }
    let mut r = Reader(&body[HEADER_BYTES + 4 * n..]);
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    let fixed = Fixed::from_parts(n, f32s(r.take(id.shape.fixed_bytes())?));
    let elems = n * id.shape.kv_row;
    let read = |r: &mut Reader<'_>| -> Result<Kv, FileError> {
        Ok(match id.kv {
            KvPrecision::F32 => Kv::F32(f32s(r.take(elems * 4)?)),
            KvPrecision::F16 => Kv::F16(
                r.take(elems * 2)?
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
        })
    };
    let mut layers = Vec::with_capacity(id.shape.attention_layers);
    for _ in 0..id.shape.attention_layers {
        let k = read(&mut r)?;
        layers.push((k, read(&mut r)?));
    }
    Ok(Decoded { tokens, fixed, kv: KvSpan::from_parts(0, n, layers) })
}

/// A 64-bit streaming checksum (four multiply-rotate lanes over 32-byte
/// stripes, then a final avalanche): fast and sensitive to every bit, for
/// detecting damage, not for security.
#[derive(Clone, Debug)]
pub struct Checksum {
    lanes: [u64; 4],
    buf: [u8; 32],
    held: usize,
    total: u64,
}

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;

fn round(acc: u64, word: u64) -> u64 {
    acc.wrapping_add(word.wrapping_mul(P2)).rotate_left(31).wrapping_mul(P1)
}

impl Checksum {
    /// A fresh checksum with `seed`.
    pub fn new(seed: u64) -> Checksum {
        let lanes = [seed ^ P1, seed ^ P2, seed ^ P3, seed.wrapping_sub(P1)];
        Checksum { lanes, buf: [0; 32], held: 0, total: 0 }
    }

    fn stripe(&mut self, s: &[u8]) {
        for (lane, w) in self.lanes.iter_mut().zip(s.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            *lane = round(*lane, u64::from_le_bytes(a));
        }
    }

    /// Adds `data`.
    pub fn update(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.held > 0 {
            let n = (32 - self.held).min(data.len());
            self.buf[self.held..self.held + n].copy_from_slice(&data[..n]);
            self.held += n;
            data = &data[n..];
            if self.held < 32 {
                return;
            }
            let b = self.buf;
            self.stripe(&b);
            self.held = 0;
        }
        let mut stripes = data.chunks_exact(32);
        for s in &mut stripes {
            self.stripe(s);
        }
        let rest = stripes.remainder();
        self.buf[..rest.len()].copy_from_slice(rest);
        self.held = rest.len();
    }

    /// The checksum of everything added.
    pub fn finish(&self) -> u64 {
        let mut h = self.total.wrapping_mul(P3);
        for (i, &l) in self.lanes.iter().enumerate() {
            h = round(h ^ l.rotate_left(i as u32 * 13), l);
        }
        for &b in &self.buf[..self.held] {
            h = round(h, u64::from(b) ^ 0xA5);
        }
        h ^= h >> 33;
        h = h.wrapping_mul(P2);
        h ^= h >> 29;
        h = h.wrapping_mul(P3);
        h ^ (h >> 32)
    }
}
