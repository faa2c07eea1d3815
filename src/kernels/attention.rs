//! Sparse MLA attention in absorbed form over the latent cache (`shaders/attention.wgsl`).
//!
//! Latent cache row `s`: `[c_kv (kv_lora) | k_pe (dr)]`. Query row `t`, head `h`:
//! `q[t, h*(dn+dr) .. ]` = `[q_nope (dn) | q_pe (dr)]` (q_pe already rotated).
//! `wkvb` is `kv_b_proj.weight`, `[heads * (dn + dv), kv_lora]`: head `h`'s rows
//! `h*(dn+dv) .. h*(dn+dv)+dn` map c_kv to k_nope, the next `dv` rows to v.
//!
//! `wkvb` must be one chunk (it is small: 64·448·512 bf16 = 29 MiB for GLM-5) in F32, BF16
//! or F16. Output buffers must not be any of the input buffers.
use super::cache::{CacheRows, LatentFormat};
use super::rope::QueryRope;
use super::topk::Selection;
use super::{matmul, Recorder, View, CPU_LOOPS, CPU_WG};
use crate::config::Config;
use crate::gpu::{kernel_params, u, Shader, ShaderCode};
use crate::knobs::knob;
use crate::weights::{DType, GpuWeight};

/// mla_combine: latent columns per workgroup (`CW` in mla.wgsl).
const COMBINE_COLS: u32 = 64;
/// Invocations per `mla` workgroup.
const WG: u32 = 256;

fn check_wkvb(what: &str, wkvb: &GpuWeight, heads: u32, dn: u32, dv: u32) {
    assert_eq!(
        wkvb.chunks.len(),
        1,
        "{what}: kv_b weight must be a single chunk ({} chunks of a {}×{} matrix; it exceeds one storage binding)",
        wkvb.chunks.len(),
        wkvb.rows,
        wkvb.cols
    );
    assert_eq!(
        wkvb.rows,
        (heads * (dn + dv)) as usize,
        "{what}: kv_b weight has {} rows, expected heads {heads} × (dn {dn} + dv {dv})",
        wkvb.rows
    );
}

fn grid_count(what: &str, n: u64) -> u32 {
    assert!(n <= u32::MAX as u64, "{what}: too many workgroups");
    n as u32
}

/// MLA's shapes, from the config once ([`MlaDims::of`]): each of `heads` query/key heads
/// has `dn` dims without RoPE and `dr` with it, each value head `dv`; a latent cache row is
/// `kv_lora` values of `c_kv` then `dr` of `k_pe`; `scale` is the softmax scale.
#[derive(Clone, Copy, Debug)]
pub struct MlaDims {
    pub heads: u32,
    pub dn: u32,
    pub dr: u32,
    pub dv: u32,
    pub kv_lora: u32,
    pub scale: f32,
}

impl MlaDims {
    pub fn of(cfg: &Config) -> MlaDims {
        MlaDims {
            heads: cfg.num_attention_heads as u32,
            dn: cfg.qk_nope_head_dim as u32,
            dr: cfg.qk_rope_head_dim as u32,
            dv: cfg.v_head_dim as u32,
            kv_lora: cfg.kv_lora_rank as u32,
            scale: cfg.softmax_scale(),
        }
    }
}

/// The queries of a chunk's `rows` rows as [`sparse_mla`] reads them: `absorbed`
/// (`[rows, heads * kv_lora]`, from [`absorb_q`]) scores the latent `c_kv`, and the RoPE
/// part of `q` (`q[t, h*(dn+dr)+dn ..]`) scores `k_pe`: rotated already, or by the kernel
/// as it reads it where `rope` is given (its slice must be those dims).
#[derive(Clone, Copy)]
pub struct MlaQueries<'a> {
    pub absorbed: View<'a>,
    pub q: View<'a>,
    pub rows: u32,
    pub rope: Option<QueryRope<'a>>,
}

/// `q_abs[t, h*kv_lora + c] = Σ_{d<dn} q[t, h*(dn+dr) + d] · wkvb[h*(dn+dv) + d, c]`:
/// kv_b's k_nope rows of each head, transposed ([`matmul::matmul_heads_t`]: a per-head GEMV
/// at decode and verification, the per-head GEMM at a prefill chunk's rows).
pub fn absorb_q(
    rec: &mut Recorder,
    q: View,
    wkvb: &GpuWeight,
    q_abs: View,
    rows: u32,
    d: &MlaDims,
) {
    let MlaDims {
        heads, dn, dr, dv, ..
    } = *d;
    check_wkvb("absorb_q", wkvb, heads, dn, dv);
    let h = matmul::Heads {
        x: q,
        head_stride: dn + dr,
        heads,
        win: matmul::Window { first: 0, n: dn },
        y: q_abs,
        y_head: wkvb.cols as u32,
        rows,
    };
    matmul::matmul_heads_t(rec, wkvb, &h);
}

kernel_params! {
    struct MlaParams {
        /// Q_abs view.
        qa_off: u32,
        qa_stride: u32,
        /// Q view (q_pe = columns h*(dn+dr)+dn ..)
        q_off: u32,
        q_stride: u32,
        /// Cache view.
        c_off: u32,
        c_stride: u32,
        /// O_lat view.
        o_off: u32,
        o_stride: u32,
        rows: u32,
        heads: u32,
        dn: u32,
        dr: u32,
        kv_lora: u32,
        /// Idx row stride (capacity)
        topk: u32,
        splits: u32,
        /// Positions per split (a multiple of PT)
        split_len: u32,
        scale: f32,
        hgroups: u32,
        /// The segment this dispatch reads: positions seg_lo .. seg_lo + seg_n.
        seg_lo: u32,
        seg_n: u32,
        /// Partials written: split_base + split of part_splits (1: normalized output).
        split_base: u32,
        part_splits: u32,
        /// RoPE on q_pe as it is read: 0 = none, 1 = half-split, 2 = interleaved.
        rope: u32,
        /// mla_qcat, mla_softmax: the chunk row of the block's first query row.
        row0: u32,
    }
}

const MLA: Shader<MlaParams> = Shader::new(
    "mla",
    concat!(
        include_str!("../../shaders/fp8.wgsl"),
        include_str!("../../shaders/rotary.wgsl"),
        include_str!("../../shaders/cpu.wgsl"),
        include_str!("../../shaders/mla.wgsl")
    ),
);

/// MLA with `mla_cpu_sg`, which shares the selected rows through subgroups (its own module,
/// so adapters without subgroups still compile the others).
const MLA_SG: Shader<MlaParams> = Shader::new(
    "mla_sg",
    concat!(
        include_str!("../../shaders/fp8.wgsl"),
        include_str!("../../shaders/rotary.wgsl"),
        include_str!("../../shaders/cpu.wgsl"),
        include_str!("../../shaders/mla.wgsl"),
        include_str!("../../shaders/mla_cpu_sg.wgsl")
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[MLA.code(), MLA_SG.code()];

/// Most 4-float words of a cache row (`qd4`) for which `mla_cpu_sg` runs: each invocation
/// holds its row, the row it takes from a lane, its query and its sums in registers, four
/// arrays of `qd4` words (the built-in model's rows are 20 words; GLM-5's 144 would spill
/// them, and llvmpipe compiles such a variant slowly).
const MLA_CPU_SG_MAX_QD4: u32 = 32;

/// Whether a CPU adapter's sparse MLA takes `mla_cpu_sg` on a device whose subgroups have
/// at least `subgroup_lanes` lanes (0: none), for rows of `qd4` words: where a subgroup
/// holds a whole workgroup of [`CPU_WG`] invocations and a row fits
/// [`MLA_CPU_SG_MAX_QD4`], unless `SPARSA_MLA_CPU_SG=0` (a measurement aid).
fn mla_cpu_sg(subgroup_lanes: u32, qd4: u32) -> bool {
    let fits = subgroup_lanes >= CPU_WG && qd4 <= MLA_CPU_SG_MAX_QD4;
    if let Some(on) = super::forced_mla_cpu_sg() {
        return on && fits;
    }
    fits && knob!("SPARSA_MLA_CPU_SG", |v| v <= 1) != Some(0)
}

/// Workgroups `sparse_mla` aims for before it splits the selected positions. Measured on
/// the H200 (full-depth GLM-5, a 4-position verification at 4K): 1,024 → 256 took `mla`
/// 12.1 → 11.5 ms and `mla_combine` 1.14 → 1.06 ms (fewer, longer splits: each workgroup
/// loads its queries and writes its partial sums once for more positions); 128 gave 11.9.
const MLA_TARGET_GROUPS: u32 = 256;
/// Most splits of one (row, head); `mla_combine`'s workgroup array holds a weight each.
const MLA_MAX_SPLITS: u32 = 1024;

/// Tile positions of `mla.wgsl` (its `PT`).
const MLA_TILE: u32 = 64;

/// The positions per split for `mla_cpu` at `n_max` selected positions: about `n_max /
/// splits`, fewer where an invocation would pass [`CPU_LOOPS`] (its loops run 1 +
/// `qd4` + `kv_lora / 4` times per position, at most 3 `qd4` more around them). None where the
/// kernel does not apply: `kv_lora` not a multiple of 4, or more splits than the partials
/// hold with `nseg` cache segments.
fn mla_cpu_split_len(n_max: u32, kv_lora: u32, qd4: u32, splits: u32, nseg: u32) -> Option<u32> {
    if !kv_lora.is_multiple_of(4) {
        return None;
    }
    let per_pos = 1 + qd4 + kv_lora / 4;
    let most = CPU_LOOPS.checked_sub(3 * qd4)? / per_pos;
    let len = n_max.div_ceil(splits.max(1)).min(most);
    (len >= 1 && n_max.div_ceil(len) <= MLA_MAX_SPLITS / nseg).then_some(len)
}

/// How [`sparse_mla`] runs: the most heads per workgroup, and the workgroups it aims
/// for before it splits the selected positions (1: one split, every tile of a row in one
/// workgroup).
#[derive(Clone, Copy, Debug)]
pub struct MlaPlan {
    head_cap: u32,
    target_groups: u32,
    gemm: MlaGemmUse,
    /// The most query rows a block of [`sparse_mla_gemm`] takes (0: as many as
    /// [`MLA_GEMM_LOGIT_BYTES`] hold).
    gemm_rows: u32,
    /// Query rows × splits of the selected positions that [`sparse_mla_gemm`]'s values
    /// product aims for ([`MLA_VALUE_SPLIT_ROWS`]; 1: never split).
    gemm_split: u32,
    /// Splits of each row's selected positions for `mla_cpu` (CPU adapters): 1, a row's
    /// heads are invocations enough for a decode step (splits cost an `mla_combine`, whose
    /// barriers cost more than they spread on lavapipe). `SPARSA_MLA_CPU_SPLITS` overrides.
    cpu_splits: u32,
    /// Each row's selection is its sequence's positions from the first, in order, and the
    /// rows are consecutive positions of one sequence (`topk::select_all` over a plain
    /// chunk): [`sparse_mla_gemm`]'s logits may then tile rows in pairs ([`mla_pairs`]).
    prefix: bool,
}

/// When [`sparse_mla`] runs its two products as GEMMs on the matmul tile
/// ([`sparse_mla_gemm`]) instead of `mla.wgsl`'s kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MlaGemmUse {
    Never,
    /// Where the tile runs on tensor cores.
    TensorCores,
    /// On any device (the tests: lavapipe has no tensor cores).
    Always,
}

impl MlaPlan {
    /// The plan for `rows` query rows: at most 8 heads per workgroup up to
    /// [`matmul::GEMV_MAX_ROWS`] rows (a decode step or a verification: twice the
    /// workgroups of 16 heads; on the H200 a full-depth GLM-5 decode step's `mla` 4.37 →
    /// 3.60 ms, a 4-position verification's 11.5 → 11.1 ms), 16 at a prefill's many rows
    /// (4-layer GLM-5 at 2,048 / 8,192 tokens: 115 / 784 ms with 16, 130 / 883 with 8, 162 /
    /// 1,121 with 4; each selected row is read once per head group).
    /// A prefill's rows run as GEMMs on tensor cores ([`sparse_mla_gemm`]) for models of
    /// at least [`MLA_GEMM_MIN_HEADS`] heads.
    /// Several rows (a batched step's, a verification's) take them too; one decode row does
    /// not (on the H200 at full depth, 2026-12-05: an 8-row step 79.7 → 69.1 ms and a
    /// 4-position verification 49.0 → 44.6 ms with them, a one-row step 22.75 → 25.0 ms).
    /// SPARSA_MLA_HG (1, 2, 4, 8 or 16), SPARSA_MLA_GROUPS and SPARSA_MLA_GEMM (0: never,
    /// 1: on tensor cores at several rows, 2: at several rows on any device, 3: on
    /// tensor cores at every row count) override them (measurement knobs).
    pub fn for_rows(rows: u32) -> MlaPlan {
        let cap = knob!("SPARSA_MLA_HG", |v| v.is_power_of_two() && v <= 16);
        let groups = knob!("SPARSA_MLA_GROUPS", |v| v >= 1);
        let few = rows <= matmul::GEMV_MAX_ROWS;
        let gemm = match knob!("SPARSA_MLA_GEMM", |v| v <= 3) {
            // 3: on tensor cores at a decode step's row too.
            Some(3) => MlaGemmUse::TensorCores,
            _ if rows == 1 => MlaGemmUse::Never,
            Some(0) => MlaGemmUse::Never,
            Some(2) => MlaGemmUse::Always,
            _ => MlaGemmUse::TensorCores,
        };
        MlaPlan {
            head_cap: cap.unwrap_or(if few { 8 } else { 16 }),
            target_groups: groups.unwrap_or(MLA_TARGET_GROUPS),
            gemm,
            gemm_rows: 0,
            gemm_split: MLA_VALUE_SPLIT_ROWS,
            cpu_splits: knob!("SPARSA_MLA_CPU_SPLITS", |v| v >= 1).unwrap_or(1),
            prefix: false,
        }
    }

    /// This plan for selections that are each row's positions from the first, in order,
    /// over consecutive positions of one sequence (`prefix`, [`MlaPlan::prefix`]).
    pub const fn with_prefix(self, prefix: bool) -> MlaPlan {
        MlaPlan { prefix, ..self }
    }

    /// This plan with `mla_cpu`'s positions in `splits` splits (CPU adapters).
    pub const fn with_cpu_splits(self, splits: u32) -> MlaPlan {
        MlaPlan {
            cpu_splits: splits,
            ..self
        }
    }

    /// This plan with the GEMMs used as `gemm` says (and blocks of at most `rows` query
    /// rows; 0: as many as fit).
    pub const fn with_gemm(self, gemm: MlaGemmUse, rows: u32) -> MlaPlan {
        MlaPlan {
            gemm,
            gemm_rows: rows,
            ..self
        }
    }

    /// This plan with the GEMMs' values product split to about `rows` query rows × splits
    /// (1: never split).
    pub const fn with_value_splits(self, rows: u32) -> MlaPlan {
        MlaPlan {
            gemm_split: rows,
            ..self
        }
    }
}

/// `mla.wgsl`'s shape for a model: heads per workgroup, vec4s per query, value columns per
/// invocation.
#[derive(Clone, Copy, Debug, PartialEq)]
struct MlaShape {
    hg: u32,
    qd4: u32,
    nc: u32,
}

impl MlaShape {
    /// The most heads per workgroup (≤ `cap`, a power of two ≤ heads) whose queries and
    /// logit tile fit in the adapter's workgroup memory.
    fn new(heads: u32, kv_lora: u32, dr: u32, wg_bytes: u32, cap: u32) -> MlaShape {
        let qd4 = (kv_lora + dr).div_ceil(4);
        let mut hg = cap.min(1 << (31 - heads.max(1).leading_zeros()));
        // queries + logit tile + positions and softmax state.
        while hg > 1 && hg * qd4 * 16 + hg * MLA_TILE * 4 + 1024 > wg_bytes {
            hg /= 2;
        }
        MlaShape {
            hg,
            qd4,
            nc: kv_lora.div_ceil(WG),
        }
    }

    fn defines(&self, format: LatentFormat) -> [(&'static str, String); 5] {
        [
            ("HG", u(self.hg)),
            ("QD4", u(self.qd4)),
            ("NC", u(self.nc)),
            ("MAXS", u(MLA_MAX_SPLITS)),
            ("LFMT", u(format as u32)),
        ]
    }
}

/// For each `t < rows`, `h < heads`, over the selected positions `s = idx[t*k + j]`,
/// `j < cnt[t]` of `sel`:
/// `logit_j = (q_abs[t,h,:] · cache[s, :kv_lora] + q_pe[t,h,:] · cache[s, kv_lora..kv_lora+dr]) · scale`,
/// `o_lat[t, h*kv_lora + c] = Σ_j softmax(logit)_j · cache[s, c]` (online softmax, any count).
///
/// `cnt[t]` is clamped to `k`; a row with no selected position gets zeros. Only the
/// cache rows named by `idx` are read, each once per group of heads (`mla.wgsl`), decoded
/// from the cache's format. `max_count` bounds `cnt` (e.g. `min(k, keys cached)`): it sizes
/// the split of the positions across workgroups, which a decode step needs to fill the GPU.
/// Every selected position must lie in one of `cache`'s segments; each segment is read by a
/// dispatch of its own, and split or segmented partial results go to a scratch buffer that
/// the device keeps between calls, merged by `mla_combine`. `plan` sets the heads per
/// workgroup and the split ([`MlaPlan::for_rows`]).
#[allow(clippy::too_many_arguments)]
pub fn sparse_mla(
    rec: &mut Recorder,
    qs: &MlaQueries,
    cache: &CacheRows<LatentFormat>,
    sel: &Selection,
    max_count: u32,
    o_lat: View,
    d: &MlaDims,
    MlaPlan {
        head_cap,
        target_groups,
        gemm,
        gemm_rows,
        gemm_split,
        cpu_splits,
        prefix,
    }: MlaPlan,
) {
    let MlaQueries {
        absorbed: q_abs,
        q,
        rows,
        rope,
    } = *qs;
    let MlaDims {
        heads,
        dn,
        dr,
        kv_lora,
        scale,
        ..
    } = *d;
    let (idx, cnt, topk) = (sel.idx, sel.cnt, sel.k);
    if rows == 0 || heads == 0 {
        return;
    }
    if let Some(r) = &rope {
        let s = &r.slice;
        assert!(
            s.heads == heads && s.head_stride == dn + dr && s.rot_off == dn && s.rot_dim == dr,
            "sparse_mla: it rotates q_pe (dims {dn}.. of each head, {dr} of them) only, not {s:?}"
        );
    }
    let cs = rope.map_or(rec.gpu().dummy(), |r| r.cos_sin);
    let nseg = cache.segs.len() as u32;
    assert!(
        (1..=MLA_MAX_SPLITS).contains(&nseg),
        "sparse_mla: {nseg} cache segments, supported 1..={MLA_MAX_SPLITS}"
    );
    let gpu = rec.gpu();
    let sh = MlaShape::new(
        heads,
        kv_lora,
        dr,
        gpu.limits.max_compute_workgroup_storage_size,
        head_cap,
    );
    let hgroups = heads.div_ceil(sh.hg);
    let n_max = max_count.min(topk).max(1);
    let as_gemm = match gemm {
        MlaGemmUse::Never => false,
        MlaGemmUse::TensorCores => gpu.tensor_cores() && heads >= MLA_GEMM_MIN_HEADS,
        MlaGemmUse::Always => true,
    };
    // Blocks of a few rows (a dense model's long selections) would be dispatches by the
    // thousand: those keep the kernel.
    let enough = GemmBlock::new(d, rows, n_max, 0, 1).rows >= rows.min(MLA_GEMM_MIN_ROWS);
    if as_gemm && enough && cache.format != LatentFormat::Fp8 {
        let block = (n_max, gemm_rows, gemm_split);
        sparse_mla_gemm(rec, qs, cache, (sel, prefix), block, o_lat, d, &sh);
        return;
    }
    // CPU adapters: a workgroup per (row, split, CPU_WG heads), an invocation per head, each
    // split short enough for lavapipe's loop limit (see CPU_LOOPS).
    let cpu_len = mla_cpu_split_len(n_max, kv_lora, sh.qd4, cpu_splits, nseg);
    let cpu = super::cpu_kernels(gpu) && cpu_len.is_some();
    // The splits, their length and the workgroups of a segment's dispatch.
    let (splits, split_len, workgroups) = if let Some(len) = cpu_len.filter(|_| cpu) {
        let splits = n_max.div_ceil(len);
        // A workgroup per (row, split, CPU_WG heads).
        let groups = rows as u64 * splits as u64 * heads.div_ceil(CPU_WG) as u64;
        (splits, len, groups)
    } else {
        let groups = rows as u64 * hgroups as u64;
        let want =
            (target_groups as u64 / groups.max(1)).min((MLA_MAX_SPLITS / nseg) as u64) as u32;
        let (splits, len) = if want <= 1 {
            (1, n_max.div_ceil(MLA_TILE) * MLA_TILE)
        } else {
            let len = n_max.div_ceil(want).div_ceil(MLA_TILE) * MLA_TILE;
            (n_max.div_ceil(len), len)
        };
        (splits, len, groups * splits as u64)
    };
    let part_splits = splits * nseg;
    let defines = sh.defines(cache.format);
    let p = if cpu && mla_cpu_sg(gpu.subgroup_lanes(), sh.qd4) {
        gpu.pipeline(&MLA_SG, "mla_cpu_sg", &defines)
    } else {
        gpu.pipeline(&MLA, if cpu { "mla_cpu" } else { "mla" }, &defines)
    };
    let params = MlaParams {
        qa_off: q_abs.offset,
        qa_stride: q_abs.stride,
        q_off: q.offset,
        q_stride: q.stride,
        c_off: 0,
        c_stride: cache.row_words,
        o_off: o_lat.offset,
        o_stride: o_lat.stride,
        rows,
        heads,
        dn,
        dr,
        kv_lora,
        topk,
        splits,
        split_len,
        scale,
        hgroups,
        seg_lo: 0,
        seg_n: cache.segs[0].len,
        split_base: 0,
        part_splits,
        rope: QueryRope::mode(qs.rope.as_ref()),
        row0: 0,
    };
    let row_bytes = 4 * cache.row_words as u64;
    let flops = 2 * rows as u64 * heads as u64 * n_max as u64 * (2 * kv_lora + dr) as u64;
    let n = grid_count("sparse_mla", workgroups);
    // Taken by the next dispatch: with several segments, the first one's (the selected rows
    // are spread over them).
    rec.cost(rows as u64 * n_max as u64 * row_bytes, flops, "");
    if part_splits == 1 {
        rec.dispatch(
            &p,
            &params,
            &[
                o_lat.buf,
                q_abs.buf,
                q.buf,
                cs,
                &cache.segs[0].buf,
                idx,
                cnt,
            ],
            gpu.grid(n),
        );
        return;
    }
    let part_bytes = 4 * rows as u64 * heads as u64 * part_splits as u64 * (kv_lora + 2) as u64;
    let part = match gpu.scratch("mla partials", part_bytes) {
        Ok(b) => b,
        Err(e) => {
            gpu.report_error(e.to_string());
            return;
        }
    };
    for (k, seg) in cache.segs.iter().enumerate() {
        let k = k as u32;
        let params = MlaParams {
            seg_lo: seg.lo,
            seg_n: seg.len,
            split_base: k * splits,
            ..params
        };
        rec.dispatch(
            &p,
            &params,
            &[&part, q_abs.buf, q.buf, cs, &seg.buf, idx, cnt],
            gpu.grid(n),
        );
    }
    let pc = gpu.pipeline(&MLA, "mla_combine", &defines);
    rec.cost(part_bytes, 0, "");
    rec.dispatch(
        &pc,
        &params,
        &[o_lat.buf, &part],
        gpu.grid(grid_count(
            "mla_combine",
            rows as u64 * heads as u64 * kv_lora.div_ceil(COMBINE_COLS) as u64,
        )),
    );
}

/// Most bytes of logits [`sparse_mla_gemm`] holds at once: the query rows of a chunk go
/// in blocks of as many rows as fit.
const MLA_GEMM_LOGIT_BYTES: u64 = 64 << 20;
/// The fewest heads a model has for [`sparse_mla`] to take the GEMMs on tensor cores: a
/// query row's heads are the rows of its 64-row tiles, so with fewer most of each tile is
/// padding (the golden models have 3 or 4, GLM-5 64, DeepSeek-V3.2 128).
pub const MLA_GEMM_MIN_HEADS: u32 = 16;
/// The fewest query rows a block of [`sparse_mla_gemm`] may take (fewer rows than that in
/// all are one block).
const MLA_GEMM_MIN_ROWS: u32 = 16;
/// Query rows × splits of the selected positions that [`sparse_mla_gemm`]'s values product
/// aims for: unsplit, a decode step's or a verification's few rows would be `kv_lora / TN`
/// workgroups a row, each over every selected position (GLM-5: 8 per row, 32 K-steps each);
/// split, 8 rows take 4 splits and 4 rows 8 (about 256 workgroups for GLM-5). A prefill
/// block's 32 or more rows are not split.
const MLA_VALUE_SPLIT_ROWS: u32 = 32;

/// The blocks [`sparse_mla_gemm`] runs: query rows at a time, the queries' row stride and
/// the logits' (selected positions rounded up to 64).
struct GemmBlock {
    rows: u32,
    q_stride: u32,
    n: u32,
    /// Splits of the positions in the values product (`n` is a multiple of 64 of them).
    splits: u32,
}

impl GemmBlock {
    /// Blocks for `rows` query rows of at most `n_max` positions (at most `most_rows`
    /// a block, 0: as many as fit), the values product split to about `split_rows` rows ×
    /// splits.
    fn new(d: &MlaDims, rows: u32, n_max: u32, most_rows: u32, split_rows: u32) -> GemmBlock {
        let n = n_max.next_multiple_of(64);
        let fit = MLA_GEMM_LOGIT_BYTES / Self::logit_bytes(d, 1, n);
        let mut block = fit.clamp(1, rows.max(1) as u64) as u32;
        if most_rows > 0 {
            block = block.min(most_rows);
        }
        let splits = (split_rows / block).clamp(1, n / 64);
        GemmBlock {
            rows: block,
            q_stride: (d.kv_lora + d.dr).next_multiple_of(4),
            n: n.next_multiple_of(64 * splits),
            splits,
        }
    }

    /// The values product's partial sums, where it is split.
    fn part_bytes(&self, d: &MlaDims) -> u64 {
        if self.splits == 1 {
            return 0;
        }
        4 * (self.splits * self.rows) as u64 * d.heads as u64 * d.kv_lora as u64
    }

    fn query_bytes(d: &MlaDims, rows: u32) -> u64 {
        4 * rows as u64 * d.heads as u64 * (d.kv_lora + d.dr).next_multiple_of(4) as u64
    }

    fn logit_bytes(d: &MlaDims, rows: u32, n: u32) -> u64 {
        4 * rows as u64 * d.heads as u64 * n as u64
    }
}

/// The device scratch [`sparse_mla`] takes at most for chunks of `rows` query rows and up
/// to `topk` selected positions a row (the GEMMs' queries and logits), for memory plans:
/// none for models with fewer than [`MLA_GEMM_MIN_HEADS`] heads, which keep the kernel.
pub fn gemm_scratch_bytes(d: &MlaDims, rows: u32, topk: u32) -> u64 {
    if d.heads < MLA_GEMM_MIN_HEADS {
        return 0;
    }
    let b = GemmBlock::new(d, rows, topk, 0, MLA_VALUE_SPLIT_ROWS);
    // Blocks under MLA_VALUE_SPLIT_ROWS rows split the values product: their parts hold at
    // most that many rows' sums (splits × rows), which 1, 2, 4 or 8 rows reach.
    let parts = (1..=matmul::GEMV_MAX_ROWS)
        .map(|r| GemmBlock::new(d, r, topk, 0, MLA_VALUE_SPLIT_ROWS).part_bytes(d))
        .max()
        .unwrap_or(0);
    GemmBlock::query_bytes(d, b.rows) + GemmBlock::logit_bytes(d, b.rows, b.n) + parts
}

/// [`sparse_mla`] as GEMMs on the matmul tile (on tensor cores where the device has them),
/// for blocks of query rows in turn: `mla_qcat` writes the block's queries as rows of
/// `kv_lora + dr` (RoPE applied), `mla_logits` multiplies them by each row's selected cache
/// rows (a GEMM per query row: its heads × its positions), `mla_softmax` turns the logits
/// into probabilities, and `mla_values` multiplies those by the same rows' latents.
/// Each segment of the cache is read by dispatches of its own; its values are added up.
/// f32 and bf16 caches (the tile's weight formats).
#[allow(clippy::too_many_arguments)]
fn sparse_mla_gemm(
    rec: &mut Recorder,
    qs: &MlaQueries,
    cache: &CacheRows<LatentFormat>,
    (sel, prefix): (&Selection, bool),
    (n_max, most_rows, split_rows): (u32, u32, u32),
    o_lat: View,
    d: &MlaDims,
    sh: &MlaShape,
) {
    let MlaDims {
        heads,
        dn,
        dr,
        kv_lora,
        scale,
        ..
    } = *d;
    let rows = qs.rows;
    let (format, row_elems) = match cache.format {
        LatentFormat::F32 => (DType::F32, cache.row_words),
        LatentFormat::Bf16 => (DType::BF16, 2 * cache.row_words),
        LatentFormat::Fp8 => unreachable!("sparse_mla_gemm: FP8 rows are not a tile format"),
    };
    let qd = kv_lora + dr;
    let b = GemmBlock::new(d, rows, n_max, most_rows, split_rows);
    let GemmBlock {
        rows: block,
        q_stride,
        n,
        splits,
    } = b;
    let gpu = rec.gpu();
    let bufs = gpu
        .scratch("mla queries", GemmBlock::query_bytes(d, block))
        .and_then(|q| {
            Ok((
                q,
                gpu.scratch("mla logits", GemmBlock::logit_bytes(d, block, n))?,
                match splits {
                    1 => None,
                    _ => Some(gpu.scratch("mla value parts", b.part_bytes(d))?),
                },
            ))
        });
    let (qbuf, sbuf, parts) = match bufs {
        Ok(b) => b,
        Err(e) => {
            gpu.report_error(e.to_string());
            return;
        }
    };
    let defines = sh.defines(cache.format);
    let qcat = gpu.pipeline(&MLA, "mla_qcat", &defines);
    let softmax = gpu.pipeline(&MLA, "mla_softmax", &defines);
    let sum = gpu.pipeline(&MLA, "mla_sum", &defines);
    let cs = qs.rope.map_or(gpu.dummy(), |r| r.cos_sin);
    for row0 in (0..rows).step_by(block as usize) {
        let br = block.min(rows - row0);
        let params = MlaParams {
            qa_off: qs.absorbed.offset,
            qa_stride: qs.absorbed.stride,
            q_off: qs.q.offset,
            q_stride: qs.q.stride,
            o_stride: q_stride,
            rows: br,
            heads,
            dn,
            dr,
            kv_lora,
            topk: sel.k,
            split_len: n,
            scale,
            rope: QueryRope::mode(qs.rope.as_ref()),
            row0,
            ..MlaParams::default()
        };
        let elems = br as u64 * heads as u64 * qd as u64;
        let grid = gpu.grid(grid_count("mla_qcat", elems.div_ceil(WG as u64)));
        rec.cost(8 * elems, 0, "");
        rec.dispatch(
            &qcat,
            &params,
            &[&qbuf, qs.absorbed.buf, qs.q.buf, cs],
            grid,
        );
        let g = matmul::MlaGemm {
            rows: br,
            row0,
            heads,
            idx: sel.idx,
            cnt: sel.cnt,
            topk: sel.k,
            format,
            row_elems,
            group: 1,
        };
        let logits = View::new(&sbuf, 0, n);
        let queries = View::new(&qbuf, 0, q_stride);
        // Rows in pairs where their selections allow it: the pair's query rows are
        // consecutive in the block's query buffer, so they are one row of twice the heads.
        let pairs = prefix && br.is_multiple_of(2) && mla_pairs();
        let paired = matmul::MlaGemm {
            rows: br / 2,
            heads: 2 * heads,
            group: 2,
            ..g
        };
        let gl = if pairs { &paired } else { &g };
        for (k, seg) in cache.segs.iter().enumerate() {
            matmul::mla_logits(rec, gl, queries, qd, seg, logits, n, k == 0);
        }
        let o_stride = n;
        let params = MlaParams { o_stride, ..params };
        let grid = gpu.grid(grid_count("mla_softmax", br as u64 * heads as u64));
        rec.cost(8 * br as u64 * heads as u64 * n as u64, 0, "");
        rec.dispatch(&softmax, &params, &[&sbuf, sel.cnt], grid);
        let o = View::new(o_lat.buf, o_lat.offset + row0 * o_lat.stride, o_lat.stride);
        // Split (few rows): each split of the positions sums into a part of its own, and
        // mla_sum adds the parts up (in split order); else the sums go to o.
        let hk = heads * kv_lora;
        let (dst, y_split) = match &parts {
            Some(p) => (View::new(p, 0, hk), br * hk),
            None => (o, 0),
        };
        for (k, seg) in cache.segs.iter().enumerate() {
            let split = (splits, y_split);
            matmul::mla_values(rec, &g, logits, n, seg, dst, kv_lora, k > 0, split);
        }
        let Some(parts) = &parts else {
            continue;
        };
        let params = MlaParams {
            o_off: o.offset,
            o_stride: o.stride,
            splits,
            ..params
        };
        let elems = br as u64 * hk as u64;
        rec.cost(4 * elems * (splits as u64 + 1), elems * splits as u64, "");
        let grid = gpu.grid(grid_count("mla_sum", elems.div_ceil(WG as u64)));
        rec.dispatch(&sum, &params, &[o.buf, parts], grid);
    }
}

/// Whether [`sparse_mla_gemm`]'s logits tile query rows in pairs where every row's
/// selection is its positions from the first, in order ([`MlaPlan::prefix`]: a prompt's
/// chunks while the whole context fits the top-k): a pair's rows are one tile row of twice
/// the heads over the later row's selection, the earlier row's logits past its own count
/// left unwritten (its softmax and values stop at its count, and column j is position j in
/// both lists). On tensor cores with the attention's f16 operands such a tile takes 128
/// rows (two queries of GLM-5's 64 heads), so each staged cache row feeds twice the
/// products. `SPARSA_MLA_PAIRS=1` turns it on (a measurement aid; off until measured).
fn mla_pairs() -> bool {
    #[cfg(test)]
    if let Some(on) = MLA_PAIRS.with(|c| c.get()) {
        return on;
    }
    knob!("SPARSA_MLA_PAIRS", |v| v <= 1) == Some(1)
}

#[cfg(test)]
thread_local! {
    /// What `SPARSA_MLA_PAIRS` answers on this thread ([`mla_pairs`]).
    static MLA_PAIRS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// `o[t, h*dv + v] = Σ_c wkvb[h*(dn+dv) + dn + v, c] · o_lat[t, h*kv_lora + c]`: kv_b's
/// value rows of each head ([`matmul::matmul_heads`]: a per-head GEMV at decode and
/// verification, the per-head GEMM at a prefill chunk's rows).
pub fn up_v(rec: &mut Recorder, o_lat: View, wkvb: &GpuWeight, o: View, rows: u32, d: &MlaDims) {
    let MlaDims {
        heads,
        dn,
        dv,
        kv_lora,
        ..
    } = *d;
    check_wkvb("up_v", wkvb, heads, dn, dv);
    let h = matmul::Heads {
        x: o_lat,
        head_stride: kv_lora,
        heads,
        win: matmul::Window { first: dn, n: dv },
        y: o,
        y_head: dv,
        rows,
    };
    matmul::matmul_heads(rec, wkvb, &h);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cache::{decode_latent, encode_latent, Segment};
    use crate::kernels::matmul::{gemm_x_f16, whole_words, GEMV_MAX_ROWS};
    use crate::kernels::rope::{rope_ref, RopeSlice};
    use crate::kernels::testutil::{
        abs_dot, assert_close, assert_close_plus, cache_segments, gpu, x_f16_bound, x_split_bound,
        Placed, Rng,
    };
    use crate::kernels::{with_cpu_kernels, with_mla_cpu_sg};
    use crate::weights::{DType, WFormat};

    fn abs(v: &[f32]) -> Vec<f32> {
        v.iter().map(|x| x.abs()).collect()
    }

    /// The weight as the GPU sees it (rounded to `dtype`).
    fn rounded(w: &[f32], dtype: DType) -> Vec<f32> {
        dtype.to_f32(&dtype.from_f32(w))
    }

    struct Dims {
        heads: usize,
        dn: usize,
        dr: usize,
        dv: usize,
        kv: usize,
    }

    impl Dims {
        /// The kernels' dims, with softmax scale `scale`.
        fn mla(&self, scale: f32) -> MlaDims {
            MlaDims {
                heads: self.heads as u32,
                dn: self.dn as u32,
                dr: self.dr as u32,
                dv: self.dv as u32,
                kv_lora: self.kv as u32,
                scale,
            }
        }
    }

    fn absorb_ref(q: &[f32], w: &[f32], rows: usize, d: &Dims) -> Vec<f32> {
        let mut out = vec![0f32; rows * d.heads * d.kv];
        for t in 0..rows {
            for h in 0..d.heads {
                for c in 0..d.kv {
                    let mut s = 0f64;
                    for i in 0..d.dn {
                        s += q[t * d.heads * (d.dn + d.dr) + h * (d.dn + d.dr) + i] as f64
                            * w[(h * (d.dn + d.dv) + i) * d.kv + c] as f64;
                    }
                    out[(t * d.heads + h) * d.kv + c] = s as f32;
                }
            }
        }
        out
    }

    fn up_v_ref(ol: &[f32], w: &[f32], rows: usize, d: &Dims) -> Vec<f32> {
        let mut out = vec![0f32; rows * d.heads * d.dv];
        for t in 0..rows {
            for h in 0..d.heads {
                for v in 0..d.dv {
                    let mut s = 0f64;
                    for c in 0..d.kv {
                        s += w[(h * (d.dn + d.dv) + d.dn + v) * d.kv + c] as f64
                            * ol[(t * d.heads + h) * d.kv + c] as f64;
                    }
                    out[(t * d.heads + h) * d.dv + v] = s as f32;
                }
            }
        }
        out
    }

    /// Attention over exactly the selected rows (f64).
    #[allow(clippy::too_many_arguments)]
    fn sparse_ref(
        qa: &[f32],
        q: &[f32],
        cache: &[f32],
        sel: &[Vec<u32>],
        rows: usize,
        d: &Dims,
        scale: f32,
    ) -> Vec<f32> {
        let w = d.kv + d.dr;
        let mut out = vec![0f32; rows * d.heads * d.kv];
        for t in 0..rows {
            for h in 0..d.heads {
                let (_, p) = query_probs(qa, q, cache, &sel[t], (t, h), d, scale);
                for c in 0..d.kv {
                    let mut o = 0f64;
                    for (j, &s) in sel[t].iter().enumerate() {
                        o += p[j] * cache[s as usize * w + c] as f64;
                    }
                    out[(t * d.heads + h) * d.kv + c] = o as f32;
                }
            }
        }
        out
    }

    /// Query row `t`'s head `h` as the reference multiplies it with the cache rows (its
    /// absorbed part, then its rotated part), and its probabilities over the positions
    /// `sel` (in f64).
    fn query_probs(
        qa: &[f32],
        q: &[f32],
        cache: &[f32],
        sel: &[u32],
        (t, h): (usize, usize),
        d: &Dims,
        scale: f32,
    ) -> (Vec<f32>, Vec<f64>) {
        let w = d.kv + d.dr;
        let qa = &qa[(t * d.heads + h) * d.kv..][..d.kv];
        let qp = &q[t * d.heads * (d.dn + d.dr) + h * (d.dn + d.dr) + d.dn..][..d.dr];
        let qw: Vec<f32> = qa.iter().chain(qp).copied().collect();
        let logits: Vec<f64> = sel
            .iter()
            .map(|&s| {
                let row = &cache[s as usize * w..][..w];
                let x: f64 = qw.iter().zip(row).map(|(a, b)| *a as f64 * *b as f64).sum();
                x * scale as f64
            })
            .collect();
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (qw, e.iter().map(|e| e / z).collect())
    }

    /// How far the attention's products with their operands rounded to f16 (each to within
    /// 2^-11 of itself, f32 sums) may move [`sparse_ref`]'s outputs: each logit by at most
    /// δ = scale · 2^-10 · max_j Σ|q|·|k_j| (both operands rounded), so each probability by
    /// a factor within e^±2δ; the probabilities and the values are rounded again, so output
    /// c moves by at most Σ_j p_j |v_jc| · (e^2δ (1 + 2^-11)² - 1).
    fn sparse_f16_bound(
        qa: &[f32],
        q: &[f32],
        cache: &[f32],
        sel: &[Vec<u32>],
        rows: usize,
        d: &Dims,
        scale: f32,
    ) -> Vec<f32> {
        let w = d.kv + d.dr;
        let u = 1.0 / 2048.0f64;
        let mut out = vec![0f32; rows * d.heads * d.kv];
        for t in 0..rows {
            for h in 0..d.heads {
                let (qw, p) = query_probs(qa, q, cache, &sel[t], (t, h), d, scale);
                let row = |s: u32| &cache[s as usize * w..][..w];
                let most = sel[t]
                    .iter()
                    .map(|&s| abs_dot(&qw, row(s)) as f64)
                    .fold(0.0, f64::max);
                let delta = scale as f64 * 2.0 * u * most;
                let grow = (2.0 * delta).exp() * (1.0 + u).powi(2) - 1.0;
                for c in 0..d.kv {
                    let a: f64 = sel[t]
                        .iter()
                        .zip(&p)
                        .map(|(&s, p)| p * row(s)[c].abs() as f64)
                        .sum();
                    out[(t * d.heads + h) * d.kv + c] = (a * grow * 1.01) as f32;
                }
            }
        }
        out
    }

    /// Every weight format kv_b can come in.
    fn all_formats() -> Vec<WFormat> {
        use crate::weights::QFormat;
        let mut v: Vec<WFormat> = [DType::F32, DType::BF16, DType::F16]
            .into_iter()
            .map(WFormat::Float)
            .collect();
        for q in [
            QFormat::Fp8,
            QFormat::Q8 { block: 32 },
            QFormat::Q4 { block: 64 },
        ] {
            v.push(WFormat::Quant(q));
        }
        v
    }

    /// kv_b on the GPU in `fmt`, and the values the GPU sees.
    fn weight_any(w: &[f32], d: &Dims, fmt: WFormat) -> (GpuWeight, Vec<f32>) {
        use crate::weights::{quant, QFormat};
        let (n, k) = (d.heads * (d.dn + d.dv), d.kv);
        match fmt {
            WFormat::Float(dt) => (weight(gpu(), w, d, dt), rounded(w, dt)),
            WFormat::Quant(q) => {
                let (wb, sb) = match q {
                    QFormat::Fp8 => quant::quantize_fp8(w, n, k),
                    _ => quant::quantize_rows(q, w, k),
                };
                let g =
                    GpuWeight::upload_quant_raw(gpu(), &wb, &sb, n, k, q, None, "wkvb").unwrap();
                (g, quant::dequantize_rows(q, &wb, &sb, 0, n, k))
            }
        }
    }

    fn weight(g: &crate::gpu::Gpu, w: &[f32], d: &Dims, dtype: DType) -> GpuWeight {
        GpuWeight::from_f32(g, w, d.heads * (d.dn + d.dv), d.kv, dtype, None, "wkvb").unwrap()
    }

    #[test]
    fn absorb_q_all_dtypes() {
        // The GPUs' per-head GEMV (gemvt_experts) and the CPU adapters' (gemvt_cpu).
        for cpu in [false, true] {
            with_cpu_kernels(cpu, absorb_q_cases);
        }
    }

    fn absorb_q_cases() {
        let g = gpu();
        let mut rng = Rng::new(31);
        // kv 300: 16-byte rows for f32 only; 544: for every format, and a last column slab
        // of the per-head GEMV that is partly past the row (17 q4 words).
        for kv in [300, 544] {
            let d = Dims {
                heads: 3,
                dn: 70,
                dr: 6,
                dv: 12,
                kv,
            };
            let w = rng.vec(d.heads * (d.dn + d.dv) * d.kv, 0.5);
            for dtype in all_formats() {
                let (wg, wr) = weight_any(&w, &d, dtype);
                // Output rows padded (the tiled kernel past one row) or contiguous (the
                // per-head GEMV up to 8 rows, as a verification's).
                for (rows, pad) in [(1usize, 7), (3, 7), (3, 0), (8, 0), (11, 0), (70, 5)] {
                    let qc = d.heads * (d.dn + d.dr);
                    let q = rng.vec(rows * qc, 1.0);
                    let qb = Placed::new(g, &q, qc, (2, qc + 3), f32::NAN);
                    let hk = d.heads * d.kv;
                    let ob = Placed::filled(g, rows, hk, (5, hk + pad), 9.0);
                    let mut rec = g.recorder();
                    rec.set_prefill(true);
                    absorb_q(
                        &mut rec,
                        qb.view(),
                        &wg,
                        ob.view(),
                        rows as u32,
                        &d.mla(1.0),
                    );
                    rec.finish().unwrap();
                    let got = ob.read(g, "absorb_q");
                    // Tensor-core GEMMs with q4 weights round x (q) to f16: the per-head
                    // GEMM, unless the GEMV serves these rows (matmul_heads_t).
                    let gemv = (rows == 1 || (rows <= GEMV_MAX_ROWS as usize && pad == 0))
                        && whole_words(&wg);
                    let extra: Vec<f32> = match gemm_x_f16(g, dtype) && !gemv {
                        true => absorb_ref(&abs(&q), &abs(&wr), rows, &d)
                            .into_iter()
                            .map(x_f16_bound)
                            .collect(),
                        false => vec![0.0; got.len()],
                    };
                    assert_close_plus(
                        &got,
                        &absorb_ref(&q, &wr, rows, &d),
                        1e-4,
                        1e-4,
                        &extra,
                        &format!("absorb_q {dtype:?} kv {kv} rows {rows} pad {pad}"),
                    );
                }
            }
        }
    }

    #[test]
    fn up_v_all_dtypes() {
        let g = gpu();
        let mut rng = Rng::new(32);
        // Odd sizes and offsets (the scalar kernels), then 16-byte rows and 4-float
        // offsets: at one row the per-head GEMV takes its 16-byte (q4: integer-dot) path.
        let odd = Dims {
            heads: 2,
            dn: 5,
            dr: 4,
            dv: 37,
            kv: 300,
        };
        let aligned = Dims {
            heads: 3,
            dn: 24,
            dr: 4,
            dv: 40,
            kv: 512,
        };
        for (d, pad) in [(odd, (1, 2)), (aligned, (4, 4))] {
            let w = rng.vec(d.heads * (d.dn + d.dv) * d.kv, 0.5);
            for dtype in all_formats() {
                let (wg, wr) = weight_any(&w, &d, dtype);
                for (rows, opad) in [(1usize, 1), (4, 1), (4, 0), (7, 0), (10, 0), (70, 3)] {
                    let ic = d.heads * d.kv;
                    let ol = rng.vec(rows * ic, 1.0);
                    let ib = Placed::new(g, &ol, ic, (pad.0, ic + pad.1), f32::NAN);
                    let hv = d.heads * d.dv;
                    let ob = Placed::filled(g, rows, hv, (3, hv + opad), 9.0);
                    let mut rec = g.recorder();
                    rec.set_prefill(true);
                    up_v(
                        &mut rec,
                        ib.view(),
                        &wg,
                        ob.view(),
                        rows as u32,
                        &d.mla(1.0),
                    );
                    rec.finish().unwrap();
                    let got = ob.read(g, "up_v");
                    // q4: the per-head GEMV may take the integer-dot path, which holds
                    // o_lat to within its split's bound, and tensor-core GEMMs round it
                    // to f16.
                    let q4 = matches!(dtype, WFormat::Quant(crate::weights::QFormat::Q4 { .. }));
                    let f16_x = gemm_x_f16(g, dtype);
                    let extra: Vec<f32> = (0..rows * hv)
                        .map(|i| {
                            let (t, h, v) = (i / hv, i % hv / d.dv, i % d.dv);
                            let x = &ol[(t * d.heads + h) * d.kv..][..d.kv];
                            let r = h * (d.dn + d.dv) + d.dn + v;
                            let w = &wr[r * d.kv..][..d.kv];
                            let rounded = match f16_x {
                                true => x_f16_bound(abs_dot(x, w)),
                                false => 0.0,
                            };
                            match q4 {
                                true => x_split_bound(x, w).max(rounded),
                                false => rounded,
                            }
                        })
                        .collect();
                    assert_close_plus(
                        &got,
                        &up_v_ref(&ol, &wr, rows, &d),
                        1e-4,
                        1e-4,
                        &extra,
                        &format!("up_v {dtype:?} kv {} rows {rows} pad {opad}", d.kv),
                    );
                }
            }
        }
    }

    /// Runs sparse_mla with the selection `sel` (per row) and returns GPU and CPU outputs.
    /// Cache rows not selected by any row are set to NaN when `poison`.
    #[allow(clippy::too_many_arguments)]
    fn run_sparse(
        rng: &mut Rng,
        d: &Dims,
        rows: usize,
        n_keys: usize,
        topk: usize,
        sel: &[Vec<u32>],
        poison: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        run_sparse_in(
            rng,
            d,
            (rows, n_keys, topk),
            sel,
            poison,
            (LatentFormat::F32, n_keys),
            None,
        )
    }

    /// [`run_sparse`] with the cache in `format`, split into segments of `seg_len` rows;
    /// with `rope` (interleaved or not) q_pe is given unrotated and rotated by the kernel
    /// (the reference rotates it beforehand).
    #[allow(clippy::too_many_arguments)]
    fn run_sparse_in(
        rng: &mut Rng,
        d: &Dims,
        dims: (usize, usize, usize),
        sel: &[Vec<u32>],
        poison: bool,
        cache: (LatentFormat, usize),
        rope: Option<bool>,
    ) -> (Vec<f32>, Vec<f32>) {
        let r = run_sparse_as(rng, d, dims, sel, poison, cache, rope, (false, None));
        (r.got, r.want)
    }

    /// What [`run_sparse_as`] returns: the outputs of every plan one after the other, the
    /// reference's for each, and how far from them each output may be on top of the
    /// tolerance (the attention's products rounded to f16, [`matmul::mla_f16`]).
    struct SparseRun {
        got: Vec<f32>,
        want: Vec<f32>,
        extra: Vec<f32>,
    }

    /// [`run_sparse_in`], recorded as a prompt's prefill where `prefill` (on tensor cores
    /// the attention's products then take their operands as one f16 value each), in the
    /// plans `plans` where given (else [`TEST_PLANS`], then the CPU adapters' kernels).
    #[allow(clippy::too_many_arguments)]
    fn run_sparse_as(
        rng: &mut Rng,
        d: &Dims,
        (rows, n_keys, topk): (usize, usize, usize),
        sel: &[Vec<u32>],
        poison: bool,
        (format, seg_len): (LatentFormat, usize),
        rope: Option<bool>,
        (prefill, plans): (bool, Option<&[MlaPlan]>),
    ) -> SparseRun {
        let g = gpu();
        let scale = 0.07f32;
        let w = d.kv + d.dr;
        let rw = format.row_words(d.kv, d.dr);
        let mut words = Vec::with_capacity(n_keys * rw);
        let mut cache = Vec::with_capacity(n_keys * w);
        for _ in 0..n_keys {
            let e = encode_latent(format, &rng.vec(w, 1.0), d.kv);
            cache.extend(decode_latent(format, &e, d.kv, d.dr));
            words.extend(e);
        }
        if poison {
            let mut used = vec![false; n_keys];
            for s in sel.iter().flatten() {
                used[*s as usize] = true;
            }
            for (s, u) in used.iter().enumerate() {
                if !u {
                    words[s * rw..(s + 1) * rw].fill(f32::NAN.to_bits());
                }
            }
        }
        let qa = rng.vec(rows * d.heads * d.kv, 1.0);
        let qc = d.heads * (d.dn + d.dr);
        let q: Vec<f32> = rng
            .vec(rows * qc, 1.0)
            .into_iter()
            .enumerate()
            .map(|(i, x)| {
                if (i % (d.dn + d.dr)) < d.dn {
                    f32::NAN
                } else {
                    x
                }
            })
            .collect();
        let mut idx = vec![0xFFFF_FFFFu32; rows * topk]; // garbage past cnt
        let mut cnt = vec![0u32; rows];
        for t in 0..rows {
            idx[t * topk..t * topk + sel[t].len()].copy_from_slice(&sel[t]);
            cnt[t] = sel[t].len() as u32;
        }
        let hk = d.heads * d.kv;
        let segs = cache_segments(g, &words, rw, seg_len);
        let cb = CacheRows {
            segs: &segs,
            format,
            row_words: rw as u32,
        };
        let ab = Placed::new(g, &qa, hk, (1, hk + 2), f32::NAN);
        let qb = g.buffer_from(&q, "q").unwrap();
        let ib = g.buffer_from(&idx, "idx").unwrap();
        let nb = g.buffer_from(&cnt, "cnt").unwrap();
        let slice = |interleave| RopeSlice {
            heads: d.heads as u32,
            head_stride: (d.dn + d.dr) as u32,
            rot_off: d.dn as u32,
            rot_dim: d.dr as u32,
            interleave,
        };
        let cs = rng.cos_sin(rows, d.dr / 2);
        let csb = g.buffer_from(&cs, "cos_sin").unwrap();
        let mut q_ref = q.clone();
        if let Some(il) = rope {
            rope_ref(&mut q_ref, rows, qc, &slice(il), &cs);
        }
        let want = sparse_ref(&qa, &q_ref, &cache, sel, rows, d, scale);
        let extra = match prefill && matmul::mla_f16(g) {
            true => sparse_f16_bound(&qa, &q_ref, &cache, sel, rows, d, scale),
            false => vec![0.0; want.len()],
        };
        let mut got = Vec::new();
        // The GPUs' kernels in every plan, then the CPU adapters' kernels (rows staged in
        // workgroup memory, and shared through subgroups), unsplit and split.
        let runs: Vec<(MlaPlan, bool, bool)> = match plans {
            Some(p) => p.iter().map(|&p| (p, false, false)).collect(),
            None => TEST_PLANS
                .map(|p| (p, false, false))
                .into_iter()
                .chain(
                    [(1, false), (3, false), (1, true), (3, true)]
                        .map(|(s, sg)| (TEST_PLANS[0].with_cpu_splits(s), true, sg)),
                )
                .collect(),
        };
        let n_runs = runs.len();
        for (plan, cpu, sg) in runs {
            // Filled anew: an element a kernel leaves unwritten shows.
            let ob = Placed::filled(g, rows, hk, (2, hk + 1), 9.0);
            let mut rec = g.recorder();
            rec.set_prefill(prefill);
            with_cpu_kernels(cpu, || {
                with_mla_cpu_sg(sg, || {
                    sparse_mla(
                        &mut rec,
                        &MlaQueries {
                            absorbed: ab.view(),
                            q: View::rows(&qb, qc as u32),
                            rows: rows as u32,
                            rope: rope.map(|il| QueryRope {
                                slice: slice(il),
                                cos_sin: &csb,
                            }),
                        },
                        &cb,
                        &Selection {
                            idx: &ib,
                            cnt: &nb,
                            k: topk as u32,
                        },
                        topk as u32,
                        ob.view(),
                        &d.mla(scale),
                        plan,
                    )
                })
            });
            rec.finish().unwrap();
            got.extend(ob.read(g, "sparse_mla"));
        }
        SparseRun {
            got,
            want: want.repeat(n_runs),
            extra: extra.repeat(n_runs),
        }
    }

    /// How [`run_sparse_in`] runs sparse_mla, its outputs one after the other in this
    /// order: up to 16 and up to 8 heads per workgroup, the positions split as a model
    /// splits them and in one split (several tiles per workgroup: the online softmax's
    /// rescale); then as GEMMs in blocks of 2 query rows ([`sparse_mla_gemm`], which FP8
    /// caches do not take), the values product split as few rows split it (up to 16
    /// splits, as many as 64-position tiles allow) and not split.
    const TEST_PLANS: [MlaPlan; 6] = {
        const fn plan(head_cap: u32, target_groups: u32) -> MlaPlan {
            MlaPlan {
                head_cap,
                target_groups,
                gemm: MlaGemmUse::Never,
                gemm_rows: 0,
                gemm_split: MLA_VALUE_SPLIT_ROWS,
                cpu_splits: 1,
                prefix: false,
            }
        }
        [
            plan(16, MLA_TARGET_GROUPS),
            plan(16, 1),
            plan(8, MLA_TARGET_GROUPS),
            plan(8, 1),
            plan(16, MLA_TARGET_GROUPS).with_gemm(MlaGemmUse::Always, 2),
            plan(16, MLA_TARGET_GROUPS)
                .with_gemm(MlaGemmUse::Always, 2)
                .with_value_splits(1),
        ]
    };

    #[test]
    fn mla_cpu_splits_stay_under_the_loop_limit() {
        // The built-in model (kv 64, dr 16: 20 vec4s a query) at its 64 positions: one split.
        assert_eq!(mla_cpu_split_len(64, 64, 20, 1, 1), Some(64));
        assert_eq!(mla_cpu_split_len(64, 64, 20, 3, 1), Some(22));
        // GLM-5 (kv 512, dr 64) at 2,048 positions: 117 a split, 18 splits.
        let len = mla_cpu_split_len(2048, 512, 144, 1, 1).unwrap();
        assert_eq!(len, (CPU_LOOPS - 3 * 144) / (1 + 144 + 128));
        assert!(len * (1 + 144 + 128) + 3 * 144 <= CPU_LOOPS);
        // Not for a latent of odd width, nor past the partials' splits.
        assert_eq!(mla_cpu_split_len(64, 62, 20, 1, 1), None);
        assert_eq!(mla_cpu_split_len(1 << 20, 512, 144, 1, 1), None);
    }

    #[test]
    fn mla_gemm_blocks_hold_64_mib_of_logits() {
        let d = |heads| MlaDims {
            heads,
            dn: 192,
            dr: 64,
            dv: 256,
            kv_lora: 512,
            scale: 1.0,
        };
        // GLM-5 (64 heads) and DeepSeek-V3.2 (128) at 2,048 selected positions.
        let split = MLA_VALUE_SPLIT_ROWS;
        let b = GemmBlock::new(&d(64), 2048, 2048, 0, split);
        assert_eq!((b.rows, b.q_stride, b.n, b.splits), (128, 576, 2048, 1));
        assert_eq!(GemmBlock::new(&d(128), 2048, 2048, 0, split).rows, 64);
        // Counts round up to whole tiles; few rows make one block; a cap holds.
        assert_eq!(GemmBlock::new(&d(64), 5, 1000, 0, 1).rows, 5);
        assert_eq!(GemmBlock::new(&d(64), 5, 1000, 0, 1).n, 1024);
        assert_eq!(GemmBlock::new(&d(64), 500, 1000, 2, 1).rows, 2);
        // Few rows split the values product: 4 rows in 8 splits of 256 positions; 5 rows
        // in 6 splits of 192 (the logits' rows rounded up to whole splits); never more
        // splits than 64-position tiles.
        let b = GemmBlock::new(&d(64), 4, 2048, 0, split);
        assert_eq!((b.rows, b.n, b.splits), (4, 2048, 8));
        let b = GemmBlock::new(&d(64), 5, 1000, 0, split);
        assert_eq!((b.n, b.splits), (1152, 6));
        assert_eq!(GemmBlock::new(&d(64), 1, 100, 0, split).splits, 2);
        // The plan's scratch: 128 rows of queries (576 floats a head) and of logits, and
        // the few rows' parts (32 rows × splits of 64 heads' 512 sums).
        assert_eq!(
            gemm_scratch_bytes(&d(64), 512, 2048),
            4 * 128 * 64 * 576 + (64 << 20) + 4 * 32 * 64 * 512
        );
        // Few heads keep the kernel: nothing to plan for.
        assert_eq!(gemm_scratch_bytes(&d(4), 512, 2048), 0);
    }

    #[test]
    fn sparse_mla_gemms_skip_positions_outside_the_segments_as_the_kernel_does() {
        // Positions 0..96 cached in two segments, only the first (0..64) listed: selected
        // positions past it count as absent both ways.
        let mut rng = Rng::new(41);
        let (rows, heads, kv, dr, topk) = (3usize, 5usize, 40usize, 8usize, 30usize);
        let d = Dims {
            heads,
            dn: 4,
            dr,
            dv: 4,
            kv,
        };
        let g = gpu();
        let words: Vec<u32> = rng
            .vec(96 * (kv + dr), 1.0)
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let segs = cache_segments(g, &words, kv + dr, 64);
        let cache = CacheRows {
            segs: &segs[..1],
            format: LatentFormat::F32,
            row_words: (kv + dr) as u32,
        };
        let q_abs = g
            .buffer_from(&rng.vec(rows * heads * kv, 1.0), "q_abs")
            .unwrap();
        let q = g
            .buffer_from(&rng.vec(rows * heads * (4 + dr), 1.0), "q")
            .unwrap();
        // Row 0: some positions past the segment; row 1: all of them; row 2: none.
        let picks: [Vec<u32>; 3] = [
            (0..topk as u32).map(|j| (j * 5) % 96).collect(),
            (70..90).collect(),
            (0..20).map(|j| j * 3).collect(),
        ];
        let mut idx = vec![0u32; rows * topk];
        for (t, p) in picks.iter().enumerate() {
            idx[t * topk..t * topk + p.len()].copy_from_slice(p);
        }
        let cnt: Vec<u32> = picks.iter().map(|p| p.len() as u32).collect();
        let ib = g.buffer_from(&idx, "idx").unwrap();
        let nb = g.buffer_from(&cnt, "cnt").unwrap();
        let hk = heads * kv;
        let run = |gemm| {
            let ob = Placed::filled(g, rows, hk, (0, hk), 9.0);
            let mut rec = g.recorder();
            let queries = MlaQueries {
                absorbed: View::rows(&q_abs, hk as u32),
                q: View::rows(&q, (heads * (4 + dr)) as u32),
                rows: rows as u32,
                rope: None,
            };
            let sel = Selection {
                idx: &ib,
                cnt: &nb,
                k: topk as u32,
            };
            let plan = MlaPlan::for_rows(rows as u32).with_gemm(gemm, 0);
            let dims = d.mla(0.2);
            sparse_mla(
                &mut rec,
                &queries,
                &cache,
                &sel,
                topk as u32,
                ob.view(),
                &dims,
                plan,
            );
            rec.finish().unwrap();
            ob.read(g, "sparse_mla")
        };
        let kernel = run(MlaGemmUse::Never);
        let gemms = run(MlaGemmUse::Always);
        assert!(
            kernel[hk..2 * hk].iter().all(|&v| v == 0.0),
            "row 1 has no position"
        );
        assert_close(&gemms, &kernel, 1e-5, 1e-4, "GEMMs against the kernel");
    }

    /// An f32 latent cache in one segment.
    struct F32Cache(Vec<Segment>, u32);

    impl F32Cache {
        fn rows(&self) -> CacheRows<'_, LatentFormat> {
            CacheRows {
                segs: &self.0,
                format: LatentFormat::F32,
                row_words: self.1,
            }
        }
    }

    fn f32_cache(cache: &[f32], w: usize) -> F32Cache {
        let words: Vec<u32> = cache.iter().map(|v| v.to_bits()).collect();
        F32Cache(cache_segments(gpu(), &words, w, cache.len() / w), w as u32)
    }

    #[test]
    fn sparse_mla_reads_every_cache_format_across_segments() {
        // Each format, in one segment and in segments of 64 and 192 rows (selected positions
        // spread over all of them; unselected rows poisoned with NaN words); GLM-5's row
        // (512 + 64) and an awkward one (kv 100: a partial FP8 scale block, dr 6). The
        // segmented runs give q_pe unrotated and let the kernel apply RoPE (half-split pairs
        // at 64, interleaved at 192; each row its own cos/sin).
        let mut rng = Rng::new(38);
        for (kv, dr) in [(512usize, 64usize), (100, 6)] {
            let d = Dims {
                heads: 5,
                dn: 4,
                dr,
                dv: 4,
                kv,
            };
            let (rows, n_keys, topk) = (2, 700, 300);
            for format in LatentFormat::ALL {
                for (seg_len, rope) in [(n_keys, None), (64, Some(false)), (192, Some(true))] {
                    let sel: Vec<Vec<u32>> = [300usize, 37]
                        .iter()
                        .map(|&c| random_selection(&mut rng, n_keys, c))
                        .collect();
                    let (got, want) = run_sparse_in(
                        &mut rng,
                        &d,
                        (rows, n_keys, topk),
                        &sel,
                        true,
                        (format, seg_len),
                        rope,
                    );
                    assert_close(
                        &got,
                        &want,
                        1e-5,
                        1e-4,
                        &format!(
                            "sparse_mla {format:?} kv {kv} segments of {seg_len} rope {rope:?}"
                        ),
                    );
                }
            }
        }
    }

    fn random_selection(rng: &mut Rng, n: usize, k: usize) -> Vec<u32> {
        // k distinct positions < n, in random order.
        let mut all: Vec<u32> = (0..n as u32).collect();
        for i in 0..k {
            let j = i + rng.below((n - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(k);
        all
    }

    #[test]
    fn sparse_mla_matches_selected_attention() {
        let mut rng = Rng::new(33);
        // Latents that pick each workgroup size (256 with 2 columns each, 128, 64).
        for kv in [300, 100, 40] {
            let d = Dims {
                heads: 3,
                dn: 8,
                dr: 12,
                dv: 4,
                kv,
            };
            let (rows, n_keys, topk) = (5, 400, 77);
            // counts: 1, below a block, a block exactly, several blocks, full topk
            let counts = [1usize, 13, 32, 70, 77];
            let sel: Vec<Vec<u32>> = counts
                .iter()
                .map(|&c| random_selection(&mut rng, n_keys, c))
                .collect();
            let (got, want) = run_sparse(&mut rng, &d, rows, n_keys, topk, &sel, false);
            assert_close(&got, &want, 1e-5, 1e-4, &format!("sparse_mla kv {kv}"));
        }
    }

    #[test]
    fn sparse_mla_in_a_prefill_holds_f16_operands_to_their_bound() {
        // Recorded as a prompt's prefill with the attention's f16 products on (the default,
        // SPARSA_COOP_MLA_F16): on tensor cores they take their operands as one f16 value
        // each (coop_mla_f16), f32 caches on 128-column tiles; elsewhere exact. 66 heads (a
        // second tile of 2 live rows), counts past one 128-position tile, inside one, and
        // one; both tile cache formats. On tensor cores GLM-5's row (512 + 64), whose
        // rounding the bound is for; elsewhere, where the products are exact, a row of
        // 300 + 12: compiling the CPU adapters' attention kernel for GLM-5's row took
        // lavapipe 4.7 minutes with a cold shader cache, as CI's is.
        let mut rng = Rng::new(39);
        let glm5_row = gpu().tensor_cores();
        let d = Dims {
            heads: 66,
            dn: 4,
            dr: if glm5_row { 64 } else { 12 },
            dv: 4,
            kv: if glm5_row { 512 } else { 300 },
        };
        let (rows, n_keys, topk) = (3, 300, 160);
        for format in [LatentFormat::F32, LatentFormat::Bf16] {
            let sel: Vec<Vec<u32>> = [160usize, 100, 1]
                .iter()
                .map(|&c| random_selection(&mut rng, n_keys, c))
                .collect();
            let r = matmul::with_mla_f16(true, || {
                run_sparse_as(
                    &mut rng,
                    &d,
                    (rows, n_keys, topk),
                    &sel,
                    true,
                    (format, n_keys),
                    None,
                    (true, None),
                )
            });
            let what = format!("sparse_mla prefill {format:?}");
            assert_close_plus(&r.got, &r.want, 1e-5, 1e-4, &r.extra, &what);
        }
    }

    #[test]
    fn sparse_mla_logits_in_row_pairs_over_prefix_selections() {
        // Each row's selection its positions from the first, in order (select_all over a
        // chunk from position 52; the last row's 64 positions are the whole top-k): the
        // logits tile rows in pairs (mla_pairs) over the later row's selection, on blocks of
        // 4 and 6 rows, with the cache in two segments; the earlier row of a pair ends at
        // its own count. As plain GEMMs and the kernel, against the reference; on tensor
        // cores the pairs take 128-row tiles with the f16 operands (their bound).
        let mut rng = Rng::new(43);
        let d = Dims {
            heads: 20,
            dn: 4,
            dr: 8,
            dv: 4,
            kv: 36,
        };
        let (rows, pos0, topk) = (12usize, 52usize, 64usize);
        let n_keys = pos0 + rows;
        let sel: Vec<Vec<u32>> = (0..rows)
            .map(|t| (0..=(pos0 + t) as u32).collect())
            .collect();
        let base = TEST_PLANS[0].with_gemm(MlaGemmUse::Always, 4);
        let plans = [
            TEST_PLANS[0],
            base,
            base.with_prefix(true),
            TEST_PLANS[0]
                .with_gemm(MlaGemmUse::Always, 6)
                .with_prefix(true),
        ];
        for format in [LatentFormat::F32, LatentFormat::Bf16] {
            let r = with_mla_pairs(true, || {
                run_sparse_as(
                    &mut rng,
                    &d,
                    (rows, n_keys, topk),
                    &sel,
                    false,
                    (format, 40),
                    Some(true),
                    (true, Some(&plans)),
                )
            });
            let what = format!("sparse_mla row pairs {format:?}");
            assert_close_plus(&r.got, &r.want, 1e-5, 1e-4, &r.extra, &what);
        }
    }

    /// Runs `f` with [`mla_pairs`] on or off on this thread, whatever `SPARSA_MLA_PAIRS` says.
    fn with_mla_pairs<R>(on: bool, f: impl FnOnce() -> R) -> R {
        crate::kernels::with_forced(&MLA_PAIRS, on, f)
    }

    #[test]
    fn sparse_mla_splits_and_head_groups() {
        // Few rows with many selected positions: the positions are split across workgroups
        // and merged by mla_combine (rows with fewer positions leave whole splits empty).
        // 20 heads: a full group of 16 and a group with 4 live heads; kv 300: two value
        // columns per invocation; kv + dr = 310: a query that ends inside a vec4.
        let mut rng = Rng::new(37);
        let d = Dims {
            heads: 20,
            dn: 4,
            dr: 10,
            dv: 4,
            kv: 300,
        };
        let (n_keys, topk) = (2600, 2000);
        let sel: Vec<Vec<u32>> = [2000usize, 700, 1]
            .iter()
            .map(|&c| random_selection(&mut rng, n_keys, c))
            .collect();
        let (got, want) = run_sparse(&mut rng, &d, 3, n_keys, topk, &sel, true);
        assert_close(&got, &want, 1e-5, 1e-4, "sparse_mla split");
        // One row, 3 heads (groups of 2), a single-head tail group.
        let d = Dims {
            heads: 3,
            dn: 4,
            dr: 4,
            dv: 4,
            kv: 60,
        };
        let sel = vec![random_selection(&mut rng, 5000, 4097)];
        let (got, want) = run_sparse(&mut rng, &d, 1, 5000, 4100, &sel, false);
        assert_close(&got, &want, 1e-5, 1e-4, "sparse_mla split, 3 heads");
        // 70 heads: two 64-row tiles of the GEMMs, the second with 6 live rows.
        let d = Dims {
            heads: 70,
            dn: 4,
            dr: 8,
            dv: 4,
            kv: 72,
        };
        let sel: Vec<Vec<u32>> = [150usize, 0, 64]
            .iter()
            .map(|&c| random_selection(&mut rng, 300, c))
            .collect();
        let (got, want) = run_sparse(&mut rng, &d, 3, 300, 160, &sel, true);
        assert_close(&got, &want, 1e-5, 1e-4, "sparse_mla 70 heads");
    }

    #[test]
    fn sparse_mla_decode_reads_only_selected_rows() {
        // Unselected cache rows hold NaN (and q_nope is NaN: it must not be read either);
        // the output stays finite and equal to attention over the selected set. The shape
        // of sparse_mla_matches_selected_attention's widest latent (the kernels it compiles
        // are those; GLM-5's 512 took lavapipe 1.7 minutes to compile, shader cache cold).
        let mut rng = Rng::new(34);
        let d = Dims {
            heads: 3,
            dn: 8,
            dr: 12,
            dv: 4,
            kv: 300,
        };
        let (n_keys, topk) = (1000, 64);
        let sel = vec![random_selection(&mut rng, n_keys, topk)];
        let (got, want) = run_sparse(&mut rng, &d, 1, n_keys, topk, &sel, true);
        assert!(got.iter().all(|x| x.is_finite()), "output finite");
        assert_close(&got, &want, 1e-5, 1e-4, "sparse_mla poisoned");
        // Prefill-like rows with overlapping selections.
        let sel: Vec<Vec<u32>> = (0..3)
            .map(|_| random_selection(&mut rng, 200, 50))
            .collect();
        let (got, want) = run_sparse(&mut rng, &d, 3, 200, 64, &sel, true);
        assert!(got.iter().all(|x| x.is_finite()), "output finite");
        assert_close(&got, &want, 1e-5, 1e-4, "sparse_mla poisoned prefill");
    }

    #[test]
    fn sparse_mla_large_logits_stable() {
        // Big logits: the online softmax must not overflow.
        let mut rng = Rng::new(35);
        let d = Dims {
            heads: 2,
            dn: 4,
            dr: 4,
            dv: 4,
            kv: 64,
        };
        let sel = vec![random_selection(&mut rng, 150, 100)];
        let g = gpu();
        let w = d.kv + d.dr;
        let cache: Vec<f32> = rng.vec(150 * w, 30.0);
        let qa = rng.vec(d.heads * d.kv, 30.0);
        let q = rng.vec(d.heads * (d.dn + d.dr), 30.0);
        let cb = f32_cache(&cache, w);
        let ab = g.buffer_from(&qa, "qa").unwrap();
        let qb = g.buffer_from(&q, "q").unwrap();
        let ib = g.buffer_from(&sel[0], "idx").unwrap();
        let nb = g.buffer_from(&[100u32], "cnt").unwrap();
        let ob = g.buffer((d.heads * d.kv * 4) as u64, "o").unwrap();
        let mut rec = g.recorder();
        sparse_mla(
            &mut rec,
            &MlaQueries {
                absorbed: View::rows(&ab, (d.heads * d.kv) as u32),
                q: View::rows(&qb, (d.heads * (d.dn + d.dr)) as u32),
                rows: 1,
                rope: None,
            },
            &cb.rows(),
            &Selection {
                idx: &ib,
                cnt: &nb,
                k: 100,
            },
            100,
            View::rows(&ob, (d.heads * d.kv) as u32),
            &d.mla(1.0),
            MlaPlan::for_rows(1),
        );
        rec.finish().unwrap();
        let got = g.read_f32(&ob, 0, d.heads * d.kv).unwrap();
        let want = sparse_ref(&qa, &q, &cache, &sel, 1, &d, 1.0);
        assert_close(&got, &want, 1e-3, 1e-4, "sparse_mla large logits");
    }

    #[test]
    fn absorbed_pipeline_equals_naive_mla() {
        // absorb_q → sparse_mla → up_v equals attention with k_nope / v expanded from c_kv.
        let g = gpu();
        let mut rng = Rng::new(36);
        let d = Dims {
            heads: 2,
            dn: 16,
            dr: 8,
            dv: 12,
            kv: 64,
        };
        let (rows, n_keys, topk) = (2, 90, 40);
        let w = rng.vec(d.heads * (d.dn + d.dv) * d.kv, 0.3);
        let wg = weight(g, &w, &d, DType::BF16);
        let wr = rounded(&w, DType::BF16);
        let lw = d.kv + d.dr;
        let cache = rng.vec(n_keys * lw, 1.0);
        let qc = d.heads * (d.dn + d.dr);
        let q = rng.vec(rows * qc, 1.0);
        let sel: Vec<Vec<u32>> = (0..rows)
            .map(|_| random_selection(&mut rng, n_keys, topk))
            .collect();
        let scale = (d.dn as f32 + d.dr as f32).powf(-0.5);

        let qb = g.buffer_from(&q, "q").unwrap();
        let cb = f32_cache(&cache, lw);
        let idx: Vec<u32> = sel.iter().flatten().cloned().collect();
        let ib = g.buffer_from(&idx, "idx").unwrap();
        let nb = g.buffer_from(&vec![topk as u32; rows], "cnt").unwrap();
        let qa = g
            .buffer((rows * d.heads * d.kv * 4) as u64, "q_abs")
            .unwrap();
        let ol = g
            .buffer((rows * d.heads * d.kv * 4) as u64, "o_lat")
            .unwrap();
        let ob = g.buffer((rows * d.heads * d.dv * 4) as u64, "o").unwrap();
        let (h, dv, kv) = (d.heads as u32, d.dv as u32, d.kv as u32);
        let mut rec = g.recorder();
        absorb_q(
            &mut rec,
            View::rows(&qb, qc as u32),
            &wg,
            View::rows(&qa, h * kv),
            rows as u32,
            &d.mla(1.0),
        );
        sparse_mla(
            &mut rec,
            &MlaQueries {
                absorbed: View::rows(&qa, h * kv),
                q: View::rows(&qb, qc as u32),
                rows: rows as u32,
                rope: None,
            },
            &cb.rows(),
            &Selection {
                idx: &ib,
                cnt: &nb,
                k: topk as u32,
            },
            topk as u32,
            View::rows(&ol, h * kv),
            &d.mla(scale),
            MlaPlan::for_rows(rows as u32),
        );
        up_v(
            &mut rec,
            View::rows(&ol, h * kv),
            &wg,
            View::rows(&ob, h * dv),
            rows as u32,
            &d.mla(1.0),
        );
        rec.finish().unwrap();
        let got = g.read_f32(&ob, 0, rows * d.heads * d.dv).unwrap();

        let mut want = vec![0f32; rows * d.heads * d.dv];
        for t in 0..rows {
            for hh in 0..d.heads {
                let qh = &q[t * qc + hh * (d.dn + d.dr)..][..d.dn + d.dr];
                let mut logits = Vec::new();
                let mut vals = Vec::new();
                for &s in &sel[t] {
                    let row = &cache[s as usize * lw..(s as usize + 1) * lw];
                    let proj = |r: usize| -> f64 {
                        (0..d.kv)
                            .map(|c| wr[r * d.kv + c] as f64 * row[c] as f64)
                            .sum()
                    };
                    let k_nope: Vec<f64> =
                        (0..d.dn).map(|i| proj(hh * (d.dn + d.dv) + i)).collect();
                    let v: Vec<f64> = (0..d.dv)
                        .map(|i| proj(hh * (d.dn + d.dv) + d.dn + i))
                        .collect();
                    let mut x: f64 = (0..d.dn).map(|i| qh[i] as f64 * k_nope[i]).sum();
                    x += (0..d.dr)
                        .map(|i| qh[d.dn + i] as f64 * row[d.kv + i] as f64)
                        .sum::<f64>();
                    logits.push(x * scale as f64);
                    vals.push(v);
                }
                let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for i in 0..d.dv {
                    want[(t * d.heads + hh) * d.dv + i] =
                        (0..e.len()).map(|j| e[j] / z * vals[j][i]).sum::<f64>() as f32;
                }
            }
        }
        assert_close(&got, &want, 1e-4, 1e-3, "absorbed MLA vs naive");
    }

    #[test]
    #[should_panic(expected = "single chunk")]
    fn split_wkvb_is_refused() {
        // Checked through the wrapper's precondition directly: a panic while a Recorder is
        // alive would poison the shared GPU's param-arena lock for the other tests.
        let g = gpu();
        let d = Dims {
            heads: 2,
            dn: 2,
            dr: 2,
            dv: 2,
            kv: 8,
        };
        let w = vec![0.0f32; d.heads * (d.dn + d.dv) * d.kv];
        let wg = GpuWeight::from_f32(
            g,
            &w,
            d.heads * (d.dn + d.dv),
            d.kv,
            DType::F32,
            Some(4),
            "wkvb",
        )
        .unwrap();
        check_wkvb("absorb_q", &wg, 2, 2, 2);
    }
}
