//! Safetensors model files, memory-mapped, and their upload to the GPU.
//!
//! `WeightFiles` opens `model.safetensors` or the shards named by
//! `model.safetensors.index.json`, validates every header, and hands out byte slices that
//! point into the mapping: no file is ever read whole into RAM. `GpuWeight` is a matrix on
//! the GPU in its stored dtype, split into row chunks that each fit one storage binding.

mod files;
mod gpu_weight;

pub use files::{TensorRef, WeightFiles};
pub use gpu_weight::{GpuWeight, WeightChunk};

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
                "tensor {tensor}: dtype {other:?} is not supported yet (expected F32, BF16 or F16)"
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
