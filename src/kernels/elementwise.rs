//! Small elementwise kernels (`shaders/elementwise.wgsl`).
use super::matmul::{xq_bytes, XQuant};
use super::{Recorder, View};
use crate::gpu::{kernel_params, Shader, ShaderCode};
use crate::weights::QFormat;

kernel_params! {
    struct Params {
        a_off: u32,
        a_stride: u32,
        b_off: u32,
        b_stride: u32,
        o_off: u32,
        o_stride: u32,
        rows: u32,
        dim: u32,
        topk: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

const ELEMENTWISE: Shader<Params> = Shader::new(
    "elementwise",
    concat!(
        include_str!("../../shaders/xquant.wgsl"),
        include_str!("../../shaders/elementwise.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[ELEMENTWISE.code()];

impl Params {
    fn new(a: View, b: Option<View>, o: View, rows: u32, dim: u32, topk: u32) -> Params {
        let b = b.unwrap_or(a);
        Params {
            a_off: a.offset,
            a_stride: a.stride,
            b_off: b.offset,
            b_stride: b.stride,
            o_off: o.offset,
            o_stride: o.stride,
            rows,
            dim,
            topk,
            _pad0: 0,
            _pad1: 0,
            _pad2: 0,
        }
    }
}

/// Records `entry` over `rows × dim` elements, one invocation each.
fn run(rec: &mut Recorder, entry: &'static str, p: &Params, buffers: &[&wgpu::Buffer]) {
    let n = p.rows as u64 * p.dim as u64;
    if n == 0 {
        return;
    }
    assert!(n <= u32::MAX as u64, "{entry}: {n} elements exceed u32");
    let gpu = rec.gpu();
    let pipe = gpu.pipeline(&ELEMENTWISE, entry, &[]);
    let grid = gpu.grid((n as u32).div_ceil(256));
    rec.dispatch(&pipe, p, buffers, grid);
}

/// `y[r, c] += x[r, c]` for `r < rows`, `c < dim` (x and y in different buffers).
pub fn add(rec: &mut Recorder, x: View, y: View, rows: u32, dim: u32) {
    debug_assert!(x.buf != y.buf, "add: x and y must be different buffers");
    run(
        rec,
        "add",
        &Params::new(x, None, y, rows, dim, 0),
        &[y.buf, x.buf],
    );
}

/// Fills `rows × dim` values of `y` with seeded pseudo-random values, uniform with unit
/// variance (synthetic caches for benchmarks: same seed, same values on every adapter).
pub fn fill_random(rec: &mut Recorder, y: View, rows: u32, dim: u32, seed: u32) {
    let p = Params::new(y, None, y, rows, dim, seed);
    rec.cost(4 * rows as u64 * dim as u64, 0, "");
    run(rec, "fill_random", &p, &[y.buf]);
}

/// SwiGLU: `out[r, c] = silu(g[r, c]) * u[r, c]`, `silu(v) = v / (1 + exp(-v))`.
/// `g` and `u` may be views of one buffer; `out` must be another buffer.
pub fn swiglu(rec: &mut Recorder, g: View, u: View, out: View, rows: u32, dim: u32) {
    debug_assert!(
        out.buf != g.buf && out.buf != u.buf,
        "swiglu: out must be a buffer of its own"
    );
    let p = Params::new(g, Some(u), out, rows, dim, 0);
    if g.buf == u.buf {
        run(rec, "swiglu", &p, &[out.buf, g.buf]);
    } else {
        run(rec, "swiglu2", &p, &[out.buf, g.buf, u.buf]);
    }
}

/// [`swiglu`] with `g` and `u` in one buffer that also writes `out`'s rows quantized for
/// the integer-dot GEMVs into `xq` ([`xq_bytes`] of `dim` × `rows`), in `order`'s element
/// order: what `matmul::quantize_x` would make of `out`, without its dispatch. `dim` a
/// multiple of 32.
#[allow(clippy::too_many_arguments)]
pub fn swiglu_q<'a>(
    rec: &mut Recorder,
    g: View,
    u: View,
    out: View,
    rows: u32,
    dim: u32,
    order: QFormat,
    xq: &'a wgpu::Buffer,
) -> XQuant<'a> {
    debug_assert!(g.buf == u.buf && out.buf != g.buf && dim.is_multiple_of(32));
    debug_assert!(xq.size() >= xq_bytes(dim, rows));
    let q4 = matches!(order, QFormat::Q4 { .. }) as u32;
    // `dim` in the parameters stays the columns.
    let p = Params::new(g, Some(u), out, rows, dim, q4);
    let n = rows * (dim / 32);
    if n > 0 {
        let gpu = rec.gpu();
        let pipe = gpu.pipeline(&ELEMENTWISE, "swiglu_q", &[]);
        // Eight invocations per block.
        rec.dispatch(&pipe, &p, &[out.buf, g.buf, xq], gpu.grid(n.div_ceil(32)));
    }
    XQuant {
        buf: xq,
        k: dim,
        rows,
        order,
    }
}

/// MoE combine into the residual: `y[t, c] += Σ_{j<topk} weights[t*topk + j] · e[t*topk + j, c]`.
pub fn moe_combine(
    rec: &mut Recorder,
    e: View,
    weights: &wgpu::Buffer,
    topk: u32,
    y: View,
    rows: u32,
    dim: u32,
) {
    debug_assert!(
        e.buf != y.buf && weights != y.buf,
        "moe_combine: y must be a buffer of its own"
    );
    if topk == 0 {
        return;
    }
    run(
        rec,
        "moe_combine",
        &Params::new(e, None, y, rows, dim, topk),
        &[y.buf, e.buf, weights],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{assert_close, gpu, own_gpu, Rng};

    /// (offset, stride) of a view over `rows × dim` with some slack.
    fn layout(off: usize, extra: usize, dim: usize) -> (usize, usize) {
        (off, dim + extra)
    }

    /// A kept recording replays its own dispatches with its own parameters, though other
    /// recordings filled the same parameter slots with theirs in between: y = y0 + 3x after
    /// the recording and two replays, while a second buffer got the other recording's adds.
    #[test]
    fn replayed_recording_repeats_its_dispatches() {
        // A device of its own: `keep` refuses a recording during which the host wrote to any
        // buffer of the device, and other test threads write to the shared one's.
        let g = &own_gpu();
        let (rows, dim) = (3usize, 37usize);
        let mut rng = Rng::new(11);
        let x = rng.vec(rows * dim, 1.0);
        let (y0, z0) = (rng.vec(rows * dim, 1.0), rng.vec(2 * rows * dim, 1.0));
        let (xb, yb, zb) = (
            g.buffer_from(&x, "x").unwrap(),
            g.buffer_from(&y0, "y").unwrap(),
            g.buffer_from(&z0, "z").unwrap(),
        );
        let v = |b| View::new(b, 0, dim as u32);
        let mut rec = g.recorder();
        add(&mut rec, v(&xb), v(&yb), rows as u32, dim as u32);
        let kept = rec.keep().expect("nothing submitted or written: kept");
        assert_eq!(kept.dispatches(), 1);
        drop(rec);
        for _ in 0..2 {
            // Another recording in the same slots (other rows, other buffers) first.
            let mut rec = g.recorder();
            add(
                &mut rec,
                v(&xb),
                View::new(&zb, (rows * dim) as u32, dim as u32),
                rows as u32,
                dim as u32,
            );
            drop(rec);
            let mut rec = g.recorder();
            rec.replay(&kept);
            drop(rec);
        }
        let y = g.read_f32(&yb, 0, rows * dim).unwrap();
        let want: Vec<f32> = y0.iter().zip(&x).map(|(y, x)| y + 3.0 * x).collect();
        assert_close(
            &y,
            &want,
            1e-5,
            1e-6,
            "y after the recording and two replays",
        );
        let z = g.read_f32(&zb, 0, 2 * rows * dim).unwrap();
        let n = rows * dim;
        let want: Vec<f32> = (0..2 * n)
            .map(|i| if i < n { z0[i] } else { z0[i] + 2.0 * x[i - n] })
            .collect();
        assert_close(&z, &want, 1e-5, 1e-6, "z: the other recording's adds only");
        // Not kept: a host write while recording (the replay would not repeat it), or part
        // of the recording submitted already.
        let mut rec = g.recorder();
        add(&mut rec, v(&xb), v(&yb), rows as u32, dim as u32);
        g.write(&xb, 0, bytemuck::cast_slice(&x));
        assert!(rec.keep().is_none(), "kept across a host write");
        drop(rec);
        let mut rec = g.recorder();
        add(&mut rec, v(&xb), v(&yb), rows as u32, dim as u32);
        rec.flush();
        add(&mut rec, v(&xb), v(&yb), rows as u32, dim as u32);
        assert!(rec.keep().is_none(), "kept after a submission");
    }

    #[test]
    fn add_offsets_and_sizes() {
        let g = gpu();
        for (seed, (rows, dim)) in [(1usize, 1usize), (3, 577), (37, 131), (300, 7)]
            .into_iter()
            .enumerate()
        {
            let mut rng = Rng::new(seed as u64);
            let (xo, xs) = layout(3, 2, dim);
            let (yo, ys) = layout(8, 5, dim);
            let x = rng.vec(xo + rows * xs, 1.0);
            let y0 = rng.vec(yo + rows * ys + 3, 1.0);
            let xb = g.buffer_from(&x, "x").unwrap();
            let yb = g.buffer_from(&y0, "y").unwrap();
            let mut rec = g.recorder();
            add(
                &mut rec,
                View::new(&xb, xo as u32, xs as u32),
                View::new(&yb, yo as u32, ys as u32),
                rows as u32,
                dim as u32,
            );
            rec.finish().unwrap();
            let got = g.read_f32(&yb, 0, y0.len()).unwrap();
            let mut want = y0.clone();
            for r in 0..rows {
                for c in 0..dim {
                    want[yo + r * ys + c] += x[xo + r * xs + c];
                }
            }
            assert_close(&got, &want, 0.0, 0.0, &format!("add rows={rows} dim={dim}"));
        }
    }

    fn silu(v: f32) -> f64 {
        let v = v as f64;
        v / (1.0 + (-v).exp())
    }

    #[test]
    fn swiglu_one_and_two_buffers() {
        let g = gpu();
        for (seed, (rows, dim)) in [(1usize, 1usize), (3, 577), (37, 131), (300, 7)]
            .into_iter()
            .enumerate()
        {
            let mut rng = Rng::new(100 + seed as u64);
            // One buffer [rows, 2*dim + 3]: g at column 1, u at column dim + 2 (the usual
            // fused gate|up projection, shifted).
            let stride = 2 * dim + 3;
            let gu = rng.vec(4 + rows * stride, 8.0);
            let gub = g.buffer_from(&gu, "gu").unwrap();
            // Two buffers.
            let (uo, us) = layout(6, 1, dim);
            let u2 = rng.vec(uo + rows * us, 2.0);
            let u2b = g.buffer_from(&u2, "u").unwrap();
            let (oo, os) = layout(2, 4, dim);
            let olen = oo + rows * os + 2;
            let o0 = rng.vec(olen, 1.0);
            for two in [false, true] {
                let ob = g.buffer_from(&o0, "out").unwrap();
                let gv = View::new(&gub, 4 + 1, stride as u32);
                let uv = if two {
                    View::new(&u2b, uo as u32, us as u32)
                } else {
                    View::new(&gub, 4 + dim as u32 + 2, stride as u32)
                };
                let mut rec = g.recorder();
                swiglu(
                    &mut rec,
                    gv,
                    uv,
                    View::new(&ob, oo as u32, os as u32),
                    rows as u32,
                    dim as u32,
                );
                rec.finish().unwrap();
                let got = g.read_f32(&ob, 0, olen).unwrap();
                let mut want = o0.clone();
                for r in 0..rows {
                    for c in 0..dim {
                        let gval = gu[5 + r * stride + c];
                        let u = if two {
                            u2[uo + r * us + c]
                        } else {
                            gu[4 + dim + 2 + r * stride + c]
                        };
                        want[oo + r * os + c] = (silu(gval) * u as f64) as f32;
                    }
                }
                assert_close(
                    &got,
                    &want,
                    1e-6,
                    1e-5,
                    &format!("swiglu rows={rows} dim={dim} two_buffers={two}"),
                );
            }
        }
    }

    #[test]
    fn swiglu_q_is_swiglu_then_quantize_x() {
        // Bit for bit, several rows (the routed pairs' down-projection inputs), odd block
        // counts, offsets and strides; both element orders.
        let g = gpu();
        for (i, (rows, dim)) in [(1u32, 32u32), (3, 96), (8, 2080)].into_iter().enumerate() {
            for order in [QFormat::Q4 { block: 32 }, QFormat::Q8 { block: 32 }] {
                let mut rng = Rng::new(700 + i as u64);
                let stride = 2 * dim + 5;
                let gu = rng.vec((2 + rows * stride) as usize, 3.0);
                let gb = g.buffer_from(&gu, "gu").unwrap();
                let ob = [0, 1].map(|_| g.buffer(4 * (rows * dim) as u64, "act").unwrap());
                let qb = [0, 1].map(|_| g.buffer(xq_bytes(dim, rows), "xq").unwrap());
                let gv = View::new(&gb, 2, stride);
                let uv = gv.col(dim);
                let mut rec = g.recorder();
                swiglu(&mut rec, gv, uv, View::rows(&ob[0], dim), rows, dim);
                let o0 = View::rows(&ob[0], dim);
                crate::kernels::matmul::quantize_x(&mut rec, o0, rows, dim, order, &qb[0]);
                swiglu_q(
                    &mut rec,
                    gv,
                    uv,
                    View::rows(&ob[1], dim),
                    rows,
                    dim,
                    order,
                    &qb[1],
                );
                rec.finish().unwrap();
                let n = (rows * dim) as usize;
                assert_eq!(
                    g.read_f32(&ob[0], 0, n).unwrap(),
                    g.read_f32(&ob[1], 0, n).unwrap()
                );
                let q = xq_bytes(dim, rows) as usize / 4;
                let words = |b: &wgpu::Buffer| g.read_u32(b, 0, q).unwrap();
                assert_eq!(words(&qb[0]), words(&qb[1]), "{rows}x{dim} {order:?}");
            }
        }
    }

    #[test]
    fn moe_combine_sizes() {
        let g = gpu();
        for (seed, (rows, dim, topk)) in [
            (1usize, 577usize, 8usize),
            (3, 131, 3),
            (37, 7, 1),
            (20, 300, 6),
        ]
        .into_iter()
        .enumerate()
        {
            let mut rng = Rng::new(200 + seed as u64);
            let slots = rows * topk;
            let (eo, es) = layout(5, 3, dim);
            let e = rng.vec(eo + slots * es, 1.0);
            let wts = rng.vec(slots, 1.0);
            let (yo, ys) = layout(1, 6, dim);
            let y0 = rng.vec(yo + rows * ys + 2, 1.0);
            let eb = g.buffer_from(&e, "e").unwrap();
            let wb = g.buffer_from(&wts, "w").unwrap();
            let yb = g.buffer_from(&y0, "y").unwrap();
            let mut rec = g.recorder();
            moe_combine(
                &mut rec,
                View::new(&eb, eo as u32, es as u32),
                &wb,
                topk as u32,
                View::new(&yb, yo as u32, ys as u32),
                rows as u32,
                dim as u32,
            );
            rec.finish().unwrap();
            let got = g.read_f32(&yb, 0, y0.len()).unwrap();
            let mut want = y0.clone();
            for t in 0..rows {
                for c in 0..dim {
                    let s: f64 = (0..topk)
                        .map(|j| wts[t * topk + j] as f64 * e[eo + (t * topk + j) * es + c] as f64)
                        .sum();
                    want[yo + t * ys + c] = (want[yo + t * ys + c] as f64 + s) as f32;
                }
            }
            assert_close(
                &got,
                &want,
                1e-5,
                1e-5,
                &format!("moe_combine rows={rows} dim={dim} topk={topk}"),
            );
        }
    }

    #[test]
    fn add_2d_grid() {
        // More than 65535 workgroups of 256 along one dimension.
        let g = gpu();
        let dim = 256 * 3 + 1;
        let rows = (g.max_groups() as usize * 256).div_ceil(dim) + 5;
        let n = rows * dim;
        let x: Vec<f32> = (0..n).map(|i| (i % 1013) as f32).collect();
        let y0: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.5).collect();
        let xb = g.buffer_from(&x, "x").unwrap();
        let yb = g.buffer_from(&y0, "y").unwrap();
        let mut rec = g.recorder();
        add(
            &mut rec,
            View::rows(&xb, dim as u32),
            View::rows(&yb, dim as u32),
            rows as u32,
            dim as u32,
        );
        rec.finish().unwrap();
        let got = g.read_f32(&yb, 0, n).unwrap();
        let want: Vec<f32> = x.iter().zip(&y0).map(|(a, b)| a + b).collect();
        assert_close(&got, &want, 0.0, 0.0, "add 2d grid");
    }
}
