// Shared by topk.wgsl and topk_wide.wgsl (prepended to both): the order-preserving keys,
// the workgroup prefix sum, and the ordered collection of the selected positions.
// The including file declares WG (= 256), `scores` (u32 bits), `idx` (read_write u32),
// and the workgroup variable `scan: array<u32, WG>`.

// Order-preserving map from f32 bits to u32 (larger float -> larger key), -0 == +0.
fn key_of(bits: u32) -> u32 {
    var b = bits;
    if (b == 0x80000000u) {
        b = 0u;
    }
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// Inclusive prefix sum of `v` over the workgroup (Hillis-Steele). Call from uniform
// control flow. Returns this invocation's inclusive sum; scan[WG-1] holds the total.
fn scan_incl(lid: u32, v: u32) -> u32 {
    scan[lid] = v;
    workgroupBarrier();
    for (var off = 1u; off < WG; off = off << 1u) {
        var x = scan[lid];
        if (lid >= off) {
            x = x + scan[lid - off];
        }
        workgroupBarrier();
        scan[lid] = x;
        workgroupBarrier();
    }
    return scan[lid];
}

// Collection in position order over positions [lo, hi) of the row whose scores start at
// `sb`: a key > thr goes to the next slot, a key == thr only while fewer than `need` of
// them have been seen in the row. A position s is written as `base + s` (the row's cache
// rows, places.wgsl). `written0` and `eq_seen0` are the slots already filled
// and the keys == thr already seen before `lo`; slots start at idx[ob]. Uniform control flow.
// Invocation lid walks its own run of consecutive positions twice: counting, then (after
// one prefix sum of the counts over the workgroup) writing its keys' slots in order. A
// prefix sum per 256 positions cost a dozen barriers each, most of a decode row's time.
fn collect_range(lid: u32, sb: u32, lo: u32, hi: u32, ob: u32, thr: u32, need: u32,
                 written0: u32, eq_seen0: u32, base: u32) {
    let per = (hi - lo + WG - 1u) / WG;
    let a = min(lo + lid * per, hi);
    let b = min(a + per, hi);
    var gt = 0u;
    var eq = 0u;
    for (var i = a; i < b; i = i + 1u) {
        let key = key_of(scores[sb + i]);
        gt = gt + select(0u, 1u, key > thr);
        eq = eq + select(0u, 1u, key == thr);
    }
    let gt_ex = scan_incl(lid, gt) - gt;
    let eq_ex = scan_incl(lid, eq) - eq;
    var eq_room = 0u;
    if (need > eq_seen0) {
        eq_room = need - eq_seen0;
    }
    // This run's first slot: the keys > thr before it, and the keys == thr before it
    // that were taken.
    var w = ob + written0 + gt_ex + min(eq_ex, eq_room);
    var eqs = eq_ex;
    for (var i = a; i < b; i = i + 1u) {
        let key = key_of(scores[sb + i]);
        if (key > thr) {
            idx[w] = base + i;
            w = w + 1u;
        } else if (key == thr) {
            if (eqs < eq_room) {
                idx[w] = base + i;
                w = w + 1u;
            }
            eqs = eqs + 1u;
        }
    }
}
