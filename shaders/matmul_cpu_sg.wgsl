// gemv_cpu_sg: gemv_cpu (matmul.wgsl) for several x rows on CPU adapters with subgroups, one
// lane group per row group (TPR4 = 1), so that every lane walks the same 16-byte words of
// K. Lane t of a subgroup loads x row t's floats of the word and the other lanes take them
// by subgroupShuffle: one load of each x float per subgroup instead of one per lane. On
// llvmpipe every load from a storage buffer is a loop over the SIMD lanes, whatever its
// address, and the T rows of x loaded by each lane were half of gemv_cpu's time at 8 rows
// (a build that left them out ran it in 4.5 against 9.7 ms a step); a shuffle there is a
// few register moves. Needs subgroups of at least T lanes (kernels/matmul.rs checks). Its
// own module: adapters without subgroups still compile matmul.wgsl.

// x row t's floats of a word, from the subgroup lane that loaded them.
fn shuffle_x(mine: X8, t: u32) -> X8 {
    let z = vec4<f32>(0.0);
    var x = X8(subgroupShuffle(mine.a, t), z, z, z, z, z, z, z);
    if (EPV > 4u) {
        x.b = subgroupShuffle(mine.b, t);
    }
    if (EPV > 8u) {
        x.c = subgroupShuffle(mine.c, t);
        x.d = subgroupShuffle(mine.d, t);
    }
    if (EPV > 16u) {
        x.e = subgroupShuffle(mine.e, t);
        x.f = subgroupShuffle(mine.f, t);
        x.g = subgroupShuffle(mine.g, t);
        x.h = subgroupShuffle(mine.h, t);
    }
    return x;
}

// cpu_partial with TPR4 = 1 and x shared through the subgroup. Lanes without a live row
// (`oa` all NONE) walk row 0's words and store nothing: every lane must reach the shuffles.
fn cpu_partial_sg(oa: vec4<u32>, ob: vec4<u32>, xb: u32, xs4: u32, sgl: u32) -> QuadsT {
    let z = vec4<f32>(0.0);
    var a = WQ(z, z, z, z, z, z, z, z);
    var b = WQ(z, z, z, z, z, z, z, z);
    let live = oa.x != NONE;
    let sa = select(vec4<u32>(0u), oa, live);
    let sb = select(vec4<u32>(0u), ob, live);
    let own = xb + min(sgl, T - 1u) * xs4;
    let kw = P.k / EPV;
    for (var q = 0u; q < kw; q++) {
        let wa = quad_words(sa, q);
        var wb = wa;
        if (CQ > 1u) {
            wb = quad_words(sb, q);
        }
        let mine = load_xw(own + q * (EPV / 4u));
        let r0 = cpu_row_x(wa, wb, shuffle_x(mine, 0u)); a.a += r0.lo; b.a += r0.hi;
        if (T > 1u) { let r1 = cpu_row_x(wa, wb, shuffle_x(mine, 1u)); a.b += r1.lo; b.b += r1.hi; }
        if (T > 2u) { let r2 = cpu_row_x(wa, wb, shuffle_x(mine, 2u)); a.c += r2.lo; b.c += r2.hi; }
        if (T > 3u) { let r3 = cpu_row_x(wa, wb, shuffle_x(mine, 3u)); a.d += r3.lo; b.d += r3.hi; }
        if (T > 4u) { let r4 = cpu_row_x(wa, wb, shuffle_x(mine, 4u)); a.e += r4.lo; b.e += r4.hi; }
        if (T > 5u) { let r5 = cpu_row_x(wa, wb, shuffle_x(mine, 5u)); a.f += r5.lo; b.f += r5.hi; }
        if (T > 6u) { let r6 = cpu_row_x(wa, wb, shuffle_x(mine, 6u)); a.g += r6.lo; b.g += r6.hi; }
        if (T > 7u) { let r7 = cpu_row_x(wa, wb, shuffle_x(mine, 7u)); a.h += r7.lo; b.h += r7.hi; }
    }
    return QuadsT(a, b);
}

@compute @workgroup_size(WGC)
fn gemv_cpu_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_invocation_id) sgl: u32) {
    let n0 = cpu_row0(wid.x + wid.y * nwg.x, lid);
    let w = dense_quads(n0);
    let l = live_quads(w[0], w[1]);
    cpu_store(cpu_partial_sg(l[0], l[1], P.x_off / 4u, P.x_stride / 4u, sgl), w[0], w[1], P.y_off, n0, lid);
}
