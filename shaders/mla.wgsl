// Sparse MLA attention in absorbed form over the latent cache (MQA form: every head reads
// the same selected cache rows), flash-decoding style.
//
//   logit[t, h, j] = (q_abs[t, h, :] · cache[s_j, :kv_lora] + q_pe[t, h, :] · cache[s_j, kv_lora:]) · scale
//   o_lat[t, h, :] = Σ_j softmax_j(logit[t, h, :]) · cache[s_j, :kv_lora]
// over the selected positions s_j = idx[t * topk + j], j < min(cnt[t], topk).
//
// mla: one workgroup per (row t, group of HG heads, split of the selected list). The
//   HG queries sit in workgroup memory as vec4s; each selected row is read from memory by
//   the workgroup once for the logits and once for the values (the second read hits the
//   cache), and is used by all HG heads: bytes per row stay one row, not one per head.
//   Positions go in tiles of PT:
//   1. logits: LANES invocations per tile position split the row's vec4s; each keeps the
//      partial dot products of all HG heads (HG dot products per row vec4 read), and the
//      lanes' partial sums are added in workgroup memory;
//   2. per head, the tile's max and the online-softmax rescale (invocations h < HG);
//   3. values: invocation c takes latent columns c, c + 256, ... (NC of them) for all HG
//      heads and accumulates p_j · row_j[c] over the tile, 4 positions per step.
//   With one split the output is normalized and written to o_lat; with several, each split
//   writes its unnormalized sums, max and sum of exponentials to `part`, and mla_combine
//   merges the splits with a log-sum-exp rescale.
//
// The cache may be split into segments (one buffer each, see src/cache/mod.rs): a dispatch
// reads one segment, positions seg_lo .. seg_lo + seg_n, and treats selected positions
// outside it as absent; its splits write partials split_base .. split_base + splits of the
// part_splits that mla_combine merges.
//
// Cache rows are words in the format LFMT (0 = f32, 1 = bf16, 2 = FP8: kv_lora e4m3 codes,
// an f32 scale per 128 of them, then dr bf16 values; src/kernels/cache.rs).
//
// Defines: HG (heads per workgroup, a power of two), QD4 (ceil((kv_lora + dr) / 4)),
// NC (ceil(kv_lora / 256)), MAXS (most splits mla_combine merges), LFMT.

const WG: u32 = 256u;
const LANES: u32 = 4u;      // invocations per tile position in the logit phase
const PT: u32 = WG / LANES; // tile positions
const TPH: u32 = WG / HG;   // invocations per head in the softmax phase
const NEG_BIG: f32 = -3.0e38;
const ABSENT: u32 = 0xffffffffu; // a selected position outside this dispatch's segment

// Params (binding 0): declared once, in src/kernels/attention.rs (`MlaParams`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> qa: array<f32>;
@group(0) @binding(3) var<storage, read> qin: array<f32>;
// RoPE's cos/sin per chunk row (P.rope != 0: q_pe is rotated as it is read). Before the
// cache rows so that mla_qcat, which reads bindings 1 to 4, binds a prefix of mla's.
@group(0) @binding(4) var<storage, read> cs: array<f32>;
@group(0) @binding(5) var<storage, read> cache: array<u32>;
@group(0) @binding(6) var<storage, read> idx: array<u32>;
@group(0) @binding(7) var<storage, read> cnt: array<u32>;

var<workgroup> qsh: array<vec4<f32>, HG * QD4>;
var<workgroup> sp: array<vec4<f32>, HG * PT / 4u>;  // logits, then probabilities, [h][p]
var<workgroup> pos_sh: array<u32, PT>;
var<workgroup> corr_sh: array<f32, HG>;
var<workgroup> m_sh: array<f32, HG>;
var<workgroup> l_sh: array<f32, HG>;
var<workgroup> n_sh: u32;

fn qd() -> u32 {
    return P.kv_lora + P.dr;
}

fn bf16_lo(w: u32) -> f32 {
    return bitcast<f32>(w << 16u);
}
fn bf16_hi(w: u32) -> f32 {
    return bitcast<f32>(w & 0xffff0000u);
}

// Elements d .. d + 3 (d a multiple of 4, d < kv_lora + dr) of the cache row at word
// `base`; elements past the row are 0.
fn row4(base: u32, d: u32) -> vec4<f32> {
    let n = qd();
    if (LFMT == 2u && d < P.kv_lora) {
        let u = cache[base + d / 4u];
        let s = bitcast<f32>(cache[base + P.kv_lora / 4u + d / 128u]);
        return vec4<f32>(e4m3(u), e4m3(u >> 8u), e4m3(u >> 16u), e4m3(u >> 24u)) * s;
    }
    if (LFMT != 0u) {
        // bf16 pairs: the whole row (LFMT 1) or the RoPE part after the FP8 codes and scales.
        var w = base + d / 2u;
        var e = d;
        if (LFMT == 2u) {
            e = d - P.kv_lora;
            w = base + P.kv_lora / 4u + (P.kv_lora + 127u) / 128u + e / 2u;
        }
        let w0 = cache[w];
        var r = vec4<f32>(bf16_lo(w0), bf16_hi(w0), 0.0, 0.0);
        if (d + 2u < n) {
            let w1 = cache[w + 1u];
            r = vec4<f32>(r.x, r.y, bf16_lo(w1), bf16_hi(w1));
        }
        return r;
    }
    var r = vec4<f32>(0.0);
    if (d + 3u < n) {
        r = bitcast<vec4<f32>>(vec4<u32>(cache[base + d], cache[base + d + 1u], cache[base + d + 2u], cache[base + d + 3u]));
    } else {
        for (var e = 0u; e < 4u; e = e + 1u) {
            if (d + e < n) {
                r[e] = bitcast<f32>(cache[base + d + e]);
            }
        }
    }
    return r;
}

// Latent element c < kv_lora of the cache row at word `base`.
fn row1(base: u32, c: u32) -> f32 {
    if (LFMT == 2u) {
        let s = bitcast<f32>(cache[base + P.kv_lora / 4u + c / 128u]);
        return e4m3(cache[base + c / 4u] >> ((c & 3u) * 8u)) * s;
    }
    if (LFMT == 1u) {
        let w = cache[base + c / 2u];
        return select(bf16_lo(w), bf16_hi(w), (c & 1u) == 1u);
    }
    return bitcast<f32>(cache[base + c]);
}

// Element i of the query of head h: q_abs for i < kv_lora, then q_pe (rotated here where
// P.rope says so).
fn query(t: u32, h: u32, i: u32) -> f32 {
    if (h >= P.heads || i >= qd()) {
        return 0.0;
    }
    if (i < P.kv_lora) {
        return qa[P.qa_off + t * P.qa_stride + h * P.kv_lora + i];
    }
    let qb = P.q_off + t * P.q_stride + h * (P.dn + P.dr) + P.dn;
    let j = i - P.kv_lora;
    let v = qin[qb + j];
    if (P.rope == 0u) {
        return v;
    }
    // RoPE on the fly (rotary.wgsl): 1 = half-split pairs, 2 = interleaved.
    let half = P.dr / 2u;
    let pr = rotary_partner(j, half, P.rope == 2u);
    let ci = (t * half + pr.x) * 2u;
    return rotary_one(v, qin[qb + pr.y], cs[ci], cs[ci + 1u], pr.z == 1u);
}

@compute @workgroup_size(256)
fn mla(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= P.rows * P.hgroups * P.splits) {
        return;
    }
    let split = g % P.splits;
    let hg = (g / P.splits) % P.hgroups;
    let t = g / (P.splits * P.hgroups);
    let h0 = hg * HG;
    if (lid == 0u) {
        n_sh = min(cnt[t], P.topk);
    }
    for (var i = lid; i < HG * QD4; i = i + WG) {
        let h = h0 + i / QD4;
        let d = (i % QD4) * 4u;
        qsh[i] = vec4<f32>(query(t, h, d), query(t, h, d + 1u), query(t, h, d + 2u), query(t, h, d + 3u));
    }
    let n = workgroupUniformLoad(&n_sh);
    let j_begin = split * P.split_len;
    let j_end = min(n, j_begin + P.split_len);
    let ib = t * P.topk;

    // Logit phase: invocation (p, l).
    let p_me = lid / LANES;
    let l_me = lid % LANES;
    // Softmax state per head in m_sh / l_sh, value accumulators per (head, column).
    for (var i = lid; i < HG; i = i + WG) {
        m_sh[i] = NEG_BIG;
        l_sh[i] = 0.0;
    }
    var acc: array<f32, HG * NC>;
    for (var i = 0u; i < HG * NC; i = i + 1u) {
        acc[i] = 0.0;
    }
    for (var j0 = j_begin; j0 < j_end; j0 = j0 + PT) {
        let nb = min(PT, j_end - j0);
        workgroupBarrier();
        for (var i = lid; i < nb; i = i + WG) {
            let pos = idx[ib + j0 + i];
            pos_sh[i] = select(ABSENT, pos - P.seg_lo, pos >= P.seg_lo && pos - P.seg_lo < P.seg_n);
        }
        workgroupBarrier();
        // 1. logits: invocation (p_me, l_me) sums vec4 steps l_me, l_me + LANES, .. of
        //    tile row p_me for all HG heads, then the LANES partial sums are added up in sp.
        var lg: array<f32, HG>;
        for (var k = 0u; k < HG; k = k + 1u) {
            lg[k] = 0.0;
        }
        if (p_me < nb && pos_sh[p_me] != ABSENT) {
            let base = P.c_off + pos_sh[p_me] * P.c_stride;
            for (var d4 = l_me; d4 < QD4; d4 = d4 + LANES) {
                let r = row4(base, d4 * 4u);
                for (var k = 0u; k < HG; k = k + 1u) {
                    lg[k] = lg[k] + dot(qsh[k * QD4 + d4], r);
                }
            }
        }
        for (var r = 0u; r < LANES; r = r + 1u) {
            if (l_me == r) {
                for (var k = 0u; k < HG; k = k + 1u) {
                    let i = (k * PT + p_me) / 4u;
                    if (r == 0u) {
                        sp[i][p_me % 4u] = lg[k];
                    } else {
                        sp[i][p_me % 4u] = sp[i][p_me % 4u] + lg[k];
                    }
                }
            }
            workgroupBarrier();
        }
        // 2. online softmax per head: TPH invocations per head each take every TPH-th tile
        //    position, and their max and sum are reduced in `red`.
        let h2 = lid / TPH;
        let sub = lid % TPH;
        var lm = NEG_BIG;
        if (h2 < HG) {
            for (var p = sub; p < nb; p = p + TPH) {
                if (pos_sh[p] != ABSENT) {
                    lm = max(lm, sp[(h2 * PT + p) / 4u][p % 4u] * P.scale);
                }
            }
        }
        red[lid] = lm;
        workgroupBarrier();
        for (var off = TPH / 2u; off > 0u; off = off >> 1u) {
            if (sub < off) {
                red[lid] = max(red[lid], red[lid + off]);
            }
            workgroupBarrier();
        }
        var mb = NEG_BIG;
        var ls = 0.0;
        if (h2 < HG) {
            mb = max(m_sh[h2], red[h2 * TPH]);
            for (var p = sub; p < PT; p = p + TPH) {
                var e = 0.0;
                if (p < nb && pos_sh[p] != ABSENT) {
                    e = exp(sp[(h2 * PT + p) / 4u][p % 4u] * P.scale - mb);
                }
                sp[(h2 * PT + p) / 4u][p % 4u] = e;
                ls = ls + e;
            }
        }
        workgroupBarrier();
        red[lid] = ls;
        workgroupBarrier();
        for (var off = TPH / 2u; off > 0u; off = off >> 1u) {
            if (sub < off) {
                red[lid] = red[lid] + red[lid + off];
            }
            workgroupBarrier();
        }
        if (h2 < HG && sub == 0u) {
            let c = exp(m_sh[h2] - mb);
            corr_sh[h2] = c;
            l_sh[h2] = l_sh[h2] * c + red[lid];
            m_sh[h2] = mb;
        }
        workgroupBarrier();
        // 3. values.
        for (var h = 0u; h < HG; h = h + 1u) {
            let c = corr_sh[h];
            for (var i = 0u; i < NC; i = i + 1u) {
                acc[h * NC + i] = acc[h * NC + i] * c;
            }
        }
        for (var p = 0u; p < nb; p = p + 4u) {
            var rv: array<vec4<f32>, NC>;
            for (var i = 0u; i < NC; i = i + 1u) {
                let col = lid + i * WG;
                var v = vec4<f32>(0.0);
                if (col < P.kv_lora) {
                    for (var e = 0u; e < 4u; e = e + 1u) {
                        if (p + e < nb && pos_sh[p + e] != ABSENT) {
                            v[e] = row1(P.c_off + pos_sh[p + e] * P.c_stride, col);
                        }
                    }
                }
                rv[i] = v;
            }
            for (var h = 0u; h < HG; h = h + 1u) {
                let pr = sp[(h * PT + p) / 4u];
                for (var i = 0u; i < NC; i = i + 1u) {
                    acc[h * NC + i] = acc[h * NC + i] + dot(pr, rv[i]);
                }
            }
        }
    }
    workgroupBarrier();
    for (var h = 0u; h < HG; h = h + 1u) {
        let head = h0 + h;
        if (head >= P.heads) {
            break;
        }
        let hm = m_sh[h];
        let hl = l_sh[h];
        if (P.part_splits == 1u) {
            var inv = 0.0;
            if (hl > 0.0) {
                inv = 1.0 / hl;
            }
            let ob = P.o_off + t * P.o_stride + head * P.kv_lora;
            for (var i = 0u; i < NC; i = i + 1u) {
                let col = lid + i * WG;
                if (col < P.kv_lora) {
                    out[ob + col] = acc[h * NC + i] * inv;
                }
            }
        } else {
            // part[(t, head, split)] = [acc (kv_lora) | m | l]
            let pb = ((t * P.heads + head) * P.part_splits + P.split_base + split) * (P.kv_lora + 2u);
            for (var i = 0u; i < NC; i = i + 1u) {
                let col = lid + i * WG;
                if (col < P.kv_lora) {
                    out[pb + col] = acc[h * NC + i];
                }
            }
            if (lid == 0u) {
                out[pb + P.kv_lora] = hm;
                out[pb + P.kv_lora + 1u] = hl;
            }
        }
    }
}

// mla_cpu: mla for CPU adapters (lavapipe, where a load whose address differs between
// invocations is a loop over the SIMD lanes and a barrier a switch through every SIMD slice
// of the workgroup). One workgroup of CPU_WG invocations per (row t, split, CPU_WG heads),
// an invocation per head, walking the split's positions with an online softmax: the query
// and the sums stay in registers. The workgroup stages CPU_WG selected rows at a time in
// workgroup memory, one row an invocation, and every head reads them from there: each row
// is loaded from the cache once, not once per head. Outputs as mla's: o_lat, or with
// several splits the split's partials for mla_combine.
var<workgroup> crow: array<vec4<f32>, CPU_WG * QD4>;
var<workgroup> cpos: array<u32, CPU_WG>;

// mla_cpu's (and mla_cpu_sg's) workgroup: its row t, split and this invocation's head.
struct CpuAt {
    t: u32,
    split: u32,
    head: u32,
}

// Row and split alone are workgroup-uniform (a value built from `lid` is not, for the
// barriers' uniformity analysis, even in its other fields): the entry points take them first.
fn cpu_at(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> CpuAt {
    let g = wid.x + wid.y * nwg.x;
    let hgs = (P.heads + CPU_WG - 1u) / CPU_WG;
    return CpuAt(g / (P.splits * hgs), (g / hgs) % P.splits, (g % hgs) * CPU_WG + lid);
}

// cpu_at's row and split, uniform.
fn cpu_row_split(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
    let at = cpu_at(wid, nwg, 0u);
    return vec2<u32>(at.t, at.split);
}

// Head h's query of row t (zeros for a head past the last).
fn cpu_query(t: u32, h: u32) -> array<vec4<f32>, QD4> {
    var q: array<vec4<f32>, QD4>;
    for (var d4 = 0u; d4 < QD4; d4++) {
        let d = d4 * 4u;
        q[d4] = vec4<f32>(0.0);
        if (h < P.heads) {
            q[d4] = vec4<f32>(query(t, h, d), query(t, h, d + 1u), query(t, h, d + 2u), query(t, h, d + 3u));
        }
    }
    return q;
}

// Selected position j of row t: its cache position, or ABSENT past j_end or outside the
// segment.
fn cpu_pos(t: u32, j: u32, j_end: u32) -> u32 {
    if (j < j_end) {
        let p = idx[t * P.topk + j];
        if (p >= P.seg_lo && p - P.seg_lo < P.seg_n) {
            return p;
        }
    }
    return ABSENT;
}

// Where split `split` of row t's selected positions ends (they start at split ·
// split_len). The count goes through workgroup memory, so that the analysis sees it uniform:
// the loops it bounds hold barriers (mla_cpu) or shuffles (mla_cpu_sg). Call in uniform
// control flow.
fn cpu_split_end(t: u32, split: u32, lid: u32) -> u32 {
    if (lid == 0u) {
        n_sh = min(cnt[t], P.topk);
    }
    let n = workgroupUniformLoad(&n_sh);
    return min(n, (split + 1u) * P.split_len);
}

// The online softmax's state of one head: the running max, the sum of weights and the
// weighted rows.
struct Online {
    m: f32,
    l: f32,
    acc: array<vec4<f32>, QD4>,
}

// Takes cache row r (its logit against q) into o.
fn online_add(o: ptr<function, Online>, q: ptr<function, array<vec4<f32>, QD4>>, r: ptr<function, array<vec4<f32>, QD4>>) {
    var dotv = vec4<f32>(0.0);
    for (var d4 = 0u; d4 < QD4; d4++) {
        dotv += (*q)[d4] * (*r)[d4];
    }
    let s = (dotv.x + dotv.y + dotv.z + dotv.w) * P.scale;
    let mn = max((*o).m, s);
    let c = exp((*o).m - mn);
    let p = exp(s - mn);
    (*o).l = (*o).l * c + p;
    (*o).m = mn;
    // Every one of the QD4 columns (the RoPE part's sums are never stored): a loop of
    // constant length keeps acc in registers on llvmpipe, where indexing it by a runtime
    // bound put it in memory.
    for (var d4 = 0u; d4 < QD4; d4++) {
        (*o).acc[d4] = (*o).acc[d4] * c + p * (*r)[d4];
    }
}

// One split: o_lat, normalized. Several: the split's partials, [acc (kv_lora) | m | l] at
// part[(t, head, split)].
fn cpu_store(at: CpuAt, o: ptr<function, Online>) {
    let kv4 = P.kv_lora / 4u;
    var ob = P.o_off + at.t * P.o_stride + at.head * P.kv_lora;
    var inv = select(0.0, 1.0 / (*o).l, (*o).l > 0.0);
    if (P.part_splits > 1u) {
        ob = ((at.t * P.heads + at.head) * P.part_splits + P.split_base + at.split) * (P.kv_lora + 2u);
        inv = 1.0;
        out[ob + P.kv_lora] = (*o).m;
        out[ob + P.kv_lora + 1u] = (*o).l;
    }
    for (var i = 0u; i < QD4; i++) {
        if (i < kv4) {
            let v = (*o).acc[i] * inv;
            out[ob + 4u * i] = v.x;
            out[ob + 4u * i + 1u] = v.y;
            out[ob + 4u * i + 2u] = v.z;
            out[ob + 4u * i + 3u] = v.w;
        }
    }
}

fn online_new() -> Online {
    var o: Online;
    o.m = NEG_BIG;
    o.l = 0.0;
    for (var i = 0u; i < QD4; i++) {
        o.acc[i] = vec4<f32>(0.0);
    }
    return o;
}

@compute @workgroup_size(CPU_WG)
fn mla_cpu(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Row and split are the workgroup's (uniform: barriers follow).
    let rs = cpu_row_split(wid, nwg);
    let t = rs.x;
    let split = rs.y;
    let at = cpu_at(wid, nwg, lid);
    if (t >= P.rows) {
        return;
    }
    var q = cpu_query(t, at.head);
    var o = online_new();
    let j_end = cpu_split_end(t, split, lid);
    for (var j0 = split * P.split_len; j0 < j_end; j0 += CPU_WG) {
        // Invocation lid stages position j0 + lid (ABSENT: past the split or the segment).
        let pos = cpu_pos(t, j0 + lid, j_end);
        cpos[lid] = pos;
        if (pos != ABSENT) {
            let base = P.c_off + (pos - P.seg_lo) * P.c_stride;
            for (var d4 = 0u; d4 < QD4; d4++) {
                crow[lid * QD4 + d4] = row4(base, d4 * 4u);
            }
        }
        workgroupBarrier();
        let staged = min(CPU_WG, j_end - j0);
        for (var i = 0u; i < staged; i++) {
            if (cpos[i] == ABSENT) {
                continue;
            }
            var r: array<vec4<f32>, QD4>;
            for (var d4 = 0u; d4 < QD4; d4++) {
                r[d4] = crow[i * QD4 + d4];
            }
            online_add(&o, &q, &r);
        }
        workgroupBarrier();
    }
    if (at.head < P.heads) {
        cpu_store(at, &o);
    }
}

// mla_combine: one workgroup per (row t, head, CW columns). Merges the splits' partial sums:
//   M = max_s m_s, o = Σ_s e^(m_s - M) acc_s / Σ_s e^(m_s - M) l_s.
// Each workgroup computes the weights e^(m_s - M) of all splits (a few hundred values), then
// its SS slices of the splits sum its columns and meet in workgroup memory: one workgroup per
// head walked every split serially for 2 columns per invocation, 64 workgroups in all.
// Reads `part` through binding 2 (qa) and writes o_lat through binding 1 (out).
const CW: u32 = 64u;
const SS: u32 = WG / CW;

var<workgroup> wsh: array<f32, MAXS>;
var<workgroup> red: array<f32, WG>;

// The maximum (with `sum`: the sum) of `v` over the workgroup's invocations, through `red`.
// Call in uniform control flow.
fn reduce_wg(v: f32, lid: u32, sum: bool) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var off = WG / 2u; off > 0u; off = off >> 1u) {
        if (lid < off) {
            red[lid] = select(max(red[lid], red[lid + off]), red[lid] + red[lid + off], sum);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn mla_combine(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    let slabs = (P.kv_lora + CW - 1u) / CW;
    if (g >= P.rows * P.heads * slabs) {
        return;
    }
    let slab = g % slabs;
    let t = g / slabs / P.heads;
    let head = (g / slabs) % P.heads;
    let row = P.kv_lora + 2u;
    let pb = (t * P.heads + head) * P.part_splits * row;
    var mx = NEG_BIG;
    for (var s = lid; s < P.part_splits; s = s + WG) {
        mx = max(mx, qa[pb + s * row + P.kv_lora]);
    }
    let big = reduce_wg(mx, lid, false);
    var l = 0.0;
    for (var s = lid; s < P.part_splits; s = s + WG) {
        let w = exp(qa[pb + s * row + P.kv_lora] - big);
        wsh[s] = w;
        l = l + w * qa[pb + s * row + P.kv_lora + 1u];
    }
    let total = reduce_wg(l, lid, true);
    var inv = 0.0;
    if (total > 0.0) {
        inv = 1.0 / total;
    }
    let c = slab * CW + lid % CW;
    var o = 0.0;
    if (c < P.kv_lora) {
        for (var s = lid / CW; s < P.part_splits; s = s + SS) {
            o = o + wsh[s] * qa[pb + s * row + c];
        }
    }
    workgroupBarrier();
    red[lid] = o;
    workgroupBarrier();
    if (lid < CW && c < P.kv_lora) {
        var sum = 0.0;
        for (var i = 0u; i < SS; i = i + 1u) {
            sum = sum + red[i * CW + lid];
        }
        out[P.o_off + t * P.o_stride + head * P.kv_lora + c] = sum * inv;
    }
}

// ---- the products as GEMMs (kernels/attention.rs `sparse_mla_gemm`) ----------------------
// For a block of query rows (chunk rows P.row0 ..), the two products run on the GEMM tile
// (matmul.wgsl's mla_logits and mla_values); these two prepare and normalize between them.

// mla_qcat: the block's queries as GEMM rows, out[P.o_off + (t · heads + h) · o_stride + i]
// = query(P.row0 + t, h, i) for i < kv_lora + dr: q_abs then the (rotated) q_pe. One
// invocation per element.
@compute @workgroup_size(256)
fn mla_qcat(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    let n = qd();
    if (i >= P.rows * P.heads * n) {
        return;
    }
    let th = i / n;
    out[P.o_off + th * P.o_stride + i % n] = query(P.row0 + th / P.heads, th % P.heads, i % n);
}

// mla_softmax: one workgroup per (block row t, head h): the logits out[P.o_off + (t · heads
// + h) · o_stride + j], j < n = min(count, topk), become softmax(logit · scale) and the rest
// of the first split_len columns zeros (a row with no position: all zeros). The counts are
// read through binding 2 (qa), as u32: bind the selection's counts there.
@compute @workgroup_size(256)
fn mla_softmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= P.rows * P.heads) {
        return;
    }
    let n = min(bitcast<u32>(qa[P.row0 + g / P.heads]), P.topk);
    let base = P.o_off + g * P.o_stride;
    var mx = NEG_BIG;
    for (var j = lid; j < n; j += WG) {
        mx = max(mx, out[base + j] * P.scale);
    }
    let m = reduce_wg(mx, lid, false);
    var l = 0.0;
    for (var j = lid; j < n; j += WG) {
        let e = exp(out[base + j] * P.scale - m);
        out[base + j] = e;
        l += e;
    }
    let total = reduce_wg(l, lid, true);
    var inv = 0.0;
    if (total > 0.0) {
        inv = 1.0 / total;
    }
    for (var j = lid; j < P.split_len; j += WG) {
        var p = 0.0;
        if (j < n) {
            p = out[base + j] * inv;
        }
        out[base + j] = p;
    }
}

// mla_sum: out[P.o_off + t · o_stride + i] = Σ_s part[(s · rows + t) · hk + i], i < hk =
// heads · kv_lora, s < P.splits: the GEMMs' values product over splits of the selected
// positions (src/kernels/attention.rs, sparse_mla_gemm), added in split order. Reads the
// parts through binding 2 (qa) and writes o_lat through binding 1 (out).
@compute @workgroup_size(256)
fn mla_sum(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let hk = P.heads * P.kv_lora;
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    if (i >= P.rows * hk) {
        return;
    }
    var acc = 0.0;
    for (var s = 0u; s < P.splits; s++) {
        acc += qa[s * P.rows * hk + i];
    }
    out[P.o_off + (i / hk) * P.o_stride + i % hk] = acc;
}
