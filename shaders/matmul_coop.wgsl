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
// f32 kernels to about f32 rounding. The lo halves are staged times LO_SCALE and their
// products summed in accumulators of their own, so that they stay in f16's normal range.
// bf16, f16 and q4 weights are exact in f16 (q4 in f16's normal range) and skip their lo
// part; X_F16 = 1 drops x's lo part too (a measurement aid: it misses the goldens, see
// kernels/matmul.rs). Values beyond f16's range (|v| > 65504) are not representable: the
// CPU-side loaders keep weights finite, and activations of that size do not occur in the
// supported models (documented in BENCHMARKS.md).
//
// Subgroup s = lid / 32 (8 subgroups of 32) owns output rows 16 (s % 4) .. + 15 and
// columns 32 (s / 4) .. + 31: two accumulators (four with the lo products).
//
// Staging: x and the weights go through workgroup memory as f16 pairs, K-steps of 64. Where
// two stages fit (x and the weights without lo halves), while the subgroups multiply one
// K-step's tiles the next K-step's values are written to the other stage, so one barrier a
// K-step suffices; else the next K-step's values wait in registers during the products.
// x comes in 16-byte loads where its rows allow (`xquad`: coop_x4.wgsl or coop_x1.wgsl).
// Each invocation writes whole pairs (4 bytes; a q4 word's 8 weights as 4 pairs), its rows
// chosen so that the two halves of a subgroup write rows 4 apart: with 144-byte rows their
// pairs are 16 banks apart, and writing them in opposite orders puts them on disjoint
// banks; 144-byte rows also keep the matrix loads' 8 rows of 16 bytes on disjoint banks.

const HK: u32 = 64u;                    // K per staged tile
const HP: u32 = HK / 2u + 4u;           // row stride of the staged tiles in f16 pairs (144 bytes)
const STAGE: u32 = 64u * HP;            // pairs per stage and matrix: 64 rows × HP
const NPR: u32 = HK / 32u;              // weight words (q4) or groups of 4 pairs an invocation stages
// Weights that are not exact in f16: f32, FP8 and q8 (an FP8 or int8 code times an f32 or
// bf16 scale). q4 (a nibble times a bf16 scale: at most 11 significant bits) is, in f16's
// normal range (kernels/matmul.rs, `coop_q4_mode`), unless Q4_MODE asks for its lo half.
const W_LO: bool = W_DTYPE == 0u || W_DTYPE == 3u || W_DTYPE == 4u || (W_DTYPE == 5u && Q4_MODE == 1u);
// x as hi and lo halves, unless X_F16 asks for one f16 value.
const X_LO: bool = X_F16 == 0u;

// Two stages where they fit in the workgroup memory NVIDIA's driver offers (48 KB; sparsa
// allows itself 44), else one.
const MATS: u32 = 2u + select(0u, 1u, X_LO) + select(0u, 1u, W_LO);
const STAGES: u32 = select(1u, 2u, 2u * MATS * STAGE * 4u + 4096u + 512u <= 45056u);
var<workgroup> Ahi: array<vec2<f16>, STAGES * STAGE>;   // [stage][64 rows of x][HP]
var<workgroup> Alo: array<vec2<f16>, select(4u, STAGES * STAGE, X_LO)>;
var<workgroup> Bhi: array<vec2<f16>, STAGES * STAGE>;   // [stage][64 weight rows][HP]: B = Wᵀ column-major
var<workgroup> Blo: array<vec2<f16>, select(4u, STAGES * STAGE, W_LO)>;
var<workgroup> Cs: array<f32, 1024>;          // a quarter of the output tile: [16][64] row-major
var<workgroup> x_rows: array<u32, 64>;        // the x offset of each tile row
var<workgroup> w_rows: array<u32, 64>;        // the weight offset of each tile column

// v = hi + lo with hi = v truncated to f16's 11 significant bits (exact in f32 and, in f16's
// normal range, in f16) and lo = v - hi (exact in f32, rounded to f16). The split is done on
// the bits: written as v - f32(f16(v)), NVIDIA's compiler folded the round trip to zero.
fn hi_part(v: vec2<f32>) -> vec2<f32> {
    return bitcast<vec2<f32>>(bitcast<vec2<u32>>(v) & vec2<u32>(0xffffe000u));
}

// lo halves are staged times LO_SCALE and their products summed apart (times 1 / LO_SCALE
// at the end): unscaled, the lo half of a value under about 0.1 falls below f16's normal
// range, where NVIDIA's tensor cores lost it (the goldens of f32 and FP8 checkpoints missed
// their tolerance by up to 4×).
const LO_SCALE: f32 = 4096.0;

// Two consecutive x values at pair `at` of the A tiles (hi and lo halves where X_LO).
fn put_a(at: u32, v: vec2<f32>) {
    if (X_LO) {
        let h = hi_part(v);
        Ahi[at] = vec2<f16>(h);
        Alo[at] = vec2<f16>((v - h) * LO_SCALE);
    } else {
        Ahi[at] = vec2<f16>(v);
    }
}

// Two consecutive weights at pair `at` of the B tiles (the lo half only where W_LO).
fn put_b(at: u32, v: vec2<f32>) {
    if (W_LO) {
        let h = hi_part(v);
        Bhi[at] = vec2<f16>(h);
        Blo[at] = vec2<f16>((v - h) * LO_SCALE);
    } else {
        Bhi[at] = vec2<f16>(v);
    }
}

// `xquad(row, k)`, elements k .. k + 3 of x row `row`, comes from coop_x4.wgsl or coop_x1.wgsl.

// q4 weights without a lo half, in whole K-tiles (P.k and the row stride multiples of HK,
// scale blocks of whole 32-column groups, so a word's 8 nibbles share one scale): each
// invocation stages NPR 32-bit words of 8 nibbles a K-tile, instead of element pairs each
// with its own bounds checks, word and scale loads.
const Q4_TILE: bool = W_DTYPE == 5u && Q4_MODE == 0u && QB % 32u == 0u;

// What one invocation stages a K-step: 4 quads of x (tile rows `arow(i)`, columns
// 4 (lid % 16) .. + 3) and 4 NPR pairs of weights (q4: NPR words of 8 weights; else 4 NPR
// pairs of tile column lid / 4, pair columns 4 (lid % 4) + 16 j .. + 3).
struct Staged {
    a: array<vec4<f32>, 4>,
    b: array<vec2<f32>, 4 * NPR>,
    word: array<u32, NPR>,
    scale: array<f32, NPR>,
}

// Tile row of x quad i of invocation lid: rows 4 apart for the two halves of a subgroup.
fn arow(lid: u32, i: u32) -> u32 {
    let s = lid / 32u;
    return (s % 4u) + 4u * ((lid / 16u) % 2u) + 8u * (s / 4u) + 16u * i;
}

// Loads what invocation lid stages for the K-step at k0.
fn load_step(lid: u32, k0: u32, q4: bool) -> Staged {
    var st: Staged;
    let c = 4u * (lid % 16u);
    for (var i = 0u; i < 4u; i++) {
        st.a[i] = xquad(x_rows[arow(lid, i)], k0 + c);
    }
    let row = w_rows[lid / 4u];
    let q = lid % 4u;
    if (q4) {
        for (var j = 0u; j < NPR; j++) {
            st.word[j] = 0u;
            st.scale[j] = 0.0;
            if (row != NONE) {
                st.word[j] = w[w_word(row + k0) + q + 4u * j];
                st.scale[j] = q_scale((row + k0 + 32u * j) / QB);
            }
        }
    } else {
        for (var j = 0u; j < NPR; j++) {
            for (var i = 0u; i < 4u; i++) {
                st.b[4u * j + i] = wpair(row, k0 + 32u * j + 8u * q + 2u * i);
            }
        }
    }
    return st;
}

// Writes what load_step loaded into the stage starting at pair `base`.
fn store_step(lid: u32, base: u32, st: Staged, q4: bool) {
    // A quad is two pairs. The two halves of a subgroup write their rows' pairs in opposite
    // orders: rows 4 apart are 16 banks apart, so pairs of the same parity would collide.
    let odd = (lid / 16u) % 2u == 1u;
    let c = 2u * (lid % 16u) + select(0u, 1u, odd);
    let c2 = 2u * (lid % 16u) + select(1u, 0u, odd);
    for (var i = 0u; i < 4u; i++) {
        let r = base + arow(lid, i) * HP;
        put_a(r + c, select(st.a[i].xy, st.a[i].zw, odd));
        put_a(r + c2, select(st.a[i].zw, st.a[i].xy, odd));
    }
    for (var j = 0u; j < NPR; j++) {
        let at = base + (lid / 4u) * HP + 4u * (lid % 4u) + 16u * j;
        if (q4) {
            let lo = q_nib_lo(st.word[j]) * st.scale[j];
            let hi = q_nib_hi(st.word[j]) * st.scale[j];
            Bhi[at] = vec2<f16>(lo.xy);
            Bhi[at + 1u] = vec2<f16>(lo.zw);
            Bhi[at + 2u] = vec2<f16>(hi.xy);
            Bhi[at + 3u] = vec2<f16>(hi.zw);
        } else {
            for (var i = 0u; i < 4u; i++) {
                put_b(at + i, st.b[4u * j + i]);
            }
        }
    }
}

fn tile(xr: vec4<u32>, wr: vec2<u32>, lid: u32) -> Acc16 {
    let sg = lid / 32u;
    let mr = 16u * (sg % 4u);
    let nc = 32u * (sg / 4u);
    // The accumulators start from zeros in memory: a zero-valued cooperative matrix
    // (OpConstantNull) left garbage in them on NVIDIA's driver.
    if (lid < 256u) {
        Cs[lid] = 0.0;
    }
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
    // The lo halves' products, times LO_SCALE.
    var d0 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var d1 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    // Uniform: P is.
    let q4 = Q4_TILE && P.k % HK == 0u && P.ws % HK == 0u && P.w_t == 0u;
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
            c0 = coopMultiplyAdd(ah, b0, c0);
            c1 = coopMultiplyAdd(ah, b1, c1);
            if (X_LO) {
                let al = coopLoadT<coop_mat16x16<f16, A>>(&Alo[cur + mr * HP + kk], HP);
                d0 = coopMultiplyAdd(al, b0, d0);
                d1 = coopMultiplyAdd(al, b1, d1);
            }
            if (W_LO) {
                let l0 = coopLoad<coop_mat16x16<f16, B>>(&Blo[cur + nc * HP + kk], HP);
                let l1 = coopLoad<coop_mat16x16<f16, B>>(&Blo[cur + (nc + 16u) * HP + kk], HP);
                d0 = coopMultiplyAdd(ah, l0, d0);
                d1 = coopMultiplyAdd(ah, l1, d1);
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
    // The result goes through Cs in quarters: the subgroups of rows 0..15, 16..31, ...;
    // the lo products (where there are any) a second time.
    var acc: Acc16;
    let ty = lid / 16u;
    let r = 4u * (ty % 4u) * 64u + 4u * (lid % 16u);
    let parts = select(1u, 2u, X_LO || W_LO);
    for (var quarter = 0u; quarter < 4u; quarter++) {
        for (var part = 0u; part < parts; part++) {
            if (mr / 16u == quarter) {
                if (part == 0u) {
                    coopStoreT(c0, &Cs[nc], 64u);
                    coopStoreT(c1, &Cs[nc + 16u], 64u);
                } else {
                    coopStoreT(d0, &Cs[nc], 64u);
                    coopStoreT(d1, &Cs[nc + 16u], 64u);
                }
            }
            workgroupBarrier();
            if (ty / 4u == quarter) {
                let v = Acc16(
                    vec4<f32>(Cs[r], Cs[r + 1u], Cs[r + 2u], Cs[r + 3u]),
                    vec4<f32>(Cs[r + 64u], Cs[r + 65u], Cs[r + 66u], Cs[r + 67u]),
                    vec4<f32>(Cs[r + 128u], Cs[r + 129u], Cs[r + 130u], Cs[r + 131u]),
                    vec4<f32>(Cs[r + 192u], Cs[r + 193u], Cs[r + 194u], Cs[r + 195u]),
                );
                if (part == 0u) {
                    acc = v;
                } else {
                    let f = 1.0 / LO_SCALE;
                    acc = Acc16(acc.r0 + f * v.r0, acc.r1 + f * v.r1, acc.r2 + f * v.r2, acc.r3 + f * v.r3);
                }
            }
            workgroupBarrier();
        }
    }
    return acc;
}
