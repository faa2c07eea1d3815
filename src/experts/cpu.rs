//! Routed experts on the CPU: SwiGLU experts computed straight from the weights' stored
//! bytes (a memory-mapped file's: no copy, no conversion), in every stored format (f32,
//! bf16, f16, FP8 block-scaled, q8, q4). Issue 22's executor: a hybrid run computes here the
//! experts it did not make resident on the GPU instead of uploading them.
//!
//! A matrix product spreads its output rows over the threads of a [`Pool`]. A weight row is decoded
//! block by block (a scale's block, or 256 elements of a float row) into f32 on the stack,
//! and each block's dot product with x is taken in 8 independent sums, which the compiler
//! vectorizes: with AVX2 and FMA where the CPU has them (checked at run time), NEON on
//! aarch64, SSE2 otherwise; q4, q8 and FP8 rows have AVX2 code of their own. Nothing is
//! allocated per row, and an expert's intermediates live in a scratch vector its caller
//! keeps.

use super::pool::Pool;
use crate::error::{Error, Result};
use crate::weights::quant::{e4m3_to_f32, FP8_BLOCK};
use crate::weights::{QFormat, WFormat};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The most elements a decoded block holds (q4 / q8 blocks are 32 ..= 256, FP8's 128,
/// float rows go 256 at a time).
const MAX_BLOCK: usize = 256;

/// The instruction sets the executor has rows for, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isa {
    /// AVX-512 with VNNI (and BW, VL): q4 / q8 rows take one `vpdpwssd` per 32 weights.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx512,
    /// AVX2 and FMA: q4 / q8 rows on `maddubs`, FP8 rows decoded on the bits.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2,
    /// What the compiler vectorizes for the build's target.
    Portable,
}

impl Isa {
    /// The best set this CPU has, checked once (`SPARSA_CPU_AVX512=0`: AVX2 at most, a
    /// measurement aid).
    fn here() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            let all = Isa::all_here();
            let avx512 = crate::knobs::knob_on!("SPARSA_CPU_AVX512");
            all.into_iter()
                .find(|&i| avx512 || i != Isa::Avx512)
                .unwrap_or(Isa::Portable)
        })
    }

    /// Every set this CPU has, best first (Portable last).
    fn all_here() -> Vec<Isa> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma");
            if avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni")
            {
                v.push(Isa::Avx512);
            }
            if avx2 {
                v.push(Isa::Avx2);
            }
        }
        v.push(Isa::Portable);
        v
    }
}

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

    /// `y[i · r + j] = Σ_c W[row0 + i, c] · xs[j][c]` for the rows `y` holds (`r` =
    /// `xs.len()` rows of x: a weight row is read once, from cache, for all of them). `xq`:
    /// the same rows quantized ([`XRow`]) where [`CpuMatrix::int_dot`] applies.
    fn rows_into(&self, xs: &[&[f32]], xq: XRows, y: &mut [f32], row0: usize) {
        self.rows_on(Isa::here(), xs, xq, y, row0)
    }

    /// [`CpuMatrix::rows_into`] on the instruction set `isa` (which the CPU must have: tests
    /// take each one the CPU has).
    fn rows_on(&self, isa: Isa, xs: &[&[f32]], xq: XRows, y: &mut [f32], row0: usize) {
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `isa` is one the CPU has (Isa::here, Isa::all_here).
            Isa::Avx512 => unsafe { rows_avx512(self, xs, xq, y, row0) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Isa::Avx2 => unsafe { rows_avx2(self, xs, xq, y, row0) },
            _ => {
                let _ = xq;
                rows_generic(self, xs, y, row0)
            }
        }
    }

    /// Whether products with this matrix take x quantized ([`XRow`]) for integer dot
    /// products: q4 / q8 in whole blocks, on a CPU with AVX2 and FMA (`SPARSA_CPU_INT_DOT=0`:
    /// never, a measurement aid).
    fn int_dot(&self) -> bool {
        if let WFormat::Quant(QFormat::Q4 { block } | QFormat::Q8 { block }) = self.format {
            return self.k.is_multiple_of(block)
                && crate::knobs::knob_on!("SPARSA_CPU_INT_DOT")
                && Isa::here() != Isa::Portable;
        }
        false
    }

    /// `y = W · x` (`y` has `n` elements, `x` has `k`), on the calling thread.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) {
        self.matvec_on(Isa::here(), x, y)
    }

    /// [`CpuMatrix::matvec`] on the instruction set `isa` (one the CPU has).
    fn matvec_on(&self, isa: Isa, x: &[f32], y: &mut [f32]) {
        assert!(
            x.len() >= self.k && y.len() >= self.n,
            "CpuMatrix::matvec: short x or y"
        );
        let xs = [x];
        let mut xq = RowCache::default();
        xq.fill(None, std::iter::once((self, &xs[..])));
        self.rows_on(isa, &xs, xq.of(0, 1), &mut y[..self.n], 0);
    }
}

/// This machine's RAM read rate, bytes per second, on `pool`'s threads:
/// a 1 GiB buffer (larger than the caches) summed in 64 KiB pieces, best of three after a
/// first pass that faults it in. What the executor's expert reads are measured against.
pub fn ram_read_bandwidth(pool: &Pool) -> f64 {
    let big: Vec<u64> = vec![1; 1 << 27];
    let piece = 1 << 13;
    let mut best = 0f64;
    for pass in 0..4 {
        let total = AtomicU64::new(0);
        let t = std::time::Instant::now();
        pool.run(big.len() / piece, &|i| {
            let s: u64 = big[i * piece..(i + 1) * piece].iter().sum();
            total.fetch_add(s, Ordering::Relaxed);
        });
        let rate = (8 * big.len()) as f64 / t.elapsed().as_secs_f64();
        assert_eq!(total.load(Ordering::Relaxed), big.len() as u64);
        if pass > 0 {
            best = best.max(rate);
        }
    }
    best
}

/// One row of x quantized per 32-element block for integer dot products with q4 / q8
/// weights, as the GPU's decode GEMVs quantize it (`shaders/xquant.wgsl`): block b is
/// `x ≈ s_b · (h + l / 254)` with int8 `h = round(x / s_b)`, `l = round((x / s_b − h) ·
/// 254)` and `s_b = amax / 127`, which keeps products within f32 tolerances. For q4 each
/// block's elements are stored even ones first, then odd ones: the order of a q4 block's
/// low and high nibbles. `m_b = s_b · (Σh + Σl / 254)`: the block's sum, for q4's offset of 8.
#[derive(Default)]
pub struct XRow {
    h: Vec<i8>,
    l: Vec<i8>,
    s: Vec<f32>,
    /// `s_b / 254`, the scale of `254 · h + l`.
    s254: Vec<f32>,
    m: Vec<f32>,
    /// `254 · h + l` as one 16-bit integer per element (|·| ≤ 32,385), in h's order: the
    /// AVX-512 rows' x, whose products are then the AVX2 rows' integer sums exactly.
    w: Vec<i16>,
    /// q4: h and l by pairs of chunks (A, B) as the AVX-512 rows take them, 64 bytes a pair:
    /// A's positions 0..16, B's 0..16, A's 16..32, B's 16..32 (an odd last chunk is left out).
    hp: Vec<i8>,
    lp: Vec<i8>,
}

impl XRow {
    #[cfg(test)]
    fn new(x: &[f32], q4: bool) -> XRow {
        let mut r = XRow::default();
        r.fill(x, q4);
        r
    }

    /// This row made `x` quantized (q4's element order where `q4`), in the vectors it
    /// already has: it allocates only where they are shorter than `x` needs.
    fn fill(&mut self, x: &[f32], q4: bool) {
        let nb = x.len() / 32;
        let pairs = if q4 { nb / 2 * 64 } else { 0 };
        let r = self;
        r.h.resize(nb * 32, 0);
        r.l.resize(nb * 32, 0);
        r.s.resize(nb, 0.0);
        r.s254.resize(nb, 0.0);
        r.m.resize(nb, 0.0);
        r.w.resize(nb * 32, 0);
        r.hp.resize(pairs, 0);
        r.lp.resize(pairs, 0);
        for b in 0..nb {
            let v = &x[32 * b..32 * b + 32];
            let amax = v.iter().fold(0f32, |a, &e| a.max(e.abs()));
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            // h and l in x's order, in a loop the compiler vectorizes (no rounding call).
            let (mut hs, mut ls) = ([0f32; 32], [0f32; 32]);
            for j in 0..32 {
                let f = v[j] * inv;
                let h = round_even(f).clamp(-127.0, 127.0);
                hs[j] = h;
                ls[j] = round_even((f - h) * 254.0).clamp(-127.0, 127.0);
            }
            let (mut sh, mut sl) = (0i32, 0i32);
            for j in 0..32 {
                // q4: even elements to positions 0..16, odd ones to 16..32.
                let src = if q4 { 2 * (j % 16) + j / 16 } else { j };
                let (h, l) = (hs[src], ls[src]);
                r.h[32 * b + j] = h as i8;
                r.l[32 * b + j] = l as i8;
                r.w[32 * b + j] = 254 * h as i16 + l as i16;
                sh += h as i32;
                sl += l as i32;
            }
            r.s[b] = amax / 127.0;
            r.s254[b] = r.s[b] / 254.0;
            r.m[b] = r.s[b] * (sh as f32 + sl as f32 / 254.0);
        }
        if q4 {
            for p in 0..nb / 2 {
                for (q, (chunk, half)) in [(0, 0), (1, 0), (0, 1), (1, 1)].into_iter().enumerate() {
                    let from = 32 * (2 * p + chunk) + 16 * half;
                    let to = 64 * p + 16 * q;
                    r.hp[to..to + 16].copy_from_slice(&r.h[from..from + 16]);
                    r.lp[to..to + 16].copy_from_slice(&r.l[from..from + 16]);
                }
            }
        }
    }
}

/// `f.round_ties_even()` for |f| < 2^22 (here |f| ≤ 127.5), without a call into libm: adding
/// and subtracting 1.5 · 2^23 leaves f rounded to an integer in the default rounding mode,
/// ties to even, and the compiler vectorizes it.
#[inline(always)]
fn round_even(f: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (f + MAGIC) - MAGIC
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(m: &CpuMatrix, xs: &[&[f32]], xq: XRows, y: &mut [f32], row0: usize) {
    let r = xs.len();
    match m.format {
        WFormat::Quant(q @ (QFormat::Q4 { block } | QFormat::Q8 { block }))
            if m.k.is_multiple_of(block) =>
        {
            for (i, out) in y.chunks_exact_mut(r).enumerate() {
                for (j, (o, x)) in out.iter_mut().zip(xs).enumerate() {
                    *o = match xq.get(j) {
                        Some(xr) => int_row_avx2(m, q, block, row0 + i, xr),
                        None => quant_row_avx2(m, q, block, row0 + i, x),
                    };
                }
            }
        }
        WFormat::Quant(QFormat::Fp8) if m.k.is_multiple_of(FP8_BLOCK) => {
            for (i, out) in y.chunks_exact_mut(r).enumerate() {
                for (o, x) in out.iter_mut().zip(xs) {
                    *o = fp8_row_avx2(m, row0 + i, x);
                }
            }
        }
        _ => rows_generic(m, xs, y, row0),
    }
}

/// `254 · Σ w·h + Σ w·l` in 8 lanes of 32 weights `w` (unsigned bytes) against x's signed
/// bytes `h` and `l`, with AVX2: `maddubs` multiplies into 16-bit pair sums, `madd` widens
/// them (h's weighted by 254).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_avx2(
    w: std::arch::x86_64::__m256i,
    h: std::arch::x86_64::__m256i,
    l: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    _mm256_add_epi32(
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, h), _mm256_set1_epi16(254)),
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, l), _mm256_set1_epi16(1)),
    )
}

/// Row `r` of a q4 / q8 matrix in whole blocks as the integer rows read it: its codes, its
/// bf16 scales, its 32-element chunks, and the shift from a chunk to its scale's block
/// (chunk c's scale is block c >> shift's).
#[cfg(target_arch = "x86_64")]
fn int_row_parts(
    m: &CpuMatrix,
    q: QFormat,
    block: usize,
    r: usize,
) -> (*const u8, *const u16, usize, u32) {
    let nb = m.k / block;
    let rb = q.file_row_bytes(m.k);
    (
        m.w[r * rb..(r + 1) * rb].as_ptr(),
        m.scale[2 * r * nb..2 * (r + 1) * nb].as_ptr() as *const u16,
        m.k / 32,
        (block / 32).trailing_zeros(),
    )
}

/// The bf16 weight scale of chunk `c` of a row from [`int_row_parts`] (`scales`, `per`).
///
/// # Safety
/// `c` is below the row's chunks.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn chunk_scale(scales: *const u16, c: usize, per: u32) -> f32 {
    let bits = u16::from_le(scales.add(c >> per).read_unaligned());
    f32::from_bits((bits as u32) << 16)
}

/// A q4 or q8 row (whole blocks) against a quantized x row with 8-bit integer products
/// ([`dot_avx2`]: per 32 weights, q4's nibbles 0..15 against x's h and l; q8's |w| against
/// x's bytes with w's sign), one conversion and one multiply per 32 weights to scale them
/// by `w_scale · s_b / 254`; q4's offset of 8 is taken off per block with x's block sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn int_row_avx2(m: &CpuMatrix, q: QFormat, block: usize, r: usize, x: &XRow) -> f32 {
    use std::arch::x86_64::*;
    let k = m.k;
    let (row, scales, chunks, per) = int_row_parts(m, q, block, r);
    assert!(x.h.len() >= k && x.l.len() >= k && x.s254.len() >= chunks && x.m.len() >= chunks);
    let (xh, xl, xs, xm) = (x.h.as_ptr(), x.l.as_ptr(), x.s254.as_ptr(), x.m.as_ptr());
    let q4 = matches!(q, QFormat::Q4 { .. });
    let mask = _mm_set1_epi8(15);
    // Chunk c's 32 products as f32 lanes, scaled, and (q4) w_scale · m_c.
    // SAFETY (in the closure): c < chunks, so the codes of elements 32c .. 32c + 32
    // lie in the row, their scale among the row's scales, and x holds chunk c
    // (asserted above).
    let chunk = |c: usize| -> (__m256, f32) {
        let j = 32 * c;
        let ws = chunk_scale(scales, c, per);
        let h = _mm256_loadu_si256(xh.add(j) as *const __m256i);
        let l = _mm256_loadu_si256(xl.add(j) as *const __m256i);
        let (sum, off) = if q4 {
            let v = _mm_loadu_si128(row.add(j / 2) as *const __m128i);
            let lo = _mm_and_si128(v, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
            (dot_avx2(_mm256_set_m128i(hi, lo), h, l), ws * *xm.add(c))
        } else {
            let w = _mm256_loadu_si256(row.add(j) as *const __m256i);
            let a = _mm256_abs_epi8(w);
            (
                dot_avx2(a, _mm256_sign_epi8(h, w), _mm256_sign_epi8(l, w)),
                0.0,
            )
        };
        let sc = _mm256_set1_ps(ws * *xs.add(c));
        (_mm256_mul_ps(_mm256_cvtepi32_ps(sum), sc), off)
    };
    // Two chunks a step into two sums: independent chains for the out-of-order core.
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (mut o0, mut o1) = (0f32, 0f32);
    let mut c = 0;
    // Bytes of codes a chunk (a 2-chunk step is half a line of q4, a line of q8).
    let cb = if q4 { 16 } else { 32 };
    let ahead = prefetch_distance();
    while c + 2 <= chunks {
        prefetch_ahead(row.wrapping_add(cb * c), ahead, 1);
        let (v0, f0) = chunk(c);
        let (v1, f1) = chunk(c + 1);
        a0 = _mm256_add_ps(a0, v0);
        a1 = _mm256_add_ps(a1, v1);
        o0 += f0;
        o1 += f1;
        c += 2;
    }
    if c < chunks {
        let (v0, f0) = chunk(c);
        a0 = _mm256_add_ps(a0, v0);
        o0 += f0;
    }
    hsum(_mm256_add_ps(a0, a1)) - 8.0 * (o0 + o1)
}

/// [`rows_avx2`] with the q4 / q8 rows on AVX-512 VNNI ([`int_row_avx512`]) where x comes
/// quantized; everything else as AVX2 does it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn rows_avx512(m: &CpuMatrix, xs: &[&[f32]], xq: XRows, y: &mut [f32], row0: usize) {
    match m.format {
        WFormat::Quant(q @ (QFormat::Q4 { block } | QFormat::Q8 { block }))
            if m.k.is_multiple_of(block) && xq.covers(xs.len()) =>
        {
            for (i, out) in y.chunks_exact_mut(xs.len()).enumerate() {
                for (j, o) in out.iter_mut().enumerate() {
                    if let Some(xr) = xq.get(j) {
                        *o = int_row_avx512(m, q, block, row0 + i, xr);
                    }
                }
            }
        }
        WFormat::Quant(QFormat::Fp8) if m.k.is_multiple_of(FP8_BLOCK) => {
            for (i, out) in y.chunks_exact_mut(xs.len()).enumerate() {
                for (o, x) in out.iter_mut().zip(xs) {
                    *o = fp8_row_avx512(m, row0 + i, x);
                }
            }
        }
        _ => rows_avx2(m, xs, xq, y, row0),
    }
}

/// Row `r` of an FP8 matrix in whole 128-column blocks: its codes, the scales of its
/// 128-row block (one f32 per column block) and the column blocks.
#[cfg(target_arch = "x86_64")]
fn fp8_row_parts<'a>(m: &CpuMatrix<'a>, r: usize) -> (&'a [u8], &'a [u8], usize) {
    let (k, nbk) = (m.k, m.k / FP8_BLOCK);
    let sb = r / FP8_BLOCK;
    (
        &m.w[r * k..(r + 1) * k],
        &m.scale[4 * sb * nbk..4 * (sb + 1) * nbk],
        nbk,
    )
}

/// An FP8 row (whole 128-column blocks) against x with AVX-512: 32 e4m3 codes at a time
/// become f16 on the bits (sign to bit 15, exponent and mantissa shifted by 7: the value
/// times 2^-8, subnormals included, which the block's scale takes back), then f32 by
/// `vcvtph2ps`, 16 products a multiply-add; the codes 0x7F / 0xFF stay NaN. About a third
/// of [`fp8_row_avx2`]'s instructions per weight: on a 2-core Xeon with AVX-512
/// (`examples/cpu_experts fp8 2 20`, two GLM-5-shaped experts, mostly from L3: the rows'
/// arithmetic, not RAM, bounds both) 5.4 → 9.3 GB/s on one thread, 11.5 → 18.5 on two,
/// against `SPARSA_CPU_AVX512=0` (the AVX2 rows) in the same session.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn fp8_row_avx512(m: &CpuMatrix, r: usize, x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let (row, scales, nbk) = fp8_row_parts(m, r);
    assert!(x.len() >= m.k);
    let low7 = _mm512_set1_epi16(0x7f);
    let sign = _mm512_set1_epi16(0x80);
    let nan = _mm512_set1_ps(f32::NAN);
    let mut total = _mm512_setzero_ps();
    for bi in 0..nbk {
        let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for c in 0..FP8_BLOCK / 32 {
            let j = bi * FP8_BLOCK + 32 * c;
            // SAFETY: j + 32 <= k (whole blocks): the 32 bytes lie in the row, x holds k.
            let b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(row.as_ptr().add(j) as *const __m256i));
            let em = _mm512_and_si512(b, low7);
            let bits = _mm512_or_si512(
                _mm512_slli_epi16(em, 7),
                _mm512_slli_epi16(_mm512_and_si512(b, sign), 8),
            );
            let nans = _mm512_cmpeq_epi16_mask(em, low7);
            let w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(bits));
            let w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1));
            let w0 = _mm512_mask_mov_ps(w0, nans as u16, nan);
            let w1 = _mm512_mask_mov_ps(w1, (nans >> 16) as u16, nan);
            let xp = x.as_ptr().add(j);
            a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xp), a0);
            a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xp.add(16)), a1);
        }
        // 2^8: the codes were read as f16, whose exponent bias is 8 above e4m3's.
        let s = 256.0 * QFormat::Fp8.scale_at(scales, bi);
        total = _mm512_fmadd_ps(_mm512_set1_ps(s), _mm512_add_ps(a0, a1), total);
    }
    _mm512_reduce_add_ps(total)
}

/// [`int_row_avx2`] on AVX-512 VNNI: per 32 weights, the codes widened to 16 bits (q4's
/// nibbles, 0..15, low ones first as x's order has them; q8's signed bytes) and one
/// `vpdpwssd` against x's `254 · h + l` ([`XRow`]'s 16-bit form), which gives the AVX2
/// rows' integer sums exactly; then one conversion and one multiply-add by `w_scale ·
/// s_b / 254`, as there. With one scale a chunk (32-element blocks, the default) those
/// factors are made 16 chunks at a time as vectors: on a 2-core AMD EPYC (Zen 4) that took
/// `examples/cpu_experts` q4 from 13.3–14.5 to 18.0–18.4 GB/s on 2 threads, 16.5–20.7 to
/// 14.7–16.2 ms a round on one (q8: 15.9–17.3 to 19.0–19.3 GB/s), side by side. In that
/// loop q4 takes two chunks at a time on bytes (`pair_q4`, one `vpdpbusd` for h and one for
/// l, no widening): one thread 10.8 / 9.8 → 13.4 / 12.4 GB/s on the same machine.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
unsafe fn int_row_avx512(m: &CpuMatrix, q: QFormat, block: usize, r: usize, x: &XRow) -> f32 {
    use std::arch::x86_64::*;
    let k = m.k;
    let (row, scales, chunks, per) = int_row_parts(m, q, block, r);
    assert!(x.w.len() >= k && x.s254.len() >= chunks && x.m.len() >= chunks);
    let (xw, xs, xm) = (x.w.as_ptr(), x.s254.as_ptr(), x.m.as_ptr());
    let q4 = matches!(q, QFormat::Q4 { .. });
    // The q4 pairs run in the 16-chunk loop below (one scale a chunk), whose pairs are whole.
    assert!(!q4 || per != 0 || x.hp.len() >= 32 * (chunks / 16 * 16));
    let mask = _mm256_set1_epi8(15);
    // The 16 bytes of nibbles twice: the low half's words shifted by 0, the high half's by 4.
    let shifts = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
    // Chunk c's 16 lanes of integer sums.
    // SAFETY (in the closures): c < chunks, so the codes of elements 32c .. 32c + 32 lie in
    // the row, their scale among the row's scales, and x holds chunk c (asserted above).
    let dot = |c: usize| -> __m512i {
        let codes = if q4 {
            let v = _mm_loadu_si128(row.add(16 * c) as *const __m128i);
            let n = _mm256_and_si256(_mm256_srlv_epi16(_mm256_set_m128i(v, v), shifts), mask);
            _mm512_cvtepu8_epi16(n)
        } else {
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(row.add(32 * c) as *const __m256i))
        };
        let xv = _mm512_loadu_si512(xw.add(32 * c) as *const __m512i);
        _mm512_dpwssd_epi32(_mm512_setzero_si512(), codes, xv)
    };
    // q4, chunks c and c + 1 (c even, c + 1 < chunks): their 64 nibbles as unsigned bytes,
    // 32 low ones then 32 high ones, against x's h and l in the same order (XRow's hp, lp),
    // one `vpdpbusd` each; the lanes hold `254 · Σ w·h + Σ w·l` by groups of 4 bytes:
    // lanes 0..4 and 8..12 chunk c's, 4..8 and 12..16 chunk c + 1's. The integer sums are
    // those of `dot`, without widening the nibbles to 16 bits.
    let (xhp, xlp) = (x.hp.as_ptr(), x.lp.as_ptr());
    let pair_q4 = |c: usize| -> __m512i {
        let v = _mm256_loadu_si256(row.add(16 * c) as *const __m256i);
        let lo = _mm256_and_si256(v, mask);
        let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
        let n = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        let h = _mm512_loadu_si512(xhp.add(32 * c) as *const __m512i);
        let l = _mm512_loadu_si512(xlp.add(32 * c) as *const __m512i);
        let sh = _mm512_dpbusd_epi32(_mm512_setzero_si512(), n, h);
        let sl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), n, l);
        _mm512_add_epi32(
            _mm512_sub_epi32(_mm512_slli_epi32(sh, 8), _mm512_slli_epi32(sh, 1)),
            sl,
        )
    };
    let scale = |c: usize| chunk_scale(scales, c, per);
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let (mut o0, mut o1) = (0f32, 0f32);
    let mut c = 0;
    // Bytes of codes a chunk: 16 chunks a step are 4 lines of q4, 8 of q8; 2 chunks half a
    // line of q4, a line of q8.
    let cb = if q4 { 16 } else { 32 };
    let ahead = prefetch_distance();
    if per == 0 {
        // One scale a chunk: 16 chunks' factors `w_scale · s_b / 254` (and their offset
        // terms `w_scale · m_b`) as vectors, each chunk's broadcast from its lane, instead
        // of scalar loads, conversions and products per chunk.
        let mut ov = _mm512_setzero_ps();
        // q4: the lanes of a pair of chunks (pair_q4) take chunk j's factor, then j + 1's,
        // by groups of 4.
        let pair_lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
        while c + 16 <= chunks {
            prefetch_ahead(row.wrapping_add(cb * c), ahead, cb / 4);
            let sb = _mm256_loadu_si256(scales.add(c) as *const __m256i);
            let ws = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(sb), 16));
            let f = _mm512_mul_ps(ws, _mm512_loadu_ps(xs.add(c)));
            ov = _mm512_fmadd_ps(ws, _mm512_loadu_ps(xm.add(c)), ov);
            let mut j = 0;
            while j < 16 {
                if q4 {
                    let i0 = _mm512_add_epi32(pair_lanes, _mm512_set1_epi32(j as i32));
                    let i1 = _mm512_add_epi32(pair_lanes, _mm512_set1_epi32(j as i32 + 2));
                    let f0 = _mm512_permutexvar_ps(i0, f);
                    let f1 = _mm512_permutexvar_ps(i1, f);
                    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair_q4(c + j)), f0, a0);
                    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair_q4(c + j + 2)), f1, a1);
                    j += 4;
                } else {
                    let f0 = _mm512_permutexvar_ps(_mm512_set1_epi32(j as i32), f);
                    let f1 = _mm512_permutexvar_ps(_mm512_set1_epi32(j as i32 + 1), f);
                    a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot(c + j)), f0, a0);
                    a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot(c + j + 1)), f1, a1);
                    j += 2;
                }
            }
            c += 16;
        }
        o0 = _mm512_reduce_add_ps(ov);
    }
    // Two chunks a step into two sums: independent chains for the out-of-order core.
    while c + 2 <= chunks {
        prefetch_ahead(row.wrapping_add(cb * c), ahead, 1);
        let (w0, w1) = (scale(c), scale(c + 1));
        a0 = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(dot(c)),
            _mm512_set1_ps(w0 * *xs.add(c)),
            a0,
        );
        a1 = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(dot(c + 1)),
            _mm512_set1_ps(w1 * *xs.add(c + 1)),
            a1,
        );
        o0 += w0 * *xm.add(c);
        o1 += w1 * *xm.add(c + 1);
        c += 2;
    }
    if c < chunks {
        let w0 = scale(c);
        a0 = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(dot(c)),
            _mm512_set1_ps(w0 * *xs.add(c)),
            a0,
        );
        o0 += w0 * *xm.add(c);
    }
    let off = if q4 { 8.0 * (o0 + o1) } else { 0.0 };
    _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) - off
}

/// How far ahead of the codes it is reading a q4 / q8 row on x86 prefetches them into L1.
/// The hardware prefetchers alone left the rows waiting on memory (Intel's L2 streamer
/// stops at each 4 KiB page; a row of GLM-5's experts is 3 KiB of q4). On a 2-core Xeon with
/// AVX-512 VNNI (`examples/cpu_experts q4|q8 32 30`, 32 experts read from RAM, RAM read
/// 11.3–12.1 GB/s a thread; with and without, alternated twice), GB/s on one / two threads:
///
/// | | without | with 4 KiB ahead |
/// |---|---|---|
/// | q4, AVX-512 | 8.1–8.4 / 16.8 | 10.9–12.1 / 21.7–22.9 |
/// | q8, AVX-512 | 9.9–10.2 / 19.6–19.9 | 12.3–12.8 / 25.1–25.6 |
/// | q4, AVX2 | 5.6–6.0 / 11.8 | 7.0–7.4 / 13.4–15.1 |
/// | q8, AVX2 | 7.4–7.5 / 14.4–14.8 | 12.1–12.7 / 23.2–25.2 |
///
/// 3 KiB ahead gave less (9.8–11.0 / 20.1–21.1 for q4, AVX-512), 6 and 8 KiB the same as 4;
/// prefetching the scales too changed nothing. The FP8 rows (compute-bound: 43 % of the
/// RAM rate on two threads) do not prefetch.
#[cfg(target_arch = "x86_64")]
const PREFETCH_AHEAD: usize = 4096;

/// [`PREFETCH_AHEAD`], or 0 (no prefetches) with `SPARSA_CPU_PREFETCH=0`, a measurement aid.
#[cfg(target_arch = "x86_64")]
fn prefetch_distance() -> usize {
    if crate::knobs::knob_on!("SPARSA_CPU_PREFETCH") {
        PREFETCH_AHEAD
    } else {
        0
    }
}

/// Prefetches `lines` 64-byte lines into L1 from `ahead` bytes past `p` (none where `ahead`
/// is 0). Addresses past the data are harmless: a prefetch is a hint, it never faults.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_ahead(p: *const u8, ahead: usize, lines: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    if ahead == 0 {
        return;
    }
    for i in 0..lines {
        // SAFETY: a prefetch reads nothing into the program and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead + 64 * i) as *const i8) };
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
    let (row, scales, nbk) = fp8_row_parts(m, r);
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
fn rows_generic(m: &CpuMatrix, xs: &[&[f32]], y: &mut [f32], row0: usize) {
    for (i, out) in y.chunks_exact_mut(xs.len()).enumerate() {
        for (o, x) in out.iter_mut().zip(xs) {
            *o = row_dot(m, row0 + i, x);
        }
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
}

/// What [`run_experts`] keeps from one call to the next: the activations, the task lists,
/// the quantized rows. Once a call has had the sizes of the next, the next allocates
/// nothing (issue 22: no allocation per token; `tests/executor_alloc.rs` counts).
#[derive(Default)]
pub struct Scratch {
    /// `silu(gate · x) ⊙ (up · x)`, a row of `inter` per (job, x row).
    act: Vec<f32>,
    /// Each job's first row in `act` and in the output.
    at: Vec<usize>,
    /// The running pass's tasks: (job, first row, end row).
    tasks: Vec<(usize, usize, usize)>,
    /// The x rows and the activation rows, quantized.
    xq: RowCache,
    aq: RowCache,
    /// Each job's gate_up tasks not yet done.
    left: Vec<AtomicUsize>,
    /// The activation rows as slices: empty between calls (see [`relend`]).
    acts: Vec<&'static [f32]>,
}

/// SwiGLU experts on rows of x: `jobs[j]` = (expert, its x rows). `out` gets, job after
/// job, each row's `down(silu(gate · x) ⊙ (up · x))` (`hidden` floats a row, the expert's
/// output before its routing weight). Two parallel passes over every job at once, so a
/// decode step's few experts keep every thread busy and nothing runs serially between them:
/// gate and up (a task takes a chunk of both matrices' rows and writes `silu(g) · u` for
/// each x row), then down (a task takes a chunk of rows and writes them into each row's
/// output). Each distinct x row is quantized once for the integer products, in parallel;
/// each activation row by the gate_up task that finishes its job, so the passes are two.
/// Everything between them lives in `scratch`.
pub fn run_experts(
    pool: &Pool,
    jobs: &[(CpuExpert, &[&[f32]])],
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let Some((first, _)) = jobs.first() else {
        return;
    };
    let (inter, hidden) = (first.gate.n, first.down.n);
    assert!(
        jobs.iter().all(|(e, xs)| e.gate.n == inter
            && e.down.n == hidden
            && xs.iter().all(|x| x.len() >= e.gate.k)),
        "run_experts: experts of different shapes, or short x rows"
    );
    let rows: usize = jobs.iter().map(|(_, xs)| xs.len()).sum();
    assert!(out.len() >= rows * hidden, "run_experts: short output");
    let Scratch {
        act,
        at,
        tasks: ts,
        xq,
        aq,
        left,
        acts,
    } = scratch;
    if act.len() < rows * inter {
        act.resize(rows * inter, 0.0);
    }
    let act = &mut act[..rows * inter];
    at.clear();
    let mut n = 0;
    for (_, xs) in jobs {
        at.push(n);
        n += xs.len();
    }
    let at = &*at;
    let threads = pool.threads();
    // x rows quantized once per distinct row (decode: the experts of a token share one).
    xq.fill(Some(pool), jobs.iter().map(|(e, xs)| (&e.gate, *xs)));
    let xq = &*xq;
    // The activation rows quantized for down's integer products, one each (no two jobs
    // share one): the job's last gate_up task fills them.
    aq.own_rows(jobs.iter().map(|(e, xs)| (&e.down, xs.len())));
    let aq_rows = SharedOut::of(&mut aq.rows);
    let dst = SharedOut::of(act);
    tasks_into(ts, jobs, inter, threads);
    left.clear();
    left.extend(jobs.iter().map(|_| AtomicUsize::new(0)));
    for &(j, _, _) in ts.iter() {
        *left[j].get_mut() += 1;
    }
    let left = &*left;
    let gate_up = |(j, n0, n1): (usize, usize, usize), act: SharedOut<f32>| {
        let (e, xs) = &jobs[j];
        let r = xs.len();
        let xr = xq.of(at[j], r);
        let (mut g, mut u) = ([0f32; MAX_TASK], [0f32; MAX_TASK]);
        let len = (n1 - n0) * r;
        e.gate.rows_into(xs, xr, &mut g[..len], n0);
        e.up.rows_into(xs, xr, &mut u[..len], n0);
        for c in 0..r {
            for i in 0..n1 - n0 {
                let (a, b) = (g[i * r + c], u[i * r + c]);
                // SAFETY: this task alone writes columns n0..n1 of job j's rows.
                unsafe { act.put((at[j] + c) * inter + n0 + i, a / (1.0 + (-a).exp()) * b) };
            }
        }
        // The job's last task quantizes its activation rows (a panicking task leaves them
        // undone, and the pass then panics in the caller).
        if left[j].fetch_sub(1, Ordering::AcqRel) == 1 && e.down.int_dot() {
            for c in 0..r {
                let at_row = at[j] + c;
                // SAFETY: every task of job j has written its rows (their writes come
                // before this through the counter's AcqRel) and none writes them again;
                // row at_row of the quantized rows is this job's alone.
                unsafe { aq_rows.at(at_row) }
                    .fill(unsafe { act.slice(at_row * inter, inter) }, is_q4(&e.down));
            }
        }
    };
    pool.run(ts.len(), &|t| gate_up(ts[t], dst));
    let act = &*act;
    let mut acts_here = relend(std::mem::take(acts));
    acts_here.extend(act.chunks_exact(inter));
    let acts_of = |j: usize| &acts_here[at[j]..at[j] + jobs[j].1.len()];
    let aq = &*aq;
    let down = |(j, n0, n1): (usize, usize, usize), out: SharedOut<f32>| {
        let (e, xs) = &jobs[j];
        let r = xs.len();
        let mut y = [0f32; MAX_TASK];
        e.down
            .rows_into(acts_of(j), aq.of(at[j], r), &mut y[..(n1 - n0) * r], n0);
        for c in 0..r {
            for i in 0..n1 - n0 {
                // SAFETY: this task alone writes elements n0..n1 of job j's output rows.
                unsafe { out.put((at[j] + c) * hidden + n0 + i, y[i * r + c]) };
            }
        }
    };
    let out = &mut out[..rows * hidden];
    let dst = SharedOut::of(out);
    tasks_into(ts, jobs, hidden, threads);
    pool.run(ts.len(), &|t| down(ts[t], dst));
    *acts = relend(acts_here);
}

/// `v` emptied, its allocation lent at another lifetime: a vector of borrowed slices kept
/// between calls holds none between them. (`collect` over the emptied vector's own
/// iterator reuses its allocation: the elements have one size; `tests/executor_alloc.rs`
/// checks that nothing is allocated.)
fn relend<'b>(mut v: Vec<&[f32]>) -> Vec<&'b [f32]> {
    v.clear();
    v.into_iter()
        .map(|_| -> &'b [f32] { unreachable!() })
        .collect()
}

/// The most values (rows × x rows) one task of [`run_experts`] computes into its stack.
const MAX_TASK: usize = 2048;

/// `out` made the tasks of a pass over `n` rows of every job's matrix: (job, first row,
/// end row), in chunks of about a quarter of the rows per thread, at most [`MAX_TASK`]
/// values each.
fn tasks_into(
    out: &mut Vec<(usize, usize, usize)>,
    jobs: &[(CpuExpert, &[&[f32]])],
    n: usize,
    threads: usize,
) {
    out.clear();
    for (j, (_, xs)) in jobs.iter().enumerate() {
        let chunk = chunk_rows(n * jobs.len(), xs.len(), threads);
        for n0 in (0..n).step_by(chunk) {
            out.push((j, n0, (n0 + chunk).min(n)));
        }
    }
}

/// Rows per task of a pass over `total` rows with `r` rows of x: about a quarter of the
/// rows per thread, 8 ..= 512, at most [`MAX_TASK`] values.
fn chunk_rows(total: usize, r: usize, threads: usize) -> usize {
    (total / (4 * threads).max(1))
        .clamp(8, 512)
        .min(MAX_TASK / r.max(1))
        .max(1)
}

/// A buffer that parallel tasks write disjoint elements of.
#[derive(Clone, Copy)]
struct SharedOut<T>(*mut T, usize);

// SAFETY: tasks write disjoint elements (each `put`'s caller says why), and the buffer
// outlives the parallel pass that writes it.
unsafe impl<T: Send> Send for SharedOut<T> {}
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    fn of(b: &mut [T]) -> SharedOut<T> {
        SharedOut(b.as_mut_ptr(), b.len())
    }
    /// # Safety
    /// No other task writes or reads element `i` during the pass.
    unsafe fn put(self, i: usize, v: T) {
        *self.at(i) = v;
    }
    /// Elements `from .. from + len`.
    ///
    /// # Safety
    /// No task writes them during the slice's life.
    unsafe fn slice(&self, from: usize, len: usize) -> &[T] {
        assert!(
            from + len <= self.1,
            "SharedOut: {from} + {len} of {}",
            self.1
        );
        std::slice::from_raw_parts(self.0.add(from), len)
    }
    /// # Safety
    /// As [`SharedOut::put`].
    #[allow(clippy::mut_from_ref)]
    unsafe fn at(&self, i: usize) -> &mut T {
        assert!(i < self.1, "SharedOut: element {i} of {}", self.1);
        &mut *self.0.add(i)
    }
}

/// The x rows of one product as quantized ([`XRow`]): row j's is `rows[idx[j]]`, none
/// where `idx[j]` is [`NO_ROW`] (its matrix takes x unquantized).
#[derive(Clone, Copy)]
struct XRows<'a> {
    rows: &'a [XRow],
    idx: &'a [u32],
}

/// An x row that no quantized row stands for.
const NO_ROW: u32 = u32::MAX;

impl<'a> XRows<'a> {
    fn get(&self, j: usize) -> Option<&'a XRow> {
        self.rows.get(*self.idx.get(j)? as usize)
    }

    /// Whether each of the first `r` rows has its quantized row.
    fn covers(&self, r: usize) -> bool {
        (0..r).all(|j| self.get(j).is_some())
    }
}

/// Quantized x rows for the matrices that take them so ([`CpuMatrix::int_dot`]), kept from
/// call to call: each distinct (row, element order) quantized once, in parallel, into rows
/// whose vectors the last call left.
#[derive(Default)]
struct RowCache {
    rows: Vec<XRow>,
    /// This fill's distinct rows: (address, q4's order, job, row of the job).
    want: Vec<(usize, bool, usize, usize)>,
    /// Per x row of every use in turn: its quantized row's index in `rows`, or [`NO_ROW`].
    idx: Vec<u32>,
}

impl RowCache {
    /// Quantizes the rows of `uses` (a matrix and its x rows per job), on `pool`'s threads
    /// where given.
    fn fill<'a>(
        &mut self,
        pool: Option<&Pool>,
        uses: impl Iterator<Item = (&'a CpuMatrix<'a>, &'a [&'a [f32]])> + Clone + Sync,
    ) {
        self.want.clear();
        self.idx.clear();
        for (j, (m, xs)) in uses.clone().enumerate() {
            let q4 = is_q4(m);
            for (c, x) in xs.iter().enumerate() {
                let mut i = NO_ROW;
                if m.int_dot() {
                    let at = x.as_ptr() as usize;
                    i = match self.want.iter().position(|w| (w.0, w.1) == (at, q4)) {
                        Some(i) => i as u32,
                        None => {
                            self.want.push((at, q4, j, c));
                            (self.want.len() - 1) as u32
                        }
                    };
                }
                self.idx.push(i);
            }
        }
        if self.rows.len() < self.want.len() {
            self.rows.resize_with(self.want.len(), XRow::default);
        }
        let rows = SharedOut::of(&mut self.rows);
        let want = &self.want;
        let quantize = |i: usize| {
            let (_, q4, j, c) = want[i];
            let (m, xs) = uses.clone().nth(j).expect("a job of this fill");
            // SAFETY: task i alone writes row i.
            unsafe { rows.at(i) }.fill(&xs[c][..m.k], q4);
        };
        match pool {
            Some(p) => p.run(want.len(), &quantize),
            None => (0..want.len()).for_each(quantize),
        }
    }

    /// A row of its own for each of the x rows of `uses` (a matrix and its count of x rows
    /// per job) whose matrix takes x quantized, for the caller to fill (no row shared).
    fn own_rows<'a>(&mut self, uses: impl Iterator<Item = (&'a CpuMatrix<'a>, usize)>) {
        self.want.clear();
        self.idx.clear();
        for (m, r) in uses {
            let q = m.int_dot();
            for _ in 0..r {
                let i = self.idx.len() as u32;
                self.idx.push(if q { i } else { NO_ROW });
            }
        }
        if self.rows.len() < self.idx.len() {
            self.rows.resize_with(self.idx.len(), XRow::default);
        }
    }

    /// The quantized rows of the `r` x rows from row `first` on (in the order of the fill's
    /// uses).
    fn of(&self, first: usize, r: usize) -> XRows<'_> {
        XRows {
            rows: &self.rows,
            idx: &self.idx[first..first + r],
        }
    }
}

fn is_q4(m: &CpuMatrix) -> bool {
    matches!(m.format, WFormat::Quant(QFormat::Q4 { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{assert_close, assert_close_plus, x_split_bound, Rng};

    /// Three threads (two workers and the caller), sleeping when idle.
    fn test_pool() -> Pool {
        Pool::new(3, std::time::Duration::ZERO).unwrap()
    }
    use crate::weights::quant::{dequantize_rows, quantize_fp8, quantize_rows};
    use crate::weights::DType;

    /// A matrix as stored: weight bytes, scale bytes, the values as stored.
    type Stored = (Vec<u8>, Vec<u8>, Vec<f32>);

    /// `data` ([n, k]) stored in `format`: (weight bytes, scale bytes, the values as stored).
    fn stored(format: WFormat, data: &[f32], n: usize, k: usize) -> Stored {
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

    /// x as a product with `m` sees it: quantized and back ([`XRow`]) where `m` takes x
    /// quantized, else as it is.
    fn seen(m: &CpuMatrix, x: &[f32]) -> Vec<f32> {
        if !m.int_dot() {
            return x.to_vec();
        }
        let q4 = matches!(m.format, WFormat::Quant(QFormat::Q4 { .. }));
        let r = XRow::new(x, q4);
        let mut v = x.to_vec();
        for b in 0..x.len() / 32 {
            for j in 0..32 {
                let at = 32 * b + if q4 { 2 * (j % 16) + j / 16 } else { j };
                v[at] = r.s[b] * (r.h[32 * b + j] as f32 + r.l[32 * b + j] as f32 / 254.0);
            }
        }
        v
    }

    /// The SwiGLU expert `e` (its matrices decoded: `back`) on `x` in f64 sums, each product
    /// with its input as the executor's product sees it ([`seen`]).
    fn expert_ref(e: &CpuExpert, back: [&[f32]; 3], x: &[f32]) -> Vec<f32> {
        let (inter, hidden) = (e.gate.n, e.gate.k);
        let g = matvec_ref(back[0], &seen(&e.gate, x), inter, hidden);
        let u = matvec_ref(back[1], &seen(&e.up, x), inter, hidden);
        let h: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| a / (1.0 + (-a).exp()) * b)
            .collect();
        matvec_ref(back[2], &seen(&e.down, &h), hidden, inter)
    }

    #[test]
    fn round_even_is_round_ties_even_in_its_range() {
        let mut rng = Rng::new(5);
        let mut xs: Vec<f32> = rng.vec(10_000, 130.0);
        // Ties, both parities and signs, and values next to them.
        for k in -128..=128 {
            let t = k as f32 + 0.5;
            xs.extend([t, -t, t.next_up(), t.next_down(), k as f32]);
        }
        for x in xs {
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn matvec_matches_the_decoded_matrix_in_every_format() {
        let mut rng = Rng::new(71);
        // Awkward sizes: partial blocks, rows past a 128-row FP8 block, k not a multiple of 8;
        // and whole blocks (k = 256: the AVX2 rows of q4, q8 and FP8 where the CPU has them).
        // k = 1024 and 544: 32 and 17 chunks, the AVX-512 rows' 16-chunk loop (and a tail).
        for (n, k) in [
            (5usize, 70usize),
            (131, 300),
            (260, 1000),
            (131, 256),
            (37, 1024),
            (19, 544),
        ] {
            let data = rng.vec(n * k, 1.0);
            let x = rng.vec(k, 1.0);
            for format in formats() {
                let (w, s, back) = stored(format, &data, n, k);
                let m = CpuMatrix::new("w", format, &w, &s, n, k).unwrap();
                let int_dot = m.int_dot();
                let want = matvec_ref(&back, &x, n, k);
                // x quantized for integer dot products adds at most its bound.
                let extra: Vec<f32> = match int_dot {
                    true => back.chunks(k).map(|w| x_split_bound(&x, w)).collect(),
                    false => Vec::new(),
                };
                // The product with x as quantized.
                let want_seen = matvec_ref(&back, &seen(&m, &x), n, k);
                // Every instruction set this CPU has (the portable rows do not take x
                // quantized, so they run only where the others do not quantize it).
                let mut first: Option<Vec<f32>> = None;
                for isa in Isa::all_here() {
                    if isa == Isa::Portable && int_dot {
                        continue;
                    }
                    let mut y = vec![f32::NAN; n];
                    m.matvec_on(isa, &x, &mut y);
                    // The integer rows of every set take the same integer sums: only the
                    // order of the float additions differs.
                    match &first {
                        Some(f) if int_dot => {
                            assert_close(&y, f, 1e-5, 1e-5, &format!("{format:?} {isa:?}"))
                        }
                        _ => first = Some(y.clone()),
                    }
                    let what =
                        format!("matvec {format:?} [{n}, {k}] on {isa:?}, int dot {int_dot}");
                    assert_close_plus(&y, &want, 1e-4, 1e-4, &extra, &what);
                    // And exactly (to f32 rounding) the product with x as quantized.
                    assert_close(&y, &want_seen, 1e-4, 1e-4, &what);
                }
            }
        }
    }

    #[test]
    fn fp8_rows_read_every_code_exactly() {
        // Row 0 holds each e4m3 code at its own column (subnormals, ±0 and ±448 among them)
        // but the NaN codes 0x7F / 0xFF, whose columns hold 0; row 1 + j holds a NaN code
        // at column j only. Scales of 1: with x = e_j row 0's product is code j's value, and
        // with x all ones every other row's is NaN, on every instruction set this CPU has.
        let k = 256;
        let nan = |c: u8| c & 0x7f == 0x7f;
        let mut w: Vec<u8> = (0..=255u8).map(|c| if nan(c) { 0 } else { c }).collect();
        for j in 0..k {
            w.extend((0..k).map(|c| match (c == j, j % 2) {
                (false, _) => 0,
                (true, 0) => 0x7f,
                (true, _) => 0xff,
            }));
        }
        let n = 1 + k;
        let s: Vec<u8> = [1f32; 6].iter().flat_map(|v| v.to_le_bytes()).collect();
        let m = CpuMatrix::new("w", WFormat::Quant(QFormat::Fp8), &w, &s, n, k).unwrap();
        for isa in Isa::all_here() {
            let mut y = vec![0f32; n];
            for j in 0..k {
                let mut x = vec![0f32; k];
                x[j] = 1.0;
                m.matvec_on(isa, &x, &mut y);
                let want = if nan(j as u8) {
                    0.0
                } else {
                    e4m3_to_f32(j as u8)
                };
                assert_eq!(y[0], want, "code {j:#04x} on {isa:?}");
            }
            m.matvec_on(isa, &vec![1f32; k], &mut y);
            for (j, v) in y[1..].iter().enumerate() {
                assert!(v.is_nan(), "a NaN code at column {j} on {isa:?}: {v}");
            }
        }
    }

    #[test]
    fn expert_matches_swiglu_reference() {
        let mut rng = Rng::new(72);
        let (hidden, inter) = (200, 96);
        for format in formats() {
            let mats: Vec<Stored> = [(inter, hidden), (inter, hidden), (hidden, inter)]
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
            let mut out = vec![f32::NAN; hidden];
            run_experts(
                &test_pool(),
                &[(e, &[&x[..]])],
                &mut out,
                &mut Scratch::default(),
            );
            let want = expert_ref(&e, [&mats[0].2, &mats[1].2, &mats[2].2], &x);
            assert_close(&out, &want, 1e-4, 1e-4, &format!("expert {format:?}"));
        }
    }

    #[test]
    fn run_experts_batches_rows_and_experts() {
        // Three experts with 1, 3 and 2 rows each (a verification's rows sharing experts),
        // against the SwiGLU reference of every row alone.
        let mut rng = Rng::new(73);
        let (hidden, inter) = (96, 72);
        for format in [
            WFormat::Quant(QFormat::Q4 { block: 32 }),
            WFormat::Quant(QFormat::Fp8),
            WFormat::Float(DType::BF16),
        ] {
            let stores: Vec<Vec<Stored>> = (0..3)
                .map(|_| {
                    [(inter, hidden), (inter, hidden), (hidden, inter)]
                        .iter()
                        .map(|&(n, k)| stored(format, &rng.vec(n * k, 0.5), n, k))
                        .collect()
                })
                .collect();
            let experts: Vec<CpuExpert> = stores
                .iter()
                .map(|m| {
                    let mat = |i: usize, n, k| {
                        CpuMatrix::new("m", format, &m[i].0, &m[i].1, n, k).unwrap()
                    };
                    CpuExpert::new(
                        "e",
                        mat(0, inter, hidden),
                        mat(1, inter, hidden),
                        mat(2, hidden, inter),
                    )
                    .unwrap()
                })
                .collect();
            let xs: Vec<Vec<f32>> = (0..6).map(|_| rng.vec(hidden, 1.0)).collect();
            let rows: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
            let jobs = [
                (experts[0], &rows[0..1]),
                (experts[1], &rows[1..4]),
                (experts[2], &rows[4..6]),
            ];
            let mut out = vec![f32::NAN; 6 * hidden];
            let mut scratch = Scratch::default();
            run_experts(&test_pool(), &jobs, &mut out, &mut scratch);
            let owner = [0, 1, 1, 1, 2, 2];
            for (r, x) in xs.iter().enumerate() {
                let m = &stores[owner[r]];
                let want = expert_ref(&experts[owner[r]], [&m[0].2, &m[1].2, &m[2].2], x);
                assert_close(
                    &out[r * hidden..(r + 1) * hidden],
                    &want,
                    1e-4,
                    1e-4,
                    &format!("{format:?} row {r}"),
                );
            }
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
