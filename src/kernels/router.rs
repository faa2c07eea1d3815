//! MoE router (`shaders/router.wgsl`), DeepSeek-V3 "noaux_tc" rule.
use super::{Recorder, View};

/// For each row `t < rows` with router logits `logits[t, :n_experts]` (f32, from a matmul):
/// `s = sigmoid(logit)`; choice scores `c = s + bias` (bias f32 buffer of n_experts);
/// groups (`n_experts / n_group` consecutive experts): a group's score is the sum of its two
/// largest `c` (its largest when groups have one expert); keep the `topk_group` best groups,
/// the others' `c` become -inf; pick the `topk` largest `c` (ties: lower expert index wins);
/// weights are the unbiased `s` of the picks, divided by their sum (+1e-20) when
/// `norm_topk_prob`, times `scaling`. Writes `idx[t*topk + j]` (u32) and `weights[t*topk + j]`
/// (f32) in descending order of `c`.
#[allow(clippy::too_many_arguments)]
pub fn route(
    rec: &mut Recorder,
    logits: View,
    bias: &wgpu::Buffer,
    rows: u32,
    n_experts: u32,
    n_group: u32,
    topk_group: u32,
    topk: u32,
    norm_topk_prob: bool,
    scaling: f32,
    idx: &wgpu::Buffer,
    weights: &wgpu::Buffer,
) {
    let _ = (rec, logits, bias, rows, n_experts, n_group, topk_group, topk, norm_topk_prob, scaling, idx, weights);
    todo!()
}
