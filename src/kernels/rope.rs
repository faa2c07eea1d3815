//! Rotary position embedding on a slice of each head (`shaders/rope.wgsl`).
use super::{Recorder, View};

/// Rotate dims `[rot_off, rot_off + rot_dim)` of each of `heads` heads of each row `t < rows`.
/// Head `h` of row `t` starts at `view.offset + t * stride + h * head_stride`.
/// `cos_sin` (f32) holds, for row `t` and frequency `i < rot_dim / 2`, `cos` at
/// `(t * rot_dim / 2 + i) * 2` and `sin` right after (the host computes them per position).
/// Pairing: `interleave` rotates `(x[2i], x[2i+1])`; otherwise half-split
/// `(x[i], x[i + rot_dim/2])` (NeoX). Rotation: `(a, b) -> (a cos - b sin, b cos + a sin)`.
/// `src = None` rotates `dst` in place; otherwise reads `src`, writes `dst` (other buffer),
/// copying nothing outside the rotated dims.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    rec: &mut Recorder,
    src: Option<View>,
    dst: View,
    rows: u32,
    heads: u32,
    head_stride: u32,
    rot_off: u32,
    rot_dim: u32,
    interleave: bool,
    cos_sin: &wgpu::Buffer,
) {
    let _ = (rec, src, dst, rows, heads, head_stride, rot_off, rot_dim, interleave, cos_sin);
    todo!()
}
