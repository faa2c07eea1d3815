// The GEMM tile of `gemm` and `gemm_experts` on adapters without the tensor-core path
// (matmul_coop.wgsl): f32 FMAs, `tile64` in matmul.wgsl.
fn tile(xr: vec4<u32>, wr: vec2<u32>, lid: u32) -> Acc16 {
    return tile64(xr, wr, lid);
}
