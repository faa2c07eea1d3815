enable f16;
enable wgpu_cooperative_matrix;

// The GEMM tile on tensor cores: cooperative matrices of 16×16×16, f16 inputs, f32
// accumulation. Put before matmul.wgsl (whose `gemm`, `gemm_experts` and `gemm_heads` call `tile`) on
// adapters that offer that configuration with subgroups of 32 (kernels/matmul.rs checks).
//
// Same contract as `tile` in matmul_tile.wgsl (K to `kend`), over TM rows and TN columns (the
// TM and TN defines, from kernels/matmul.rs: TN 128 where the weights need no lo half, else
// 64; TM 128 where x is one f16 value and TN is 128, else 64): one TM × TN output tile over
// the whole K, `xr[p]` the x offset of tile row `lid / 16 + 16 p`, `wr[q]` the weight offset
// of tile column `lid / 8 + 32 q` (NONE = zero row), the result as TM / 64 × TN / 64 blocks of
// tile64's layout (block TN / 64 · rh + h: rows 64 rh .., columns 64 h ..; invocation
// (lid % 16, lid / 16) holds rows 4 ty .. 4 ty + 3, columns 4 tx .. 4 tx + 3 of each). Call in
// uniform control flow.
//
// Precision: every f32 value v is split into f16 halves hi + lo (`hi_part`), and the product
// is hi·hi + lo·hi + hi·lo (lo·lo, about 2^-21 relative, is dropped), so results match the
// f32 kernels to about f32 rounding. The lo halves are staged times LO_SCALE and their
// products summed in accumulators of their own, so that they stay in f16's normal range.
// bf16, f16 and q4 weights are exact in f16 (q4 in f16's normal range) and skip their lo
// part; X_F16 = 1 drops x's lo part too: q4's GEMMs by default (x rounded to 2^-11, as
// transformers rounds it to bf16's 2^-8), not the goldens' nor `--exact-gemms`
// (kernels/matmul.rs, `coop_x_f16`); X_F16 = 2 drops both lo parts: the sparse attention's
// products in a prompt's prefill with SPARSA_COOP_MLA_F16=1, over f32 caches too
// (`coop_mla_f16`). Values beyond f16's range (|v| > 65504) are not
// representable: the CPU-side loaders keep weights finite, and activations of that size do
// not occur in the supported models (documented in BENCHMARKS.md).
//
// Subgroup s = lid / 32 (8 subgroups of 32) owns output rows TM / 4 · (s % 4) .. + TM / 4 - 1
// and columns TN / 2 · (s / 4) .. + TN / 2 - 1: NB = TN / 32 accumulators for its first 16
// rows, and NB more for the lo products or, where TM is 128, for its next 16 rows. 128
// columns stage x once for twice the products of 64: q4 GEMMs ran 51–63 TFLOP/s against 41–50
// with 64 (BENCHMARKS.md, "The tensor-core tile, 64 × 128"). 128 rows with x as one f16
// value run the loop of the hi and lo products (two A fragments, eight products a K-part)
// for twice the outputs: each staged weight feeds twice the rows.
//
// Staging: x and the weights go through workgroup memory as f16 pairs, K-steps of HK (64, or
// 32 for the GEMMs with `SPARSA_COOP_HK=32`). Where two stages fit (with HK = 64 only x as
// one f16 value on 64 columns; with 32 all), while the subgroups multiply one K-step's tiles
// the next K-step's values are written to the other stage, so one barrier a K-step suffices;
// else the next K-step's values wait in registers during the products and two barriers
// bracket their stores. x comes in 16-byte loads where its rows allow (`xquad`: coop_x4.wgsl
// or coop_x1.wgsl). Each invocation writes whole pairs (4 bytes; a q4 word's 8 weights as 4
// pairs), x's rows chosen (`arow`) so that a subgroup's stores fall on disjoint banks, the
// weights' pairs rotated for the same (`store_b`); the row strides (144 or 80 bytes) keep the
// matrix loads' 8 rows of 16 bytes on disjoint banks too.
// (Staged in 8-byte units instead, vec4<f16>, the tile was 9–16 % slower on the H200.)

// HK (a define, kernels/matmul.rs `coop_tile_k`): K per staged tile, 64 or 32. Rows of
// HK / 2 + 4 pairs (144 or 80 bytes) keep both the staging stores below and the matrix
// loads' 8 rows of 16 bytes on disjoint banks.
const HP: u32 = HK / 2u + 4u;           // row stride of the staged tiles in f16 pairs
const XL: u32 = HK / 4u;                // invocations that stage one x row (a quad each)
const XI: u32 = TM * HK / 1024u;        // x quads an invocation stages a K-step
// WIDE (TN = 256, kernels/matmul.rs `coop_wide`): 128 × 256 tiles whose subgroups each own
// 64 × 64 outputs (rows 64 (s % 2) .., columns 64 (s / 2) ..: four A and four B fragments
// for 16 products a K-part, where 32 × 64 loads two A and four B for 8), K-steps of 32 in
// one stage (30 KB). Each staged value then feeds as many products as on the 128 × 128
// tile, but each matrix loaded from workgroup memory feeds 2 products instead of 1.33.
const WIDE: bool = TN == 256u;
const NB: u32 = select(TN / 32u, 4u, WIDE);  // B fragments (and accumulators) a subgroup a row group
const TH: u32 = TN / 64u;               // 64-column blocks of the tile
const ASTAGE: u32 = select(TM * HP, 4u, A_GLOBAL);  // pairs per stage of an x matrix: TM rows × HP (none: A_GLOBAL)
const BSTAGE: u32 = TN * HP;            // pairs per stage of a weight matrix: TN rows × HP
const NPR: u32 = HK / 32u;              // weight words (q4) or groups of 4 pairs an invocation stages per 64 rows
// X_F16 (kernels/matmul.rs, `coop_x_f16` and `coop_mla_f16`): 0, x as hi and lo halves;
// 1, x as one f16 value; 2 (the attention's entries, `coop_mla_f16`), x and the weights
// each as one f16 value (rounded to nearest), whatever the weights' format; 3, x as one f16
// value loaded from memory (A_GLOBAL, below).
// Weights that are not exact in f16: f32, FP8 and q8 (an FP8 or int8 code times an f32 or
// bf16 scale). q4 (a nibble times a bf16 scale: at most 11 significant bits) is, in f16's
// normal range (kernels/matmul.rs, `coop_q4_mode`), unless Q4_MODE asks for its lo half.
const W_LO: bool = X_F16 != 2u && (W_DTYPE == 0u || W_DTYPE == 3u || W_DTYPE == 4u || (W_DTYPE == 5u && Q4_MODE == 1u));
// x as hi and lo halves, unless X_F16 asks for one f16 value.
const X_LO: bool = X_F16 == 0u;
// X_F16 = 3 (`gemm` with SPARSA_COOP_A_GLOBAL=1, kernels/matmul.rs `coop_a_global`; with
// coop_xh.wgsl): x comes as f16 rows (a copy kernels/matmul.rs writes with x_to_f16.wgsl,
// rows P.x_stride elements apart, zeros past K to a whole K-step and past the last row to a
// whole tile; the tile's x offsets count f16 elements), and the subgroups load their A
// fragments straight from it (`a_frag`), a K-step ahead into registers, instead of through
// workgroup memory. Only the weights are staged: two stages, one barrier a K-step.
const A_GLOBAL: bool = X_F16 == 3u;
const_assert !(A_GLOBAL && (W_LO || W_GATHER == 1u));
// 128 rows: each subgroup's second 16 rows in the accumulators of the lo products.
const TR: bool = TM == 128u;
// X_F16 = 2 on 128 rows: mla_logits over pairs of query rows (kernels/matmul.rs, `MlaGemm::group`).
const_assert TM == 64u || (TM == 128u && X_F16 >= 1u && !W_LO && TN >= 128u && W_GATHER == 0u);
const_assert TN != 256u || (TM == 128u && X_F16 == 1u && HK == 32u);
// mla_values (W_GATHER = 1): the weights are a query row's selected cache rows read
// transposed, staged K-major ([k][n], rows of KP pairs) as the rows lie in memory
// (load_b_gathered); the others are staged [n][k] (rows of HP pairs).
const GATHER: bool = W_GATHER == 1u;
const KP: u32 = TN / 2u + 4u;
const_assert HK == 64u || (HK == 32u && !GATHER);
const_assert !GATHER || 64u * KP <= BSTAGE;

// Two stages where they fit in the workgroup memory NVIDIA's driver offers (48 KB; sparsa
// allows itself 47, gpu::COOP_WORKGROUP_BYTES: 46 for the stages, Cs and the rows' offsets,
// 1 for the entries' own arrays), else one. With HK = 32 every variant fits two; with 64,
// only x as one f16 value on 64 × 64 tiles.
const STAGE_BYTES: u32 = 4u * (ASTAGE * select(1u, 2u, X_LO) + BSTAGE * select(1u, 2u, W_LO));
const STAGES: u32 = select(1u, 2u, 2u * STAGE_BYTES + 4096u + 4u * (TM + TN) <= 47104u);
var<workgroup> Ahi: array<vec2<f16>, STAGES * ASTAGE>;   // [stage][64 rows of x][HP]
var<workgroup> Alo: array<vec2<f16>, select(4u, STAGES * ASTAGE, X_LO)>;
var<workgroup> Bhi: array<vec2<f16>, STAGES * BSTAGE>;   // [stage][TN weight rows][HP]: B = Wᵀ column-major
var<workgroup> Blo: array<vec2<f16>, select(4u, STAGES * BSTAGE, W_LO)>;
var<workgroup> Cs: array<f32, 1024>;          // a 16 × 64 part of the output tile, row-major
var<workgroup> x_rows: array<u32, TM>;        // the x offset of each tile row
var<workgroup> w_rows: array<u32, TN>;        // the weight offset of each tile column

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

// A pair of f32 values as f16 hi halves and lo halves times LO_SCALE.
struct F16Split {
    hi: vec2<f16>,
    lo: vec2<f16>,
}

fn split_f16(v: vec2<f32>) -> F16Split {
    let h = hi_part(v);
    return F16Split(vec2<f16>(h), vec2<f16>((v - h) * LO_SCALE));
}

// The 8 weights of a 32-bit word of q4 nibbles times `scale`, as 4 f16 pairs (exact: see
// Q4_MODE in kernels/matmul.rs).
fn q4_pairs(word: u32, scale: f32) -> array<vec2<f16>, 4> {
    let lo = q_nib_lo(word) * scale;
    let hi = q_nib_hi(word) * scale;
    return array<vec2<f16>, 4>(vec2<f16>(lo.xy), vec2<f16>(lo.zw), vec2<f16>(hi.xy), vec2<f16>(hi.zw));
}

// Two consecutive x values at pair `at` of the A tiles (hi and lo halves where X_LO).
fn put_a(at: u32, v: vec2<f32>) {
    if (X_LO) {
        let s = split_f16(v);
        Ahi[at] = s.hi;
        Alo[at] = s.lo;
    } else {
        Ahi[at] = vec2<f16>(v);
    }
}

// Two consecutive weights at pair `at` of the B tiles (the lo half only where W_LO).
fn put_b(at: u32, v: vec2<f32>) {
    if (W_LO) {
        let s = split_f16(v);
        Bhi[at] = s.hi;
        Blo[at] = s.lo;
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

// What one invocation stages a K-step: XI quads of x (tile rows `arow(i)`, columns
// 4 (lid % XL) .. + 3) and, for each 64-column block of the tile (b0, and b1 where TN is
// 128), 4 NPR pairs of weights (q4: NPR words of 8 weights; else 4 NPR pairs of tile column
// lid / 4 + 64 h, pair columns 4 (lid % 4) + 16 j .. + 3). The blocks are fields, not an
// array indexed in a loop: dynamically indexed, NVIDIA's compiler put them in local memory.
struct StagedB {
    b: array<vec2<f32>, 4 * NPR>,
    word: array<u32, NPR>,
    scale: array<f32, NPR>,
}
struct Staged {
    a: array<vec4<f32>, XI>,
    b0: StagedB,
    b1: StagedB,
    b2: StagedB,
    b3: StagedB,
}

// Tile row of x quad i of invocation lid. HK = 64 (rows of 36 words): the two halves of a
// subgroup take rows 4 apart, 16 banks apart. HK = 32 (rows of 20 words): its four quarters
// take rows r, r + 1, r + 4, r + 5 of an 8-row group (banks 0, 20, 16 and 4 on), r + 1 and
// r + 5 writing their pairs in the opposite order (`store_step`).
fn arow(lid: u32, i: u32) -> u32 {
    let s = lid / 32u;
    if (HK == 64u) {
        return (s % 4u) + 4u * ((lid / 16u) % 2u) + 8u * (s / 4u) + 16u * i;
    }
    let qq = (lid / 8u) % 4u;
    let g = s + 8u * i;
    return 8u * (g / 2u) + 2u * (g % 2u) + qq % 2u + 4u * (qq / 2u);
}

// p[i] without indexing the array dynamically (which NVIDIA's compiler put in local memory).
fn pick4(p: array<vec2<f16>, 4>, i: u32) -> vec2<f16> {
    return select(select(p[0], p[1], i == 1u), select(p[2], p[3], i == 3u), i >= 2u);
}
fn pick4f(p: array<vec2<f32>, 4>, i: u32) -> vec2<f32> {
    return select(select(p[0], p[1], i == 1u), select(p[2], p[3], i == 3u), i >= 2u);
}

// The weights invocation lid stages for tile column `row`'s K-step at k0.
fn load_b(lid: u32, row: u32, k0: u32, q4: bool) -> StagedB {
    var sb: StagedB;
    let q = lid % 4u;
    if (q4) {
        for (var j = 0u; j < NPR; j++) {
            sb.word[j] = 0u;
            sb.scale[j] = 0.0;
            if (row != NONE) {
                sb.word[j] = w[w_word(row + k0) + q + 4u * j];
                sb.scale[j] = q_scale((row + k0 + 32u * j) / QB);
            }
        }
    } else {
        for (var j = 0u; j < NPR; j++) {
            for (var i = 0u; i < 4u; i++) {
                sb.b[4u * j + i] = wpair(row, k0 + 32u * j + 8u * q + 2u * i);
            }
        }
    }
    return sb;
}

// mla_values' weights for the K-step at k0 and 64-column block h of the tile (GATHER): K
// index k is the query row's k-th selected position (`gather_row`, matmul.wgsl: NONE past
// its count or outside the segment), tile column c the element `w_rows[c]` of its cache row.
// Invocation lid stages position k0 + lid / 4 and the column pairs lid % 4 + 4 i (i < 8):
// a subgroup's 4 lanes of a row read 32 consecutive bytes per load, where [n][k] staging
// read each position's element on its own (the rows lie K-major in memory). `ra`: the
// cache row of that position (`gathered_row`).
fn load_b_gathered(lid: u32, h: u32, ra: u32) -> StagedB {
    var sb: StagedB;
    for (var i = 0u; i < 4u * NPR; i++) {
        let col = 64u * h + 2u * (lid % 4u + 4u * i);
        let c = w_rows[col];
        var v = vec2<f32>(0.0);
        if (ra != NONE && c != NONE) {
            if (w_rows[col + 1u] != NONE) {
                v = wload2(ra + c);
            } else {
                v.x = wload(ra + c);
            }
        }
        sb.b[i] = v;
    }
    return sb;
}

// The offset of the cache row of position k (NONE past P.k: see gather_row).
fn gathered_row_of(k: u32) -> u32 {
    if (k < P.k) {
        return gather_row(k);
    }
    return NONE;
}

// The cache row invocation lid gathers for the K-step at k0 (position k0 + lid / 4). Each
// row's values come after two loads in turn (the position, then the values). With G_AHEAD
// = 1 (kernels/matmul.rs, `coop_gather_ahead`) the position is loaded a K-step ahead, into
// g_ra, so that only the values wait behind the products (load_step runs the K-steps in
// order from 0); with 0 both are the K-step's loads.
var<private> g_ra: u32;
fn gathered_row(lid: u32, k0: u32) -> u32 {
    let k = k0 + lid / 4u;
    if (G_AHEAD == 0u) {
        return gathered_row_of(k);
    }
    var ra = g_ra;
    if (k0 == 0u) {
        ra = gathered_row_of(k);
    }
    g_ra = gathered_row_of(k + HK);
    return ra;
}

// Loads what invocation lid stages for the K-step at k0.
fn load_step(lid: u32, k0: u32, q4: bool) -> Staged {
    var st: Staged;
    let c = 4u * (lid % XL);
    for (var i = 0u; i < select(XI, 0u, A_GLOBAL); i++) {
        st.a[i] = xquad(x_rows[arow(lid, i)], k0 + c);
    }
    if (GATHER) {
        let ra = gathered_row(lid, k0);
        st.b0 = load_b_gathered(lid, 0u, ra);
        if (TH == 2u) {
            st.b1 = load_b_gathered(lid, 1u, ra);
        }
        return st;
    }
    st.b0 = load_b(lid, w_rows[lid / 4u], k0, q4);
    if (TH >= 2u) {
        st.b1 = load_b(lid, w_rows[lid / 4u + 64u], k0, q4);
    }
    if (TH == 4u) {
        st.b2 = load_b(lid, w_rows[lid / 4u + 128u], k0, q4);
        st.b3 = load_b(lid, w_rows[lid / 4u + 192u], k0, q4);
    }
    return st;
}

// Writes what load_b loaded for the tile column at B pair `row_at` (its row's start). Each
// invocation writes 4 consecutive pairs. In order, the rows' 36- or 20-word strides put 4 of
// a subgroup's 32 stores on one bank; with B_ROT = 1 (kernels/matmul.rs, `coop_b_rot`) the 8
// columns of a subgroup start their 4 at pair (i + column) % 4, so that each store's 32
// pairs fall on 32 banks.
fn store_b(lid: u32, row_at: u32, sb: StagedB, q4: bool) {
    let rot = select(0u, lid / 4u, B_ROT == 1u);
    for (var j = 0u; j < NPR; j++) {
        let at = row_at + 4u * (lid % 4u) + 16u * j;
        if (q4) {
            let p = q4_pairs(sb.word[j], sb.scale[j]);
            for (var i = 0u; i < 4u; i++) {
                let ii = (i + rot) % 4u;
                Bhi[at + ii] = pick4(p, ii);
            }
        } else {
            let b = array<vec2<f32>, 4>(sb.b[4u * j], sb.b[4u * j + 1u], sb.b[4u * j + 2u], sb.b[4u * j + 3u]);
            for (var i = 0u; i < 4u; i++) {
                let ii = (i + rot) % 4u;
                put_b(at + ii, pick4f(b, ii));
            }
        }
    }
}

// Writes what load_b_gathered loaded at K-major pair `at`: pairs at, at + 4, ...
fn store_b_gathered(at: u32, sb: StagedB) {
    for (var i = 0u; i < 4u * NPR; i++) {
        put_b(at + 4u * i, sb.b[i]);
    }
}

// Writes what load_step loaded into stage `stage`.
fn store_step(lid: u32, stage: u32, st: Staged, q4: bool) {
    let base = stage * ASTAGE;
    // A quad is two pairs. The two halves of a subgroup write their rows' pairs in opposite
    // orders: rows 4 apart are 16 banks apart, so pairs of the same parity would collide.
    let odd = (lid / XL) % 2u == 1u;
    let c = 2u * (lid % XL) + select(0u, 1u, odd);
    let c2 = 2u * (lid % XL) + select(1u, 0u, odd);
    for (var i = 0u; i < select(XI, 0u, A_GLOBAL); i++) {
        let r = base + arow(lid, i) * HP;
        put_a(r + c, select(st.a[i].xy, st.a[i].zw, odd));
        put_a(r + c2, select(st.a[i].zw, st.a[i].xy, odd));
    }
    if (GATHER) {
        // Row lid / 4 of the K-major stage; pair lid % 4 + 4 i of block h. The 8 rows of
        // a subgroup are 4 banks apart (KP ≡ 4 mod 32 words), so its 32 stores hit 32 banks.
        let kbase = stage * BSTAGE + (lid / 4u) * KP + lid % 4u;
        store_b_gathered(kbase, st.b0);
        if (TH == 2u) {
            store_b_gathered(kbase + 32u, st.b1);
        }
        return;
    }
    let bbase = stage * BSTAGE + (lid / 4u) * HP;
    store_b(lid, bbase, st.b0, q4);
    if (TH >= 2u) {
        store_b(lid, bbase + 64u * HP, st.b1, q4);
    }
    if (TH == 4u) {
        store_b(lid, bbase + 128u * HP, st.b2, q4);
        store_b(lid, bbase + 192u * HP, st.b3, q4);
    }
}

// The invocation's 4 × 4 outputs of the 16 × 64 part in Cs (row-major), at `r`.
fn cs_block(r: u32) -> Acc16 {
    return Acc16(
        vec4<f32>(Cs[r], Cs[r + 1u], Cs[r + 2u], Cs[r + 3u]),
        vec4<f32>(Cs[r + 64u], Cs[r + 65u], Cs[r + 66u], Cs[r + 67u]),
        vec4<f32>(Cs[r + 128u], Cs[r + 129u], Cs[r + 130u], Cs[r + 131u]),
        vec4<f32>(Cs[r + 192u], Cs[r + 193u], Cs[r + 194u], Cs[r + 195u]),
    );
}

// The staged pair where the B fragment of K-step part kk (in pairs) and tile column n
// starts, and the distance to the next 16 columns' fragment.
fn b_at(stage: u32, kk: u32, n: u32) -> u32 {
    if (GATHER) {
        return stage * BSTAGE + 2u * kk * KP + n / 2u;
    }
    return stage * BSTAGE + n * HP + kk;
}
const BCOL16: u32 = select(16u * HP, 8u, GATHER);

// B fragments (16 × 16 of K × N) of the weights' hi and lo halves at staged pair `at`:
// [n][k] stages load column-major, K-major ones row-major.
fn b_hi(at: u32) -> coop_mat16x16<f16, B> {
    if (GATHER) {
        return coopLoadT<coop_mat16x16<f16, B>>(&Bhi[at], KP);
    }
    return coopLoad<coop_mat16x16<f16, B>>(&Bhi[at], HP);
}
fn b_lo(at: u32) -> coop_mat16x16<f16, B> {
    if (GATHER) {
        return coopLoadT<coop_mat16x16<f16, B>>(&Blo[at], KP);
    }
    return coopLoad<coop_mat16x16<f16, B>>(&Blo[at], HP);
}

// a + v / LO_SCALE.
fn add_lo(a: Acc16, v: Acc16) -> Acc16 {
    let f = 1.0 / LO_SCALE;
    return Acc16(a.r0 + f * v.r0, a.r1 + f * v.r1, a.r2 + f * v.r2, a.r3 + f * v.r3);
}

// a, or v where it is the first part of an output (part 0), else a + v / LO_SCALE.
fn merge(a: Acc16, v: Acc16, part: u32) -> Acc16 {
    if (part == 0u) {
        return v;
    }
    return add_lo(a, v);
}

// `a_frag(row, i)`, A_GLOBAL's A fragment of the 16 x rows from f16 offset `row` and
// K-columns 16 i .., comes from coop_xh.wgsl (coop_x4.wgsl and coop_x1.wgsl: a value never
// used, without a load).

fn tile(xr: array<u32, TM / 16u>, wr: array<u32, TN / 32u>, lid: u32, kend: u32) -> array<Acc16, TM / 64u * (TN / 64u)> {
    let sg = lid / 32u;
    let mr = select((TM / 4u) * (sg % 4u), 64u * (sg % 2u), WIDE);
    let nc = select((TN / 2u) * (sg / 4u), 64u * (sg / 2u), WIDE);
    // The accumulators start from zeros in memory: a zero-valued cooperative matrix
    // (OpConstantNull) left garbage in them on NVIDIA's driver.
    if (lid < 256u) {
        Cs[lid] = 0.0;
    }
    if (lid % 16u == 0u) {
        for (var p = 0u; p < TM / 16u; p++) {
            x_rows[lid / 16u + 16u * p] = xr[p];
        }
    }
    if (lid % 8u == 0u) {
        for (var q = 0u; q < TN / 32u; q++) {
            w_rows[lid / 8u + 32u * q] = wr[q];
        }
    }
    workgroupBarrier();
    var c0 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var c1 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var c2 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var c3 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    // The lo halves' products, times LO_SCALE; where TM is 128, rows mr + 16 .. + 31.
    var d0 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var d1 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var d2 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var d3 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    // WIDE: rows mr + 32 .. (e) and mr + 48 .. (f).
    var e0 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var e1 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var e2 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var e3 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var f0 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var f1 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var f2 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    var f3 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[0], 16u);
    // Uniform: P is.
    let q4 = Q4_TILE && P.k % HK == 0u && P.ws % HK == 0u && P.w_t == 0u;
    store_step(lid, 0u, load_step(lid, 0u, q4), q4);
    // A_GLOBAL: the subgroup's A fragments of the next HK / 16 K-parts, in order (qa: rows
    // mr .., qb: rows mr + 16 .. where TM is 128); each K-part takes the first and loads
    // the one a K-step later.
    let nfrag = (kend + HK - 1u) / HK * (HK / 16u);
    let ra = x_rows[mr];
    let rb = x_rows[min(mr + 16u, TM - 1u)];
    var qa0 = a_frag(ra, 0u);
    var qa1 = a_frag(ra, 1u);
    var qa2 = a_frag(ra, 2u);
    var qa3 = a_frag(ra, 3u);
    var qb0 = a_frag(rb, 0u);
    var qb1 = a_frag(rb, 1u);
    var qb2 = a_frag(rb, 2u);
    var qb3 = a_frag(rb, 3u);
    workgroupBarrier();
    var cur = 0u;
    for (var k0 = 0u; k0 < kend; k0 += HK) {
        let more = k0 + HK < kend;
        var st: Staged;
        if (more) {
            st = load_step(lid, k0 + HK, q4);
        }
        for (var kk = 0u; kk < HK / 2u; kk += 8u) {
            let ia = cur * ASTAGE + mr * HP + kk;
            let ib = b_at(cur, kk, nc);
            if (WIDE) {
                let w0 = coopLoadT<coop_mat16x16<f16, A>>(&Ahi[ia], HP);
                let w1 = coopLoadT<coop_mat16x16<f16, A>>(&Ahi[ia + 16u * HP], HP);
                let w2 = coopLoadT<coop_mat16x16<f16, A>>(&Ahi[ia + 32u * HP], HP);
                let w3 = coopLoadT<coop_mat16x16<f16, A>>(&Ahi[ia + 48u * HP], HP);
                let v0 = b_hi(ib);
                let v1 = b_hi(ib + BCOL16);
                let v2 = b_hi(ib + 2u * BCOL16);
                let v3 = b_hi(ib + 3u * BCOL16);
                c0 = coopMultiplyAdd(w0, v0, c0);
                c1 = coopMultiplyAdd(w0, v1, c1);
                c2 = coopMultiplyAdd(w0, v2, c2);
                c3 = coopMultiplyAdd(w0, v3, c3);
                d0 = coopMultiplyAdd(w1, v0, d0);
                d1 = coopMultiplyAdd(w1, v1, d1);
                d2 = coopMultiplyAdd(w1, v2, d2);
                d3 = coopMultiplyAdd(w1, v3, d3);
                e0 = coopMultiplyAdd(w2, v0, e0);
                e1 = coopMultiplyAdd(w2, v1, e1);
                e2 = coopMultiplyAdd(w2, v2, e2);
                e3 = coopMultiplyAdd(w2, v3, e3);
                f0 = coopMultiplyAdd(w3, v0, f0);
                f1 = coopMultiplyAdd(w3, v1, f1);
                f2 = coopMultiplyAdd(w3, v2, f2);
                f3 = coopMultiplyAdd(w3, v3, f3);
                continue;
            }
            var ah = qa0;
            var a2 = qb0;
            if (A_GLOBAL) {
                qa0 = qa1;
                qa1 = qa2;
                qa2 = qa3;
                qb0 = qb1;
                qb1 = qb2;
                qb2 = qb3;
                let i = (k0 + 2u * kk) / 16u + HK / 16u;
                if (i < nfrag) {
                    qa3 = a_frag(ra, i);
                    if (TR) {
                        qb3 = a_frag(rb, i);
                    }
                }
            } else {
                ah = coopLoadT<coop_mat16x16<f16, A>>(&Ahi[ia], HP);
                if (TR) {
                    a2 = coopLoadT<coop_mat16x16<f16, A>>(&Ahi[ia + 16u * HP], HP);
                }
            }
            let b0 = b_hi(ib);
            let b1 = b_hi(ib + BCOL16);
            c0 = coopMultiplyAdd(ah, b0, c0);
            c1 = coopMultiplyAdd(ah, b1, c1);
            if (NB == 4u) {
                let b2 = b_hi(ib + 2u * BCOL16);
                let b3 = b_hi(ib + 3u * BCOL16);
                c2 = coopMultiplyAdd(ah, b2, c2);
                c3 = coopMultiplyAdd(ah, b3, c3);
                if (X_LO) {
                    let al = coopLoadT<coop_mat16x16<f16, A>>(&Alo[ia], HP);
                    d0 = coopMultiplyAdd(al, b0, d0);
                    d1 = coopMultiplyAdd(al, b1, d1);
                    d2 = coopMultiplyAdd(al, b2, d2);
                    d3 = coopMultiplyAdd(al, b3, d3);
                } else if (TR) {
                    d0 = coopMultiplyAdd(a2, b0, d0);
                    d1 = coopMultiplyAdd(a2, b1, d1);
                    d2 = coopMultiplyAdd(a2, b2, d2);
                    d3 = coopMultiplyAdd(a2, b3, d3);
                }
            } else if (X_LO) {
                let al = coopLoadT<coop_mat16x16<f16, A>>(&Alo[ia], HP);
                d0 = coopMultiplyAdd(al, b0, d0);
                d1 = coopMultiplyAdd(al, b1, d1);
            }
            // Weights with lo halves run 64-column tiles (kernels/matmul.rs): NB = 2.
            if (W_LO) {
                let l0 = b_lo(ib);
                let l1 = b_lo(ib + BCOL16);
                d0 = coopMultiplyAdd(ah, l0, d0);
                d1 = coopMultiplyAdd(ah, l1, d1);
            }
        }
        if (STAGES == 1u) {
            // One stage: everyone is done reading it before it is overwritten.
            workgroupBarrier();
        } else {
            cur = 1u - cur;
        }
        if (more) {
            store_step(lid, cur, st, q4);
        }
        workgroupBarrier();
    }
    // The result goes through Cs 16 rows × 64 columns at a time: for row group g (rows
    // 16 g ..) and each 64-column block, the subgroup holding it stores its accumulators, then
    // the invocations of those rows read their 4 × 4 blocks; the lo products (where there are
    // any) a second time. Where TM is 128 a subgroup's second 16 rows are its d accumulators.
    var acc0: Acc16;
    var acc1: Acc16;
    var acc2: Acc16;
    var acc3: Acc16;
    var acc4: Acc16;
    var acc5: Acc16;
    var acc6: Acc16;
    var acc7: Acc16;
    let ty = lid / 16u;
    let r = 4u * (ty % 4u) * 64u + 4u * (lid % 16u);
    let parts = select(1u, 2u, X_LO || W_LO);
    let block = nc / 64u;
    let col = nc % 64u;
    for (var g = 0u; g < TM / 16u; g++) {
        for (var hp = 0u; hp < TH * parts; hp++) {
            let h = hp / parts;
            let part = hp % parts;
            let second = TR && mr / 16u + 1u == g;
            // WIDE: the subgroup's row groups mr / 16 .. + 3 in c, d, e, f.
            let j = g - mr / 16u;
            if (WIDE && block == h && g >= mr / 16u && j < 4u) {
                if (j == 0u) {
                    coopStoreT(c0, &Cs[0], 64u);
                    coopStoreT(c1, &Cs[16], 64u);
                    coopStoreT(c2, &Cs[32], 64u);
                    coopStoreT(c3, &Cs[48], 64u);
                } else if (j == 1u) {
                    coopStoreT(d0, &Cs[0], 64u);
                    coopStoreT(d1, &Cs[16], 64u);
                    coopStoreT(d2, &Cs[32], 64u);
                    coopStoreT(d3, &Cs[48], 64u);
                } else if (j == 2u) {
                    coopStoreT(e0, &Cs[0], 64u);
                    coopStoreT(e1, &Cs[16], 64u);
                    coopStoreT(e2, &Cs[32], 64u);
                    coopStoreT(e3, &Cs[48], 64u);
                } else {
                    coopStoreT(f0, &Cs[0], 64u);
                    coopStoreT(f1, &Cs[16], 64u);
                    coopStoreT(f2, &Cs[32], 64u);
                    coopStoreT(f3, &Cs[48], 64u);
                }
            } else if (!WIDE && block == h && (mr / 16u == g || second)) {
                if (part == 0u && !second) {
                    coopStoreT(c0, &Cs[col], 64u);
                    coopStoreT(c1, &Cs[col + 16u], 64u);
                    if (NB == 4u) {
                        coopStoreT(c2, &Cs[col + 32u], 64u);
                        coopStoreT(c3, &Cs[col + 48u], 64u);
                    }
                } else {
                    coopStoreT(d0, &Cs[col], 64u);
                    coopStoreT(d1, &Cs[col + 16u], 64u);
                    if (NB == 4u) {
                        coopStoreT(d2, &Cs[col + 32u], 64u);
                        coopStoreT(d3, &Cs[col + 48u], 64u);
                    }
                }
            }
            workgroupBarrier();
            if (ty / 4u == g % 4u) {
                let v = cs_block(r);
                // Block TH · (g / 4) + h, in variables: arrays indexed in loops went to
                // local memory (see Staged).
                let b = TH * (g / 4u) + h;
                if (b == 0u) {
                    acc0 = merge(acc0, v, part);
                } else if (b == 1u) {
                    acc1 = merge(acc1, v, part);
                } else if (b == 2u) {
                    acc2 = merge(acc2, v, part);
                } else if (b == 3u) {
                    acc3 = merge(acc3, v, part);
                } else if (b == 4u) {
                    acc4 = v;
                } else if (b == 5u) {
                    acc5 = v;
                } else if (b == 6u) {
                    acc6 = v;
                } else {
                    acc7 = v;
                }
            }
            workgroupBarrier();
        }
    }
    const NA: u32 = TM / 64u * TH;
    var acc: array<Acc16, NA>;
    acc[0] = acc0;
    if (NA > 1u) {
        acc[min(1u, NA - 1u)] = acc1;
    }
    if (NA > 2u) {
        acc[min(2u, NA - 1u)] = acc2;
        acc[min(3u, NA - 1u)] = acc3;
    }
    if (NA > 4u) {
        acc[min(4u, NA - 1u)] = acc4;
        acc[min(5u, NA - 1u)] = acc5;
        acc[min(6u, NA - 1u)] = acc6;
        acc[min(7u, NA - 1u)] = acc7;
    }
    return acc;
}
