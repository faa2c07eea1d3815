// ---- GEMV on integer dot products (q8 and q4 weights, one x row) -----------------------
// gemv4q's layout (4 weight rows per lane, TPR4 lanes per row group), but the products are
// 8-bit integer dot products (dot4I8Packed: 4 multiply-adds in one instruction where the
// device has them) instead of decoding every weight to f32: the decode's integer work, not
// DRAM, bounds gemv4q over 4- and 8-bit weights.
//
// x is split per block of 32 elements into two int8 vectors (xquant.wgsl), which keeps the
// result within f32-reference tolerances; llama.cpp's q8_1 activations keep only `hi`.
//
// Where x comes from (define XQ): 0 = each workgroup quantizes its x row into workgroup
// memory first; 1 = a producer wrote it to a buffer once (`quantize_x_rows`, or a fused
// RMSNorm / SwiGLU), read through x4's binding by every workgroup: no per-workgroup prologue.
// Extra defines: MAXB, the blocks the workgroup arrays hold (≥ k / 32 when XQ = 0); UNROLL,
// 16-byte words per row a lane loads before using them (1 or 2); XLO, 0 to leave x's lo
// words out (half the products and x loads; inexact results, for timing only); I2F, the
// int-to-float conversions of a q4 word's sums (1, or 2: see dot_x).

var<workgroup> xh: array<vec4<u32>, 2 * MAXB>;
var<workgroup> xl: array<vec4<u32>, 2 * MAXB>;
var<workgroup> xs: array<f32, MAXB>;
var<workgroup> xm: array<f32, MAXB>;

// XQ = 1 reads the quantized words through x4 (binding 1, bitcast back to words: an entry
// point may bind only one variable there).
fn xq(i: u32) -> vec4<u32> {
    return bitcast<vec4<u32>>(x4[i]);
}
@group(0) @binding(2) var<storage, read_write> xq_out: array<vec4<u32>>;

// vec4 offset of this invocation's quantized x row in `xq` (XQ = 1).
var<private> xqb: u32;

fn get_xh(i: u32) -> vec4<u32> {
    if (XQ == 1u) {
        return xq(xqb + i);
    }
    return xh[i];
}
fn get_xl(i: u32) -> vec4<u32> {
    if (XLO == 0u) {
        return vec4<u32>(0u);
    }
    if (XQ == 1u) {
        return xq(xqb + P.k / 16u + i);
    }
    return xl[i];
}
// (scale, xm) of block b.
fn get_xsm(b: u32) -> vec2<f32> {
    if (XQ == 1u) {
        let v = xq(xqb + P.k / 8u + b / 2u);
        return bitcast<vec2<f32>>(select(v.xy, v.zw, (b & 1u) == 1u));
    }
    return vec2<f32>(xs[b], xm[b]);
}

// Block b of the x row at float offset `xo`, quantized in the order W_DTYPE reads.
fn quant_block(xo: u32, b: u32) -> QBlock {
    let v0 = xo / 4u + b * 8u;
    var v: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j++) {
        v[j] = x4[v0 + j];
    }
    return quant_block_of(v, W_DTYPE == 5u);
}

// Quantizes the x row at float offset `xo` (k floats) into xh / xl / xs / xm (XQ = 0).
fn quantize_x(xo: u32, lid: u32) {
    if (XQ == 1u) {
        return;
    }
    let nb = P.k / 32u;
    for (var b = lid; b < nb; b += WG) {
        let q = quant_block(xo, b);
        xh[2u * b] = q.h0;
        xh[2u * b + 1u] = q.h1;
        xl[2u * b] = q.l0;
        xl[2u * b + 1u] = q.l1;
        xs[b] = q.s;
        xm[b] = q.m;
    }
    workgroupBarrier();
}

// The `rows` rows of x (P.x_off, P.x_stride) quantized into xq_out, row r at r · XQ_STRIDE,
// eight invocations per 32-element block (XQ = 1's producer where no RMSNorm or SwiGLU
// makes it).
@compute @workgroup_size(256)
fn quantize_x_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let nb = P.k / 32u;
    let rb = word_slot((wid.x + wid.y * nwg.x) * WG + lid, nb);
    let r = rb.x;
    let b = rb.y;
    let j = lid & 7u;
    let live = r < P.rows;
    var v = vec4<f32>(0.0);
    if (live) {
        let xo = P.x_off + r * P.x_stride + 32u * b;
        for (var i = 0u; i < 4u; i++) {
            let e = xo + word_elem(j, i, W_DTYPE == 5u);
            v[i] = x4[e / 4u][e % 4u];
        }
    }
    quant_word(v, lid, live, r * xq_stride(P.k), nb, b);
}

// dot(w, h) and dot(w, l) of 16 bytes of int8 weights with x's hi and lo words (l's left
// out where XLO = 0).
fn idot8x(w: vec4<u32>, h: vec4<u32>, l: vec4<u32>) -> vec2<i32> {
    var lo = 0;
    if (XLO == 1u) {
        lo = (dot4I8Packed(w.x, l.x) + dot4I8Packed(w.y, l.y)) + (dot4I8Packed(w.z, l.z) + dot4I8Packed(w.w, l.w));
    }
    return vec2<i32>((dot4I8Packed(w.x, h.x) + dot4I8Packed(w.y, h.y)) + (dot4I8Packed(w.z, h.z) + dot4I8Packed(w.w, h.w)), lo);
}

// A 16-byte word of weight codes as int8 vectors: q4's 32 nibbles (low and high nibble of
// each byte, 0..15) in `a` and `b`; q8's 16 codes in `a`.
struct Codes {
    a: vec4<u32>,
    b: vec4<u32>,
}

fn codes_of(v: vec4<u32>) -> Codes {
    if (W_DTYPE == 5u) {
        let m = vec4<u32>(0x0f0f0f0fu);
        let lo = v & m;
        let hi = (v >> vec4<u32>(4u)) & m;
        return Codes(vec4<u32>(lo.x, hi.x, lo.y, hi.y), vec4<u32>(lo.z, hi.z, lo.w, hi.w));
    }
    return Codes(v, v);
}

// x's quantized words that weight word q meets (the row at `xqb` where XQ = 1): hi and lo
// for each code vector of Codes (q4: words 2q and 2q + 1; q8: word q, half q & 1 of block
// q / 2), and their block's (scale, m).
struct XWords {
    ha: vec4<u32>,
    la: vec4<u32>,
    hb: vec4<u32>,
    lb: vec4<u32>,
    sm: vec2<f32>,
}

fn x_words(q: u32) -> XWords {
    if (W_DTYPE == 5u) {
        return XWords(get_xh(2u * q), get_xl(2u * q), get_xh(2u * q + 1u), get_xl(2u * q + 1u), get_xsm(q));
    }
    let z = vec4<u32>(0u);
    return XWords(get_xh(q), get_xl(q), z, z, get_xsm(q / 2u));
}

// The codes `c` of a weight word (scale `sw`) against x's words `x` for it:
// sw · s_x · (Dhi + Dlo / 254 − offset).
// With I2F = 1 or 3 (3 the default), q4's two sums become f32 in one conversion: |254 · Dhi + Dlo| ≤ 255 · 32 ·
// 15 · 127 < 2^24, so the f32 holds it exactly.
fn dot_x(c: Codes, x: XWords, sw: f32) -> f32 {
    if (W_DTYPE == 5u) {
        let d = idot8x(c.a, x.ha, x.la) + idot8x(c.b, x.hb, x.lb);
        if (I2F != 2u) {
            return sw * x.sm.x * (f32(d.x * 254 + d.y) * (1.0 / 254.0) - x.sm.y);
        }
        return sw * x.sm.x * ((f32(d.x) + f32(d.y) * (1.0 / 254.0)) - x.sm.y);
    }
    let d = idot8x(c.a, x.ha, x.la);
    return sw * x.sm.x * (f32(d.x) + f32(d.y) * (1.0 / 254.0));
}

// dot_x with x's words for weight word `q`.
fn word_dot(c: Codes, q: u32, sw: f32) -> f32 {
    return dot_x(c, x_words(q), sw);
}

// One 16-byte word of codes `v` at word index `wi` of the chunk, against x's quantized words
// for that word (word `q` of the row): s_w · s_x · (Dhi + Dlo / 254 − offset).
fn dot_word_i8(v: vec4<u32>, wi: u32, q: u32) -> f32 {
    return word_dot(codes_of(v), q, q_scale((wi * EPV) / QB));
}

// quad_partial on integer dot products: the 4 rows' partial dots of this lane.
fn quad_partial_i8(wo: vec4<u32>, lane: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    let w = live_rows(wo);
    if (w.x == NONE) {
        return acc;
    }
    let kw = P.k / EPV;
    var q = lane;
    if (UNROLL == 2u) {
        // Both words of all 4 rows loaded before any is used: 8 loads in flight per lane.
        for (; q + TPR4 < kw; q += 2u * TPR4) {
            let r = q + TPR4;
            let a0 = w4[w.x + q];
            let a1 = w4[w.y + q];
            let a2 = w4[w.z + q];
            let a3 = w4[w.w + q];
            let b0 = w4[w.x + r];
            let b1 = w4[w.y + r];
            let b2 = w4[w.z + r];
            let b3 = w4[w.w + r];
            acc += vec4<f32>(dot_word_i8(a0, w.x + q, q), dot_word_i8(a1, w.y + q, q), dot_word_i8(a2, w.z + q, q), dot_word_i8(a3, w.w + q, q));
            acc += vec4<f32>(dot_word_i8(b0, w.x + r, r), dot_word_i8(b1, w.y + r, r), dot_word_i8(b2, w.z + r, r), dot_word_i8(b3, w.w + r, r));
        }
    }
    for (; q < kw; q += TPR4) {
        acc += vec4<f32>(dot_word_i8(w4[w.x + q], w.x + q, q), dot_word_i8(w4[w.y + q], w.y + q, q),
                         dot_word_i8(w4[w.z + q], w.z + q, q), dot_word_i8(w4[w.w + q], w.w + q, q));
    }
    return acc;
}

@compute @workgroup_size(256)
fn gemv_dot(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    xqb = 0u;
    quantize_x(P.x_off, lid);
    let n0 = dense_quad_row(g, lid);
    let wo = dense_quad(n0);
    dot_store(quad_partial_i8(wo, lid % TPR4), wo, P.y_off, n0, lid);
}

// gemv_dot for routed experts: one slot per workgroup (as gemv4q_experts).
@compute @workgroup_size(256)
fn gemv_dot_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let at = block_quad_row(g, lid);
    let slot = at.x;
    let n0 = at.y;
    var wo = vec4<u32>(NONE);
    var xo = 0u;
    var e = NONE;
    xqb = 0u;
    if (slot < P.rows) {
        e = expert_of(slot);
        xo = slot_x(slot);
        xqb = select(slot / P.topk, slot, P.x_per_slot != 0u) * xq_stride(P.k);
    }
    // Uniform: every invocation of the workgroup has the same slot.
    quantize_x(xo, lid);
    if (e < P.n_experts) {
        wo = expert_quad(e, n0);
    }
    dot_store(quad_partial_i8(wo, lid % TPR4), wo, P.y_off + slot * P.y_stride, n0, lid);
}

// ---- T rows of x at once (gemv_dot_rows, gemv_dot_experts_rows; XQ = 1) ----------------
// A speculative verification (or a short chunk) multiplies a few rows of x by the same
// weights: each lane loads its weight rows' words once and takes them against every x
// row, so the weights are read once for all rows instead of once per row. A lane takes RR
// quads of weight rows (1 or 2): with 2, each x word it loads serves 8 weight rows, half
// the x loads per product. Workgroups of ROWS_WG invocations (256, or 128: with as many
// registers a lane, finer steps of occupancy; `red` and the reductions' lane groups are
// laid out for 256 and serve any smaller size).

// Weight rows a lane group takes (RR quads), and a workgroup (rows_per_workgroup in
// kernels/matmul.rs).
const RLG: u32 = 4u * RR;
const RPWG: u32 = ROWS_WG / TPR4 * RLG;

// This lane's partial dots: acc_t[i · T + t][j] for x row t (t < nx) and weight row j of
// quad i.
var<private> acc_t: array<vec4<f32>, T * RR>;
// vec4 offset in xq of x row t, and the y offset its outputs go to.
var<private> xrows: array<u32, T>;
var<private> ybase: array<u32, T>;
var<private> nx: u32;

// One word position q of the 4 weight rows at word offsets w: their 16-byte words and
// block scales.
struct Words4 {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
    d: vec4<u32>,
    s: vec4<f32>,
}

fn words4(w: vec4<u32>, q: u32) -> Words4 {
    return Words4(w4[w.x + q], w4[w.y + q], w4[w.z + q], w4[w.w + q],
                  vec4<f32>(q_scale(((w.x + q) * EPV) / QB), q_scale(((w.y + q) * EPV) / QB),
                            q_scale(((w.z + q) * EPV) / QB), q_scale(((w.w + q) * EPV) / QB)));
}

// Word position q of a lane's quads (the second only where RR = 2).
struct Words8 {
    u: Words4,
    v: Words4,
}

fn words8(w: vec4<u32>, w2: vec4<u32>, q: u32) -> Words8 {
    let u = words4(w, q);
    if (RR == 2u) {
        return Words8(u, words4(w2, q));
    }
    return Words8(u, u);
}

// rows_word's dot of the codes `c` (scale `sw`) with x's words `x`, whose block factors
// f = (s_x / 254, s_x · m) rows_word takes once per x row and word: with I2F = 3 (q4),
// sw · (f32(254 · Dhi + Dlo) · f.x − f.y), one conversion and two multiply-adds a weight
// row, instead of dot_x's conversion and five operations.
fn rows_dot(c: Codes, x: XWords, f: vec2<f32>, sw: f32) -> f32 {
    if (I2F == 3u && W_DTYPE == 5u) {
        let d = idot8x(c.a, x.ha, x.la) + idot8x(c.b, x.hb, x.lb);
        return sw * fma(f32(d.x * 254 + d.y), f.x, -f.y);
    }
    return dot_x(c, x, sw);
}

// Adds word position q's products with every x row to acc_t: the weight words unpacked
// once, each x row's words loaded once.
fn rows_word(v: Words8, q: u32) {
    let c0 = codes_of(v.u.a);
    let c1 = codes_of(v.u.b);
    let c2 = codes_of(v.u.c);
    let c3 = codes_of(v.u.d);
    let c4 = codes_of(v.v.a);
    let c5 = codes_of(v.v.b);
    let c6 = codes_of(v.v.c);
    let c7 = codes_of(v.v.d);
    for (var t = 0u; t < T; t++) {
        if (t < nx) {
            xqb = xrows[t];
            let xw = x_words(q);
            let f = vec2<f32>(xw.sm.x * (1.0 / 254.0), xw.sm.x * xw.sm.y);
            acc_t[t] += vec4<f32>(rows_dot(c0, xw, f, v.u.s.x), rows_dot(c1, xw, f, v.u.s.y), rows_dot(c2, xw, f, v.u.s.z), rows_dot(c3, xw, f, v.u.s.w));
            if (RR == 2u) {
                acc_t[T + t] += vec4<f32>(rows_dot(c4, xw, f, v.v.s.x), rows_dot(c5, xw, f, v.v.s.y), rows_dot(c6, xw, f, v.v.s.z), rows_dot(c7, xw, f, v.v.s.w));
            }
        }
    }
}

// acc_t for the weight rows at word offsets `wo` and (RR = 2) `wo2` (NONE: absent) from
// lane `lane`. With UNROLL = 2 the next word position's words are loaded before this one's
// products, so the loads of one overlap the arithmetic of the other.
fn rows_partial(wo: vec4<u32>, wo2: vec4<u32>, lane: u32) {
    for (var i = 0u; i < T * RR; i++) {
        acc_t[i] = vec4<f32>(0.0);
    }
    let w = live_rows(wo);
    let kw = P.k / EPV;
    if (w.x == NONE || lane >= kw) {
        return;
    }
    // The second quad's absent rows read the first's (rows ascend: if any of the first
    // quad's rows is absent, all of the second's are).
    var w2 = live_rows(wo2);
    if (w2.x == NONE) {
        w2 = w;
    }
    if (UNROLL == 2u) {
        var q = lane;
        var v = words8(w, w2, q);
        for (; q + TPR4 < kw; q += TPR4) {
            let next = words8(w, w2, q + TPR4);
            rows_word(v, q);
            v = next;
        }
        rows_word(v, q);
        return;
    }
    for (var q = lane; q < kw; q += TPR4) {
        rows_word(words8(w, w2, q), q);
    }
}

// rows_store_quad for each of the lane's quads: rows n0 .. n0 + 3 at `wo`, n0 + 4 .. n0 + 7
// at `wo2`.
fn rows_store(wo: vec4<u32>, wo2: vec4<u32>, n0: u32, lid: u32) {
    rows_store_quad(0u, wo, n0, lid);
    if (RR == 2u) {
        rows_store_quad(1u, wo2, n0 + 4u, lid);
    }
}

// y[t, n] (+)= Σ_k x[t, k] · W[n, k] for the T = P.rows rows of x quantized in xq (row t at
// t · xq_stride(k)).
@compute @workgroup_size(ROWS_WG)
fn gemv_dot_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let n0 = g * RPWG + lid / TPR4 * RLG;
    let wo = dense_quad(n0);
    let wo2 = dense_quad(n0 + 4u);
    nx = min(P.rows, T);
    for (var t = 0u; t < T; t++) {
        xrows[t] = t * xq_stride(P.k);
        ybase[t] = P.y_off + t * P.y_stride;
    }
    rows_partial(wo, wo2, lid % TPR4);
    rows_store(wo, wo2, n0, lid);
}

// The slots of the current batch, for workgroup-uniform control flow.
var<workgroup> batch_n: u32;

// Routed experts at a few token rows, grouped by expert: one workgroup per (expert, row
// group) reads that expert's rows once for every slot routed to it (at most T per batch;
// a token names an expert once, so one batch unless more than T tokens share it). Workgroups
// of experts no slot names return at once.
@compute @workgroup_size(ROWS_WG)
fn gemv_dot_experts_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let b = item_block(g, RPWG);
    let e = P.e0 + b.x;
    let n0 = b.y + lid / TPR4 * RLG;
    let wo = expert_quad(e, n0);
    let wo2 = expert_quad(e, n0 + 4u);
    let stride = xq_stride(P.k);
    var s = 0u;
    loop {
        // The next (up to T) slots routed to e, from slot s on.
        var m = 0u;
        for (; s < P.rows && m < T; s++) {
            if (expert_of(s) == e) {
                xrows[m] = select(s / P.topk, s, P.x_per_slot != 0u) * stride;
                ybase[m] = P.y_off + s * P.y_stride;
                m++;
            }
        }
        if (lid == 0u) {
            batch_n = m;
        }
        let n = workgroupUniformLoad(&batch_n);
        nx = n;
        if (n == 0u) {
            break;
        }
        rows_partial(wo, wo2, lid % TPR4);
        rows_store(wo, wo2, n0, lid);
    }
}
