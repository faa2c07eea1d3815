// MoE routing, DeepSeek-V3 "noaux_tc": sigmoid scores, bias for the choice only, group
// limiting (sum of top-2 per group, keep topk_group groups, others masked), top-k with
// ties to the lower expert index, unbiased weights (normalized, scaled). A row's picks go
// to idx / weights from o; with extra = 1 one more pair follows them: expert extra_id with
// weight 1 (the shared expert, run as a routed one).
//
// One workgroup (WG = 256) routes a row. Choice scores are held as order-preserving u32
// keys (masked experts get key 0, below every real score, so they order like -inf with ties
// to the lower index); a bitonic sort of (key desc, expert asc) over N2 (power of two ≥
// n_experts) entries in workgroup memory gives the picks in descending order.
//
// Prepended to router.wgsl (logits from a matmul) and router_gemv.wgsl (the router's own
// GEMV in the same dispatch), which declare `bias`, `idx` and `weights` and fill the
// workgroup arrays with `set_expert` before `pick_row`. Defines: N2.

const WG: u32 = 256u;
const MAX_GROUPS: u32 = 64u;

var<workgroup> keys: array<u32, N2>;
var<workgroup> ids: array<u32, N2>;
// sigmoid(logit) of each expert: the unbiased score its weight comes from.
var<workgroup> sig: array<f32, N2>;
var<workgroup> gscore: array<f32, MAX_GROUPS>;
var<workgroup> gkeep: array<u32, MAX_GROUPS>;
var<workgroup> wsum: f32;

fn key_of(x: f32) -> u32 {
    var b = bitcast<u32>(x);
    if (b == 0x80000000u) {
        b = 0u;
    }
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

fn f32_of(key: u32) -> f32 {
    if ((key & 0x80000000u) != 0u) {
        return bitcast<f32>(key & 0x7fffffffu);
    }
    return bitcast<f32>(~key);
}

fn sigmoid(x: f32) -> f32 {
    if (x >= 0.0) {
        return 1.0 / (1.0 + exp(-x));
    }
    let e = exp(x);
    return e / (1.0 + e);
}

// Whether entry (ka, ia) ranks before (kb, ib): larger key, then lower index.
fn before(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}

// Entry e (< N2) of the workgroup arrays: expert e's logit, or padding past n_experts.
fn set_expert(e: u32, logit: f32) {
    var k = 0u;
    var s = 0.0;
    if (e < P.n_experts) {
        s = sigmoid(logit);
        k = key_of(s + bias[e]);
    }
    keys[e] = k;
    ids[e] = e;
    sig[e] = s;
}

// Routes the row whose entries set_expert filled (every invocation calls it after a
// barrier); its pairs go to idx / weights from o.
fn pick_row(lid: u32, o: u32) {
    if (P.n_group > 1u && P.topk_group < P.n_group) {
        let gs = P.n_experts / P.n_group;
        if (lid < P.n_group) {
            // The two largest choice scores of the group (equal values both count).
            var k1 = 0u;
            var k2 = 0u;
            for (var i = 0u; i < gs; i = i + 1u) {
                let k = keys[lid * gs + i];
                if (k > k1) {
                    k2 = k1;
                    k1 = k;
                } else if (k > k2) {
                    k2 = k;
                }
            }
            var sc = f32_of(k1);
            if (gs > 1u) {
                sc = f32_of(k1) + f32_of(k2);
            }
            gscore[lid] = sc;
        }
        workgroupBarrier();
        if (lid < P.n_group) {
            let mine = gscore[lid];
            var rank = 0u;
            for (var g = 0u; g < P.n_group; g = g + 1u) {
                let o = gscore[g];
                if (o > mine || (o == mine && g < lid)) {
                    rank = rank + 1u;
                }
            }
            gkeep[lid] = select(0u, 1u, rank < P.topk_group);
        }
        workgroupBarrier();
        for (var e = lid; e < P.n_experts; e = e + WG) {
            if (gkeep[e / gs] == 0u) {
                keys[e] = 0u;
            }
        }
        workgroupBarrier();
    }

    // Bitonic sort, "before" order first.
    for (var k = 2u; k <= N2; k = k << 1u) {
        for (var j = k >> 1u; j > 0u; j = j >> 1u) {
            for (var p = lid; p < N2 / 2u; p = p + WG) {
                let a = (p / j) * 2u * j + (p % j);
                let b = a + j;
                let ka = keys[a];
                let kb = keys[b];
                let ia = ids[a];
                let ib = ids[b];
                // Segments with (a & k) == 0 end up in "before" order, the others reversed.
                let want_a_first = (a & k) == 0u;
                if (before(kb, ib, ka, ia) == want_a_first) {
                    keys[a] = kb;
                    keys[b] = ka;
                    ids[a] = ib;
                    ids[b] = ia;
                }
            }
            workgroupBarrier();
        }
    }

    // Unbiased weights of the picks.
    var s = 0.0;
    if (lid < P.topk) {
        s = sig[ids[lid]];
    }
    if (lid == 0u) {
        var total = 0.0;
        for (var j = 0u; j < P.topk; j = j + 1u) {
            total = total + sig[ids[j]];
        }
        wsum = total + 1e-20;
    }
    workgroupBarrier();
    if (lid < P.topk) {
        if (P.norm != 0u) {
            s = s / wsum;
        }
        idx[o + lid] = ids[lid];
        weights[o + lid] = s * P.scaling;
    }
    if (P.extra == 1u && lid == 0u) {
        idx[o + P.topk] = P.extra_id;
        weights[o + P.topk] = 1.0;
    }
}
