enable f16;
enable wgpu_cooperative_matrix;

// The GEMM tile on tensor cores: cooperative matrices of 16×16×16, f16 inputs, f32
// accumulation. Put before matmul.wgsl (whose `gemm` and `gemm_experts` call `tile`) on
// adapters that offer that configuration with subgroups of 32 (kernels/matmul.rs checks).
//
// Same contract as `tile64`: one 64 × 64 output tile over the whole K, `xr[p]` the x offset
// of tile row `lid / 16 + 16 p`, `wr[q]` the weight offset of tile column `lid / 8 + 32 q`
// (NONE = zero row), the result in tile64's layout (invocation (lid % 16, lid / 16) holds
// rows 4 ty .. 4 ty + 3, columns 4 tx .. 4 tx + 3). Call in uniform control flow.
//
// Precision: every f32 value v is split into f16 halves hi + lo (`hi_part`), and the product
// is hi·hi + lo·hi + hi·lo (lo·lo, about 2^-21 relative, is dropped), so results match the
// f32 kernels to about f32 rounding. bf16, f16 and q4 weights are exact in f16 (q4 in f16's
// normal range) and skip their lo part. Values beyond f16's range (|v| > 65504) are not representable: the
// CPU-side loaders keep weights finite, and activations of that size do not occur in the
// supported models (documented in BENCHMARKS.md).
//
// Subgroup s = lid / 32 (8 subgroups of 32) owns output rows 16 (s % 4) .. + 15 and
// columns 32 (s / 4) .. + 31: two accumulators.
//
// Staging: x and the weights go through workgroup memory as f16 pairs, in two stages: while
// the subgroups multiply one K-step's tiles, the next K-step's values are loaded and
// written to the other stage, so one barrier a K-step suffices. Each invocation writes
// whole pairs (4 bytes; a q4 word's 8 weights as 4 pairs), its rows chosen so that the two
// halves of a subgroup write rows 4 apart: 80-byte rows put them on disjoint banks, and
// 80-byte rows also keep the matrix loads' 8 rows of 16 bytes on disjoint banks.

const HK: u32 = 32u;                    // K per staged tile
const HP: u32 = 20u;                    // row stride of the staged tiles in f16 pairs (80 bytes)
const STAGE: u32 = 1280u;               // pairs per stage: 64 rows × HP
// Weights that are not exact in f16: f32, FP8 and q8 (an FP8 or int8 code times an f32 or
// bf16 scale). q4 (a nibble times a bf16 scale: at most 11 significant bits) is, in f16's
// normal range (kernels/matmul.rs, `coop_q4_mode`), unless Q4_MODE asks for its lo half.
const W_LO: bool = W_DTYPE == 0u || W_DTYPE == 3u || W_DTYPE == 4u || (W_DTYPE == 5u && Q4_MODE == 1u);

// Two stages, or one where the weights' lo halves take the room (they make one stage of
// 20 KB: two would pass the 48 KB of workgroup memory NVIDIA's driver offers).
const STAGES: u32 = select(2u, 1u, W_LO);
var<workgroup> Ahi: array<vec2<f16>, STAGES * STAGE>;   // [stage][64 rows of x][HP]
var<workgroup> Alo: array<vec2<f16>, STAGES * STAGE>;
var<workgroup> Bhi: array<vec2<f16>, STAGES * STAGE>;   // [stage][64 weight rows][HP]: B = Wᵀ column-major
var<workgroup> Blo: array<vec2<f16>, select(4u, STAGE, W_LO)>;
var<workgroup> Cs: array<f32, 2048>;          // half the output tile: [32][64] row-major
var<workgroup> x_rows: array<u32, 64>;        // the x offset of each tile row
var<workgroup> w_rows: array<u32, 64>;        // the weight offset of each tile column

// v = hi + lo with hi = v truncated to f16's 11 significant bits (exact in f32 and, in f16's
// normal range, in f16) and lo = v - hi (exact in f32, rounded to f16). The split is done on
// the bits: written as v - f32(f16(v)), NVIDIA's compiler folded the round trip to zero.
fn hi_part(v: vec2<f32>) -> vec2<f32> {
    return bitcast<vec2<f32>>(bitcast<vec2<u32>>(v) & vec2<u32>(0xffffe000u));
}

// Two consecutive x values at pair `at` of the A tiles, as hi and lo halves.
fn put_a(at: u32, v: vec2<f32>) {
    let h = hi_part(v);
    Ahi[at] = vec2<f16>(h);
    Alo[at] = vec2<f16>(v - h);
}

// Two consecutive weights at pair `at` of the B tiles (the lo half only where W_LO).
fn put_b(at: u32, v: vec2<f32>) {
    if (W_LO) {
        let h = hi_part(v);
        Bhi[at] = vec2<f16>(h);
        Blo[at] = vec2<f16>(v - h);
    } else {
        Bhi[at] = vec2<f16>(v);
    }
}

// Elements k and k + 1 of x row `row` (NONE: zeros; zeros past K).
fn xpair(row: u32, k: u32) -> vec2<f32> {
    if (row == NONE || k >= P.k) {
        return vec2<f32>(0.0);
    }
    let i = row + k;
    if (k + 1u < P.k) {
        return vec2<f32>(x[i], x[i + 1u]);
    }
    return vec2<f32>(x[i], 0.0);
}

// q4 weights without a lo half, in whole K-tiles (P.k and the row stride multiples of HK,
// scale blocks of whole K-tiles): each invocation stages one 32-bit word of 8 nibbles (one
// scale) a K-tile, instead of 4 element pairs each with its own bounds checks, word and
// scale loads.
const Q4_TILE: bool = W_DTYPE == 5u && Q4_MODE == 0u && QB % HK == 0u;

// What one invocation stages a K-step: 4 pairs of x (tile rows `arow(i)`, pair column
// lid % 16) and 4 pairs of weights (a q4 word: its 8 weights; else 4 pairs of tile column
// lid / 4, pair columns 4 (lid % 4) .. + 3).
struct Staged {
    a: array<vec2<f32>, 4>,
    b: array<vec2<f32>, 4>,
    word: u32,
    scale: f32,
}

// Tile row of x pair i of invocation lid: rows 4 apart for the two halves of a subgroup.
fn arow(lid: u32, i: u32) -> u32 {
    let s = lid / 32u;
    return (s % 4u) + 4u * ((lid / 16u) % 2u) + 8u * (s / 4u) + 16u * i;
}

// Loads what invocation lid stages for the K-step at k0.
fn load_step(lid: u32, k0: u32, q4: bool) -> Staged {
    var st: Staged;
    let c = 2u * (lid % 16u);
    for (var i = 0u; i < 4u; i++) {
        st.a[i] = xpair(x_rows[arow(lid, i)], k0 + c);
    }
    let row = w_rows[lid / 4u];
    let j = lid % 4u;
    if (q4) {
        st.word = 0u;
        st.scale = 0.0;
        if (row != NONE) {
            st.word = w[w_word(row + k0) + j];
            st.scale = q_scale((row + k0) / QB);
        }
    } else {
        for (var i = 0u; i < 4u; i++) {
            st.b[i] = wpair(row, k0 + 8u * j + 2u * i);
        }
    }
    return st;
}

// Writes what load_step loaded into the stage starting at pair `base`.
fn store_step(lid: u32, base: u32, st: Staged, q4: bool) {
    let c = lid % 16u;
    for (var i = 0u; i < 4u; i++) {
        put_a(base + arow(lid, i) * HP + c, st.a[i]);
    }
    let at = base + (lid / 4u) * HP + 4u * (lid % 4u);
    if (q4) {
        let lo = q_nib_lo(st.word) * st.scale;
        let hi = q_nib_hi(st.word) * st.scale;
        Bhi[at] = vec2<f16>(lo.xy);
        Bhi[at + 1u] = vec2<f16>(lo.zw);
        Bhi[at + 2u] = vec2<f16>(hi.xy);
        Bhi[at + 3u] = vec2<f16>(hi.zw);
    } else {
        for (var i = 0u; i < 4u; i++) {
            put_b(at + i, st.b[i]);
        }
    }
}

fn tile(xr: vec4<u32>, wr: vec2<u32>, lid: u32) -> Acc16 {
    let sg = lid / 32u;
    let mr = 16u * (sg % 4u);
    let nc = 32u * (sg / 4u);
    // The accumulators start from zeros in memory: a zero-valued cooperative matrix
    // (OpConstantNull) left garbage in them on NVIDIA's driver.
    Cs[lid] = 0.0;
    if (lid % 16u == 0u) {
        for (var p = 0u; p < 4u; p++) {
            x_rows[lid / 16u + 16u * p] = xr[p];
        }
    }
    if (lid % 8u == 0u) {
        for (var q = 0u; q < 2u; q++) {
            w_rows[lid / 8u + 32u * q] = wr[q];
        }
    }
    workgroupBarrier();
    var c0 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var c1 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    // Uniform: P is.
    let q4 = Q4_TILE && P.k % HK == 0u && P.ws % HK == 0u;
    store_step(lid, 0u, load_step(lid, 0u, q4), q4);
    workgroupBarrier();
    var cur = 0u;
    for (var k0 = 0u; k0 < P.k; k0 += HK) {
        let more = k0 + HK < P.k;
        var st: Staged;
        if (more) {
            st = load_step(lid, k0 + HK, q4);
        }
        for (var kk = 0u; kk < HK / 2u; kk += 8u) {
            let ah = coopLoadT<coop_mat16x16<f16, A>>(&Ahi[cur + mr * HP + kk], HP);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&Bhi[cur + nc * HP + kk], HP);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&Bhi[cur + (nc + 16u) * HP + kk], HP);
            let al = coopLoadT<coop_mat16x16<f16, A>>(&Alo[cur + mr * HP + kk], HP);
            c0 = coopMultiplyAdd(ah, b0, c0);
            c0 = coopMultiplyAdd(al, b0, c0);
            c1 = coopMultiplyAdd(ah, b1, c1);
            c1 = coopMultiplyAdd(al, b1, c1);
            if (W_LO) {
                let l0 = coopLoad<coop_mat16x16<f16, B>>(&Blo[cur + nc * HP + kk], HP);
                let l1 = coopLoad<coop_mat16x16<f16, B>>(&Blo[cur + (nc + 16u) * HP + kk], HP);
                c0 = coopMultiplyAdd(ah, l0, c0);
                c1 = coopMultiplyAdd(ah, l1, c1);
            }
        }
        if (STAGES == 1u) {
            // One stage: everyone is done reading it before it is overwritten.
            workgroupBarrier();
        } else {
            cur = STAGE - cur;
        }
        if (more) {
            store_step(lid, cur, st, q4);
        }
        workgroupBarrier();
    }
    // The result goes through Cs in halves: the subgroups of rows 0..31, then of 32..63.
    var acc: Acc16;
    let ty = lid / 16u;
    let r = 4u * (ty % 8u) * 64u + 4u * (lid % 16u);
    for (var half = 0u; half < 2u; half++) {
        if (mr / 32u == half) {
            coopStoreT(c0, &Cs[(mr % 32u) * 64u + nc], 64u);
            coopStoreT(c1, &Cs[(mr % 32u) * 64u + nc + 16u], 64u);
        }
        workgroupBarrier();
        if (ty / 8u == half) {
            acc = Acc16(
                vec4<f32>(Cs[r], Cs[r + 1u], Cs[r + 2u], Cs[r + 3u]),
                vec4<f32>(Cs[r + 64u], Cs[r + 65u], Cs[r + 66u], Cs[r + 67u]),
                vec4<f32>(Cs[r + 128u], Cs[r + 129u], Cs[r + 130u], Cs[r + 131u]),
                vec4<f32>(Cs[r + 192u], Cs[r + 193u], Cs[r + 194u], Cs[r + 195u]),
            );
        }
        workgroupBarrier();
    }
    return acc;
}
