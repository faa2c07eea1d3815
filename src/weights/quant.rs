//! Quantized weight formats: the official FP8 releases and sparsa's own q8 / q4.
//!
//! All three are block-scaled integers (or e4m3 floats) with scales in a side tensor, so a
//! quantized directory is still an ordinary safetensors model directory:
//!
//! | format | weight tensor `W` | scale tensor | value |
//! |---|---|---|---|
//! | FP8 (GLM-5-FP8, DeepSeek-V3.2) | `F8_E4M3` `[N, K]` | `W_scale_inv` `F32` `[⌈N/128⌉, ⌈K/128⌉]` | `e4m3(W[i,j]) · S[i/128, j/128]` |
//! | sparsa q8 | `I8` `[N, K]` | `W_scale` `BF16` `[N, ⌈K/B⌉]` | `W[i,j] · S[i, j/B]` |
//! | sparsa q4 | `U8` `[N, ⌈K/2⌉]` (element `2j` in the low nibble) | `W_scale` `BF16` `[N, ⌈K/B⌉]` | `(nibble − 8) · S[i, j/B]` |
//!
//! sparsa's formats are symmetric (q8 uses −127..127, q4 −8..7 with the scale chosen so the
//! largest magnitude maps to 7 or −8), row-wise blocks of `B` columns (default
//! [`DEFAULT_BLOCK`]; see docs/QUANTIZATION.md for the measurements behind it), bf16 scales
//! (f32's exponent range: f16 scales of small-magnitude blocks would be subnormal, which
//! some GPUs flush to zero when converting).
//! `config.json` says which format a directory uses in `quantization_config`
//! (`{"quant_method": "sparsa", "format": "q8", "block_size": 32}`), and each safetensors file
//! repeats it in its `__metadata__`.
//!
//! On the GPU every quantized matrix uses one layout: rows padded with zeros to a multiple of
//! the block (`stride`), one scale per (row, block) — FP8's 128×128 scales are repeated per
//! row at upload (4 bytes per 128 weights) — so element `i` of a chunk has scale `i / block`.

use super::TensorRef;
use crate::error::{Error, Result};

/// Default row block of sparsa's q8 / q4 formats (columns per scale).
pub const DEFAULT_BLOCK: usize = 32;
/// FP8 releases scale 128×128 blocks.
pub const FP8_BLOCK: usize = 128;

/// The largest finite e4m3fn value.
pub const E4M3_MAX: f32 = 448.0;

/// Decode one `float8_e4m3fn` byte: sign, 4-bit exponent (bias 7), 3-bit mantissa;
/// exponent 0 is subnormal (`m/8 · 2⁻⁶`); `0x7F` / `0xFF` are NaN; there are no infinities.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xF) as i32;
    let m = (b & 7) as f32;
    if e == 15 && b & 7 == 7 {
        return f32::NAN;
    }
    if e == 0 {
        sign * m / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// Nearest e4m3fn byte to `x` (round to nearest even, saturating at ±448).
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    if a.is_nan() {
        return 0x7F;
    }
    // Exhaustive search over the 127 non-negative finite codes is cheap and exact.
    let mut best = 0u8;
    let mut best_d = f32::INFINITY;
    for c in 0u8..=0x7E {
        let v = e4m3_to_f32(c);
        let d = (v - a).abs();
        // Ties go to the even code (even mantissa).
        if d < best_d || (d == best_d && c & 1 == 0) {
            best = c;
            best_d = d;
        }
    }
    sign | best
}

/// Whether an e4m3fn byte is NaN.
pub fn e4m3_is_nan(b: u8) -> bool {
    b & 0x7F == 0x7F
}

/// A quantized matrix format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QFormat {
    /// `float8_e4m3fn` with fp32 inverse scales of 128×128 blocks (official releases).
    Fp8,
    /// sparsa 8-bit: int8, a bf16 scale per row block of `block` columns.
    Q8 { block: usize },
    /// sparsa 4-bit: two nibbles per byte, a bf16 scale per row block of `block` columns.
    Q4 { block: usize },
}

impl QFormat {
    /// Columns per scale on the GPU (FP8: 128).
    pub fn block(self) -> usize {
        match self {
            QFormat::Fp8 => FP8_BLOCK,
            QFormat::Q8 { block } | QFormat::Q4 { block } => block,
        }
    }
    /// Bits per weight element.
    pub fn bits(self) -> usize {
        match self {
            QFormat::Fp8 | QFormat::Q8 { .. } => 8,
            QFormat::Q4 { .. } => 4,
        }
    }
    /// The name used on the command line and in config.json.
    pub fn name(self) -> &'static str {
        match self {
            QFormat::Fp8 => "fp8",
            QFormat::Q8 { .. } => "q8",
            QFormat::Q4 { .. } => "q4",
        }
    }
    /// Suffix of the scale tensor's name.
    pub fn scale_suffix(self) -> &'static str {
        match self {
            QFormat::Fp8 => "_scale_inv",
            _ => "_scale",
        }
    }
    /// Bytes of one stored (file) row of `k` elements.
    pub fn file_row_bytes(self, k: usize) -> usize {
        match self {
            QFormat::Q4 { .. } => k.div_ceil(2),
            _ => k,
        }
    }
    /// Scale `i` (row-major in the scale tensor's shape) of the scale tensor's raw bytes:
    /// f32 `scale_inv` for FP8, bf16 otherwise.
    #[inline(always)]
    pub fn scale_at(self, scale: &[u8], i: usize) -> f32 {
        match self {
            QFormat::Fp8 => f32::from_le_bytes([
                scale[4 * i],
                scale[4 * i + 1],
                scale[4 * i + 2],
                scale[4 * i + 3],
            ]),
            // bf16 is f32's upper half: exact by a shift (no NaN-quieting branch).
            _ => {
                f32::from_bits((u16::from_le_bytes([scale[2 * i], scale[2 * i + 1]]) as u32) << 16)
            }
        }
    }
    /// Shape of the scale tensor of an `[n, k]` matrix in the file.
    pub fn scale_shape(self, n: usize, k: usize) -> [usize; 2] {
        match self {
            QFormat::Fp8 => [n.div_ceil(FP8_BLOCK), k.div_ceil(FP8_BLOCK)],
            _ => [n, k.div_ceil(self.block())],
        }
    }
    /// Whether `block` is one the kernels accept (a power of two, 32 ..= 256).
    pub fn check_block(block: usize, what: &str) -> Result<()> {
        if !(32..=256).contains(&block) || !block.is_power_of_two() {
            return Err(Error::msg(format!(
                "{what}: block size {block} is not supported (expected 32, 64, 128 or 256)"
            )));
        }
        Ok(())
    }
}

/// The format of a stored matrix, from its dtype: FP8 for `F8_E4M3`, sparsa q8 / q4 for `I8` /
/// `U8` (which `config.json`'s `quantization_config` must declare, with the block size), None
/// for floats.
pub fn stored_format(t: &TensorRef, qconfig: Option<QFormat>) -> Result<Option<QFormat>> {
    use safetensors::Dtype as D;
    let sparsa = |want: &str| -> Result<Option<QFormat>> {
        match qconfig {
            Some(q @ QFormat::Q8 { .. }) if want == "q8" => Ok(Some(q)),
            Some(q @ QFormat::Q4 { .. }) if want == "q4" => Ok(Some(q)),
            _ => Err(Error::msg(format!(
                "tensor {} in {}: dtype {:?} (sparsa {want}) but config.json's quantization_config does not declare sparsa {want}",
                t.name,
                t.file.display(),
                t.dtype
            ))),
        }
    };
    match t.dtype {
        D::F8_E4M3 => Ok(Some(QFormat::Fp8)),
        D::I8 => sparsa("q8"),
        D::U8 => sparsa("q4"),
        _ => Ok(None),
    }
}

/// Checks a quantized matrix of `cols` columns and its scale tensor: dtypes, shapes (which,
/// with the file's own size checks, bound every row and scale the upload slices) and, when
/// `scan`, finite scales (an expert streamed again was scanned on its first upload).
/// Returns the number of rows.
pub fn check_pair(
    w: &TensorRef,
    s: &TensorRef,
    fmt: QFormat,
    cols: usize,
    scan: bool,
) -> Result<usize> {
    use safetensors::Dtype as D;
    let (want_w, want_s) = match fmt {
        QFormat::Fp8 => (D::F8_E4M3, D::F32),
        QFormat::Q8 { .. } => (D::I8, D::BF16),
        QFormat::Q4 { .. } => (D::U8, D::BF16),
    };
    let bad = |what: String| {
        Err(Error::msg(format!(
            "tensor {} in {}: {what}",
            w.name,
            w.file.display()
        )))
    };
    if w.dtype != want_w {
        return bad(format!(
            "dtype {:?}, expected {want_w:?} for the {} format",
            w.dtype,
            fmt.name()
        ));
    }
    let frb = fmt.file_row_bytes(cols);
    if w.shape.len() != 2 || w.shape[1] != frb {
        return bad(format!(
            "shape {:?}, expected [*, {frb}] ({} columns in {})",
            w.shape,
            cols,
            fmt.name()
        ));
    }
    let rows = w.shape[0];
    if w.bytes.len() != rows.saturating_mul(frb) {
        return bad(format!(
            "{} bytes, expected {rows} rows of {frb} bytes",
            w.bytes.len()
        ));
    }
    let sshape = fmt.scale_shape(rows, cols);
    let s_size = if want_s == D::F32 { 4 } else { 2 };
    if s.dtype != want_s
        || s.shape != sshape
        || s.bytes.len() != sshape[0].saturating_mul(sshape[1]).saturating_mul(s_size)
    {
        return Err(Error::msg(format!(
            "tensor {} in {}: {:?} {:?}, expected {want_s:?} {sshape:?} (the scales of {})",
            s.name,
            s.file.display(),
            s.dtype,
            s.shape,
            w.name
        )));
    }
    let dtype = match fmt {
        QFormat::Fp8 => super::DType::F32,
        _ => super::DType::BF16,
    };
    if scan && dtype.first_non_finite(s.bytes).is_some() {
        return Err(Error::msg(format!(
            "tensor {} in {}: a scale is NaN or infinite",
            s.name,
            s.file.display()
        )));
    }
    Ok(rows)
}

/// Checks tensor `name` of `files` as the loader does when it is a quantized matrix (its
/// format from its dtype and `qconfig`, its scale tensor, their shapes), taking the column
/// count from its shape, and dequantizes its first rows on the CPU (at most `limit` values).
/// Returns the number of values decoded (0 for a float tensor).
pub fn check_stored(
    files: &super::WeightFiles,
    name: &str,
    qconfig: Option<QFormat>,
    limit: usize,
) -> Result<usize> {
    let w = files.get(name)?;
    let Some(fmt) = stored_format(&w, qconfig)? else {
        return Ok(0);
    };
    let sname = format!("{name}{}", fmt.scale_suffix());
    let s = files.get(&sname).map_err(|_| {
        Error::msg(format!(
            "tensor {name} in {}: {} weights need their scales in {sname}, which is missing",
            w.file.display(),
            fmt.name()
        ))
    })?;
    let stored = w.shape.get(1).copied().unwrap_or(0);
    let cols = match fmt {
        QFormat::Q4 { .. } => stored.saturating_mul(2),
        _ => stored,
    };
    let rows = check_pair(&w, &s, fmt, cols, true)?;
    let n = rows.min(limit / cols.max(1));
    Ok(dequantize_rows(fmt, w.bytes, s.bytes, 0, n, cols).len())
}

/// Quantize rows of `k` f32 values to sparsa q8 or q4: (weight bytes, bf16 scale bytes),
/// in the file layout. Blocks are symmetric: `scale = amax / 127` (q8) or `amax / 7.5`
/// rounded so that −8..7 covers ±amax best (q4 uses `amax / 7` when the extreme is
/// positive, `amax / 8` when negative, so the extreme is exact).
pub fn quantize_rows(fmt: QFormat, data: &[f32], k: usize) -> (Vec<u8>, Vec<u8>) {
    let b = fmt.block();
    let n = data.len() / k.max(1);
    let nb = k.div_ceil(b);
    let mut w = Vec::with_capacity(n * fmt.file_row_bytes(k));
    let mut s = Vec::with_capacity(n * nb * 2);
    let mut q = vec![0i32; k];
    for row in data.chunks_exact(k) {
        for (bi, blk) in row.chunks(b).enumerate() {
            let (lo, hi) = blk
                .iter()
                .fold((0f32, 0f32), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            let scale = match fmt {
                QFormat::Q4 { .. } => {
                    if -lo > hi {
                        -lo / 8.0
                    } else {
                        hi / 7.0
                    }
                }
                _ => lo.abs().max(hi) / 127.0,
            };
            // The stored scale is bf16; quantize against the value the GPU will use.
            let sh = half::bf16::from_f32(scale);
            let sf = sh.to_f32();
            s.extend_from_slice(&sh.to_le_bytes());
            let (qmin, qmax) = match fmt {
                QFormat::Q4 { .. } => (-8, 7),
                _ => (-127, 127),
            };
            for (j, &x) in blk.iter().enumerate() {
                q[bi * b + j] = if sf > 0.0 && sf.is_finite() {
                    ((x / sf).round() as i32).clamp(qmin, qmax)
                } else {
                    0
                };
            }
        }
        match fmt {
            QFormat::Q4 { .. } => {
                for pair in q.chunks(2) {
                    let lo = (pair[0] + 8) as u8;
                    let hi = pair.get(1).map_or(8, |v| (v + 8) as u8);
                    w.push(lo | (hi << 4));
                }
            }
            _ => w.extend(q.iter().map(|&v| v as i8 as u8)),
        }
    }
    (w, s)
}

/// Decode `n` rows of `k` elements of a quantized matrix in the file layout to f32.
/// `scale` holds the scale tensor's raw bytes (f32 for FP8, bf16 otherwise); `row0` is the
/// first row's index in the whole matrix (FP8 scales are per 128 rows).
pub fn dequantize_rows(
    fmt: QFormat,
    w: &[u8],
    scale: &[u8],
    row0: usize,
    n: usize,
    k: usize,
) -> Vec<f32> {
    let rb = fmt.file_row_bytes(k);
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        let row = &w[r * rb..(r + 1) * rb];
        for j in 0..k {
            let (v, s) = match fmt {
                QFormat::Fp8 => {
                    let nbk = k.div_ceil(FP8_BLOCK);
                    let si = ((row0 + r) / FP8_BLOCK) * nbk + j / FP8_BLOCK;
                    (e4m3_to_f32(row[j]), fmt.scale_at(scale, si))
                }
                QFormat::Q8 { block } | QFormat::Q4 { block } => {
                    let si = r * k.div_ceil(block) + j / block;
                    let s = fmt.scale_at(scale, si);
                    let v = match fmt {
                        QFormat::Q4 { .. } => ((row[j / 2] >> (4 * (j % 2))) & 15) as f32 - 8.0,
                        _ => row[j] as i8 as f32,
                    };
                    (v, s)
                }
            };
            out.push(v * s);
        }
    }
    out
}

/// FP8-quantize an `[n, k]` f32 matrix as the official releases do (per 128×128 block,
/// `scale = amax / 448`): (e4m3 bytes, f32 `scale_inv` bytes). Used by tests and `sparsa synth`.
pub fn quantize_fp8(data: &[f32], n: usize, k: usize) -> (Vec<u8>, Vec<u8>) {
    let (nbr, nbk) = (n.div_ceil(FP8_BLOCK), k.div_ceil(FP8_BLOCK));
    let mut scales = vec![0f32; nbr * nbk];
    for i in 0..n {
        for j in 0..k {
            let s = &mut scales[(i / FP8_BLOCK) * nbk + j / FP8_BLOCK];
            *s = s.max(data[i * k + j].abs());
        }
    }
    for s in scales.iter_mut() {
        *s = if *s > 0.0 { *s / E4M3_MAX } else { 1.0 };
    }
    let w = (0..n * k)
        .map(|idx| {
            let s = scales[(idx / k / FP8_BLOCK) * nbk + (idx % k) / FP8_BLOCK];
            f32_to_e4m3(data[idx] / s)
        })
        .collect();
    (w, bytemuck::cast_slice(&scales).to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_decodes_special_values() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert!(e4m3_to_f32(0x80) == 0.0 && e4m3_to_f32(0x80).is_sign_negative());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9)); // largest subnormal
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6)); // smallest normal
        assert_eq!(e4m3_to_f32(0x7E), 448.0);
        assert_eq!(e4m3_to_f32(0xFE), -448.0);
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
        // Every finite code round-trips through the encoder.
        for b in 0u8..=255 {
            if !e4m3_is_nan(b) && b != 0x80 {
                assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "code {b:#x}");
            }
        }
        assert_eq!(f32_to_e4m3(1e6), 0x7E);
    }

    #[test]
    fn q8_and_q4_round_trip_within_a_step() {
        let k = 77; // not a multiple of the block
        let data: Vec<f32> = (0..3 * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0)
            .collect();
        for fmt in [QFormat::Q8 { block: 32 }, QFormat::Q4 { block: 32 }] {
            let (w, s) = quantize_rows(fmt, &data, k);
            assert_eq!(w.len(), 3 * fmt.file_row_bytes(k));
            assert_eq!(s.len(), 3 * k.div_ceil(32) * 2);
            let back = dequantize_rows(fmt, &w, &s, 0, 3, k);
            for (r, row) in data.chunks(k).enumerate() {
                for (bi, blk) in row.chunks(32).enumerate() {
                    let amax = blk.iter().fold(0f32, |a, x| a.max(x.abs()));
                    let step = amax / if fmt.bits() == 8 { 127.0 } else { 7.0 };
                    // q4's range is −8..7 with the scale fitted to the extreme: the other
                    // side can clip by up to one step; q8 stays within half a step.
                    let bound = if fmt.bits() == 8 { 0.5 } else { 1.0 };
                    for (j, x) in blk.iter().enumerate() {
                        let y = back[r * k + bi * 32 + j];
                        assert!(
                            (x - y).abs() <= step * bound + 1e-3 * amax,
                            "{fmt:?} {x} {y}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_quantization_matches_the_release_rule() {
        let (n, k) = (130, 200);
        let data: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0)
            .collect();
        let (w, s) = quantize_fp8(&data, n, k);
        assert_eq!(s.len(), 2 * 2 * 4);
        let back = dequantize_rows(QFormat::Fp8, &w, &s, 0, n, k);
        for (x, y) in data.iter().zip(&back) {
            assert!((x - y).abs() <= x.abs() / 16.0 + 1e-6, "{x} {y}");
        }
    }
}
