// x for the tensor-core tile (matmul_coop.wgsl) as f16 rows loaded straight into A
// fragments (A_GLOBAL: the dense `gemm` with SPARSA_COOP_A_GLOBAL=1): binding 1 holds the
// copy x_to_f16.wgsl writes, rows P.x_stride f16 elements apart, whole K-steps and tiles.

@group(0) @binding(1) var<storage, read> xh: array<f16>;

// The A fragment of the 16 x rows from f16 offset `row` and K-columns 16 i .. (row NONE:
// row 0's, for outputs that are not stored).
fn a_frag(row: u32, i: u32) -> coop_mat16x16<f16, A> {
    let r = select(row, 0u, row == NONE);
    return coopLoadT<coop_mat16x16<f16, A>>(&xh[r + 16u * i], P.x_stride);
}

// The staging's x quads: none (A_GLOBAL stages no x).
fn xquad(row: u32, k: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}
