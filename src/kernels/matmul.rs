//! Matrix products over weights in their stored dtype (`shaders/matmul.wgsl`):
//! a GEMV for decode (few rows) and a tiled GEMM for prefill, f32 accumulation.
//!
//! Kernel choice (`Dense::pick`; the measurements behind each threshold are in BENCHMARKS.md,
//! "Kernel choices"):
//! - rows ≤ 8: GEMV, all rows in one pass over the weights. `gemv4` (16-byte loads, two
//!   weight rows per lane) when weight rows are whole 16-byte words and x rows start on 4-float
//!   boundaries (every real model shape), else the scalar `gemv` (any layout, odd K).
//! - rows ≤ 32: GEMV passes of 8 rows.
//! - beyond: 64×64 or 128×128 tiled GEMM (the larger above 128 rows when it still yields
//!   ≥ 100 tiles).
//!
//! `matmul_experts` runs a per-slot GEMV (16-byte or scalar, as above) up to 8 tokens and a
//! grouped GEMM beyond: one workgroup per (expert, 64 columns) gathers the slots routed to its
//! expert into 64-row tiles.
use super::cache::Segment;
use super::{Recorder, View};
use crate::gpu::{kernel_params, u, Kernel, Shader, ShaderCode, ShaderVariant};
use crate::knobs::{knob, knob_on};
use crate::weights::{DType, GpuWeight, QFormat, WFormat};
use bytemuck::Zeroable;

/// Rows of `x` one GEMV pass handles (`T` in the shader). `matmul_experts` uses the
/// per-slot GEMV up to this many tokens and the grouped GEMM beyond.
pub const GEMV_MAX_ROWS: u32 = 8;
/// Up to this many rows `matmul` runs GEMV passes of up to [`GEMV_MAX_ROWS`] rows (each
/// reads the weights once); beyond, a tiled GEMM.
pub const GEMV_PASSES_MAX_ROWS: u32 = 32;
/// Without tensor cores `matmul` uses 128×128 GEMM tiles for more than 128 rows when there
/// are at least this many of them, else 64×64 (the smaller tiles keep more of the GPU busy).
const GEMM128_MIN_TILES: u32 = 100;
/// Rows of the GEMM tiles of `gemm`, `gemm_experts` and `gemm_heads` (`BM` in the shader);
/// their columns are [`tile_cols`].
const GEMM_TILE_ROWS: u32 = 64;
/// Weight rows per GEMV workgroup (`RPW` in the shader).
const GEMV_RPW: u32 = 4;

kernel_params! {
    struct Params {
        /// Columns of W = length of the dot products.
        k: u32,
        /// Dense: rows of this chunk; experts: rows per expert.
        n: u32,
        /// Dense: rows of x / y; experts: slots (= tokens * topk)
        rows: u32,
        /// Experts only.
        topk: u32,
        x_off: u32,
        x_stride: u32,
        /// Dense: includes the chunk's first row as a column offset.
        y_off: u32,
        y_stride: u32,
        /// Experts: first stacked row held by this chunk.
        row0: u32,
        /// Experts: rows held by this chunk.
        crow: u32,
        x_per_slot: u32,
        /// Experts GEMM: first expert (partly) in this chunk.
        e0: u32,
        n_experts: u32,
        /// Elements per weight row in the chunk (k, or k padded to the block)
        ws: u32,
        /// Dense gemv4q / gemv_dot, mla_values: 1 = add to y instead of writing it;
        /// mla_logits: 1 = not the first segment (positions outside it left as they are).
        accumulate: u32,
        /// Experts: rows of each expert's block in the stacked weight; its `n` rows from
        /// `r_lo` are the ones multiplied (all, from 0, for MoE experts).
        e_rows: u32,
        r_lo: u32,
        /// Experts: 1 = slot s runs expert s % topk, no ids read (a per-head product).
        e_direct: u32,
        /// With `x_per_slot`: elements between token rows of x, whose `topk` slots are
        /// `x_stride` apart within a row (0: the slots are contiguous, `topk · x_stride`).
        /// A per-head product over query rows that hold more than the heads.
        x_row: u32,
        /// With `e_direct`: elements between token rows of y (0: `topk · y_stride`).
        y_row: u32,
        /// 1: the weights are read transposed (the per-head GEMM of `matmul_heads_t`): K
        /// runs down a window's `k` rows, `ws` apart, and output column n is column n of W.
        /// 2: transposed and gathered (`mla_values`): K index j is a selected cache row.
        w_t: u32,
        /// `mla_logits` / `mla_values`: x rows (query heads) per query row.
        heads: u32,
        /// ... the cache segment the weights binding holds: positions seg_lo .. + seg_n.
        seg_lo: u32,
        seg_n: u32,
        /// ... the chunk row of the block's first query row (its selection's row).
        q_row0: u32,
        /// `mla_values`: splits of the selected positions (`k` of them each), their sums
        /// written `y_split` elements apart; `mla_logits`: 1.
        splits: u32,
        y_split: u32,
        /// `gemm_experts`: 0, each workgroup walks its expert's slots; else the table of row
        /// tiles [`expert_tiles`] wrote is bound for the ids, its sorted slots from here.
        e_list: u32,
        /// `gemm_experts` over row tiles: 1, x is a copy in the order of the sorted slots
        /// (row i for entry i; [`x_to_f16`]) instead of x itself.
        x_copy: u32,
        /// `mla_logits`: chunk rows per tile row (0 or 1: one; G: the G rows from
        /// `q_row0 + G t`, over the last one's selection; [`MlaGemm::group`]).
        q_group: u32,
    }
}

kernel_params! {
    /// [`expert_tiles`]' parameters.
    struct TileParams {
        /// Slots (token rows times the experts each takes).
        slots: u32,
        n_experts: u32,
        /// Rows of the GEMM's tile.
        tm: u32,
        /// Where the sorted slots start in the table.
        list: u32,
    }
}

kernel_params! {
    /// [`x_to_f16`]'s parameters.
    struct HalfParams {
        /// Rows of the copy, and those with values (zeros past `rows`).
        rows: u32,
        rows_pad: u32,
        /// Elements of a row of x, and of the copy (zeros past `k`).
        k: u32,
        kpad: u32,
        x_off: u32,
        x_stride: u32,
        /// 0: row r of the copy is row r of x; else row r is the row of slot
        /// `table[list + r]` (`slot_x` with the routed GEMM's `topk`, `x_per_slot`, `x_row`).
        list: u32,
        topk: u32,
        x_per_slot: u32,
        x_row: u32,
    }
}

/// x as f16 rows for the tile that loads its A fragments from memory
/// (shaders/x_to_f16.wgsl, with slot_x.wgsl).
const X_TO_F16: Shader<HalfParams> = Shader::new(
    "x_to_f16",
    concat!(
        include_str!("../../shaders/x_to_f16.wgsl"),
        include_str!("../../shaders/slot_x.wgsl")
    ),
);

/// The routed GEMM's row tiles, cut by one workgroup (shaders/expert_tiles.wgsl).
const EXPERT_TILES: Shader<TileParams> = Shader::new(
    "expert_tiles",
    include_str!("../../shaders/expert_tiles.wgsl"),
);
/// Most experts [`expert_tiles`] sorts (`MAX_EXPERTS` in its shader; GLM-5 and DeepSeek-V3.2
/// have 256).
const EXPERT_TILES_MAX: u32 = 1024;

/// The text of a matmul module: the `head` files of shaders/ (those whose `enable` lines
/// must come first), matmul.wgsl with the files it calls into, then the `tail` files.
macro_rules! matmul_module {
    ([$($head:literal),*], [$($tail:literal),*]) => {
        concat!(
            $(include_str!(concat!("../../shaders/", $head)),)*
            include_str!("../../shaders/weights.wgsl"),
            include_str!("../../shaders/fp8.wgsl"),
            include_str!("../../shaders/quant.wgsl"),
            include_str!("../../shaders/matmul.wgsl"),
            include_str!("../../shaders/slot_x.wgsl"),
            $(include_str!(concat!("../../shaders/", $tail))),*
        )
    };
}

const MATMUL: Shader<Params> = Shader::new("matmul", matmul_module!([], ["matmul_tile.wgsl"]));
/// MATMUL with gemv_cpu_sg, which shares x through subgroups (its own module, so adapters
/// without subgroups still compile the others).
const MATMUL_SG: Shader<Params> = Shader::new(
    "matmul_sg",
    matmul_module!([], ["matmul_tile.wgsl", "matmul_cpu_sg.wgsl"]),
);
/// MATMUL with the GEMV on 8-bit integer dot products (its own module, so browsers
/// without WGSL's packed_4x8_integer_dot_product still compile the others).
const MATMUL_DOT: Shader<Params> = Shader::new(
    "matmul_dot",
    matmul_module!(
        [],
        [
            "matmul_tile.wgsl",
            "xquant.wgsl",
            "matmul_dot.wgsl",
            "dot_red.wgsl"
        ]
    ),
);
/// MATMUL_DOT with its lanes' reductions through subgroup shuffles ([`dot_sg_lanes`]; its
/// own module, as MATMUL_SG).
const MATMUL_DOT_SG: Shader<Params> = Shader::new(
    "matmul_dot_sg",
    matmul_module!(
        [],
        [
            "matmul_tile.wgsl",
            "xquant.wgsl",
            "matmul_dot.wgsl",
            "dot_red_sg.wgsl"
        ]
    ),
);
/// MATMUL with the GEMM tile on tensor cores (its `enable` lines first), reading x in
/// 16-byte loads: for x rows on 4-float boundaries and K a multiple of 4 ([`x_in_quads`]).
const MATMUL_COOP: Shader<Params> = Shader::new(
    "matmul_coop",
    matmul_module!(
        ["matmul_coop.wgsl", "coop_x4.wgsl"],
        ["matmul_coop_rows.wgsl"]
    ),
);
/// MATMUL_COOP reading x element by element (any x layout).
const MATMUL_COOP_X1: Shader<Params> = Shader::new(
    "matmul_coop_x1",
    matmul_module!(
        ["matmul_coop.wgsl", "coop_x1.wgsl"],
        ["matmul_coop_rows.wgsl"]
    ),
);
/// MATMUL_COOP loading x's A fragments from an f16 copy ([`coop_a_global`]).
const MATMUL_COOP_XH: Shader<Params> = Shader::new(
    "matmul_coop_xh",
    matmul_module!(
        ["matmul_coop.wgsl", "coop_xh.wgsl"],
        ["matmul_coop_rows.wgsl"]
    ),
);

/// This module's shaders (for [`super::shaders`]).
pub(super) const SHADERS: &[ShaderCode] = &[
    MATMUL.code(),
    MATMUL_SG.code(),
    MATMUL_DOT.code(),
    MATMUL_DOT_SG.code(),
    MATMUL_COOP.code(),
    MATMUL_COOP_X1.code(),
    MATMUL_COOP_XH.code(),
    EXPERT_TILES.code(),
    X_TO_F16.code(),
];

/// Kernel variant knobs that become defines (all are always defined: one shader module).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Knobs {
    t: u32,
    tpr4: u32,
    rr: u32,
    /// gemv_dot: 32-element blocks of x its workgroup memory holds.
    maxb: u32,
    /// gemv_dot: x quantized beforehand into a buffer (1) or by each workgroup (0).
    xq: u32,
    /// gemv_dot: 16-byte words per row a lane loads before using them.
    unroll: u32,
    /// The tensor-core GEMMs: x read in 16-byte loads ([`x_in_quads`]; not a define, a
    /// shader of its own).
    x4: bool,
    /// The integer-dot GEMVs: lanes a subgroup shuffle reduces ([`dot_sg_lanes`]; 0: the
    /// reductions in workgroup memory). Set by [`pipeline_for`], which picks the module.
    sgr: u32,
    /// The few-rows integer-dot GEMVs: 16-byte words of a weight row each lane of a row
    /// group takes (0: not known), for [`dot_sg_lanes`]. Not a define.
    wpl: u32,
    /// The tensor-core GEMMs: x's A fragments loaded from an f16 copy ([`coop_a_global`];
    /// `X_F16` 3 and a shader of its own).
    xa: bool,
    /// `mla_logits` over row pairs with f16 operands on tensor cores: 128-row tiles
    /// ([`MlaGemm::group`]; the `TM` define).
    m128: bool,
}

const KNOBS: Knobs = Knobs {
    t: 1,
    tpr4: 64,
    rr: 1,
    maxb: 1,
    xq: 0,
    unroll: 1,
    x4: false,
    sgr: 0,
    wpl: 0,
    xa: false,
    m128: false,
};

/// gemv_dot's knobs after the measurement overrides.
fn dot_knobs(tpr4: u32, maxb: u32, xq: bool) -> Knobs {
    // Measurement aids for tuning on a real GPU (examples/gemv_shapes.rs), as is
    // SPARSA_GEMV_TPR (lanes per row).
    let unroll = knob!("SPARSA_GEMV_UNROLL", |v| v == 1 || v == 2);
    Knobs {
        tpr4,
        maxb: if xq { 1 } else { maxb },
        xq: xq as u32,
        unroll: unroll.unwrap_or(1),
        ..KNOBS
    }
}

/// The knobs of gemv_dot_rows and gemv_dot_experts_rows at `rows` rows of x (quantized
/// beforehand), `unroll_default` words in flight per lane. `SPARSA_ROWS_UNROLL` (1 or 2, a
/// measurement aid) overrides it.
fn rows_knobs(tpr4: u32, rows: u32, unroll_default: u32) -> Knobs {
    let unroll = knob!("SPARSA_ROWS_UNROLL", |v| v == 1 || v == 2);
    Knobs {
        t: rows,
        unroll: unroll.unwrap_or(unroll_default),
        rr: rows_quads(),
        ..dot_knobs(rows_tpr(tpr4), 1, true)
    }
}

/// 16-byte words of a row of `w` each lane of a row group of gemv_dot_rows /
/// gemv_dot_experts_rows takes with `tpr4` lanes asked (rounded up).
fn words_per_lane(w: &GpuWeight, tpr4: u32) -> u32 {
    ((w.format.row_bytes(w.cols) / 16) as u32).div_ceil(rows_tpr(tpr4))
}

/// Invocations of a workgroup of gemv_dot_rows and gemv_dot_experts_rows: 256, or 128 with
/// `SPARSA_ROWS_WG=128` (a measurement aid: with the same registers a lane, workgroups half
/// the size fill an SM in finer steps).
fn rows_wg() -> u32 {
    #[cfg(test)]
    if let Some((_, w)) = tests::ROWS_LAYOUT.with(|c| c.get()) {
        return w;
    }
    knob!("SPARSA_ROWS_WG", |v| v == 128 || v == 256).unwrap_or(256)
}

/// Weight rows a workgroup of gemv_dot_rows and gemv_dot_experts_rows takes with `tpr4`
/// lanes per row group (RPWG in matmul_dot.wgsl).
fn rows_per_workgroup(tpr4: u32) -> u32 {
    rows_wg() / rows_tpr(tpr4) * 4 * rows_quads()
}

/// The lanes a row group of gemv_dot_rows / gemv_dot_experts_rows takes for `tpr4` asked:
/// at most a workgroup (with `SPARSA_ROWS_WG=128`, a long row's 256 lanes would leave a
/// workgroup no whole row group).
fn rows_tpr(tpr4: u32) -> u32 {
    tpr4.min(rows_wg())
}

/// Whether the integer-dot GEMVs take x's lo words: 1 (default), or 0 with `SPARSA_XQ_LO=0`,
/// a measurement aid whose results are inexact (x kept to its hi int8 words, as llama.cpp's
/// q8_1 activations are, but with the lo words' share of the q4 offset still subtracted): half
/// the products and x loads, to time what the lo words cost the few-rows GEMVs, which are
/// bound by their integer products.
fn xq_lo() -> u32 {
    knob!("SPARSA_XQ_LO", |v| v <= 1).unwrap_or(1)
}

/// How the integer-dot GEMVs turn a q4 word's two integer sums (x's hi and lo words) into
/// f32. 3 (the default): one int-to-float conversion of `254 · hi + lo` (under 2^24 for q4,
/// so exact), and the few-rows kernels (gemv_dot_rows, gemv_dot_experts_rows) take x's
/// block factors once per x row and word, leaving that conversion and two multiply-adds per
/// weight row and x row. 1: the conversion, with the factors applied per weight row; 2: two
/// conversions (measurement knobs, `SPARSA_DOT_I2F`). On an H100 (run2 of
/// benches/results/2026-12-06d, alternated twice) 3 took the GLM-5 decode shapes at 4 x rows
/// from 735–736 to 666–667 µs (lm_head 477 → 418, dense gate_up 81 → 72), left 1 and 8 rows
/// within 0.6 %, and a full-depth 8-sequence step 65.0 → 63.9–64.2 ms; the goldens, matmul
/// lib tests and batch tests pass with it there. One conversion instead of two (1 against 2)
/// took the shapes at 8 rows from 1,085 to 1,079 µs (run4 of benches/results/2026-12-06c).
fn dot_i2f() -> u32 {
    #[cfg(test)]
    if let Some(v) = tests::DOT_I2F.with(|c| c.get()) {
        return v;
    }
    knob!("SPARSA_DOT_I2F", |v| (1..=3).contains(&v)).unwrap_or(3)
}

/// gemv_dot_rows reduces through subgroup shuffles by default where each lane takes at most
/// this many 16-byte words of a row. On an H100 (2026-12-06, `gemv_shapes q4 20 1,8`, 8 x
/// rows) the shuffles took the GLM-5 shapes whose lanes take 1–6 words from 16–78 µs to
/// 14–71 (q_a 24.4 → 17.1, q_b 32.3 → 25.5, dense down 77.7 → 70.6) and lost on those of
/// 8–12 words (o 97.5 → 101.0, dense gate_up 114.5 → 160.3, lm_head 661 → 746); the whole
/// table 1,085 µs by the earlier rule (≤ 256 workgroups) against 1,070 by this one (run4 of
/// benches/results/2026-12-06c).
const DOT_SG_MAX_WORDS: u32 = 6;

/// The lanes whose partial dots the integer-dot GEMV `entry` (with `tpr4` lanes a row
/// group, each taking `wpl` 16-byte words of a row, 0 if not known) adds through subgroup
/// shuffles on a device with subgroups of at least `subgroup_lanes` lanes (0: none):
/// min(tpr4, subgroup_lanes), or 0 for the reductions in workgroup memory. By default
/// gemv_dot_experts_rows always (at full depth on an H100, the 8-sequence step 65.4 ms with
/// the few-rows kernels' shuffles against 68.2–68.7 without, almost all of it this kernel's:
/// BENCHMARKS.md, "2026-12-06 (third session)") and gemv_dot_rows where `wpl` is at most
/// [`DOT_SG_MAX_WORDS`]. `SPARSA_DOT_SG` overrides: 0 none, 1 the few-rows kernels, 2 every
/// integer-dot GEMV (measurement aids). Subgroups of under 4 lanes keep workgroup memory.
fn dot_sg_lanes(subgroup_lanes: u32, entry: &str, tpr4: u32, wpl: u32) -> u32 {
    let knob = || knob!("SPARSA_DOT_SG", |v| v <= 2);
    #[cfg(test)]
    let mode = tests::DOT_SG.with(|c| c.get()).or_else(knob);
    #[cfg(not(test))]
    let mode = knob();
    let on = match mode {
        None => match entry {
            "gemv_dot_experts_rows" => true,
            "gemv_dot_rows" => (1..=DOT_SG_MAX_WORDS).contains(&wpl),
            _ => false,
        },
        Some(0) => false,
        Some(1) => entry.ends_with("_rows"),
        Some(_) => entry.starts_with("gemv_dot"),
    };
    if on && subgroup_lanes >= 4 {
        tpr4.min(subgroup_lanes)
    } else {
        0
    }
}

/// Quads of weight rows each lane of gemv_dot_rows and gemv_dot_experts_rows takes: 1 (4
/// rows), or 2 (8 rows: each x word a lane loads serves twice the products, for twice the
/// registers). `SPARSA_ROWS_QUADS` selects (a measurement aid; 1 until measured).
fn rows_quads() -> u32 {
    #[cfg(test)]
    if let Some((q, _)) = tests::ROWS_LAYOUT.with(|c| c.get()) {
        return q;
    }
    knob!("SPARSA_ROWS_QUADS", |v| v == 1 || v == 2).unwrap_or(1)
}

fn pipeline(rec: &Recorder, entry: &'static str, w: &GpuWeight, k: Knobs) -> Kernel<Params> {
    pipeline_for(rec, entry, w.format, k)
}

/// [`pipeline`] for weights in format `f`.
fn pipeline_for(rec: &Recorder, entry: &'static str, f: WFormat, k: Knobs) -> Kernel<Params> {
    let mut shader = shader_of(entry, rec.gpu().tensor_cores(), k.x4);
    let mut k = k;
    if shader.name == MATMUL_DOT.name {
        k.sgr = dot_sg_lanes(rec.gpu().subgroup_lanes(), entry, k.tpr4, k.wpl);
        if k.sgr > 0 {
            shader = &MATMUL_DOT_SG;
        }
    }
    let gpu = rec.gpu();
    if [MATMUL_COOP.name, MATMUL_COOP_X1.name].contains(&shader.name) {
        if k.xa {
            shader = &MATMUL_COOP_XH;
        }
        const N: usize = DEFINE_NAMES.len() + COOP_ONLY_NAMES.len();
        let (mut names, mut values) = ([""; N], [0; N]);
        names[..DEFINE_NAMES.len()].copy_from_slice(&DEFINE_NAMES);
        names[DEFINE_NAMES.len()..].copy_from_slice(&COOP_ONLY_NAMES);
        values[..DEFINE_NAMES.len()].copy_from_slice(&define_values(f, k));
        values[DEFINE_NAMES.len()..].copy_from_slice(&coop_only_values(
            f.code(),
            entry,
            coop_operands(rec, f, entry, k),
            rec.exact_gemms(),
        ));
        gpu.pipeline_n(shader, entry, &names, &values)
    } else {
        gpu.pipeline_n(shader, entry, &DEFINE_NAMES, &define_values(f, k))
    }
}

/// How the tensor-core tile takes its operands, beyond what the weights' format and the
/// entry decide: chosen per recording.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct CoopOperands {
    /// `W_GATHER`: the weights are gathered rows read transposed (`mla_values`), staged
    /// K-major ([`coop_gather`]).
    gather: bool,
    /// x's A fragments come from an f16 copy ([`coop_a_global`], [`Knobs::xa`]).
    xa: bool,
    /// The attention's operands as one f16 value each ([`coop_mla_f16`]).
    mla_f16: bool,
    /// 128 × 256 tiles, 64 × 64 outputs a subgroup ([`coop_wide`]).
    wide: bool,
    /// 128-row tiles for the attention's logits over row pairs ([`Knobs::m128`]).
    m128: bool,
}

/// Every define of the tensor-core tile (the GEMVs' and its own), with its operands taken
/// as `ops` says, on a device whose GEMMs are `exact` or not.
#[cfg(test)]
fn coop_defines_with(
    f: WFormat,
    k: Knobs,
    entry: &str,
    ops: CoopOperands,
    exact: bool,
) -> Vec<(&'static str, String)> {
    let mut d = named(&DEFINE_NAMES, &define_values(f, k));
    d.extend(coop_only_defines(f.code(), entry, ops, exact));
    d
}

/// The defines only the tensor-core tile reads, for `entry` with weights of `W_DTYPE` code
/// `w_dtype`, operands taken as `ops` says. `exact`: [`crate::gpu::Gpu::exact_gemms`].
fn coop_only_defines(
    w_dtype: u32,
    entry: &str,
    ops: CoopOperands,
    exact: bool,
) -> Vec<(&'static str, String)> {
    named(
        &COOP_ONLY_NAMES,
        &coop_only_values(w_dtype, entry, ops, exact),
    )
}

// The tile's variants pass both lists to `Gpu::pipeline_n`, which holds at most
// NUM_DEFINES (a variant with more panicked there at its first compile).
const _: () = assert!(DEFINE_NAMES.len() + COOP_ONLY_NAMES.len() <= crate::gpu::NUM_DEFINES);

/// The names of [`coop_only_defines`], in the order of [`coop_only_values`].
const COOP_ONLY_NAMES: [&str; 10] = [
    "Q4_MODE",
    "X_F16",
    "TN",
    "TM",
    "HK",
    "B_ROT",
    "G_AHEAD",
    "W_GATHER",
    "RC",
    "ROWS_DIAG",
];

/// The operands the tensor-core tile takes for `entry` (weights in format `f`) recorded on
/// `rec` with knobs `k`: what [`pipeline_for`] compiles and [`tile_rows`] / [`tile_cols`]
/// size the grid by.
fn coop_operands(rec: &Recorder, f: WFormat, entry: &str, k: Knobs) -> CoopOperands {
    CoopOperands {
        gather: coop_gather(entry),
        xa: k.xa,
        mla_f16: coop_mla_f16(entry, rec.exact_gemms()),
        wide: coop_wide(f.code(), entry, rec.exact_gemms()),
        m128: k.m128,
    }
}

/// The tensor-core tile's rows, columns and K-step (`TM`, `TN`, `HK`) for `entry` with
/// weights of `W_DTYPE` code `w_dtype`, operands taken as `ops` says.
fn coop_shape(w_dtype: u32, entry: &str, ops: CoopOperands, exact: bool) -> (u32, u32, u32) {
    let tm = match ops.m128 {
        true => 128,
        false => coop_tile_rows(w_dtype, entry, coop_x_f16(w_dtype, entry, exact)),
    };
    match ops.wide {
        true => (tm, 256, 32),
        false => (tm, coop_tile_cols(w_dtype, ops.mla_f16), coop_tile_k(entry)),
    }
}

/// The values of [`coop_only_defines`].
fn coop_only_values(w_dtype: u32, entry: &str, ops: CoopOperands, exact: bool) -> [u32; 10] {
    let x_f16 = coop_x_f16(w_dtype, entry, exact);
    let x_mode = match ops {
        CoopOperands { mla_f16: true, .. } => 2,
        CoopOperands { xa: true, .. } => 3,
        _ => x_f16 as u32,
    };
    let (tm, tn, hk) = coop_shape(w_dtype, entry, ops, exact);
    [
        coop_q4_mode(),
        x_mode,
        tn,
        tm,
        hk,
        coop_b_rot(),
        coop_gather_ahead(),
        ops.gather as u32,
        coop_rows_cols(),
        coop_rows_diag(),
    ]
}

/// `names` with their u32 `values` as define text.
fn named(names: &[&'static str], values: &[u32]) -> Vec<(&'static str, String)> {
    names.iter().zip(values).map(|(n, v)| (*n, u(*v))).collect()
}

/// A measurement aid for the [`coop_rows`] kernels, which gives wrong results: which part of
/// a K-step to leave out, to see what bounds the rest (`SPARSA_ROWS_COOP_DIAG`): 0 (default)
/// none; 1, the weights' decoding (a constant staged instead); 2, the products; 3, the
/// weights' stores into workgroup memory (the loads kept).
fn coop_rows_diag() -> u32 {
    knob!("SPARSA_ROWS_COOP_DIAG", |v| v <= 3).unwrap_or(0)
}

/// Whether the tensor-core tile stages `entry`'s weights K-major, as gathered rows read
/// transposed lie in memory (`mla_values`), instead of [n][k] an element at a time as the
/// other entries do. On by default since it ran on the H200 (2026-12-05: the attention
/// tests and goldens pass, prefill 5.7–8 % faster; BENCHMARKS.md, "H200 again");
/// `SPARSA_COOP_GATHER=0` turns it off.
fn coop_gather(entry: &str) -> bool {
    entry == "mla_values" && knob!("SPARSA_COOP_GATHER", |v| v <= 1) != Some(0)
}

/// Columns of the tensor-core tile for weights of `W_DTYPE` code `w_dtype` (the `TN` define):
/// 128 where the weights are staged as one f16 value (bf16, f16, q4, and every format where
/// `w_f16`, [`coop_mla_f16`]), so each staged x value feeds twice the products of 64
/// columns; 64 where they need a lo half too (f32, FP8, q8, q4 with `SPARSA_COOP_Q4=1`),
/// whose 128-column stage would not fit the workgroup memory.
fn coop_tile_cols(w_dtype: u32, w_f16: bool) -> u32 {
    let w_lo = !w_f16 && (matches!(w_dtype, 0 | 3 | 4) || (w_dtype == 5 && coop_q4_mode() == 1));
    // `SPARSA_COOP_TN=64` keeps 64 columns for every format (a measurement aid).
    if w_lo || knob!("SPARSA_COOP_TN", |v| v == 64 || v == 128) == Some(64) {
        64
    } else {
        128
    }
}

/// Rows of the tensor-core tile for `entry` with weights of `W_DTYPE` code `w_dtype` (the `TM`
/// define): 128 where x is one f16 value (`x_f16`, [`coop_x_f16`]) on 128 columns, whose
/// subgroups then spend the registers and products of x's lo halves on 16 more rows each, so
/// that each staged weight feeds twice the rows; else 64. The attention's entries
/// (`mla_logits`, `mla_values`: 64 heads a tile) keep 64.
fn coop_tile_rows(w_dtype: u32, entry: &str, x_f16: bool) -> u32 {
    if GEMM_ENTRIES.contains(&entry) && x_f16 && coop_tile_cols(w_dtype, false) == 128 {
        128
    } else {
        64
    }
}

/// K per staged step of the tensor-core tile for `entry` (the `HK` define): 64, or 32 for the
/// GEMMs with `SPARSA_COOP_HK=32` (a measurement aid), where two stages fit every variant's
/// workgroup memory (one barrier a K-step, the next K-step's stores beside the products).
/// The attention's entries keep 64 (mla_values stages its gathered rows 64 positions a step),
/// but for `mla_logits` with `SPARSA_COOP_MLA_HK=32` (a measurement aid: two stages of its
/// 64 × 128 f16 tile fit).
fn coop_tile_k(entry: &str) -> u32 {
    if entry == "mla_logits" {
        return knob!("SPARSA_COOP_MLA_HK", |v| v == 32 || v == 64).unwrap_or(64);
    }
    match knob!("SPARSA_COOP_HK", |v| v == 32 || v == 64) {
        Some(32) if GEMM_ENTRIES.contains(&entry) => 32,
        _ => 64,
    }
}

/// Whether the tensor-core tile of `entry` (weights of `W_DTYPE` code `w_dtype`, GEMMs
/// `exact` or not) runs 128 × 256 output tiles whose subgroups own 64 × 64 outputs each
/// (`TN` = 256 and K-steps of 32 in one stage: `WIDE` in matmul_coop.wgsl) instead of
/// 128 × 128 tiles of 32 × 64 a subgroup: each A and B matrix loaded from workgroup memory
/// then feeds two products instead of 1.33, each staged value as many as before. Where x is
/// one f16 value on 128-row tiles ([`coop_tile_rows`]), with `SPARSA_COOP_WIDE`: 1 the
/// dense `gemm`, 2 the routed `gemm_experts`, 3 both (a measurement aid; off until
/// measured). Not with x's A fragments from memory ([`coop_a_global`]), which wins.
fn coop_wide(w_dtype: u32, entry: &str, exact: bool) -> bool {
    let picks = |v| gemm_knob_picks(v, w_dtype, entry, exact);
    picks(knob!("SPARSA_COOP_WIDE", |v| v <= 3))
        && !picks(knob!("SPARSA_COOP_A_GLOBAL", |v| v <= 3))
}

/// Whether a knob's value `v` that picks the dense `gemm` (bit 1) and the routed
/// `gemm_experts` (bit 2) picks `entry`, where x is one f16 value on the 128-row tile (the
/// tile those knobs change: [`coop_a_global`], [`coop_wide`]).
fn gemm_knob_picks(v: Option<u32>, w_dtype: u32, entry: &str, exact: bool) -> bool {
    let which = match entry {
        "gemm" => 1,
        "gemm_experts" => 2,
        _ => return false,
    };
    v.is_some_and(|v| v & which != 0)
        && coop_tile_rows(w_dtype, entry, coop_x_f16(w_dtype, entry, exact)) == 128
}

/// Whether the tensor-core tile rotates each subgroup's weight stores onto 32 distinct banks
/// (the `B_ROT` define; in order, the staged rows' strides put 4 of them on one bank).
/// `SPARSA_COOP_BROT=1` turns it on; off by default: at full depth it cost 7 % (H100,
/// BENCHMARKS.md, 2026-12-07 fifth session).
fn coop_b_rot() -> u32 {
    knob!("SPARSA_COOP_BROT", |v| v <= 1).unwrap_or(0)
}

/// Whether `mla_values` loads its gathered positions a K-step ahead of their rows' values
/// (the `G_AHEAD` define). `SPARSA_COOP_GATHER_AHEAD=1` turns it on; off by default until
/// measured on a device with tensor cores.
fn coop_gather_ahead() -> u32 {
    knob!("SPARSA_COOP_GATHER_AHEAD", |v| v <= 1).unwrap_or(0)
}

/// Columns of the f32 GEMM tile (`TN` in matmul_tile.wgsl).
const PORTABLE_TILE_COLS: u32 = 64;

/// Rows and columns of the GEMM tile `entry` runs with on `rec`'s device for weights in
/// format `f`, compiled with knobs `k` (`TM` and `TN` in the shaders; 64 × 64 in
/// matmul_tile.wgsl).
fn tile_shape(rec: &Recorder, f: WFormat, entry: &str, k: Knobs) -> (u32, u32) {
    if !rec.gpu().tensor_cores() {
        return (GEMM_TILE_ROWS, PORTABLE_TILE_COLS);
    }
    let ops = coop_operands(rec, f, entry, k);
    let (tm, tn, _) = coop_shape(f.code(), entry, ops, rec.exact_gemms());
    (tm, tn)
}

/// Rows of the GEMM tile ([`tile_shape`]).
fn tile_rows(rec: &Recorder, f: WFormat, entry: &str, k: Knobs) -> u32 {
    tile_shape(rec, f, entry, k).0
}

/// Columns of the GEMM tile ([`tile_shape`]).
fn tile_cols(rec: &Recorder, f: WFormat, entry: &str, k: Knobs) -> u32 {
    tile_shape(rec, f, entry, k).1
}

/// The tiled GEMMs of weights: the entries whose x may be one f16 value ([`coop_x_f16`]).
const GEMM_ENTRIES: [&str; 3] = ["gemm", "gemm_experts", "gemm_heads"];

/// Whether the tensor-core tile takes `entry`'s x as one f16 value (f32 accumulation, as
/// transformers runs bf16 models on a GPU) instead of hi and lo halves, for weights of
/// `W_DTYPE` code `w_dtype`, recorded where the GEMMs are `exact` or not
/// ([`Recorder::exact_gemms`]: everywhere but a prompt's prefill, and there too with
/// [`crate::gpu::Gpu::set_exact_gemms`]). By default: the GEMMs (not the attention's
/// entries) of q4 weights, which are exact in f16, unless `exact`. With x as one value they
/// run 128-row tiles ([`coop_tile_rows`]): full-depth GLM-5 q4 prefill 1.47–1.50× (H100,
/// 2026-12-07); on the built-in model q4's top-1 agreement with bf16 went from 89.01 % to
/// 88.79 % and its perplexity from +3.73 % to +3.75 %, with the same greedy tokens
/// (docs/QUANTIZATION.md). The f32 goldens do not hold it: x's rounding (2^-11) moves their
/// logits past the tolerance, so they and `--exact-gemms` run exact (BENCHMARKS.md). f32,
/// FP8 and q8 weights are not exact in f16 and keep x precise; bf16 and f16 weights too
/// (not measured). `SPARSA_COOP_X_F16=0|1` (a measurement aid)
/// sets it for the GEMMs of every format, `exact` or not.
fn coop_x_f16(w_dtype: u32, entry: &str, exact: bool) -> bool {
    if !GEMM_ENTRIES.contains(&entry) {
        return false;
    }
    match knob!("SPARSA_COOP_X_F16", |v| v <= 1) {
        Some(v) => v == 1,
        None => !exact && w_dtype == 5 && coop_q4_mode() == 0,
    }
}

/// Whether the tensor-core tile of `entry` on `rec`'s device loads its A fragments (x, as
/// one f16 value) straight from memory instead of staging x through workgroup memory (the
/// `X_F16` define 3, [`Knobs::xa`]): x is first copied as f16 rows ([`x_to_f16`]; the routed
/// experts' in the order of their row tiles), and only the weights are staged, in two stages
/// with one barrier a K-step. Where x is one f16 value ([`coop_x_f16`]), with
/// `SPARSA_COOP_A_GLOBAL`: 1 the dense `gemm`, 2 the routed `gemm_experts` (over row tiles),
/// 3 both (a measurement aid; off until measured).
fn coop_a_global(rec: &Recorder, w_dtype: u32, entry: &str) -> bool {
    let v = knob!("SPARSA_COOP_A_GLOBAL", |v| v <= 3);
    rec.gpu().tensor_cores() && gemm_knob_picks(v, w_dtype, entry, rec.exact_gemms())
}

/// The routed slots whose rows [`x_to_f16`] copies, in the order of a table of row tiles.
struct SlotOrder<'a> {
    table: &'a wgpu::Buffer,
    list: u32,
    topk: u32,
    x_per_slot: bool,
    x_row: u32,
}

/// Records the copy of `rows.0` rows of x (`k` elements each; with `slots`, the rows of
/// the slots in the table's order) as f16 rows of `k` rounded up to the tile's K-step,
/// `rows.1` of them, zeros past both (shaders/x_to_f16.wgsl), into the scratch buffer
/// "x f16"; returns it and its row stride (in f16 elements), or None where it cannot be had
/// (x is then staged as usual).
fn x_to_f16(
    rec: &mut Recorder,
    x: View,
    (rows, rows_pad): (u32, u32),
    k: u32,
    slots: Option<SlotOrder>,
) -> Option<(wgpu::Buffer, u32)> {
    let kpad = k.next_multiple_of(64);
    let gpu = rec.gpu();
    let buf = gpu
        .scratch("x f16", 2 * rows_pad as u64 * kpad as u64)
        .ok()?;
    let pipe = gpu.pipeline_n(&X_TO_F16, "x_to_f16", &[], &[]);
    let (table, list, topk, x_per_slot, x_row) = match slots {
        Some(s) => (s.table, s.list, s.topk, s.x_per_slot, s.x_row),
        None => (gpu.dummy(), 0, 1, false, 0),
    };
    let p = HalfParams {
        rows,
        rows_pad,
        k,
        kpad,
        x_off: x.offset,
        x_stride: x.stride,
        list,
        topk,
        x_per_slot: x_per_slot as u32,
        x_row,
    };
    let pairs = rows_pad as u64 * kpad as u64 / 2;
    rec.cost(4 * rows as u64 * k as u64 + 2 * pairs * 2, 0, "");
    let grid = gpu.grid(pairs.div_ceil(256) as u32);
    rec.dispatch(&pipe, &p, &[x.buf, &buf, table], grid);
    Some((buf, kpad))
}

/// The sparse attention's products on the GEMM tile ([`MlaGemm`]).
const MLA_ENTRIES: [&str; 2] = ["mla_logits", "mla_values"];

/// Whether the tensor-core tile takes both operands of `entry`, one of the attention's
/// products ([`MLA_ENTRIES`]), as one f16 value each (f32 accumulation): the queries and the
/// cache rows of the logits, the probabilities and the cache rows of the values, rounded to
/// nearest, whatever the cache's format (the `X_F16` define 2; `TN` then 128). Where it is
/// off, f32 caches take hi and lo halves of both (three products where one does) on
/// 64-column tiles, bf16 caches those of the queries and probabilities.
/// On by default where the recording is not `exact` ([`Recorder::exact_gemms`]: a prompt's
/// prefill without `--exact-gemms`), as transformers runs its bf16 attention (rounding to
/// 2^-8 where f16 rounds to 2^-11); decode steps, verifications and the goldens keep the
/// exact products; `SPARSA_COOP_MLA_F16=0` turns it off. Full-depth GLM-5 q4 prefill on an
/// H100: 760 → 868 tok/s at 2,048 tokens, 548 → 645 at 8,192 (2026-12-07, eighth session,
/// `benches/results/2026-12-07g/run1.tar.xz`). Its own rounding on the built-in model (its 8
/// heads forced onto the tile, against the exact attention): top-1 99.55 % of 883 positions,
/// perplexity +0.035 %, the same greedy tokens (docs/QUANTIZATION.md).
fn coop_mla_f16(entry: &str, exact: bool) -> bool {
    if !MLA_ENTRIES.contains(&entry) || exact {
        return false;
    }
    #[cfg(test)]
    if let Some(on) = MLA_F16.with(|c| c.get()) {
        return on;
    }
    knob!("SPARSA_COOP_MLA_F16", |v| v <= 1) != Some(0)
}

#[cfg(test)]
thread_local! {
    /// What `SPARSA_COOP_MLA_F16` answers on this thread ([`coop_mla_f16`]).
    static MLA_F16: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the attention's f16 products ([`coop_mla_f16`]) on or off on this thread,
/// whatever `SPARSA_COOP_MLA_F16` says (tests run them on tensor cores).
#[cfg(test)]
pub(crate) fn with_mla_f16<R>(on: bool, f: impl FnOnce() -> R) -> R {
    super::with_forced(&MLA_F16, on, f)
}

/// Whether `gpu`'s attention products, recorded as a prefill, take their operands as one
/// f16 value each ([`coop_mla_f16`]): tests then allow that rounding.
#[cfg(test)]
pub(crate) fn mla_f16(gpu: &crate::gpu::Gpu) -> bool {
    gpu.tensor_cores() && coop_mla_f16("mla_logits", gpu.exact_gemms())
}

/// Whether `gpu`'s GEMM tile, recorded as a prefill ([`Recorder::set_prefill`], as the
/// GEMM tests record), takes x as one f16 value for weights in format `f`
/// ([`coop_x_f16`]): tests then allow x's rounding ([`crate::testutil::x_f16_bound`]) where
/// a GEMM may run.
#[cfg(test)]
pub(crate) fn gemm_x_f16(gpu: &crate::gpu::Gpu, f: WFormat) -> bool {
    gpu.tensor_cores() && coop_x_f16(f.code(), "gemm", gpu.exact_gemms())
}

/// The entries that multiply a few rows of x on tensor cores (matmul_coop_rows.wgsl), and
/// the sum of the dense one's K ranges.
const COOP_ROWS_ENTRIES: [&str; 3] = [
    "gemv_coop_rows",
    "gemv_coop_experts_rows",
    "gemv_coop_rows_sum",
];

/// Most rows of x [`coop_rows`] takes (the tensor cores' 16-row products).
const COOP_ROWS_MAX: u32 = 16;
/// Weight rows (output columns) per workgroup of the [`coop_rows`] kernels (`RC`; 64
/// invocations each): 64, or 128 with `SPARSA_ROWS_COOP_COLS=128` (half the workgroups, twice
/// the products per staged x fragment; a measurement aid). On an H100 the GLM-5 decode shapes
/// took 1.53 ms at one row with 64 against 3.42 with 128, and 2.03 against 3.73 at 8 rows
/// (2026-12-05 night, run1).
fn coop_rows_cols() -> u32 {
    knob!("SPARSA_ROWS_COOP_COLS", |v| v == 64 || v == 128).unwrap_or(64)
}

/// The K ranges `gemv_coop_rows` splits a product of `k` columns into where it has `blocks`
/// column blocks: as many as bring the workgroups to about [`COOP_ROWS_WORKGROUPS`], each at
/// least [`COOP_ROWS_MIN_K`] long (a multiple of the 64-element K-step); returns (ranges,
/// elements per range).
fn coop_rows_splits(blocks: u32, k: u32) -> (u32, u32) {
    let want = knob!("SPARSA_ROWS_COOP_WGS", |v| v >= 1).unwrap_or(COOP_ROWS_WORKGROUPS);
    let min_k = knob!("SPARSA_ROWS_COOP_KMIN", |v| v >= 64).unwrap_or(COOP_ROWS_MIN_K);
    let most = k.div_ceil(min_k.next_multiple_of(64)).max(1);
    let splits = want.div_ceil(blocks.max(1)).clamp(1, most);
    let len = k.div_ceil(splits).next_multiple_of(64);
    (k.div_ceil(len), len)
}
/// Workgroups [`coop_rows_splits`] aims for (`SPARSA_ROWS_COOP_WGS` overrides).
const COOP_ROWS_WORKGROUPS: u32 = 1024;
/// Shortest K range of a split (`SPARSA_ROWS_COOP_KMIN` overrides).
const COOP_ROWS_MIN_K: u32 = 256;

/// Whether `rows` rows of x, quantized for the integer-dot GEMVs (so over q4 weights the
/// integer-dot GEMV takes), run on the tensor cores instead (`gemv_coop_rows`,
/// `gemv_coop_experts_rows`): each weight decoded once and multiplied with all the rows in
/// 16-row products, where the integer-dot kernels take every weight word against every row.
/// Off by default: correct on the real driver (the matmul tests, the batched-greedy tests and
/// the goldens pass on H100 and H200), but slower than the integer-dot rows.
/// - The first version (2026-12-05 midday) walked all of K in each workgroup of 8 subgroups:
///   the GLM-5 decode shapes took 2.54 ms at 8 rows against 1.03 (H200).
/// - This one (2026-12-05 night, `benches/results/2026-12-05-coop-split/`) splits the dense
///   kernel's K into ranges ([`coop_rows_splits`]) and has two subgroups of 32 columns a
///   workgroup: 1.87 ms at 8 rows against the integer-dot rows' 1.04 in the same call (H200,
///   run4), 1.73 against 0.29 at one row. At full depth (H100, run3) an 8-row step took
///   106.7 ms against 68.1, a 4-position verification 94 against 44.7.
/// - What bounds it (run4, `SPARSA_ROWS_COOP_DIAG`): without decoding the weights the shapes
///   took 1.14 ms at one row, without the products 1.45, with neither decoding nor storing
///   the weights 1.28: each part costs, and the bare K-step (loads, x staged, two barriers,
///   the products) is already 4× the integer-dot kernel. Two K-steps' loads in flight
///   instead of one were slower (1.97 against 1.86 ms at 8 rows, H100, run5).
///
/// `SPARSA_ROWS_COOP`: 1 at 2 rows and more, 2 also at one row (0, the default: never).
fn coop_rows(gpu: &crate::gpu::Gpu, rows: u32) -> bool {
    let mode = knob!("SPARSA_ROWS_COOP", |v| v <= 2).unwrap_or(0);
    gpu.tensor_cores() && rows <= COOP_ROWS_MAX && (mode == 2 || (mode == 1 && rows > 1))
}

/// The entries that run the GEMM tile (`tile`): on tensor cores where the device has them.
const TILE_ENTRIES: [&str; 5] = [
    "gemm",
    "gemm_experts",
    "gemm_heads",
    "mla_logits",
    "mla_values",
];

/// The shader whose `entry` runs on a device with or without tensor cores; `x4`: x can be
/// read in 16-byte loads ([`x_in_quads`]).
fn shader_of(entry: &str, tensor_cores: bool, x4: bool) -> &'static Shader<Params> {
    // The GEMMs take the tensor-core tile: dense `gemm`, the routed experts' `gemm_experts`
    // and the per-head `gemm_heads`.
    if (TILE_ENTRIES.contains(&entry) || COOP_ROWS_ENTRIES.contains(&entry)) && tensor_cores {
        if x4 {
            &MATMUL_COOP
        } else {
            &MATMUL_COOP_X1
        }
    } else if entry.starts_with("gemv_dot") || entry == "quantize_x_rows" {
        &MATMUL_DOT
    } else if entry == "gemv_cpu_sg" {
        &MATMUL_SG
    } else {
        &MATMUL
    }
}

/// The variants a device with tensor cores compiles instead of `v`, a GEMM compiled on a
/// device without them (the tensor-core shaders, x in 16-byte loads and element loads, with
/// the defines only they read), and with a dense or routed GEMM the few-rows kernels of the
/// same weights; none for the other matmul variants. For the backend test, which translates
/// those too.
pub fn tensor_core_variants(v: &ShaderVariant) -> Vec<ShaderVariant> {
    let portable = shader_of(v.entry, false, false).code();
    if portable != v.shader || shader_of(v.entry, true, true).code() == portable {
        return vec![];
    }
    let w_dtype = v
        .defines
        .lines()
        .find_map(|l| {
            l.strip_prefix("const W_DTYPE = ")?
                .strip_suffix("u;")?
                .parse()
                .ok()
        })
        .expect("a GEMM variant's defines name its W_DTYPE");
    // A device with tensor cores also runs the few-rows kernels where the integer-dot rows
    // kernels ran (off by default, `coop_rows`): compiled here beside the GEMMs of the same
    // weights, which every workload with a prefill runs.
    let rows_entries: &[&'static str] = match v.entry {
        "gemm" => &["gemv_coop_rows", "gemv_coop_rows_sum"],
        "gemm_experts" => &["gemv_coop_experts_rows"],
        _ => &[],
    };
    // Exact GEMMs and not (x as one f16 value for q4: the 128-row tile), where they differ;
    // and, not exact, the attention's f16 operands (SPARSA_COOP_MLA_F16, the default) and
    // the operands the measurement aids take (SPARSA_COOP_A_GLOBAL, SPARSA_COOP_WIDE) where
    // the entry has them.
    let gather = coop_gather(v.entry);
    let plain = CoopOperands {
        gather,
        ..CoopOperands::default()
    };
    let mla_f16 = MLA_ENTRIES.contains(&v.entry).then_some(CoopOperands {
        mla_f16: true,
        ..plain
    });
    let xa = gemm_knob_picks(Some(3), w_dtype, v.entry, false)
        .then_some(CoopOperands { xa: true, ..plain });
    let wide = xa.map(|_| CoopOperands {
        wide: true,
        ..plain
    });
    // The logits over row pairs, 128-row tiles (SPARSA_MLA_PAIRS).
    let pairs = (v.entry == "mla_logits").then_some(CoopOperands {
        mla_f16: true,
        m128: true,
        ..plain
    });
    let mut ways: Vec<(&'static str, bool, bool, CoopOperands)> = vec![];
    for entry in std::iter::once(v.entry).chain(rows_entries.iter().copied()) {
        let ops = CoopOperands {
            gather: coop_gather(entry),
            ..CoopOperands::default()
        };
        for (x4, exact) in [(true, false), (false, false), (true, true), (false, true)] {
            ways.push((entry, x4, exact, ops));
        }
    }
    for ops in mla_f16.into_iter().chain(xa).chain(wide).chain(pairs) {
        ways.extend([(v.entry, true, false, ops), (v.entry, false, false, ops)]);
    }
    let mut out: Vec<ShaderVariant> = vec![];
    for (entry, x4, exact, ops) in ways {
        let shader = match ops.xa {
            true => &MATMUL_COOP_XH,
            false => shader_of(entry, true, x4),
        };
        let variant = ShaderVariant {
            shader: shader.code(),
            entry,
            defines: v.defines.clone()
                + &crate::gpu::define_lines(&coop_only_defines(w_dtype, entry, ops, exact)),
        };
        if !out.contains(&variant) {
            out.push(variant);
        }
    }
    out
}

/// The names of the GEMV and GEMM defines, in the order of [`define_values`].
const DEFINE_NAMES: [&str; 15] = [
    "W_DTYPE", "QB", "S_BF16", "T", "TPR4", "RR", "EPV", "MAXB", "XQ", "UNROLL", "WGC", "XLO",
    "ROWS_WG", "SGR", "I2F",
];

/// The values of the GEMV and GEMM defines ([`DEFINE_NAMES`]) for weights in format `f`.
fn define_values(f: WFormat, k: Knobs) -> [u32; 15] {
    [
        f.code(),
        f.block().max(1) as u32,
        f.scale_bf16() as u32,
        k.t,
        k.tpr4,
        k.rr,
        f.per_word() as u32,
        k.maxb,
        k.xq,
        k.unroll,
        cpu_wg(),
        xq_lo(),
        rows_wg(),
        k.sgr,
        dot_i2f(),
    ]
}

/// How the tensor-core tile stages q4 weights: 0 (default), one f16 value each, staged a
/// 32-bit word of nibbles per invocation; 1, f16 hi and lo halves, element pairs (three
/// products per multiply-add, as before 2026-12-04); 2, one f16 value, element pairs. A q4
/// weight is a nibble (-8..7, at most 3 significant bits) times a bf16 scale (8), so f16's
/// 11 bits hold it exactly in f16's normal range; below it (|w| < 2^-14) f16 keeps it to
/// 2^-24 (an absolute error under 3·10^-8 per weight, the size of f32 rounding in the sums
/// it joins). `SPARSA_COOP_Q4` selects (a measurement aid).
fn coop_q4_mode() -> u32 {
    knob!("SPARSA_COOP_Q4", |v| v <= 2).unwrap_or(0)
}

/// The dense kernels.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dense {
    /// Any layout.
    Gemv,
    /// 16-byte loads: lanes per row, rows per lane.
    Gemv4(u32, u32),
    /// 16-byte loads, one x row, quantized weights, 4 rows per lane: lanes per row.
    Gemv4Q(u32),
    /// Gemv4Q on 8-bit integer dot products (q8 / q4): lanes per row, x blocks held.
    GemvDot(u32, u32),
    /// CPU adapters: lanes per row group, weight rows per lane (4 or 8), x rows loaded once
    /// for all of them (`gemv_cpu`).
    GemvCpu(u32, u32),
    /// CPU adapters, any layout: a lane per weight row (`gemv_cpu1`).
    GemvCpu1,
    /// Square tiles of this size.
    Gemm(u32),
    /// A few rows on tensor cores ([`coop_rows`]).
    CoopRows,
}

/// Whether the 16-byte GEMV applies: weight rows of whole 16-byte words (quantized: K a
/// multiple of the elements per word, so padding is never read), x rows on 4-float
/// boundaries.
fn gemv4_ok(rows: u32, x: View, w: &GpuWeight) -> bool {
    whole_words(w) && x.offset.is_multiple_of(4) && (rows == 1 || x.stride.is_multiple_of(4))
}

/// Whether the tensor-core GEMM can read x in 16-byte loads: every x row it reads (`x` and
/// rows `row` floats apart) starts on a 4-float boundary and K is a multiple of 4, so a
/// row's last load ends inside the buffer.
fn x_in_quads(x: View, row: u32, k: u32) -> bool {
    [x.offset, x.stride, row, k]
        .iter()
        .all(|v| v.is_multiple_of(4))
}

/// Whether `w`'s rows are whole 16-byte words (quantized: K a multiple of the elements per
/// word, so padding is never read).
pub(crate) fn whole_words(w: &GpuWeight) -> bool {
    w.cols.is_multiple_of(w.format.per_word()) && w.format.row_bytes(w.cols).is_multiple_of(16)
}

/// gemv4's (lanes per row, rows per lane) for `x_rows` rows of x and about `out_rows`
/// weight rows to cover. Each lane should walk at least 8 words of its row (the lane sums'
/// reduction has a fixed cost: 4-bit rows are short). On a GPU, fewer lanes per row also
/// mean fewer workgroups, so lanes are added back while the dispatch would have under 256,
/// and one q8 row takes 64 lanes. On a CPU adapter (`cpu`) neither: a few workgroups fill
/// its cores, and an idle lane costs as much as a busy one (the built-in model's 256-wide
/// q8 rows on 64 lanes left three in four idle: 3.5x slower on lavapipe, 8x on SwiftShader;
/// BENCHMARKS.md, "Kernel choices").
fn gemv4_knobs(w: &GpuWeight, x_rows: u32, out_rows: u32, cpu: bool) -> (u32, u32) {
    if !cpu && x_rows == 1 && matches!(w.format, WFormat::Quant(QFormat::Q8 { .. })) {
        // 64 lanes per row: fastest or tied for every GLM-5 shape (examples/gemv_shapes.rs;
        // BENCHMARKS.md, "Kernel choices").
        return (64, 2);
    }
    let words = (w.format.row_bytes(w.cols) / 16) as u32;
    let min = x_rows.next_power_of_two().max(4);
    let mut tpr = 64u32;
    while tpr > min && words < 8 * tpr {
        tpr /= 2;
    }
    // Few rows (a router, the indexer's head weights): more lanes per row, up to a whole
    // workgroup, so that the row's words spread over more workgroups than a few.
    while !cpu && tpr < 256 && out_rows.div_ceil(256 / tpr * 2) < 256 {
        tpr *= 2;
    }
    (tpr, 2)
}

/// Lanes of a `gemv_cpu` workgroup (WGC in matmul.wgsl): 16, two SIMD vectors on lavapipe,
/// so that even a 256-row product spreads over several workgroups (cores).
/// `SPARSA_CPU_WG` overrides (a measurement aid).
fn cpu_wg() -> u32 {
    knob!("SPARSA_CPU_WG", |v| v.is_power_of_two()
        && (8..=64).contains(&v))
    .unwrap_or(16)
}

/// gemv_cpu's (lanes per row group, weight rows per lane) for `out_rows` weight rows: 8
/// rows a lane, and lanes added to each row group (splitting K) while the dispatch would
/// have under 4 workgroups and each lane keeps at least 4 words of a row. With `shares_x`
/// (several x rows shared through subgroups, `gemv_cpu_sg`, which takes one lane a row
/// group): one lane, and 4 rows a lane where 8 would make under 4 workgroups.
/// `SPARSA_CPU_RR` (4 or 8) and `SPARSA_CPU_TPR` override (measurement aids).
fn cpu_knobs(w: &GpuWeight, out_rows: u32, shares_x: bool) -> (u32, u32) {
    let rr_knob = knob!("SPARSA_CPU_RR", |v| v == 4 || v == 8);
    let tpr_knob = knob!("SPARSA_CPU_TPR", |v| v.is_power_of_two() && v <= 16);
    if shares_x && tpr_knob.is_none() {
        let few = out_rows.div_ceil(cpu_wg() * 8) < 4;
        return (1, rr_knob.unwrap_or(if few { 4 } else { 8 }));
    }
    let rr = rr_knob.unwrap_or(8);
    let words = (w.format.row_bytes(w.cols) / 16) as u32;
    let tpr = tpr_knob.unwrap_or_else(|| {
        let mut t = 1u32;
        while t < 16 && words >= 4 * t && out_rows.div_ceil(cpu_wg() / t * rr) < 4 {
            t *= 2;
        }
        t
    });
    (tpr, rr)
}

/// Whether `rows` rows of x can be shared through subgroups of `subgroup_lanes` lanes
/// (`gemv_cpu_sg`, which [`cpu_knobs`] then lays out and which runs where that layout has
/// one lane per row group): several rows, and subgroups of at least that many lanes.
/// `SPARSA_CPU_SG=0` keeps `gemv_cpu` (a measurement aid).
fn cpu_shares_x(subgroup_lanes: u32, rows: u32) -> bool {
    #[cfg(test)]
    if tests::CPU_SG_OFF.with(|c| c.get()) {
        return false;
    }
    rows > 1 && subgroup_lanes >= rows && knob_on!("SPARSA_CPU_SG")
}

/// Bytes of workgroup memory `gemv4q`'s reduction takes (`red` in matmul.wgsl).
const RED_BYTES: u32 = 512 * 16;

/// For one x row over q4 weights: the x blocks gemv_dot's workgroup memory must hold, when
/// it applies (whole 32-element blocks, scale blocks of whole x blocks, 16-byte rows, and
/// room in the device's workgroup memory: 72 bytes per block). The kernel also takes q8,
/// but q8 decoded faster on the float GEMV while q4 gained (BENCHMARKS.md, "Kernel
/// choices"), so only q4 is routed to it.
fn dot_blocks(gpu: &crate::gpu::Gpu, x: View, w: &GpuWeight) -> Option<u32> {
    if !dot_applies(x, w) {
        return None;
    }
    let maxb = ((w.cols / 32) as u32).next_power_of_two().max(8);
    (maxb * 72 + RED_BYTES <= gpu.limits.max_compute_workgroup_storage_size).then_some(maxb)
}

/// Whether gemv_dot can run `w` on `x`, whatever holds the quantized x: q4 in whole
/// 32-element blocks, scale blocks of whole x blocks, 16-byte rows; native only.
fn dot_applies(x: View, w: &GpuWeight) -> bool {
    if cfg!(target_arch = "wasm32") {
        // Not every browser's WGSL has packed_4x8_integer_dot_product yet.
        return false;
    }
    let block = match w.format {
        WFormat::Quant(QFormat::Q4 { block }) => block,
        _ => return false,
    };
    block.is_multiple_of(32) && w.cols.is_multiple_of(32) && gemv4_ok(1, x, w)
}

/// gemv_dot's lanes per row (its x quantization costs the same whatever the lanes, so it
/// uses gemv4q's choice), unless `SPARSA_GEMV_TPR` says otherwise.
fn dot_lanes(w: &GpuWeight, out_rows: u32, cpu: bool) -> u32 {
    env_tpr().unwrap_or_else(|| gemv4_knobs(w, 1, out_rows / 2, cpu).0)
}

/// Most rows of x that [`matmul`] runs as one integer-dot GEMV pass each (where the
/// integer-dot GEMV applies) rather than one float GEMV over all of them;
/// `SPARSA_DOT_ROWS` overrides (0 or 1: never).
fn dot_rows() -> u32 {
    knob!("SPARSA_DOT_ROWS", |v| v <= GEMV_MAX_ROWS).unwrap_or(4)
}

/// Whether [`matmul`] runs `rows` (> 1) rows of x over `w` as integer-dot GEMV passes.
fn dot_passes(gpu: &crate::gpu::Gpu, x: View, w: &GpuWeight, rows: u32) -> bool {
    rows <= dot_rows() && (0..rows).all(|t| dot_blocks(gpu, x.row(t), w).is_some())
}

fn env_tpr() -> Option<u32> {
    knob!("SPARSA_GEMV_TPR", |v| v.is_power_of_two()
        && (4..=64).contains(&v))
}

/// Most slots of one expert `gemv_dot_experts_rows` takes per pass over the expert's rows,
/// at `rows` token rows: 4 (an expert with more slots takes more passes, the later ones
/// reading its rows from the caches). Fewer accumulators per invocation leave room for more
/// invocations: on the H200, a 78-layer GLM-5 q4 step of 8 sequences (random routing over
/// 16 experts, about 4 slots an expert) spent 30.1 ms in the kernel at 4, 30.9 at 2, 33.0
/// at 8 (BENCHMARKS.md, "Batched decode: what bounds the several-row GEMVs").
/// `SPARSA_EXPERT_BATCH` overrides (a measurement knob).
fn expert_batch(rows: u32) -> u32 {
    let cap = knob!("SPARSA_EXPERT_BATCH", |v| (1..=GEMV_MAX_ROWS).contains(&v));
    rows.min(cap.unwrap_or(4))
}

/// Whether decode GEMVs over `w` take 4 rows per lane (gemv4q): for 4-bit weights, whose
/// GEMV is bound by the x loads per element. 8-bit weights measured slower that way and keep
/// 2 rows per lane (BENCHMARKS.md, "Kernel choices").
fn quad_rows(w: &GpuWeight) -> bool {
    matches!(w.format, WFormat::Quant(QFormat::Q4 { .. }))
}

/// What the kernel choice needs to know of the device.
#[derive(Clone, Copy, Debug, Default)]
struct Dev {
    /// The device runs `gemm`'s tile on tensor cores.
    tensor_cores: bool,
    /// A CPU adapter (see [`gemv4_knobs`]).
    cpu: bool,
    /// The GEMVs take the CPU adapters' kernels ([`super::cpu_kernels`]).
    cpu_gemvs: bool,
    /// [`crate::gpu::Gpu::subgroup_lanes`].
    subgroup_lanes: u32,
}

impl Dev {
    fn of(gpu: &crate::gpu::Gpu) -> Dev {
        Dev {
            tensor_cores: gpu.tensor_cores(),
            cpu: gpu.adapter.is_cpu(),
            cpu_gemvs: super::cpu_kernels(gpu),
            subgroup_lanes: gpu.subgroup_lanes(),
        }
    }
}

impl Dense {
    /// The kernel for `rows` rows of x on `dev`; on tensor cores `gemm`'s tile serves every
    /// GEMM size (gemm128 is the f32 tile's large variant). `dot`: what [`dot_blocks`] says
    /// for this x and weight.
    fn pick(rows: u32, x: View, w: &GpuWeight, dev: Dev, dot: Option<u32>) -> Dense {
        let cpu = dev.cpu;
        if rows <= GEMV_MAX_ROWS {
            if dev.cpu_gemvs && gemv4_ok(rows, x, w) {
                let sg = cpu_shares_x(dev.subgroup_lanes, rows);
                let (tpr, rr) = cpu_knobs(w, w.rows as u32, sg);
                Dense::GemvCpu(tpr, rr)
            } else if let Some(maxb) = dot.filter(|_| rows == 1) {
                Dense::GemvDot(dot_lanes(w, w.rows as u32, cpu), maxb)
            } else if rows == 1 && quad_rows(w) && gemv4_ok(rows, x, w) {
                Dense::Gemv4Q(gemv4_knobs(w, 1, w.rows as u32 / 2, cpu).0)
            } else if gemv4_ok(rows, x, w) {
                let (tpr, rr) = gemv4_knobs(w, rows, w.rows as u32, cpu);
                Dense::Gemv4(tpr, rr)
            } else if dev.cpu_gemvs {
                Dense::GemvCpu1
            } else {
                Dense::Gemv
            }
        } else if dev.tensor_cores
            || rows <= 128
            || rows.div_ceil(128) * (w.rows as u32).div_ceil(128) < GEMM128_MIN_TILES
        {
            Dense::Gemm(64)
        } else {
            Dense::Gemm(128)
        }
    }
}

/// `y[t, n] = Σ_k x[t, k] · W[n, k]` for `t < rows`, `n < w.rows`, `k < w.cols`.
/// One dispatch per weight chunk; picks GEMV or GEMM by `rows`. `x` and `y` must be
/// different buffers.
pub fn matmul(rec: &mut Recorder, x: View, w: &GpuWeight, y: View, rows: u32) {
    matmul_into(rec, x, w, y, rows, false);
}

/// `y[t, n] += Σ_k x[t, k] · W[n, k]`: [`matmul`] with the sum added in the GEMVs' store
/// (a residual add folded in: one dispatch fewer) for up to [`GEMV_MAX_ROWS`] rows; more
/// rows (a GEMM) record nothing and return false.
pub fn matmul_add(rec: &mut Recorder, x: View, w: &GpuWeight, y: View, rows: u32) -> bool {
    if rows > GEMV_MAX_ROWS {
        return false;
    }
    matmul_into(rec, x, w, y, rows, true);
    true
}

/// [`matmul`], or with `accumulate` [`matmul_add`] (up to [`GEMV_MAX_ROWS`] rows: every
/// GEMV kernel adds in its store, the GEMM tiles do not).
fn matmul_into(rec: &mut Recorder, x: View, w: &GpuWeight, y: View, rows: u32, accumulate: bool) {
    debug_assert!(!accumulate || rows <= GEMV_MAX_ROWS);
    let gpu = rec.gpu();
    let dev = Dev::of(gpu);
    let pick = |r: u32, xv: View| Dense::pick(r, xv, w, dev, dot_blocks(gpu, xv, w));
    if rows > 1 && !dev.cpu_gemvs && dot_passes(gpu, x, w, rows) {
        // A few rows over q4 (a speculative verification, a short chunk): a pass of the
        // integer-dot GEMV per row reads the weights once per row, but at a third of the
        // float GEMV's instructions per byte, which is what bounds that one at few rows.
        for t in 0..rows {
            let xv = x.row(t);
            matmul_as(rec, xv, w, y.row(t), 1, pick(1, xv), None, accumulate);
        }
        return;
    }
    if rows > GEMV_MAX_ROWS && (rows <= GEMV_PASSES_MAX_ROWS || dev.cpu_gemvs) {
        // A few GEMV passes beat a GEMM whose tiles are mostly empty. On CPU adapters they
        // beat the tile at any rows: `gemv_cpu` takes 8 rows of x per weight read without a
        // barrier, while the tile's 256 invocations switch through 32 SIMD slices at each
        // of its barriers (a prefill chunk's dense GEMMs on lavapipe: BENCHMARKS.md,
        // "lavapipe: prefill on the CPU adapters' GEMVs").
        let mut t = 0;
        while t < rows {
            let r = (rows - t).min(GEMV_MAX_ROWS);
            let xv = x.row(t);
            matmul_as(rec, xv, w, y.row(t), r, pick(r, xv), None, accumulate);
            t += r;
        }
        return;
    }
    matmul_as(rec, x, w, y, rows, pick(rows, x), None, accumulate);
}

/// Rows of x quantized for the integer-dot GEMV by [`quantize_x`]: `rows` rows of `k`
/// columns in `buf`, in the element order of `order`'s weights (q4 or q8).
#[derive(Clone, Copy)]
pub struct XQuant<'a> {
    pub buf: &'a wgpu::Buffer,
    pub k: u32,
    pub rows: u32,
    pub order: QFormat,
}

impl XQuant<'_> {
    /// Whether GEMVs over `w` can read these rows: its columns, its element order.
    fn serves(&self, w: &GpuWeight) -> bool {
        self.k == w.cols as u32 && w.format == WFormat::Quant(self.order)
    }
}

/// Bytes [`quantize_x`] writes for `rows` rows of `k` columns (k a multiple of 32).
pub fn xq_bytes(k: u32, rows: u32) -> u64 {
    let nb = k as u64 / 32;
    16 * (4 * nb + nb.div_ceil(2)) * rows as u64
}

/// Whether decode steps quantize x once for the integer-dot GEMVs (default yes;
/// `SPARSA_GEMV_XQ=0` makes every GEMV quantize its own, a measurement aid).
pub fn xq_enabled() -> bool {
    knob_on!("SPARSA_GEMV_XQ")
}

/// Most rows of x a forward quantizes once for the integer-dot GEMVs, which then read the
/// weights once for all of them (`gemv_dot_rows`, `gemv_dot_experts_rows`): a decode step's
/// one, a speculative verification's few. `SPARSA_XQ_ROWS` overrides (1: decode steps
/// only, a measurement aid).
pub fn xq_max_rows() -> u32 {
    knob!("SPARSA_XQ_ROWS", |v| (1..=GEMV_MAX_ROWS).contains(&v)).unwrap_or(GEMV_MAX_ROWS)
}

/// Whether `w`'s decode GEMV can take x quantized beforehand (the integer-dot GEMV applies
/// and reads x in this element order).
pub fn takes_xq(x: View, w: &GpuWeight) -> Option<QFormat> {
    match w.format {
        WFormat::Quant(q) if dot_applies(x, w) => Some(q),
        _ => None,
    }
}

/// Quantizes `rows` rows of `x` (`k` columns, a multiple of 32) for GEMVs over weights of
/// format `order` into `out` ([`xq_bytes`] long), once for every GEMV that reads this x.
pub fn quantize_x<'a>(
    rec: &mut Recorder,
    x: View,
    rows: u32,
    k: u32,
    order: QFormat,
    out: &'a wgpu::Buffer,
) -> XQuant<'a> {
    debug_assert!(k.is_multiple_of(32) && out.size() >= xq_bytes(k, rows));
    let fmt = WFormat::Quant(order);
    let shader = shader_of("quantize_x_rows", false, false);
    let pipe = rec.gpu().pipeline_n(
        shader,
        "quantize_x_rows",
        &DEFINE_NAMES,
        &define_values(fmt, dot_knobs(KNOBS.tpr4, 1, true)),
    );
    let p = Params {
        k,
        rows,
        x_off: x.offset,
        x_stride: x.stride,
        ..Params::zeroed()
    };
    rec.cost(4 * (rows * k) as u64 + xq_bytes(k, rows), 0, "f32");
    // Eight invocations per 32-element block.
    let grid = rec.gpu().grid((rows * (k / 32)).div_ceil(32));
    rec.dispatch(&pipe, &p, &[x.buf, out], grid);
    XQuant {
        buf: out,
        k,
        rows,
        order,
    }
}

/// [`matmul`] for the rows of x (one, or up to [`GEMV_MAX_ROWS`]) that [`quantize_x`] has
/// quantized: the integer-dot GEMV reads `xq` instead of quantizing x in every workgroup,
/// and reads the weights once for all the rows; where it does not apply (other formats,
/// layouts), the plain [`matmul`] on `x`.
pub fn matmul_xq(rec: &mut Recorder, xq: &XQuant, x: View, w: &GpuWeight, y: View) {
    if !xq_gemv(rec, xq, x, w, y, false) {
        matmul(rec, x, w, y, xq.rows)
    }
}

/// `y += x · Wᵀ` for the rows of x that [`quantize_x`] has quantized, in one dispatch (the
/// residual add folded into the GEMV's store), where the integer-dot GEMV applies; returns
/// false, recording nothing, where it does not.
pub fn matmul_xq_add(rec: &mut Recorder, xq: &XQuant, x: View, w: &GpuWeight, y: View) -> bool {
    xq_gemv(rec, xq, x, w, y, true)
}

fn xq_gemv(rec: &mut Recorder, xq: &XQuant, x: View, w: &GpuWeight, y: View, add: bool) -> bool {
    let rows = xq.rows;
    if !((1..=GEMV_MAX_ROWS).contains(&rows) && xq.serves(w) && dot_applies(x, w)) {
        return false;
    }
    if coop_rows(rec.gpu(), rows) {
        // Reads x itself.
        matmul_as(rec, x, w, y, rows, Dense::CoopRows, None, add);
        return true;
    }
    // No workgroup memory for x: MAXB 1.
    let kind = Dense::GemvDot(dot_lanes(w, w.rows as u32, rec.gpu().adapter.is_cpu()), 1);
    matmul_as(rec, x, w, y, rows, kind, Some(xq), add);
    true
}

/// [`matmul`] on the kernel `kind` (tests force each kernel through it).
#[allow(clippy::too_many_arguments)]
fn matmul_as(
    rec: &mut Recorder,
    x: View,
    w: &GpuWeight,
    y: View,
    rows: u32,
    kind: Dense,
    xq: Option<&XQuant>,
    accumulate: bool,
) {
    debug_assert!(x.buf != y.buf, "matmul: x and y must be different buffers");
    if rows == 0 || w.rows == 0 {
        return;
    }
    // The tile that loads x's A fragments from memory reads an f16 copy of x instead (where
    // its scratch buffer can be had; else x is staged as usual).
    let x16 = (kind == Dense::Gemm(64) && coop_a_global(rec, w.format.code(), "gemm"))
        .then(|| {
            let tm = tile_rows(rec, w.format, "gemm", KNOBS);
            x_to_f16(
                rec,
                x,
                (rows, rows.next_multiple_of(tm)),
                w.cols as u32,
                None,
            )
        })
        .flatten();
    let x = x16
        .as_ref()
        .map_or(x, |(b, stride)| View::new(b, 0, *stride));
    let pipe = match kind {
        Dense::Gemv => pipeline(rec, "gemv", w, Knobs { t: rows, ..KNOBS }),
        Dense::GemvCpu1 => pipeline(rec, "gemv_cpu1", w, Knobs { t: rows, ..KNOBS }),
        Dense::Gemv4(tpr4, rr) => {
            debug_assert!(
                tpr4 >= rows && 256 % tpr4 == 0 && (rr == 1 || rr == 2),
                "gemv4 knobs {kind:?}"
            );
            pipeline(
                rec,
                "gemv4",
                w,
                Knobs {
                    t: rows,
                    tpr4,
                    rr,
                    ..KNOBS
                },
            )
        }
        Dense::Gemv4Q(tpr4) => pipeline(rec, "gemv4q", w, Knobs { tpr4, ..KNOBS }),
        Dense::GemvCpu(tpr4, rr) => pipeline(
            rec,
            if tpr4 == 1 && cpu_shares_x(rec.gpu().subgroup_lanes(), rows) {
                "gemv_cpu_sg"
            } else {
                "gemv_cpu"
            },
            w,
            Knobs {
                t: rows,
                tpr4,
                rr,
                ..KNOBS
            },
        ),
        // Several rows of x, quantized beforehand: the weights read once for all of them.
        Dense::GemvDot(tpr4, _) if rows > 1 => {
            debug_assert!(xq.is_some(), "gemv_dot_rows reads x quantized");
            pipeline(
                rec,
                "gemv_dot_rows",
                w,
                Knobs {
                    wpl: words_per_lane(w, tpr4),
                    ..rows_knobs(tpr4, rows, 1)
                },
            )
        }
        Dense::GemvDot(tpr4, maxb) => {
            pipeline(rec, "gemv_dot", w, dot_knobs(tpr4, maxb, xq.is_some()))
        }
        Dense::Gemm(64) => {
            let x4 = x_in_quads(x, x.stride, w.cols as u32);
            let xa = x16.is_some();
            pipeline(rec, "gemm", w, Knobs { x4, xa, ..KNOBS })
        }
        Dense::Gemm(_) => pipeline(rec, "gemm128", w, KNOBS),
        Dense::CoopRows => {
            let x4 = x_in_quads(x, x.stride, w.cols as u32);
            pipeline(rec, "gemv_coop_rows", w, Knobs { x4, ..KNOBS })
        }
    };
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
            ws: w.stride as u32,
            accumulate: accumulate as u32,
            ..Params::zeroed()
        };
        let groups = match kind {
            Dense::Gemv => n.div_ceil(GEMV_RPW),
            Dense::Gemv4(tpr4, rr) => n.div_ceil(256 / tpr4 * rr),
            Dense::GemvCpu(tpr4, rr) => n.div_ceil(cpu_wg() / tpr4 * rr),
            Dense::GemvCpu1 => n.div_ceil(cpu_wg()),
            Dense::GemvDot(tpr4, _) if rows > 1 => n.div_ceil(rows_per_workgroup(tpr4)),
            Dense::Gemv4Q(tpr4) | Dense::GemvDot(tpr4, _) => n.div_ceil(256 / tpr4 * 4),
            Dense::Gemm(64) => {
                rows.div_ceil(tile_rows(rec, w.format, "gemm", KNOBS))
                    * n.div_ceil(tile_cols(rec, w.format, "gemm", KNOBS))
            }
            Dense::Gemm(tile) => rows.div_ceil(tile) * n.div_ceil(tile),
            Dense::CoopRows => n.div_ceil(coop_rows_cols()),
        };
        let scale = c.scale.as_ref().unwrap_or(rec.gpu().dummy());
        let (k, n, r) = (w.cols as u64, n as u64, rows as u64);
        rec.cost(
            n * w.row_bytes() + 4 * r * (k + n),
            2 * r * n * k,
            w.format.name(),
        );
        if kind == Dense::CoopRows {
            let x4 = x_in_quads(x, x.stride, w.cols as u32);
            coop_rows_dispatch(
                rec,
                (&pipe, w, x4),
                p,
                [x.buf, &c.buf, y.buf, scale],
                groups,
            );
            continue;
        }
        let grid = rec.gpu().grid(groups);
        let xb = xq.map_or(x.buf, |q| q.buf);
        rec.dispatch(&pipe, &p, &[xb, &c.buf, y.buf, scale], grid);
    }
}

/// `gemv_coop_rows` (`pipe`, of weights `w`, x read in quads where `x4`) over `blocks`
/// column blocks with parameters `p` and bindings `b` (x, weights, y, scales): in one
/// dispatch where K needs no split ([`coop_rows_splits`]), else each K range's sums into a
/// scratch buffer and `gemv_coop_rows_sum` adding them into y.
fn coop_rows_dispatch(
    rec: &mut Recorder,
    (pipe, w, x4): (&Kernel<Params>, &GpuWeight, bool),
    p: Params,
    b: [&wgpu::Buffer; 4],
    blocks: u32,
) {
    let (splits, len) = coop_rows_splits(blocks, p.k);
    let p = Params {
        splits,
        seg_n: len,
        y_split: p.rows * p.n,
        ..p
    };
    let grid = rec.gpu().grid(blocks * splits);
    if splits == 1 {
        rec.dispatch(pipe, &p, &b, grid);
        return;
    }
    let gpu = rec.gpu();
    let sums = match gpu.scratch("coop rows sums", 4 * (splits * p.y_split) as u64) {
        Ok(s) => s,
        Err(e) => {
            gpu.report_error(e.to_string());
            return;
        }
    };
    rec.dispatch(pipe, &p, &[b[0], b[1], &sums, b[3]], grid);
    let sum = pipeline(rec, "gemv_coop_rows_sum", w, Knobs { x4, ..KNOBS });
    rec.cost(4 * (splits + 2) as u64 * p.y_split as u64, 0, "f32");
    rec.dispatch(&sum, &p, &[&sums, b[2]], gpu.grid(p.y_split.div_ceil(256)));
}

/// Which expert each routed pair uses: `ids[t * topk + j]` (u32) for row `t`'s `j`-th pair,
/// an expert of the `n_experts` stacked in the weight (expert ids, or the expert cache's
/// slots).
#[derive(Clone, Copy)]
pub struct Routed<'a> {
    pub ids: &'a wgpu::Buffer,
    pub n_experts: u32,
    pub topk: u32,
}

/// Routed-expert product. `w` stacks `n_experts` matrices of `w.rows / n_experts` rows
/// (chunks split only between experts). For `t < rows`, `j < topk`, with
/// `e = ids[t * topk + j]`: `y[t * topk + j, n] = Σ_k x[r, k] · W_e[n, k]`
/// where `r = t * topk + j` if `x_per_slot`, else `r = t`.
pub fn matmul_experts(
    rec: &mut Recorder,
    x: View,
    x_per_slot: bool,
    w: &GpuWeight,
    routed: &Routed,
    y: View,
    rows: u32,
) {
    experts_as(rec, x, None, x_per_slot, w, routed, None, y, rows, 0)
}

/// [`matmul_experts`] with x quantized by [`quantize_x`] (its rows: one per token row, or one
/// per slot with `x_per_slot`) at a decode step or a few rows (≤ [`GEMV_MAX_ROWS`]): the
/// integer-dot GEMV reads `xq` where it applies, else the plain kernels read `x`. At more
/// than one row it groups the slots by expert, so that each expert's weights are read once
/// for all the rows routed to it.
#[allow(clippy::too_many_arguments)]
pub fn matmul_experts_xq(
    rec: &mut Recorder,
    xq: &XQuant,
    x: View,
    x_per_slot: bool,
    w: &GpuWeight,
    routed: &Routed,
    y: View,
    rows: u32,
) {
    let ok = rows <= GEMV_MAX_ROWS && xq.serves(w);
    experts_as(
        rec,
        x,
        ok.then_some(xq),
        x_per_slot,
        w,
        routed,
        None,
        y,
        rows,
        0,
    )
}

/// Rows of each stacked block a routed product multiplies: `n` rows from `first` (all of
/// them, from 0, for MoE experts).
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub first: u32,
    pub n: u32,
}

/// A per-head product's operands over `rows` token rows: `w` stacks `heads` blocks of
/// `w.rows / heads` rows, of which `win` is multiplied; head h of token row t reads x from
/// `x.offset + t * x.stride + h * head_stride` and writes y from
/// `y.offset + t * y.stride + h * y_head`.
#[derive(Clone, Copy)]
pub struct Heads<'a> {
    pub x: View<'a>,
    pub head_stride: u32,
    pub heads: u32,
    pub win: Window,
    pub y: View<'a>,
    pub y_head: u32,
    pub rows: u32,
}

impl Heads<'_> {
    /// The kernel parameters that lay out the slots (token row t's head h is slot
    /// `t * heads + h`, expert h, its window of `w`'s block of `block` rows); the caller
    /// adds K, the outputs and the chunk.
    fn slot_params(&self, w: &GpuWeight, block: u32) -> Params {
        Params {
            rows: self.rows * self.heads,
            topk: self.heads,
            x_off: self.x.offset,
            x_stride: self.head_stride,
            x_row: self.x.stride,
            x_per_slot: 1,
            y_off: self.y.offset,
            y_stride: self.y_head,
            n_experts: self.heads,
            ws: w.stride as u32,
            e_rows: block,
            r_lo: self.win.first,
            e_direct: 1,
            ..Params::zeroed()
        }
    }

    /// Whether a GEMV serves these rows: at most [`GEMV_MAX_ROWS`] (any number where `cpu`:
    /// the CPU adapters' GEMVs beat the tile's barriers there, as for the routed experts),
    /// and past one row y's heads follow each other (each head's row is a slot's row).
    fn gemv(&self, cpu: bool) -> bool {
        self.rows == 1
            || ((self.rows <= GEMV_MAX_ROWS || cpu) && self.y.stride == self.heads * self.y_head)
    }
}

/// For each token row t and head h,
/// `y[t, h, v] = Σ_k x[t, h, k] · w[h * block + win.first + v, k]`, `v < win.n`, k over
/// `w.cols`: absorbed MLA's value up-projection
/// (`attention::up_v`). At decode and verification the routed-expert GEMV with head h as
/// slot h's expert; at more rows (a prefill chunk) the per-head GEMM (`gemm_heads`: the
/// GEMM tile per head, on tensor cores where the device has them).
pub fn matmul_heads(rec: &mut Recorder, w: &GpuWeight, h: &Heads) {
    if h.rows == 0 || h.heads == 0 || w.rows == 0 {
        return;
    }
    if !h.gemv(super::cpu_kernels(rec.gpu())) {
        heads_gemm(rec, w, h, false);
        return;
    }
    let routed = Routed {
        ids: rec.gpu().dummy(),
        n_experts: h.heads,
        topk: h.heads,
    };
    let slots = View::new(h.x.buf, h.x.offset, h.head_stride);
    let y = View::new(h.y.buf, h.y.offset, h.y_head);
    experts_as(
        rec,
        slots,
        None,
        true,
        w,
        &routed,
        Some(h.win),
        y,
        h.rows,
        h.x.stride,
    )
}

/// Columns of a `gemvt_experts` workgroup, in 16-byte words (`TW` in the shader).
const GEMVT_WORDS: u32 = 8;

/// The transposed product of [`matmul_heads`]: for each token row t and head h,
/// `y[t, h, c] = Σ_{d < win.n} x[t, h, d] · w[h * block + win.first + d, c]` for every
/// column c of `w`: absorbed MLA's query absorption (`attention::absorb_q`). At decode and
/// verification a per-head transposed GEMV that reads each row of the windows once per token
/// row in 16-byte words (where `w`'s rows are whole words); otherwise the per-head GEMM
/// reading the weights transposed.
pub fn matmul_heads_t(rec: &mut Recorder, w: &GpuWeight, h: &Heads) {
    if h.rows == 0 || h.heads == 0 || w.rows == 0 {
        return;
    }
    let cpu = super::cpu_kernels(rec.gpu());
    let words = whole_words(w);
    if !(h.gemv(cpu) && (words || cpu)) {
        heads_gemm(rec, w, h, true);
        return;
    }
    let Heads {
        x,
        y,
        heads,
        win,
        rows,
        ..
    } = *h;
    let block = block_rows("matmul_heads_t", w, heads, Some(win));
    let entry = match (cpu, words) {
        (true, true) => "gemvt_cpu",
        (true, false) => "gemvt_cpu1",
        (false, _) => "gemvt_experts",
    };
    let pipe = pipeline(rec, entry, w, KNOBS);
    let slots = rows * heads;
    let row_words = (w.cols / w.format.per_word()) as u32;
    // Workgroups: one per (slot, GEMVT_WORDS columns); on CPU adapters one lane per (slot,
    // column word), or per (slot, column) where rows are not whole words.
    let groups = match (cpu, words) {
        (true, true) => (slots * row_words).div_ceil(cpu_wg()),
        (true, false) => (slots * w.cols as u32).div_ceil(cpu_wg()),
        (false, _) => slots * row_words.div_ceil(GEMVT_WORDS),
    };
    for c in &w.chunks {
        if c.rows == 0 {
            continue;
        }
        let p = Params {
            k: w.cols as u32,
            n: win.n,
            row0: c.row0 as u32,
            crow: c.rows as u32,
            ..h.slot_params(w, block)
        };
        let (k, n, sl) = (w.cols as u64, win.n as u64, slots as u64);
        rec.cost(
            heads as u64 * n * w.row_bytes() + 4 * sl * (k + n),
            2 * sl * n * k,
            w.format.name(),
        );
        let scale = c.scale.as_ref().unwrap_or(rec.gpu().dummy());
        let grid = rec.gpu().grid(groups);
        rec.dispatch(
            &pipe,
            &p,
            &[x.buf, &c.buf, y.buf, scale, rec.gpu().dummy()],
            grid,
        );
    }
}

/// The per-head GEMM of [`matmul_heads`] (`transposed`: of [`matmul_heads_t`]): one
/// workgroup per (head, 64 token rows, [`tile_cols`] outputs), the GEMM tile over the head's
/// window.
fn heads_gemm(rec: &mut Recorder, w: &GpuWeight, h: &Heads, transposed: bool) {
    let Heads {
        x,
        head_stride,
        heads,
        win,
        y,
        rows,
        ..
    } = *h;
    assert_eq!(
        w.chunks.len(),
        1,
        "per-head GEMM: the weight must be one chunk ({} chunks of a {}×{} matrix)",
        w.chunks.len(),
        w.rows,
        w.cols
    );
    let block = block_rows("per-head GEMM", w, heads, Some(win));
    // K and outputs per head: a window's rows by the columns, or the columns transposed.
    let (k, n) = match transposed {
        false => (w.cols as u32, win.n),
        true => (win.n, w.cols as u32),
    };
    let x4 = x_in_quads(View::new(x.buf, x.offset, head_stride), x.stride, k);
    let pipe = pipeline(rec, "gemm_heads", w, Knobs { x4, ..KNOBS });
    let c = &w.chunks[0];
    let p = Params {
        k,
        n,
        y_row: y.stride,
        w_t: transposed as u32,
        ..h.slot_params(w, block)
    };
    let tiles = heads as u64
        * rows.div_ceil(tile_rows(rec, w.format, "gemm_heads", KNOBS)) as u64
        * n.div_ceil(tile_cols(rec, w.format, "gemm_heads", KNOBS)) as u64;
    assert!(
        tiles <= u32::MAX as u64,
        "per-head GEMM: too many workgroups"
    );
    let (kk, nn, sl) = (k as u64, n as u64, (rows * heads) as u64);
    rec.cost(
        heads as u64 * win.n as u64 * w.row_bytes() + 4 * sl * (kk + nn),
        2 * sl * nn * kk,
        w.format.name(),
    );
    let scale = c.scale.as_ref().unwrap_or(rec.gpu().dummy());
    let grid = rec.gpu().grid(tiles as u32);
    rec.dispatch(&pipe, &p, &[x.buf, &c.buf, y.buf, scale], grid);
}

/// Sparse MLA's products over a block of `rows` query rows as GEMMs on the tile
/// ([`mla_logits`], [`mla_values`]): query row `t` (chunk row `row0 + t`) has `heads` x rows
/// and attends the positions `idx[(row0 + t) · topk + j]`, `j < min(cnt[row0 + t], topk)`,
/// whose rows are read from one cache segment at a time: rows of `row_elems` elements in
/// `format` (f32 or bf16).
pub struct MlaGemm<'a> {
    pub rows: u32,
    pub row0: u32,
    pub heads: u32,
    pub idx: &'a wgpu::Buffer,
    pub cnt: &'a wgpu::Buffer,
    pub topk: u32,
    pub format: DType,
    pub row_elems: u32,
    /// `mla_logits`: chunk rows per tile row (1, or G: `rows` tile rows of `heads` x rows
    /// each, row t being chunk rows `row0 + G t ..` of `heads / G` heads each). Each row's
    /// selection must be its positions from the first, in order, and the G rows consecutive
    /// positions of one sequence: the tile reads the last row's selection, and the others'
    /// logits end at their own counts (entries past them are not written).
    pub group: u32,
}

impl MlaGemm<'_> {
    fn params(&self, seg: &Segment) -> Params {
        Params {
            rows: self.rows,
            topk: self.topk,
            ws: self.row_elems,
            heads: self.heads,
            seg_lo: seg.lo,
            seg_n: seg.len,
            q_row0: self.row0,
            q_group: self.group,
            splits: 1,
            ..Params::default()
        }
    }

    fn dispatch(
        &self,
        rec: &mut Recorder,
        entry: &'static str,
        p: Params,
        x: View,
        bufs: [&wgpu::Buffer; 2],
    ) {
        let x4 = x_in_quads(x, p.x_stride, p.k);
        // Row pairs of the logits with f16 operands on tensor cores: 128-row tiles.
        let m128 = self.group > 1
            && rec.gpu().tensor_cores()
            && entry == "mla_logits"
            && coop_mla_f16(entry, rec.exact_gemms());
        let (f, k) = (WFormat::Float(self.format), Knobs { x4, m128, ..KNOBS });
        let pipe = pipeline_for(rec, entry, f, k);
        let tiles = (p.splits * self.rows) as u64
            * self.heads.div_ceil(tile_rows(rec, f, entry, k)) as u64
            * p.n.div_ceil(tile_cols(rec, f, entry, k)) as u64;
        assert!(tiles <= u32::MAX as u64, "{entry}: too many workgroups");
        let grid = rec.gpu().grid(tiles as u32);
        // The positions and counts where the scales and expert ids go (matmul.wgsl, sel_pos).
        rec.dispatch(
            &pipe,
            &p,
            &[x.buf, bufs[0], bufs[1], self.idx, self.cnt],
            grid,
        );
    }
}

/// `s[(t · heads + h) · s.stride + j] = q[t, h, :k] · seg[idx_j, :k]` for the selected positions
/// `j` in segment `seg`; where `first`, a logit of -10^30 (no weight) for the others, else
/// their entries are left as they are. `q` rows `(t · heads + h) · q.stride` from
/// `q.offset`, `n` columns per row (at least every count).
#[allow(clippy::too_many_arguments)]
pub fn mla_logits(
    rec: &mut Recorder,
    g: &MlaGemm,
    q: View,
    k: u32,
    seg: &Segment,
    s: View,
    n: u32,
    first: bool,
) {
    let p = Params {
        k,
        n,
        x_off: q.offset,
        x_stride: q.stride,
        y_off: s.offset,
        y_stride: s.stride,
        accumulate: !first as u32,
        ..g.params(seg)
    };
    let sel = (g.rows as u64 * g.heads as u64) * n as u64;
    rec.cost(sel * 4 * (k as u64 + 1), 2 * sel * k as u64, "");
    g.dispatch(rec, "mla_logits", p, q, [&seg.buf, s.buf]);
}

/// `o[s · split.1 + t · o.stride + h · n + c] (=, or += where `add`) Σ_j p[t, h, j] ·
/// seg[idx_j, c]` over the selected positions `j` in segment `seg` and in split `s` of
/// `split.0` (positions `s · len .. (s + 1) · len`, `len = k / split.0`), `c < n`; `p` rows
/// `(t · heads + h) · p.stride` from `p.offset`, `k` columns (at least every count; zeros
/// past a row's count; `len` a multiple of 64).
#[allow(clippy::too_many_arguments)]
pub fn mla_values(
    rec: &mut Recorder,
    g: &MlaGemm,
    p: View,
    k: u32,
    seg: &Segment,
    o: View,
    n: u32,
    add: bool,
    (splits, y_split): (u32, u32),
) {
    assert!(
        splits >= 1 && k.is_multiple_of(64 * splits),
        "mla_values: {k} positions do not make {splits} splits of whole 64-position tiles"
    );
    let params = Params {
        k: k / splits,
        n,
        x_off: p.offset,
        x_stride: p.stride,
        y_off: o.offset,
        y_stride: o.stride,
        w_t: 2,
        accumulate: add as u32,
        splits,
        y_split,
        ..g.params(seg)
    };
    let sel = (g.rows as u64 * g.heads as u64) * k as u64;
    rec.cost(sel * 4 * (n as u64 + 1), 2 * sel * n as u64, "");
    g.dispatch(rec, "mla_values", params, p, [&seg.buf, o.buf]);
}

/// Rows of each of the `n` blocks `w` stacks (checked: whole blocks, `win` inside one).
fn block_rows(what: &str, w: &GpuWeight, n: u32, win: Option<Window>) -> u32 {
    assert!(
        w.rows.is_multiple_of(n as usize),
        "{what}: {} rows do not split into {n} blocks",
        w.rows
    );
    let block = (w.rows / n as usize) as u32;
    if let Some(win) = win {
        assert!(
            win.first + win.n <= block,
            "{what}: rows {}..{} are outside blocks of {block}",
            win.first,
            win.first + win.n
        );
    }
    block
}

/// `win`: None for MoE experts (whole blocks, ids read); Some for [`matmul_heads`].
#[allow(clippy::too_many_arguments)]
fn experts_as(
    rec: &mut Recorder,
    x: View,
    xq: Option<&XQuant>,
    x_per_slot: bool,
    w: &GpuWeight,
    routed: &Routed,
    win: Option<Window>,
    y: View,
    rows: u32,
    x_row: u32,
) {
    let Routed {
        ids: experts,
        n_experts,
        topk,
    } = *routed;
    debug_assert!(
        x.buf != y.buf && experts != y.buf,
        "matmul_experts: y must be a buffer of its own"
    );
    if rows == 0 || topk == 0 || n_experts == 0 || w.rows == 0 {
        return;
    }
    let block = block_rows("matmul_experts", w, n_experts, win);
    let direct = win.is_some();
    let win = win.unwrap_or(Window { first: 0, n: block });
    // Rows multiplied per slot.
    let rpe = win.n;
    let slots = rows * topk;
    // On CPU adapters the per-slot GEMV serves a prefill chunk's slots too (faster there
    // than the tile's barriers, as for `matmul`'s GEMV passes).
    let cpu_kernels = super::cpu_kernels(rec.gpu());
    let gemv = rows <= GEMV_MAX_ROWS || cpu_kernels;
    let gemv4 = gemv && gemv4_ok(2, x, w);
    // Rows or x the CPU adapters' 16-byte GEMV cannot read: a lane per (slot, row).
    let cpu1 = gemv && !gemv4 && cpu_kernels;
    // q8 / q4: integer dot products, 4 rows per lane (gemv_dot_experts); other 4-bit
    // weights: 4 rows per lane (gemv4q_experts), else RR rows.
    let dot = match xq {
        Some(_) if gemv4 && dot_applies(x, w) => Some(1),
        _ => gemv4.then(|| dot_blocks(rec.gpu(), x, w)).flatten(),
    }
    // A prefill chunk's products stay in f32 (the CPU adapters' per-slot GEMV above).
    .filter(|_| rows <= GEMV_MAX_ROWS);
    let cpu = rec.gpu().adapter.is_cpu();
    let quad = gemv4 && (dot.is_some() || quad_rows(w));
    let (tpr4, rr) = if quad {
        (gemv4_knobs(w, 1, rpe.saturating_mul(slots) / 2, cpu).0, 4)
    } else {
        gemv4_knobs(w, 1, rpe.saturating_mul(slots), cpu)
    };
    let xq = xq.filter(|_| dot.is_some());
    // A few token rows with x quantized: one workgroup per (expert, row group) reads the
    // expert once for all its slots.
    let on_tensor_cores = coop_rows(rec.gpu(), rows);
    let grouped = xq.is_some() && !direct && (rows > 1 || on_tensor_cores);
    // ... on tensor cores where they serve (reading x itself).
    let coop = grouped && on_tensor_cores;
    let xq = xq.filter(|_| !coop);
    let tpr4 = match dot {
        Some(_) => env_tpr().unwrap_or(tpr4),
        None => tpr4,
    };
    let cpu_gemv = gemv4 && dot.is_none() && cpu_kernels;
    let (tpr4, rr) = if cpu_gemv {
        cpu_knobs(w, rpe.saturating_mul(slots), false)
    } else {
        (tpr4, rr)
    };
    // The GEMM's row tiles cut beforehand (expert_tiles), for MoE experts: the GEMM runs
    // exactly where no GEMV does (every kernel below but gemm_experts is one of `gemv`'s).
    let tiles = (!gemv && !direct && expert_tiles_on(n_experts))
        .then(|| {
            expert_tiles(
                rec,
                experts,
                slots,
                n_experts,
                tile_rows(rec, w.format, "gemm_experts", KNOBS),
            )
        })
        .flatten();
    // Over row tiles, the tile may load x's A fragments from an f16 copy of x in the tiles'
    // order instead (where its scratch buffer can be had; else x is staged as usual).
    let x16 = tiles
        .as_ref()
        .filter(|_| coop_a_global(rec, w.format.code(), "gemm_experts"))
        .and_then(|t| {
            let tm = tile_rows(rec, w.format, "gemm_experts", KNOBS);
            let order = SlotOrder {
                table: &t.table,
                list: t.list,
                topk,
                x_per_slot,
                x_row,
            };
            x_to_f16(rec, x, (slots, slots + tm), w.cols as u32, Some(order))
        });
    let x = x16
        .as_ref()
        .map_or(x, |(b, stride)| View::new(b, 0, *stride));
    let pipe = if cpu_gemv {
        pipeline(rec, "gemv_cpu_experts", w, Knobs { tpr4, rr, ..KNOBS })
    } else if coop {
        let x4 = x_in_quads(x, x_row, w.cols as u32);
        pipeline(rec, "gemv_coop_experts_rows", w, Knobs { x4, ..KNOBS })
    } else if grouped {
        pipeline(
            rec,
            "gemv_dot_experts_rows",
            w,
            Knobs {
                wpl: words_per_lane(w, tpr4),
                ..rows_knobs(tpr4, expert_batch(rows), 2)
            },
        )
    } else if let Some(maxb) = dot {
        pipeline(
            rec,
            "gemv_dot_experts",
            w,
            dot_knobs(tpr4, maxb, xq.is_some()),
        )
    } else if quad {
        pipeline(rec, "gemv4q_experts", w, Knobs { tpr4, ..KNOBS })
    } else if gemv4 {
        pipeline(
            rec,
            "gemv4_experts",
            w,
            Knobs {
                t: 1,
                tpr4,
                rr,
                ..KNOBS
            },
        )
    } else if cpu1 {
        pipeline(rec, "gemv_cpu1_experts", w, KNOBS)
    } else if gemv {
        pipeline(rec, "gemv_experts", w, KNOBS)
    } else {
        // Per-slot rows are x_row apart (the token rows) and x.stride apart (the slots).
        let x4 = x_in_quads(x, x_row, w.cols as u32);
        let xa = x16.is_some();
        pipeline(rec, "gemm_experts", w, Knobs { x4, xa, ..KNOBS })
    };
    let mut rows_left = (slots as u64 * rpe as u64).min(n_experts as u64 * rpe as u64);
    let mut counted = false;
    for c in &w.chunks {
        if c.rows == 0 {
            continue;
        }
        // Experts with at least one row in this chunk (the whole expert unless the chunk
        // boundaries split one; the kernels handle both).
        let e0 = (c.row0 / block as usize) as u32;
        let e1 = (c.row0 + c.rows).div_ceil(block as usize) as u32;
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
            ws: w.stride as u32,
            accumulate: 0,
            e_rows: block,
            r_lo: win.first,
            e_direct: direct as u32,
            x_row,
            e_list: tiles.as_ref().map_or(0, |t| t.list),
            x_copy: x16.is_some() as u32,
            ..Params::default()
        };
        let groups = if let Some(t) = &tiles {
            t.most * rpe.div_ceil(tile_cols(rec, w.format, "gemm_experts", KNOBS))
        } else if cpu_gemv {
            slots * rpe.div_ceil(cpu_wg() / tpr4 * rr)
        } else if coop {
            (e1 - e0) * rpe.div_ceil(coop_rows_cols())
        } else if grouped {
            (e1 - e0) * rpe.div_ceil(rows_per_workgroup(tpr4))
        } else if gemv4 {
            slots * rpe.div_ceil(256 / tpr4 * rr)
        } else if cpu1 {
            (slots * rpe).div_ceil(cpu_wg())
        } else if gemv {
            slots * rpe.div_ceil(GEMV_RPW)
        } else {
            (e1 - e0) * rpe.div_ceil(tile_cols(rec, w.format, "gemm_experts", KNOBS))
        };
        let grid = rec.gpu().grid(groups);
        let scale = c.scale.as_ref().unwrap_or(rec.gpu().dummy());
        // Rows read: each slot's expert once (distinct experts may be fewer; this is the
        // bound for decode, where the slots of one token name distinct experts), over all
        // the chunks together; x, y and the products are counted once, with the first.
        let (k, n, sl) = (w.cols as u64, rpe as u64, slots as u64);
        let read_rows = rows_left.min(c.rows as u64);
        rows_left -= read_rows;
        let (xy_bytes, flops) = match counted {
            true => (0, 0),
            false => (4 * sl * (k + n), 2 * sl * n * k),
        };
        counted = true;
        rec.cost(read_rows * w.row_bytes() + xy_bytes, flops, w.format.name());
        let xb = xq.map_or(x.buf, |q| q.buf);
        let ids = tiles.as_ref().map_or(experts, |t| &t.table);
        rec.dispatch(&pipe, &p, &[xb, &c.buf, y.buf, scale, ids], grid);
    }
}

/// The routed GEMM's row tiles ([`expert_tiles`]): the table, where its sorted slots start,
/// and how many tiles it may hold (the GEMM's workgroups per column block).
struct ExpertTiles {
    table: wgpu::Buffer,
    list: u32,
    most: u32,
}

/// Whether `gemm_experts` runs over row tiles cut beforehand ([`expert_tiles`]) for
/// `n_experts` experts: a workgroup per (row tile, column block), those running together on
/// one column block's weights, instead of a workgroup per (expert, column block) walking its
/// expert's rows: the routed gate and up of `examples/gemm_shapes` (2,048 rows, 16 experts,
/// q4) took 7.5 ms against 15.4 walking, full-depth GLM-5 q4 prefill 746 tok/s against 683
/// (H200, 2026-12-07; BENCHMARKS.md). `SPARSA_EXPERT_TILES=0` keeps the walk (a measurement
/// aid).
fn expert_tiles_on(n_experts: u32) -> bool {
    #[cfg(test)]
    if let Some(on) = tests::EXPERT_TILES.with(|c| c.get()) {
        return on && n_experts <= EXPERT_TILES_MAX;
    }
    n_experts <= EXPERT_TILES_MAX && knob_on!("SPARSA_EXPERT_TILES")
}

/// Records the cut of `slots` slots, routed by `ids` to `n_experts` experts, into tiles of
/// at most `tm` rows of one expert each (shaders/expert_tiles.wgsl); None where its scratch
/// buffer cannot be had (the GEMM then walks each expert's rows itself).
fn expert_tiles(
    rec: &mut Recorder,
    ids: &wgpu::Buffer,
    slots: u32,
    n_experts: u32,
    tm: u32,
) -> Option<ExpertTiles> {
    // Each expert with a slot has one partial tile at most.
    let most = slots.div_ceil(tm) + n_experts.min(slots);
    let list = 1 + 3 * most;
    let gpu = rec.gpu();
    let table = gpu
        .scratch("expert tiles", 4 * (list as u64 + slots as u64))
        .ok()?;
    let pipe = gpu.pipeline_n(&EXPERT_TILES, "expert_tiles", &[], &[]);
    let p = TileParams {
        slots,
        n_experts,
        tm,
        list,
    };
    rec.dispatch(&pipe, &p, &[ids, &table], [1, 1, 1]);
    Some(ExpertTiles { table, list, most })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testutil::{
        abs_dot, assert_close_plus, gpu, gpu_default_limits, x_f16_bound, x_split_bound, Rng,
    };

    thread_local! {
        /// What [`rows_quads`] and [`rows_wg`] answer on this thread (tests run every
        /// layout of the few-rows kernels).
        pub(super) static ROWS_LAYOUT: std::cell::Cell<Option<(u32, u32)>> = const { std::cell::Cell::new(None) };
        /// Set: [`cpu_shares_x`] answers no on this thread (tests run both CPU GEMVs).
        pub(super) static CPU_SG_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// What `SPARSA_DOT_SG` answers on this thread ([`dot_sg_lanes`]; tests run both
        /// reductions).
        pub(super) static DOT_SG: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
        /// What `SPARSA_DOT_I2F` answers on this thread ([`dot_i2f`]).
        pub(super) static DOT_I2F: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
        /// What `SPARSA_EXPERT_TILES` answers on this thread ([`expert_tiles_on`]; tests run
        /// both forms of the routed GEMM).
        pub(super) static EXPERT_TILES: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    }
    use crate::kernels::with_cpu_kernels;
    use crate::weights::{quant, DType, QFormat, WFormat};

    /// Whether `matmul` runs the integer-dot GEMV for this call (`kind` as given to
    /// `run_matmul`: forced, or picked as `matmul` picks it).
    fn int_dot(kind: Option<Dense>, rows: usize, x: View, w: &GpuWeight) -> bool {
        let dev = Dev::of(gpu());
        match kind {
            Some(k) => matches!(k, Dense::GemvDot(..)),
            None if rows == 1 => matches!(
                Dense::pick(1, x, w, dev, dot_blocks(gpu(), x, w)),
                Dense::GemvDot(..)
            ),
            None => !dev.cpu_gemvs && dot_passes(gpu(), x, w, rows as u32),
        }
    }

    const DTYPES: [DType; 3] = [DType::F32, DType::BF16, DType::F16];
    const QUANT: [QFormat; 5] = [
        QFormat::Fp8,
        QFormat::Q8 { block: 32 },
        QFormat::Q4 { block: 32 },
        QFormat::Q8 { block: 128 },
        QFormat::Q4 { block: 64 },
    ];
    const SENTINEL: f32 = -1234.5;

    /// FP8 codes worth covering: ±0, subnormals, the smallest normal, ±max finite.
    const E4M3_SPECIAL: [u8; 9] = [0x00, 0x80, 0x01, 0x07, 0x81, 0x87, 0x08, 0x7E, 0xFE];

    /// `wv` ([n, k]) on the GPU in `fmt`, and the values the GPU sees (CPU decode of the
    /// same bytes). FP8 matrices get special codes sprinkled in.
    fn make_weight(
        wv: &[f32],
        n: usize,
        k: usize,
        fmt: WFormat,
        align_rows: usize,
        chunk: Option<usize>,
    ) -> (GpuWeight, Vec<f32>) {
        let g = gpu();
        match fmt {
            WFormat::Float(dtype) => {
                let bytes = dtype.from_f32(wv);
                let w = GpuWeight::upload_bytes(
                    g,
                    &[&bytes],
                    n,
                    k,
                    dtype,
                    align_rows,
                    chunk,
                    ("w", false),
                )
                .unwrap();
                (w, rounded(wv, dtype))
            }
            WFormat::Quant(q) => {
                let (mut wb, sb) = match q {
                    QFormat::Fp8 => quant::quantize_fp8(wv, n, k),
                    _ => quant::quantize_rows(q, wv, k),
                };
                if q == QFormat::Fp8 {
                    for (i, c) in E4M3_SPECIAL.iter().enumerate() {
                        let at = (i * 7919 + 13) % wb.len();
                        wb[at] = *c;
                    }
                }
                let w = GpuWeight::upload_quant_raw(g, &wb, &sb, n, k, q, chunk, "w").unwrap();
                (w, quant::dequantize_rows(q, &wb, &sb, 0, n, k))
            }
        }
    }

    /// The values the GPU sees for `w` stored as `dtype`.
    fn rounded(w: &[f32], dtype: DType) -> Vec<f32> {
        dtype.to_f32(&dtype.from_f32(w))
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum::<f64>() as f32
    }

    fn check_matmul(
        seed: u64,
        rows: usize,
        k: usize,
        n: usize,
        dtype: impl Into<WFormat>,
        chunk: Option<usize>,
    ) {
        run_matmul(seed, rows, k, n, dtype, chunk, None, (5, k + 3));
    }

    fn check_matmul_as(
        seed: u64,
        rows: usize,
        k: usize,
        n: usize,
        dtype: impl Into<WFormat>,
        chunk: Option<usize>,
        kind: Dense,
    ) {
        run_matmul(seed, rows, k, n, dtype, chunk, Some(kind), (5, k + 3));
    }

    /// Runs `matmul` (or the given kernel) with x at `(x_off, x_stride)` and y at offset 7,
    /// stride n + 2, and checks every element of y's buffer: the product where written, the
    /// sentinel elsewhere.
    #[allow(clippy::too_many_arguments)]
    fn run_matmul(
        seed: u64,
        rows: usize,
        k: usize,
        n: usize,
        dtype: impl Into<WFormat>,
        chunk: Option<usize>,
        kind: Option<Dense>,
        xv: (usize, usize),
    ) {
        run_matmul_xq(seed, rows, k, n, dtype.into(), chunk, kind, xv, false)
    }

    /// [`run_matmul`]; with `xq`, x quantized beforehand (`quantize_x` + `matmul_xq`, one
    /// row; `kind` must be None).
    #[allow(clippy::too_many_arguments)]
    fn run_matmul_xq(
        seed: u64,
        rows: usize,
        k: usize,
        n: usize,
        dtype: WFormat,
        chunk: Option<usize>,
        kind: Option<Dense>,
        (x_off, x_stride): (usize, usize),
        xq: bool,
    ) {
        let g = gpu();
        let mut rng = Rng::new(seed);
        let (y_off, y_stride) = (7usize, n + 2);
        let xs = rng.vec(x_off + rows * x_stride, 1.0);
        let wv = rng.vec(n * k, 1.0);
        let (wgt, wr) = make_weight(&wv, n, k, dtype, 1, chunk);
        if let Some(c) = chunk {
            assert_eq!(wgt.chunks.len(), n.div_ceil(c), "chunking not exercised");
        }
        let xb = g.buffer_from(&xs, "x").unwrap();
        let ylen = y_off + rows * y_stride + 3;
        let yb = g.buffer_from(&vec![SENTINEL; ylen], "y").unwrap();
        let xv = View::new(&xb, x_off as u32, x_stride as u32);
        let yv = View::new(&yb, y_off as u32, y_stride as u32);
        // As a prompt's prefill records (on tensor cores, q4's GEMMs with x as one f16 value).
        let mut rec = g.recorder();
        rec.set_prefill(true);
        let qb = g
            .buffer(xq_bytes(k as u32, rows as u32).max(16), "xq")
            .unwrap();
        let q = xq.then(|| {
            let order = takes_xq(xv, &wgt).expect("x quantized beforehand applies");
            quantize_x(&mut rec, xv, rows as u32, k as u32, order, &qb)
        });
        match (kind, &q) {
            (Some(kind), q) => {
                matmul_as(&mut rec, xv, &wgt, yv, rows as u32, kind, q.as_ref(), false)
            }
            (None, Some(q)) => matmul_xq(&mut rec, q, xv, &wgt, yv),
            (None, None) => matmul(&mut rec, xv, &wgt, yv, rows as u32),
        }
        rec.finish().unwrap();
        let got = g.read_f32(&yb, 0, ylen).unwrap();
        let mut want = vec![SENTINEL; ylen];
        let mut extra = vec![0.0; ylen];
        // A GEMM runs past the GEMV passes' rows, or where `kind` asks for the tile.
        let f16_x = gemm_x_f16(g, wgt.format)
            && (rows > GEMV_PASSES_MAX_ROWS as usize || matches!(kind, Some(Dense::Gemm(64))));
        for t in 0..rows {
            let xr = &xs[x_off + t * x_stride..][..k];
            for j in 0..n {
                let wj = &wr[j * k..][..k];
                want[y_off + t * y_stride + j] = dot(xr, wj);
                if xq || int_dot(kind, rows, xv, &wgt) {
                    extra[y_off + t * y_stride + j] = x_split_bound(xr, wj);
                } else if f16_x {
                    extra[y_off + t * y_stride + j] = x_f16_bound(abs_dot(xr, wj));
                }
            }
        }
        let what =
            format!("matmul kind={kind:?} rows={rows} k={k} n={n} {dtype:?} chunk={chunk:?}");
        assert_close_plus(&got, &want, 1e-4, 1e-4, &extra, &what);
    }

    #[test]
    fn x_to_f16_copies_rows_and_routed_slots() {
        // The f16 copy of x that the tile with A fragments from memory reads
        // (SPARSA_COOP_A_GLOBAL; the copy runs on any adapter): rows of x (an offset, rows
        // wider than K), and the rows of routed slots in a table's order (a row per token,
        // and a row per slot); K padded to a whole K-step and rows past the last, zeros.
        let g = gpu();
        let mut rng = Rng::new(61);
        let (k, stride, off, tokens, topk) = (70u32, 75u32, 3u32, 5u32, 3u32);
        let x = rng.vec((off + tokens * topk * stride) as usize, 4.0);
        let xb = g.buffer_from(&x, "x").unwrap();
        let list = 4u32;
        let order = [7u32, 0, 14, 3, 8, 12, 1];
        let table: Vec<u32> = [9; 4].into_iter().chain(order).collect();
        let tb = g.buffer_from(&table, "table").unwrap();
        for (case, per_slot) in [(None, false), (Some(false), false), (Some(true), true)] {
            let rows = match case {
                None => tokens,
                Some(_) => order.len() as u32,
            };
            let slots = case.map(|_| SlotOrder {
                table: &tb,
                list,
                topk,
                x_per_slot: per_slot,
                x_row: 0,
            });
            let mut rec = g.recorder();
            let (buf, kpad) = x_to_f16(
                &mut rec,
                View::new(&xb, off, stride),
                (rows, rows + 5),
                k,
                slots,
            )
            .unwrap();
            rec.finish().unwrap();
            assert_eq!(kpad, 128);
            let got = g
                .read_u32(&buf, 0, ((rows + 5) * kpad / 2) as usize)
                .unwrap();
            // Row r's first element in x (slot_x.wgsl's formula).
            let src = |r: u32| match case {
                None => off + r * stride,
                Some(_) => {
                    let s = order[r as usize];
                    let (t, j) = (s / topk, s % topk);
                    match per_slot {
                        false => off + t * stride,
                        true => off + t * topk * stride + j * stride,
                    }
                }
            };
            for (i, &w) in got.iter().enumerate() {
                let (r, c) = (i as u32 / (kpad / 2), 2 * (i as u32 % (kpad / 2)));
                for (half, c) in [(w & 0xffff, c), (w >> 16, c + 1)] {
                    let want = match r < rows && c < k {
                        true => half::f16::from_f32(x[(src(r) + c) as usize]).to_bits() as u32,
                        false => 0,
                    };
                    // Rounded to nearest; a GPU may round the other way (one f16 step).
                    assert!(
                        half.abs_diff(want) <= 1,
                        "x_to_f16 {case:?} row {r} column {c}: {half:#x}, want {want:#x}"
                    );
                }
            }
        }
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
    fn gemv_passes() {
        // Between GEMV_MAX_ROWS and GEMV_PASSES_MAX_ROWS rows `matmul` runs several GEMVs.
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            check_matmul(300 + i as u64, 17, 577, 131, dtype, Some(64));
            run_matmul(
                310 + i as u64,
                GEMV_PASSES_MAX_ROWS as usize,
                520,
                37,
                dtype,
                None,
                None,
                (4, 524),
            );
        }
    }

    #[test]
    fn gemv4_lanes_on_cpu_and_gpu() {
        // The built-in model's 256-wide q8 rows are 16 words: a GPU gives a row 64 lanes, a
        // CPU adapter 4 (each lane walks 4 words; the fewest lanes the kernel takes).
        let q8 = WFormat::Quant(QFormat::Q8 { block: 32 });
        let w = make_weight(&[0.5; 2 * 256], 2, 256, q8, 1, None).0;
        assert_eq!(gemv4_knobs(&w, 1, 6144, false), (64, 2));
        assert_eq!(gemv4_knobs(&w, 1, 6144, true), (4, 2));
        // 768 bf16 rows of 256 (32 words): lanes added back on a GPU until the dispatch has
        // 256 workgroups (a whole workgroup per row pair), none on a CPU.
        let b = make_weight(
            &[0.5; 2 * 256],
            2,
            256,
            WFormat::Float(DType::BF16),
            1,
            None,
        )
        .0;
        assert_eq!(gemv4_knobs(&b, 1, 768, false), (256, 2));
        assert_eq!(gemv4_knobs(&b, 1, 768, true), (4, 2));
        // Two x rows: at least 4 lanes a row either way; long rows keep 64 lanes.
        let long = make_weight(&[0.5; 2 * 6144], 2, 6144, q8, 1, None).0;
        assert_eq!(gemv4_knobs(&long, 2, 6144, true), (32, 2));
    }

    #[test]
    fn gemv4_all_dtypes_and_shapes() {
        let g = gpu();
        // The picker takes the 16-byte path only for aligned rows and x.
        let w = GpuWeight::from_f32(g, &[0.0; 16 * 24], 16, 24, DType::BF16, None, "w").unwrap();
        let xb = g.buffer(4 * 1024, "x").unwrap();
        assert!(matches!(
            Dense::pick(3, View::new(&xb, 4, 28), &w, Dev::default(), None),
            Dense::Gemv4(..)
        ));
        assert_eq!(
            Dense::pick(3, View::new(&xb, 4, 26), &w, Dev::default(), None),
            Dense::Gemv
        );
        assert_eq!(
            Dense::pick(3, View::new(&xb, 2, 28), &w, Dev::default(), None),
            Dense::Gemv
        );
        assert!(matches!(
            Dense::pick(1, View::new(&xb, 4, 26), &w, Dev::default(), None),
            Dense::Gemv4(..)
        ));
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            for (tpr, rr) in [(64, 1), (16, 2), (256, 2), (8, 1)] {
                for rows in [1, 2, 5, GEMV_MAX_ROWS as usize] {
                    let s = 100 + i as u64 * 100 + tpr as u64 + rr as u64 * 1000 + rows as u64;
                    // K of 520 elements: not a multiple of the lanes' stride.
                    run_matmul(
                        s,
                        rows,
                        520,
                        37,
                        dtype,
                        None,
                        Some(Dense::Gemv4(tpr, rr)),
                        (8, 524),
                    );
                    run_matmul(
                        s + 1,
                        rows,
                        24,
                        131,
                        dtype,
                        Some(7),
                        Some(Dense::Gemv4(tpr, rr)),
                        (4, 36),
                    );
                }
            }
            run_matmul(
                1000 + i as u64,
                4,
                520,
                131,
                dtype,
                Some(38),
                None,
                (0, 520),
            );
        }
    }

    #[test]
    fn gemv_cpu_all_formats_and_shapes() {
        let g = gpu();
        let w = GpuWeight::from_f32(g, &[0.0; 16 * 24], 16, 24, DType::BF16, None, "w").unwrap();
        let xb = g.buffer(4 * 1024, "x").unwrap();
        let cpu = Dev {
            cpu: true,
            cpu_gemvs: true,
            ..Dev::default()
        };
        assert!(matches!(
            Dense::pick(3, View::new(&xb, 4, 28), &w, cpu, None),
            Dense::GemvCpu(..)
        ));
        // Misaligned x, or rows of part of a 16-byte word: the CPU adapters' any-layout GEMV.
        assert_eq!(
            Dense::pick(3, View::new(&xb, 4, 26), &w, cpu, None),
            Dense::GemvCpu1
        );
        let odd = GpuWeight::from_f32(g, &[0.0; 16 * 22], 16, 22, DType::F16, None, "w").unwrap();
        assert_eq!(
            Dense::pick(1, View::new(&xb, 4, 28), &odd, cpu, None),
            Dense::GemvCpu1
        );
        let formats = DTYPES
            .map(WFormat::from)
            .into_iter()
            .chain(QUANT.map(WFormat::Quant));
        for (i, f) in formats.enumerate() {
            // K of whole 16-byte words in every format (1024: 32 q4 words, 256 f32 ones).
            let k = if matches!(f, WFormat::Float(_)) {
                520
            } else {
                1024
            };
            // (1, 4) and (1, 8) with several rows: gemv_cpu_sg where the adapter has
            // subgroups, then gemv_cpu. Every layout for f32 and the q4 formats, two for the
            // others (the layouts do not depend on the format's decoding).
            let all = i == 0 || matches!(f, WFormat::Quant(QFormat::Q4 { .. }));
            let layouts = [
                (1, 8, false),
                (16, 8, false),
                (1, 4, false),
                (1, 8, true),
                (2, 4, false),
                (4, 8, false),
            ];
            for (tpr, rr, sg_off) in layouts.into_iter().take(if all { 6 } else { 2 }) {
                CPU_SG_OFF.with(|c| c.set(sg_off));
                for rows in [1, 3, GEMV_MAX_ROWS as usize] {
                    let s = 7000 + i as u64 * 100 + tpr as u64 + rr as u64 * 10 + rows as u64;
                    let kind = Some(Dense::GemvCpu(tpr, rr));
                    // 37 rows: the last lane group's second quad partly or wholly past n.
                    run_matmul(s, rows, k, 37, f, None, kind, (4, k + 4));
                    // Chunks of 7 rows: quads straddle chunk ends.
                    run_matmul(s + 50, rows, k, 131, f, Some(7), kind, (0, k));
                }
            }
            CPU_SG_OFF.with(|c| c.set(false));
            // gemv_cpu1: odd K (rows off word boundaries; 16-bit rows starting mid-word), x at
            // an odd offset and stride, chunks of 7 rows.
            let k1 = if matches!(f, WFormat::Float(_)) {
                77
            } else {
                96
            };
            for rows in [1, 2, 5, GEMV_MAX_ROWS as usize] {
                let s = 7900 + i as u64 * 100 + rows as u64;
                let kind = Some(Dense::GemvCpu1);
                run_matmul(s, rows, k1, 37, f, None, kind, (3, k1 + 5));
                run_matmul(s + 50, rows, k1, 131, f, Some(7), kind, (1, k1));
            }
        }
    }

    #[test]
    fn gemv_chunked() {
        // The GPUs' GEMVs and the CPU adapters' (gemv_cpu1 where K is odd).
        for cpu in [false, true] {
            with_cpu_kernels(cpu, || {
                for (i, dtype) in DTYPES.into_iter().enumerate() {
                    // Odd chunk row counts: with an odd K every other 16-bit row starts
                    // mid-word.
                    check_matmul(20 + i as u64, 1, 577, 131, dtype, Some(37));
                    check_matmul(23 + i as u64, 2, 64, 131, dtype, Some(16));
                    check_matmul(26 + i as u64, 5, 3, 9, dtype, Some(1));
                }
            });
        }
    }

    const GEMMS: [Dense; 2] = [Dense::Gemm(64), Dense::Gemm(128)];

    #[test]
    fn gemm_all_dtypes_odd_sizes() {
        let w =
            GpuWeight::from_f32(gpu(), &[0.0; 8 * 1280], 1280, 8, DType::F32, None, "w").unwrap();
        let xb = gpu().buffer(1024, "x").unwrap();
        assert_eq!(
            Dense::pick(
                GEMV_MAX_ROWS + 1,
                View::rows(&xb, 8),
                &w,
                Dev::default(),
                None
            ),
            Dense::Gemm(64)
        );
        assert_eq!(
            Dense::pick(1280, View::rows(&xb, 8), &w, Dev::default(), None),
            Dense::Gemm(128)
        );
        assert_eq!(
            Dense::pick(
                1280,
                View::rows(&xb, 8),
                &w,
                Dev {
                    tensor_cores: true,
                    ..Dev::default()
                },
                None
            ),
            Dense::Gemm(64)
        );
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            for kind in GEMMS {
                let s = 30 + i as u64 * 10 + if kind == GEMMS[0] { 0 } else { 5 };
                check_matmul_as(s, 37, 577, 131, dtype, None, kind);
                check_matmul_as(s + 1, GEMV_MAX_ROWS as usize + 1, 31, 70, dtype, None, kind);
            }
        }
    }

    #[test]
    fn gemm_chunked_and_multi_tile() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            for kind in GEMMS {
                let s = 60 + i as u64 * 10 + if kind == GEMMS[0] { 0 } else { 5 };
                check_matmul_as(s, 37, 577, 131, dtype, Some(37), kind);
                check_matmul_as(s + 1, 130, 80, 259, dtype, Some(130), kind);
                check_matmul_as(s + 2, 140, 17, 5, dtype, Some(3), kind);
            }
        }
        // Exact tile multiples.
        check_matmul_as(99, 64, 64, 128, DType::BF16, None, Dense::Gemm(64));
        check_matmul_as(98, 128, 64, 256, DType::F16, None, Dense::Gemm(128));
    }

    #[test]
    fn gemv_and_gemm_2d_grid() {
        // More workgroups than fit one grid dimension.
        let n = gpu().max_groups() as usize * GEMV_RPW as usize + 5;
        check_matmul(60, 1, 3, n, DType::BF16, None);
        // (The GEMM tiles share `gpu.grid`; a >65535-tile GEMM case needs an output over
        // 150 MB, more than lavapipe's 128 MiB binding limit, so only the GEMVs test it here.)
        let n = gpu().max_groups() as usize * 4 + 5;
        run_matmul(
            63,
            2,
            8,
            n,
            DType::BF16,
            None,
            Some(Dense::Gemv4(64, 1)),
            (0, 8),
        );
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
        dtype: impl Into<WFormat>,
        x_per_slot: bool,
        align_rows: usize,
        chunk: Option<usize>,
    ) {
        let shape = (rows, topk, n_experts, rpe, k);
        check_experts_xq(
            seed,
            shape,
            dtype.into(),
            x_per_slot,
            align_rows,
            chunk,
            false,
        )
    }

    /// [`check_experts`]; with `xq`, x quantized beforehand (`matmul_experts_xq`).
    fn check_experts_xq(
        seed: u64,
        (rows, topk, n_experts, rpe, k): (usize, usize, usize, usize, usize),
        dtype: WFormat,
        x_per_slot: bool,
        align_rows: usize,
        chunk: Option<usize>,
        xq: bool,
    ) {
        let g = gpu();
        let mut rng = Rng::new(seed);
        let slots = rows * topk;
        let xr_n = if x_per_slot { slots } else { rows };
        // K a multiple of 8: 16-byte aligned rows and x (the gemv4 path); else misaligned x.
        let (x_off, x_stride) = if k.is_multiple_of(8) {
            (4usize, k + 4)
        } else {
            (3usize, k + 1)
        };
        let (y_off, y_stride) = (11usize, rpe + 5);
        let xs = rng.vec(x_off + xr_n * x_stride, 1.0);
        let wv = rng.vec(n_experts * rpe * k, 1.0);
        let (wgt, wr) = make_weight(&wv, n_experts * rpe, k, dtype, align_rows, chunk);
        if chunk.is_some() {
            assert!(wgt.chunks.len() > 1, "chunking not exercised");
        }
        let ex: Vec<u32> = (0..slots)
            .map(|_| rng.below(n_experts as u64) as u32)
            .collect();
        let xb = g.buffer_from(&xs, "x").unwrap();
        let eb = g.buffer_from(&ex, "experts").unwrap();
        let ylen = y_off + slots * y_stride + 2;
        let yb = g.buffer_from(&vec![SENTINEL; ylen], "y").unwrap();
        let xv = View::new(&xb, x_off as u32, x_stride as u32);
        // As matmul_experts decides: GEMV rows, 16-byte x, and gemv_dot's own conditions.
        let int_dot_experts = rows <= GEMV_MAX_ROWS as usize
            && gemv4_ok(2, xv, &wgt)
            && dot_blocks(g, xv, &wgt).is_some();
        let mut rec = g.recorder();
        rec.set_prefill(true);
        let routed = Routed {
            ids: &eb,
            n_experts: n_experts as u32,
            topk: topk as u32,
        };
        let yv = View::new(&yb, y_off as u32, y_stride as u32);
        let qb = g
            .buffer(xq_bytes(k as u32, xr_n as u32).max(16), "xq")
            .unwrap();
        if xq {
            let order = takes_xq(xv, &wgt).expect("x quantized beforehand applies");
            let q = quantize_x(&mut rec, xv, xr_n as u32, k as u32, order, &qb);
            matmul_experts_xq(&mut rec, &q, xv, x_per_slot, &wgt, &routed, yv, rows as u32);
        } else {
            matmul_experts(&mut rec, xv, x_per_slot, &wgt, &routed, yv, rows as u32);
        }
        rec.finish().unwrap();
        let got = g.read_f32(&yb, 0, ylen).unwrap();
        let mut want = vec![SENTINEL; ylen];
        let mut extra = vec![0.0; ylen];
        for s in 0..slots {
            let r = if x_per_slot { s } else { s / topk };
            let xrow = &xs[x_off + r * x_stride..][..k];
            let e = ex[s] as usize;
            for j in 0..rpe {
                let wrow = &wr[(e * rpe + j) * k..][..k];
                want[y_off + s * y_stride + j] = dot(xrow, wrow);
                if int_dot_experts {
                    extra[y_off + s * y_stride + j] = x_split_bound(xrow, wrow);
                } else if rows > GEMV_MAX_ROWS as usize && gemm_x_f16(g, wgt.format) {
                    extra[y_off + s * y_stride + j] = x_f16_bound(abs_dot(xrow, wrow));
                }
            }
        }
        let what = format!(
            "matmul_experts rows={rows} topk={topk} experts={n_experts}×{rpe} k={k} {dtype:?} per_slot={x_per_slot} align={align_rows} chunk={chunk:?}"
        );
        assert_close_plus(&got, &want, 1e-4, 1e-4, &extra, &what);
    }

    #[test]
    fn experts_gemv() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            for (rows, per_slot) in [(1, false), (3, true), (GEMV_MAX_ROWS as usize, false)] {
                let seed = 50 + i as u64 * 10 + rows as u64;
                check_experts(seed, rows, 3, 5, 37, 577, dtype, per_slot, 37, None);
                // Chunks of one and of two experts (odd row counts).
                check_experts(
                    seed + 100,
                    rows,
                    3,
                    5,
                    37,
                    577,
                    dtype,
                    !per_slot,
                    37,
                    Some(37),
                );
                check_experts(
                    seed + 200,
                    rows,
                    2,
                    5,
                    37,
                    99,
                    dtype,
                    per_slot,
                    37,
                    Some(74),
                );
            }
        }
    }

    #[test]
    fn experts_gemv4() {
        // The GPUs' kernel (gemv4_experts) and the CPU adapters' (gemv_cpu_experts).
        for cpu in [false, true] {
            with_cpu_kernels(cpu, experts_gemv_cases);
        }
    }

    fn experts_gemv_cases() {
        for (i, dtype) in DTYPES.into_iter().enumerate() {
            for (rows, per_slot) in [(1, false), (3, true), (GEMV_MAX_ROWS as usize, false)] {
                let seed = 150 + i as u64 * 10 + rows as u64;
                // 520 columns: 16-byte words = 65 (bf16) / 130 (f32): the 32-lane knobs.
                check_experts(seed, rows, 3, 5, 37, 520, dtype, per_slot, 37, None);
                check_experts(
                    seed + 100,
                    rows,
                    3,
                    5,
                    37,
                    24,
                    dtype,
                    !per_slot,
                    37,
                    Some(37),
                );
                check_experts(
                    seed + 200,
                    rows,
                    2,
                    5,
                    38,
                    520,
                    dtype,
                    per_slot,
                    38,
                    Some(76),
                );
                // Chunk boundaries inside experts, at odd rows (a lane's row pair straddles them).
                check_experts(seed + 300, rows, 3, 4, 37, 24, dtype, per_slot, 1, Some(9));
            }
        }
        // The 64-lane knobs (≥ 512 words per row).
        check_experts(190, 1, 4, 3, 21, 4096, DType::F32, false, 21, Some(42));
    }

    #[test]
    fn experts_gemm() {
        // The GPUs' tile, over row tiles cut beforehand and walking each expert's rows; on
        // CPU adapters a prefill chunk's slots take the per-slot GEMVs (gemv_cpu1_experts:
        // these K are not whole 16-byte words).
        for (cpu, tiles) in EXPERT_FORMS {
            with_expert_forms(cpu, tiles, || {
                for (i, dtype) in DTYPES.into_iter().enumerate() {
                    let seed = 80 + i as u64 * 10;
                    check_experts(seed, 37, 3, 5, 37, 577, dtype, false, 37, None);
                    check_experts(seed + 1, 37, 3, 5, 37, 99, dtype, true, 37, Some(37));
                    check_experts(seed + 2, 37, 2, 5, 37, 99, dtype, false, 37, Some(74));
                    // More than a tile per expert and several scan blocks; multi-tile rpe.
                    check_experts(seed + 3, 150, 4, 3, 70, 33, dtype, true, 70, Some(140));
                }
            });
        }
    }

    /// The routed products' kernel sets: (CPU adapters' kernels, the GEMM's row tiles cut
    /// beforehand).
    const EXPERT_FORMS: [(bool, bool); 3] = [(false, true), (false, false), (true, true)];

    /// `f` with the CPU adapters' kernels or not and the routed GEMM's row tiles cut
    /// beforehand or not ([`expert_tiles_on`]).
    fn with_expert_forms(cpu: bool, tiles: bool, f: impl FnOnce()) {
        let was = EXPERT_TILES.with(|c| c.replace(Some(tiles)));
        with_cpu_kernels(cpu, f);
        EXPERT_TILES.with(|c| c.set(was));
    }

    #[test]
    fn experts_chunks_split_inside_an_expert() {
        // Not required by the contract (uploads align chunks to experts), but handled.
        for (cpu, tiles) in EXPERT_FORMS {
            with_expert_forms(cpu, tiles, || {
                for (i, dtype) in DTYPES.into_iter().enumerate() {
                    check_experts(90 + i as u64, 2, 3, 4, 37, 65, dtype, false, 1, Some(10));
                    // Aligned rows: the 16-byte kernels.
                    check_experts(96 + i as u64, 2, 3, 4, 37, 64, dtype, false, 1, Some(10));
                    check_experts(93 + i as u64, 20, 3, 4, 37, 65, dtype, true, 1, Some(10));
                }
            });
        }
    }

    #[test]
    fn integer_dot_gemv_shapes_and_limits() {
        let g = gpu();
        let xb = g.buffer(4 * 8192, "x").unwrap();
        let x = View::rows(&xb, 0);
        for q in [
            QFormat::Q8 { block: 32 },
            QFormat::Q4 { block: 32 },
            QFormat::Q4 { block: 64 },
        ] {
            let f = WFormat::Quant(q);
            let w = |k: usize| make_weight(&vec![0.5; 3 * k], 3, k, f, 1, None).0;
            if let QFormat::Q4 { .. } = q {
                // One aligned x row over q4 takes it; workgroup memory bounds K.
                assert!(matches!(
                    Dense::pick(1, x, &w(64), Dev::default(), dot_blocks(g, x, &w(64))),
                    Dense::GemvDot(_, 8)
                ));
                assert_eq!(
                    dot_blocks(g, x.col(2), &w(64)),
                    None,
                    "x off a 16-byte boundary"
                );
                assert_eq!(dot_blocks(gpu_default_limits(), x, &w(2048)), Some(64));
                assert_eq!(
                    dot_blocks(gpu_default_limits(), x, &w(4096)),
                    None,
                    "16 KiB"
                );
            } else {
                // q8 keeps the float GEMV (see dot_blocks); the kernel still serves it.
                assert_eq!(dot_blocks(g, x, &w(64)), None);
            }
            for (i, (k, n, chunk)) in [(32, 5, None), (544, 37, Some(7)), (2080, 70, Some(33))]
                .into_iter()
                .enumerate()
            {
                let s = 1200 + 10 * i as u64 + q.bits() as u64;
                run_matmul(s, 1, k, n, f, chunk, None, (8, k + 4));
                // Lanes a row group within a subgroup and across several; the reductions
                // in workgroup memory (0) and through subgroup shuffles (2).
                for (tpr, sg) in [(4, 0), (32, 0), (4, 2), (32, 2), (256, 2)] {
                    DOT_SG.with(|c| c.set(Some(sg)));
                    let kind = Dense::GemvDot(tpr, (k as u32 / 32).next_power_of_two().max(8));
                    run_matmul(s + tpr as u64, 1, k, n, f, chunk, Some(kind), (4, k));
                }
                DOT_SG.with(|c| c.set(None));
            }
        }
        // x quantized once beforehand (the decode path's quantize_x + matmul_xq): the same
        // products, K over one and several workgroups' worth of blocks, odd block counts.
        for (i, (k, n, chunk)) in [
            (32, 5, None),
            (96, 9, None),
            (544, 37, Some(7)),
            (6176, 70, Some(33)),
        ]
        .into_iter()
        .enumerate()
        {
            let f = WFormat::Quant(QFormat::Q4 { block: 32 });
            run_matmul_xq(1300 + i as u64, 1, k, n, f, chunk, None, (8, k + 4), true);
            // Routed experts: one x row for all slots, and one per slot (as the down
            // projection's), stacked experts split across chunks.
            for per_slot in [false, true] {
                let seed = 1400 + 2 * i as u64 + per_slot as u64;
                check_experts_xq(seed, (1, 3, 4, n, k), f, per_slot, 1, Some(2 * n), true);
            }
        }
        // Other formats keep the float GEMVs.
        let f8 = make_weight(&[0.5; 3 * 64], 3, 64, WFormat::Quant(QFormat::Fp8), 1, None).0;
        assert_eq!(dot_blocks(g, x, &f8), None);
    }

    #[test]
    fn rows_kernels_keep_a_row_group_within_a_workgroup() {
        // 256 lanes a row (a long K) in workgroups of 128: one row group of 128 lanes, not
        // none (which divided by zero on an H100).
        ROWS_LAYOUT.with(|c| c.set(Some((1, 128))));
        assert_eq!(rows_knobs(256, 8, 1).tpr4, 128);
        assert_eq!(rows_per_workgroup(256), 4);
        ROWS_LAYOUT.with(|c| c.set(Some((2, 256))));
        assert_eq!(rows_knobs(256, 8, 1).tpr4, 256);
        assert_eq!(rows_per_workgroup(256), 8);
        ROWS_LAYOUT.with(|c| c.set(None));
    }

    #[test]
    fn dot_reductions_through_subgroups_where_measured_faster() {
        // By default: gemv_dot_experts_rows always, gemv_dot_rows where a lane takes at most
        // DOT_SG_MAX_WORDS words, on subgroups of 4 lanes or more.
        DOT_SG.with(|c| c.set(None));
        let max = DOT_SG_MAX_WORDS;
        assert_eq!(dot_sg_lanes(32, "gemv_dot_experts_rows", 16, 12), 16);
        assert_eq!(dot_sg_lanes(32, "gemv_dot_experts_rows", 64, 0), 32);
        assert_eq!(dot_sg_lanes(32, "gemv_dot_rows", 16, 1), 16);
        assert_eq!(dot_sg_lanes(32, "gemv_dot_rows", 64, max), 32);
        assert_eq!(dot_sg_lanes(32, "gemv_dot_rows", 16, max + 1), 0);
        assert_eq!(
            dot_sg_lanes(32, "gemv_dot_rows", 16, 0),
            0,
            "words not known"
        );
        assert_eq!(dot_sg_lanes(0, "gemv_dot_rows", 16, 1), 0, "no subgroups");
        assert_eq!(
            dot_sg_lanes(2, "gemv_dot_experts_rows", 16, 1),
            0,
            "2-lane subgroups"
        );
        assert_eq!(dot_sg_lanes(32, "gemv_dot", 16, 1), 0);
        assert_eq!(dot_sg_lanes(32, "gemv_dot_experts", 16, 1), 0);
        // The overrides: none, the few-rows kernels, every integer-dot GEMV.
        DOT_SG.with(|c| c.set(Some(0)));
        assert_eq!(dot_sg_lanes(32, "gemv_dot_experts_rows", 16, 1), 0);
        DOT_SG.with(|c| c.set(Some(1)));
        assert_eq!(dot_sg_lanes(8, "gemv_dot_rows", 64, 12), 8);
        assert_eq!(dot_sg_lanes(8, "gemv_dot", 64, 1), 0);
        DOT_SG.with(|c| c.set(Some(2)));
        assert_eq!(dot_sg_lanes(8, "gemv_dot", 4, 0), 4);
        DOT_SG.with(|c| c.set(None));
    }

    #[test]
    fn xq_gemv_several_rows() {
        // A verification's few rows quantized once: gemv_dot_rows reads each weight word
        // once for all of them, gemv_dot_experts_rows each expert once for the slots routed
        // to it. Every row count up to GEMV_MAX_ROWS somewhere; odd K and N; chunks.
        let f = WFormat::Quant(QFormat::Q4 { block: 32 });
        for ((i, (rows, k, n, chunk)), (quads, wg, sg, i2f)) in [
            (2, 32, 5, None),
            (3, 96, 9, None),
            (4, 544, 37, Some(7)),
            (5, 160, 70, Some(33)),
            (6, 64, 3, None),
            (7, 2080, 21, Some(8)),
            (8, 6176, 70, Some(33)),
        ]
        .into_iter()
        .enumerate()
        .flat_map(|c| {
            [
                (c, (1, 256, 0, 1)),
                (c, (2, 256, 2, 3)),
                (c, (1, 128, 2, 3)),
                (c, (2, 128, 0, 1)),
            ]
        }) {
            // Each lane 4 weight rows, or 8 (two quads: the second partly or wholly past
            // N in some workgroups); workgroups of 256 invocations or 128; the lanes'
            // reductions in workgroup memory (0) or through subgroup shuffles (2); x's block
            // factors per weight row (1) or once per x row and word (3).
            ROWS_LAYOUT.with(|c| c.set(Some((quads, wg))));
            DOT_SG.with(|c| c.set(Some(sg)));
            DOT_I2F.with(|c| c.set(Some(i2f)));
            run_matmul_xq(
                1700 + i as u64 + 100 * quads as u64 + wg as u64,
                rows,
                k,
                n,
                f,
                chunk,
                None,
                (8, k + 4),
                true,
            );
            // A long row's 256 lanes (what a GPU picks at large K), in every layout: at
            // most a workgroup's lanes take a row group (rows_tpr).
            if k >= 2048 {
                run_matmul_xq(
                    1750 + i as u64 + 100 * quads as u64 + wg as u64,
                    rows,
                    k,
                    n,
                    f,
                    chunk,
                    Some(Dense::GemvDot(256, 1)),
                    (8, k + 4),
                    true,
                );
            }
            for per_slot in [false, true] {
                let seed = 1800 + 2 * i as u64 + per_slot as u64 + 100 * quads as u64 + wg as u64;
                // Few experts: rows share them, and a row may name one twice (random ids),
                // so an expert can have more than `rows` slots (the kernel's batches).
                check_experts_xq(seed, (rows, 3, 4, n, k), f, per_slot, 1, Some(2 * n), true);
                // More experts than slots: most workgroups find none.
                check_experts_xq(seed + 50, (rows, 2, 23, n, k), f, per_slot, 1, None, true);
            }
        }
        DOT_I2F.with(|c| c.set(None));
    }

    #[test]
    fn gemv_add_is_gemv_then_add() {
        // y += x · Wᵀ in the float GEMVs' store: bit for bit each kernel's rows plus y's old
        // values (x at an odd offset and stride, weights in chunks of 33 rows), on both kernel sets
        // through `matmul_add`; a GEMM's rows record nothing.
        let g = gpu();
        let (n, k) = (70usize, 200usize);
        let mut rng = Rng::new(1600);
        let q8 = WFormat::Quant(QFormat::Q8 { block: 32 });
        let formats = [DType::F32.into(), DType::BF16.into(), q8];
        let kinds = |rows: u32| {
            let mut v = vec![
                Dense::Gemv,
                Dense::GemvCpu1,
                Dense::Gemv4(64, 1),
                Dense::Gemv4(32, 2),
            ];
            if rows == 1 {
                v.push(Dense::Gemv4Q(32));
            }
            v
        };
        let cases = formats.iter().flat_map(|f| {
            [1u32, 3, 8]
                .into_iter()
                .flat_map(move |r| kinds(r).into_iter().map(move |d| (*f, r, Some(d))))
        });
        let run = |(f, rows, kind): (WFormat, u32, Option<Dense>), rng: &mut Rng| {
            let (wgt, _) = make_weight(&rng.vec(n * k, 1.0), n, k, f, 1, Some(33));
            let (xo, xs) = (3u32, k as u32 + 5);
            let xb = g
                .buffer_from(&rng.vec((xo + xs * rows) as usize, 1.0), "x")
                .unwrap();
            let len = n * rows as usize;
            let y0 = rng.vec(len, 5.0);
            let ya = g.buffer(4 * len as u64, "y").unwrap();
            let yb = g.buffer_from(&y0, "y + old").unwrap();
            let xv = View::new(&xb, xo, xs);
            let (va, vb) = (View::rows(&ya, n as u32), View::rows(&yb, n as u32));
            let mut rec = g.recorder();
            match kind {
                Some(d) => {
                    matmul_as(&mut rec, xv, &wgt, va, rows, d, None, false);
                    matmul_as(&mut rec, xv, &wgt, vb, rows, d, None, true);
                }
                None => {
                    matmul(&mut rec, xv, &wgt, va, rows);
                    assert!(matmul_add(&mut rec, xv, &wgt, vb, rows));
                }
            }
            rec.finish().unwrap();
            let plain = g.read_f32(&ya, 0, len).unwrap();
            let want: Vec<f32> = plain.iter().zip(&y0).map(|(a, b)| a + b).collect();
            let what = format!("{f:?}, {rows} rows, {kind:?}");
            assert_eq!(g.read_f32(&yb, 0, len).unwrap(), want, "{what}");
        };
        for c in cases {
            run(c, &mut rng);
        }
        for cpu in [false, true] {
            crate::kernels::with_cpu_kernels(cpu, || {
                for f in formats {
                    for rows in [1, 3, GEMV_MAX_ROWS] {
                        run((f, rows, None), &mut rng);
                    }
                }
            });
        }
        let xb = g.buffer_from(&rng.vec(k * 9, 1.0), "x").unwrap();
        let yb = g.buffer(4 * 9 * n as u64, "y").unwrap();
        let (wgt, _) = make_weight(&rng.vec(n * k, 1.0), n, k, q8, 1, None);
        let mut rec = g.recorder();
        let rows = GEMV_MAX_ROWS + 1;
        let (xv, yv) = (View::rows(&xb, k as u32), View::rows(&yb, n as u32));
        assert!(!matmul_add(&mut rec, xv, &wgt, yv, rows));
    }

    #[test]
    fn xq_gemv_add_is_gemv_then_add() {
        // y += x · Wᵀ in the GEMV's store: bit for bit the GEMV's rows plus y's old values,
        // at one row (decode) and a few (a verification).
        let g = gpu();
        let (n, k) = (70usize, 544usize);
        let mut rng = Rng::new(1500);
        let f = WFormat::Quant(QFormat::Q4 { block: 32 });
        let (wgt, _) = make_weight(&rng.vec(n * k, 1.0), n, k, f, 1, Some(33));
        for rows in [1u32, 3] {
            let len = n * rows as usize;
            let xb = g
                .buffer_from(&rng.vec(k * rows as usize, 1.0), "x")
                .unwrap();
            let y0 = rng.vec(len, 5.0);
            let ya = g.buffer(4 * len as u64, "y").unwrap();
            let yb = g.buffer_from(&y0, "y + old").unwrap();
            let qb = g.buffer(xq_bytes(k as u32, rows), "xq").unwrap();
            let xv = View::rows(&xb, k as u32);
            let mut rec = g.recorder();
            let q = quantize_x(
                &mut rec,
                xv,
                rows,
                k as u32,
                takes_xq(xv, &wgt).unwrap(),
                &qb,
            );
            matmul_xq(&mut rec, &q, xv, &wgt, View::rows(&ya, n as u32));
            assert!(matmul_xq_add(
                &mut rec,
                &q,
                xv,
                &wgt,
                View::rows(&yb, n as u32)
            ));
            rec.finish().unwrap();
            let plain = g.read_f32(&ya, 0, len).unwrap();
            let want: Vec<f32> = plain.iter().zip(&y0).map(|(a, b)| a + b).collect();
            assert_eq!(g.read_f32(&yb, 0, len).unwrap(), want, "{rows} rows");
        }
        let xb = g.buffer_from(&rng.vec(k, 1.0), "x").unwrap();
        let yb = g.buffer(4 * n as u64, "y").unwrap();
        let qb = g.buffer(xq_bytes(k as u32, 1), "xq").unwrap();
        let xv = View::rows(&xb, k as u32);
        let mut rec = g.recorder();
        let q = quantize_x(&mut rec, xv, 1, k as u32, takes_xq(xv, &wgt).unwrap(), &qb);
        // Where the integer-dot GEMV does not apply, nothing is recorded.
        let (bf, _) = make_weight(&rng.vec(n * k, 1.0), n, k, DType::BF16.into(), 1, None);
        assert!(!matmul_xq_add(
            &mut rec,
            &q,
            xv,
            &bf,
            View::rows(&yb, n as u32)
        ));
    }

    #[test]
    fn quantized_gemv_gemm_against_cpu_decode() {
        // K not a multiple of any block (77, 200) and multiples (256); every kernel kind.
        for (i, q) in QUANT.into_iter().enumerate() {
            let f = WFormat::Quant(q);
            let s = 500 + 10 * i as u64;
            for k in [77usize, 200, 256] {
                for rows in [1usize, 3, GEMV_MAX_ROWS as usize] {
                    run_matmul(s + rows as u64, rows, k, 37, f, None, None, (4, k + 4));
                }
                check_matmul_as(s + 1, 70, k, 130, f, Some(64), Dense::Gemm(64));
                check_matmul_as(s + 2, 130, k, 131, f, None, Dense::Gemm(128));
                check_matmul_as(s + 3, 5, k, 40, f, Some(16), Dense::Gemv);
            }
            // The 16-byte GEMV on long rows, several chunks.
            run_matmul(s + 4, 2, 1024, 66, f, Some(32), None, (0, 1024));
            // One x row: 4 weight rows per lane (row counts not a multiple of 4, chunks).
            run_matmul(s + 5, 1, 1024, 66, f, Some(32), None, (0, 1024));
            for tpr in [4, 16, 64] {
                run_matmul(
                    s + 6 + tpr as u64,
                    1,
                    512,
                    39,
                    f,
                    None,
                    Some(Dense::Gemv4Q(tpr)),
                    (4, 516),
                );
            }
        }
    }

    /// x in 16-byte loads only where every row the tile reads starts on a 4-float boundary
    /// and K is a multiple of 4 (else the last load of a row could pass the buffer's end).
    #[test]
    fn x_in_quads_needs_aligned_rows_and_k() {
        let g = gpu();
        let buf = g.buffer(4 * 4096, "x").unwrap();
        let v = |offset, stride| View::new(&buf, offset, stride);
        assert!(x_in_quads(v(0, 64), 64, 64));
        assert!(x_in_quads(v(8, 68), 0, 64));
        assert!(!x_in_quads(v(2, 64), 64, 64), "offset");
        assert!(!x_in_quads(v(0, 66), 66, 64), "stride");
        assert!(!x_in_quads(v(0, 64), 66, 64), "row");
        assert!(!x_in_quads(v(0, 68), 68, 66), "K");
    }

    /// The tensor-core GEMM shader for every weight format through the compiler path the
    /// device uses (naga, then the memory-model patch): it only runs on adapters with
    /// tensor cores (the H200 run in BENCHMARKS.md), so this keeps it compiling everywhere.
    #[test]
    fn tensor_core_gemms_compile_for_every_format() {
        let compile = |defines: &[(&'static str, String)], source: &str, entry: &str| {
            let src = crate::gpu::shader_source(
                "",
                <Params as crate::gpu::KernelParams>::WGSL,
                &crate::gpu::define_lines(defines),
                source,
            );
            crate::gpu::spirv::compile(&src, entry)
        };
        let formats = [DType::F32, DType::BF16, DType::F16]
            .map(WFormat::from)
            .into_iter()
            .chain(QUANT.map(WFormat::Quant));
        for (f, shader) in formats.flat_map(|f| [(f, &MATMUL_COOP), (f, &MATMUL_COOP_X1)]) {
            // mla_values both ways: its weights staged K-major (SPARSA_COOP_GATHER=1) or not.
            let entries = TILE_ENTRIES.map(|e| (e, false));
            let rows = COOP_ROWS_ENTRIES.map(|e| (e, false));
            // Exact, and with x as one f16 value for every format's GEMMs (q4's default;
            // SPARSA_COOP_X_F16=1 for the others): those of weights staged as one f16 value
            // on 128-row tiles; the attention's with both operands as one f16 value (a
            // prefill's default, coop_mla_f16) on 128-column tiles.
            // The GEMMs and mla_logits also with K-steps of 32 (SPARSA_COOP_HK=32,
            // SPARSA_COOP_MLA_HK=32), in two stages.
            for (entry, gather, x_f16, hk) in entries
                .into_iter()
                .chain(rows)
                .chain([("mla_values", true)])
                .flat_map(|(e, g)| [(e, g, false), (e, g, true)])
                .flat_map(|(e, g, x)| {
                    let hk32 = (GEMM_ENTRIES.contains(&e) || e == "mla_logits")
                        .then_some((e, g, x, 32u32));
                    std::iter::once((e, g, x, 64)).chain(hk32)
                })
            {
                let ops = CoopOperands {
                    gather,
                    ..CoopOperands::default()
                };
                let mut defines = coop_defines_with(f, KNOBS, entry, ops, true);
                let gemm = GEMM_ENTRIES.contains(&entry);
                let mla = MLA_ENTRIES.contains(&entry);
                let tm = coop_tile_rows(f.code(), entry, x_f16 && gemm);
                for (name, value) in defines.iter_mut() {
                    match *name {
                        "X_F16" if gemm => *value = u(x_f16 as u32),
                        "X_F16" if mla => *value = u(2 * x_f16 as u32),
                        "TN" if mla && x_f16 => *value = u(128u32),
                        "TM" => *value = u(tm),
                        "HK" => *value = u(hk),
                        // The second variant of each entry with the measurement knobs on.
                        "B_ROT" | "G_AHEAD" => *value = u(x_f16 as u32),
                        _ => {}
                    }
                }
                let c = compile(&defines, shader.source, entry)
                    .unwrap_or_else(|e| panic!("{} {entry} {f:?} x_f16 {x_f16}: {e}", shader.name));
                assert!(c.words.len() > 1000, "{entry} {f:?}");
                // Devices run this tile only where it fits their workgroup memory.
                assert!(
                    c.workgroup_bytes <= crate::gpu::COOP_WORKGROUP_BYTES,
                    "{entry} {f:?}: {} bytes of workgroup memory",
                    c.workgroup_bytes
                );
                // K-steps of 32 stage twice: the 128 × 128 tile's two stages of 20 KB.
                if hk == 32 && tm == 128 {
                    assert!(c.workgroup_bytes > 40 * 1024, "{entry} {f:?}: one stage");
                }
                let bindings: Vec<u32> = c.layout.iter().map(|e| e.binding).collect();
                // The MLA GEMMs take the positions and counts at 4 and 5.
                let want: &[u32] = if ["gemm", "gemm_heads", "gemv_coop_rows"].contains(&entry) {
                    &[0, 1, 2, 3, 4]
                } else if entry == "gemv_coop_rows_sum" {
                    // The scratch sums at 1, y at 2.
                    &[0, 1, 2]
                } else {
                    &[0, 1, 2, 3, 4, 5]
                };
                assert_eq!(bindings, want, "{entry} {f:?}");
            }
            // The dense and routed GEMMs loading x's A fragments from memory (X_F16 = 3,
            // SPARSA_COOP_A_GLOBAL) where the weights are staged as one f16 value: only
            // they are staged, in two stages of 18 KB.
            let a_global =
                shader.name == MATMUL_COOP.name && coop_tile_cols(f.code(), false) == 128;
            for entry in ["gemm", "gemm_experts"].into_iter().filter(|_| a_global) {
                let xa = CoopOperands {
                    xa: true,
                    ..CoopOperands::default()
                };
                let mut defines = coop_defines_with(f, KNOBS, entry, xa, true);
                for (name, value) in defines.iter_mut() {
                    if *name == "TM" {
                        *value = u(128u32);
                    }
                }
                let c = compile(&defines, MATMUL_COOP_XH.source, entry)
                    .unwrap_or_else(|e| panic!("{} {entry} {f:?} A from memory: {e}", shader.name));
                assert!(
                    (36 * 1024..=crate::gpu::COOP_WORKGROUP_BYTES).contains(&c.workgroup_bytes),
                    "{entry} {f:?} A from memory: {} bytes of workgroup memory",
                    c.workgroup_bytes
                );
            }
            // The attention's logits over row pairs with f16 operands: 128-row tiles of one
            // stage (SPARSA_MLA_PAIRS).
            let pairs = CoopOperands {
                mla_f16: true,
                m128: true,
                ..CoopOperands::default()
            };
            let defines = coop_defines_with(f, KNOBS, "mla_logits", pairs, false);
            if f == WFormat::Float(DType::F32) {
                let c = compile(&defines, shader.source, "mla_logits")
                    .unwrap_or_else(|e| panic!("{} mla_logits pairs: {e}", shader.name));
                assert!(
                    (36 * 1024..=crate::gpu::COOP_WORKGROUP_BYTES).contains(&c.workgroup_bytes),
                    "mla_logits pairs: {} bytes of workgroup memory",
                    c.workgroup_bytes
                );
            }
            // The same GEMMs on 128 × 256 tiles (SPARSA_COOP_WIDE: x as one f16 value, 64 ×
            // 64 outputs a subgroup, K-steps of 32 in one stage of 30 KB), x in 16-byte loads
            // and not.
            for entry in ["gemm", "gemm_experts"].into_iter().filter(|_| a_global) {
                let wide = CoopOperands {
                    wide: true,
                    ..CoopOperands::default()
                };
                let mut defines = coop_defines_with(f, KNOBS, entry, wide, true);
                for (name, value) in defines.iter_mut() {
                    match *name {
                        "X_F16" => *value = u(1u32),
                        "TM" => *value = u(128u32),
                        _ => {}
                    }
                }
                for source in [MATMUL_COOP.source, MATMUL_COOP_X1.source] {
                    let c = compile(&defines, source, entry)
                        .unwrap_or_else(|e| panic!("{entry} {f:?} wide: {e}"));
                    assert!(
                        (30 * 1024..40 * 1024).contains(&c.workgroup_bytes),
                        "{entry} {f:?} wide: {} bytes of workgroup memory",
                        c.workgroup_bytes
                    );
                }
            }
        }
    }

    #[test]
    fn quantized_experts_against_cpu_decode() {
        for (i, q) in QUANT.into_iter().enumerate() {
            let f = WFormat::Quant(q);
            let s = 700 + 10 * i as u64;
            for cpu in [false, true] {
                with_cpu_kernels(cpu, || {
                    check_experts(s, 1, 4, 6, 21, 256, f, false, 21, Some(42));
                    check_experts(s + 1, 3, 2, 5, 19, 200, f, true, 1, None);
                    // Chunk ends inside experts, at odd rows.
                    check_experts(s + 3, 3, 2, 5, 19, 256, f, true, 1, Some(9));
                });
            }
            check_experts(s + 2, 40, 2, 6, 70, 96, f, false, 70, Some(140));
        }
    }
}
