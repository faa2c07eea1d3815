// ---- The integer-dot GEMVs' reductions over a row group's lanes, in workgroup memory ------
// (matmul_dot's portable module; dot_red_sg.wgsl is the same through subgroup shuffles.)

// gemv_dot / gemv_dot_experts: reduces the lanes' partial dots of a quad of weight rows and
// stores the rows that exist (quad_store's tree in `red`).
fn dot_store(acc: vec4<f32>, wo: vec4<u32>, base: u32, n0: u32, lid: u32) {
    quad_store(acc, wo, base, n0, lid);
}

// Reduces quad i's acc_t over each row group's lanes and stores its rows (those in `wo`,
// from n0) of each x row t < nx at ybase[t] (P.accumulate: added to y). Workgroup-uniform:
// the reductions run for all T rows.
fn rows_store_quad(i: u32, wo: vec4<u32>, n0: u32, lid: u32) {
    for (var t = 0u; t < T; t += 2u) {
        var b = vec4<f32>(0.0);
        if (t + 1u < T) {
            b = acc_t[i * T + t + 1u];
        }
        let r = reduce_pair(acc_t[i * T + t], b, lid);
        if (lid % TPR4 == 0u) {
            if (t < nx) {
                store_quad(r.lo, wo, ybase[t] + n0);
            }
            if (t + 1u < nx) {
                store_quad(r.hi, wo, ybase[t + 1u] + n0);
            }
        }
    }
}

