//! Embedding gather (`shaders/embed.wgsl`).
use super::{Recorder, View};
use crate::weights::GpuWeight;

/// `out[t, :] = table[ids[ids_off + t], :]` as f32, for `t < n`. `table` is `[vocab, dim]`
/// in any [`crate::weights::DType`] and may be split into chunks (one dispatch per chunk;
/// each writes the rows whose id falls in that chunk). Ids ≥ vocab write zeros.
pub fn embed(rec: &mut Recorder, table: &GpuWeight, ids: &wgpu::Buffer, ids_off: u32, n: u32, out: View) {
    let _ = (rec, table, ids, ids_off, n, out);
    todo!()
}
