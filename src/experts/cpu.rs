//! Routed experts on the CPU: SwiGLU experts computed straight from the weights' stored
//! bytes (a memory-mapped file's: no copy, no conversion), in every stored format (f32,
//! bf16, f16, FP8 block-scaled, q8, q4). Issue 22's executor: a hybrid run computes here the
//! experts it did not make resident on the GPU instead of uploading them.
//!
//! A matrix product spreads its output rows over rayon's threads. A weight row is decoded
//! block by block (a scale's block, or 256 elements of a float row) into f32 on the stack,
//! and each block's dot product with x is taken in 8 independent sums, which the compiler
//! vectorizes: with AVX2 and FMA where the CPU has them (checked at run time), NEON on
//! aarch64, SSE2 otherwise; q4, q8 and FP8 rows have AVX2 code of their own. Nothing is
//! allocated per row, and an expert's intermediates live in a scratch vector its caller
//! keeps.

use crate::error::{Error, Result};
use crate::weights::quant::{e4m3_to_f32, FP8_BLOCK};
use crate::weights::{QFormat, WFormat};
use rayon::prelude::*;

/// The most elements a decoded block holds (q4 / q8 blocks are 32 ..= 256, FP8's 128,
/// float rows go 256 at a time).
const MAX_BLOCK: usize = 256;

/// One `[n, k]` matrix as stored: the rows' bytes and, for quantized formats, the scale
/// tensor's bytes (bf16 per row block for q8 / q4, f32 `scale_inv` per 128 × 128 block for
/// FP8), both little-endian as in the safetensors file.
#[derive(Clone, Copy, Debug)]
pub struct CpuMatrix<'a> {
    pub format: WFormat,
    pub w: &'a [u8],
    pub scale: &'a [u8],
    pub n: usize,
    pub k: usize,
}

impl<'a> CpuMatrix<'a> {
    /// Checks the byte lengths against the shape and format; `what` names the tensor in the
    /// error.
    pub fn new(
        what: &str,
        format: WFormat,
        w: &'a [u8],
        scale: &'a [u8],
        n: usize,
        k: usize,
    ) -> Result<CpuMatrix<'a>> {
        let (row, scales) = match format {
            WFormat::Float(d) => (k * d.size(), 0),
            WFormat::Quant(q) => {
                if let QFormat::Q8 { block } | QFormat::Q4 { block } = q {
                    QFormat::check_block(block, what)?;
                }
                let [a, b] = q.scale_shape(n, k);
                let each = if q == QFormat::Fp8 { 4 } else { 2 };
                (q.file_row_bytes(k), a * b * each)
            }
        };
        if w.len() != n * row || scale.len() != scales {
            return Err(Error::msg(format!(
                "{what}: {} bytes of weights and {} of scales where a [{n}, {k}] {format:?} matrix has {} and {scales}",
                w.len(),
                scale.len(),
                n * row
            )));
        }
        Ok(CpuMatrix {
            format,
            w,
            scale,
            n,
            k,
        })
    }

    /// `y[i] = Σ_j W[row0 + i, j] · x[j]` for the rows `y` holds.
    fn rows_into(&self, x: &[f32], y: &mut [f32], row0: usize) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU has AVX2 and FMA (checked just above).
            unsafe { rows_avx2(self, x, y, row0) };
            return;
        }
        rows_generic(self, x, y, row0);
    }

    /// `y = W · x` (`y` has `n` elements, `x` has `k`), the rows spread over rayon's
    /// threads in chunks of about a quarter of `n` per thread (8 ..= 512 rows).
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        assert!(
            x.len() >= self.k && y.len() >= self.n,
            "CpuMatrix::matvec: short x or y"
        );
        let chunk = (self.n / (4 * rayon::current_num_threads()).max(1)).clamp(8, 512);
        y[..self.n]
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(c, ys)| self.rows_into(x, ys, c * chunk));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(m: &CpuMatrix, x: &[f32], y: &mut [f32], row0: usize) {
    match m.format {
        WFormat::Quant(q @ (QFormat::Q4 { block } | QFormat::Q8 { block }))
            if m.k.is_multiple_of(block) =>
        {
            for (i, out) in y.iter_mut().enumerate() {
                *out = quant_row_avx2(m, q, block, row0 + i, x);
            }
        }
        WFormat::Quant(QFormat::Fp8) if m.k.is_multiple_of(FP8_BLOCK) => {
            for (i, out) in y.iter_mut().enumerate() {
                *out = fp8_row_avx2(m, row0 + i, x);
            }
        }
        _ => rows_generic(m, x, y, row0),
    }
}

/// An FP8 row (whole 128-column blocks) against x with AVX2: 8 e4m3 bytes at a time become
/// f32 on the bits (sign to bit 31, exponent and mantissa shifted into f32's and rescaled
/// by 2^120 for the bias, which also gives the subnormals; 0x7F / 0xFF stay NaN), each
/// block's sums scaled by its `scale_inv`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fp8_row_avx2(m: &CpuMatrix, r: usize, x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let k = m.k;
    let nbk = k / FP8_BLOCK;
    let row = &m.w[r * k..(r + 1) * k];
    let scales = &m.scale[4 * (r / FP8_BLOCK) * nbk..4 * (r / FP8_BLOCK + 1) * nbk];
    let low7 = _mm256_set1_epi32(0x7f);
    let sign = _mm256_set1_epi32(0x80);
    let bias = _mm256_set1_ps(f32::from_bits((127 + 120) << 23));
    let nan = _mm256_set1_ps(f32::NAN);
    let mut total = _mm256_setzero_ps();
    for bi in 0..nbk {
        let mut acc = _mm256_setzero_ps();
        for c in 0..FP8_BLOCK / 8 {
            let j = bi * FP8_BLOCK + 8 * c;
            // SAFETY: j + 8 <= k (whole blocks): the 8 bytes lie in the row, x holds k.
            let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.as_ptr().add(j) as *const __m128i));
            let em = _mm256_and_si256(b, low7);
            let bits = _mm256_or_si256(
                _mm256_slli_epi32(em, 20),
                _mm256_slli_epi32(_mm256_and_si256(b, sign), 24),
            );
            let w = _mm256_mul_ps(_mm256_castsi256_ps(bits), bias);
            let w = _mm256_blendv_ps(w, nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(em, low7)));
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(j)), acc);
        }
        let s = QFormat::Fp8.scale_at(scales, bi);
        total = _mm256_fmadd_ps(_mm256_set1_ps(s), acc, total);
    }
    hsum(total)
}

/// The sum of an AVX register's 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    let mut l = [0f32; 8];
    std::arch::x86_64::_mm256_storeu_ps(l.as_mut_ptr(), v);
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

/// A q4 or q8 row (whole blocks only) against x with AVX2: each 32 weights' codes become
/// f32 in registers (q4: 16 bytes of nibbles, low first as stored; q8: 32 signed bytes),
/// 8 products at a time, and each block's sums are scaled into the row's 8 running sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quant_row_avx2(m: &CpuMatrix, q: QFormat, block: usize, r: usize, x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let k = m.k;
    let nb = k / block;
    let rb = q.file_row_bytes(k);
    let row = &m.w[r * rb..(r + 1) * rb];
    let scales = &m.scale[2 * r * nb..2 * (r + 1) * nb];
    let mask = _mm_set1_epi8(15);
    let eight = _mm256_set1_ps(8.0);
    let q4 = matches!(q, QFormat::Q4 { .. });
    let mut total = _mm256_setzero_ps();
    for bi in 0..nb {
        let mut acc = _mm256_setzero_ps();
        for c in 0..block / 32 {
            let j = bi * block + 32 * c;
            // SAFETY (loads): the 32 codes of elements j .. j + 32 lie in the row (j + 32 <= k,
            // whole blocks) and x holds k elements.
            let (e0, e1) = if q4 {
                let v = _mm_loadu_si128(row.as_ptr().add(j / 2) as *const __m128i);
                let lo = _mm_and_si128(v, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
                (_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi))
            } else {
                let p = row.as_ptr().add(j) as *const __m128i;
                (_mm_loadu_si128(p), _mm_loadu_si128(p.add(1)))
            };
            for (h, e) in [e0, e1].into_iter().enumerate() {
                let lanes = |b: __m128i| {
                    if q4 {
                        _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), eight)
                    } else {
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))
                    }
                };
                let xp = x.as_ptr().add(j + 16 * h);
                acc = _mm256_fmadd_ps(lanes(e), _mm256_loadu_ps(xp), acc);
                acc = _mm256_fmadd_ps(lanes(_mm_srli_si128(e, 8)), _mm256_loadu_ps(xp.add(8)), acc);
            }
        }
        let s = q.scale_at(scales, bi);
        total = _mm256_fmadd_ps(_mm256_set1_ps(s), acc, total);
    }
    hsum(total)
}

/// The row loop, inlined into each instruction-set variant so that its block loops are
/// vectorized for that set.
#[inline(always)]
fn rows_generic(m: &CpuMatrix, x: &[f32], y: &mut [f32], row0: usize) {
    for (i, out) in y.iter_mut().enumerate() {
        *out = row_dot(m, row0 + i, x);
    }
}

/// Σ_j a[j] · b[j] over `a.len()` elements in 8 independent sums.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let n8 = a.len() / 8 * 8;
    for (ca, cb) in a[..n8].chunks_exact(8).zip(b[..n8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = ca[l].mul_add(cb[l], acc[l]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for j in n8..a.len() {
        s = a[j].mul_add(b[j], s);
    }
    s
}

/// Row `r` of `m` against `x`.
#[inline(always)]
fn row_dot(m: &CpuMatrix, r: usize, x: &[f32]) -> f32 {
    let k = m.k;
    let mut buf = [0f32; MAX_BLOCK];
    let mut sum = 0f32;
    match m.format {
        WFormat::Float(d) => {
            let row = &m.w[r * k * d.size()..(r + 1) * k * d.size()];
            for j0 in (0..k).step_by(MAX_BLOCK) {
                let len = MAX_BLOCK.min(k - j0);
                let b = &mut buf[..len];
                d.decode_into(&row[j0 * d.size()..], b);
                sum += dot(b, &x[j0..j0 + len]);
            }
        }
        WFormat::Quant(QFormat::Fp8) => {
            let row = &m.w[r * k..(r + 1) * k];
            let nbk = k.div_ceil(FP8_BLOCK);
            let lut = e4m3_table();
            for (bi, j0) in (0..k).step_by(FP8_BLOCK).enumerate() {
                let len = FP8_BLOCK.min(k - j0);
                let b = &mut buf[..len];
                for (o, &c) in b.iter_mut().zip(&row[j0..j0 + len]) {
                    *o = lut[c as usize];
                }
                let s = QFormat::Fp8.scale_at(m.scale, (r / FP8_BLOCK) * nbk + bi);
                sum += s * dot(b, &x[j0..j0 + len]);
            }
        }
        WFormat::Quant(q @ (QFormat::Q8 { block } | QFormat::Q4 { block })) => {
            let rb = q.file_row_bytes(k);
            let row = &m.w[r * rb..(r + 1) * rb];
            let nb = k.div_ceil(block);
            for bi in 0..nb {
                let j0 = bi * block;
                let len = block.min(k - j0);
                let b = &mut buf[..len];
                if let QFormat::Q4 { .. } = q {
                    // Two nibbles a byte, low first; a block starts on a byte (block is even).
                    let bytes = &row[j0 / 2..(j0 + len).div_ceil(2)];
                    let even = len / 2 * 2;
                    for (p, &c) in b[..even].chunks_exact_mut(2).zip(bytes) {
                        p[0] = (c & 15) as f32 - 8.0;
                        p[1] = (c >> 4) as f32 - 8.0;
                    }
                    if even < len {
                        b[even] = (bytes[even / 2] & 15) as f32 - 8.0;
                    }
                } else {
                    for (o, &c) in b.iter_mut().zip(&row[j0..j0 + len]) {
                        *o = c as i8 as f32;
                    }
                }
                let s = q.scale_at(m.scale, r * nb + bi);
                sum += s * dot(b, &x[j0..j0 + len]);
            }
        }
    }
    sum
}

/// e4m3 byte → f32, all 256 values.
fn e4m3_table() -> &'static [f32; 256] {
    static T: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|b| e4m3_to_f32(b as u8)))
}

/// One routed expert's three matrices: `gate` and `up` `[inter, hidden]`, `down`
/// `[hidden, inter]`.
#[derive(Clone, Copy, Debug)]
pub struct CpuExpert<'a> {
    pub gate: CpuMatrix<'a>,
    pub up: CpuMatrix<'a>,
    pub down: CpuMatrix<'a>,
}

impl<'a> CpuExpert<'a> {
    /// Checks that the three shapes fit together; `what` names the expert in the error.
    pub fn new(
        what: &str,
        gate: CpuMatrix<'a>,
        up: CpuMatrix<'a>,
        down: CpuMatrix<'a>,
    ) -> Result<Self> {
        let (inter, hidden) = (gate.n, gate.k);
        if up.n != inter || up.k != hidden || down.n != hidden || down.k != inter {
            return Err(Error::msg(format!(
                "{what}: gate [{inter}, {hidden}], up [{}, {}] and down [{}, {}] do not make a SwiGLU expert (up [{inter}, {hidden}] and down [{hidden}, {inter}] were expected)",
                up.n, up.k, down.n, down.k
            )));
        }
        Ok(CpuExpert { gate, up, down })
    }

    /// `out += weight · down(silu(gate · x) ⊙ (up · x))` for one token row `x`. `scratch`
    /// holds the intermediates (`2 · inter + hidden` floats): reused, it allocates only the
    /// first time.
    pub fn add_to(&self, x: &[f32], weight: f32, out: &mut [f32], scratch: &mut Vec<f32>) {
        let (inter, hidden) = (self.gate.n, self.down.n);
        scratch.resize(2 * inter + hidden, 0.0);
        let (g, rest) = scratch.split_at_mut(inter);
        let (u, d) = rest.split_at_mut(inter);
        rayon::join(|| self.gate.matvec(x, g), || self.up.matvec(x, u));
        for (a, &b) in g.iter_mut().zip(u.iter()) {
            *a = *a / (1.0 + (-*a).exp()) * b;
        }
        self.down.matvec(g, d);
        for (o, &v) in out.iter_mut().zip(d.iter()) {
            *o += weight * v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::quant::{dequantize_rows, quantize_fp8, quantize_rows};
    use crate::weights::DType;

    /// Uniform values in (-scale, scale) from a fixed seed.
    struct Rng(u64);
    impl Rng {
        fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
        }
        fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n)
                .map(|_| {
                    self.0 ^= self.0 << 13;
                    self.0 ^= self.0 >> 7;
                    self.0 ^= self.0 << 17;
                    ((self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
                })
                .collect()
        }
    }

    fn assert_close(got: &[f32], want: &[f32], atol: f32, rtol: f32, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= atol + rtol * w.abs(),
                "{what}[{i}]: got {g}, want {w}"
            );
        }
    }

    /// `data` ([n, k]) stored in `format`: (weight bytes, scale bytes, the values as stored).
    fn stored(format: WFormat, data: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<u8>, Vec<f32>) {
        match format {
            WFormat::Float(d) => {
                let bytes = d.from_f32(data);
                let back = d.to_f32(&bytes);
                (bytes, Vec::new(), back)
            }
            WFormat::Quant(q) => {
                let (w, s) = match q {
                    QFormat::Fp8 => quantize_fp8(data, n, k),
                    _ => quantize_rows(q, data, k),
                };
                let back = dequantize_rows(q, &w, &s, 0, n, k);
                (w, s, back)
            }
        }
    }

    fn formats() -> Vec<WFormat> {
        let mut v: Vec<WFormat> = [DType::F32, DType::BF16, DType::F16]
            .map(WFormat::Float)
            .into();
        v.extend(
            [
                QFormat::Fp8,
                QFormat::Q8 { block: 32 },
                QFormat::Q8 { block: 128 },
                QFormat::Q4 { block: 32 },
                QFormat::Q4 { block: 64 },
            ]
            .map(WFormat::Quant),
        );
        v
    }

    fn matvec_ref(w: &[f32], x: &[f32], n: usize, k: usize) -> Vec<f32> {
        (0..n)
            .map(|r| {
                (0..k)
                    .map(|j| w[r * k + j] as f64 * x[j] as f64)
                    .sum::<f64>() as f32
            })
            .collect()
    }

    #[test]
    fn matvec_matches_the_decoded_matrix_in_every_format() {
        let mut rng = Rng::new(71);
        // Awkward sizes: partial blocks, rows past a 128-row FP8 block, k not a multiple of 8;
        // and whole blocks (k = 256: the AVX2 rows of q4, q8 and FP8 where the CPU has them).
        for (n, k) in [(5usize, 70usize), (131, 300), (260, 1000), (131, 256)] {
            let data = rng.vec(n * k, 1.0);
            let x = rng.vec(k, 1.0);
            for format in formats() {
                let (w, s, back) = stored(format, &data, n, k);
                let m = CpuMatrix::new("w", format, &w, &s, n, k).unwrap();
                let mut y = vec![f32::NAN; n];
                m.matvec(&x, &mut y);
                let want = matvec_ref(&back, &x, n, k);
                assert_close(
                    &y,
                    &want,
                    1e-4,
                    1e-4,
                    &format!("matvec {format:?} [{n}, {k}]"),
                );
            }
        }
    }

    #[test]
    fn expert_matches_swiglu_reference() {
        let mut rng = Rng::new(72);
        let (hidden, inter) = (200, 96);
        for format in formats() {
            let mats: Vec<(Vec<u8>, Vec<u8>, Vec<f32>)> =
                [(inter, hidden), (inter, hidden), (hidden, inter)]
                    .iter()
                    .map(|&(n, k)| stored(format, &rng.vec(n * k, 0.5), n, k))
                    .collect();
            let mat =
                |i: usize, n, k| CpuMatrix::new("m", format, &mats[i].0, &mats[i].1, n, k).unwrap();
            let e = CpuExpert::new(
                "e",
                mat(0, inter, hidden),
                mat(1, inter, hidden),
                mat(2, hidden, inter),
            )
            .unwrap();
            let x = rng.vec(hidden, 1.0);
            let mut out = vec![0.5f32; hidden];
            e.add_to(&x, 0.25, &mut out, &mut Vec::new());
            let g = matvec_ref(&mats[0].2, &x, inter, hidden);
            let u = matvec_ref(&mats[1].2, &x, inter, hidden);
            let h: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(&a, &b)| a / (1.0 + (-a).exp()) * b)
                .collect();
            let d = matvec_ref(&mats[2].2, &h, hidden, inter);
            let want: Vec<f32> = d.iter().map(|v| 0.5 + 0.25 * v).collect();
            assert_close(&out, &want, 1e-4, 1e-4, &format!("expert {format:?}"));
        }
    }

    #[test]
    fn wrong_sizes_are_errors_naming_the_tensor() {
        let w = vec![0u8; 10];
        let e = CpuMatrix::new(
            "layers.3.mlp.experts.7.up_proj.weight",
            WFormat::Float(DType::BF16),
            &w,
            &[],
            2,
            4,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("experts.7.up_proj") && e.contains("[2, 4]"),
            "{e}"
        );
        let q = WFormat::Quant(QFormat::Q4 { block: 32 });
        let (w, s) = quantize_rows(QFormat::Q4 { block: 32 }, &[0.5; 64], 32);
        let e = CpuMatrix::new("q", q, &w, &s[..2], 2, 32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("scales"), "{e}");
        let m = CpuMatrix::new("q", q, &w, &s, 2, 32).unwrap();
        let e = CpuExpert::new("expert 7", m, m, m).unwrap_err().to_string();
        assert!(e.contains("expert 7") && e.contains("down"), "{e}");
    }
}
