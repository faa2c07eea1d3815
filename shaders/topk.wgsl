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

// Row t's selection: its valid keys (up to its position), its sequence's first cache row,
// how many to take, where its slots and its scores start.
struct RowSel {
    valid: u32,
    lo: u32,
    k: u32,
    ob: u32,
    sb: u32,
}

fn row_sel(t: u32) -> RowSel {
    let valid = min(row_pos(t) + 1u, P.n_keys);
    return RowSel(valid, row_lo(t), min(P.topk, valid), t * P.topk, P.s_off + t * P.s_stride);
}

// Row r's positions first, first + step, .. below its valid keys, all taken (k = valid).
fn select_every(r: RowSel, first: u32, step: u32) {
    for (var i = first; i < r.valid; i = i + step) {
        idx[r.ob + i] = r.lo + i;
    }
}

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
    let r = row_sel(t);
    if (lid == 0u) {
        cnt[t] = r.k;
    }
    if (r.k == r.valid) {
        select_every(r, lid, WG);
        return;
    }

    // Radix select of the k-th largest key: after pass p, `prefix` holds its top 8(p+1)
    // bits and `remaining` how many keys with that prefix still have to be taken.
    var prefix = 0u;
    var mask = 0u;
    var remaining = r.k;
    for (var ps = 0u; ps < 4u; ps = ps + 1u) {
        let shift = 24u - 8u * ps;
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        for (var i = lid; i < r.valid; i = i + WG) {
            let key = key_of(scores[r.sb + i]);
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
    collect_range(lid, r.sb, 0u, r.valid, r.ob, prefix, remaining, 0u, 0u, r.lo);
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

// topk_cpu: topk for CPU adapters (lavapipe: a load whose address differs between
// invocations is a loop over the SIMD lanes, and a barrier a switch through every SIMD slice
// of the workgroup; src/kernels/mod.rs, `cpu_kernels`). One invocation per row, no workgroup
// memory and no barrier: radix select over 4-bit digits from the top, the 16 counts of a
// digit in registers, one read of the row per digit; it stops at the first digit whose bin
// holds exactly the keys still to take (random scores: after 2 or 3 digits). Then the
// collection in position order: keys above the prefix found, and the first `remaining`
// keys on it. The host keeps 9 reads of the row within llvmpipe's loop budget
// (src/kernels/topk.rs, CPU_MAX_KEYS).
@compute @workgroup_size(CPU_WG)
fn topk_cpu(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = cpu_item(wid, nwg, lid);
    if (t >= P.rows) {
        return;
    }
    let r = row_sel(t);
    cnt[t] = r.k;
    if (r.k == r.valid) {
        select_every(r, 0u, 1u);
        return;
    }
    var prefix = 0u;
    var mask = 0u;
    var remaining = r.k;
    for (var shift = 28i; shift >= 0i; shift -= 4i) {
        let sh = u32(shift);
        // Zeroed each pass (an explicit initializer: a loop-body declaration without one was
        // not re-zeroed on every translator).
        var c = array<u32, 16>();
        for (var i = 0u; i < r.valid; i++) {
            let key = key_of(scores[r.sb + i]);
            let on = (key & mask) == prefix;
            let digit = (key >> sh) & 15u;
            for (var v = 0u; v < 16u; v++) {
                c[v] += select(0u, 1u, on && digit == v);
            }
        }
        // The bin holding the remaining-th largest key, from the top bin down.
        var above = 0u;
        var bin = 0u;
        var in_bin = 0u;
        var found = false;
        for (var v = 15i; v >= 0i; v--) {
            let n = c[v];
            if (!found) {
                if (above + n >= remaining) {
                    bin = u32(v);
                    in_bin = n;
                    found = true;
                } else {
                    above += n;
                }
            }
        }
        prefix |= bin << sh;
        mask |= 15u << sh;
        remaining -= above;
        if (in_bin == remaining) {
            break;
        }
    }
    var w = r.ob;
    var eqs = 0u;
    for (var i = 0u; i < r.valid; i++) {
        let top = key_of(scores[r.sb + i]) & mask;
        if (top > prefix || (top == prefix && eqs < remaining)) {
            idx[w] = r.lo + i;
            w++;
        }
        eqs += select(0u, 1u, top == prefix);
    }
}
