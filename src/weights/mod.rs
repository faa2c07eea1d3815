//! Safetensors model files, memory-mapped, and their upload to the GPU.
//!
//! `WeightFiles` opens `model.safetensors` or the shards named by
//! `model.safetensors.index.json`, validates every header, and hands out byte slices that
//! point into the mapping: no file is ever read whole into RAM. `GpuWeight` is a matrix on
//! the GPU in its stored dtype, split into row chunks that each fit one storage binding.

mod files;
mod gpu_weight;
pub mod quant;

pub use files::{parse_shard_index, TensorRef, WeightFiles};
pub use gpu_weight::{GpuWeight, QuantPart, WeightChunk};
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
    /// Decode little-endian bytes of this dtype to f32.
    pub fn to_f32(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
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
