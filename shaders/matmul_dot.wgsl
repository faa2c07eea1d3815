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
// 16-byte words per row a lane loads before using them (1 or 2).

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

// dot(w, hi) and dot(w, lo) of 16 bytes of int8 weights with x vec4 pair index `xi`.
fn idot8(w: vec4<u32>, xi: u32) -> vec2<i32> {
    let h = get_xh(xi);
    let l = get_xl(xi);
    return vec2<i32>(
        (dot4I8Packed(w.x, h.x) + dot4I8Packed(w.y, h.y)) + (dot4I8Packed(w.z, h.z) + dot4I8Packed(w.w, h.w)),
        (dot4I8Packed(w.x, l.x) + dot4I8Packed(w.y, l.y)) + (dot4I8Packed(w.z, l.z) + dot4I8Packed(w.w, l.w)));
}

// One 16-byte word of codes `v` at word index `wi` of the chunk, against x's quantized words
// for that word (word `q` of the row), unscaled by x: s_w · (Dhi + Dlo / 254 − offset).
fn dot_word_i8(v: vec4<u32>, wi: u32, q: u32) -> f32 {
    var d: vec2<i32>;
    var off = 0.0;
    let blk = select(q / 2u, q, W_DTYPE == 5u);
    let sm = get_xsm(blk);
    if (W_DTYPE == 5u) {
        // 32 nibbles: the low and high nibble of each byte, as int8 in 0..15.
        let m = vec4<u32>(0x0f0f0f0fu);
        let a = v & m;
        let b = (v >> vec4<u32>(4u)) & m;
        d = idot8(vec4<u32>(a.x, b.x, a.y, b.y), 2u * q) + idot8(vec4<u32>(a.z, b.z, a.w, b.w), 2u * q + 1u);
        off = sm.y;
    } else {
        // 16 int8 codes: half `q & 1` of block q / 2.
        d = idot8(v, q);
    }
    return q_scale((wi * EPV) / QB) * sm.x * ((f32(d.x) + f32(d.y) * (1.0 / 254.0)) - off);
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
    let n0 = (g * (WG / TPR4) + lid / TPR4) * 4u;
    let rw = P.ws / EPV;
    var wo = vec4<u32>(NONE);
    for (var j = 0u; j < 4u; j++) {
        if (n0 + j < P.n) {
            wo[j] = (n0 + j) * rw;
        }
    }
    quad_store(quad_partial_i8(wo, lid % TPR4), wo, P.y_off, n0, lid);
}

// gemv_dot for routed experts: one slot per workgroup (as gemv4q_experts).
@compute @workgroup_size(256)
fn gemv_dot_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let per = WG / TPR4 * 4u;
    let groups = (P.n + per - 1u) / per;
    let slot = g / groups;
    let n0 = (g % groups) * per + lid / TPR4 * 4u;
    let rw = P.ws / EPV;
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
        for (var j = 0u; j < 4u; j++) {
            let gr = expert_row(e, n0 + j);
            if (n0 + j < P.n && gr >= P.row0 && gr < P.row0 + P.crow) {
                wo[j] = (gr - P.row0) * rw;
            }
        }
    }
    quad_store(quad_partial_i8(wo, lid % TPR4), wo, P.y_off + slot * P.y_stride, n0, lid);
}
