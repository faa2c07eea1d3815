// x for the tensor-core tile (matmul_coop.wgsl) element by element, for x rows off 4-float
// boundaries or K not a multiple of 4: elements k .. k + 3 of the row at `row` (NONE: zeros;
// zeros past K).
fn xquad(row: u32, k: u32) -> vec4<f32> {
    var q = vec4<f32>(0.0);
    if (row == NONE) {
        return q;
    }
    for (var j = 0u; j < 4u; j++) {
        if (k + j < P.k) {
            q[j] = x[row + k + j];
        }
    }
    return q;
}

// A_GLOBAL's A fragments (matmul_coop.wgsl) come from coop_xh.wgsl's module only: here a
// value the tile never uses (it starts its queue with it), without a load.
fn a_frag(row: u32, i: u32) -> coop_mat16x16<f16, A> {
    var a: coop_mat16x16<f16, A>;
    return a;
}
