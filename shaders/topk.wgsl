// Top-k per row by radix select, and the dense "select all" case.
//
// topk: one workgroup (WG = 256 threads) per row. Each f32 score is mapped to an
// order-preserving u32 key (-0 is canonicalized to +0 first, so they tie; -inf is the
// smallest non-NaN key). Four 8-bit histogram passes find the k-th largest key T and how
// many keys equal to T must be taken. A collection pass walks the row in position order
// with a workgroup prefix sum: every key > T is taken, and the lowest-position keys == T
// until k are taken (tie rule: lower position wins). Positions come out ascending.
//
// Scores are read as raw u32 bits, so no float arithmetic touches -inf. Keys, the prefix
// sum and the collection pass are in select.wgsl (shared with topk_wide.wgsl).
// Both entry points share the binding declarations (1: idx, 2: cnt, 3: places, 4: scores);
// with places (P.ragged, places.wgsl) row t's valid keys end at its own position and the
// positions selected come out as its sequence's cache rows (lo + s).

const WG: u32 = 256u;

// Params (binding 0): declared once, in src/kernels/topk.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> idx: array<u32>;
@group(0) @binding(2) var<storage, read_write> cnt: array<u32>;
@group(0) @binding(3) var<storage, read> places: array<u32>;
@group(0) @binding(4) var<storage, read> scores: array<u32>;

var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> scan: array<u32, 256>;
var<workgroup> sel_bin: u32;
var<workgroup> sel_below: u32;

@compute @workgroup_size(256)
fn topk(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= P.rows) {
        return;
    }
    let valid = min(row_pos(t) + 1u, P.n_keys);
    let lo = row_lo(t);
    let k = min(P.topk, valid);
    let ob = t * P.topk;
    let sb = P.s_off + t * P.s_stride;
    if (lid == 0u) {
        cnt[t] = k;
    }
    if (k == valid) {
        for (var i = lid; i < valid; i = i + WG) {
            idx[ob + i] = lo + i;
        }
        return;
    }

    // Radix select of the k-th largest key: after pass p, `prefix` holds its top 8(p+1)
    // bits and `remaining` how many keys with that prefix still have to be taken.
    var prefix = 0u;
    var mask = 0u;
    var remaining = k;
    for (var ps = 0u; ps < 4u; ps = ps + 1u) {
        let shift = 24u - 8u * ps;
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        for (var i = lid; i < valid; i = i + WG) {
            let key = key_of(scores[sb + i]);
            if ((key & mask) == prefix) {
                atomicAdd(&hist[(key >> shift) & 255u], 1u);
            }
        }
        workgroupBarrier();
        // Invocation `lid` looks at bin 255 - lid, so the scan runs from the largest bin down.
        let c = atomicLoad(&hist[255u - lid]);
        let incl = scan_incl(lid, c);
        let excl = incl - c;
        if (excl < remaining && incl >= remaining) {
            sel_bin = 255u - lid;
            sel_below = excl;
        }
        let bin = workgroupUniformLoad(&sel_bin);
        let below = workgroupUniformLoad(&sel_below);
        prefix = prefix | (bin << shift);
        mask = mask | (255u << shift);
        remaining = remaining - below;
    }

    // Collection in position order: all keys > T, then the first `remaining` keys == T.
    collect_range(lid, sb, 0u, valid, ob, prefix, remaining, 0u, 0u, lo);
}

// Dense case: idx[t*topk + j] = lo + j for j <= pos, cnt[t] = pos + 1 (row t's lo and pos:
// places.wgsl).
@compute @workgroup_size(256)
fn select_all(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = (wid.x + wid.y * nwg.x) * WG + lid;
    if (g >= P.rows * P.topk) {
        return;
    }
    let t = g / P.topk;
    let j = g % P.topk;
    let n = row_pos(t) + 1u;
    if (j < n) {
        idx[g] = row_lo(t) + j;
    }
    if (j == 0u) {
        cnt[t] = n;
    }
}
