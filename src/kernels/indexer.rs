//! Lightning-indexer scores in f32 (`shaders/indexer.wgsl`).
use super::cache::{CacheRows, KeyFormat};
use super::rope::QueryRope;
use super::{Causal, Recorder, View, CPU_LOOPS, CPU_WG};
use crate::config::Config;
use crate::gpu::{kernel_params, u, Shader, ShaderCode};

/// Keys per workgroup (cache segments are whole blocks of it).
pub const KT: u32 = 128;
/// Head groups of the kernel (each invocation takes 4·ceil(heads / 4·NG) heads).
const NG: u32 = 8;

kernel_params! {
    struct Params {
        q_off: u32,
        q_stride: u32,
        w_off: u32,
        w_stride: u32,
        k_off: u32,
        k_stride: u32,
        o_off: u32,
        o_stride: u32,
        rows: u32,
        dim: u32,
        n_keys: u32,
        pos0: u32,
        key_blocks: u32,
        /// First key block of this dispatch (a segment's).
        blk0: u32,
        w_scale: f32,
        scale: f32,
        /// First position of the segment bound.
        seg_lo: u32,
        /// RoPE on the queries as they are staged: 0 = none, 1 = half-split, 2 = interleaved.
        rope: u32,
        rot_half: u32,
        /// Rows say where they sit (places.wgsl, [`Causal::places`]).
        ragged: u32,
    }
}

const INDEXER: Shader<Params> = Shader::new(
    "indexer",
    concat!(
        include_str!("../../shaders/rotary.wgsl"),
        include_str!("../../shaders/places.wgsl"),
        include_str!("../../shaders/cpu.wgsl"),
        include_str!("../../shaders/indexer.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[INDEXER.code()];

/// (row, head) pairs a `scores_rows` workgroup takes (`RP` in the shader).
const ROWS_PAIRS: u32 = 128;

thread_local! {
    /// Set by [`with_rows_kernel`]: whether a GPU's chunk scores take `scores_rows` on this
    /// thread wherever it can run, whatever the chunk's rows, or never.
    static FORCE_ROWS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the indexer's scores recorded on this thread taking `scores_rows` wherever
/// it can run (`on`: also for chunks of fewer rows than a workgroup takes) or never: for
/// tests, which check both GPU kernels on one adapter (and tests/backends.rs, which
/// translates every entry point).
pub fn with_rows_kernel<R>(on: bool, f: impl FnOnce() -> R) -> R {
    super::with_forced(&FORCE_ROWS, on, f)
}

/// Query rows a `scores_rows` workgroup takes for `heads` heads (`RT` in the shader): its
/// 128 (row, head) pairs over the heads padded to whole quads.
fn rows_per_workgroup(heads: u32) -> u32 {
    ROWS_PAIRS / heads.next_multiple_of(4)
}

/// Whether a GPU's chunk of `rows` query rows with `heads` heads takes `scores_rows` (several
/// rows a workgroup, 8 × 8 outputs an invocation, the keys read once for them) rather than
/// `scores` (one row a workgroup): where the rows are of `one_sequence` (a session's chunk,
/// not a batched step's rows of several), its 128 pairs hold every head of a row and the
/// chunk fills at least one workgroup (decode keeps `scores`), with
/// `SPARSA_INDEXER_ROWS=1`: off by default until measured on a GPU (written in a session
/// without one; its results are checked on lavapipe against the CPU reference, as the other
/// two kernels' are).
fn rows_kernel(rows: u32, heads: u32, one_sequence: bool) -> bool {
    if !one_sequence || heads > ROWS_PAIRS {
        return false;
    }
    match FORCE_ROWS.with(|c| c.get()) {
        Some(on) => on,
        None => {
            rows >= rows_per_workgroup(heads)
                && crate::knobs::knob!("SPARSA_INDEXER_ROWS", |v| v <= 1) == Some(1)
        }
    }
}

/// The indexer's shapes, from the config once ([`IndexerDims::of`]): `heads` query heads of
/// `dim` values sharing one key per position; the head weights are scaled by `w_scale`
/// (`heads^-1/2`) and the scores by `scale` (`dim^-1/2`).
#[derive(Clone, Copy, Debug)]
pub struct IndexerDims {
    pub heads: u32,
    pub dim: u32,
    pub w_scale: f32,
    pub scale: f32,
}

impl IndexerDims {
    pub fn of(cfg: &Config) -> IndexerDims {
        let (heads, dim) = (cfg.index_n_heads as u32, cfg.index_head_dim as u32);
        IndexerDims {
            heads,
            dim,
            w_scale: (heads as f32).powf(-0.5),
            scale: (dim as f32).powf(-0.5),
        }
    }
}

/// For the chunk's query rows `t < rows` (absolute position `pos0 + t`) and keys
/// `s < n_keys`:
/// `out[t, s] = Σ_{h<heads} (w[t, h] · w_scale) · relu(q[t, h*dim .. h*dim+dim] · keys[s, :dim]) · scale`
/// and `out[t, s] = -inf` where `s > pos0 + t` (causal mask before top-k). With
/// [`Causal::places`], row `t` is at its own position and reads its sequence's keys at cache
/// rows `lo + s`.
/// `q`: rows × heads·dim; `w`: rows × heads; `keys`: the key cache (in its format, decoded
/// as it is read; `I8` keys are rotated, so `q` must have been rotated too: see
/// [`super::cache::rotate`]), whose segments must cover the `n_keys` positions and be whole
/// key blocks (a multiple of 128 positions) but for the last.
///
/// `out` must be a buffer of its own (the inputs may share one). On GPUs a chunk of a
/// prompt's rows may take `scores_rows` ([`rows_kernel`]): one workgroup covers 128 / heads
/// query rows (heads padded to 4) and 128 keys, a [128 pairs × dim]·[dim × 128] product of
/// 8 × 8 outputs an invocation; decode and rows of several sequences take `scores`, a workgroup a query
/// row, and CPU adapters `scores_cpu`. Blocks wholly in the causal future only write -inf.
/// Each segment is scored by a dispatch of its own.
/// With `rope`, the queries are rotated as they are read (its slice: the first dims of each
/// head; not with `I8` keys, whose queries are rotated twice before: RoPE, then Hadamard).
#[allow(clippy::too_many_arguments)]
pub fn indexer_scores(
    rec: &mut Recorder,
    q: View,
    w: View,
    keys: &CacheRows<KeyFormat>,
    out: View,
    chunk: Causal,
    d: &IndexerDims,
    rope: Option<QueryRope>,
) {
    let Causal {
        rows, n_keys, pos0, ..
    } = chunk;
    let IndexerDims {
        heads,
        dim,
        w_scale,
        scale,
    } = *d;
    if rows == 0 || n_keys == 0 {
        return;
    }
    assert!(
        (1..=256).contains(&heads),
        "indexer_scores: heads = {heads}, supported 1..=256"
    );
    assert!(dim > 0, "indexer_scores: dim must be positive");
    if let Some(r) = &rope {
        let s = &r.slice;
        assert!(
            s.heads == heads && s.head_stride == dim && s.rot_off == 0 && s.rot_dim <= dim,
            "indexer_scores: it rotates the first dims of each query head only, not {s:?}"
        );
        assert!(
            !keys.format.rotated(),
            "indexer_scores: rotated keys need their queries rotated (RoPE first) beforehand"
        );
    }
    let gpu = rec.gpu();
    let cs = rope.map_or(gpu.dummy(), |r| r.cos_sin);
    let (ragged, places) = chunk.places_binding(gpu);
    // Workgroup memory: q chunk DC·NG·HPI floats, key chunk DC·KT floats, sums NG·KT floats.
    let hq4 = heads.div_ceil(4 * NG);
    let wg_bytes = |dc: u32| 4 * (dc * NG * 4 * hq4 + dc * KT + NG * KT);
    let dc: u32 = if wg_bytes(32) <= gpu.limits.max_compute_workgroup_storage_size {
        32
    } else {
        16
    };
    let qd4 = dim.div_ceil(4);
    let limit = gpu.limits.max_compute_workgroup_storage_size;
    let cpu = super::cpu_kernels(gpu) && cpu_scores_fit(heads, qd4, limit);
    // scores_rows: queries and keys staged DC dims at a time, 32 vec4s each per dim (its
    // row sums' 1,024 vec4s then fit the same memory with DC >= 16).
    let rows_dc = [32u32, 16]
        .into_iter()
        .find(|dc| dc * 64 * 16 <= limit)
        .filter(|_| !cpu && rows_kernel(rows, heads, chunk.of_one_sequence()));
    let (entry, dc, per_wg) = match rows_dc {
        Some(rdc) => ("scores_rows", rdc, rows_per_workgroup(heads)),
        None if cpu => ("scores_cpu", dc, 1),
        None => ("scores", dc, 1),
    };
    let p = gpu.pipeline(
        &INDEXER,
        entry,
        &[
            ("HEADS", u(heads)),
            ("HQ4", u(hq4)),
            ("DC", u(dc)),
            ("KFMT", u(keys.format as u32)),
            ("QD4", u(if cpu { qd4 } else { 1 })),
        ],
    );
    let blocks = n_keys.div_ceil(KT);
    // Keys up to the last causal position are read once per row.
    let live = (0..rows.min(4))
        .map(|t| n_keys.min(pos0 + t + 1) as u64)
        .max()
        .unwrap_or(0)
        * rows as u64;
    rec.cost(
        live * keys.row_words as u64 * 4 + rows as u64 * n_keys as u64 * 4,
        2 * live * heads as u64 * dim as u64,
        "",
    );
    let mut blk0 = 0;
    for (k, seg) in keys.segs.iter().enumerate() {
        assert!(
            seg.lo == blk0 * KT,
            "indexer_scores: key cache segment {k} starts at position {}, not at {} (segments must be whole blocks of {KT})",
            seg.lo,
            blk0 * KT
        );
        if blk0 >= blocks {
            break;
        }
        let key_blocks = seg.len.div_ceil(KT).min(blocks - blk0);
        let params = Params {
            q_off: q.offset,
            q_stride: q.stride,
            w_off: w.offset,
            w_stride: w.stride,
            k_off: 0,
            k_stride: keys.row_words,
            o_off: out.offset,
            o_stride: out.stride,
            rows,
            dim,
            n_keys,
            pos0,
            key_blocks,
            blk0,
            w_scale,
            scale,
            seg_lo: seg.lo,
            rope: QueryRope::mode(rope.as_ref()),
            rot_half: rope.map_or(0, |r| r.slice.rot_dim / 2),
            ragged,
        };
        let groups = rows.div_ceil(per_wg) as u64 * key_blocks as u64;
        assert!(
            groups <= u32::MAX as u64,
            "indexer_scores: too many workgroups"
        );
        rec.dispatch(
            &p,
            &params,
            &[q.buf, w.buf, &seg.buf, out.buf, cs, places],
            gpu.grid(groups as u32),
        );
        blk0 += key_blocks;
    }
    assert!(
        blk0 >= blocks,
        "indexer_scores: the key cache's segments hold fewer than {n_keys} positions"
    );
}

/// Whether `scores_cpu` (CPU adapters: one invocation per key, the queries staged once per
/// workgroup) can take `heads` heads of `qd4` vec4s: its loops stay under [`CPU_LOOPS`] an
/// invocation (per key: the key's loads and a dot per head; before them, the queries'
/// share of the staging) and its workgroup memory (queries, weights) under `wg_bytes`.
fn cpu_scores_fit(heads: u32, qd4: u32, wg_bytes: u32) -> bool {
    let per_key = qd4 + heads * (1 + qd4);
    let loops = (KT / CPU_WG) * per_key + (heads * qd4).div_ceil(CPU_WG) + heads;
    let bytes = 16 * heads * qd4 + 4 * heads + 8;
    loops <= CPU_LOOPS && bytes <= wg_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Gpu;
    use crate::kernels::cache::{decode_key, encode_key, hadamard};
    use crate::kernels::rope::{rope_ref, RopeSlice};
    use crate::kernels::testutil::{
        assert_close, cache_segments, gpu, gpu_default_limits, Placed, Rng,
    };
    use crate::kernels::topk::{topk, topk_ref, Selection, TopkScratch};

    #[test]
    fn indexer_scores_placed_rows_of_several_sequences() {
        // A batched step's rows over a pooled key cache: row t reads its own sequence's
        // keys from cache row lo and is causal at its own position; each row must equal the
        // reference over its sequence's keys alone. Then a session's chunk placed in the
        // pool: rows of one sequence (one lo), which scores_rows takes 32 a workgroup.
        let g = gpu();
        let mut rng = Rng::new(77);
        let (heads, dim, n_keys) = (4usize, 40usize, 260usize);
        let several = [(0usize, 259usize), (640, 3), (320, 130), (640, 200)];
        let one_seq: Vec<(usize, usize)> = (190..227).map(|p| (320, p)).collect();
        for (host, one_sequence) in [(&several[..], false), (&one_seq[..], true)] {
            let rows = host.len();
            let pool = 640 + n_keys;
            let keys = rng.vec(pool * dim, 1.0);
            let one = Case {
                rows,
                heads,
                dim,
                n_keys,
                pos0: 0,
            };
            let (q, w, _) = one.random_inputs(&mut rng);
            let words: Vec<u32> = keys.iter().map(|v| v.to_bits()).collect();
            let kseg = cache_segments(g, &words, dim, pool);
            let kb = CacheRows {
                segs: &kseg,
                format: KeyFormat::F32,
                row_words: dim as u32,
            };
            let qb = g.buffer_from(&q, "q").unwrap();
            let wb = g.buffer_from(&w, "w").unwrap();
            let pw: Vec<u32> = host
                .iter()
                .flat_map(|&(lo, p)| [lo as u32, p as u32])
                .collect();
            let places = g.buffer_from(&pw, "places").unwrap();
            let chunk = Causal {
                places: Some(&places),
                one_sequence,
                ..Causal::chunk(rows as u32, n_keys as u32, 0)
            };
            let d = IndexerDims {
                heads: heads as u32,
                dim: dim as u32,
                w_scale: 0.37,
                scale: 0.125,
            };
            for kernel in KERNELS {
                let ob = Placed::filled(g, rows, n_keys, (2, n_keys + 1), 7.5);
                let mut rec = g.recorder();
                let (qv, wv) = (
                    View::rows(&qb, (heads * dim) as u32),
                    View::rows(&wb, heads as u32),
                );
                kernel.with(|| indexer_scores(&mut rec, qv, wv, &kb, ob.view(), chunk, &d, None));
                rec.finish().unwrap();
                let got = ob.read(g, "indexer_scores placed");
                for (t, &(lo, pos)) in host.iter().enumerate() {
                    let c = Case {
                        rows: 1,
                        pos0: pos,
                        ..one
                    };
                    let qt = &q[t * heads * dim..(t + 1) * heads * dim];
                    let wt = &w[t * heads..(t + 1) * heads];
                    let kt = &keys[lo * dim..(lo + n_keys) * dim];
                    let want = cpu_scores(qt, wt, kt, &c, 0.37, 0.125);
                    let row = &got[t * n_keys..(t + 1) * n_keys];
                    let what = format!("{kernel:?}: placed row {t} (lo {lo}, pos {pos})");
                    assert_close(row, &want, 1e-4, 1e-4, &what);
                }
            }
        }
    }

    #[test]
    fn indexer_small_workgroup_memory() {
        // WebGPU's default 16 KiB of workgroup memory: 100 heads take the 16-wide dim chunk.
        let g = gpu_default_limits();
        assert!(g.limits.max_compute_workgroup_storage_size <= 16384);
        let mut rng = Rng::new(91);
        let c = Case {
            rows: 3,
            heads: 100,
            dim: 40,
            n_keys: 150,
            pos0: 147,
        };
        let (q, w, keys) = c.random_inputs(&mut rng);
        let (got, want) = run_on(g, &c, &q, &w, &keys, (0.37, 0.125), None);
        assert_close(
            &got,
            &want,
            1e-4,
            1e-4,
            "indexer with 16 KiB workgroup memory",
        );
    }

    fn cpu_scores(
        q: &[f32],
        w: &[f32],
        keys: &[f32],
        c: &Case,
        w_scale: f32,
        scale: f32,
    ) -> Vec<f32> {
        let (rows, heads, dim, n_keys, pos0) = (c.rows, c.heads, c.dim, c.n_keys, c.pos0);
        let mut out = vec![0f32; rows * n_keys];
        for t in 0..rows {
            for s in 0..n_keys {
                out[t * n_keys + s] = if s > pos0 + t {
                    f32::NEG_INFINITY
                } else {
                    let mut acc = 0f64;
                    for h in 0..heads {
                        let mut d = 0f64;
                        for i in 0..dim {
                            d += q[t * heads * dim + h * dim + i] as f64 * keys[s * dim + i] as f64;
                        }
                        acc += (w[t * heads + h] * w_scale) as f64 * d.max(0.0) * scale as f64;
                    }
                    acc as f32
                };
            }
        }
        out
    }

    struct Case {
        rows: usize,
        heads: usize,
        dim: usize,
        n_keys: usize,
        pos0: usize,
    }

    impl Case {
        fn causal(&self) -> Causal<'static> {
            Causal::chunk(self.rows as u32, self.n_keys as u32, self.pos0 as u32)
        }

        /// Queries, head weights and keys drawn from `rng` (in that order), uniform in ±1.
        fn random_inputs(&self, rng: &mut Rng) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let q = rng.vec(self.rows * self.heads * self.dim, 1.0);
            let w = rng.vec(self.rows * self.heads, 1.0);
            let keys = rng.vec(self.n_keys * self.dim, 1.0);
            (q, w, keys)
        }
    }

    /// Runs the kernel with inputs inside padded matrices (offsets, strides) and returns the
    /// GPU scores plus the CPU reference, both rows × n_keys.
    fn run(
        c: &Case,
        q: &[f32],
        w: &[f32],
        keys: &[f32],
        w_scale: f32,
        scale: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        run_on(gpu(), c, q, w, keys, (w_scale, scale), None)
    }

    /// [`run`] on `g`; with `rope` (rot_dim, interleaved) the queries are given unrotated and
    /// the kernel rotates them (the reference rotates them beforehand).
    fn run_on(
        g: &Gpu,
        c: &Case,
        q: &[f32],
        w: &[f32],
        keys: &[f32],
        (w_scale, scale): (f32, f32),
        rope: Option<(usize, bool)>,
    ) -> (Vec<f32>, Vec<f32>) {
        let (rows, heads, dim, n_keys) = (c.rows, c.heads, c.dim, c.n_keys);
        // q and w share one buffer: q rows of stride heads*dim + 3 at offset 5, w after it.
        let qs = heads * dim + 3;
        let qoff = 5;
        let woff = qoff + rows * qs + 2;
        let ws = heads + 1;
        let mut qw = vec![f32::NAN; woff + rows * ws];
        for t in 0..rows {
            qw[qoff + t * qs..qoff + t * qs + heads * dim]
                .copy_from_slice(&q[t * heads * dim..(t + 1) * heads * dim]);
            qw[woff + t * ws..woff + t * ws + heads]
                .copy_from_slice(&w[t * heads..(t + 1) * heads]);
        }
        let words: Vec<u32> = keys.iter().map(|v| v.to_bits()).collect();
        let kseg = cache_segments(g, &words, dim, n_keys);
        let kb = CacheRows {
            segs: &kseg,
            format: KeyFormat::F32,
            row_words: dim as u32,
        };
        let qwb = g.buffer_from(&qw, "qw").unwrap();
        let slice = rope.map(|(rot_dim, interleave)| RopeSlice {
            heads: heads as u32,
            head_stride: dim as u32,
            rot_off: 0,
            rot_dim: rot_dim as u32,
            interleave,
        });
        let cs = Rng::new(5).cos_sin(rows, rope.map_or(1, |r| r.0 / 2));
        let csb = g.buffer_from(&cs, "cos_sin").unwrap();
        let mut q_ref = q.to_vec();
        if let Some(r) = &slice {
            rope_ref(&mut q_ref, rows, heads * dim, r, &cs);
        }
        // The GPUs' kernels, then the CPU adapters' (each into a freshly filled output).
        let mut got = Vec::new();
        for kernel in KERNELS {
            let ob = Placed::filled(g, rows, n_keys, (3, n_keys + 4), 7.5);
            let mut rec = g.recorder();
            kernel.with(|| {
                indexer_scores(
                    &mut rec,
                    View::new(&qwb, qoff as u32, qs as u32),
                    View::new(&qwb, woff as u32, ws as u32),
                    &kb,
                    ob.view(),
                    c.causal(),
                    &IndexerDims {
                        heads: heads as u32,
                        dim: dim as u32,
                        w_scale,
                        scale,
                    },
                    slice.map(|slice| QueryRope {
                        slice,
                        cos_sin: &csb,
                    }),
                )
            });
            rec.finish().unwrap();
            got.extend(ob.read(g, "indexer_scores"));
        }
        let want = cpu_scores(&q_ref, w, keys, c, w_scale, scale);
        (got, want.repeat(KERNELS.len()))
    }

    /// The kernels the tests check on one adapter: the GPUs' `scores` (a row a workgroup)
    /// and `scores_rows` (several), and the CPU adapters' `scores_cpu`.
    #[derive(Clone, Copy, Debug)]
    enum Kernel {
        Scores,
        ScoresRows,
        ScoresCpu,
    }
    const KERNELS: [Kernel; 3] = [Kernel::Scores, Kernel::ScoresRows, Kernel::ScoresCpu];

    impl Kernel {
        /// Runs `f` with the indexer's scores recorded on this thread taking this kernel.
        fn with<R>(self, f: impl FnOnce() -> R) -> R {
            let cpu = matches!(self, Kernel::ScoresCpu);
            let rows = matches!(self, Kernel::ScoresRows);
            crate::kernels::with_cpu_kernels(cpu, || with_rows_kernel(rows, f))
        }
    }

    #[test]
    fn indexer_rotates_queries_as_it_reads() {
        // Queries unrotated in memory, RoPE applied as they are staged: both pairings, a
        // rot_dim spanning two dim chunks, decode and a chunk of rows.
        let mut rng = Rng::new(61);
        for (rows, pos0) in [(1usize, 299usize), (6, 200)] {
            let c = Case {
                rows,
                heads: 7,
                dim: 72,
                n_keys: 300,
                pos0,
            };
            for interleave in [false, true] {
                let (q, w, keys) = c.random_inputs(&mut rng);
                let (got, want) = run_on(
                    gpu(),
                    &c,
                    &q,
                    &w,
                    &keys,
                    (0.37, 0.125),
                    Some((40, interleave)),
                );
                let what = format!("indexer rope rows {rows} interleave {interleave}");
                assert_close(&got, &want, 1e-4, 1e-4, &what);
            }
        }
    }

    #[test]
    fn indexer_reads_every_key_format_across_segments() {
        // Keys stored in each format, in one segment or segments of 128 / 256 positions;
        // i8 keys are rotated, so the queries are rotated as the model does. The reference
        // scores the decoded keys, so only the f32 arithmetic may differ.
        let g = gpu();
        let mut rng = Rng::new(95);
        for dim in [32usize, 128] {
            let c = Case {
                rows: 3,
                heads: 9,
                dim,
                n_keys: 300,
                pos0: 290,
            };
            for format in KeyFormat::ALL {
                for seg_len in [c.n_keys, 128, 256] {
                    let (mut q, w, keys) = c.random_inputs(&mut rng);
                    if format.rotated() {
                        q.chunks_mut(dim).for_each(hadamard);
                    }
                    let rw = format.row_words(dim);
                    let mut words = Vec::new();
                    let mut decoded = Vec::new();
                    for k in keys.chunks(dim) {
                        let e = encode_key(format, k);
                        decoded.extend(decode_key(format, &e, dim));
                        words.extend(e);
                    }
                    let segs = cache_segments(g, &words, rw, seg_len);
                    let kc = CacheRows {
                        segs: &segs,
                        format,
                        row_words: rw as u32,
                    };
                    let qb = g.buffer_from(&q, "q").unwrap();
                    let wb = g.buffer_from(&w, "w").unwrap();
                    let d = IndexerDims {
                        heads: c.heads as u32,
                        dim: dim as u32,
                        w_scale: 0.3,
                        scale: 0.2,
                    };
                    let want = cpu_scores(&q, &w, &decoded, &c, 0.3, 0.2);
                    for kernel in KERNELS {
                        let ob = Placed::filled(g, c.rows, c.n_keys, (1, c.n_keys + 3), 7.5);
                        let mut rec = g.recorder();
                        let qv = View::rows(&qb, (c.heads * dim) as u32);
                        let wv = View::rows(&wb, c.heads as u32);
                        kernel.with(|| {
                            indexer_scores(&mut rec, qv, wv, &kc, ob.view(), c.causal(), &d, None)
                        });
                        rec.finish().unwrap();
                        let got = ob.read(g, "indexer_scores");
                        check_scores(&got, &want);
                    }
                }
            }
        }
    }

    fn check_scores(got: &[f32], want: &[f32]) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            if w.is_infinite() {
                assert!(*g == f32::NEG_INFINITY, "[{i}]: got {g}, want -inf");
            }
        }
        assert_close(got, want, 1e-4, 1e-4, "indexer scores");
    }

    #[test]
    fn indexer_prefill_chunks_and_decode() {
        let mut rng = Rng::new(11);
        for (i, c) in [
            // prefill from 0, awkward sizes
            Case {
                rows: 7,
                heads: 3,
                dim: 37,
                n_keys: 7,
                pos0: 0,
            },
            // chunk at pos0 > 0, keys beyond one block
            Case {
                rows: 5,
                heads: 4,
                dim: 40,
                n_keys: 150,
                pos0: 145,
            },
            Case {
                rows: 9,
                heads: 5,
                dim: 33,
                n_keys: 200,
                pos0: 70,
            },
            // decode: one row, pos0 = L - 1
            Case {
                rows: 1,
                heads: 8,
                dim: 64,
                n_keys: 301,
                pos0: 300,
            },
            // many heads: smaller dim chunk
            Case {
                rows: 2,
                heads: 100,
                dim: 24,
                n_keys: 70,
                pos0: 68,
            },
            // GLM-5's 32 heads: scores_rows' 4 rows a workgroup over 3 row blocks (the last
            // partial), dims past a whole chunk; from 0 (blocks wholly in every row's
            // future) and deep into the keys.
            Case {
                rows: 9,
                heads: 32,
                dim: 40,
                n_keys: 300,
                pos0: 0,
            },
            Case {
                rows: 10,
                heads: 32,
                dim: 40,
                n_keys: 300,
                pos0: 289,
            },
        ]
        .iter()
        .enumerate()
        {
            let (q, w, keys) = c.random_inputs(&mut rng);
            let (got, want) = run(c, &q, &w, &keys, 0.37, 0.125);
            check_scores(&got, &want);
            // the causal mask really is there for prefill-like cases
            if c.pos0 + c.rows < c.n_keys {
                assert!(
                    want.iter().any(|x| x.is_infinite()),
                    "case {i} exercises the mask"
                );
            }
        }
    }

    #[test]
    fn indexer_relu_ties_then_topk() {
        // One head: about half the scores are exactly 0 (ReLU), all of them when the row's
        // head weight is negative, so top-k must break many ties with the lower-position rule.
        let g = gpu();
        let mut rng = Rng::new(12);
        let c = Case {
            rows: 6,
            heads: 1,
            dim: 16,
            n_keys: 600,
            pos0: 594,
        };
        let q = rng.vec(c.rows * c.heads * c.dim, 1.0);
        let w: Vec<f32> = (0..c.rows * c.heads)
            .map(|i| if i % 3 == 1 { -0.5 } else { 0.7 })
            .collect();
        let keys = rng.vec(c.n_keys * c.dim, 1.0);
        let (got, want) = run(&c, &q, &w, &keys, 1.0, 0.25);
        check_scores(&got, &want);
        let zeros = got.iter().filter(|&&x| x == 0.0).count();
        assert!(zeros > got.len() / 5, "enough exact zeros ({zeros})");

        // GPU top-k over the GPU scores, CPU reference over the same values.
        let k = 400u32;
        let sbuf = g.buffer_from(&got, "scores").unwrap();
        let idx = g.buffer(c.rows as u64 * k as u64 * 4, "idx").unwrap();
        let cnt = g.buffer(c.rows as u64 * 4, "cnt").unwrap();
        let sc = TopkScratch::new(g, c.rows as u32).unwrap();
        let sel = Selection {
            idx: &idx,
            cnt: &cnt,
            k,
        };
        let mut rec = g.recorder();
        let scores = View::rows(&sbuf, c.n_keys as u32);
        topk(&mut rec, scores, c.causal(), &sel, &sc);
        rec.finish().unwrap();
        let gi = g.read_u32(&idx, 0, c.rows * k as usize).unwrap();
        for t in 0..c.rows {
            let valid = (c.pos0 + t + 1).min(c.n_keys);
            let row = &got[t * c.n_keys..(t + 1) * c.n_keys];
            let want = topk_ref(row, valid, k as usize);
            let positive = row[..valid].iter().filter(|&&x| x > 0.0).count();
            assert!(
                positive < k as usize,
                "row {t}: the cut falls inside the zeros"
            );
            assert_eq!(
                &gi[t * k as usize..(t + 1) * k as usize],
                want.as_slice(),
                "row {t}"
            );
        }
    }

    #[test]
    fn indexer_fully_masked_blocks() {
        // Short chunk at the start of a long key range: later key blocks are all -inf.
        let mut rng = Rng::new(13);
        let c = Case {
            rows: 3,
            heads: 2,
            dim: 8,
            n_keys: 260,
            pos0: 10,
        };
        let (q, w, keys) = c.random_inputs(&mut rng);
        let (got, want) = run(&c, &q, &w, &keys, 1.0, 1.0);
        check_scores(&got, &want);
    }
}
