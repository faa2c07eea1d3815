//! Top-k selection on the GPU (`shaders/topk.wgsl`, `shaders/topk_wide.wgsl`).
//!
//! Tie rule: among equal scores the lower position wins (+0 and -0 are equal), so every
//! backend selects the same set.
//!
//! Both kernels map the scores' f32 bits to order-preserving u32 keys, find the k-th
//! largest key by radix select (histogram passes over the key digits), then take every
//! key above it and the lowest positions among the keys equal to it in one pass in
//! position order. Nothing is sorted.
//!
//! - Short rows (`n_keys < WIDE_MIN_KEYS`): `topk.wgsl`, one workgroup of 256 invocations
//!   per row, four 8-bit histogram passes and the collection pass (5 reads of the row).
//! - Long rows: `topk_wide.wgsl` spreads each row over many workgroups (segments of the
//!   row), 11 + 11 + 10-bit digits with global per-row histograms, a count pass and the
//!   collection pass (5 dispatches, 5 reads of the row). One workgroup per row reads a
//!   decode row of 128K keys five times on one compute unit; the wide kernel spreads the
//!   same reads over the whole GPU. It needs a [`TopkScratch`].
use super::{Causal, Recorder, View};
use crate::error::Result;
use crate::gpu::{kernel_params, Gpu, Shader, ShaderCode};

/// Rows of at least this many keys take the multi-workgroup kernel. Below it a row is a
/// few passes of ≤ 32 loads per invocation in one workgroup, which costs about what the
/// wide kernel's five dispatches cost; above it the single workgroup's serial passes grow
/// with the row while the wide kernel's stay spread over the GPU.
pub const WIDE_MIN_KEYS: u32 = 8192;
/// [`WIDE_MIN_KEYS`], or SPARSA_TOPK_WIDE_MIN (a measurement knob, at least 2048).
fn wide_min_keys() -> u32 {
    crate::knobs::knob!("SPARSA_TOPK_WIDE_MIN", |v| v >= 2048).unwrap_or(WIDE_MIN_KEYS)
}

/// Fewest positions per workgroup segment of the wide kernel.
const WIDE_MIN_SEG: u32 = 1024;
/// Workgroups the wide kernel aims at over all rows on a GPU (a few per compute unit of a
/// large one); segments grow past `WIDE_MIN_SEG` to stay near it.
const WIDE_TARGET_GROUPS: u32 = 512;
/// On a CPU adapter (lavapipe) workgroups run on the host's threads: more workgroups than
/// a few per thread only add per-workgroup work (histogram clears, scans).
const WIDE_GROUPS_PER_CPU_THREAD: u32 = 2;
/// u32 per row in the wide kernel's histograms (2048 + 2048 + 1024 bins) and state.
const HIST_ROW: u64 = 5120;
const STATE_ROW: u64 = 8;

/// Scratch of the wide top-k for up to `max_rows` rows: per-row histograms (zero between
/// calls: the kernel zeroes them again at its end), the radix-select state and per-segment
/// counts. Create once per session (about 20 KiB per row); reused by every call.
pub struct TopkScratch {
    hist: wgpu::Buffer,
    state: wgpu::Buffer,
    segcnt: wgpu::Buffer,
    max_rows: u32,
    max_segs: u32,
    /// Workgroups the wide kernel aims at (see `wide_plan`).
    groups: u32,
}

impl TopkScratch {
    pub fn new(gpu: &Gpu, max_rows: u32) -> Result<TopkScratch> {
        let groups = if gpu.adapter.is_cpu() {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            (threads as u32).saturating_mul(WIDE_GROUPS_PER_CPU_THREAD)
        } else {
            WIDE_TARGET_GROUPS
        };
        Self::with_groups(gpu, max_rows, groups)
    }

    /// GPU bytes of the scratch for `max_rows` rows (at most: the workgroup target is the
    /// larger of the GPU's and the CPU's).
    pub fn bytes_for(max_rows: u32) -> u64 {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let groups = (WIDE_TARGET_GROUPS as u64).max(threads * WIDE_GROUPS_PER_CPU_THREAD as u64);
        let rows = max_rows.max(1) as u64;
        rows * (HIST_ROW + STATE_ROW) * 4 + (groups + rows) * 8
    }

    /// Scratch whose wide kernel aims at `groups` workgroups.
    fn with_groups(gpu: &Gpu, max_rows: u32, groups: u32) -> Result<TopkScratch> {
        let rows = max_rows.max(1);
        let groups = groups.max(1);
        // `wide_plan` keeps rows × segments ≤ groups + rows.
        let max_segs = groups + rows;
        Ok(TopkScratch {
            hist: gpu.buffer(rows as u64 * HIST_ROW * 4, "topk hist")?,
            state: gpu.buffer(rows as u64 * STATE_ROW * 4, "topk state")?,
            segcnt: gpu.buffer(max_segs as u64 * 2 * 4, "topk segment counts")?,
            max_rows: rows,
            max_segs,
            groups,
        })
    }
}

/// Segment length and segments per row of the wide kernel for `rows × n_keys` scores:
/// at least `WIDE_MIN_SEG` positions per workgroup, about `groups` workgroups in all
/// (rows × segments ≤ groups + rows).
fn wide_plan(rows: u32, n_keys: u32, groups: u32) -> (u32, u32) {
    let per = (rows as u64 * n_keys as u64).div_ceil(groups.max(1) as u64);
    let seg_len = per.clamp(WIDE_MIN_SEG as u64, n_keys.max(1) as u64) as u32;
    (seg_len, n_keys.div_ceil(seg_len).max(1))
}

kernel_params! {
    /// The `Params` of topk.wgsl and topk_wide.wgsl (the one-workgroup kernels leave the
    /// segment fields 0).
    struct Params {
        s_off: u32,
        s_stride: u32,
        rows: u32,
        n_keys: u32,
        pos0: u32,
        topk: u32,
        /// Unused here (topk_wide.wgsl)
        seg_len: u32,
        segs: u32,
        /// Rows say where they sit (places.wgsl, [`Causal::places`]).
        ragged: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

const TOPK: Shader<Params> = Shader::new(
    "topk",
    concat!(
        include_str!("../../shaders/places.wgsl"),
        include_str!("../../shaders/select.wgsl"),
        include_str!("../../shaders/cpu.wgsl"),
        include_str!("../../shaders/topk.wgsl")
    ),
);
const TOPK_WIDE: Shader<Params> = Shader::new(
    "topk_wide",
    concat!(
        include_str!("../../shaders/places.wgsl"),
        include_str!("../../shaders/select.wgsl"),
        include_str!("../../shaders/topk_wide.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[TOPK.code(), TOPK_WIDE.code()];

impl Params {
    /// Scores `scores` of `chunk` into a selection of `k` per row, in `segs` segments of
    /// `seg_len` positions (0, 0 for the one-workgroup kernels).
    fn new(scores: View, chunk: Causal, k: u32, (seg_len, segs): (u32, u32)) -> Params {
        Params {
            s_off: scores.offset,
            s_stride: scores.stride,
            rows: chunk.rows,
            n_keys: chunk.n_keys,
            pos0: chunk.pos0,
            topk: k,
            seg_len,
            segs,
            ragged: chunk.ragged(),
            ..Default::default()
        }
    }
}

/// Where a top-k selection goes, and where attention reads it: row `t`'s positions at
/// `idx[t * k ..]` (u32, ascending position order), their number at `cnt[t]` (≤ `k`).
#[derive(Clone, Copy)]
pub struct Selection<'a> {
    pub idx: &'a wgpu::Buffer,
    pub cnt: &'a wgpu::Buffer,
    /// Positions per row at most (the row stride of `idx`).
    pub k: u32,
}

/// For each row `t < rows` of `chunk`: `valid = min(pos0 + t + 1, n_keys)`,
/// `k = min(sel.k, valid)`; writes the `k` positions `s < valid` with the largest
/// `scores[t, s]` to row `t` of `sel`. With [`Causal::places`], `valid` ends at the row's
/// own position and the positions are written as its cache rows (`lo + s`). Rows of `n_keys ≥ WIDE_MIN_KEYS` use the
/// multi-workgroup kernel when `scratch` holds `rows` rows (else the one-workgroup-per-row
/// kernel, same result).
pub fn topk(
    rec: &mut Recorder,
    scores: View,
    chunk: Causal,
    sel: &Selection,
    scratch: &TopkScratch,
) {
    if chunk.rows == 0 {
        return;
    }
    assert!(sel.k > 0, "topk: topk must be at least 1");
    if chunk.n_keys <= CPU_MAX_KEYS && super::cpu_kernels(rec.gpu()) {
        topk_cpu(rec, scores, chunk, sel);
        return;
    }
    if chunk.n_keys >= wide_min_keys() && chunk.rows <= scratch.max_rows {
        let plan = wide_plan(chunk.rows, chunk.n_keys, scratch.groups);
        topk_wide(rec, scores, chunk, sel, scratch, plan);
        return;
    }
    topk_one_wg(rec, scores, chunk, sel);
}

/// The one-workgroup-per-row kernel (`topk.wgsl`).
fn topk_one_wg(rec: &mut Recorder, scores: View, chunk: Causal, sel: &Selection) {
    let gpu = rec.gpu();
    let p = gpu.pipeline(&TOPK, "topk", &[]);
    let params = Params::new(scores, chunk, sel.k, (0, 0));
    // Five reads of the valid scores (at most n_keys per row), k indices written per row.
    let (rows, n_keys) = (chunk.rows as u64, chunk.n_keys as u64);
    let reads = 5 * rows * n_keys * 4;
    rec.cost(reads + rows * (sel.k as u64 + 1) * 4, 0, "");
    let (_, places) = chunk.places_binding(gpu);
    rec.dispatch(
        &p,
        &params,
        &[sel.idx, sel.cnt, places, scores.buf],
        gpu.grid(chunk.rows),
    );
}

/// Longest rows `topk_cpu` takes: its invocation reads the row at most 9 times (8 digits and
/// the collection), within [`super::CPU_LOOPS`].
const CPU_MAX_KEYS: u32 = super::CPU_LOOPS / 9;

/// The CPU adapters' kernel (`topk_cpu` in topk.wgsl): one invocation per row.
fn topk_cpu(rec: &mut Recorder, scores: View, chunk: Causal, sel: &Selection) {
    let gpu = rec.gpu();
    let p = gpu.pipeline(&TOPK, "topk_cpu", &[]);
    let params = Params::new(scores, chunk, sel.k, (0, 0));
    // Three reads of the valid scores for random ones (two digits and the collection).
    let (rows, n_keys) = (chunk.rows as u64, chunk.n_keys as u64);
    rec.cost(3 * rows * n_keys * 4 + rows * (sel.k as u64 + 1) * 4, 0, "");
    let (_, places) = chunk.places_binding(gpu);
    rec.dispatch(
        &p,
        &params,
        &[sel.idx, sel.cnt, places, scores.buf],
        gpu.grid(chunk.rows.div_ceil(super::CPU_WG)),
    );
}

/// The multi-workgroup kernel (`topk_wide.wgsl`) with `segs` segments of `seg_len`
/// positions per row (`segs × seg_len ≥ n_keys`).
fn topk_wide(
    rec: &mut Recorder,
    scores: View,
    chunk: Causal,
    sel: &Selection,
    sc: &TopkScratch,
    (seg_len, segs): (u32, u32),
) {
    let (rows, n_keys) = (chunk.rows, chunk.n_keys);
    assert!(
        rows <= sc.max_rows && rows as u64 * segs as u64 <= sc.max_segs as u64,
        "topk_wide: {rows} rows × {segs} segments exceed the scratch"
    );
    assert!(
        seg_len as u64 * segs as u64 >= n_keys as u64,
        "topk_wide: segments do not cover the row"
    );
    let gpu = rec.gpu();
    let params = Params::new(scores, chunk, sel.k, (seg_len, segs));
    let grid = gpu.grid(rows * segs);
    let (r, n, g) = (rows as u64, n_keys as u64, rows as u64 * segs as u64);
    let row_bytes = r * n * 4;
    let pipe = |entry| gpu.pipeline(&TOPK_WIDE, entry, &[]);
    // hist0: the scores, and at most 2048 atomics per workgroup.
    rec.cost(row_bytes + g * 2048 * 4, 0, "");
    let (_, places) = chunk.places_binding(gpu);
    rec.dispatch(
        &pipe("hist0"),
        &params,
        &[places, scores.buf, &sc.hist],
        grid,
    );
    // hist1, hist2: also a histogram scan per workgroup.
    for entry in ["hist1", "hist2"] {
        rec.cost(row_bytes + g * 2 * 2048 * 4, 0, "");
        rec.dispatch(
            &pipe(entry),
            &params,
            &[places, scores.buf, &sc.hist, &sc.state],
            grid,
        );
    }
    rec.cost(row_bytes + g * (1024 + 2) * 4, 0, "");
    rec.dispatch(
        &pipe("count"),
        &params,
        &[places, scores.buf, &sc.hist, &sc.state, &sc.segcnt],
        grid,
    );
    // collect: the scores, the earlier segments' counts, k indices out, histograms zeroed.
    rec.cost(
        row_bytes + g * segs as u64 * 4 + r * (sel.k as u64 + HIST_ROW + 1) * 4,
        0,
        "",
    );
    rec.dispatch(
        &pipe("collect"),
        &params,
        &[
            places, scores.buf, &sc.hist, &sc.state, &sc.segcnt, sel.idx, sel.cnt,
        ],
        grid,
    );
}

/// The dense case (every row has at most `sel.k` valid keys: `chunk.n_keys ≤ sel.k`, each
/// row's position below `n_keys`): selects all of them, `idx[t * k + j] = j` for
/// `j ≤ pos0 + t`, `cnt[t] = pos0 + t + 1`; with [`Causal::places`], `j ≤ pos` written as
/// `lo + j`. No scores needed.
pub fn select_all(rec: &mut Recorder, chunk: Causal, sel: &Selection) {
    let rows = chunk.rows;
    if rows == 0 {
        return;
    }
    let k = sel.k;
    assert!(
        chunk.n_keys <= k,
        "select_all: {} positions exceed topk {k} (use topk())",
        chunk.n_keys
    );
    let gpu = rec.gpu();
    let p = gpu.pipeline(&TOPK, "select_all", &[]);
    // No scores: the view fields stay 0.
    let params = Params {
        s_off: 0,
        s_stride: 0,
        rows,
        n_keys: chunk.n_keys,
        pos0: chunk.pos0,
        topk: k,
        ragged: chunk.ragged(),
        ..Default::default()
    };
    let n = rows as u64 * k as u64;
    rec.cost((n + rows as u64) * 4, 0, "");
    let (_, places) = chunk.places_binding(gpu);
    rec.dispatch(
        &p,
        &params,
        &[sel.idx, sel.cnt, places],
        gpu.grid(n.div_ceil(256) as u32),
    );
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
    use crate::kernels::with_cpu_kernels;

    const POISON: u32 = 0xDEAD_BEEF;

    /// Which kernel a check runs.
    #[derive(Clone, Copy)]
    enum Mode {
        /// `topk` as the model calls it (picks the kernel).
        Auto,
        /// The wide kernel with this segment length.
        Wide(u32),
        /// The CPU adapters' kernel, whatever the adapter.
        Cpu,
    }

    /// Runs `topk` on `rows × n_keys` scores laid out with `stride` at `offset` and checks
    /// every row against the CPU reference (set, order, count, untouched tail).
    fn check(scores: &[f32], offset: u32, stride: u32, rows: u32, n_keys: u32, pos0: u32, k: u32) {
        let sc = TopkScratch::new(gpu(), rows).unwrap();
        let chunk = causal(rows, n_keys, pos0);
        let at = (offset, stride);
        with_cpu_kernels(false, || check_mode(Mode::Auto, &sc, scores, at, chunk, k));
        if n_keys <= CPU_MAX_KEYS {
            check_mode(Mode::Cpu, &sc, scores, at, chunk, k);
        }
    }

    /// The chunk of `rows` rows at `pos0` over `n_keys` positions.
    fn causal(rows: u32, n_keys: u32, pos0: u32) -> Causal<'static> {
        Causal::chunk(rows, n_keys, pos0)
    }

    /// Each row's (lo, pos): from the places buffer (`host`: what was written there), else
    /// the chunk's.
    fn places_of(chunk: &Causal, host: &[(u32, u32)]) -> Vec<(u32, u32)> {
        match chunk.places {
            Some(_) => host.to_vec(),
            None => (0..chunk.rows).map(|t| (0, chunk.pos0 + t)).collect(),
        }
    }

    /// A places buffer for `rows` ((lo, pos) each).
    fn places_buffer(rows: &[(u32, u32)]) -> wgpu::Buffer {
        let words: Vec<u32> = rows.iter().flat_map(|&(lo, p)| [lo, p]).collect();
        gpu().buffer_from(&words, "places").unwrap()
    }

    fn run(
        rec: &mut Recorder,
        mode: Mode,
        sc: &TopkScratch,
        scores: View,
        chunk: Causal,
        sel: &Selection,
    ) {
        match mode {
            Mode::Auto => topk(rec, scores, chunk, sel, sc),
            Mode::Cpu => topk_cpu(rec, scores, chunk, sel),
            Mode::Wide(seg) => {
                let segs = chunk.n_keys.div_ceil(seg);
                topk_wide(rec, scores, chunk, sel, sc, (seg, segs))
            }
        }
    }

    /// [`check`] on the kernel `mode` picks, with the scratch `sc`; `at` is the scores'
    /// (offset, stride).
    fn check_mode(
        mode: Mode,
        sc: &TopkScratch,
        scores: &[f32],
        at: (u32, u32),
        chunk: Causal,
        k: u32,
    ) {
        check_placed(mode, sc, scores, at, chunk, &[], k)
    }

    /// [`check_mode`] where `chunk` may have places, `host` being what they hold.
    fn check_placed(
        mode: Mode,
        sc: &TopkScratch,
        scores: &[f32],
        at: (u32, u32),
        chunk: Causal,
        host: &[(u32, u32)],
        k: u32,
    ) {
        let ((offset, stride), rows) = (at, chunk.rows);
        let g = gpu();
        let sbuf = g.buffer_from(scores, "scores").unwrap();
        let idx = g
            .buffer_from(&vec![POISON; (rows * k) as usize], "idx")
            .unwrap();
        let cnt = g.buffer_from(&vec![POISON; rows as usize], "cnt").unwrap();
        let mut rec = g.recorder();
        let view = View::new(&sbuf, offset, stride);
        let sel = Selection {
            idx: &idx,
            cnt: &cnt,
            k,
        };
        run(&mut rec, mode, sc, view, chunk, &sel);
        rec.finish().unwrap();
        let got_idx = g.read_u32(&idx, 0, (rows * k) as usize).unwrap();
        let got_cnt = g.read_u32(&cnt, 0, rows as usize).unwrap();
        let places = places_of(&chunk, host);
        verify(scores, at, (&places, chunk.n_keys), k, &got_idx, &got_cnt);
    }

    /// Compares the kernel's `idx` / `cnt` with the CPU reference, row by row (`places`: each
    /// row's (lo, pos), over `n_keys` scores).
    fn verify(
        scores: &[f32],
        (offset, stride): (u32, u32),
        (places, n_keys): (&[(u32, u32)], u32),
        k: u32,
        got_idx: &[u32],
        got_cnt: &[u32],
    ) {
        for (t, &(lo, pos)) in places.iter().enumerate() {
            let valid = (pos as usize + 1).min(n_keys as usize);
            let base = offset as usize + t * stride as usize;
            let want: Vec<u32> = topk_ref(&scores[base..base + n_keys as usize], valid, k as usize)
                .into_iter()
                .map(|s| lo + s)
                .collect();
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
    fn topk_cpu_longest_rows() {
        // The CPU adapters' kernel at its longest rows, with ties everywhere, so no digit
        // ends the select early: 8 digit passes and the collection, each a read of the row,
        // must all fit lavapipe's loop budget (past it the loops would end silently and the
        // selection come out short).
        let mut rng = Rng::new(13);
        let n = CPU_MAX_KEYS;
        let vals = [0.25f32, -1.5, 3.0];
        let s: Vec<f32> = (0..2 * n)
            .map(|_| vals[rng.below(vals.len() as u64) as usize])
            .collect();
        check(&s, 0, n, 2, n, n - 2, 1000);
        let r = random_scores(&mut rng, n as usize);
        check(&r, 0, n, 1, n, n - 1, 2048);
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
        // More workgroups than one grid dimension holds: every row must be processed, by
        // both kernels (the CPU adapters' takes CPU_WG rows a workgroup).
        for cpu in [false, true] {
            let per_group = if cpu { crate::kernels::CPU_WG } else { 1 };
            with_cpu_kernels(cpu, || check_2d_grid(gpu().max_groups() * per_group + 100));
        }
    }

    fn check_2d_grid(rows: u32) {
        let g = gpu();
        let (n_keys, k) = (2u32, 2u32);
        let s = vec![1.0f32; (rows * n_keys) as usize];
        let sbuf = g.buffer_from(&s, "scores").unwrap();
        let idx = g
            .buffer_from(&vec![POISON; (rows * k) as usize], "idx")
            .unwrap();
        let cnt = g.buffer_from(&vec![POISON; rows as usize], "cnt").unwrap();
        // Short rows never use the scratch: one row's worth is enough.
        let sc = TopkScratch::new(g, 1).unwrap();
        let mut rec = g.recorder();
        let sel = Selection {
            idx: &idx,
            cnt: &cnt,
            k,
        };
        topk(
            &mut rec,
            View::rows(&sbuf, n_keys),
            causal(rows, n_keys, 0),
            &sel,
            &sc,
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
        let sel = Selection {
            idx: &idx,
            cnt: &cnt,
            k,
        };
        select_all(&mut rec, causal(rows, pos0 + rows, pos0), &sel);
        // Placed rows: sequences at cache rows 100 and 7, positions out of order.
        let host = [(100u32, 4u32), (7, 0), (100, 8), (7, 2)];
        let places = places_buffer(&host);
        let (idx2, cnt2) = (
            g.buffer_from(&vec![POISON; 4 * k as usize], "idx").unwrap(),
            g.buffer_from(&[POISON; 4], "cnt").unwrap(),
        );
        let sel2 = Selection {
            idx: &idx2,
            cnt: &cnt2,
            k,
        };
        let placed = Causal {
            places: Some(&places),
            ..causal(4, 9, 0)
        };
        select_all(&mut rec, placed, &sel2);
        rec.finish().unwrap();
        let c = g.read_u32(&cnt, 0, rows as usize).unwrap();
        let ix = g.read_u32(&idx, 0, (rows * k) as usize).unwrap();
        let c2 = g.read_u32(&cnt2, 0, 4).unwrap();
        let ix2 = g.read_u32(&idx2, 0, 4 * k as usize).unwrap();
        let all = (0..rows).map(|t| (0, pos0 + t));
        for (t, (lo, pos)) in all.chain(host).enumerate() {
            let (c, ix, t) = match t.checked_sub(rows as usize) {
                None => (&c, &ix, t as u32),
                Some(t) => (&c2, &ix2, t as u32),
            };
            let n = pos + 1;
            assert_eq!(c[t as usize], n);
            for j in 0..k {
                let want = if j < n { lo + j } else { POISON };
                assert_eq!(ix[(t * k + j) as usize], want, "row {t} slot {j}");
            }
        }
    }

    #[test]
    fn topk_placed_rows_of_several_sequences() {
        // A batched step's rows: each its own sequence (cache rows from lo) and position,
        // some below k, in both kernels; the selection comes out as cache rows.
        let mut rng = Rng::new(12);
        let host = [(0u32, 299u32), (4096, 17), (8192, 150), (512, 64), (0, 5)];
        let rows = host.len() as u32;
        let (n_keys, stride, offset, k) = (300u32, 307u32, 3u32, 64u32);
        let s = random_scores(&mut rng, (offset + rows * stride) as usize);
        let places = places_buffer(&host);
        let chunk = Causal {
            places: Some(&places),
            ..causal(rows, n_keys, 0)
        };
        let sc = scratch(rows);
        for mode in [Mode::Auto, Mode::Cpu, Mode::Wide(64), Mode::Wide(1024)] {
            check_placed(mode, &sc, &s, (offset, stride), chunk, &host, k);
        }
    }

    // ---- The wide (multi-workgroup) kernel ----

    /// Scratch planned as on a GPU (many segments) whatever the test adapter is, with room
    /// for the explicit segment lengths of the tests (up to 1024 segments per row).
    fn scratch(rows: u32) -> TopkScratch {
        TopkScratch::with_groups(gpu(), rows, WIDE_TARGET_GROUPS.max(1024 * rows)).unwrap()
    }

    #[test]
    fn wide_plan_bounds() {
        // Segments cover the row, at least WIDE_MIN_SEG long, and rows × segments fit the
        // scratch sized for `rows`.
        for groups in [1u32, 4, 16, WIDE_TARGET_GROUPS] {
            for rows in [1u32, 2, 7, 64, 128] {
                for n in [WIDE_MIN_KEYS, 8193, 20_000, 131_072, 1 << 20, 3_000_001] {
                    let (seg, segs) = wide_plan(rows, n, groups);
                    let case = format!("{groups} groups, {rows} × {n}: {seg} × {segs}");
                    assert!(seg as u64 * segs as u64 >= n as u64, "{case}");
                    assert!(seg >= WIDE_MIN_SEG.min(n), "{case}");
                    assert!(rows * segs <= groups + rows, "{case}");
                }
            }
        }
        assert_eq!(wide_plan(1, 131_072, WIDE_TARGET_GROUPS), (1024, 128));
    }

    #[test]
    fn topk_wide_decode_random() {
        // One decode row past WIDE_MIN_KEYS (the model's path), k = 2048, a ragged length.
        let mut rng = Rng::new(11);
        let n = 40_009;
        let s = random_scores(&mut rng, n);
        check(&s, 0, n as u32, 1, n as u32, n as u32 - 1, 2048);
        // Same scores with many segments (> 256: the offset sum loops) and small k.
        let sc = scratch(1);
        check_mode(
            Mode::Wide(97),
            &sc,
            &s,
            (0, n as u32),
            causal(1, n as u32, n as u32 - 1),
            5,
        );
        check_mode(
            Mode::Wide(300),
            &sc,
            &s,
            (0, n as u32),
            causal(1, n as u32, n as u32 - 1),
            2048,
        );
    }

    #[test]
    fn topk_wide_ties_relu_zeros() {
        // ReLU-like scores: mostly exact zeros (+0 and -0 mixed), the k-th largest is 0, so
        // `need` zeros are taken from the lowest positions across many segments.
        let mut rng = Rng::new(12);
        let n = 30_011usize;
        let s: Vec<f32> = (0..n)
            .map(|i| match rng.below(20) {
                0 => rng.uniform().abs() * 5.0 + 1e-3,
                1..=6 => -0.0,
                _ if i % 7 == 0 => -(rng.uniform().abs() + 1.0), // below zero
                _ => 0.0,
            })
            .collect();
        let positive = s.iter().filter(|&&x| x > 0.0).count();
        assert!(
            positive < 2048 && n - positive > 4000,
            "the cut falls inside the zeros"
        );
        let sc = scratch(1);
        for (mode, k) in [
            (Mode::Auto, 2048u32),
            (Mode::Wide(1000), 4000),
            (Mode::Wide(333), 2048),
            (Mode::Wide(4096), 29_000),
        ] {
            check_mode(
                mode,
                &sc,
                &s,
                (0, n as u32),
                causal(1, n as u32, n as u32 - 1),
                k,
            );
        }
        // All equal: positions 0..k.
        let same = vec![-2.5f32; 20_000];
        check_mode(
            Mode::Auto,
            &sc,
            &same,
            (0, 20_000),
            causal(1, 20_000, 19_999),
            2048,
        );
        // Few distinct values.
        let vals = [0.0f32, -0.0, 1.0, -1.0, 0.5];
        let few: Vec<f32> = (0..n)
            .map(|_| vals[rng.below(vals.len() as u64) as usize])
            .collect();
        for k in [1u32, 2048, 6001, 12_000] {
            check_mode(
                Mode::Wide(1024),
                &sc,
                &few,
                (0, n as u32),
                causal(1, n as u32, n as u32 - 1),
                k,
            );
        }
    }

    #[test]
    fn topk_wide_low_digits() {
        // Keys that differ only in their low bits, so the threshold is decided by digit 1
        // or digit 2: consecutive floats above 1.0 (differing in bits 0..14) and a band
        // sharing bits 31..10.
        let mut rng = Rng::new(13);
        let n = 25_000usize;
        let base = 1.0f32.to_bits();
        let s: Vec<f32> = (0..n)
            .map(|_| f32::from_bits(base + rng.below(20_000) as u32))
            .collect();
        let sc = scratch(1);
        check_mode(
            Mode::Wide(1024),
            &sc,
            &s,
            (0, n as u32),
            causal(1, n as u32, n as u32 - 1),
            2048,
        );
        let s2: Vec<f32> = (0..n)
            .map(|_| f32::from_bits((base | 0x3ff) - rng.below(1024) as u32))
            .collect();
        check_mode(
            Mode::Wide(1500),
            &sc,
            &s2,
            (0, n as u32),
            causal(1, n as u32, n as u32 - 1),
            2048,
        );
    }

    #[test]
    fn topk_wide_rows_masked_tails_and_offsets() {
        // Several rows inside a larger matrix (offset, stride > n_keys) whose valid counts
        // (pos0 + t + 1) fall below k, on k, above k, and past n_keys; -inf scores (causal
        // mask) beyond each row's valid keys and scattered inside them, plus infinities.
        let mut rng = Rng::new(14);
        let (rows, n_keys, stride, offset) = (4u32, 20_000u32, 20_005u32, 3u32);
        let mut s = random_scores(&mut rng, (offset + rows * stride) as usize);
        for x in s.iter_mut() {
            match rng.below(50) {
                0 => *x = f32::NEG_INFINITY,
                1 => *x = f32::INFINITY,
                2 => *x = 0.0,
                3 => *x = -0.0,
                _ => {}
            }
        }
        let sc = scratch(rows);
        for pos0 in [2046u32, 9_000, 19_998] {
            let mut m = s.clone();
            for t in 0..rows {
                let valid = (pos0 + t + 1).min(n_keys);
                let b = (offset + t * stride) as usize;
                for x in &mut m[b + valid as usize..b + n_keys as usize] {
                    *x = f32::NEG_INFINITY;
                }
            }
            check_mode(
                Mode::Auto,
                &sc,
                &m,
                (offset, stride),
                causal(rows, n_keys, pos0),
                2048,
            );
            check_mode(
                Mode::Wide(777),
                &sc,
                &m,
                (offset, stride),
                causal(rows, n_keys, pos0),
                2048,
            );
        }
    }

    #[test]
    fn topk_wide_k_exceeds_live_keys() {
        // Fewer finite scores than k: all of them, then the lowest-position -inf keys.
        let mut rng = Rng::new(15);
        let n = 20_000usize;
        let mut s = vec![f32::NEG_INFINITY; n];
        for _ in 0..1000 {
            s[rng.below(n as u64) as usize] = rng.uniform();
        }
        let sc = scratch(1);
        check_mode(
            Mode::Auto,
            &sc,
            &s,
            (0, n as u32),
            causal(1, n as u32, n as u32 - 1),
            2048,
        );
        // Only -inf.
        let ninf = vec![f32::NEG_INFINITY; n];
        check_mode(
            Mode::Wide(1024),
            &sc,
            &ninf,
            (0, n as u32),
            causal(1, n as u32, n as u32 - 1),
            17,
        );
    }

    #[test]
    fn topk_wide_scratch_reuse() {
        // Several calls on one scratch in one submission and across submissions, with
        // different rows and lengths: each call must find the histograms zeroed.
        let g = gpu();
        let mut rng = Rng::new(16);
        let sc = scratch(3);
        let cases = [
            (1u32, 16_384u32, 2048u32),
            (3, 9_000, 1000),
            (2, 12_001, 64),
        ];
        for round in 0..2 {
            let mut rec = g.recorder();
            let mut outs = Vec::new();
            for &(rows, n, k) in &cases {
                let s = random_scores(&mut rng, (rows * n) as usize);
                let sbuf = g.buffer_from(&s, "scores").unwrap();
                let idx = g
                    .buffer_from(&vec![POISON; (rows * k) as usize], "idx")
                    .unwrap();
                let cnt = g.buffer_from(&vec![POISON; rows as usize], "cnt").unwrap();
                let mode = if round == 0 {
                    Mode::Auto
                } else {
                    Mode::Wide(500)
                };
                let view = View::rows(&sbuf, n);
                run(
                    &mut rec,
                    mode,
                    &sc,
                    view,
                    causal(rows, n, n - rows),
                    &Selection {
                        idx: &idx,
                        cnt: &cnt,
                        k,
                    },
                );
                outs.push((s, idx, cnt));
            }
            rec.finish().unwrap();
            for ((s, idx, cnt), &(rows, n, k)) in outs.iter().zip(&cases) {
                let gi = g.read_u32(idx, 0, (rows * k) as usize).unwrap();
                let gc = g.read_u32(cnt, 0, rows as usize).unwrap();
                let places = places_of(&causal(rows, n, n - rows), &[]);
                verify(s, (0, n), (&places, n), k, &gi, &gc);
            }
        }
        // The histograms are all zero again.
        let h = g.read_u32(&sc.hist, 0, 3 * HIST_ROW as usize).unwrap();
        assert!(h.iter().all(|&x| x == 0));
    }
}
