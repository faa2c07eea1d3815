// The GEMM tile of `gemm`, `gemm_experts` and `gemm_heads` on adapters without the
// tensor-core path (matmul_coop.wgsl): f32 FMAs, `tile64` in matmul.wgsl, 64 columns.
const TN: u32 = 64u;
// Rows of the tile: 64 (128 is the tensor-core tile's, where x is one f16 value).
const TM: u32 = 64u;

// One 64 × TN output tile over the whole K: `xr[p]` the x offset of tile row
// `lid / 16 + 16 p`, `wr[q]` the weight offset of tile column `lid / 8 + 32 q` (NONE = zero
// row); the result as TN / 64 blocks of 64 columns in tile64's layout. K runs to `kend`
// (≤ P.k; past it x or the weights are zero).
fn tile(xr: array<u32, TM / 16u>, wr: array<u32, TN / 32u>, lid: u32, kend: u32) -> array<Acc16, TM / 64u * (TN / 64u)> {
    let x4 = vec4<u32>(xr[0], xr[1], xr[2], xr[3]);
    return array<Acc16, 1>(tile64(x4, vec2<u32>(wr[0], wr[1]), lid, kend));
}
