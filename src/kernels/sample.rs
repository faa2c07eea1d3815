//! Token selection on the GPU: the greedy argmax of a logits row (`shaders/sample.wgsl`) and
//! top-k / top-p sampling with the repetition penalty (`shaders/sample_pick.wgsl`), both
//! written where the next decode step's embedding reads its token, so generation needs no
//! logits readback and the host can queue step `n + 1` before step `n`'s token is known.
use super::topk::{self, Selection, TopkScratch};
use super::{Causal, Recorder, View};
use crate::gpu::{kernel_params, Shader, ShaderCode};

kernel_params! {
    struct Params {
        x_off: u32,
        n: u32,
        parts: u32,
        per_part: u32,
        out_off: u32,
        /// Elements between the rows of a several-row argmax.
        x_stride: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// Largest number of workgroups of the first pass.
pub const MAX_PARTS: u32 = 256;
/// Elements per first-pass workgroup when the row is long enough (8 per invocation).
const PER_PART: u32 = 2048;

/// u32 words of the scratch [`argmax`] needs (a (key, index) pair per first-pass workgroup).
const PART_WORDS: u64 = 2 * MAX_PARTS as u64;

/// Where a picked token goes: `ids[index]` of a u32 buffer (e.g. the token ids the next
/// chunk embeds).
#[derive(Clone, Copy)]
pub struct TokenSlot<'a> {
    pub ids: &'a wgpu::Buffer,
    pub index: u32,
}

/// The repetition penalty's tokens: `buf[0 .. len]` and, with `prev`, the token already in
/// the output [`TokenSlot`] (the previous step's pick); each token is penalized once.
#[derive(Clone, Copy)]
pub struct Window<'a> {
    pub buf: &'a wgpu::Buffer,
    pub len: u32,
    pub prev: bool,
}

/// `out = argmax(x[0..n])` of the row starting at `x`: the lowest index among equal
/// maxima, NaN skipped (0 when all are NaN), as [`crate::sampling::argmax`].
pub fn argmax(rec: &mut Recorder, x: View, n: u32, out: TokenSlot, scratch: &SampleScratch) {
    argmax_rows(rec, x, 1, n, out, scratch)
}

/// [`argmax`] of each of the `rows` rows of `x` (`x.stride` apart), row r's index written to
/// `out.ids[out.index + r]`: a batched step's greedy rows picked in one or two dispatches,
/// not two per row (on lavapipe each dispatch costs about 0.1 ms whatever it does).
pub fn argmax_rows(
    rec: &mut Recorder,
    x: View,
    rows: u32,
    n: u32,
    out: TokenSlot,
    scratch: &SampleScratch,
) {
    assert!(n > 0 && rows > 0, "argmax of an empty row");
    assert!(
        rows <= MAX_PARTS,
        "argmax of {rows} rows: at most {MAX_PARTS}"
    );
    // All rows' partials fit the scratch's MAX_PARTS pairs: at most MAX_PARTS / rows a row
    // (a row's parts, ceil(n / per_part), stay within it since per_part ≥ n / that).
    let per_part = PER_PART
        .max(n.div_ceil(MAX_PARTS / rows))
        .next_multiple_of(256);
    let parts = n.div_ceil(per_part);
    assert!(parts * rows <= MAX_PARTS);
    let p = Params {
        x_off: x.offset,
        n,
        parts,
        per_part,
        out_off: out.index,
        x_stride: x.stride,
        _pad1: 0,
        _pad2: 0,
    };
    let gpu = rec.gpu();
    let wg = super::reduce_workgroup(gpu, 256);
    let pipe = |e| gpu.pipeline_n(&SAMPLE, e, &["SWG"], &[wg]);
    let part = &scratch.part;
    rec.cost(4 * (n * rows) as u64, 0, "");
    if n <= ONE_PASS_MAX {
        rec.dispatch(&pipe("argmax_one"), &p, &[out.ids, x.buf], [rows, 1, 1]);
        return;
    }
    rec.dispatch(&pipe("argmax_part"), &p, &[part, x.buf], [parts, rows, 1]);
    rec.dispatch(&pipe("argmax_final"), &p, &[part, out.ids], [rows, 1, 1]);
}

/// Longest rows [`argmax_rows`] reduces in one pass, a workgroup per row (`argmax_one`):
/// the built-in model's 6,144 logits, where a second dispatch cost more than the first
/// pass's spread over workgroups saves (each dispatch of a speculative round's ~235 is a few
/// µs on an H100). Longer rows (real models' 129,280–154,880) take two passes.
pub const ONE_PASS_MAX: u32 = 8192;

/// The largest top-k [`sample`] takes (the host samples wider ones).
pub const MAX_TOP_K: u32 = 256;

/// What [`sample`] does with a logits row: the host sampler's settings and its uniform draw
/// for this token.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    /// 1 ..= [`MAX_TOP_K`].
    pub top_k: u32,
    /// Repetition penalty (1: off).
    pub penalty: f32,
    /// The uniform draw in [0, 1).
    pub r: f32,
}

kernel_params! {
    struct PickParams {
        n: u32,
        x_off: u32,
        win_len: u32,
        use_prev: u32,
        out_off: u32,
        k: u32,
        temperature: f32,
        top_p: f32,
        penalty: f32,
        r: f32,
        /// Prep: 1 keeps non-finite values (for the penalized argmax)
        raw: u32,
        _pad: u32,
    }
}

const SAMPLE: Shader<Params> = Shader::new(
    "sample",
    concat!(
        include_str!("../../shaders/sample_key.wgsl"),
        include_str!("../../shaders/argmax_reduce.wgsl"),
        include_str!("../../shaders/sample.wgsl")
    ),
);
const SAMPLE_PICK: Shader<PickParams> = Shader::new(
    "sample_pick",
    concat!(
        include_str!("../../shaders/sample_key.wgsl"),
        include_str!("../../shaders/sample_pick.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[SAMPLE.code(), SAMPLE_PICK.code()];

impl PickParams {
    /// `raw`: 1 keeps non-finite logits in prep (for the penalized argmax).
    fn new(x: View, n: u32, s: &Sampling, win: &Window, out: TokenSlot, raw: u32) -> Self {
        PickParams {
            n,
            x_off: x.offset,
            win_len: win.len,
            use_prev: win.prev as u32,
            out_off: out.index,
            k: s.top_k,
            temperature: s.temperature,
            top_p: s.top_p,
            penalty: s.penalty,
            r: s.r,
            raw,
            _pad: 0,
        }
    }
}

/// Buffers the pickers work in for rows of up to `vocab` logits: the penalized logits, the
/// top-k's output and the argmax's per-workgroup partials.
pub struct SampleScratch {
    work: wgpu::Buffer,
    cand: wgpu::Buffer,
    cand_n: wgpu::Buffer,
    part: wgpu::Buffer,
    topk: TopkScratch,
}

impl SampleScratch {
    /// Label and bytes of each buffer but the top-k's, in field order.
    fn sizes(vocab: u32) -> [(&'static str, u64); 4] {
        [
            ("sample logits", 4 * vocab as u64),
            ("sample candidates", 4 * MAX_TOP_K as u64),
            ("sample candidate count", 4),
            ("argmax partials", 4 * PART_WORDS),
        ]
    }

    pub fn new(gpu: &crate::gpu::Gpu, vocab: u32) -> crate::Result<SampleScratch> {
        let mut b = Vec::with_capacity(4);
        for (label, bytes) in Self::sizes(vocab) {
            b.push(gpu.buffer(bytes, label)?);
        }
        let [work, cand, cand_n, part] = <[wgpu::Buffer; 4]>::try_from(b)
            .unwrap_or_else(|_| unreachable!("four sizes, four buffers"));
        Ok(SampleScratch {
            work,
            cand,
            cand_n,
            part,
            topk: TopkScratch::new(gpu, 1)?,
        })
    }

    /// GPU bytes [`SampleScratch::new`] allocates.
    pub fn bytes_for(vocab: u32) -> u64 {
        Self::sizes(vocab).iter().map(|s| s.1).sum::<u64>() + TopkScratch::bytes_for(1)
    }
}

/// Samples a token from the logits row `x` (`n` values) as [`crate::sampling::Sampler`]
/// does with draw `s.r`: the penalty on the tokens of `win`; non-finite logits dropped; the
/// top `s.top_k` by value (ties: lower id), softmax of value / temperature, the top-p
/// nucleus; then the token goes to `out`. With no finite logit, the argmax of `x`.
/// Probabilities are f32 (the host's are f64), so a draw within about 1e-6 of a boundary
/// between two tokens may pick the other one.
pub fn sample(
    rec: &mut Recorder,
    x: View,
    n: u32,
    s: &Sampling,
    win: &Window,
    out: TokenSlot,
    scratch: &SampleScratch,
) {
    assert!(n > 0, "sample: empty row");
    assert!(
        (1..=MAX_TOP_K).contains(&s.top_k) && s.temperature > 0.0,
        "sample: top_k {} / temperature {}",
        s.top_k,
        s.temperature
    );
    let p = PickParams::new(x, n, s, win, out, 0);
    let gpu = rec.gpu();
    let pipe = |e| gpu.pipeline(&SAMPLE_PICK, e, &[]);
    let sc = scratch;
    prep(rec, &p, x, win, out, sc);
    let work = View::rows(&sc.work, n);
    let chunk = Causal::chunk(1, n, n - 1);
    let cand = Selection {
        idx: &sc.cand,
        cnt: &sc.cand_n,
        k: s.top_k,
    };
    topk::topk(rec, work, chunk, &cand, &sc.topk);
    rec.dispatch(
        &pipe("pick"),
        &p,
        &[&sc.work, x.buf, out.ids, &sc.cand, &sc.cand_n],
        [1, 1, 1],
    );
}

/// Greedy with the repetition penalty: `out` = the argmax (as [`argmax`]) of `x` after the
/// penalty on the tokens of `win` (as in [`sample`]).
pub fn argmax_penalized(
    rec: &mut Recorder,
    x: View,
    n: u32,
    penalty: f32,
    win: &Window,
    out: TokenSlot,
    scratch: &SampleScratch,
) {
    assert!(n > 0, "argmax of an empty row");
    let greedy = Sampling {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 1,
        penalty,
        r: 0.0,
    };
    let p = PickParams::new(x, n, &greedy, win, out, 1);
    prep(rec, &p, x, win, out, scratch);
    argmax(rec, View::rows(&scratch.work, n), n, out, scratch);
}

/// sample_pick.wgsl's `prep`: the penalized (and, unless `p.raw`, sanitized) logits of `x`
/// into `scratch.work`.
fn prep(
    rec: &mut Recorder,
    p: &PickParams,
    x: View,
    win: &Window,
    out: TokenSlot,
    scratch: &SampleScratch,
) {
    let gpu = rec.gpu();
    let pipe = gpu.pipeline(&SAMPLE_PICK, "prep", &[]);
    rec.cost(8 * p.n as u64, 0, "");
    let grid = gpu.grid(p.n.div_ceil(256));
    rec.dispatch(&pipe, p, &[&scratch.work, x.buf, out.ids, win.buf], grid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{gpu, Rng};
    use crate::sampling::argmax as host_argmax;

    fn check(x: &[f32], x_off: usize, what: &str) {
        let g = gpu();
        let mut buf = vec![7.0f32; x_off];
        buf.extend_from_slice(x);
        buf.extend_from_slice(&[1e30, f32::INFINITY]);
        let xb = g.buffer_from(&buf, "x").unwrap();
        let scratch = SampleScratch::new(g, x.len() as u32).unwrap();
        let out = g.buffer_from(&[11u32, 22, 33], "out").unwrap();
        let mut rec = g.recorder();
        let slot = TokenSlot {
            ids: &out,
            index: 1,
        };
        argmax(
            &mut rec,
            View::new(&xb, x_off as u32, 0),
            x.len() as u32,
            slot,
            &scratch,
        );
        rec.finish().unwrap();
        let got = g.read_u32(&out, 0, 3).unwrap();
        assert_eq!(
            got,
            vec![11, host_argmax(x), 33],
            "{what} (n = {})",
            x.len()
        );
    }

    #[test]
    fn argmax_matches_the_host_rule() {
        // Both workgroup sizes: the GPUs' 256 and the CPU adapters' 8.
        for cpu in [false, true] {
            crate::kernels::with_cpu_kernels(cpu, argmax_matches_the_host_rule_on);
        }
    }

    fn argmax_matches_the_host_rule_on() {
        let mut rng = Rng::new(5);
        for (i, &n) in [1usize, 7, 255, 256, 2049, 4097, 70_001, 154_880, 600_000]
            .iter()
            .enumerate()
        {
            let mut x = rng.vec(n, 10.0);
            check(&x, i * 3, "random");
            // The maximum repeated further on: the first one wins.
            let at = rng.below(n as u64) as usize;
            x[at] = 20.0;
            let again = (at + 1 + rng.below(n as u64) as usize) % n;
            x[again] = 20.0;
            check(&x, i, "tied maxima");
            // NaN everywhere but a few, and -inf.
            let mut y = vec![f32::NAN; n];
            y[n - 1] = f32::NEG_INFINITY;
            y[n / 2] = -3.0;
            check(&y, 0, "NaN skipped");
            check(&vec![f32::NAN; n], 2, "all NaN");
            check(&vec![f32::NEG_INFINITY; n], 1, "all -inf");
            let mut z = vec![-0.0f32; n];
            z[n - 1] = 0.0;
            check(&z, 0, "-0 equals +0");
        }
    }

    #[test]
    fn argmax_rows_picks_each_row() {
        // Both workgroup sizes: the GPUs' 256 and the CPU adapters' 8.
        for cpu in [false, true] {
            crate::kernels::with_cpu_kernels(cpu, argmax_rows_picks_each_row_on);
        }
    }

    fn argmax_rows_picks_each_row_on() {
        // Several rows in two dispatches (a batched step's greedy picks): each row's index
        // is its own argmax, at row counts whose partials fill the scratch unevenly, rows
        // with ties and NaN among them, and a stride past the row's length.
        let g = gpu();
        let mut rng = Rng::new(9);
        for (rows, n) in [
            (2usize, 7usize),
            (3, 2049),
            (8, 6144),
            (5, 154_880),
            (8, 70_001),
            // 6 rows of DeepSeek-V3.2's vocabulary: the partials of all rows once took
            // 258 of the scratch's 256 pairs.
            (6, 129_280),
            (3, 174_084),
        ] {
            let stride = n + 5;
            let mut x = rng.vec(rows * stride + 3, 10.0);
            let row = |r: usize| 3 + r * stride;
            // Row 1: tied maxima (the first wins); the last row: NaN but for one value.
            x[row(1) + n / 2] = 99.0;
            x[row(1) + n - 1] = 99.0;
            let last = row(rows - 1);
            x[last..last + n].fill(f32::NAN);
            x[last + n / 3] = -1.0;
            let xb = g.buffer_from(&x, "x").unwrap();
            let scratch = SampleScratch::new(g, n as u32).unwrap();
            let out = g.buffer_from(&vec![77u32; rows + 2], "out").unwrap();
            let mut rec = g.recorder();
            let slot = TokenSlot {
                ids: &out,
                index: 1,
            };
            let view = View::new(&xb, row(0) as u32, stride as u32);
            argmax_rows(&mut rec, view, rows as u32, n as u32, slot, &scratch);
            rec.finish().unwrap();
            let mut want = vec![77u32];
            want.extend((0..rows).map(|r| host_argmax(&x[row(r)..row(r) + n])));
            want.push(77);
            assert_eq!(
                g.read_u32(&out, 0, rows + 2).unwrap(),
                want,
                "{rows} rows of {n}"
            );
        }
    }

    /// GPU sampling against the host sampler with the same draw, on rows with ties, NaN
    /// and infinities, every setting combination, and the window with duplicates, ids past
    /// the vocabulary and the previous step's token.
    #[test]
    fn sampling_matches_the_host_sampler() {
        use crate::sampling::{apply_repeat_penalty, sample_logits, SamplingParams};
        let g = gpu();
        let mut rng = Rng::new(11);
        let (mut checked, mut exact) = (0, 0);
        for (case, &n) in [300usize, 5000, 70_001].iter().enumerate() {
            let scratch = SampleScratch::new(g, n as u32).unwrap();
            for variant in 0..12 {
                // Values on a coarse grid (many ties), a few NaN / ±inf.
                let mut x: Vec<f32> = (0..n)
                    .map(|_| (rng.uniform() * 12.0).round() / 2.0)
                    .collect();
                for _ in 0..3 {
                    x[rng.below(n as u64) as usize] = f32::NAN;
                }
                x[rng.below(n as u64) as usize] = f32::INFINITY;
                x[rng.below(n as u64) as usize] = f32::NEG_INFINITY;
                if variant == 11 {
                    // Nothing finite: the argmax rule (+inf wins, NaN skipped).
                    x.iter_mut().for_each(|v| *v = f32::NAN);
                    x[n / 3] = f32::INFINITY;
                    x[n / 2] = f32::INFINITY;
                }
                let top = *x
                    .iter()
                    .filter(|v| v.is_finite())
                    .fold(&0.0, |a, b| if b > a { b } else { a });
                let mut window: Vec<u32> =
                    (0..20).map(|_| rng.below(n as u64 + 40) as u32).collect();
                window.push(window[3]);
                // The largest logit in the window, so the penalty changes the outcome.
                window.push(x.iter().position(|v| *v == top).unwrap_or(0) as u32);
                let prev = rng.below(n as u64) as u32;
                let use_prev = variant % 2 == 0;
                let s = Sampling {
                    temperature: [0.5, 1.0, 1.7][variant % 3],
                    top_p: [1.0, 0.9, 0.3, 0.6][variant % 4],
                    top_k: [1, 5, 40, 256][(variant + case) % 4],
                    penalty: if variant % 5 == 4 { 1.0 } else { 1.3 },
                    r: [0.0, 0.37, 0.81, 0.999][(variant / 3) % 4],
                };
                let xb = g
                    .buffer_from(&[vec![9.0f32; 5], x.clone()].concat(), "x")
                    .unwrap();
                let wb = g.buffer_from(&window, "window").unwrap();
                let ids = g.buffer_from(&[7u32, prev, 8], "ids").unwrap();
                let mut rec = g.recorder();
                let xv = View::new(&xb, 5, 0);
                let win = Window {
                    buf: &wb,
                    len: window.len() as u32,
                    prev: use_prev,
                };
                let out = TokenSlot {
                    ids: &ids,
                    index: 1,
                };
                if s.top_k == 1 {
                    argmax_penalized(&mut rec, xv, n as u32, s.penalty, &win, out, &scratch);
                } else {
                    sample(&mut rec, xv, n as u32, &s, &win, out, &scratch);
                }
                rec.finish().unwrap();
                let got = g.read_u32(&ids, 0, 3).unwrap();
                let mut seen = window.clone();
                if use_prev {
                    seen.push(prev);
                }
                let mut l = x.clone();
                apply_repeat_penalty(&mut l, &seen, s.penalty);
                let p = SamplingParams {
                    temperature: s.temperature,
                    top_p: s.top_p,
                    top_k: s.top_k as usize,
                    ..Default::default()
                };
                let want = sample_logits(&p, &l, &mut || s.r as f64);
                // The GPU's probabilities are f32: where the draw or the nucleus edge lies
                // within 1e-5 of a boundary (ties make that common here), the neighbour that
                // the host reaches with the draw or top_p moved by 1e-5 is also right.
                let mut ok = vec![want];
                for d in [-1e-5f32, 1e-5] {
                    let r = (s.r + d).clamp(0.0, 0.999_999) as f64;
                    ok.push(sample_logits(&p, &l, &mut || r));
                    let q = SamplingParams {
                        top_p: (s.top_p + d).min(1.0),
                        ..p.clone()
                    };
                    ok.push(sample_logits(&q, &l, &mut || s.r as f64));
                }
                assert!(
                    got[0] == 7 && got[2] == 8 && ok.contains(&got[1]),
                    "n {n} variant {variant}: {s:?} use_prev {use_prev}: got {got:?}, want {want} (or {ok:?})"
                );
                exact += usize::from(got[1] == want);
                checked += 1;
            }
        }
        assert_eq!(checked, 36);
        assert!(exact >= 30, "only {exact} of 36 exactly the host's token");
    }
}
