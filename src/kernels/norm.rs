//! RMSNorm and LayerNorm (`shaders/norm.wgsl`). Input and output buffers must differ.
use super::matmul::{xq_bytes, XQuant};
use super::{Recorder, View};
use crate::gpu::{kernel_params, Shader, ShaderCode};
use crate::weights::QFormat;

kernel_params! {
    struct Params {
        x_off: u32,
        x_stride: u32,
        y_off: u32,
        y_stride: u32,
        rows: u32,
        dim: u32,
        eps: f32,
        /// rms_norm_q: quantize in q4's element order.
        q4: u32,
        /// rms_norm_sel: the word of binding 4 that names the row.
        sel: u32,
    }
}

const NORM: Shader<Params> = Shader::new(
    "norm",
    concat!(
        include_str!("../../shaders/xquant.wgsl"),
        include_str!("../../shaders/reduce.wgsl"),
        include_str!("../../shaders/cpu.wgsl"),
        include_str!("../../shaders/norm.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[NORM.code()];

/// The rows of `x` normalized into the rows of `y` (`dim` columns each, `eps` added to
/// the variance).
struct Rows<'a> {
    x: View<'a>,
    y: View<'a>,
    rows: u32,
    dim: u32,
    eps: f32,
}

/// What a norm's binding 4 holds, if anything.
enum Fourth<'a> {
    None,
    /// rms_norm_q's quantized output, in q4's element order or not.
    Quantized(&'a wgpu::Buffer, bool),
    /// rms_norm_sel's row index: this word of the buffer.
    Selector(&'a wgpu::Buffer, u32),
}

/// One workgroup per row (CPU adapters' rms_norm: one invocation; rms_norm_sel: one
/// workgroup); the weight `w` and what binding 4 holds.
fn launch(rec: &mut Recorder, entry: &'static str, r: Rows, w: &wgpu::Buffer, b: Fourth) {
    let Rows {
        x,
        y,
        rows,
        dim,
        eps,
    } = r;
    debug_assert!(x.buf != y.buf, "norm: x and y must be different buffers");
    if rows == 0 || dim == 0 {
        return;
    }
    // CPU adapters: rms_norm_cpu, one invocation per row, CPU_WG rows a workgroup.
    let cpu = super::cpu_kernels(rec.gpu());
    let entry = match entry {
        "rms_norm" if cpu => "rms_norm_cpu",
        "rms_norm_sel" if cpu => "rms_norm_sel_cpu",
        e => e,
    };
    let pipe = rec.gpu().pipeline(&NORM, entry, &[]);
    // rms_norm_q: a workgroup per 32 blocks of 32 columns of each row; else one per row.
    let groups = match entry {
        "rms_norm_q" => rows * (dim / 32).div_ceil(32),
        "rms_norm_cpu" => rows.div_ceil(super::CPU_WG),
        "rms_norm_sel" | "rms_norm_sel_cpu" => 1,
        _ => rows,
    };
    let grid = rec.gpu().grid(groups);
    let mut p = Params {
        x_off: x.offset,
        x_stride: x.stride,
        y_off: y.offset,
        y_stride: y.stride,
        rows,
        dim,
        eps,
        ..Params::default()
    };
    match b {
        Fourth::None => rec.dispatch(&pipe, &p, &[x.buf, w, y.buf], grid),
        Fourth::Quantized(b, q4) => {
            p.q4 = q4 as u32;
            rec.dispatch(&pipe, &p, &[x.buf, w, y.buf, b], grid)
        }
        Fourth::Selector(b, word) => {
            p.sel = word;
            rec.dispatch(&pipe, &p, &[x.buf, w, y.buf, b], grid)
        }
    }
}

/// `y[r, :dim] = x[r, :dim] * rsqrt(mean(x²) + eps) * w` for `r < rows`, in f32
/// (`w`: f32 buffer of `dim`).
pub fn rms_norm(
    rec: &mut Recorder,
    x: View,
    w: &wgpu::Buffer,
    y: View,
    rows: u32,
    dim: u32,
    eps: f32,
) {
    let r = Rows {
        x,
        y,
        rows,
        dim,
        eps,
    };
    launch(rec, "rms_norm", r, w, Fourth::None);
}

/// [`rms_norm`] of the one row of `x`'s `rows` that word `word` of `sel` names (clamped to
/// the last), into `y`'s first row, in one dispatch: a speculative round's last accepted row
/// (its index in the round's state, `kernels::spec`), the same values [`rms_norm`] gives
/// that row. `sel` is at least 16 bytes and a multiple of 16.
pub fn rms_norm_selected(
    rec: &mut Recorder,
    (x, rows): (View, u32),
    (sel, word): (&wgpu::Buffer, u32),
    w: &wgpu::Buffer,
    y: View,
    dim: u32,
    eps: f32,
) {
    debug_assert!(
        sel.size() >= 16 && sel.size().is_multiple_of(16) && 4 * (word as u64) < sel.size()
    );
    let r = Rows {
        x,
        y,
        rows,
        dim,
        eps,
    };
    launch(rec, "rms_norm_sel", r, w, Fourth::Selector(sel, word));
}

/// [`rms_norm`] of `rows` rows (a decode step's one, a verification's few) that also writes
/// them quantized for the integer-dot GEMVs into `out` ([`xq_bytes`] of `dim` × `rows`),
/// in `order`'s element order: what `matmul::quantize_x` would make of `y`, without its
/// dispatch. `dim` a multiple of 32.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_q<'a>(
    rec: &mut Recorder,
    x: View,
    w: &wgpu::Buffer,
    y: View,
    (rows, dim): (u32, u32),
    eps: f32,
    order: QFormat,
    out: &'a wgpu::Buffer,
) -> XQuant<'a> {
    debug_assert!(dim.is_multiple_of(32) && out.size() >= xq_bytes(dim, rows));
    let r = Rows {
        x,
        y,
        rows,
        dim,
        eps,
    };
    let q4 = matches!(order, QFormat::Q4 { .. });
    launch(rec, "rms_norm_q", r, w, Fourth::Quantized(out, q4));
    XQuant {
        buf: out,
        k: dim,
        rows,
        order,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{assert_close, gpu, rms_norm_ref, Rng};
    use crate::kernels::with_cpu_kernels;

    const SENTINEL: f32 = -777.25;

    /// x rows scaled by `scale` and shifted by `shift`; x at offset 3 / stride dim+5,
    /// y at offset 9 / stride dim+2. Checks all of y's buffer (sentinel outside the rows).
    fn check(seed: u64, rows: usize, dim: usize, eps: f32, scale: f32, shift: f32) {
        let g = gpu();
        let mut rng = Rng::new(seed);
        let (x_off, x_stride, y_off, y_stride) = (3usize, dim + 5, 9usize, dim + 2);
        let xs: Vec<f32> = rng
            .vec(x_off + rows * x_stride, scale)
            .into_iter()
            .map(|v| v + shift)
            .collect();
        let w: Vec<f32> = rng.vec(dim, 1.0).into_iter().map(|v| v + 1.0).collect();
        let xb = g.buffer_from(&xs, "x").unwrap();
        let wb = g.buffer_from(&w, "w").unwrap();
        let ylen = y_off + rows * y_stride + 1;
        let yb = g.buffer_from(&vec![SENTINEL; ylen], "y").unwrap();
        let (xv, yv) = (
            View::new(&xb, x_off as u32, x_stride as u32),
            View::new(&yb, y_off as u32, y_stride as u32),
        );
        let mut rec = g.recorder();
        rms_norm(&mut rec, xv, &wb, yv, rows as u32, dim as u32, eps);
        rec.finish().unwrap();
        let got = g.read_f32(&yb, 0, ylen).unwrap();
        let mut want = vec![SENTINEL; ylen];
        for r in 0..rows {
            let xr = &xs[x_off + r * x_stride..][..dim];
            want[y_off + r * y_stride..][..dim].copy_from_slice(&rms_norm_ref(xr, &w, eps));
        }
        let what = format!("rms_norm rows={rows} dim={dim} eps={eps}");
        assert_close(&got, &want, 1e-5, 1e-4, &what);
    }

    #[test]
    fn rms_norm_sizes() {
        // The GPUs' kernel (a workgroup a row) and the CPU adapters' (an invocation a row).
        for cpu in [false, true] {
            with_cpu_kernels(cpu, || {
                for (i, (rows, dim)) in [(1, 577), (3, 7), (37, 1000), (2, 256), (5, 7168)]
                    .into_iter()
                    .enumerate()
                {
                    check(i as u64, rows, dim, 1e-6, 1.0, 0.0);
                }
            });
        }
    }

    #[test]
    fn rms_norm_selected_is_rms_norm_of_the_named_row() {
        // Bit for bit against rms_norm of all rows, for each kernel set: the row a word of
        // the selector names (not its first word), a past-the-end index clamped to the last
        // row, and y's other rows untouched.
        for cpu in [false, true] {
            with_cpu_kernels(cpu, || {
                let g = gpu();
                for (i, (rows, dim)) in [(4u32, 577u32), (5, 256), (2, 1030)]
                    .into_iter()
                    .enumerate()
                {
                    let mut rng = Rng::new(700 + i as u64);
                    let stride = dim + 3;
                    let xs = rng.vec((stride * rows) as usize + 5, 2.0);
                    let ws = rng.vec(dim as usize, 1.0);
                    let xb = g.buffer_from(&xs, "x").unwrap();
                    let wb = g.buffer_from(&ws, "w").unwrap();
                    let x = View::new(&xb, 5, stride);
                    let all = g.buffer(4 * (dim * rows) as u64, "all").unwrap();
                    let mut rec = g.recorder();
                    rms_norm(&mut rec, x, &wb, View::rows(&all, dim), rows, dim, 1e-6);
                    rec.finish().unwrap();
                    let want = g.read_f32(&all, 0, (dim * rows) as usize).unwrap();
                    for pick in [1, rows - 1, rows + 7] {
                        let sel = g
                            .buffer_from(&[9u32, 9, 9, 9, 9, 9, pick, 9], "sel")
                            .unwrap();
                        let yb = g
                            .buffer_from(&vec![SENTINEL; 2 * dim as usize + 2], "y")
                            .unwrap();
                        let mut rec = g.recorder();
                        let y = View::new(&yb, 2, dim);
                        rms_norm_selected(&mut rec, (x, rows), (&sel, 6), &wb, y, dim, 1e-6);
                        rec.finish().unwrap();
                        let got = g.read_f32(&yb, 0, 2 * dim as usize + 2).unwrap();
                        let r = pick.min(rows - 1) as usize;
                        let d = dim as usize;
                        let what = format!("cpu {cpu} rows {rows} dim {dim} pick {pick}");
                        assert_eq!(&got[2..2 + d], &want[r * d..(r + 1) * d], "{what}");
                        assert!(
                            got[..2].iter().chain(&got[2 + d..]).all(|v| *v == SENTINEL),
                            "{what}"
                        );
                    }
                }
            });
        }
    }

    #[test]
    fn rms_norm_q_is_rms_norm_then_quantize_x() {
        // Bit for bit: the f32 rows rms_norm writes, and the words quantize_x makes of
        // them (odd block counts; x off a 4-float boundary, rows of an odd stride; one row
        // and a verification's few; both element orders). rms_norm_q sums a row as the
        // GPUs' rms_norm does (rms_norm_cpu's order differs: the same to rounding only).
        with_cpu_kernels(false, rms_norm_q_cases);
    }

    fn rms_norm_q_cases() {
        let g = gpu();
        for (i, (dim, rows)) in [(32u32, 1u32), (96, 3), (6176, 1), (160, 5)]
            .into_iter()
            .enumerate()
        {
            for order in [QFormat::Q4 { block: 32 }, QFormat::Q8 { block: 32 }] {
                let mut rng = Rng::new(900 + i as u64);
                let stride = dim + 5;
                let xs = rng.vec((stride * rows) as usize + 3, 2.0);
                let ws = rng.vec(dim as usize, 1.0);
                let xb = g.buffer_from(&xs, "x").unwrap();
                let wb = g.buffer_from(&ws, "w").unwrap();
                let yb = [0, 1].map(|_| g.buffer(4 * (dim * rows) as u64, "y").unwrap());
                let qb = [0, 1].map(|_| g.buffer(xq_bytes(dim, rows), "xq").unwrap());
                let x = View::new(&xb, 3, stride);
                let mut rec = g.recorder();
                rms_norm(&mut rec, x, &wb, View::rows(&yb[0], dim), rows, dim, 1e-6);
                let y0 = View::rows(&yb[0], dim);
                crate::kernels::matmul::quantize_x(&mut rec, y0, rows, dim, order, &qb[0]);
                rms_norm_q(
                    &mut rec,
                    x,
                    &wb,
                    View::rows(&yb[1], dim),
                    (rows, dim),
                    1e-6,
                    order,
                    &qb[1],
                );
                rec.finish().unwrap();
                let n = (dim * rows) as usize;
                let q = xq_bytes(dim, rows) as usize;
                assert_eq!(
                    g.read_f32(&yb[0], 0, n).unwrap(),
                    g.read_f32(&yb[1], 0, n).unwrap()
                );
                let words = |b: &wgpu::Buffer| g.read_u32(b, 0, q / 4).unwrap();
                assert_eq!(words(&qb[0]), words(&qb[1]), "dim {dim} {order:?}");
            }
        }
    }

    #[test]
    fn rms_norm_eps_matters() {
        // mean(x²) ≈ 3e-3: eps = 1e-2 dominates, so a dropped or misplaced eps fails.
        check(11, 3, 300, 1e-2, 0.1, 0.0);
    }

    #[test]
    fn norm_many_rows_2d_grid() {
        // More rows than workgroups per grid dimension.
        let rows = gpu().max_groups() as usize + 37;
        check(40, rows, 3, 1e-6, 1.0, 0.0);
    }
}
