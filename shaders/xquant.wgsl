// x quantized for the integer-dot GEMV (matmul_dot.wgsl): per block of 32 elements,
// x ≈ s · (hi + lo / 254) with s = max|x| / 127, hi and lo int8 (|error| ≤ s / 508). For q4
// weights the bytes are stored in the order the GEMV's nibble masks produce (elements 0, 2,
// 4, 6 then 1, 3, 5, 7 of each 8), and `m` = 8 · (Σhi + Σlo / 254) serves the codes' offset
// of 8. Prepended to the kernels that produce or read it; the producers declare
// `xq_out: array<vec4<u32>>`.
//
// Two ways to make one: `quant_block_of` (one invocation per block, 32 values at hand) and
// `quant_word` (eight invocations per block, each with the 4 values of one word: the
// producers use this, so no invocation runs a long serial chain). Both give the same bits:
// the sums behind `m` are of small integers, exact in f32 in any order.
//
// A quantized row of nb = k / 32 blocks: hi at vec4 [0, 2nb), lo at [2nb, 4nb), then the
// (s, m) pairs of two blocks per vec4 ([`xq_stride`] vec4s per row).

struct QBlock {
    h0: vec4<u32>,
    h1: vec4<u32>,
    l0: vec4<u32>,
    l1: vec4<u32>,
    s: f32,
    m: f32,
}

fn xq_stride(k: u32) -> u32 {
    let nb = k / 32u;
    return 4u * nb + (nb + 1u) / 2u;
}

fn pack_i8(v: vec4<f32>) -> u32 {
    let i = vec4<u32>(vec4<i32>(v)) & vec4<u32>(255u);
    return i.x | (i.y << 8u) | (i.z << 16u) | (i.w << 24u);
}

// The 32 values `v` quantized; `q4`: in q4's element order.
fn quant_block_of(v: array<vec4<f32>, 8>, q4: bool) -> QBlock {
    var amax = 0.0;
    for (var j = 0u; j < 8u; j++) {
        let a = abs(v[j]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    var sh = 0.0;
    var sl = 0.0;
    var hw: array<u32, 8>;
    var lw: array<u32, 8>;
    for (var j = 0u; j < 8u; j++) {
        var e = v[j];
        if (q4) {
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
    return QBlock(vec4<u32>(hw[0], hw[1], hw[2], hw[3]), vec4<u32>(hw[4], hw[5], hw[6], hw[7]),
                  vec4<u32>(lw[0], lw[1], lw[2], lw[3]), vec4<u32>(lw[4], lw[5], lw[6], lw[7]),
                  amax / 127.0, 8.0 * (sh + sl / 254.0));
}

// Block b of the quantized row at vec4 `o` of xq_out (nb blocks per row). Each block writes
// only its own words (its half of the shared (s, m) vec4 included), so one invocation per
// block needs no synchronization.
fn xq_store(o: u32, nb: u32, b: u32, q: QBlock) {
    xq_out[o + 2u * b] = q.h0;
    xq_out[o + 2u * b + 1u] = q.h1;
    xq_out[o + 2u * nb + 2u * b] = q.l0;
    xq_out[o + 2u * nb + 2u * b + 1u] = q.l1;
    let at = o + 4u * nb + b / 2u;
    let c = 2u * (b & 1u);
    xq_out[at][c] = bitcast<u32>(q.s);
    xq_out[at][c + 1u] = bitcast<u32>(q.m);
}

// The block's element behind value i (0..4) of its word j (0..8): q4's order or natural.
fn word_elem(j: u32, i: u32, q4: bool) -> u32 {
    if (q4) {
        return 8u * (j >> 1u) + (j & 1u) + 2u * i;
    }
    return 4u * j + i;
}

// (row, block) of the global invocation `i` of a producer with eight invocations per block
// and rows of nb blocks (its word is i & 7).
fn word_slot(i: u32, nb: u32) -> vec2<u32> {
    let blk = i / 8u;
    let r = blk / nb;
    return vec2<u32>(r, blk - r * nb);
}

// Eight consecutive invocations (lid & ~7 .. + 8) hold the words j = lid & 7 of block b: `v`,
// the 4 values word_elem(j, 0..4). Quantizes the block and stores it at vec4 `o` of xq_out
// (nb blocks per row). Workgroup-uniform control flow (barriers): invocations without a
// block pass live = false.
var<workgroup> xq_red: array<vec4<f32>, 256>;
fn quant_word(v: vec4<f32>, lid: u32, live: bool, o: u32, nb: u32, b: u32) {
    let a = abs(v);
    xq_red[lid] = vec4<f32>(max(max(a.x, a.y), max(a.z, a.w)), 0.0, 0.0, 0.0);
    workgroupBarrier();
    let g = lid & ~7u;
    var amax = 0.0;
    for (var i = 0u; i < 8u; i++) {
        amax = max(amax, xq_red[g + i].x);
    }
    workgroupBarrier();
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    let f = v * inv;
    let h = clamp(round(f), vec4<f32>(-127.0), vec4<f32>(127.0));
    let l = clamp(round((f - h) * 254.0), vec4<f32>(-127.0), vec4<f32>(127.0));
    xq_red[lid] = vec4<f32>((h.x + h.y) + (h.z + h.w), (l.x + l.y) + (l.z + l.w), 0.0, 0.0);
    workgroupBarrier();
    let j = lid & 7u;
    if (live) {
        xq_out[o + 2u * b + (j >> 2u)][j & 3u] = pack_i8(h);
        xq_out[o + 2u * nb + 2u * b + (j >> 2u)][j & 3u] = pack_i8(l);
        if (j == 0u) {
            var sh = 0.0;
            var sl = 0.0;
            for (var i = 0u; i < 8u; i++) {
                sh += xq_red[g + i].x;
                sl += xq_red[g + i].y;
            }
            let at = o + 4u * nb + b / 2u;
            let c = 2u * (b & 1u);
            xq_out[at][c] = bitcast<u32>(amax / 127.0);
            xq_out[at][c + 1u] = bitcast<u32>(8.0 * (sh + sl / 254.0));
        }
    }
    workgroupBarrier();
}
