// mla_cpu_sg: mla_cpu with the selected rows shared through the subgroup instead of
// workgroup memory (CPU adapters whose subgroups hold a whole workgroup of CPU_WG
// invocations). llvmpipe (Mesa 22.3) loads from workgroup memory with a loop over the SIMD
// lanes, even where every lane reads the same address, and mla_cpu read each staged row
// twice per head (its logit and its weighted sum); here invocation lid keeps position
// j0 + lid's row in registers and each head takes it by subgroupShuffle, once. No barrier
// in the loop.
@compute @workgroup_size(CPU_WG)
fn mla_cpu_sg(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
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
        let pos = cpu_pos(t, j0 + lid, j_end);
        var mine: array<vec4<f32>, QD4>;
        if (pos != ABSENT) {
            let base = P.c_off + (pos - P.seg_lo) * P.c_stride;
            for (var d4 = 0u; d4 < QD4; d4++) {
                mine[d4] = row4(base, d4 * 4u);
            }
        }
        let staged = min(CPU_WG, j_end - j0);
        for (var i = 0u; i < staged; i++) {
            let present = subgroupShuffle(pos, i) != ABSENT;
            var r: array<vec4<f32>, QD4>;
            for (var d4 = 0u; d4 < QD4; d4++) {
                r[d4] = subgroupShuffle(mine[d4], i);
            }
            if (present) {
                online_add(&o, &q, &r);
            }
        }
    }
    if (at.head < P.heads) {
        cpu_store(at, &o);
    }
}
