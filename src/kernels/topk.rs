//! Top-k selection on the GPU (`shaders/topk.wgsl`).
//!
//! Tie rule: among equal scores the lower position wins (+0 and -0 are equal), so every
//! backend selects the same set.
use super::{Recorder, View};

/// For each row `t < rows`: `valid = min(pos0 + t + 1, n_keys)`, `k = min(topk, valid)`;
/// writes the `k` positions `s < valid` with the largest `scores[t, s]` to
/// `idx[t * topk .. t * topk + k]` (u32, ascending position order) and `k` to `cnt[t]`.
pub fn topk(rec: &mut Recorder, scores: View, rows: u32, n_keys: u32, pos0: u32, topk: u32, idx: &wgpu::Buffer, cnt: &wgpu::Buffer) {
    let _ = (rec, scores, rows, n_keys, pos0, topk, idx, cnt);
    todo!()
}

/// The dense case (every row has `pos0 + t + 1 ≤ topk` valid keys): selects all of them,
/// `idx[t * topk + j] = j` for `j ≤ pos0 + t`, `cnt[t] = pos0 + t + 1`. No scores needed.
pub fn select_all(rec: &mut Recorder, rows: u32, pos0: u32, topk: u32, idx: &wgpu::Buffer, cnt: &wgpu::Buffer) {
    let _ = (rec, rows, pos0, topk, idx, cnt);
    todo!()
}
