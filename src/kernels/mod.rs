//! One module per WGSL kernel family (`shaders/<name>.wgsl`), each with its Rust wrapper
//! and its tests against a plain-Rust CPU reference.
//!
//! Wrappers only record work into a [`Recorder`]; nothing waits for the GPU.
//! All activations are f32. A [`View`] is a row-major f32 matrix inside a buffer:
//! element (r, c) lives at `offset + r * stride + c`.

pub mod attention;
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

/// Shader sources, embedded at compile time. Kernels that read weights get
/// `weights.wgsl` (dtype decoding) prepended, and those that may read quantized weights
/// `quant.wgsl` too.
pub mod src {
    pub const ATTENTION: &str = concat!(
        include_str!("../../shaders/weights.wgsl"),
        include_str!("../../shaders/quant.wgsl"),
        include_str!("../../shaders/attention.wgsl")
    );
    pub const CALIBRATE: &str = include_str!("../../shaders/calibrate.wgsl");
    pub const MLA: &str = include_str!("../../shaders/mla.wgsl");
    pub const ELEMENTWISE: &str = include_str!("../../shaders/elementwise.wgsl");
    pub const EMBED: &str = concat!(
        include_str!("../../shaders/weights.wgsl"),
        include_str!("../../shaders/embed.wgsl")
    );
    pub const INDEXER: &str = include_str!("../../shaders/indexer.wgsl");
    pub const MATMUL: &str = concat!(
        include_str!("../../shaders/weights.wgsl"),
        include_str!("../../shaders/quant.wgsl"),
        include_str!("../../shaders/matmul.wgsl"),
        include_str!("../../shaders/matmul_tile.wgsl")
    );
    /// MATMUL with the GEMV on 8-bit integer dot products (its own module, so browsers
    /// without WGSL's packed_4x8_integer_dot_product still compile the others).
    pub const MATMUL_DOT: &str = concat!(
        include_str!("../../shaders/weights.wgsl"),
        include_str!("../../shaders/quant.wgsl"),
        include_str!("../../shaders/matmul.wgsl"),
        include_str!("../../shaders/matmul_tile.wgsl"),
        include_str!("../../shaders/matmul_dot.wgsl")
    );
    /// MATMUL with the GEMM tile on tensor cores (its `enable` lines first).
    pub const MATMUL_COOP: &str = concat!(
        include_str!("../../shaders/matmul_coop.wgsl"),
        include_str!("../../shaders/weights.wgsl"),
        include_str!("../../shaders/quant.wgsl"),
        include_str!("../../shaders/matmul.wgsl")
    );
    pub const NORM: &str = include_str!("../../shaders/norm.wgsl");
    pub const ROPE: &str = include_str!("../../shaders/rope.wgsl");
    pub const ROUTER: &str = include_str!("../../shaders/router.wgsl");
    pub const SAMPLE: &str = concat!(
        include_str!("../../shaders/sample_key.wgsl"),
        include_str!("../../shaders/sample.wgsl")
    );
    pub const SAMPLE_PICK: &str = concat!(
        include_str!("../../shaders/sample_key.wgsl"),
        include_str!("../../shaders/sample_pick.wgsl")
    );
    pub const TOPK: &str = concat!(
        include_str!("../../shaders/select.wgsl"),
        include_str!("../../shaders/topk.wgsl")
    );
    pub const TOPK_WIDE: &str = concat!(
        include_str!("../../shaders/select.wgsl"),
        include_str!("../../shaders/topk_wide.wgsl")
    );
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
