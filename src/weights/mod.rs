//! Safetensors model files, memory-mapped, and their upload to the GPU.
//!
//! `WeightFiles` opens `model.safetensors` or the shards named by
//! `model.safetensors.index.json`, validates every header, and hands out byte slices that
//! point into the mapping: no file is ever read whole into RAM. `GpuWeight` is a matrix on
//! the GPU in its stored dtype, split into row chunks that each fit one storage binding.

mod files;
mod gpu_weight;
#[cfg(not(target_arch = "wasm32"))]
pub mod mapguard;
pub mod quant;

pub use files::{parse_shard_index, TensorRef, WeightFiles};
pub use gpu_weight::{GpuWeight, QuantPart, RowSource, WeightChunk};
pub use quant::QFormat;

use crate::error::{Error, Result};

/// Element types the matmul kernels read directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }
    /// The `W_DTYPE` define the kernels switch on.
    pub fn code(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::BF16 => 1,
            DType::F16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::BF16 => "BF16",
            DType::F16 => "F16",
        }
    }
    pub fn from_safetensors(d: safetensors::Dtype, tensor: &str) -> Result<DType> {
        match d {
            safetensors::Dtype::F32 => Ok(DType::F32),
            safetensors::Dtype::BF16 => Ok(DType::BF16),
            safetensors::Dtype::F16 => Ok(DType::F16),
            other => Err(Error::msg(format!(
                "tensor {tensor}: dtype {other:?} where F32, BF16 or F16 was expected (quantized weights need their scale tensor; norms, biases and embeddings must be floating point)"
            ))),
        }
    }
    /// Index of the first NaN or infinite element of little-endian `bytes` of this dtype
    /// (an all-ones exponent), or None: a branch-free lane test on the exponent bits per
    /// 64 bytes, with the exact scan only in a block that hit.
    pub fn first_non_finite(self, bytes: &[u8]) -> Option<usize> {
        let (exp, lane_low, lane_high): (u64, u64, u64) = match self {
            DType::F32 => (
                0x7F80_0000_7F80_0000,
                0x0000_0001_0000_0001,
                0x8000_0000_8000_0000,
            ),
            DType::BF16 => (
                0x7F80_7F80_7F80_7F80,
                0x0001_0001_0001_0001,
                0x8000_8000_8000_8000,
            ),
            DType::F16 => (
                0x7C00_7C00_7C00_7C00,
                0x0001_0001_0001_0001,
                0x8000_8000_8000_8000,
            ),
        };
        let size = self.size();
        let exact = |at: usize, chunk: &[u8]| -> Option<usize> {
            chunk
                .chunks_exact(size)
                .position(|c| {
                    let mut w = [0u8; 8];
                    w[..size].copy_from_slice(c);
                    u64::from_le_bytes(w) & exp == exp & (u64::MAX >> (64 - 8 * size))
                })
                .map(|i| at / size + i)
        };
        // A lane whose exponent bits are all set becomes zero in `t`; the usual "has a zero
        // lane" test (t - 1) & !t & high finds any such lane (lanes never have their top bit
        // set, so only a zero lane borrows). 64-byte blocks are tested branch-free.
        let hit = |w: &[u8]| -> u64 {
            let x = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
            let t = (x & exp) ^ exp;
            t.wrapping_sub(lane_low) & !t & lane_high
        };
        let blocks = bytes.chunks_exact(64);
        let tail = blocks.remainder();
        for (k, b) in blocks.enumerate() {
            if b.chunks_exact(8).fold(0, |a, w| a | hit(w)) != 0 {
                if let Some(i) = exact(64 * k, b) {
                    return Some(i);
                }
            }
        }
        exact(bytes.len() - tail.len(), tail)
    }

    /// Decode little-endian bytes of this dtype to f32.
    pub fn to_f32(self, bytes: &[u8]) -> Vec<f32> {
        let mut out = vec![0f32; bytes.len() / self.size()];
        self.decode_into(bytes, &mut out);
        out
    }
    /// [`DType::to_f32`] into `out` (as many elements as both hold), allocating nothing.
    #[inline(always)]
    pub fn decode_into(self, bytes: &[u8], out: &mut [f32]) {
        match self {
            DType::F32 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            // bf16 is f32's upper half: the shift is exact (a NaN stays NaN; its payload is
            // not quieted, as `half` does) and, unlike `half`'s branch, vectorizes.
            DType::BF16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
                }
            }
            DType::F16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
        }
    }
    /// Encode f32 values in this dtype (round to nearest even).
    pub fn from_f32(self, v: &[f32]) -> Vec<u8> {
        match self {
            DType::F32 => bytemuck::cast_slice(v).to_vec(),
            DType::BF16 => v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect(),
            DType::F16 => v
                .iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
        }
    }
}

/// How a matrix is stored on the GPU: a float dtype, or a block-quantized format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WFormat {
    Float(DType),
    Quant(QFormat),
}

impl WFormat {
    /// The `W_DTYPE` define: 0..=2 floats, 3 FP8 e4m3, 4 q8, 5 q4.
    pub fn code(self) -> u32 {
        match self {
            WFormat::Float(d) => d.code(),
            WFormat::Quant(QFormat::Fp8) => 3,
            WFormat::Quant(QFormat::Q8 { .. }) => 4,
            WFormat::Quant(QFormat::Q4 { .. }) => 5,
        }
    }
    /// Columns per scale (the `QB` define; 0 for floats).
    pub fn block(self) -> usize {
        match self {
            WFormat::Float(_) => 0,
            WFormat::Quant(q) => q.block(),
        }
    }
    /// Whether scales are bf16 (q8 / q4) rather than f32 (FP8).
    pub fn scale_bf16(self) -> bool {
        matches!(
            self,
            WFormat::Quant(QFormat::Q8 { .. } | QFormat::Q4 { .. })
        )
    }
    /// Elements per GPU row for `cols` columns (quantized rows are padded to the block).
    pub fn stride(self, cols: usize) -> usize {
        match self {
            WFormat::Float(_) => cols,
            WFormat::Quant(q) => cols.div_ceil(q.block()) * q.block(),
        }
    }
    /// Bytes of one GPU row of `cols` columns.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            WFormat::Float(d) => cols * d.size(),
            WFormat::Quant(q) => self.stride(cols) * q.bits() / 8,
        }
    }
    /// Bytes of the GPU scales of one row (0 for floats).
    pub fn scale_row_bytes(self, cols: usize) -> usize {
        match self {
            WFormat::Float(_) => 0,
            WFormat::Quant(q) => {
                self.stride(cols) / q.block() * if self.scale_bf16() { 2 } else { 4 }
            }
        }
    }
    /// Elements per 16-byte word (the `EPV` define of the 16-byte GEMV).
    pub fn per_word(self) -> usize {
        match self {
            WFormat::Float(d) => 16 / d.size(),
            WFormat::Quant(q) => 128 / q.bits(),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            WFormat::Float(d) => d.name(),
            WFormat::Quant(q) => q.name(),
        }
    }
}

impl From<DType> for WFormat {
    fn from(d: DType) -> WFormat {
        WFormat::Float(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_non_finite_finds_nan_and_inf_at_any_position() {
        for d in [DType::F32, DType::BF16, DType::F16] {
            for n in [1usize, 3, 4, 5, 8, 9, 17] {
                let ok: Vec<f32> = (0..n).map(|i| i as f32 * -1.5e3 + 0.25).collect();
                assert_eq!(d.first_non_finite(&d.from_f32(&ok)), None, "{d:?} {n}");
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    for at in [0, n / 2, n - 1] {
                        let mut v = ok.clone();
                        v[at] = bad;
                        if at + 1 < n {
                            v[n - 1] = bad;
                        }
                        assert_eq!(
                            d.first_non_finite(&d.from_f32(&v)),
                            Some(at),
                            "{d:?} {n} {bad} at {at}"
                        );
                    }
                }
            }
        }
        // The largest finite values are not flagged.
        assert_eq!(
            DType::F16.first_non_finite(&DType::F16.from_f32(&[65504.0; 5])),
            None
        );
        assert_eq!(
            DType::BF16.first_non_finite(&DType::BF16.from_f32(&[-3.0e38; 5])),
            None
        );
    }
}
