// Sampling on the GPU with the host sampler's rules (`generate::Sampler`), so generation can
// queue the next step before this one's token is read back.
//
// prep (one invocation per logit): work[i] = logits[i] with the repetition penalty applied
//   to tokens in the window (positive logits divided by it, others multiplied, each token
//   once), and every non-finite value replaced by -inf (the host drops non-finite logits)
//   unless P.raw = 1 (greedy with a penalty: sample.wgsl's argmax follows).
//   The window is win[0 .. P.win_len] plus, when P.use_prev = 1, the token the previous
//   step left at ids[P.out_off].
// topk (topk.wgsl / topk_wide.wgsl, between the two): the P.k largest of work.
// pick (one workgroup): sorts the finite candidates (value descending, then id ascending),
//   softmax of value / temperature, the top-p nucleus, and the host's uniform P.r walks
//   the probabilities; the token goes to ids[P.out_off]. With no finite candidate it takes
//   the argmax of the raw logits (lowest id among maxima, NaN skipped), as the host does.
// order_key and wins come from sample_key.wgsl.
// Bindings: 1 = work (f32), 2 = logits (f32 bits), 3 = ids (in/out); prep: 4 = window ids;
// pick: 4 = the topk's ids, 5 = its count.

// Params (binding 0): declared once, in src/kernels/sample.rs (`PickParams`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> work: array<f32>;
@group(0) @binding(2) var<storage, read> logits: array<u32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
// prep only:
@group(0) @binding(4) var<storage, read> win: array<u32>;
// pick only (binding 4 again: each entry point binds only what it uses):
@group(0) @binding(4) var<storage, read> cand: array<u32>;
@group(0) @binding(5) var<storage, read> cand_n: array<u32>;

const WG: u32 = 256u;
const NEG_INF: u32 = 0xff800000u;
// Most candidates `pick` sorts (the largest top-k the GPU path takes).
const MAX_K: u32 = 256u;

var<workgroup> mask: array<atomic<u32>, 8>;
var<workgroup> cv: array<f32, MAX_K>;
var<workgroup> ci: array<u32, MAX_K>;
var<workgroup> sv: array<f32, MAX_K>;
var<workgroup> si: array<u32, MAX_K>;
var<workgroup> n_fin: atomic<u32>;
var<workgroup> n_fin_u: u32;
var<workgroup> rkey: array<u32, WG>;
var<workgroup> ridx: array<u32, WG>;

fn finite(bits: u32) -> bool {
    return (bits & 0x7f800000u) != 0x7f800000u;
}

@compute @workgroup_size(256)
fn prep(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let base = (wid.x + wid.y * nwg.x) * WG;
    if (lid < 8u) {
        atomicStore(&mask[lid], 0u);
    }
    workgroupBarrier();
    // Mark the window's tokens that fall in this workgroup's 256 logits.
    let total = P.win_len + P.use_prev;
    for (var j = lid; j < total; j += WG) {
        var t = 0u;
        if (j < P.win_len) {
            t = win[j];
        } else {
            t = ids[P.out_off];
        }
        if (t >= base && t < base + WG) {
            atomicOr(&mask[(t - base) / 32u], 1u << ((t - base) % 32u));
        }
    }
    workgroupBarrier();
    let i = base + lid;
    if (i >= P.n) {
        return;
    }
    let bits = logits[P.x_off + i];
    var v = bitcast<f32>(bits);
    if ((atomicLoad(&mask[lid / 32u]) & (1u << (lid % 32u))) != 0u && finite(bits)) {
        v = select(v * P.penalty, v / P.penalty, v > 0.0);
    }
    if (P.raw == 0u && (!finite(bits) || !finite(bitcast<u32>(v)))) {
        v = bitcast<f32>(NEG_INF);
    }
    work[i] = v;
}

@compute @workgroup_size(256)
fn pick(@builtin(local_invocation_index) lid: u32) {
    let k = min(cand_n[0], min(P.k, MAX_K));
    if (lid == 0u) {
        atomicStore(&n_fin, 0u);
    }
    workgroupBarrier();
    var fin = false;
    if (lid < k) {
        ci[lid] = cand[lid];
        cv[lid] = work[ci[lid]];
        fin = bitcast<u32>(cv[lid]) != NEG_INF;
        if (fin) {
            atomicAdd(&n_fin, 1u);
        }
    }
    workgroupBarrier();
    // Rank of each finite candidate: value descending, then id ascending.
    if (fin) {
        var rank = 0u;
        for (var j = 0u; j < k; j++) {
            let vj = cv[j];
            if (bitcast<u32>(vj) != NEG_INF && (vj > cv[lid] || (vj == cv[lid] && ci[j] < ci[lid]))) {
                rank += 1u;
            }
        }
        sv[rank] = cv[lid];
        si[rank] = ci[lid];
    }
    if (lid == 0u) {
        n_fin_u = atomicLoad(&n_fin);
    }
    let m = workgroupUniformLoad(&n_fin_u);
    if (m > 0u) {
        if (lid == 0u) {
            // The host's arithmetic in f32: probabilities relative to the largest, the
            // nucleus (the shortest prefix reaching top_p), renormalized, then the walk.
            let top = sv[0] / P.temperature;
            var total = 0.0;
            for (var j = 0u; j < m; j++) {
                total += exp(sv[j] / P.temperature - top);
            }
            var keep = m;
            var kept = 1.0;
            if (P.top_p < 1.0) {
                var acc = 0.0;
                for (var j = 0u; j < m; j++) {
                    acc += exp(sv[j] / P.temperature - top) / total;
                    if (acc >= P.top_p) {
                        keep = j + 1u;
                        break;
                    }
                }
                kept = 0.0;
                for (var j = 0u; j < keep; j++) {
                    kept += exp(sv[j] / P.temperature - top) / total;
                }
            }
            var r = P.r;
            var tok = si[keep - 1u];
            for (var j = 0u; j < keep; j++) {
                let p = exp(sv[j] / P.temperature - top) / total / kept;
                if (r < p) {
                    tok = si[j];
                    break;
                }
                r -= p;
            }
            ids[P.out_off] = tok;
        }
        return;
    }
    // No finite candidate: the argmax of the raw logits.
    var bk = 0u;
    var bi = 0xffffffffu;
    for (var i = lid; i < P.n; i += WG) {
        let key = order_key(logits[P.x_off + i]);
        if (wins(key, i, bk, bi)) {
            bk = key;
            bi = i;
        }
    }
    rkey[lid] = bk;
    ridx[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let ok = rkey[lid + s];
            let oi = ridx[lid + s];
            if (wins(ok, oi, rkey[lid], ridx[lid])) {
                rkey[lid] = ok;
                ridx[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        ids[P.out_off] = ridx[0];
    }
}
