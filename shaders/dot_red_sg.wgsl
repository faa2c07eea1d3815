// ---- The integer-dot GEMVs' reductions over a row group's lanes, through subgroups -------
// dot_red.wgsl's functions without workgroup memory's tree (a barrier a step, two vec4
// loads and stores a lane a step and pair of x rows): the lanes of a row group add their
// partial dots by subgroupShuffleXor, SGR lanes at a time (SGR = min(TPR4, the adapter's
// fewest subgroup lanes), at least 4). Where a row group spans several subgroups (TPR4 >
// SGR), each subgroup's first lane leaves its sums in `sg_red` and the row group's first
// lane adds them: one barrier. The shuffles pair invocation lid with lid ^ m, so this takes
// invocations laid out in subgroups by their local index (lid % subgroup size is the
// subgroup lane), as drivers lay out one-dimensional workgroups.

// The subgroups' sums a workgroup leaves for the row groups' first lanes (one element where
// a subgroup holds whole row groups: TPR4 ≤ SGR).
const SG_PARTS: u32 = max(1u, 256u / SGR * T * min(1u, TPR4 / (2u * SGR)));
var<workgroup> sg_red: array<vec4<f32>, SG_PARTS>;

// v summed over SGR aligned lanes (every one of them gets the sum).
fn sg_sum(v: vec4<f32>) -> vec4<f32> {
    var s = v;
    for (var m = SGR / 2u; m > 0u; m >>= 1u) {
        s += subgroupShuffleXor(s, m);
    }
    return s;
}

// `s` (this lane's subgroup sums of T x rows) summed over the row group's subgroups: in the
// row group's first lane. Workgroup-uniform.
fn sg_parts(s: ptr<function, array<vec4<f32>, T>>, lid: u32) {
    if (TPR4 <= SGR) {
        return;
    }
    if (lid % SGR == 0u) {
        for (var t = 0u; t < T; t++) {
            sg_red[lid / SGR * T + t] = (*s)[t];
        }
    }
    workgroupBarrier();
    if (lid % TPR4 == 0u) {
        for (var t = 0u; t < T; t++) {
            var a = vec4<f32>(0.0);
            for (var p = 0u; p < TPR4 / SGR; p++) {
                a += sg_red[(lid / SGR + p) * T + t];
            }
            (*s)[t] = a;
        }
    }
    workgroupBarrier();
}

// gemv_dot / gemv_dot_experts (T = 1): reduces the lanes' partial dots of a quad of weight
// rows and stores the rows that exist.
fn dot_store(acc: vec4<f32>, wo: vec4<u32>, base: u32, n0: u32, lid: u32) {
    var s: array<vec4<f32>, T>;
    s[0] = sg_sum(acc);
    sg_parts(&s, lid);
    if (lid % TPR4 == 0u) {
        store_quad(s[0], wo, base + n0);
    }
}

// Reduces quad i's acc_t over each row group's lanes and stores its rows (those in `wo`,
// from n0) of each x row t < nx at ybase[t] (P.accumulate: added to y). Workgroup-uniform.
fn rows_store_quad(i: u32, wo: vec4<u32>, n0: u32, lid: u32) {
    var s: array<vec4<f32>, T>;
    for (var t = 0u; t < T; t++) {
        s[t] = sg_sum(acc_t[i * T + t]);
    }
    sg_parts(&s, lid);
    if (lid % TPR4 == 0u) {
        for (var t = 0u; t < T; t++) {
            if (t < nx) {
                store_quad(s[t], wo, ybase[t] + n0);
            }
        }
    }
}
