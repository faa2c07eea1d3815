//! MoE router (`shaders/router.wgsl`), DeepSeek-V3 "noaux_tc" rule.
use super::{Recorder, View};
use crate::config::Config;
use crate::gpu::{kernel_params, u, Shader, ShaderCode};
use crate::weights::{GpuWeight, WFormat};

kernel_params! {
    struct Params {
        l_off: u32,
        l_stride: u32,
        rows: u32,
        n_experts: u32,
        n_group: u32,
        topk_group: u32,
        topk: u32,
        norm: u32,
        scaling: f32,
        /// Pairs per row in idx / weights: topk, plus 1 with `extra`.
        stride: u32,
        /// 1: expert `extra_id` follows each row's picks with weight 1.
        extra: u32,
        extra_id: u32,
        /// route_gemv: x's offset, its columns, words per row of the router's weight, words
        /// from one row of x to the next.
        x_off: u32,
        k: u32,
        ws: u32,
        x_stride: u32,
    }
}

const ROUTER: Shader<Params> = Shader::new(
    "router",
    concat!(
        include_str!("../../shaders/router_pick.wgsl"),
        include_str!("../../shaders/cpu.wgsl"),
        include_str!("../../shaders/router.wgsl")
    ),
);

const ROUTER_GEMV: Shader<Params> = Shader::new(
    "router_gemv",
    concat!(
        include_str!("../../shaders/weights.wgsl"),
        include_str!("../../shaders/router_pick.wgsl"),
        include_str!("../../shaders/reduce.wgsl"),
        include_str!("../../shaders/router_gemv.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[ROUTER.code(), ROUTER_GEMV.code()];

/// A MoE layer's routing rule, from the config once ([`Routing::of`]).
#[derive(Clone, Copy, Debug)]
pub struct Routing {
    pub n_experts: u32,
    /// Groups of `n_experts / n_group` consecutive experts, of which `topk_group` are kept.
    pub n_group: u32,
    pub topk_group: u32,
    /// Experts per token.
    pub topk: u32,
    /// Divide the picked weights by their sum.
    pub norm_topk_prob: bool,
    /// Multiplies the weights (`routed_scaling_factor`).
    pub scaling: f32,
}

impl Routing {
    pub fn of(cfg: &Config) -> Routing {
        Routing {
            n_experts: cfg.n_routed_experts as u32,
            n_group: cfg.n_group as u32,
            topk_group: cfg.topk_group as u32,
            topk: cfg.num_experts_per_tok as u32,
            norm_topk_prob: cfg.norm_topk_prob,
            scaling: cfg.routed_scaling_factor,
        }
    }
}

/// For each row `t < rows` with router logits `logits[t, :n_experts]` (f32, from a matmul):
/// `s = sigmoid(logit)`; choice scores `c = s + bias` (bias f32 buffer of n_experts);
/// groups (`n_experts / n_group` consecutive experts): a group's score is the sum of its two
/// largest `c` (its largest when groups have one expert); keep the `topk_group` best groups,
/// the others' `c` become -inf; pick the `topk` largest `c` (ties: lower expert index wins);
/// weights are the unbiased `s` of the picks, divided by their sum (+1e-20) when
/// `norm_topk_prob`, times `scaling`. Writes `idx[t*stride + j]` (u32) and
/// `weights[t*stride + j]` (f32) in descending order of `c`, `stride` = `topk`; with
/// `extra` (the shared expert's id, run as one more routed expert), `stride` = `topk + 1`
/// and pair `topk` of each row is that expert with weight 1.
///
/// Ties between group scores also go to the lower group index. When `topk` exceeds the
/// experts of the kept groups, the remaining picks are masked experts in index order.
/// One workgroup per row (on CPU adapters one invocation, `route_cpu`); limits: `n_experts ≤
/// 1024`, `n_group ≤ 64`, `topk ≤ 256`.
pub fn route(
    rec: &mut Recorder,
    logits: View,
    bias: &wgpu::Buffer,
    rows: u32,
    r: &Routing,
    (idx, weights): (&wgpu::Buffer, &wgpu::Buffer),
    extra: Option<u32>,
) {
    if rows == 0 {
        return;
    }
    let (n2, mut params) = route_params(r, extra);
    params.l_off = logits.offset;
    params.l_stride = logits.stride;
    params.rows = rows;
    let gpu = rec.gpu();
    // CPU adapters: one invocation per row (`route_cpu`), CPU_WG rows a workgroup, where its
    // loops stay within lavapipe's budget.
    let (entry, groups) = if route_cpu_loops(r) <= super::CPU_LOOPS && super::cpu_kernels(gpu) {
        ("route_cpu", rows.div_ceil(super::CPU_WG))
    } else {
        ("route", rows)
    };
    let p = gpu.pipeline(&ROUTER, entry, &[("N2", u(n2))]);
    rec.dispatch(
        &p,
        &params,
        &[logits.buf, bias, idx, weights],
        gpu.grid(groups),
    );
}

/// Loop iterations of a `route_cpu` invocation: a pass over the experts per pick, the
/// weights' pass and, with groups masked, every group's score for each group's rank.
fn route_cpu_loops(r: &Routing) -> u32 {
    let grouped = r.n_group > 1 && r.topk_group < r.n_group;
    let gs = r.n_experts / r.n_group.max(1);
    let groups = if grouped {
        r.n_group * (r.n_group + 1) * (gs + 1)
    } else {
        0
    };
    r.topk * (r.n_experts + 2) + groups
}

/// The parameters every routing kernel shares, after checking the rule's limits, and N2
/// (the sort's size).
fn route_params(r: &Routing, extra: Option<u32>) -> (u32, Params) {
    let Routing {
        n_experts,
        n_group,
        topk_group,
        topk,
        norm_topk_prob,
        scaling,
    } = *r;
    assert!(
        (1..=1024).contains(&n_experts),
        "route: n_experts = {n_experts}, supported 1..=1024"
    );
    assert!(
        (1..=64).contains(&n_group) && n_experts.is_multiple_of(n_group),
        "route: n_group = {n_group} must be in 1..=64 and divide n_experts = {n_experts}"
    );
    assert!(topk_group >= 1, "route: topk_group must be at least 1");
    assert!(
        topk >= 1 && topk <= n_experts && topk <= 256,
        "route: topk = {topk} must be in 1..=min(n_experts, 256)"
    );
    let params = Params {
        l_off: 0,
        l_stride: 0,
        rows: 1,
        n_experts,
        n_group,
        topk_group,
        topk,
        norm: norm_topk_prob as u32,
        scaling,
        stride: topk + extra.is_some() as u32,
        extra: extra.is_some() as u32,
        extra_id: extra.unwrap_or(0),
        x_off: 0,
        k: 0,
        ws: 0,
        x_stride: 0,
    };
    (n_experts.next_power_of_two().max(2), params)
}

/// The most rows [`route_gemv`] routes in one dispatch (a verification of up to 7 drafts, a
/// batched step of up to 8 sequences); more take the matmul and [`route`].
pub const ROUTE_GEMV_ROWS: usize = 8;

/// Words of [`route_gemv`]'s `tally` buffer for `n_experts` experts: a block of 1 +
/// `n_experts` for each of [`ROUTE_GEMV_ROWS`] rows.
pub fn tally_words(n_experts: usize) -> usize {
    ROUTE_GEMV_ROWS * (1 + n_experts)
}

/// The router's GEMV on `t` rows of `x` (`w`: `[n_experts, k]`) and [`route`] of their
/// logits in one dispatch: workgroup (e, r) computes row r's logit of expert e, the last one
/// of a row to finish routes it (`shaders/router_gemv.wgsl`). `tally`: [`tally_words`] u32
/// words, zero before the first use (a buffer as created); each dispatch leaves it zero
/// again. Returns false, with nothing recorded, where it does not apply (more than
/// [`ROUTE_GEMV_ROWS`] rows, a quantized or split router weight, an odd number of 16-bit
/// columns): then the caller runs the matmul and [`route`].
#[allow(clippy::too_many_arguments)]
pub fn route_gemv(
    rec: &mut Recorder,
    x: View,
    t: u32,
    w: &GpuWeight,
    bias: &wgpu::Buffer,
    r: &Routing,
    (idx, weights): (&wgpu::Buffer, &wgpu::Buffer),
    extra: Option<u32>,
    tally: &wgpu::Buffer,
) -> bool {
    let WFormat::Float(d) = w.format else {
        return false;
    };
    let per_word = 4 / d.size();
    if t == 0
        || t as usize > ROUTE_GEMV_ROWS
        || w.chunks.len() != 1
        || w.rows != r.n_experts as usize
        || !w.cols.is_multiple_of(per_word)
        || tally.size() < 4 * tally_words(w.rows) as u64
    {
        return false;
    }
    let (n2, mut params) = route_params(r, extra);
    params.x_off = x.offset;
    params.x_stride = x.stride;
    params.k = w.cols as u32;
    params.ws = (w.stride / per_word) as u32;
    let gpu = rec.gpu();
    let p = gpu.pipeline(
        &ROUTER_GEMV,
        "route_gemv",
        &[("N2", u(n2)), ("W_DTYPE", u(w.format.code()))],
    );
    let [gx, gy, _] = gpu.grid(r.n_experts);
    rec.dispatch(
        &p,
        &params,
        &[x.buf, &w.chunks[0].buf, bias, idx, weights, tally],
        [gx, gy, t],
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{assert_close, gpu, Placed, Rng};
    use crate::kernels::with_cpu_kernels;

    fn sigmoid(x: f32) -> f32 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            let e = x.exp();
            e / (1.0 + e)
        }
    }

    /// transformers' DeepseekV3TopkRouter / GlmMoeDsa router for one row, with -inf group
    /// masking and ties to the lower index.
    fn route_ref(logits: &[f32], bias: &[f32], r: &Routing) -> (Vec<u32>, Vec<f32>) {
        let (n_group, topk_group, topk) =
            (r.n_group as usize, r.topk_group as usize, r.topk as usize);
        let (norm, scaling) = (r.norm_topk_prob, r.scaling);
        let n = logits.len();
        let s: Vec<f32> = logits.iter().map(|&x| sigmoid(x)).collect();
        let mut c: Vec<f32> = s.iter().zip(bias).map(|(a, b)| a + b).collect();
        if n_group > 1 && topk_group < n_group {
            let gs = n / n_group;
            let gscore: Vec<f32> = (0..n_group)
                .map(|g| {
                    let mut v = c[g * gs..(g + 1) * gs].to_vec();
                    v.sort_by(|a, b| b.partial_cmp(a).unwrap());
                    if gs > 1 {
                        v[0] + v[1]
                    } else {
                        v[0]
                    }
                })
                .collect();
            let mut order: Vec<usize> = (0..n_group).collect();
            order.sort_by(|&a, &b| gscore[b].partial_cmp(&gscore[a]).unwrap().then(a.cmp(&b)));
            for &g in &order[topk_group..] {
                for x in &mut c[g * gs..(g + 1) * gs] {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| {
            (c[b] + 0.0)
                .partial_cmp(&(c[a] + 0.0))
                .unwrap()
                .then(a.cmp(&b))
        });
        let idx: Vec<u32> = order[..topk].iter().map(|&e| e as u32).collect();
        let mut w: Vec<f32> = order[..topk].iter().map(|&e| s[e]).collect();
        if norm {
            let sum: f32 = w.iter().sum::<f32>() + 1e-20;
            for x in &mut w {
                *x /= sum;
            }
        }
        for x in &mut w {
            *x *= scaling;
        }
        (idx, w)
    }

    /// Checks `route` on `rows` rows of `n_experts` logits against [`route_ref`]; `groups`
    /// is (n_group, topk_group), `pick` (topk, norm_topk_prob, scaling).
    fn check(
        logits: &[f32],
        bias: &[f32],
        rows: usize,
        n_experts: usize,
        (n_group, topk_group): (usize, usize),
        (topk, norm, scaling): (usize, bool, f32),
    ) {
        let r = Routing {
            n_experts: n_experts as u32,
            n_group: n_group as u32,
            topk_group: topk_group as u32,
            topk: topk as u32,
            norm_topk_prob: norm,
            scaling,
        };
        let g = gpu();
        // Logit rows padded to a larger stride at an offset.
        let lb = Placed::new(g, logits, n_experts, (3, n_experts + 5), f32::NAN);
        let bbuf = g.buffer_from(bias, "bias").unwrap();
        // Without and with the shared expert appended to each row's picks, by both kinds of
        // kernels.
        let runs = [None, Some(n_experts as u32)]
            .into_iter()
            .flat_map(|e| [(e, false), (e, true)]);
        for (extra, cpu) in runs {
            let stride = topk + extra.is_some() as usize;
            let ibuf = g.buffer((rows * stride * 4) as u64, "idx").unwrap();
            let wbuf = g.buffer((rows * stride * 4) as u64, "weights").unwrap();
            let mut rec = g.recorder();
            with_cpu_kernels(cpu, || {
                let out = (&ibuf, &wbuf);
                route(&mut rec, lb.view(), &bbuf, rows as u32, &r, out, extra)
            });
            rec.finish().unwrap();
            let gi = g.read_u32(&ibuf, 0, rows * stride).unwrap();
            let gw = g.read_f32(&wbuf, 0, rows * stride).unwrap();
            for t in 0..rows {
                let (mut wi, mut ww) =
                    route_ref(&logits[t * n_experts..(t + 1) * n_experts], bias, &r);
                if let Some(e) = extra {
                    wi.push(e);
                    ww.push(1.0);
                }
                assert_eq!(
                    &gi[t * stride..(t + 1) * stride],
                    wi.as_slice(),
                    "row {t}: experts (n_group {n_group}, topk_group {topk_group}, extra {extra:?}, CPU kernel {cpu})"
                );
                assert_close(
                    &gw[t * stride..(t + 1) * stride],
                    &ww,
                    1e-6,
                    1e-5,
                    &format!("row {t} weights (extra {extra:?})"),
                );
            }
        }
    }

    #[test]
    fn router_single_group_glm() {
        let mut rng = Rng::new(21);
        let (rows, n) = (5, 256);
        let logits = rng.vec(rows * n, 4.0);
        let bias = rng.vec(n, 0.5);
        check(&logits, &bias, rows, n, (1, 1), (8, true, 2.5));
        check(&logits, &bias, rows, n, (1, 1), (8, false, 1.0));
    }

    #[test]
    fn router_groups_deepseek() {
        let mut rng = Rng::new(22);
        let (rows, n) = (4, 256);
        let logits = rng.vec(rows * n, 4.0);
        let bias = rng.vec(n, 0.5);
        check(&logits, &bias, rows, n, (8, 4), (8, true, 2.5));
        check(&logits, &bias, rows, n, (8, 4), (8, false, 2.5));
        check(&logits, &bias, rows, n, (8, 1), (8, true, 1.0)); // one group left
    }

    #[test]
    fn router_large_and_awkward() {
        let mut rng = Rng::new(23);
        // 1024 experts, 64 groups of 16, 64 picks.
        let logits = rng.vec(2 * 1024, 6.0);
        let bias = rng.vec(1024, 0.3);
        check(&logits, &bias, 2, 1024, (64, 7), (64, true, 1.5));
        // Not a power of two; groups of one expert; topk_group = n_group (no masking).
        let logits = rng.vec(3 * 40, 3.0);
        let bias = rng.vec(40, 0.2);
        check(&logits, &bias, 3, 40, (5, 2), (6, true, 2.0));
        check(&logits, &bias, 3, 40, (40, 10), (5, false, 1.0));
        check(&logits, &bias, 3, 40, (5, 5), (6, true, 1.0));
        // topk larger than the kept groups hold: masked experts follow in index order.
        check(&logits, &bias, 3, 40, (10, 1), (6, true, 1.0));
        // One expert.
        check(&logits[..1], &bias[..1], 1, 1, (1, 1), (1, true, 1.0));
    }

    #[test]
    fn router_ties() {
        let mut rng = Rng::new(24);
        // Few distinct logits and a zero bias: many exact ties among experts.
        let (rows, n) = (4, 64);
        let vals = [-1.0f32, 0.0, 0.5, 2.0];
        let logits: Vec<f32> = (0..rows * n).map(|_| vals[rng.below(4) as usize]).collect();
        let zero = vec![0.0f32; n];
        check(&logits, &zero, rows, n, (1, 1), (8, true, 2.5));
        check(&logits, &zero, rows, n, (4, 2), (8, true, 2.5));
        // Identical groups: group ties go to the lower group index.
        let g0 = rng.vec(8, 2.0);
        let logits: Vec<f32> = (0..n).map(|e| g0[e % 8]).collect();
        let bias: Vec<f32> = (0..n).map(|e| 0.1 * (e % 8) as f32).collect();
        check(&logits, &bias, 1, n, (8, 3), (8, true, 1.0));
        check(&logits, &bias, 1, n, (8, 3), (5, false, 1.0));
    }

    /// route_gemv against the CPU reference on logits x · Wᵀ computed in f64 from the
    /// weights as stored: f32, bf16 and f16 routers, GLM-5-like (no groups) and
    /// DeepSeek-like (groups) rules, awkward sizes; dispatches of 1, 3 (rows further apart
    /// than their width) and the most rows in one submission, so each later one also checks
    /// that the earlier ones left every row's tally at zero.
    #[test]
    fn route_gemv_is_router_matmul_then_route() {
        use crate::weights::DType;
        let g = gpu();
        let mut rng = Rng::new(26);
        let cases = [
            (16, 390, (1, 1), (8, true, 2.5), DType::BF16),
            (256, 576, (8, 4), (8, true, 2.5), DType::BF16),
            (40, 130, (5, 2), (6, false, 1.0), DType::F16),
            (33, 77, (1, 1), (3, true, 1.0), DType::F32),
            (300, 1030, (1, 1), (8, true, 1.5), DType::F32),
        ];
        let most = ROUTE_GEMV_ROWS;
        for (n, k, (n_group, topk_group), (topk, norm, scaling), dtype) in cases {
            let r = Routing {
                n_experts: n as u32,
                n_group: n_group as u32,
                topk_group: topk_group as u32,
                topk: topk as u32,
                norm_topk_prob: norm,
                scaling,
            };
            let wv: Vec<f32> = dtype.to_f32(&dtype.from_f32(&rng.vec(n * k, 0.1)));
            let w = GpuWeight::from_f32(g, &wv, n, k, dtype, None, "router").unwrap();
            let bias = rng.vec(n, 0.05);
            let bbuf = g.buffer_from(&bias, "bias").unwrap();
            let tally = g.buffer(4 * tally_words(n) as u64, "tally").unwrap();
            // Each dispatch's rows of x at an offset, `stride` words apart.
            let shapes = [(1, k), (3, k + 3), (most, k)];
            let total: usize = shapes.iter().map(|&(rows, stride)| rows * stride).sum();
            let xs = rng.vec(5 + total, 1.0);
            let xb = g.buffer_from(&xs, "x").unwrap();
            let extra = Some(n as u32);
            let pairs = topk + 1;
            let mut at = 5;
            let outs: Vec<_> = shapes
                .iter()
                .map(|&(rows, stride)| {
                    let ib = g.buffer((rows * pairs * 4) as u64, "idx").unwrap();
                    let wb = g.buffer((rows * pairs * 4) as u64, "weights").unwrap();
                    at += rows * stride;
                    (ib, wb, rows, stride, at - rows * stride)
                })
                .collect();
            let mut rec = g.recorder();
            for (ib, wb, rows, stride, off) in &outs {
                let x = View::new(&xb, *off as u32, *stride as u32);
                let t = *rows as u32;
                let ok = route_gemv(&mut rec, x, t, &w, &bbuf, &r, (ib, wb), extra, &tally);
                assert!(
                    ok,
                    "route_gemv applies to {rows} rows of a {dtype:?} router"
                );
            }
            let x = View::new(&xb, 0, k as u32);
            let (ib, wb, ..) = &outs[0];
            let more = route_gemv(
                &mut rec,
                x,
                most as u32 + 1,
                &w,
                &bbuf,
                &r,
                (ib, wb),
                extra,
                &tally,
            );
            assert!(!more, "route_gemv leaves {} rows to the matmul", most + 1);
            rec.finish().unwrap();
            for (ib, wb, rows, stride, off) in &outs {
                let got_i = g.read_u32(ib, 0, rows * pairs).unwrap();
                let got_w = g.read_f32(wb, 0, rows * pairs).unwrap();
                for i in 0..*rows {
                    let x = &xs[off + i * stride..][..k];
                    let logits: Vec<f32> = (0..n)
                        .map(|e| {
                            let row = &wv[e * k..][..k];
                            row.iter()
                                .zip(x)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>() as f32
                        })
                        .collect();
                    let (mut want_i, mut want_w) = route_ref(&logits, &bias, &r);
                    want_i.push(n as u32);
                    want_w.push(1.0);
                    let what = format!("route_gemv n {n} k {k} {dtype:?} row {i} of {rows}");
                    let o = i * pairs;
                    assert_eq!(&got_i[o..o + pairs], &want_i[..], "{what}: experts");
                    let w = &got_w[o..o + pairs];
                    assert_close(w, &want_w, 1e-5, 1e-4, &format!("{what}: weights"));
                }
            }
            let left = g.read_u32(&tally, 0, tally_words(n)).unwrap();
            // Each row's count returns to zero (its logits stay).
            let counts: Vec<u32> = (0..most).map(|r| left[r * (1 + n)]).collect();
            assert_eq!(counts, vec![0; most], "tally counts left at zero");
        }
    }

    #[test]
    fn router_many_rows() {
        let mut rng = Rng::new(25);
        let (rows, n) = (300, 64);
        let logits = rng.vec(rows * n, 3.0);
        let bias = rng.vec(n, 0.1);
        check(&logits, &bias, rows, n, (8, 3), (6, true, 2.5));
    }
}
