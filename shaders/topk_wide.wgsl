// Top-k per row for long rows, spread over many workgroups (multi-workgroup radix select).
//
// Same result as topk.wgsl's `topk` (same order-preserving keys with -0 == +0, same tie
// rule: among keys equal to the k-th largest the lowest positions are taken; positions
// ascending; cnt[t] = k), for rows so long that one workgroup per row would leave most of
// the GPU idle (decode: one row of 10^5..10^6 keys).
//
// Each row is cut into `segs` segments of `seg_len` positions; the grid is
// (row, segment) flattened, one workgroup of WG = 256 each. Five dispatches, in order:
//
//   hist0    histogram of digit 0 (key bits 31..21, 2048 bins) over the segment's keys in
//            workgroup memory, added to the row's global histogram H0 with atomics.
//   hist1    every workgroup scans H0 from the largest bin down to find the bin holding
//            the k-th largest key and how many keys lie above that bin (all taken); the
//            segment-0 workgroup records (prefix, remaining) in `state`. Then the
//            histogram of digit 1 (bits 20..10) of the keys whose digit 0 matches -> H1.
//   hist2    the same from H1: digit 1 found, histogram of digit 2 (bits 9..0, 1024 bins)
//            of the keys matching the 22-bit prefix -> H2.
//   count    the same from H2: now T, the k-th largest key, is known exactly, and `need`,
//            how many keys == T are taken. Each workgroup counts its segment's keys > T
//            and == T into `segcnt`.
//   collect  each workgroup sums the counts of the segments before it (its first output
//            slot, and how many keys == T those segments already took), then walks its
//            segment in position order like topk.wgsl's collection pass: every key > T,
//            and keys == T while fewer than `need` have been taken in the row.
//            It also zeroes its share of the row's histograms: they must be zero when the
//            next call starts (a new buffer is zeroed by wgpu).
//
// Scanning a histogram is repeated by every workgroup of the row (8 KiB from cache) rather
// than done once by an extra dispatch. Rows with k == valid take every position: the
// first four passes skip them. Scores are read as raw u32 bits (no float math on -inf).

const WG: u32 = 256u;
// u32 per row in `hist`: H0 (2048 bins), H1 (2048), H2 (1024).
const HROW: u32 = 5120u;
// u32 per row in `state`: (prefix, remaining) after digits 0, 1, 2; the last pair is (T, need).
const SROW: u32 = 8u;

// Params (binding 0): declared once, in src/kernels/topk.rs (`Params`), and put before this source.

// Every entry point uses a prefix of these bindings (hist0: 1-3, hist1/hist2: 1-4,
// count: 1-5, collect: all); `places` is places.wgsl's (row t's lo and position).
@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> places: array<u32>;
@group(0) @binding(2) var<storage, read> scores: array<u32>;
@group(0) @binding(3) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> state: array<u32>;
@group(0) @binding(5) var<storage, read_write> segcnt: array<u32>;
@group(0) @binding(6) var<storage, read_write> idx: array<u32>;
@group(0) @binding(7) var<storage, read_write> cnt: array<u32>;

var<workgroup> lh: array<atomic<u32>, 2048>;
var<workgroup> scan: array<u32, 256>;
var<workgroup> sel_bin: u32;
var<workgroup> sel_below: u32;
var<workgroup> bcast: u32;
var<workgroup> n_match: atomic<u32>;

// Digit d of a key: its lowest bit, number of bins, offset of its histogram in a row.
fn digit_shift(d: u32) -> u32 {
    return select(select(0u, 10u, d == 1u), 21u, d == 0u);
}
fn digit_bins(d: u32) -> u32 {
    return select(2048u, 1024u, d == 2u);
}
fn digit_base(d: u32) -> u32 {
    return d * 2048u;
}
// The key bits fixed by the digits before d.
fn done_mask(d: u32) -> u32 {
    if (d == 0u) {
        return 0u;
    }
    return ~((1u << digit_shift(d - 1u)) - 1u);
}

// Sum of `v` over the workgroup, returned to every invocation (uniform control flow).
fn wg_sum(lid: u32, v: u32) -> u32 {
    let incl = scan_incl(lid, v);
    if (lid == WG - 1u) {
        bcast = incl;
    }
    return workgroupUniformLoad(&bcast);
}

// The workgroup's segment: row t, segment s, positions [lo, hi) (clipped to the row's
// valid keys), and the row's valid count and k.
struct Seg {
    t: u32,
    s: u32,
    lo: u32,
    hi: u32,
    valid: u32,
    k: u32,
}

fn seg_of(wid: vec3<u32>, nwg: vec3<u32>) -> Seg {
    let g = wid.x + wid.y * nwg.x;
    let t = g / P.segs;
    let s = g % P.segs;
    let valid = min(row_pos(t) + 1u, P.n_keys);
    let lo = min(s * P.seg_len, valid);
    let hi = min(lo + P.seg_len, valid);
    return Seg(t, s, lo, hi, valid, min(P.topk, valid));
}

// Scans `nb` bins at hist[base..] from the largest bin down for the bin where the count
// reaches `rem`. Returns (bin, number of keys in the bins above it). Every invocation sums
// nb / WG consecutive bins; the prefix sum over invocations finds the one whose range
// holds the crossing, and that invocation walks its bins.
fn find_bin(base: u32, nb: u32, rem: u32, lid: u32) -> vec2<u32> {
    let per = nb / WG;
    let top = nb - lid * per;
    var c: array<u32, 8>;
    var v = 0u;
    for (var j = 0u; j < per; j = j + 1u) {
        c[j] = atomicLoad(&hist[base + top - 1u - j]);
        v = v + c[j];
    }
    let incl = scan_incl(lid, v);
    let excl = incl - v;
    if (excl < rem && incl >= rem) {
        var acc = excl;
        for (var j = 0u; j < per; j = j + 1u) {
            if (acc + c[j] >= rem) {
                sel_bin = top - 1u - j;
                sel_below = acc;
                break;
            }
            acc = acc + c[j];
        }
    }
    let bin = workgroupUniformLoad(&sel_bin);
    let below = workgroupUniformLoad(&sel_below);
    return vec2<u32>(bin, below);
}

// Finds digit d-1 of the k-th largest key from the row's histogram of that digit, given
// the state after digit d-2 (or none for d = 1). Returns (prefix, remaining) after digit
// d-1; segment 0's workgroup records them for the later passes.
fn next_digit(d: u32, sg: Seg, lid: u32) -> vec2<u32> {
    let sb = sg.t * SROW;
    var prefix = 0u;
    var rem = sg.k;
    if (d >= 2u) {
        prefix = state[sb + 2u * (d - 2u)];
        rem = state[sb + 2u * (d - 2u) + 1u];
    }
    let p = d - 1u;
    let r = find_bin(sg.t * HROW + digit_base(p), digit_bins(p), rem, lid);
    prefix = prefix | (r.x << digit_shift(p));
    rem = rem - r.y;
    if (sg.s == 0u && lid == 0u) {
        state[sb + 2u * p] = prefix;
        state[sb + 2u * p + 1u] = rem;
    }
    return vec2<u32>(prefix, rem);
}

// Histogram of digit d over the segment's keys whose earlier digits equal `prefix`,
// added to the row's global histogram of digit d. For digits 1 and 2 most segments hold
// no matching key: they skip reading the workgroup histogram back.
fn hist_pass(d: u32, sg: Seg, prefix: u32, lid: u32) {
    let shift = digit_shift(d);
    let nb = digit_bins(d);
    let mask = done_mask(d);
    for (var b = lid; b < nb; b = b + WG) {
        atomicStore(&lh[b], 0u);
    }
    if (lid == 0u) {
        atomicStore(&n_match, 0u);
    }
    workgroupBarrier();
    let sb = P.s_off + sg.t * P.s_stride;
    var m = 0u;
    for (var i = sg.lo + lid; i < sg.hi; i = i + WG) {
        let key = key_of(scores[sb + i]);
        if ((key & mask) == prefix) {
            atomicAdd(&lh[(key >> shift) & (nb - 1u)], 1u);
            m = m + 1u;
        }
    }
    if (m != 0u) {
        atomicAdd(&n_match, m);
    }
    workgroupBarrier();
    if (atomicLoad(&n_match) == 0u) {
        return;
    }
    let hb = sg.t * HROW + digit_base(d);
    for (var b = lid; b < nb; b = b + WG) {
        let c = atomicLoad(&lh[b]);
        if (c != 0u) {
            atomicAdd(&hist[hb + b], c);
        }
    }
}

@compute @workgroup_size(256)
fn hist0(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let sg = seg_of(wid, nwg);
    if (sg.t >= P.rows || sg.k == sg.valid || sg.lo >= sg.hi) {
        return;
    }
    hist_pass(0u, sg, 0u, lid);
}

@compute @workgroup_size(256)
fn hist1(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Segment 0 is never empty (valid >= 1), so the state is always recorded.
    let sg = seg_of(wid, nwg);
    if (sg.t >= P.rows || sg.k == sg.valid || sg.lo >= sg.hi) {
        return;
    }
    let st = next_digit(1u, sg, lid);
    hist_pass(1u, sg, st.x, lid);
}

@compute @workgroup_size(256)
fn hist2(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let sg = seg_of(wid, nwg);
    if (sg.t >= P.rows || sg.k == sg.valid || sg.lo >= sg.hi) {
        return;
    }
    let st = next_digit(2u, sg, lid);
    hist_pass(2u, sg, st.x, lid);
}

@compute @workgroup_size(256)
fn count(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let sg = seg_of(wid, nwg);
    if (sg.t >= P.rows || sg.k == sg.valid) {
        return;
    }
    let cb = 2u * (sg.t * P.segs + sg.s);
    if (sg.lo >= sg.hi) {
        // An empty segment (past the row's valid keys) still reports zero counts.
        if (lid == 0u) {
            segcnt[cb] = 0u;
            segcnt[cb + 1u] = 0u;
        }
        return;
    }
    let st = next_digit(3u, sg, lid);
    let thr = st.x;
    let sb = P.s_off + sg.t * P.s_stride;
    var gt = 0u;
    var eq = 0u;
    for (var i = sg.lo + lid; i < sg.hi; i = i + WG) {
        let key = key_of(scores[sb + i]);
        gt = gt + select(0u, 1u, key > thr);
        eq = eq + select(0u, 1u, key == thr);
    }
    let g = wg_sum(lid, gt);
    let e = wg_sum(lid, eq);
    if (lid == 0u) {
        segcnt[cb] = g;
        segcnt[cb + 1u] = e;
    }
}

@compute @workgroup_size(256)
fn collect(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let sg = seg_of(wid, nwg);
    if (sg.t >= P.rows) {
        return;
    }
    let ob = sg.t * P.topk;
    if (sg.s == 0u && lid == 0u) {
        cnt[sg.t] = sg.k;
    }
    // Nothing reads the histograms any more: zero this segment's share for the next call.
    let hb = sg.t * HROW;
    for (var j = sg.s * WG + lid; j < HROW; j = j + P.segs * WG) {
        atomicStore(&hist[hb + j], 0u);
    }
    if (sg.k == sg.valid) {
        for (var i = sg.lo + lid; i < sg.hi; i = i + WG) {
            idx[ob + i] = row_lo(sg.t) + i;
        }
        return;
    }
    if (sg.lo >= sg.hi) {
        return;
    }
    let thr = state[sg.t * SROW + 4u];
    let need = state[sg.t * SROW + 5u];

    // Keys > T, and keys == T, in the segments before this one.
    let cb = 2u * sg.t * P.segs;
    var g = 0u;
    var e = 0u;
    for (var j = lid; j < sg.s; j = j + WG) {
        g = g + segcnt[cb + 2u * j];
        e = e + segcnt[cb + 2u * j + 1u];
    }
    let gt_before = wg_sum(lid, g);
    let eq_before = wg_sum(lid, e);

    // Collection in position order (select.wgsl): a key > T goes to the next slot, a key
    // == T only while fewer than `need` of them have been seen in the row.
    let sb = P.s_off + sg.t * P.s_stride;
    collect_range(lid, sb, sg.lo, sg.hi, ob, thr, need, gt_before + min(eq_before, need), eq_before,
                  row_lo(sg.t));
}
