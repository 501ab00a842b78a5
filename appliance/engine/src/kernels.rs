//! The numeric kernels every matrix product goes through. This is the generic,
//! portable implementation; faster ones (SIMD, a worker pool) replace the
//! bodies here without changing the model code.

use alloc::vec;

use crate::weights::Linear;

/// Batched matrix product: for each of `tokens` rows of `x` (`[tokens, cols]`),
/// `y[t] = W x[t]`, so `y` is `[tokens, rows]`. Each weight row is decoded
/// once per call and reused for every token (prefill reads weights once).
pub fn matmul(w: &Linear<'_>, x: &[f32], tokens: usize, y: &mut [f32]) {
    let (rows, cols) = (w.rows(), w.cols());
    assert_eq!(x.len(), tokens * cols, "matmul input shape");
    assert_eq!(y.len(), tokens * rows, "matmul output shape");
    let mut row = vec![0.0f32; cols];
    for r in 0..rows {
        w.decode_row(r, &mut row);
        for t in 0..tokens {
            y[t * rows + r] = dot(&row, &x[t * cols..(t + 1) * cols]);
        }
    }
}

/// Single-vector product `y = W x` (`x` is `[cols]`, `y` is `[rows]`).
pub fn matvec(w: &Linear<'_>, x: &[f32], y: &mut [f32]) {
    matmul(w, x, 1, y);
}

/// Dot product of equal-length slices, with 8 partial sums.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    acc.iter().sum::<f32>() + tail
}
