// x for the tensor-core tile (matmul_coop.wgsl) in 16-byte loads, for x rows that start on
// 4-float boundaries with K a multiple of 4 (kernels/matmul.rs checks): elements k .. k + 3
// of the row at `row` (k a multiple of 4; NONE: zeros; zeros past K).
fn xquad(row: u32, k: u32) -> vec4<f32> {
    if (row == NONE || k >= P.k) {
        return vec4<f32>(0.0);
    }
    return x4[(row + k) / 4u];
}

// A_GLOBAL's A fragments (matmul_coop.wgsl) come from coop_xh.wgsl's module only: here a
// value the tile never uses (it starts its queue with it), without a load.
fn a_frag(row: u32, i: u32) -> coop_mat16x16<f16, A> {
    var a: coop_mat16x16<f16, A>;
    return a;
}
