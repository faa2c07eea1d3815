//! Rotary position embedding on a slice of each head (`shaders/rope.wgsl`).
use super::{Recorder, View};
use crate::gpu::{kernel_params, Shader, ShaderCode};

kernel_params! {
    struct Params {
        rows: u32,
        heads: u32,
        head_stride: u32,
        rot_off: u32,
        half: u32,
        interleave: u32,
        dst_off: u32,
        dst_stride: u32,
    }
}

const ROPE: Shader<Params> = Shader::new(
    "rope",
    concat!(
        include_str!("../../shaders/rotary.wgsl"),
        include_str!("../../shaders/rope.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[ROPE.code()];

/// Which dims of which heads RoPE rotates, and how it pairs them: dims
/// `[rot_off, rot_off + rot_dim)` of each of `heads` heads, head `h` of a row starting
/// `h * head_stride` into it. `interleave` rotates `(x[2i], x[2i+1])`; otherwise the
/// half-split pairs `(x[i], x[i + rot_dim/2])` (NeoX).
#[derive(Clone, Copy, Debug)]
pub struct RopeSlice {
    pub heads: u32,
    pub head_stride: u32,
    pub rot_off: u32,
    pub rot_dim: u32,
    pub interleave: bool,
}

/// RoPE that a kernel applies to its queries as it reads them, instead of a [`rope`]
/// dispatch before it (`sparse_mla`'s `q_pe`, `indexer_scores`' queries): the dims `slice`
/// names, rotated with row `t`'s cos/sin from `cos_sin` (laid out as [`rope`] reads them).
/// Each kernel states which slices it can rotate.
#[derive(Clone, Copy)]
pub struct QueryRope<'a> {
    pub slice: RopeSlice,
    pub cos_sin: &'a wgpu::Buffer,
}

impl QueryRope<'_> {
    /// The kernels' `rope` parameter: 0 = none, 1 = half-split pairs, 2 = interleaved.
    pub(super) fn mode(r: Option<&Self>) -> u32 {
        r.map_or(0, |r| 1 + r.slice.interleave as u32)
    }
}

/// Rotate, in place, the dims `r` names in each row `t < rows` of `x`; row `t` starts at
/// `x.offset + t * x.stride`. `cos_sin` (f32) holds, for row `t` and frequency
/// `i < rot_dim / 2`, `cos` at `(t * rot_dim / 2 + i) * 2` and `sin` right after (the host
/// computes them per position). Rotation: `(a, b) -> (a cos - b sin, b cos + a sin)`.
pub fn rope(rec: &mut Recorder, x: View, rows: u32, r: &RopeSlice, cos_sin: &wgpu::Buffer) {
    debug_assert!(
        r.rot_dim.is_multiple_of(2),
        "rope: odd rot_dim {}",
        r.rot_dim
    );
    let half = r.rot_dim / 2;
    let total = rows as u64 * r.heads as u64 * half as u64;
    if total == 0 {
        return;
    }
    assert!(
        total <= u32::MAX as u64,
        "rope: {total} rotations exceed u32"
    );
    let p = Params {
        rows,
        heads: r.heads,
        head_stride: r.head_stride,
        rot_off: r.rot_off,
        half,
        interleave: r.interleave as u32,
        dst_off: x.offset,
        dst_stride: x.stride,
    };
    let gpu = rec.gpu();
    let pipe = gpu.pipeline(&ROPE, "rope_inplace", &[]);
    let grid = gpu.grid((total as u32).div_ceil(256));
    rec.dispatch(&pipe, &p, &[x.buf, cos_sin], grid);
}

/// CPU reference of [`rope`] (in f64): rotates the dims `r` names in each of `rows` rows
/// of `x`, row `t` at `t * stride`, with `cs` laid out as [`rope`] reads it.
#[cfg(test)]
pub(crate) fn rope_ref(x: &mut [f32], rows: usize, stride: usize, r: &RopeSlice, cs: &[f32]) {
    let half = r.rot_dim as usize / 2;
    for t in 0..rows {
        for h in 0..r.heads as usize {
            let base = t * stride + h * r.head_stride as usize + r.rot_off as usize;
            for i in 0..half {
                let (ia, ib) = if r.interleave {
                    (base + 2 * i, base + 2 * i + 1)
                } else {
                    (base + i, base + i + half)
                };
                let ci = (t * half + i) * 2;
                let (c, s) = (cs[ci] as f64, cs[ci + 1] as f64);
                let (a, b) = (x[ia] as f64, x[ib] as f64);
                x[ia] = (a * c - b * s) as f32;
                x[ib] = (b * c + a * s) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{assert_close, gpu, Rng};

    struct Case {
        rows: usize,
        heads: usize,
        head_stride: usize,
        rot_off: usize,
        rot_dim: usize,
    }

    fn check(seed: u64, k: &Case, interleave: bool) {
        let g = gpu();
        let mut rng = Rng::new(seed);
        let half = k.rot_dim / 2;
        let cs = rng.cos_sin(k.rows, half);
        let row_len = k.heads * k.head_stride;
        let (d_off, d_stride) = (5usize, row_len + 3);
        let dlen = d_off + k.rows * d_stride + 4;
        let d0 = rng.vec(dlen, 1.0);
        let db = g.buffer_from(&d0, "dst").unwrap();
        let csb = g.buffer_from(&cs, "cos_sin").unwrap();
        let dv = View::new(&db, d_off as u32, d_stride as u32);
        let mut rec = g.recorder();
        let slice = RopeSlice {
            heads: k.heads as u32,
            head_stride: k.head_stride as u32,
            rot_off: k.rot_off as u32,
            rot_dim: k.rot_dim as u32,
            interleave,
        };
        rope(&mut rec, dv, k.rows as u32, &slice, &csb);
        rec.finish().unwrap();
        let got = g.read_f32(&db, 0, dlen).unwrap();
        let mut want = d0.clone();
        rope_ref(&mut want[d_off..], k.rows, d_stride, &slice, &cs);
        let what = format!(
            "rope rows={} heads={} hs={} off={} dim={} interleave={interleave}",
            k.rows, k.heads, k.head_stride, k.rot_off, k.rot_dim
        );
        assert_close(&got, &want, 1e-6, 1e-5, &what);
    }

    #[test]
    fn rope_pairings_and_offsets() {
        let cases = [
            Case {
                rows: 3,
                heads: 5,
                head_stride: 24,
                rot_off: 7,
                rot_dim: 10,
            },
            Case {
                rows: 37,
                heads: 5,
                head_stride: 18,
                rot_off: 0,
                rot_dim: 18,
            },
            Case {
                rows: 1,
                heads: 3,
                head_stride: 192,
                rot_off: 128,
                rot_dim: 64,
            },
            Case {
                rows: 2,
                heads: 1,
                head_stride: 4,
                rot_off: 2,
                rot_dim: 2,
            },
        ];
        let mut seed = 0;
        for k in &cases {
            for interleave in [false, true] {
                seed += 1;
                check(seed, k, interleave);
            }
        }
    }
}
