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
// Precision: every f32 value v is split into f16 halves hi + lo (`split`), and the product
// is hi·hi + lo·hi + hi·lo (lo·lo, about 2^-21 relative, is dropped), so results match the
// f32 kernels to about f32 rounding. bf16, f16 and q4 weights are exact in f16 (q4 in f16's
// normal range) and skip their lo part. Values beyond f16's range (|v| > 65504) are not representable: the
// CPU-side loaders keep weights finite, and activations of that size do not occur in the
// supported models (documented in BENCHMARKS.md).
//
// Subgroup s = lid / 32 (8 subgroups of 32) owns output rows 16 (s % 4) .. + 15 and
// columns 32 (s / 4) .. + 31: two accumulators.

const HK: u32 = 32u;                    // K per staged tile
const HS: u32 = 40u;                    // row stride of the staged tiles (f16; 80 bytes)
// Weights that are not exact in f16: f32, FP8 and q8 (an FP8 or int8 code times an f32 or
// bf16 scale). q4 (a nibble times a bf16 scale: at most 11 significant bits) is, in f16's
// normal range (kernels/matmul.rs, `coop_q4_mode`), unless Q4_MODE asks for its lo half.
const W_LO: bool = W_DTYPE == 0u || W_DTYPE == 3u || W_DTYPE == 4u || (W_DTYPE == 5u && Q4_MODE == 1u);

var<workgroup> Ahi: array<f16, 2560>;   // [64 rows of x][HS]
var<workgroup> Alo: array<f16, 2560>;
var<workgroup> Bhi: array<f16, 2560>;   // [64 weight rows][HS]: B = Wᵀ column-major
var<workgroup> Blo: array<f16, 2560>;
var<workgroup> Cs: array<f32, 4096>;    // [64][64] row-major

// v = hi + lo with hi = v truncated to f16's 11 significant bits (exact in f32 and, in f16's
// normal range, in f16) and lo = v - hi (exact in f32, rounded to f16). The split is done on
// the bits: written as v - f32(f16(v)), NVIDIA's compiler folded the round trip to zero.
fn split(v: f32) -> vec2<f32> {
    let hi = bitcast<f32>(bitcast<u32>(v) & 0xffffe000u);
    return vec2<f32>(hi, v - hi);
}

// x value v at `at` of the A tiles, as hi and lo halves.
fn store_a(at: u32, v: f32) {
    let p = split(v);
    Ahi[at] = f16(p.x);
    Alo[at] = f16(p.y);
}

// Weight value v at `at` of the B tiles (the lo half only where W_LO).
fn store_b(at: u32, v: f32) {
    if (W_LO) {
        let p = split(v);
        Bhi[at] = f16(p.x);
        Blo[at] = f16(p.y);
    } else {
        Bhi[at] = f16(v);
    }
}

// q4 weights without a lo half, in whole K-tiles (P.k and the row stride multiples of HK,
// scale blocks of whole K-tiles): each invocation stages one 32-bit word of 8 nibbles (one
// scale) and 8 consecutive x values a K-tile, instead of 8 element pairs and 8 single
// values, each with its own bounds checks, word and scale loads.
const Q4_TILE: bool = W_DTYPE == 5u && Q4_MODE == 0u && QB % HK == 0u;

// Stages 8 q4 weights (word `word` of a row, scale `sc`) at `at` of Bhi.
fn store_q4(at: u32, word: u32, sc: f32) {
    let lo = q_nib_lo(word) * sc;
    let hi = q_nib_hi(word) * sc;
    Bhi[at] = f16(lo.x);
    Bhi[at + 1u] = f16(lo.y);
    Bhi[at + 2u] = f16(lo.z);
    Bhi[at + 3u] = f16(lo.w);
    Bhi[at + 4u] = f16(hi.x);
    Bhi[at + 5u] = f16(hi.y);
    Bhi[at + 6u] = f16(hi.z);
    Bhi[at + 7u] = f16(hi.w);
}

// 4 consecutive x values from element offset `at` (NONE: zeros).
fn xload4(row: u32, at: u32) -> vec4<f32> {
    if (row == NONE) {
        return vec4<f32>(0.0);
    }
    let i = row + at;
    return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

fn tile(xr: vec4<u32>, wr: vec2<u32>, lid: u32) -> Acc16 {
    let sg = lid / 32u;
    let mr = 16u * (sg % 4u);
    let nc = 32u * (sg / 4u);
    // The accumulators start from zeros in memory: a zero-valued cooperative matrix
    // (OpConstantNull) left garbage in them on NVIDIA's driver.
    for (var i = lid; i < 4096u; i += 256u) {
        Cs[i] = 0.0;
    }
    workgroupBarrier();
    var c0 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[mr * 64u + nc], 64u);
    var c1 = coopLoadT<coop_mat16x16<f32, C>>(&Cs[mr * 64u + nc + 16u], 64u);
    workgroupBarrier();
    let ak = lid % 16u;
    let am = lid / 16u;
    let bp = lid % 8u;
    let bn = lid / 8u;
    // Uniform: P is.
    let q4 = Q4_TILE && P.k % HK == 0u && P.ws % HK == 0u;
    // The q4 staging: this invocation's weight row bn + 32 (bp / 4) and word bp % 4 of each
    // K-tile, and its x row am + 16 (ak / 4) at columns 8 (ak % 4) .. + 7.
    let qrow = wr[bp / 4u];
    let qj = bp % 4u;
    let qx = xr[ak / 4u];
    let qc = 8u * (ak % 4u);
    let qb = (bn + 32u * (bp / 4u)) * HS + 8u * qj;
    let qa = (am + 16u * (ak / 4u)) * HS + qc;
    var qw = 0u;
    var qs = 0.0;
    var qx0 = vec4<f32>(0.0);
    var qx1 = vec4<f32>(0.0);
    // Each invocation stages 8 x values (rows am + 16 p, columns ak and ak + 16) and 8
    // weights (rows bn + 32 q, columns 2 bp, 2 bp + 1 and 16 more) per K-tile; the next
    // K-tile's values are loaded into registers while this one is multiplied.
    var xa: array<f32, 8>;
    var wb: array<vec2<f32>, 4>;
    if (q4) {
        if (qrow != NONE) {
            qw = w[w_word(qrow) + qj];
            qs = q_scale(qrow / QB);
        }
        qx0 = xload4(qx, qc);
        qx1 = xload4(qx, qc + 4u);
    } else {
        for (var p = 0u; p < 4u; p++) {
            xa[2u * p] = xload(xr[p], ak);
            xa[2u * p + 1u] = xload(xr[p], 16u + ak);
        }
        for (var q = 0u; q < 2u; q++) {
            wb[2u * q] = wpair(wr[q], 2u * bp);
            wb[2u * q + 1u] = wpair(wr[q], 16u + 2u * bp);
        }
    }
    for (var k0 = 0u; k0 < P.k; k0 += HK) {
        let kn = k0 + HK;
        if (q4) {
            store_q4(qb, qw, qs);
            store_a(qa, qx0.x);
            store_a(qa + 1u, qx0.y);
            store_a(qa + 2u, qx0.z);
            store_a(qa + 3u, qx0.w);
            store_a(qa + 4u, qx1.x);
            store_a(qa + 5u, qx1.y);
            store_a(qa + 6u, qx1.z);
            store_a(qa + 7u, qx1.w);
            if (kn < P.k) {
                if (qrow != NONE) {
                    qw = w[w_word(qrow + kn) + qj];
                    qs = q_scale((qrow + kn) / QB);
                }
                qx0 = xload4(qx, kn + qc);
                qx1 = xload4(qx, kn + qc + 4u);
            }
        } else {
            for (var p = 0u; p < 4u; p++) {
                let at = (am + 16u * p) * HS + ak;
                store_a(at, xa[2u * p]);
                store_a(at + 16u, xa[2u * p + 1u]);
            }
            for (var q = 0u; q < 2u; q++) {
                let at = (bn + 32u * q) * HS + 2u * bp;
                store_b(at, wb[2u * q].x);
                store_b(at + 1u, wb[2u * q].y);
                store_b(at + 16u, wb[2u * q + 1u].x);
                store_b(at + 17u, wb[2u * q + 1u].y);
            }
            for (var p = 0u; p < 4u; p++) {
                xa[2u * p] = xload(xr[p], kn + ak);
                xa[2u * p + 1u] = xload(xr[p], kn + 16u + ak);
            }
            for (var q = 0u; q < 2u; q++) {
                wb[2u * q] = wpair(wr[q], kn + 2u * bp);
                wb[2u * q + 1u] = wpair(wr[q], kn + 16u + 2u * bp);
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < HK; kk += 16u) {
            let ah = coopLoadT<coop_mat16x16<f16, A>>(&Ahi[mr * HS + kk], HS);
            let al = coopLoadT<coop_mat16x16<f16, A>>(&Alo[mr * HS + kk], HS);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&Bhi[nc * HS + kk], HS);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&Bhi[(nc + 16u) * HS + kk], HS);
            c0 = coopMultiplyAdd(ah, b0, c0);
            c0 = coopMultiplyAdd(al, b0, c0);
            c1 = coopMultiplyAdd(ah, b1, c1);
            c1 = coopMultiplyAdd(al, b1, c1);
            if (W_LO) {
                let l0 = coopLoad<coop_mat16x16<f16, B>>(&Blo[nc * HS + kk], HS);
                let l1 = coopLoad<coop_mat16x16<f16, B>>(&Blo[(nc + 16u) * HS + kk], HS);
                c0 = coopMultiplyAdd(ah, l0, c0);
                c1 = coopMultiplyAdd(ah, l1, c1);
            }
        }
        workgroupBarrier();
    }
    coopStoreT(c0, &Cs[mr * 64u + nc], 64u);
    coopStoreT(c1, &Cs[mr * 64u + nc + 16u], 64u);
    workgroupBarrier();
    let r = 4u * (lid / 16u) * 64u + 4u * (lid % 16u);
    return Acc16(
        vec4<f32>(Cs[r], Cs[r + 1u], Cs[r + 2u], Cs[r + 3u]),
        vec4<f32>(Cs[r + 64u], Cs[r + 65u], Cs[r + 66u], Cs[r + 67u]),
        vec4<f32>(Cs[r + 128u], Cs[r + 129u], Cs[r + 130u], Cs[r + 131u]),
        vec4<f32>(Cs[r + 192u], Cs[r + 193u], Cs[r + 194u], Cs[r + 195u]),
    );
}
