//! Small elementwise kernels (`shaders/elementwise.wgsl`).
use super::{Recorder, View};

/// `y[r, c] += x[r, c]` for `r < rows`, `c < dim` (x and y in different buffers).
pub fn add(rec: &mut Recorder, x: View, y: View, rows: u32, dim: u32) {
    let _ = (rec, x, y, rows, dim);
    todo!()
}

/// SwiGLU: `out[r, c] = silu(g[r, c]) * u[r, c]`, `silu(v) = v / (1 + exp(-v))`.
/// `g` and `u` may be views of one buffer; `out` must be another buffer.
pub fn swiglu(rec: &mut Recorder, g: View, u: View, out: View, rows: u32, dim: u32) {
    let _ = (rec, g, u, out, rows, dim);
    todo!()
}

/// MoE combine into the residual: `y[t, c] += Σ_{j<topk} weights[t*topk + j] · e[t*topk + j, c]`.
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(rec: &mut Recorder, e: View, weights: &wgpu::Buffer, topk: u32, y: View, rows: u32, dim: u32) {
    let _ = (rec, e, weights, topk, y, rows, dim);
    todo!()
}
