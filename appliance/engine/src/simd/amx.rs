//! AMX-BF16 GEMM for NVFP4 products over several tokens (`Path::Amx`, opt-in).
//!
//! An NVFP4 weight is exact in bf16: an E2M1 value has at most two
//! significant bits and an E4M3 block scale four, so their product needs six
//! of bf16's eight. A worker's chunk of rows is decoded once into bf16 A
//! tiles (16 rows x 32 columns, the block scales folded in, the tensor's
//! global scale applied to the output); the activations are rounded to bf16
//! (round to nearest even) and laid out as B tiles (per group of 16 tokens,
//! a row of 16 dwords per column pair, one bf16 pair per token). Then
//! `tdpbf16ps` accumulates 16 rows x 16 tokens in f32 per tile, 2 x 2 tiles
//! at a time, over the whole row. Products of fewer tokens (decode, batched
//! decode, verification: `kernels::AMX_MIN_TOKENS`) keep the VNNI kernel.
//!
//! Each output element's sum runs over the columns in the same order
//! whatever the batch, so a token's result is the same in every AMX
//! product; it differs in the last bits from the VNNI result (bf16 rather
//! than int8 activations), which is why the path is opted into and never
//! chosen automatically.
//!
//! The tile instructions are written as inline assembly (their intrinsics
//! are not stable Rust); tile state is configured and released around each
//! call, so no tile state outlives it.

use alloc::vec::Vec;
use core::arch::asm;
use core::arch::x86_64::*;

use kore_pack_format::fp::e4m3_to_f32;

use super::x86::{e4m3x16, E4m3Scale, E2M1};

/// Weight rows per A tile (and output rows per C tile).
pub(crate) const ROWS: usize = 16;
/// Tokens per B tile.
pub(crate) const TOKENS: usize = 16;
/// Columns per tile step (32 bf16 = 64 bytes a tile row).
pub(crate) const K: usize = 32;

/// Whether the AMX kernel takes a product of `rows x cols`: whole tiles.
pub(crate) fn fits(rows: usize, cols: usize) -> bool {
    rows % ROWS == 0 && cols % K == 0 && cols > 0
}

/// Activations `[tokens, cols]` as B tiles: group `g` of 16 tokens holds
/// `cols / 2` rows of 16 dwords; row `j`, column `t` is token `16g + t`'s
/// pair `(x[2j], x[2j + 1])` in bf16 (low half first). Tokens past the end
/// of the last group are zero.
///
/// # Safety
/// AVX-512 F/BW must be available; `x.len() == tokens * cols`, `cols % 32 == 0`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack(x: &[f32], tokens: usize, cols: usize) -> Vec<u32> {
    debug_assert!(x.len() == tokens * cols && cols % K == 0);
    let groups = tokens.div_ceil(TOKENS);
    let pairs = cols / 2;
    let mut out = alloc::vec![0u32; groups * pairs * TOKENS];
    // Words 1, 3, .., 63 of two vectors: the high halves, i.e. the bf16s.
    let high = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19,
        17, 15, 13, 11, 9, 7, 5, 3, 1,
    );
    let rows = lane_times_tokens();
    for t in 0..tokens {
        let base = (t / TOKENS) * pairs * TOKENS + t % TOKENS;
        for m in 0..cols / K {
            // SAFETY: 32 floats at t * cols + 32m are inside `x`; the 16
            // dwords at base + (16m + j) * 16, j < 16, are inside `out`.
            unsafe {
                let p = x.as_ptr().add(t * cols + K * m);
                let (a, b) = (bf16_high(_mm512_loadu_ps(p)), bf16_high(_mm512_loadu_ps(p.add(16))));
                let v = _mm512_permutex2var_epi16(a, high, b);
                let dst = out.as_mut_ptr().add(base + 16 * m * TOKENS);
                _mm512_i32scatter_epi32::<4>(dst.cast(), rows, v);
            }
        }
    }
    out
}

/// Lane `i` holds `16 i`: the dword offsets of one column of a 16 x 16 tile
/// (a B tile's column of pairs, a C tile's column of rows).
#[inline]
#[target_feature(enable = "avx512f")]
fn lane_times_tokens() -> __m512i {
    _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0)
}

/// Each f32 of `x` rounded to bf16 (`types::bf16_bits`) in its high 16 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn bf16_high(x: __m512) -> __m512i {
    let b = _mm512_castps_si512(x);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), lsb);
    let nan = _mm512_or_si512(b, _mm512_set1_epi32(0x40 << 16));
    _mm512_mask_blend_epi32(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), r, nan)
}

/// Decodes `rows` NVFP4 rows (`packed`: `rows * cols / 2` bytes, `scales`:
/// `rows * cols / 16`) into `out` as A tiles: strip `s` of 16 rows, step
/// `k` of 32 columns is 1 KiB at `(s * cols / 32 + k) * 512` (16 rows of 32
/// bf16). The values are `E2M1 x E4M3` exactly; the global scale is not in.
///
/// # Safety
/// AVX-512 F/BW must be available; `rows % 16 == 0`, `cols % 32 == 0`, the
/// slices as above, `out.len() == rows * cols`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn decode(
    packed: &[u8],
    scales: &[u8],
    rows: usize,
    cols: usize,
    out: &mut [u16],
) {
    debug_assert!(fits(rows, cols) && packed.len() == rows * cols / 2);
    debug_assert!(scales.len() == rows * cols / 16 && out.len() == rows * cols);
    let steps = cols / K;
    // Word 2i + 1 of the table pair is the high half (the bf16) of entry i;
    // words 32.. come from the second block's table.
    let off = _mm512_set_epi32(
        0x0021_0021,
        0x0021_0021,
        0x0021_0021,
        0x0021_0021,
        0x0021_0021,
        0x0021_0021,
        0x0021_0021,
        0x0021_0021,
        0x0001_0001,
        0x0001_0001,
        0x0001_0001,
        0x0001_0001,
        0x0001_0001,
        0x0001_0001,
        0x0001_0001,
        0x0001_0001,
    );
    // SAFETY: E2M1 is 16 f32 = 64 bytes.
    let e2m1 = unsafe { _mm512_loadu_ps(E2M1.as_ptr()) };
    let one = E4m3Scale::new(1.0);
    let mut sc = [0f32; 16];
    for r in 0..rows {
        let (s, i) = (r / ROWS, r % ROWS);
        for k in 0..steps {
            // The scales of the next 8 steps (256 columns) at once where
            // they exist, else one pair.
            let sat = r * cols / 16 + 2 * k;
            if k % 8 == 0 && k + 8 <= steps {
                // SAFETY: 16 scale bytes at `sat` (k + 8 <= steps); AVX-512 F.
                unsafe {
                    _mm512_storeu_ps(sc.as_mut_ptr(), e4m3x16(scales.as_ptr().add(sat), one))
                };
            } else if k >= steps - steps % 8 {
                sc[2 * (k % 8)] = e4m3_to_f32(scales[sat]);
                sc[2 * (k % 8) + 1] = e4m3_to_f32(scales[sat + 1]);
            }
            let t0 = _mm512_mul_ps(e2m1, _mm512_set1_ps(sc[2 * (k % 8)]));
            let t1 = _mm512_mul_ps(e2m1, _mm512_set1_ps(sc[2 * (k % 8) + 1]));
            let at = r * cols / 2 + 16 * k;
            // SAFETY: 16 bytes at `at` are inside `packed` (at + 16 <= rows
            // * cols / 2); 64 bytes at the tile row are inside `out`.
            unsafe {
                let d = _mm512_cvtepu8_epi32(_mm_loadu_si128(packed.as_ptr().add(at).cast()));
                let lo = _mm512_slli_epi32::<1>(_mm512_and_si512(d, _mm512_set1_epi32(0x0F)));
                let hi = _mm512_slli_epi32::<13>(_mm512_and_si512(d, _mm512_set1_epi32(0xF0)));
                let idx = _mm512_or_si512(_mm512_or_si512(lo, hi), off);
                let w = _mm512_permutex2var_epi16(
                    _mm512_castps_si512(t0),
                    idx,
                    _mm512_castps_si512(t1),
                );
                let dst = out.as_mut_ptr().add((s * steps + k) * ROWS * K + i * K);
                _mm512_storeu_si512(dst.cast(), w);
            }
        }
    }
}

/// Tile configuration (palette 1): every tile register used here is 16
/// rows of 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes per row, little-endian u16
        c[48 + t] = 16; // rows
        t += 1;
    }
    Config(c)
};

/// `y[t * ld + r] = gs * sum_c a[r][c] x[t][c]` for the `rows` decoded rows
/// in `a` ([`decode`]) and the packed tokens `b` ([`pack`], `tokens` of them).
///
/// # Safety
/// AVX-512 F, AMX-TILE and AMX-BF16 must be usable by this thread (the OS
/// has granted the tile data state); `a` holds `rows` rows of `cols` columns
/// as [`decode`] lays them out, `b` holds `tokens.div_ceil(16)` groups of
/// `cols / 2` rows as [`pack`] lays them out; `y` is valid for writes at
/// `t * ld + r` for `t < tokens`, `r < rows`, and nothing else accesses those.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)] // the two operands, shape, scale and output
pub(crate) unsafe fn gemm(
    a: &[u16],
    b: &[u32],
    rows: usize,
    cols: usize,
    tokens: usize,
    gs: f32,
    y: *mut f32,
    ld: usize,
) {
    debug_assert!(fits(rows, cols) && a.len() == rows * cols);
    let (strips, groups, steps) = (rows / ROWS, tokens.div_ceil(TOKENS), cols / K);
    debug_assert!(b.len() == groups * cols / 2 * TOKENS);
    let mut c = [[0f32; 256]; 4];
    let column = lane_times_tokens();
    // SAFETY: the caller guarantees AMX is usable; CONFIG is a valid palette-1
    // configuration (8 tiles of 16 x 64 bytes).
    unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
    // Token groups outside: a pair's B tiles stay in L2 while every strip
    // of the (decoded, L2-sized) rows passes them.
    for g in (0..groups).step_by(2) {
        let two_g = g + 1 < groups;
        for s in (0..strips).step_by(2) {
            let two_s = s + 1 < strips;
            // Tiles 0-3: C (strip s/s+1 x group g/g+1); 4, 5: A; 6, 7: B.
            // SAFETY: tile ops on configured tiles, no memory access.
            unsafe {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            }
            for k in 0..steps {
                let a0 = a[(s * steps + k) * ROWS * K..].as_ptr();
                let a1 = if two_s { a[((s + 1) * steps + k) * ROWS * K..].as_ptr() } else { a0 };
                let b0 = b[(g * cols / 2 + k * K / 2) * TOKENS..].as_ptr();
                let b1 = if two_g {
                    b[((g + 1) * cols / 2 + k * K / 2) * TOKENS..].as_ptr()
                } else {
                    b0
                };
                // SAFETY: each tile load reads 16 rows of 64 bytes at a
                // 64-byte stride from the tile start: a 1 KiB A tile inside
                // `a`, 16 B rows of 16 dwords inside `b` (by the layouts).
                unsafe {
                    asm!(
                        "tileloadd tmm4, [{a0} + {st}*1]",
                        "tileloadd tmm5, [{a1} + {st}*1]",
                        "tileloadd tmm6, [{b0} + {st}*1]",
                        "tileloadd tmm7, [{b1} + {st}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0, b1 = in(reg) b1,
                        st = in(reg) 64usize,
                        options(nostack, readonly),
                    );
                }
            }
            // SAFETY: each store writes 16 rows of 64 bytes = one [f32; 256].
            unsafe {
                asm!(
                    "tilestored [{c0} + {st}*1], tmm0",
                    "tilestored [{c1} + {st}*1], tmm1",
                    "tilestored [{c2} + {st}*1], tmm2",
                    "tilestored [{c3} + {st}*1], tmm3",
                    c0 = in(reg) c[0].as_mut_ptr(), c1 = in(reg) c[1].as_mut_ptr(),
                    c2 = in(reg) c[2].as_mut_ptr(), c3 = in(reg) c[3].as_mut_ptr(),
                    st = in(reg) 64usize,
                    options(nostack),
                );
            }
            for (q, cq) in c.iter().enumerate() {
                let (ds, dg) = (q / 2, q % 2);
                if (ds == 1 && !two_s) || (dg == 1 && !two_g) {
                    continue;
                }
                let (r0, t0) = ((s + ds) * ROWS, (g + dg) * TOKENS);
                for t in 0..TOKENS.min(tokens - t0) {
                    // SAFETY: column t of the C tile (16 floats at a stride
                    // of 16) is inside `cq`; the 16 outputs of token t0 + t,
                    // rows r0..r0 + 16, are inside `y` by the contract.
                    unsafe {
                        let v = _mm512_i32gather_ps::<4>(column, cq.as_ptr().add(t).cast());
                        let v = _mm512_mul_ps(v, _mm512_set1_ps(gs));
                        _mm512_storeu_ps(y.add((t0 + t) * ld + r0), v);
                    }
                }
            }
        }
    }
    // SAFETY: releases the tile state configured above.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Whether the OS has granted this process the AMX tile data state, asked
/// for on the first call (Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`) and remembered. Elsewhere (the Kore guest, other
/// systems) false.
pub(crate) fn tile_state_granted() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    /// 0 = not asked yet, 1 = refused, 2 = granted.
    static GRANT: AtomicU8 = AtomicU8::new(0);
    match GRANT.load(Ordering::Relaxed) {
        0 => {
            let granted = request_tile_state();
            GRANT.store(1 + u8::from(granted), Ordering::Relaxed);
            granted
        }
        g => g == 2,
    }
}

fn request_tile_state() -> bool {
    #[cfg(all(feature = "std", target_os = "linux"))]
    {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM) only changes which extended
        // states this process may use; the syscall clobbers rcx and r11.
        unsafe {
            asm!("syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _, lateout("r11") _, options(nostack));
        }
        ret == 0
    }
    #[cfg(not(all(feature = "std", target_os = "linux")))]
    false
}

#[cfg(test)]
mod tests {
    use super::super::types::bf16_bits;
    use super::*;

    fn round_bf16(x: f32) -> f32 {
        f32::from_bits(bf16_bits(x) << 16)
    }

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to the even one.
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 1.0 / 64.0);
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
        assert!(round_bf16(f32::NAN).is_nan());
    }

    #[test]
    fn pack_places_pairs_by_token_column() {
        let (tokens, cols) = (17, 32);
        // Values that round up, down and to even, a NaN and infinities.
        let mut x: Vec<f32> = (0..tokens * cols).map(|i| 1.0 + i as f32 * 0.0037).collect();
        x[5] = f32::NAN;
        x[6] = f32::INFINITY;
        x[7] = -f32::MAX;
        if !std::is_x86_feature_detected!("avx512bw") {
            eprintln!("no AVX-512 on this CPU: the packing is never used here");
            return;
        }
        // SAFETY: AVX-512 checked; 17 tokens of 32 columns.
        let p = unsafe { pack(&x, tokens, cols) };
        assert_eq!(p.len(), 2 * cols / 2 * 16);
        for t in 0..tokens {
            for j in 0..cols / 2 {
                let (a, b) = (x[t * cols + 2 * j], x[t * cols + 2 * j + 1]);
                let at = (t / 16) * cols / 2 * 16 + j * 16 + t % 16;
                assert_eq!(p[at], bf16_bits(a) | (bf16_bits(b) << 16), "token {t} pair {j}");
            }
        }
        // The padding tokens of the last group are zero.
        assert!((17..32).all(|t| p[cols / 2 * 16 + t % 16] == 0));
    }
}
