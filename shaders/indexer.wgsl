// Lightning-indexer scores in f32:
//   out[t, s] = Σ_h (w[t, h] · w_scale) · relu(q[t, h, :] · keys[s, :]) · scale,
//   out[t, s] = -inf for s > pos0 + t.
// With places (P.ragged, places.wgsl) row t is at its own position pos and reads its
// sequence's keys at cache rows lo + s; out[t, s] = -inf for s > pos.
//
// `scores` (decode, ragged rows; `scores_rows`, below, takes several rows of a prompt's
// chunk): one workgroup = one query row t and KT = 128 consecutive keys: a small matrix
// product [HEADS × dim] · [dim × 128], tiled like a GEMM. The dim axis goes in chunks of DC: the
// chunk of q for all heads and of the 128 keys are staged in workgroup memory (keys
// transposed, four neighbouring keys in one vec4; heads four to a vec4), then invocation
// (head group g, key quad k) accumulates the dot products of its 4·HQ4 heads with keys
// 4k .. 4k+3 in registers: per dim step one vec4 of keys and HQ4 vec4s of queries feed
// 16·HQ4 FMAs. At the end each invocation applies ReLU and the head weights to its heads,
// and the 8 head groups are summed through workgroup memory. Each key element is read from
// memory once per query row.
//
// Keys are words in the format KFMT (0 = f32, 1 = bf16, 2 = int8 codes of the rotated key,
// 4 per word, then an f32 scale; src/kernels/cache.rs): decoded to f32 as they are staged.
// A key cache split into segments (src/cache/mod.rs) is scored one segment per dispatch:
// key blocks blk0 .. blk0 + key_blocks, key s at row s − seg_lo of the bound buffer.
//
// Defines: HEADS (= heads), HQ4 (= ceil(HEADS / 32): vec4s of heads per invocation), DC
// (dim chunk: 32, or 16 where the adapter's workgroup memory is small; a multiple of 4),
// KFMT.
// The output is written as raw bits so -inf never goes through float arithmetic.

const KT: u32 = 128u;  // keys per workgroup
const NG: u32 = 8u;    // head groups (256 invocations = NG × KT/4 key quads)
const HPI: u32 = 4u * HQ4; // heads per invocation

// Params (binding 0): declared once, in src/kernels/indexer.rs (`Params`), and put before this source.

const NEG_INF_BITS: u32 = 0xff800000u;

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> keys: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
// RoPE's cos/sin per chunk row (P.rope != 0: the queries' first 2 · rot_half dims of each
// head are rotated as they are staged; 1 = half-split pairs, 2 = interleaved).
@group(0) @binding(5) var<storage, read> cs: array<f32>;
@group(0) @binding(6) var<storage, read> places: array<u32>;

var<workgroup> qc: array<vec4<f32>, DC * NG * HQ4>; // [d][head / 4], heads padded to NG·HPI
var<workgroup> kc: array<vec4<f32>, DC * KT / 4u>;  // [d][key / 4]
var<workgroup> red: array<f32, NG * KT>;           // [group][key]

// Element d of the key row at word `base` (`ks`: the row's int8 scale).
fn key_at(base: u32, d: u32, ks: f32) -> f32 {
    if (KFMT == 2u) {
        return f32(bitcast<i32>(keys[base + d / 4u] << (24u - (d & 3u) * 8u)) >> 24u) * ks;
    }
    if (KFMT == 1u) {
        let w = keys[base + d / 2u];
        return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (d & 1u) == 1u));
    }
    return bitcast<f32>(keys[base + d]);
}

// Workgroup g's query row and first key: (t, s0).
fn row_block(g: u32) -> vec2<u32> {
    return vec2<u32>(g / P.key_blocks, (P.blk0 + g % P.key_blocks) * KT);
}

// Element j of query head at `hb` (row t), rotated where P.rope says.
fn query_elem(hb: u32, t: u32, j: u32) -> f32 {
    var v = q[hb + j];
    if (P.rope != 0u && j < 2u * P.rot_half) {
        let pr = rotary_partner(j, P.rot_half, P.rope == 2u);
        let ci = (t * P.rot_half + pr.x) * 2u;
        v = rotary_one(v, q[hb + pr.y], cs[ci], cs[ci + 1u], pr.z == 1u);
    }
    return v;
}

// The key chunk at dims d0 .. d0 + DC of keys s0 .. s0 + 127 (zeros past P.n_keys, past
// `last` and past P.dim) into kc, transposed: invocation lid loads key lid / 2, dims
// (lid % 2) · DC / 2 .., from cache row lo + key.
fn stage_keys(lid: u32, s0: u32, last: u32, lo: u32, d0: u32) {
    let key = lid / 2u;
    let dq = (lid % 2u) * (DC / 2u);
    let s = s0 + key;
    let live = s < P.n_keys && s <= last;
    let kb = P.k_off + (lo + s - P.seg_lo) * P.k_stride;
    var ks = 0.0;
    if (KFMT == 2u && live) {
        ks = bitcast<f32>(keys[kb + P.dim / 4u]);
    }
    for (var e = 0u; e < DC / 2u; e = e + 1u) {
        var v = 0.0;
        if (live && d0 + dq + e < P.dim) {
            v = key_at(kb, d0 + dq + e, ks);
        }
        kc[(dq + e) * (KT / 4u) + key / 4u][key % 4u] = v;
    }
}

@compute @workgroup_size(256)
fn scores(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= P.rows * P.key_blocks) {
        return;
    }
    let tb = row_block(g);
    let t = tb.x;
    let s0 = tb.y;
    let last = row_pos(t);
    let lo = row_lo(t);
    if (s0 > last) {
        // Whole block in the causal future.
        if (lid < KT && s0 + lid < P.n_keys) {
            out[P.o_off + t * P.o_stride + s0 + lid] = NEG_INF_BITS;
        }
        return;
    }
    let qbase = P.q_off + t * P.q_stride;
    let hg = lid / (KT / 4u);   // head group
    let kq = lid % (KT / 4u);   // key quad
    var acc: array<vec4<f32>, HPI>;
    for (var i = 0u; i < HPI; i = i + 1u) {
        acc[i] = vec4<f32>(0.0);
    }
    for (var d0 = 0u; d0 < P.dim; d0 = d0 + DC) {
        workgroupBarrier();
        // q chunk: heads × DC values, stored [d][head].
        for (var i = lid; i < NG * HPI * DC; i = i + 256u) {
            let h = i / DC;
            let d = i % DC;
            var v = 0.0;
            if (h < HEADS && d0 + d < P.dim) {
                v = query_elem(qbase + h * P.dim, t, d0 + d);
            }
            qc[(d * NG * HPI + h) / 4u][h % 4u] = v;
        }
        stage_keys(lid, s0, last, lo, d0);
        workgroupBarrier();
        for (var d = 0u; d < DC; d = d + 1u) {
            let kv = kc[d * (KT / 4u) + kq];
            let qb = (d * NG + hg) * HQ4;
            for (var j = 0u; j < HQ4; j = j + 1u) {
                let qv = qc[qb + j];
                acc[4u * j] = acc[4u * j] + qv.x * kv;
                acc[4u * j + 1u] = acc[4u * j + 1u] + qv.y * kv;
                acc[4u * j + 2u] = acc[4u * j + 2u] + qv.z * kv;
                acc[4u * j + 3u] = acc[4u * j + 3u] + qv.w * kv;
            }
        }
    }
    // ReLU, head weights, sum over this group's heads; then over the groups.
    var part = vec4<f32>(0.0);
    for (var i = 0u; i < HPI; i = i + 1u) {
        let h = hg * HPI + i;
        if (h < HEADS) {
            let wh = w[P.w_off + t * P.w_stride + h] * P.w_scale;
            part = part + wh * max(acc[i], vec4<f32>(0.0));
        }
    }
    for (var e = 0u; e < 4u; e = e + 1u) {
        red[hg * KT + 4u * kq + e] = part[e];
    }
    workgroupBarrier();
    if (lid < KT) {
        let s = s0 + lid;
        if (s < P.n_keys) {
            let o = P.o_off + t * P.o_stride + s;
            if (s <= last) {
                var total = 0.0;
                for (var j = 0u; j < NG; j = j + 1u) {
                    total = total + red[j * KT + lid];
                }
                out[o] = bitcast<u32>(total * P.scale);
            } else {
                out[o] = NEG_INF_BITS;
            }
        }
    }
}

// scores_rows: the chunk scores of a prompt's rows on GPUs (not CPU adapters; rows of one
// sequence, placed or not; at most 128 heads; src/kernels/indexer.rs picks it where the
// chunk has rows for whole workgroups). One workgroup = RT query rows (RT = 128 / HP, HP = HEADS rounded up to 4) and
// KT = 128 keys: a [128 (row, head) pairs × dim] · [dim × 128 keys] product, tiled as a GEMM
// whose invocation (pair group lid / 16, key group lid % 16) holds 8 pairs × 8 keys in
// registers: pairs 4 pg .. + 3 and 64 + 4 pg .., keys 4 kg .. + 3 and 64 + 4 kg ... Per dim
// step two vec4s of queries and two of keys from workgroup memory feed 64 FMAs (`scores`:
// one of each for 16), and each staged key serves RT rows instead of one. Then each
// invocation applies ReLU and the head weights and sums its pair quads (4 heads of one row),
// the quads of a row are summed through workgroup memory, and the row's causal future is
// -inf. Defines as `scores` (DC: a multiple of 4; 2 · DC · 32 vec4s of workgroup memory).
const RP: u32 = 128u;                 // (row, head) pairs per workgroup
const HP: u32 = (HEADS + 3u) / 4u * 4u; // heads per row, padded to whole quads
const RT: u32 = max(RP / HP, 1u);     // query rows per workgroup (1: scores_rows does not run)
// The staged queries [d][pair / 4]; after the products, the row sums' parts of keys 0 .. 63
// ([pair / 4][key / 4], 512 vec4s), those of keys 64 .. 127 in kc (the keys' staging, shared
// with `scores`): DC >= 16.
var<workgroup> qr: array<vec4<f32>, DC * (RP / 4u)>;
const_assert DC >= 16u && DC % 4u == 0u;

// Workgroup g's first query row and first key.
fn rows_block(g: u32) -> vec2<u32> {
    return vec2<u32>((g / P.key_blocks) * RT, (P.blk0 + g % P.key_blocks) * KT);
}

// The weight of pair p's head for the workgroup's first row t0 (0 for padding).
fn pair_weight(t0: u32, p: u32) -> f32 {
    let r = p / HP;
    let h = p % HP;
    if (r >= RT || h >= HEADS || t0 + r >= P.rows) {
        return 0.0;
    }
    return w[P.w_off + (t0 + r) * P.w_stride + h] * P.w_scale;
}

// Four pairs' dot products with 4 keys (pair c in field c, keys in the vec4).
struct Quad {
    c0: vec4<f32>,
    c1: vec4<f32>,
    c2: vec4<f32>,
    c3: vec4<f32>,
}

// u plus query values q (4 pairs at one dim) times keys k (4 keys at that dim).
fn quad_fma(u: Quad, q: vec4<f32>, k: vec4<f32>) -> Quad {
    return Quad(u.c0 + q.x * k, u.c1 + q.y * k, u.c2 + q.z * k, u.c3 + q.w * k);
}

// Pair quad pq's weighted ReLU sum (its 4 pairs are heads of one row) for 4 keys.
fn quad_sum(t0: u32, pq: u32, u: Quad) -> vec4<f32> {
    let z = vec4<f32>(0.0);
    return pair_weight(t0, 4u * pq) * max(u.c0, z) + pair_weight(t0, 4u * pq + 1u) * max(u.c1, z)
        + pair_weight(t0, 4u * pq + 2u) * max(u.c2, z) + pair_weight(t0, 4u * pq + 3u) * max(u.c3, z);
}

@compute @workgroup_size(256)
fn scores_rows(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= (P.rows + RT - 1u) / RT * P.key_blocks) {
        return;
    }
    let tb = rows_block(g);
    let t0 = tb.x;
    let s0 = tb.y;
    let nr = min(RT, P.rows - t0);
    // The rows are of one sequence (kernels/indexer.rs: one lo, placed or not); the keys
    // staged are those up to the farthest row's position.
    let lo = row_lo(t0);
    var last = 0u;
    for (var r = 0u; r < nr; r++) {
        last = max(last, row_pos(t0 + r));
    }
    if (s0 > last) {
        // Every row's causal future.
        for (var i = lid; i < nr * KT; i += 256u) {
            let s = s0 + i % KT;
            if (s < P.n_keys) {
                out[P.o_off + (t0 + i / KT) * P.o_stride + s] = NEG_INF_BITS;
            }
        }
        return;
    }
    let pg = lid / 16u;
    let kg = lid % 16u;
    // uab: pairs 4 (pg + 16 a) .., keys 4 (kg + 16 b) .. (fields, not an array indexed in a
    // loop, which NVIDIA's compiler may put in local memory).
    var u00 = Quad();
    var u01 = Quad();
    var u10 = Quad();
    var u11 = Quad();
    for (var d0 = 0u; d0 < P.dim; d0 += DC) {
        workgroupBarrier();
        // Queries: pair p = i % 128 (32 invocations write 8 whole vec4s), dim i / 128.
        for (var i = lid; i < RP * DC; i += 256u) {
            let p = i % RP;
            let d = i / RP;
            let r = p / HP;
            let h = p % HP;
            var v = 0.0;
            if (r < nr && h < HEADS && d0 + d < P.dim) {
                let t = t0 + r;
                v = query_elem(P.q_off + t * P.q_stride + h * P.dim, t, d0 + d);
            }
            qr[d * (RP / 4u) + p / 4u][p % 4u] = v;
        }
        stage_keys(lid, s0, last, lo, d0);
        workgroupBarrier();
        for (var d = 0u; d < DC; d++) {
            let q0 = qr[d * (RP / 4u) + pg];
            let q1 = qr[d * (RP / 4u) + 16u + pg];
            let k0 = kc[d * (KT / 4u) + kg];
            let k1 = kc[d * (KT / 4u) + 16u + kg];
            u00 = quad_fma(u00, q0, k0);
            u01 = quad_fma(u01, q0, k1);
            u10 = quad_fma(u10, q1, k0);
            u11 = quad_fma(u11, q1, k1);
        }
    }
    // ReLU and head weights; each invocation sums its pair quads (4 heads of one row: HP is
    // whole quads), then a row's quads are summed from workgroup memory.
    workgroupBarrier();
    qr[pg * 16u + kg] = quad_sum(t0, pg, u00);
    kc[pg * 16u + kg] = quad_sum(t0, pg, u01);
    qr[(pg + 16u) * 16u + kg] = quad_sum(t0, pg + 16u, u10);
    kc[(pg + 16u) * 16u + kg] = quad_sum(t0, pg + 16u, u11);
    workgroupBarrier();
    for (var i = lid; i < nr * KT; i += 256u) {
        let r = i / KT;
        let k = i % KT;
        let s = s0 + k;
        if (s < P.n_keys) {
            let o = P.o_off + (t0 + r) * P.o_stride + s;
            if (s <= row_pos(t0 + r)) {
                var total = 0.0;
                let at = (k % 64u) / 4u;
                for (var q = r * (HP / 4u); q < (r + 1u) * (HP / 4u); q++) {
                    total += select(qr[q * 16u + at], kc[q * 16u + at], k >= 64u)[k % 4u];
                }
                out[o] = bitcast<u32>(total * P.scale);
            } else {
                out[o] = NEG_INF_BITS;
            }
        }
    }
}

// scores_cpu: scores for CPU adapters (lavapipe, where a load whose address differs between
// invocations is a loop over the SIMD lanes and a barrier a switch through every SIMD slice
// of the workgroup). One workgroup of CPU_WG invocations per (query row, block of KT keys),
// as `scores`: the row's queries (rotated as `scores` rotates them) and head weights are
// staged in workgroup memory once, one barrier; then invocation lid takes keys lid,
// lid + CPU_WG, ... of the block, each loaded into the invocation's registers (a private
// array indexed only in loops of constant length: staging it in workgroup memory, read back
// once per head, made the kernel 1.6x slower at 8 rows), dotted with every head's query,
// ReLU, weighted and summed, with no reduction across invocations. Defines: QD4 =
// ceil(dim / 4).
var<workgroup> cq: array<vec4<f32>, HEADS * QD4>;  // [head][dim / 4], zeros past dim
var<workgroup> cw: array<f32, HEADS>;
var<workgroup> c_last: u32;
var<workgroup> c_lo: u32;

@compute @workgroup_size(CPU_WG)
fn scores_cpu(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= P.rows * P.key_blocks) {
        return;
    }
    let tb = row_block(g);
    let t = tb.x;
    let s0 = tb.y;
    if (lid == 0u) {
        c_last = row_pos(t);
        c_lo = row_lo(t);
    }
    let last = workgroupUniformLoad(&c_last);
    let lo = workgroupUniformLoad(&c_lo);
    if (s0 > last) {
        // Whole block in the causal future.
        for (var s = s0 + lid; s < min(s0 + KT, P.n_keys); s += CPU_WG) {
            out[P.o_off + t * P.o_stride + s] = NEG_INF_BITS;
        }
        return;
    }
    let qbase = P.q_off + t * P.q_stride;
    for (var i = lid; i < HEADS * QD4; i += CPU_WG) {
        let hb = qbase + (i / QD4) * P.dim;
        var v = vec4<f32>(0.0);
        for (var e = 0u; e < 4u; e++) {
            let j = 4u * (i % QD4) + e;
            if (j < P.dim) {
                v[e] = query_elem(hb, t, j);
            }
        }
        cq[i] = v;
    }
    for (var h = lid; h < HEADS; h += CPU_WG) {
        cw[h] = w[P.w_off + t * P.w_stride + h] * P.w_scale;
    }
    workgroupBarrier();
    for (var key = lid; key < KT; key += CPU_WG) {
        let s = s0 + key;
        if (s >= P.n_keys) {
            break;
        }
        let o = P.o_off + t * P.o_stride + s;
        if (s > last) {
            out[o] = NEG_INF_BITS;
            continue;
        }
        let kb = P.k_off + (lo + s - P.seg_lo) * P.k_stride;
        var ks = 0.0;
        if (KFMT == 2u) {
            ks = bitcast<f32>(keys[kb + P.dim / 4u]);
        }
        var kv: array<vec4<f32>, QD4>;
        for (var d4 = 0u; d4 < QD4; d4++) {
            var v = vec4<f32>(0.0);
            for (var e = 0u; e < 4u; e++) {
                if (4u * d4 + e < P.dim) {
                    v[e] = key_at(kb, 4u * d4 + e, ks);
                }
            }
            kv[d4] = v;
        }
        var total = 0.0;
        for (var h = 0u; h < HEADS; h++) {
            var dv = vec4<f32>(0.0);
            for (var d4 = 0u; d4 < QD4; d4++) {
                dv += cq[h * QD4 + d4] * kv[d4];
            }
            total += cw[h] * max(dv.x + dv.y + dv.z + dv.w, 0.0);
        }
        out[o] = bitcast<u32>(total * P.scale);
    }
}
