//! Matrix products over weights in their stored dtype (`shaders/matmul.wgsl`):
//! a GEMV for decode (few rows) and a tiled GEMM for prefill, f32 accumulation.
use super::{Recorder, View};
use crate::weights::GpuWeight;

/// `y[t, n] = Σ_k x[t, k] · W[n, k]` for `t < rows`, `n < w.rows`, `k < w.cols`.
/// One dispatch per weight chunk; picks GEMV or GEMM by `rows`. `x` and `y` must be
/// different buffers.
pub fn matmul(rec: &mut Recorder, x: View, w: &GpuWeight, y: View, rows: u32) {
    let _ = (rec, x, w, y, rows);
    todo!()
}

/// Routed-expert product. `w` stacks `n_experts` matrices of `w.rows / n_experts` rows
/// (chunks split only between experts). For `t < rows`, `j < topk`, with
/// `e = experts[t * topk + j]` (u32 buffer): `y[t * topk + j, n] = Σ_k x[r, k] · W_e[n, k]`
/// where `r = t * topk + j` if `x_per_slot`, else `r = t`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_experts(
    rec: &mut Recorder,
    x: View,
    x_per_slot: bool,
    w: &GpuWeight,
    n_experts: u32,
    experts: &wgpu::Buffer,
    topk: u32,
    y: View,
    rows: u32,
) {
    let _ = (rec, x, x_per_slot, w, n_experts, experts, topk, y, rows);
    todo!()
}
