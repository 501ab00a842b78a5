//! What every kernel shares, portable and per-ISA alike: tile sizes, matrix
//! views, the activations' int8 form, the KV cache's element types and the
//! constants of the int8 kernels' offsets. A leaf: it imports nothing of the
//! engine, so the per-ISA modules, the generic twins and the dispatch can all
//! build on it without importing one another (llama.cpp's `ggml-cpu-impl.h`
//! and `quants.h` in that shape).

/// Most tokens per weight pass (a row kernel keeps one accumulator per token
/// in registers; 16 spilled them and measured 1.2-1.8x slower per token).
pub const TILE: usize = 8;

/// Most weight rows per tile of the int8 GEMM kernels: the row dimension of
/// their output block.
pub const TILE_ROWS: usize = 4;

/// Columns per F16 scale of a q8 weight (`Linear::Q8`).
pub const Q8_GROUP: usize = 32;

/// The offset added to every doubled E2M1 weight byte by the int8 NVFP4
/// kernels (`vpdpbusd` and `vpmaddubsw` want one unsigned operand): 0..=24.
pub const NVFP4_OFFSET: i32 = 12;

/// Which block of a 128-column chunk each dword lane of the AVX2 NVFP4
/// tile (`simd::avx2_q8`) holds: two plain 32-byte loads of a row's 64
/// packed bytes and two in-lane `vshufps` put blocks `[0, 1, 4, 5 | 2, 3, 6,
/// 7]` in lanes 0..8 (no cross-lane move: on Zen 1 the `[0 | 2]`, `[1 | 3]`
/// loads of natural order cost 1.13x a one-token product). Its own inverse:
/// block `b` sits in lane `AVX2_BLOCK_LANES[b]`.
pub const AVX2_BLOCK_LANES: [usize; 8] = [0, 1, 4, 5, 2, 3, 6, 7];

/// The offset added to every q8 weight byte by the int8 q8 kernel (a flip
/// of the sign bit): 0..=255.
pub const Q8_OFFSET: i32 = 128;

/// A row-major f32 matrix view: element `(i, j)` is `data[i * ld + j]`.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    /// The elements (at least `(rows - 1) * ld + cols` of them).
    pub data: &'a [f32],
    /// Row stride in elements.
    pub ld: usize,
}

/// A mutable [`Mat`].
#[derive(Debug)]
pub struct MatMut<'a> {
    /// The elements (at least `(rows - 1) * ld + cols` of them).
    pub data: &'a mut [f32],
    /// Row stride in elements.
    pub ld: usize,
}

/// One token's inputs to the gated delta rule on one value head.
#[derive(Clone, Copy, Debug)]
pub struct DeltaToken<'a> {
    /// Key `[dk]` (L2-normalised).
    pub k: &'a [f32],
    /// Query `[dk]` (L2-normalised, scaled by 1/sqrt(dk)).
    pub q: &'a [f32],
    /// Value `[dv]`.
    pub v: &'a [f32],
    /// Decay `exp(g)` in (0, 1].
    pub g: f32,
    /// Write strength in (0, 1).
    pub beta: f32,
}

/// Quantized activations of some tokens, each token's rows `cols` (q) and
/// `cols / group` (corr, scale) long, laid out per chunk as one kernel wants
/// them (`kernels::q8act`).
#[derive(Clone, Copy, Debug)]
pub struct Q8In<'a> {
    /// int8 activations, token `t`'s at `t * stride`.
    pub q: &'a [i8],
    /// Bytes of `q` from one token to the next: `cols` for the AVX-512
    /// kernels, `cols + 256` for the AVX2 tile (`kernels::q8act`).
    pub stride: usize,
    /// `-OFFSET * sum(q)` per group of columns (the kernel's offset:
    /// [`NVFP4_OFFSET`] or [`Q8_OFFSET`]).
    pub corr: &'a [i32],
    /// The block's activation scale per group of columns (halved for the
    /// NVFP4 kernels, whose weights are doubled).
    pub scale: &'a [f32],
}

/// The element type of dense weights, as the dense row kernels take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dense {
    /// f32.
    F32,
    /// bf16.
    Bf16,
    /// IEEE f16.
    F16,
}

impl Dense {
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            Dense::F32 => 4,
            Dense::Bf16 | Dense::F16 => 2,
        }
    }

    /// Element `i` of `data` as f32 (exact).
    #[inline]
    pub fn get(self, data: &[u8], i: usize) -> f32 {
        match self {
            Dense::F32 => {
                f32::from_le_bytes([data[4 * i], data[4 * i + 1], data[4 * i + 2], data[4 * i + 3]])
            }
            Dense::Bf16 => {
                f32::from_bits(u32::from(u16::from_le_bytes([data[2 * i], data[2 * i + 1]])) << 16)
            }
            Dense::F16 => half::f16::from_le_bytes([data[2 * i], data[2 * i + 1]]).to_f32(),
        }
    }
}

/// `x` rounded to bf16 (nearest even, NaN kept quiet with its sign): the
/// high 16 bits of the f32 that AMX tiles multiply.
#[inline]
pub fn bf16_bits(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        return (b >> 16) | 0x40;
    }
    (b + 0x7FFF + ((b >> 16) & 1)) >> 16
}

/// An element type of the KV cache.
pub trait KvElem: Copy + Default + Send + Sync + 'static {
    /// Whether the bits are IEEE f16 (`u16`); otherwise the type is `f32`.
    const F16: bool;
    /// Rounds an f32 to this type (round to nearest even).
    fn from_f32(x: f32) -> Self;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
}

impl KvElem for f32 {
    const F16: bool = false;
    #[inline]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

/// f16 stored as its bits.
impl KvElem for u16 {
    const F16: bool = true;
    #[inline]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x).to_bits()
    }
    #[inline]
    fn to_f32(self) -> f32 {
        half::f16::from_bits(self).to_f32()
    }
}
