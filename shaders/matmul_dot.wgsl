// ---- GEMV on integer dot products (q8 and q4 weights, one x row) -----------------------
// gemv4q's layout (4 weight rows per lane, TPR4 lanes per row group), but the products are
// 8-bit integer dot products (dot4I8Packed: 4 multiply-adds in one instruction where the
// device has them) instead of decoding every weight to f32: the decode's integer work, not
// DRAM, bounds gemv4q over 4- and 8-bit weights.
//
// x is split per block of 32 elements into two int8 vectors, x ≈ s · (hi + lo / 254) with
// s = max|x| / 127 (|error| ≤ s / 508, about 2^-16 of the block's largest value, which is
// finer than f16), so the result stays within f32-reference tolerances; llama.cpp's q8_1
// activations keep only `hi`. The workgroup quantizes its x row into workgroup memory once;
// for q4 the bytes are stored in the order the nibble masks produce (elements 0, 2, 4, 6 then
// 1, 3, 5, 7 of each 8), and `xm` holds 8 · (Σhi + Σlo / 254) for the codes' offset of 8.
// Extra define: MAXB, the blocks the workgroup arrays hold (≥ k / 32).

var<workgroup> xh: array<vec4<u32>, 2 * MAXB>;
var<workgroup> xl: array<vec4<u32>, 2 * MAXB>;
var<workgroup> xs: array<f32, MAXB>;
var<workgroup> xm: array<f32, MAXB>;

fn pack_i8(v: vec4<f32>) -> u32 {
    let i = vec4<u32>(vec4<i32>(v)) & vec4<u32>(255u);
    return i.x | (i.y << 8u) | (i.z << 16u) | (i.w << 24u);
}

// Quantizes the x row at float offset `xo` (k floats) into xh / xl / xs / xm.
fn quantize_x(xo: u32, lid: u32) {
    let nb = P.k / 32u;
    for (var b = lid; b < nb; b += WG) {
        let v0 = xo / 4u + b * 8u;
        var v: array<vec4<f32>, 8>;
        var amax = 0.0;
        for (var j = 0u; j < 8u; j++) {
            v[j] = x4[v0 + j];
            let a = abs(v[j]);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        let inv = select(0.0, 127.0 / amax, amax > 0.0);
        var sh = 0.0;
        var sl = 0.0;
        var hw: array<u32, 8>;
        var lw: array<u32, 8>;
        for (var j = 0u; j < 8u; j++) {
            // q4: words of elements (0, 2, 4, 6) and (1, 3, 5, 7) of each 8; q8: natural.
            var e = v[j];
            if (W_DTYPE == 5u) {
                let p = v[j & 6u];
                let q = v[(j & 6u) + 1u];
                e = select(vec4<f32>(p.x, p.z, q.x, q.z), vec4<f32>(p.y, p.w, q.y, q.w), (j & 1u) == 1u);
            }
            let f = e * inv;
            let h = clamp(round(f), vec4<f32>(-127.0), vec4<f32>(127.0));
            let l = clamp(round((f - h) * 254.0), vec4<f32>(-127.0), vec4<f32>(127.0));
            sh += (h.x + h.y) + (h.z + h.w);
            sl += (l.x + l.y) + (l.z + l.w);
            hw[j] = pack_i8(h);
            lw[j] = pack_i8(l);
        }
        xh[2u * b] = vec4<u32>(hw[0], hw[1], hw[2], hw[3]);
        xh[2u * b + 1u] = vec4<u32>(hw[4], hw[5], hw[6], hw[7]);
        xl[2u * b] = vec4<u32>(lw[0], lw[1], lw[2], lw[3]);
        xl[2u * b + 1u] = vec4<u32>(lw[4], lw[5], lw[6], lw[7]);
        xs[b] = amax / 127.0;
        xm[b] = 8.0 * (sh + sl / 254.0);
    }
    workgroupBarrier();
}

// dot(w, hi) and dot(w, lo) of 16 bytes of int8 weights with x vec4 pair index `xi`.
fn idot8(w: vec4<u32>, xi: u32) -> vec2<i32> {
    let h = xh[xi];
    let l = xl[xi];
    return vec2<i32>(
        (dot4I8Packed(w.x, h.x) + dot4I8Packed(w.y, h.y)) + (dot4I8Packed(w.z, h.z) + dot4I8Packed(w.w, h.w)),
        (dot4I8Packed(w.x, l.x) + dot4I8Packed(w.y, l.y)) + (dot4I8Packed(w.z, l.z) + dot4I8Packed(w.w, l.w)));
}

// One 16-byte word of codes at word index `wi` of the chunk, against x's quantized words
// for that word (word `q` of the row), unscaled by x: s_w · (Dhi + Dlo / 254 − offset).
fn dot_word_i8(wi: u32, q: u32) -> f32 {
    let v = w4[wi];
    var d: vec2<i32>;
    var off = 0.0;
    if (W_DTYPE == 5u) {
        // 32 nibbles: the low and high nibble of each byte, as int8 in 0..15.
        let m = vec4<u32>(0x0f0f0f0fu);
        let a = v & m;
        let b = (v >> vec4<u32>(4u)) & m;
        d = idot8(vec4<u32>(a.x, b.x, a.y, b.y), 2u * q) + idot8(vec4<u32>(a.z, b.z, a.w, b.w), 2u * q + 1u);
        off = xm[q];
    } else {
        // 16 int8 codes: half `q & 1` of block q / 2.
        d = idot8(v, q);
    }
    let blk = select(q / 2u, q, W_DTYPE == 5u);
    return q_scale((wi * EPV) / QB) * xs[blk] * ((f32(d.x) + f32(d.y) * (1.0 / 254.0)) - off);
}

// quad_partial on integer dot products: the 4 rows' partial dots of this lane.
fn quad_partial_i8(wo: vec4<u32>, lane: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    let w = live_rows(wo);
    if (w.x == NONE) {
        return acc;
    }
    let kw = P.k / EPV;
    for (var q = lane; q < kw; q += TPR4) {
        acc += vec4<f32>(dot_word_i8(w.x + q, q), dot_word_i8(w.y + q, q), dot_word_i8(w.z + q, q), dot_word_i8(w.w + q, q));
    }
    return acc;
}

@compute @workgroup_size(256)
fn gemv_dot(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
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
    if (slot < P.rows) {
        e = experts[slot];
        xo = slot_x(slot);
    }
    // Uniform: every invocation of the workgroup has the same slot.
    quantize_x(xo, lid);
    if (e < P.n_experts) {
        for (var j = 0u; j < 4u; j++) {
            let gr = e * P.n + n0 + j;
            if (n0 + j < P.n && gr >= P.row0 && gr < P.row0 + P.crow) {
                wo[j] = (gr - P.row0) * rw;
            }
        }
    }
    quad_store(quad_partial_i8(wo, lid % TPR4), wo, P.y_off + slot * P.y_stride, n0, lid);
}
