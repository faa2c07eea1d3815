// Cache writers: f32 rows in, rows of the cache's format out (the layouts are described in
// src/kernels/cache.rs, which has the same conversions on the CPU for the tests).
//
//   store_latent  row r of `src` → latent cache row (pos0 + r − seg_lo) of this segment:
//                 LFMT 0 = f32, 1 = bf16 pairs, 2 = FP8: kv_lora e4m3 codes (4 per word),
//                 one f32 scale per 128 codes (amax / 448), then dr bf16 values (RoPE part).
//   store_keys    row r of `src` → indexer key row: KFMT 0 = f32, 1 = bf16, 2 = int8 of the
//                 row after a normalized Walsh–Hadamard rotation (dim codes, 4 per word, then
//                 one f32 scale = amax / 127).
//   rotate        the same rotation in place on `src`'s rows (the indexer's queries, so that
//                 q·k is unchanged when the keys are rotated).
// With RANDOM = 1 the store kernels ignore `src` and write seeded pseudo-random values of
// unit variance (uniform in [−√3, √3)) for positions pos0 + r: synthetic caches for
// `sparsa bench`. With PREP = 1 they store row r of `src` after normalizing its first
// norm_dim values (RMSNorm with weight `nw`, or LayerNorm with `nw` and `nbias`) and
// rotating rot_half pairs from rot_off (RoPE, cos/sin row cs_row + r of `cs`): what a norm,
// a RoPE and the store did in three dispatches (`prepare`).
//
// With places (P.ragged, places.wgsl) chunk row cs_row + r goes to cache row lo + pos
// instead of pos0 + r, and a row outside this segment is skipped.
//
// One workgroup per row (per (row, head) for rotate). Defines: LFMT, KFMT, RANDOM, PREP and
// CWG, the workgroup size: 128, or 8 on CPU adapters (lavapipe), where each of a row's
// reductions then takes 3 barriers instead of 7, each a switch through one SIMD slice of 8
// instead of 16 (FP8 latents keep 128: a workgroup quantizes one 128-code block at a time).

// Params (binding 0): declared once, in src/kernels/cache.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
// rotate's rows, rotated in place (read-only `src` for the stores: a read-only binding
// needs no barrier after other readers of the buffer).
@group(0) @binding(1) var<storage, read_write> vecs: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;
@group(0) @binding(3) var<storage, read> nw: array<f32>;
@group(0) @binding(4) var<storage, read> nbias: array<f32>;
@group(0) @binding(5) var<storage, read> cs: array<f32>;
@group(0) @binding(6) var<storage, read> places: array<u32>;

const WG: u32 = CWG; // invocations: 128, or CPU_WG on CPU adapters (not FP8 latents: WG = BLK)
const BLK: u32 = 128u; // FP8 scale block
const MAXD: u32 = 256u; // longest key row the rotation takes
const MAXROW: u32 = 2048u; // longest prepared row (MAX_PREPARED_ROW in cache.rs)

var<workgroup> xs: array<f32, MAXD>;
var<workgroup> codes: array<u32, MAXD>;
var<workgroup> red: array<f32, WG>;
var<workgroup> prow: array<f32, MAXROW>;

fn hash32(x0: u32) -> u32 {
    var x = x0;
    x = (x ^ (x >> 16u)) * 0x7feb352du;
    x = (x ^ (x >> 15u)) * 0x846ca68bu;
    return x ^ (x >> 16u);
}

// Element c of the chunk's row r (or the synthetic value of position pos0 + r, or the
// prepared row).
fn value(r: u32, c: u32) -> f32 {
    if (PREP == 1u) {
        return prow[c];
    }
    if (RANDOM == 1u) {
        let h = hash32(hash32((P.pos0 + r) ^ hash32(P.seed)) ^ (c * 0x9e3779b9u));
        return (2.0 * (f32(h >> 8u) * (1.0 / 16777216.0)) - 1.0) * 1.7320508;
    }
    return src[P.src_off + r * P.src_stride + c];
}

// PREP = 1: the n values of row r of `src` into prow, the first norm_dim normalized, then
// the RoPE pairs rotated (as norm.wgsl and rope.wgsl compute them).
fn prepare(r: u32, n: u32, lid: u32) {
    let sb = P.src_off + r * P.src_stride;
    var s = 0.0;
    for (var c = lid; c < n; c += WG) {
        let v = src[sb + c];
        prow[c] = v;
        if (c < P.norm_dim) {
            s += v;
        }
    }
    var mean = 0.0;
    if (P.layer_norm == 1u) {
        mean = wg_sum(s, lid) / f32(P.norm_dim);
    }
    var sq = 0.0;
    for (var c = lid; c < P.norm_dim; c += WG) {
        let d = prow[c] - mean;
        sq += d * d;
    }
    let scale = inverseSqrt(wg_sum(sq, lid) / f32(P.norm_dim) + P.eps);
    for (var c = lid; c < P.norm_dim; c += WG) {
        var y = (prow[c] - mean) * scale * nw[c];
        if (P.layer_norm == 1u) {
            y += nbias[c];
        }
        prow[c] = y;
    }
    workgroupBarrier();
    for (var i = lid; i < P.rot_half; i += WG) {
        let d = rotary_dims(i, P.rot_off, P.rot_half, P.interleave != 0u);
        let ci = ((P.cs_row + r) * P.rot_half + i) * 2u;
        let o = rotary(prow[d.x], prow[d.y], cs[ci], cs[ci + 1u]);
        prow[d.x] = o.x;
        prow[d.y] = o.y;
    }
    workgroupBarrier();
}

fn row_id(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// The cache row row r of the dispatch goes to (see the top).
fn cache_row(r: u32) -> u32 {
    if (P.ragged != 0u) {
        let t = P.cs_row + r;
        return row_lo(t) + row_pos(t);
    }
    return P.pos0 + r;
}

// Whether cache row c lies in the bound segment (always so without places: the host cut
// the rows at the segment's ends).
fn in_segment(c: u32) -> bool {
    return P.ragged == 0u || (c >= P.seg_lo && c - P.seg_lo < P.seg_len);
}

// The bf16 bits of x, rounded to nearest even.
fn bf16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

fn pack_bf16(a: f32, b: f32) -> u32 {
    return bf16_bits(a) | (bf16_bits(b) << 16u);
}

// Row r's n values from column c0 on, at word `base`: f32 words, or (bf16) bf16 pairs.
fn store_plain(r: u32, base: u32, c0: u32, n: u32, bf16: bool, lid: u32) {
    if (!bf16) {
        for (var c = lid; c < n; c = c + WG) {
            dst[base + c] = bitcast<u32>(value(r, c0 + c));
        }
        return;
    }
    for (var w = lid; 2u * w < n; w = w + WG) {
        let c = 2u * w;
        var b = 0.0;
        if (c + 1u < n) {
            b = value(r, c0 + c + 1u);
        }
        dst[base + w] = pack_bf16(value(r, c0 + c), b);
    }
}

// The word of the four byte codes codes[i .. i + 4], the first in the low byte.
fn packed_codes(i: u32) -> u32 {
    return codes[i] | (codes[i + 1u] << 8u) | (codes[i + 2u] << 16u) | (codes[i + 3u] << 24u);
}

// The largest |red[i]| over the workgroup (every invocation has written red[lid]).
fn reduce_max(lid: u32) -> f32 {
    for (var off = WG / 2u; off > 0u; off = off >> 1u) {
        workgroupBarrier();
        if (lid < off) {
            red[lid] = max(red[lid], red[lid + off]);
        }
    }
    workgroupBarrier();
    let m = red[0];
    workgroupBarrier();
    return m;
}

@compute @workgroup_size(CWG)
fn store_latent(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = row_id(wid, nwg);
    if (r >= P.rows) {
        return;
    }
    let n = P.kv_lora + P.dr;
    let c = cache_row(r);
    if (!in_segment(c)) {
        return;
    }
    let base = P.dst_off + (c - P.seg_lo) * P.row_words;
    if (PREP == 1u) {
        prepare(r, n, lid);
    }
    if (LFMT <= 1u) {
        store_plain(r, base, 0u, n, LFMT == 1u, lid);
        return;
    }
    // FP8: blocks of BLK codes, each with its scale.
    let nb = (P.kv_lora + BLK - 1u) / BLK;
    for (var b = 0u; b < nb; b = b + 1u) {
        let c = b * BLK + lid;
        var v = 0.0;
        if (c < P.kv_lora) {
            v = value(r, c);
        }
        red[lid] = abs(v);
        let amax = reduce_max(lid);
        let scale = amax / 448.0;
        var code = 0u;
        if (amax > 0.0) {
            code = e4m3_encode(v / scale);
        }
        codes[lid] = code;
        workgroupBarrier();
        let words = min(BLK, P.kv_lora - b * BLK) / 4u;
        if (lid < words) {
            dst[base + b * BLK / 4u + lid] = packed_codes(4u * lid);
        }
        if (lid == 0u) {
            dst[base + P.kv_lora / 4u + b] = bitcast<u32>(scale);
        }
        workgroupBarrier();
    }
    // The RoPE part in bf16.
    store_plain(r, base + P.kv_lora / 4u + nb, P.kv_lora, P.dr, true, lid);
}

// The normalized Walsh–Hadamard transform of xs[0 .. dim] (dim a power of two ≤ MAXD):
// log2(dim) butterfly stages, invocation lid taking pairs lid, lid + WG, ..
fn hadamard(lid: u32, dim: u32) {
    for (var h = 1u; h < dim; h = h << 1u) {
        workgroupBarrier();
        for (var p = lid; p < dim / 2u; p = p + WG) {
            let j = (p / h) * 2u * h + p % h;
            let a = xs[j];
            let b = xs[j + h];
            xs[j] = a + b;
            xs[j + h] = a - b;
        }
    }
    workgroupBarrier();
    let norm = inverseSqrt(f32(dim));
    for (var i = lid; i < dim; i = i + WG) {
        xs[i] = xs[i] * norm;
    }
    workgroupBarrier();
}

@compute @workgroup_size(CWG)
fn store_keys(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = row_id(wid, nwg);
    if (r >= P.rows) {
        return;
    }
    let n = P.dim;
    let c = cache_row(r);
    if (!in_segment(c)) {
        return;
    }
    let base = P.dst_off + (c - P.seg_lo) * P.row_words;
    if (PREP == 1u) {
        prepare(r, n, lid);
    }
    if (KFMT <= 1u) {
        store_plain(r, base, 0u, n, KFMT == 1u, lid);
        return;
    }
    // int8 after the rotation.
    for (var c = lid; c < n; c = c + WG) {
        xs[c] = value(r, c);
    }
    hadamard(lid, n);
    var m = 0.0;
    for (var c = lid; c < n; c = c + WG) {
        m = max(m, abs(xs[c]));
    }
    red[lid] = m;
    let amax = reduce_max(lid);
    let scale = amax / 127.0;
    for (var c = lid; c < n; c = c + WG) {
        var q = 0;
        if (amax > 0.0) {
            q = i32(clamp(round(xs[c] / scale), -127.0, 127.0));
        }
        codes[c] = bitcast<u32>(q) & 0xffu;
    }
    workgroupBarrier();
    for (var w = lid; w < n / 4u; w = w + WG) {
        dst[base + w] = packed_codes(4u * w);
    }
    if (lid == 0u) {
        dst[base + n / 4u] = bitcast<u32>(scale);
    }
}

@compute @workgroup_size(CWG)
fn rotate(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = row_id(wid, nwg);
    if (g >= P.rows * P.heads) {
        return;
    }
    let base = P.src_off + (g / P.heads) * P.src_stride + (g % P.heads) * P.dim;
    for (var c = lid; c < P.dim; c = c + WG) {
        xs[c] = vecs[base + c];
    }
    hadamard(lid, P.dim);
    for (var c = lid; c < P.dim; c = c + WG) {
        vecs[base + c] = xs[c];
    }
}
