// Shared by topk.wgsl and topk_wide.wgsl (prepended to both): the order-preserving keys,
// the workgroup prefix sum, and the ordered collection of the selected positions.
// The including file declares WG (= 256), `scores` (u32 bits), `idx` (read_write u32),
// and the workgroup variables `scan: array<u32, WG>` and `bcast: u32`.

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
// them have been seen in the row. `written` and `eq_seen` are the slots already filled and
// the keys == thr already seen before `lo`; slots start at idx[ob]. Uniform control flow.
fn collect_range(lid: u32, sb: u32, lo: u32, hi: u32, ob: u32, thr: u32, need: u32,
                 written0: u32, eq_seen0: u32) {
    var written = written0;
    var eq_seen = eq_seen0;
    for (var base = lo; base < hi; base = base + WG) {
        let i = base + lid;
        var gt = 0u;
        var eq = 0u;
        if (i < hi) {
            let key = key_of(scores[sb + i]);
            gt = select(0u, 1u, key > thr);
            eq = select(0u, 1u, key == thr);
        }
        let packed = gt | (eq << 16u);
        let incl = scan_incl(lid, packed);
        let ex = incl - packed;
        let gt_ex = ex & 0xffffu;
        let eq_ex = ex >> 16u;
        var eq_room = 0u;
        if (need > eq_seen) {
            eq_room = need - eq_seen;
        }
        if (gt == 1u) {
            idx[ob + written + gt_ex + min(eq_ex, eq_room)] = i;
        } else if (eq == 1u && eq_ex < eq_room) {
            idx[ob + written + gt_ex + eq_ex] = i;
        }
        if (lid == WG - 1u) {
            bcast = incl;
        }
        let tot = workgroupUniformLoad(&bcast);
        written = written + (tot & 0xffffu) + min(tot >> 16u, eq_room);
        eq_seen = eq_seen + (tot >> 16u);
    }
}
