//! RMSNorm and LayerNorm (`shaders/norm.wgsl`). Input and output buffers must differ.
use super::{Recorder, View};

/// `y[r, :dim] = x[r, :dim] * rsqrt(mean(x²) + eps) * w` for `r < rows`, in f32
/// (`w`: f32 buffer of `dim`).
pub fn rms_norm(rec: &mut Recorder, x: View, w: &wgpu::Buffer, y: View, rows: u32, dim: u32, eps: f32) {
    let _ = (rec, x, w, y, rows, dim, eps);
    todo!()
}

/// LayerNorm with bias: `y = (x - mean) / sqrt(var + eps) * w + b` (biased variance), f32.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(rec: &mut Recorder, x: View, w: &wgpu::Buffer, b: &wgpu::Buffer, y: View, rows: u32, dim: u32, eps: f32) {
    let _ = (rec, x, w, b, y, rows, dim, eps);
    todo!()
}
