//! Test helpers that need nothing of the library (on its lowest floor, so every module's
//! tests may use them): a seeded random generator, tolerant comparisons, and the error
//! bound of x quantized for integer dot products.

/// A small deterministic generator (xorshift64*), so tests need no extra crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// RoPE's cos/sin for `rows` rows of `half` frequencies (rope.rs's layout), at random
    /// angles in [0, 3).
    pub fn cos_sin(&mut self, rows: usize, half: usize) -> Vec<f32> {
        (0..rows * half)
            .flat_map(|_| {
                let a = self.uniform() * 3.0;
                [a.cos(), a.sin()]
            })
            .collect()
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Assert |a - b| <= atol + rtol * |b| elementwise, with a helpful message.
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f32], atol: f32, rtol: f32, what: &str) {
    assert_close_plus(got, want, atol, rtol, &[], what);
}

/// [`assert_close`] with `extra[i]` (where given) added to element i's tolerance.
#[track_caller]
pub fn assert_close_plus(
    got: &[f32],
    want: &[f32],
    atol: f32,
    rtol: f32,
    extra: &[f32],
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(
            g.is_finite() == w.is_finite(),
            "{what}[{i}]: got {g}, want {w}"
        );
        let tol = atol + rtol * w.abs() + extra.get(i).copied().unwrap_or(0.0);
        if w.is_finite() && err > tol && err > worst.1 {
            worst = (i, err);
        }
    }
    assert!(
        worst.1 == 0.0,
        "{what}[{}]: got {}, want {} (|Δ| = {})",
        worst.0,
        got[worst.0],
        want[worst.0],
        worst.1
    );
}

/// The most x quantized for integer dot products (the GEMVs' of
/// matmul_dot.wgsl, the CPU executor's) may add to |x · w|: each x value is held to within
/// its 32-block's max|x| / 64516, so Σ over blocks of that times Σ|w|.
pub fn x_split_bound(x: &[f32], w: &[f32]) -> f32 {
    let per_block = x.chunks(32).zip(w.chunks(32)).map(|(xb, wb)| {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        amax / 64516.0 * wb.iter().map(|v| v.abs()).sum::<f32>()
    });
    per_block.sum::<f32>() * 1.01
}

/// The most x rounded to f16 (the tensor-core GEMMs' for q4 weights, kernels/matmul.rs
/// `coop_x_f16`) may add to |x · w|, given `abs_dot` = Σ|x|·|w|: each x value is held to
/// within 2^-11 of itself in f16's normal range (and 2^-25 below it, under the tolerances).
pub fn x_f16_bound(abs_dot: f32) -> f32 {
    abs_dot / 2048.0 * 1.01
}

/// Σ|a|·|b|: what [`x_f16_bound`] takes for one dot product.
pub fn abs_dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| (a * b).abs()).sum()
}
