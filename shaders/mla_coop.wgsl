enable f16;
enable wgpu_cooperative_matrix;

// Sparse MLA on tensor cores: `mla`'s contract (mla.wgsl: the same Params, bindings, grid
// of (row, head group, split) and `part` layout, merged by mla_combine) with its products on
// cooperative matrices of 16×16×16, f16 inputs, f32 accumulation. Put before fp8.wgsl,
// rotary.wgsl and mla.wgsl (whose bindings, `row4` and `query` it uses), on adapters that
// offer the GEMM tile's configuration (kernels/attention.rs checks).
//
// Every head of a row reads the same selected cache rows, so a row's attention is a small
// GEMM: logits S = Q · Kᵀ with Q the heads' queries (M = heads) and K the selected rows.
// One workgroup takes TH = 32 heads; its split's positions go in tiles of TP = 64:
//   1. logits S[32][64]: over the row's kv_lora + dr dimensions in chunks of TD = 64, the
//      chunk of the queries and of the tile's cache rows is staged in workgroup memory as
//      f16 hi and lo halves; subgroup s owns the 16 × 16 block (16 (s % 2), 16 (s / 2));
//   2. per head, the tile's max and the online-softmax rescale (8 invocations a head);
//      the probabilities are staged as f16 halves;
//   3. values O[32][kv_lora] += P · V in chunks of 64 latent columns (the rows staged
//      again): subgroup s computes block (16 (s % 2), 16 (s / 2)) of the chunk into
//      workgroup memory, and each invocation adds its 8 elements of it to the sums it keeps
//      in registers (rescaled by the head's correction first, as `mla` does).
// Precision (as matmul_coop.wgsl): each value v = hi + lo in f16 and each product
// hi·hi + lo·hi + hi·lo, so results match the f32 kernel to about f32 rounding; values
// beyond f16's range (|v| > 65504) are not representable (queries, latent rows and
// probabilities of the supported models stay far below).
//
// Defines beside mla.wgsl's: NQC = ceil((kv_lora + dr) / 64), NVC = ceil(kv_lora / 64).

const TH: u32 = 32u;  // heads per workgroup
const TP: u32 = 64u;  // positions per tile
const TD: u32 = 64u;  // dimensions per staged chunk
const TS: u32 = 72u;  // row stride of the staged f16 tiles

// Every workgroup variable is a multiple of 16 bytes (the scalar count too): on the H200
// a 4-byte `var<workgroup> u32` moved the arrays after it off 16-byte alignment, and the
// cooperative loads and stores (which need it) shifted their data by an element: wrong
// logits and NaN outputs.

var<workgroup> tq_hi: array<f16, 2304>;  // [TH heads][TS]: a chunk of the queries
var<workgroup> tq_lo: array<f16, 2304>;
var<workgroup> tk_hi: array<f16, 4608>;  // [TP positions][TS]: a chunk of the cache rows
var<workgroup> tk_lo: array<f16, 4608>;
var<workgroup> tp_hi: array<f16, 2304>;  // [TH][TS]: probabilities
var<workgroup> tp_lo: array<f16, 2304>;
var<workgroup> tsc: array<f32, 2048>;    // [TH][TP]: logits, then a value chunk
var<workgroup> tzero: array<f32, 256>;   // a zero 16 × 16 block: accumulators start from it
var<workgroup> tpos: array<u32, TP>;
var<workgroup> tred: array<f32, 256>;
var<workgroup> tm: array<f32, TH>;
var<workgroup> tl: array<f32, TH>;
var<workgroup> tcorr: array<f32, TH>;
var<workgroup> tcount: array<u32, 4>;  // [0]: the row's count (16 bytes: see above)

// v as f16 hi and lo halves (matmul_coop.wgsl's `split`).
fn tc_halves(v: f32) -> vec2<f16> {
    let hi = bitcast<f32>(bitcast<u32>(v) & 0xffffe000u);
    return vec2<f16>(f16(hi), f16(v - hi));
}

// Stages dimensions d0 .. d0 + 63 (those below `dmax`) of the tile's cache rows into tk:
// invocation lid takes 16 of row lid / 4. Absent positions stage zeros.
fn tc_stage_rows(d0: u32, dmax: u32, lid: u32) {
    let p = lid / 4u;
    let c = (lid % 4u) * 16u;
    let pos = tpos[p];
    for (var i = 0u; i < 16u; i += 4u) {
        let d = d0 + c + i;
        var r = vec4<f32>(0.0);
        if (pos != ABSENT && d < dmax) {
            r = row4(P.c_off + pos * P.c_stride, d);
        }
        for (var e = 0u; e < 4u; e++) {
            let h = tc_halves(select(0.0, r[e], d + e < dmax));
            tk_hi[p * TS + c + i + e] = h.x;
            tk_lo[p * TS + c + i + e] = h.y;
        }
    }
}

// Stages dimensions d0 .. d0 + 63 of the queries of heads h0 .. h0 + 31 of row t into tq:
// invocation lid takes 8 of head lid / 8.
fn tc_stage_queries(t: u32, h0: u32, d0: u32, lid: u32) {
    let h = lid / 8u;
    let c = (lid % 8u) * 8u;
    for (var i = 0u; i < 8u; i++) {
        let v = tc_halves(query(t, h0 + h, d0 + c + i));
        tq_hi[h * TS + c + i] = v.x;
        tq_lo[h * TS + c + i] = v.y;
    }
}

@compute @workgroup_size(256)
fn mla_tc(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    // Uniform: the whole workgroup returns or none of it.
    if (g >= P.rows * P.hgroups * P.splits) {
        return;
    }
    let split = g % P.splits;
    let hg = (g / P.splits) % P.hgroups;
    let t = g / (P.splits * P.hgroups);
    let h0 = hg * TH;
    let sg = lid / 32u;
    let mr = 16u * (sg % 2u);
    let nc = 16u * (sg / 2u);
    tzero[lid] = 0.0;
    if (lid < TH) {
        tm[lid] = NEG_BIG;
        tl[lid] = 0.0;
    }
    if (lid == 0u) {
        tcount[0] = min(cnt[t], P.topk);
    }
    let n = workgroupUniformLoad(&tcount[0]);
    let j_begin = split * P.split_len;
    let j_end = min(n, j_begin + P.split_len);
    let ib = t * P.topk;
    // This invocation's sums: element j of value chunk c is head lid / 64 + 4 j, latent
    // column 64 c + lid % 64.
    var acc: array<f32, 8u * NVC>;
    for (var i = 0u; i < 8u * NVC; i++) {
        acc[i] = 0.0;
    }
    for (var j0 = j_begin; j0 < j_end; j0 += TP) {
        workgroupBarrier();
        if (lid < TP) {
            var pos = ABSENT;
            if (j0 + lid < j_end) {
                let s = idx[ib + j0 + lid];
                pos = select(ABSENT, s - P.seg_lo, s >= P.seg_lo && s - P.seg_lo < P.seg_n);
            }
            tpos[lid] = pos;
        }
        // 1. logits.
        var s_acc = coopLoadT<coop_mat16x16<f32, C>>(&tzero[0], 16u);
        for (var c = 0u; c < NQC; c++) {
            workgroupBarrier();
            tc_stage_queries(t, h0, c * TD, lid);
            tc_stage_rows(c * TD, qd(), lid);
            workgroupBarrier();
            for (var kk = 0u; kk < TD; kk += 16u) {
                let ah = coopLoadT<coop_mat16x16<f16, A>>(&tq_hi[mr * TS + kk], TS);
                let al = coopLoadT<coop_mat16x16<f16, A>>(&tq_lo[mr * TS + kk], TS);
                let bh = coopLoad<coop_mat16x16<f16, B>>(&tk_hi[nc * TS + kk], TS);
                let bl = coopLoad<coop_mat16x16<f16, B>>(&tk_lo[nc * TS + kk], TS);
                s_acc = coopMultiplyAdd(ah, bh, s_acc);
                s_acc = coopMultiplyAdd(al, bh, s_acc);
                s_acc = coopMultiplyAdd(ah, bl, s_acc);
            }
        }
        coopStoreT(s_acc, &tsc[mr * TP + nc], TP);
        workgroupBarrier();
        // 2. online softmax: invocation (h, sub) takes positions 8 sub .. 8 sub + 7.
        let h = lid / 8u;
        let sub = lid % 8u;
        var lm = NEG_BIG;
        for (var i = 0u; i < 8u; i++) {
            let p = sub * 8u + i;
            if (tpos[p] != ABSENT) {
                lm = max(lm, tsc[h * TP + p] * P.scale);
            }
        }
        tred[lid] = lm;
        workgroupBarrier();
        var mx = NEG_BIG;
        for (var i = 0u; i < 8u; i++) {
            mx = max(mx, tred[h * 8u + i]);
        }
        let m_old = tm[h];
        let mb = max(m_old, mx);
        var ls = 0.0;
        for (var i = 0u; i < 8u; i++) {
            let p = sub * 8u + i;
            var e = 0.0;
            if (tpos[p] != ABSENT) {
                e = exp(tsc[h * TP + p] * P.scale - mb);
            }
            let v = tc_halves(e);
            tp_hi[h * TS + p] = v.x;
            tp_lo[h * TS + p] = v.y;
            ls += e;
        }
        workgroupBarrier();
        tred[lid] = ls;
        workgroupBarrier();
        if (sub == 0u) {
            var sum = 0.0;
            for (var i = 0u; i < 8u; i++) {
                sum += tred[h * 8u + i];
            }
            let corr = exp(m_old - mb);
            tcorr[h] = corr;
            tl[h] = tl[h] * corr + sum;
            tm[h] = mb;
        }
        workgroupBarrier();
        // 3. values.
        for (var j = 0u; j < 8u; j++) {
            let corr = tcorr[lid / 64u + 4u * j];
            for (var c = 0u; c < NVC; c++) {
                acc[c * 8u + j] *= corr;
            }
        }
        for (var c = 0u; c < NVC; c++) {
            workgroupBarrier();
            tc_stage_rows(c * TD, P.kv_lora, lid);
            workgroupBarrier();
            var o_acc = coopLoadT<coop_mat16x16<f32, C>>(&tzero[0], 16u);
            for (var kk = 0u; kk < TP; kk += 16u) {
                let ah = coopLoadT<coop_mat16x16<f16, A>>(&tp_hi[mr * TS + kk], TS);
                let al = coopLoadT<coop_mat16x16<f16, A>>(&tp_lo[mr * TS + kk], TS);
                let bh = coopLoadT<coop_mat16x16<f16, B>>(&tk_hi[kk * TS + nc], TS);
                let bl = coopLoadT<coop_mat16x16<f16, B>>(&tk_lo[kk * TS + nc], TS);
                o_acc = coopMultiplyAdd(ah, bh, o_acc);
                o_acc = coopMultiplyAdd(al, bh, o_acc);
                o_acc = coopMultiplyAdd(ah, bl, o_acc);
            }
            coopStoreT(o_acc, &tsc[mr * TP + nc], TP);
            workgroupBarrier();
            for (var j = 0u; j < 8u; j++) {
                acc[c * 8u + j] += tsc[lid + 256u * j];
            }
        }
    }
    // Outputs: normalized where there is one split, else the split's partial sums.
    let col0 = lid % 64u;
    for (var j = 0u; j < 8u; j++) {
        let hl = lid / 64u + 4u * j;
        let head = h0 + hl;
        if (head >= P.heads) {
            continue;
        }
        let pb = ((t * P.heads + head) * P.part_splits + P.split_base + split) * (P.kv_lora + 2u);
        let hsum = tl[hl];
        var inv = 0.0;
        if (hsum > 0.0) {
            inv = 1.0 / hsum;
        }
        for (var c = 0u; c < NVC; c++) {
            let col = c * TD + col0;
            if (col < P.kv_lora) {
                if (P.part_splits == 1u) {
                    out[P.o_off + t * P.o_stride + head * P.kv_lora + col] = acc[c * 8u + j] * inv;
                } else {
                    out[pb + col] = acc[c * 8u + j];
                }
            }
        }
        if (P.part_splits != 1u && col0 == 0u) {
            out[pb + P.kv_lora] = tm[hl];
            out[pb + P.kv_lora + 1u] = hsum;
        }
    }
}
