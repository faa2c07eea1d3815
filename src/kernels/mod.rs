//! One module per WGSL kernel family (`shaders/<name>.wgsl`), each with its Rust wrapper
//! and its tests against a plain-Rust CPU reference.
//!
//! Each module declares its shader once: the source, embedded with `include_str!` (kernels
//! that read weights get `weights.wgsl`, dtype decoding, prepended, and those that may read
//! quantized weights `quant.wgsl` too), and its `Params` with `kernel_params!`, whose WGSL
//! struct the pipeline cache puts before the source.
//!
//! Wrappers only record work into a [`Recorder`]; nothing waits for the GPU.
//! All activations are f32. A [`View`] is a row-major f32 matrix inside a buffer:
//! element (r, c) lives at `offset + r * stride + c`.

pub mod attention;
pub mod cache;
pub mod elementwise;
pub mod embed;
pub mod indexer;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod router;
pub mod sample;
pub mod topk;

#[cfg(test)]
pub(crate) mod testutil;

pub use crate::gpu::Recorder;
use crate::gpu::ShaderCode;

/// Every kernel shader (the backend test checks that each entry point of each was
/// translated for Metal and DX12).
pub fn shaders() -> Vec<ShaderCode> {
    [
        attention::SHADERS,
        cache::SHADERS,
        elementwise::SHADERS,
        embed::SHADERS,
        indexer::SHADERS,
        matmul::SHADERS,
        norm::SHADERS,
        rope::SHADERS,
        router::SHADERS,
        sample::SHADERS,
        topk::SHADERS,
    ]
    .concat()
}

/// The query rows of a chunk over the positions scored for it: row `t < rows` is at
/// position `pos0 + t` and sees the positions `s ≤ pos0 + t` of the `n_keys` scored
/// (causal attention over the cache).
#[derive(Clone, Copy, Debug)]
pub struct Causal {
    pub rows: u32,
    pub n_keys: u32,
    pub pos0: u32,
}

/// A row-major f32 matrix inside a buffer: element (r, c) at `offset + r * stride + c`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u32,
    pub stride: u32,
}

impl<'a> View<'a> {
    pub fn new(buf: &'a wgpu::Buffer, offset: u32, stride: u32) -> Self {
        View {
            buf,
            offset,
            stride,
        }
    }
    /// Rows of `stride` elements starting at element 0.
    pub fn rows(buf: &'a wgpu::Buffer, stride: u32) -> Self {
        View {
            buf,
            offset: 0,
            stride,
        }
    }
    /// The same matrix starting `cols` columns further right.
    pub fn col(self, cols: u32) -> Self {
        View {
            offset: self.offset + cols,
            ..self
        }
    }
    /// The same matrix starting `rows` rows further down.
    pub fn row(self, rows: u32) -> Self {
        View {
            offset: self.offset + rows * self.stride,
            ..self
        }
    }
}
