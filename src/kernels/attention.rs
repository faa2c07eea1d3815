//! Sparse MLA attention in absorbed form over the latent cache (`shaders/attention.wgsl`).
//!
//! Latent cache row `s`: `[c_kv (kv_lora) | k_pe (dr)]`. Query row `t`, head `h`:
//! `q[t, h*(dn+dr) .. ]` = `[q_nope (dn) | q_pe (dr)]` (q_pe already rotated).
//! `wkvb` is `kv_b_proj.weight`, `[heads * (dn + dv), kv_lora]`: head `h`'s rows
//! `h*(dn+dv) .. h*(dn+dv)+dn` map c_kv to k_nope, the next `dv` rows to v.
use super::{Recorder, View};
use crate::weights::GpuWeight;

/// `q_abs[t, h*kv_lora + c] = Σ_{d<dn} q[t, h*(dn+dr) + d] · wkvb[h*(dn+dv) + d, c]`.
#[allow(clippy::too_many_arguments)]
pub fn absorb_q(rec: &mut Recorder, q: View, wkvb: &GpuWeight, q_abs: View, rows: u32, heads: u32, dn: u32, dr: u32, dv: u32) {
    let _ = (rec, q, wkvb, q_abs, rows, heads, dn, dr, dv);
    todo!()
}

/// For each `t < rows`, `h < heads`, over the selected positions `s = idx[t*topk + j]`,
/// `j < cnt[t]`: `logit_j = (q_abs[t,h,:] · cache[s, :kv_lora] + q_pe[t,h,:] · cache[s, kv_lora..kv_lora+dr]) · scale`,
/// `o_lat[t, h*kv_lora + c] = Σ_j softmax(logit)_j · cache[s, c]` (online softmax, any count).
#[allow(clippy::too_many_arguments)]
pub fn sparse_mla(
    rec: &mut Recorder,
    q_abs: View,
    q: View,
    cache: View,
    idx: &wgpu::Buffer,
    cnt: &wgpu::Buffer,
    topk: u32,
    o_lat: View,
    rows: u32,
    heads: u32,
    dn: u32,
    dr: u32,
    kv_lora: u32,
    scale: f32,
) {
    let _ = (rec, q_abs, q, cache, idx, cnt, topk, o_lat, rows, heads, dn, dr, kv_lora, scale);
    todo!()
}

/// `o[t, h*dv + v] = Σ_c wkvb[h*(dn+dv) + dn + v, c] · o_lat[t, h*kv_lora + c]`.
#[allow(clippy::too_many_arguments)]
pub fn up_v(rec: &mut Recorder, o_lat: View, wkvb: &GpuWeight, o: View, rows: u32, heads: u32, dn: u32, dv: u32) {
    let _ = (rec, o_lat, wkvb, o, rows, heads, dn, dv);
    todo!()
}
