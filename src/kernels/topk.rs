//! Top-k selection on the GPU (`shaders/topk.wgsl`).
//!
//! Tie rule: among equal scores the lower position wins (+0 and -0 are equal), so every
//! backend selects the same set.
//!
//! `topk` runs one workgroup of 256 invocations per row: the scores' f32 bits are mapped
//! to order-preserving u32 keys, four 8-bit histogram passes (radix select) find the k-th
//! largest key, and a final pass in position order takes every key above it and the
//! lowest positions among the keys equal to it. Each pass reads the row's valid scores
//! once (5 reads in all); nothing is sorted.
use super::{src, Recorder, View};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    s_off: u32,
    s_stride: u32,
    rows: u32,
    n_keys: u32,
    pos0: u32,
    topk: u32,
    _pad: [u32; 2],
}

/// For each row `t < rows`: `valid = min(pos0 + t + 1, n_keys)`, `k = min(topk, valid)`;
/// writes the `k` positions `s < valid` with the largest `scores[t, s]` to
/// `idx[t * topk .. t * topk + k]` (u32, ascending position order) and `k` to `cnt[t]`.
#[allow(clippy::too_many_arguments)]
pub fn topk(
    rec: &mut Recorder,
    scores: View,
    rows: u32,
    n_keys: u32,
    pos0: u32,
    topk: u32,
    idx: &wgpu::Buffer,
    cnt: &wgpu::Buffer,
) {
    if rows == 0 {
        return;
    }
    assert!(topk > 0, "topk: topk must be at least 1");
    let gpu = rec.gpu();
    let p = gpu.pipeline("topk", src::TOPK, "topk", &[]);
    let params = Params {
        s_off: scores.offset,
        s_stride: scores.stride,
        rows,
        n_keys,
        pos0,
        topk,
        _pad: [0; 2],
    };
    rec.dispatch(&p, &params, &[idx, cnt, scores.buf], gpu.grid(rows));
}

/// The dense case (every row has `pos0 + t + 1 ≤ topk` valid keys): selects all of them,
/// `idx[t * topk + j] = j` for `j ≤ pos0 + t`, `cnt[t] = pos0 + t + 1`. No scores needed.
pub fn select_all(
    rec: &mut Recorder,
    rows: u32,
    pos0: u32,
    topk: u32,
    idx: &wgpu::Buffer,
    cnt: &wgpu::Buffer,
) {
    if rows == 0 {
        return;
    }
    assert!(
        pos0 + rows <= topk,
        "select_all: pos0 {pos0} + rows {rows} exceeds topk {topk} (use topk())"
    );
    let gpu = rec.gpu();
    let p = gpu.pipeline("topk", src::TOPK, "select_all", &[]);
    let params = Params {
        s_off: 0,
        s_stride: 0,
        rows,
        n_keys: 0,
        pos0,
        topk,
        _pad: [0; 2],
    };
    let n = rows as u64 * topk as u64;
    rec.dispatch(&p, &params, &[idx, cnt], gpu.grid(n.div_ceil(256) as u32));
}

/// CPU reference of [`topk`] for one row (also used by other modules' tests).
#[cfg(test)]
pub(crate) fn topk_ref(row: &[f32], valid: usize, topk: usize) -> Vec<u32> {
    let k = topk.min(valid);
    let mut order: Vec<usize> = (0..valid).collect();
    // +0.0 canonicalizes -0 (f32 comparison already treats them equal).
    order.sort_by(|&a, &b| {
        (row[b] + 0.0)
            .partial_cmp(&(row[a] + 0.0))
            .unwrap()
            .then(a.cmp(&b))
    });
    let mut sel: Vec<u32> = order[..k].iter().map(|&i| i as u32).collect();
    sel.sort_unstable();
    sel
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{gpu, Rng};

    const POISON: u32 = 0xDEAD_BEEF;

    /// Runs `topk` on `rows × n_keys` scores laid out with `stride` at `offset` and checks
    /// every row against the CPU reference (set, order, count, untouched tail).
    fn check(scores: &[f32], offset: u32, stride: u32, rows: u32, n_keys: u32, pos0: u32, k: u32) {
        let g = gpu();
        let sbuf = g.buffer_from(scores, "scores").unwrap();
        let idx = g
            .buffer_from(&vec![POISON; (rows * k) as usize], "idx")
            .unwrap();
        let cnt = g.buffer_from(&vec![POISON; rows as usize], "cnt").unwrap();
        let mut rec = g.recorder();
        topk(
            &mut rec,
            View::new(&sbuf, offset, stride),
            rows,
            n_keys,
            pos0,
            k,
            &idx,
            &cnt,
        );
        rec.finish().unwrap();
        let got_idx = g.read_u32(&idx, 0, (rows * k) as usize).unwrap();
        let got_cnt = g.read_u32(&cnt, 0, rows as usize).unwrap();
        for t in 0..rows as usize {
            let valid = ((pos0 as usize) + t + 1).min(n_keys as usize);
            let base = offset as usize + t * stride as usize;
            let want = topk_ref(&scores[base..base + n_keys as usize], valid, k as usize);
            let kk = want.len();
            assert_eq!(got_cnt[t] as usize, kk, "row {t}: count");
            let got = &got_idx[t * k as usize..t * k as usize + kk];
            if got != want.as_slice() {
                let diff: Vec<_> = got
                    .iter()
                    .zip(&want)
                    .enumerate()
                    .filter(|(_, (a, b))| a != b)
                    .take(5)
                    .collect();
                panic!("row {t} (valid {valid}, k {k}): selection differs, first (j, (got, want)): {diff:?}");
            }
            assert!(
                got_idx[t * k as usize + kk..(t + 1) * k as usize]
                    .iter()
                    .all(|&x| x == POISON),
                "row {t}: wrote past k"
            );
        }
    }

    fn random_scores(rng: &mut Rng, n: usize) -> Vec<f32> {
        rng.vec(n, 10.0)
    }

    #[test]
    fn topk_many_keys_decode() {
        // L ≫ topk, one decode row with pos0 = L - 1.
        let mut rng = Rng::new(1);
        let n = 5000;
        let s = random_scores(&mut rng, n);
        check(&s, 0, n as u32, 1, n as u32, n as u32 - 1, 64);
    }

    #[test]
    fn topk_prefill_chunk_with_offset_and_stride() {
        // Rows of a chunk starting at pos0 > 0: each row sees a different number of keys
        // (some below topk, some equal, most above), scores inside a larger matrix.
        let mut rng = Rng::new(2);
        let (rows, n_keys, stride, offset) = (37u32, 333u32, 340u32, 7u32);
        let s = random_scores(&mut rng, (offset + rows * stride) as usize);
        for pos0 in [0u32, 90, 296] {
            check(&s, offset, stride, rows, n_keys, pos0, 100);
        }
    }

    #[test]
    fn topk_short_rows_and_exact_fit() {
        let mut rng = Rng::new(3);
        // L < topk (all selected), L = topk.
        let s = random_scores(&mut rng, 3 * 50);
        check(&s, 0, 50, 3, 50, 49, 64);
        check(&s, 0, 50, 3, 50, 49, 50);
        check(&s, 0, 50, 3, 50, 47, 50); // rows see 48, 49, 50 keys
        check(&s, 0, 50, 3, 50, 49, 1); // k = 1
    }

    #[test]
    fn topk_large_k() {
        let mut rng = Rng::new(4);
        let n = 3001;
        let s = random_scores(&mut rng, 2 * n);
        check(&s, 0, n as u32, 2, n as u32, n as u32 - 2, 2048);
    }

    #[test]
    fn topk_ties_lower_position_wins() {
        // Few distinct values: the k-th value is tied many times; +0 and -0 mixed.
        let mut rng = Rng::new(5);
        let n = 1500;
        let vals = [0.0f32, -0.0, 1.0, -1.0, 0.5];
        let s: Vec<f32> = (0..4 * n)
            .map(|_| vals[rng.below(vals.len() as u64) as usize])
            .collect();
        for k in [1u32, 7, 64, 300, 700, 1499] {
            check(&s, 0, n as u32, 4, n as u32, n as u32 - 4, k);
        }
        // Mostly zeros (what ReLU gives), -0 at low positions: a rule that ranks -0 below
        // +0 would pick later +0 positions instead.
        let mut z = vec![0.0f32; n];
        for (i, v) in z.iter_mut().enumerate() {
            if i % 3 == 0 {
                *v = -0.0;
            }
            if i % 97 == 5 {
                *v = 2.0 + (i as f32);
            }
        }
        check(&z, 0, n as u32, 1, n as u32, n as u32 - 1, 64);
        // All equal: positions 0..k.
        let same = vec![3.25f32; 700];
        check(&same, 0, 700, 1, 700, 699, 256);
    }

    #[test]
    fn topk_infinities_and_extremes() {
        let mut rng = Rng::new(6);
        let n = 800;
        let mut s = random_scores(&mut rng, n);
        for x in s.iter_mut() {
            match rng.below(6) {
                0 => *x = f32::NEG_INFINITY,
                1 => *x = f32::INFINITY,
                2 => *x = f32::MIN,
                3 => *x = 1e-40, // denormal
                _ => {}
            }
        }
        for k in [10u32, 200, 500] {
            check(&s, 0, n as u32, 1, n as u32, n as u32 - 1, k);
        }
        // Only -inf: lowest positions.
        let ninf = vec![f32::NEG_INFINITY; 300];
        check(&ninf, 0, 300, 1, 300, 299, 17);
    }

    #[test]
    fn topk_n_keys_clamps_valid() {
        // pos0 + t + 1 > n_keys: valid = n_keys.
        let mut rng = Rng::new(7);
        let s = random_scores(&mut rng, 4 * 300);
        check(&s, 0, 300, 4, 300, 1000, 40);
    }

    #[test]
    fn topk_2d_grid() {
        // More rows than one grid dimension holds: every row must be processed.
        let g = gpu();
        let rows = g.max_groups() + 100;
        let (n_keys, k) = (2u32, 2u32);
        let s = vec![1.0f32; (rows * n_keys) as usize];
        let sbuf = g.buffer_from(&s, "scores").unwrap();
        let idx = g
            .buffer_from(&vec![POISON; (rows * k) as usize], "idx")
            .unwrap();
        let cnt = g.buffer_from(&vec![POISON; rows as usize], "cnt").unwrap();
        let mut rec = g.recorder();
        topk(
            &mut rec,
            View::rows(&sbuf, n_keys),
            rows,
            n_keys,
            0,
            k,
            &idx,
            &cnt,
        );
        rec.finish().unwrap();
        let c = g.read_u32(&cnt, 0, rows as usize).unwrap();
        let ix = g.read_u32(&idx, 0, (rows * k) as usize).unwrap();
        for t in 0..rows as usize {
            let want = if t == 0 { 1 } else { 2 };
            assert_eq!(c[t], want, "row {t}");
            assert_eq!(ix[t * 2], 0, "row {t}");
            if t > 0 {
                assert_eq!(ix[t * 2 + 1], 1, "row {t}");
            }
        }
    }

    #[test]
    fn select_all_dense() {
        let g = gpu();
        let (rows, pos0, k) = (5u32, 3u32, 9u32);
        let idx = g
            .buffer_from(&vec![POISON; (rows * k) as usize], "idx")
            .unwrap();
        let cnt = g.buffer_from(&vec![POISON; rows as usize], "cnt").unwrap();
        let mut rec = g.recorder();
        select_all(&mut rec, rows, pos0, k, &idx, &cnt);
        rec.finish().unwrap();
        let c = g.read_u32(&cnt, 0, rows as usize).unwrap();
        let ix = g.read_u32(&idx, 0, (rows * k) as usize).unwrap();
        for t in 0..rows {
            let n = pos0 + t + 1;
            assert_eq!(c[t as usize], n);
            for j in 0..k {
                let want = if j < n { j } else { POISON };
                assert_eq!(ix[(t * k + j) as usize], want, "row {t} slot {j}");
            }
        }
    }
}
