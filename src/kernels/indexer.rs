//! Lightning-indexer scores in f32 (`shaders/indexer.wgsl`).
use super::{Recorder, View};

/// For query rows `t < rows` (absolute position `pos0 + t`) and keys `s < n_keys`:
/// `out[t, s] = Σ_{h<heads} (w[t, h] · w_scale) · relu(q[t, h*dim .. h*dim+dim] · keys[s, :dim]) · scale`
/// and `out[t, s] = -inf` where `s > pos0 + t` (causal mask before top-k).
/// `q`: rows × heads·dim; `w`: rows × heads; `keys`: n_keys × dim.
#[allow(clippy::too_many_arguments)]
pub fn indexer_scores(
    rec: &mut Recorder,
    q: View,
    w: View,
    keys: View,
    out: View,
    rows: u32,
    heads: u32,
    dim: u32,
    n_keys: u32,
    pos0: u32,
    w_scale: f32,
    scale: f32,
) {
    let _ = (rec, q, w, keys, out, rows, heads, dim, n_keys, pos0, w_scale, scale);
    todo!()
}
