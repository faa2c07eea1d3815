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
        /// rope_inplace's second slice of the same rows (`heads2` = 0: none).
        heads2: u32,
        head_stride2: u32,
        rot_off2: u32,
        interleave2: u32,
        dst_off2: u32,
        dst_stride2: u32,
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

/// Rotate, in place, the dims `r` names in each row `t < rows` of `x`; row `t` starts at
/// `x.offset + t * x.stride`. `cos_sin` (f32) holds, for row `t` and frequency
/// `i < rot_dim / 2`, `cos` at `(t * rot_dim / 2 + i) * 2` and `sin` right after (the host
/// computes them per position). Rotation: `(a, b) -> (a cos - b sin, b cos + a sin)`.
pub fn rope(rec: &mut Recorder, x: View, rows: u32, r: &RopeSlice, cos_sin: &wgpu::Buffer) {
    let none = RopeSlice { heads: 0, ..*r };
    dispatch(rec, (x, r), (x, &none), rows, cos_sin);
}

/// [`rope`] on two slices of the same `rows` rows in one dispatch: `a`'s dims `ra` names
/// and `b`'s dims `rb` names (views of one buffer, the same `rot_dim`, so one `cos_sin`),
/// as two calls of [`rope`] would rotate them. The slices must not overlap.
pub fn rope_pair(
    rec: &mut Recorder,
    (a, ra): (View, &RopeSlice),
    (b, rb): (View, &RopeSlice),
    rows: u32,
    cos_sin: &wgpu::Buffer,
) {
    assert!(
        a.buf == b.buf && ra.rot_dim == rb.rot_dim,
        "rope_pair: slices of one buffer with one rot_dim"
    );
    dispatch(rec, (a, ra), (b, rb), rows, cos_sin);
}

/// One `rope_inplace` dispatch over slice `a`, then slice `b` (`heads` 0: none).
fn dispatch(
    rec: &mut Recorder,
    (a, ra): (View, &RopeSlice),
    (b, rb): (View, &RopeSlice),
    rows: u32,
    cos_sin: &wgpu::Buffer,
) {
    debug_assert!(
        ra.rot_dim.is_multiple_of(2),
        "rope: odd rot_dim {}",
        ra.rot_dim
    );
    let half = ra.rot_dim / 2;
    let total = rows as u64 * (ra.heads + rb.heads) as u64 * half as u64;
    if total == 0 {
        return;
    }
    assert!(
        total <= u32::MAX as u64,
        "rope: {total} rotations exceed u32"
    );
    let p = Params {
        rows,
        heads: ra.heads,
        head_stride: ra.head_stride,
        rot_off: ra.rot_off,
        half,
        interleave: ra.interleave as u32,
        dst_off: a.offset,
        dst_stride: a.stride,
        heads2: rb.heads,
        head_stride2: rb.head_stride,
        rot_off2: rb.rot_off,
        interleave2: rb.interleave as u32,
        dst_off2: b.offset,
        dst_stride2: b.stride,
    };
    let gpu = rec.gpu();
    let pipe = gpu.pipeline(&ROPE, "rope_inplace", &[]);
    let grid = gpu.grid((total as u32).div_ceil(256));
    rec.dispatch(&pipe, &p, &[a.buf, cos_sin], grid);
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

    /// CPU rope of one row-slice `x` (the head starts at x[0]).
    fn rotate(
        x: &mut [f32],
        src: &[f32],
        cs: &[f32],
        rot_off: usize,
        rot_dim: usize,
        interleave: bool,
    ) {
        let half = rot_dim / 2;
        for i in 0..half {
            let (ia, ib) = if interleave {
                (rot_off + 2 * i, rot_off + 2 * i + 1)
            } else {
                (rot_off + i, rot_off + i + half)
            };
            let (c, s) = (cs[2 * i] as f64, cs[2 * i + 1] as f64);
            let (a, b) = (src[ia] as f64, src[ib] as f64);
            x[ia] = (a * c - b * s) as f32;
            x[ib] = (b * c + a * s) as f32;
        }
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
        for t in 0..k.rows {
            for h in 0..k.heads {
                let db = d_off + t * d_stride + h * k.head_stride;
                let from = d0[db..][..k.head_stride].to_vec();
                rotate(
                    &mut want[db..][..k.head_stride],
                    &from,
                    &cs[t * half * 2..][..half * 2],
                    k.rot_off,
                    k.rot_dim,
                    interleave,
                );
            }
        }
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

    /// rope_pair rotates both slices as two rope calls would: MLA query heads (half-split)
    /// and indexer heads (interleaved) after them in the same rows, as the forward pass
    /// lays them out, with awkward sizes.
    #[test]
    fn rope_pair_is_two_ropes() {
        let g = gpu();
        let mut rng = Rng::new(77);
        for &(rows, interleave) in &[(1usize, (false, true)), (5, (true, false))] {
            let (ha, hsa, offa, dim) = (3usize, 14usize, 6usize, 8usize);
            let (hb, hsb) = (5usize, 11usize);
            let stride = ha * hsa + hb * hsb + 3;
            let half = dim / 2;
            let cs = rng.cos_sin(rows, half);
            let x0 = rng.vec(2 + rows * stride, 1.0);
            let xb = g.buffer_from(&x0, "x").unwrap();
            let csb = g.buffer_from(&cs, "cos_sin").unwrap();
            let a = View::new(&xb, 2, stride as u32);
            let b = View::new(&xb, (2 + ha * hsa) as u32, stride as u32);
            let ra = RopeSlice {
                heads: ha as u32,
                head_stride: hsa as u32,
                rot_off: offa as u32,
                rot_dim: dim as u32,
                interleave: interleave.0,
            };
            let rb = RopeSlice {
                heads: hb as u32,
                head_stride: hsb as u32,
                rot_off: 0,
                rot_dim: dim as u32,
                interleave: interleave.1,
            };
            let mut rec = g.recorder();
            rope_pair(&mut rec, (a, &ra), (b, &rb), rows as u32, &csb);
            rec.finish().unwrap();
            let got = g.read_f32(&xb, 0, x0.len()).unwrap();
            let mut want = x0.clone();
            for t in 0..rows {
                let c = &cs[t * half * 2..][..half * 2];
                for (base, heads, hs, off, il) in [
                    (2 + t * stride, ha, hsa, offa, interleave.0),
                    (2 + t * stride + ha * hsa, hb, hsb, 0, interleave.1),
                ] {
                    for h in 0..heads {
                        let at = base + h * hs;
                        let from = x0[at..][..hs].to_vec();
                        rotate(&mut want[at..][..hs], &from, c, off, dim, il);
                    }
                }
            }
            assert_close(&got, &want, 1e-6, 1e-5, &format!("rope_pair rows {rows}"));
        }
    }
}
