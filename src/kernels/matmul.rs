//! Matrix products over weights in their stored dtype (`shaders/matmul.wgsl`):
//! a GEMV for decode (few rows) and a tiled GEMM for prefill, f32 accumulation.
use super::{Recorder, View};
use crate::gpu::u;
use bytemuck::Zeroable;
use crate::weights::GpuWeight;

/// Up to this many rows of `x`, `matmul` runs the GEMV kernel (one pass over the weights);
/// beyond, the 64×64-tiled GEMM. `matmul_experts` uses the per-slot GEMV up to this many
/// tokens and the grouped GEMM beyond.
pub const GEMV_MAX_ROWS: u32 = 8;
/// Weight rows per GEMV workgroup (`RPW` in the shader).
const GEMV_RPW: u32 = 4;
/// GEMM tile (`BM` = `BN` in the shader).
const TILE: u32 = 64;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    k: u32,
    n: u32,
    rows: u32,
    topk: u32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    row0: u32,
    crow: u32,
    x_per_slot: u32,
    e0: u32,
    n_experts: u32,
    _pad: [u32; 3],
}

fn pipeline(rec: &Recorder, entry: &'static str, w: &GpuWeight, t: u32) -> std::sync::Arc<wgpu::ComputePipeline> {
    rec.gpu().pipeline("matmul", super::src::MATMUL, entry, &[("W_DTYPE", u(w.dtype.code())), ("T", u(t))])
}

/// `y[t, n] = Σ_k x[t, k] · W[n, k]` for `t < rows`, `n < w.rows`, `k < w.cols`.
/// One dispatch per weight chunk; picks GEMV or GEMM by `rows`. `x` and `y` must be
/// different buffers.
pub fn matmul(rec: &mut Recorder, x: View, w: &GpuWeight, y: View, rows: u32) {
    if rows == 0 || w.rows == 0 {
        return;
    }
    let gemv = rows <= GEMV_MAX_ROWS;
    let pipe = if gemv { pipeline(rec, "gemv", w, rows) } else { pipeline(rec, "gemm", w, 1) };
    for c in &w.chunks {
        if c.rows == 0 {
            continue;
        }
        let n = c.rows as u32;
        let p = Params {
            k: w.cols as u32,
            n,
            rows,
            x_off: x.offset,
            x_stride: x.stride,
            y_off: y.offset + c.row0 as u32,
            y_stride: y.stride,
            ..Params::zeroed()
        };
        let groups = if gemv { n.div_ceil(GEMV_RPW) } else { rows.div_ceil(TILE) * n.div_ceil(TILE) };
        let grid = rec.gpu().grid(groups);
        rec.dispatch(&pipe, &p, &[x.buf, &c.buf, y.buf], grid);
    }
}

/// Routed-expert product. `w` stacks `n_experts` matrices of `w.rows / n_experts` rows
/// (chunks split only between experts). For `t < rows`, `j < topk`, with
/// `e = experts[t * topk + j]` (u32 buffer): `y[t * topk + j, n] = Σ_k x[r, k] · W_e[n, k]`
/// where `r = t * topk + j` if `x_per_slot`, else `r = t`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_experts(
    rec: &mut Recorder,
    x: View,
    x_per_slot: bool,
    w: &GpuWeight,
    n_experts: u32,
    experts: &wgpu::Buffer,
    topk: u32,
    y: View,
    rows: u32,
) {
    if rows == 0 || topk == 0 || n_experts == 0 || w.rows == 0 {
        return;
    }
    assert!(w.rows % n_experts as usize == 0, "matmul_experts: {} rows do not split into {n_experts} experts", w.rows);
    let rpe = (w.rows / n_experts as usize) as u32;
    let slots = rows * topk;
    let gemv = rows <= GEMV_MAX_ROWS;
    let pipe = if gemv { pipeline(rec, "gemv_experts", w, 1) } else { pipeline(rec, "gemm_experts", w, 1) };
    for c in &w.chunks {
        if c.rows == 0 {
            continue;
        }
        // Experts with at least one row in this chunk (the whole expert unless the chunk
        // boundaries split one; the kernels handle both).
        let e0 = (c.row0 / rpe as usize) as u32;
        let e1 = (c.row0 + c.rows).div_ceil(rpe as usize) as u32;
        let p = Params {
            k: w.cols as u32,
            n: rpe,
            rows: slots,
            topk,
            x_off: x.offset,
            x_stride: x.stride,
            y_off: y.offset,
            y_stride: y.stride,
            row0: c.row0 as u32,
            crow: c.rows as u32,
            x_per_slot: x_per_slot as u32,
            e0,
            n_experts,
            _pad: [0; 3],
        };
        let groups = if gemv { slots * rpe.div_ceil(GEMV_RPW) } else { (e1 - e0) * rpe.div_ceil(TILE) };
        let grid = rec.gpu().grid(groups);
        rec.dispatch(&pipe, &p, &[x.buf, &c.buf, y.buf, experts], grid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{assert_close, gpu, Rng};
    use crate::weights::DType;

    const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
    const SENTINEL: f32 = -1234.5;

    /// The values the GPU sees for `w` stored as `dtype`.
    fn rounded(w: &[f32], dtype: DType) -> Vec<f32> {
        dtype.to_f32(&dtype.from_f32(w))
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() as f32
    }

    /// Runs `matmul` with x at (x_off, x_stride) and y at (y_off, y_stride) and checks every
    /// element of y's buffer: the product where written, the sentinel elsewhere.
    fn check_matmul(seed: u64, rows: usize, k: usize, n: usize, dtype: DType, chunk: Option<usize>) {
        let g = gpu();
        let mut rng = Rng::new(seed);
        let (x_off, x_stride) = (5usize, k + 3);
        let (y_off, y_stride) = (7usize, n + 2);
        let xs = rng.vec(x_off + rows * x_stride, 1.0);
        let wv = rng.vec(n * k, 1.0);
        let wr = rounded(&wv, dtype);
        let wgt = GpuWeight::from_f32(g, &wv, n, k, dtype, chunk, "w").unwrap();
        if let Some(c) = chunk {
            assert_eq!(wgt.chunks.len(), n.div_ceil(c), "chunking not exercised");
        }
        let xb = g.buffer_from(&xs, "x").unwrap();
        let ylen = y_off + rows * y_stride + 3;
        let yb = g.buffer_from(&vec![SENTINEL; ylen], "y").unwrap();
        let mut rec = g.recorder();
        matmul(&mut rec, View::new(&xb, x_off as u32, x_stride as u32), &wgt, View::new(&yb, y_off as u32, y_stride as u32), rows as u32);
        rec.finish().unwrap();
        let got = g.read_f32(&yb, 0, ylen).unwrap();
        let mut want = vec![SENTINEL; ylen];
        for t in 0..rows {
            let xr = &xs[x_off + t * x_stride..][..k];
            for j in 0..n {
                want[y_off + t * y_stride + j] = dot(xr, &wr[j * k..][..k]);
            }
        }
        let what = format!("matmul rows={rows} k={k} n={n} {dtype:?} chunk={chunk:?}");
        assert_close(&got, &want, 1e-4, 1e-4, &what);
    }

    #[test]
    fn gemv_all_dtypes_odd_sizes() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            for rows in [1, 3, GEMV_MAX_ROWS as usize] {
                check_matmul(10 + i as u64 * 7 + rows as u64, rows, 577, 131, dtype, None);
            }
        }
    }

    #[test]
    fn gemv_chunked() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            // Odd chunk row counts: with an odd K every other 16-bit row starts mid-word.
            check_matmul(20 + i as u64, 1, 577, 131, dtype, Some(37));
            check_matmul(23 + i as u64, 2, 64, 131, dtype, Some(16));
            check_matmul(26 + i as u64, 5, 3, 9, dtype, Some(1));
        }
    }

    #[test]
    fn gemm_all_dtypes_odd_sizes() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            check_matmul(30 + i as u64, 37, 577, 131, dtype, None);
            check_matmul(33 + i as u64, GEMV_MAX_ROWS as usize + 1, 31, 70, dtype, None);
        }
    }

    #[test]
    fn gemm_chunked_and_multi_tile() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            check_matmul(40 + i as u64, 37, 577, 131, dtype, Some(37));
            check_matmul(43 + i as u64, 70, 80, 129, dtype, Some(64));
            check_matmul(46 + i as u64, 130, 17, 5, dtype, Some(3));
        }
        // Exact tile multiples.
        check_matmul(49, 64, 64, 128, DType::BF16, None);
    }

    /// Stacked experts `[n_experts * rpe, k]` uploaded with `align_rows` and `chunk`.
    #[allow(clippy::too_many_arguments)]
    fn check_experts(
        seed: u64,
        rows: usize,
        topk: usize,
        n_experts: usize,
        rpe: usize,
        k: usize,
        dtype: DType,
        x_per_slot: bool,
        align_rows: usize,
        chunk: Option<usize>,
    ) {
        let g = gpu();
        let mut rng = Rng::new(seed);
        let slots = rows * topk;
        let xr_n = if x_per_slot { slots } else { rows };
        let (x_off, x_stride) = (3usize, k + 1);
        let (y_off, y_stride) = (11usize, rpe + 5);
        let xs = rng.vec(x_off + xr_n * x_stride, 1.0);
        let wv = rng.vec(n_experts * rpe * k, 1.0);
        let wr = rounded(&wv, dtype);
        let bytes = dtype.from_f32(&wv);
        let wgt = GpuWeight::upload_bytes(g, &[&bytes], n_experts * rpe, k, dtype, align_rows, chunk, "experts").unwrap();
        if chunk.is_some() {
            assert!(wgt.chunks.len() > 1, "chunking not exercised");
        }
        let ex: Vec<u32> = (0..slots).map(|_| rng.below(n_experts as u64) as u32).collect();
        let xb = g.buffer_from(&xs, "x").unwrap();
        let eb = g.buffer_from(&ex, "experts").unwrap();
        let ylen = y_off + slots * y_stride + 2;
        let yb = g.buffer_from(&vec![SENTINEL; ylen], "y").unwrap();
        let mut rec = g.recorder();
        matmul_experts(
            &mut rec,
            View::new(&xb, x_off as u32, x_stride as u32),
            x_per_slot,
            &wgt,
            n_experts as u32,
            &eb,
            topk as u32,
            View::new(&yb, y_off as u32, y_stride as u32),
            rows as u32,
        );
        rec.finish().unwrap();
        let got = g.read_f32(&yb, 0, ylen).unwrap();
        let mut want = vec![SENTINEL; ylen];
        for s in 0..slots {
            let r = if x_per_slot { s } else { s / topk };
            let xrow = &xs[x_off + r * x_stride..][..k];
            let e = ex[s] as usize;
            for j in 0..rpe {
                want[y_off + s * y_stride + j] = dot(xrow, &wr[(e * rpe + j) * k..][..k]);
            }
        }
        let what = format!(
            "matmul_experts rows={rows} topk={topk} experts={n_experts}×{rpe} k={k} {dtype:?} per_slot={x_per_slot} align={align_rows} chunk={chunk:?}"
        );
        assert_close(&got, &want, 1e-4, 1e-4, &what);
    }

    #[test]
    fn experts_gemv() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            for (rows, per_slot) in [(1, false), (3, true), (GEMV_MAX_ROWS as usize, false)] {
                let seed = 50 + i as u64 * 10 + rows as u64;
                check_experts(seed, rows, 3, 5, 37, 577, dtype, per_slot, 37, None);
                // Chunks of one and of two experts (odd row counts).
                check_experts(seed + 100, rows, 3, 5, 37, 577, dtype, !per_slot, 37, Some(37));
                check_experts(seed + 200, rows, 2, 5, 37, 99, dtype, per_slot, 37, Some(74));
            }
        }
    }

    #[test]
    fn experts_gemm() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            let seed = 80 + i as u64 * 10;
            check_experts(seed, 37, 3, 5, 37, 577, dtype, false, 37, None);
            check_experts(seed + 1, 37, 3, 5, 37, 99, dtype, true, 37, Some(37));
            check_experts(seed + 2, 37, 2, 5, 37, 99, dtype, false, 37, Some(74));
            // More than a tile per expert and several scan blocks; multi-tile rpe.
            check_experts(seed + 3, 150, 4, 3, 70, 33, dtype, true, 70, Some(140));
        }
    }

    #[test]
    fn experts_chunks_split_inside_an_expert() {
        // Not required by the contract (uploads align chunks to experts), but handled.
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            check_experts(90 + i as u64, 2, 3, 4, 37, 65, dtype, false, 1, Some(10));
            check_experts(93 + i as u64, 20, 3, 4, 37, 65, dtype, true, 1, Some(10));
        }
    }
}
