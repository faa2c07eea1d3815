enable f16;
enable wgpu_cooperative_matrix;

// Tensor-core peak probe for `sparsa bench --calibrate`, on devices whose GEMM tile runs on
// cooperative matrices (kernels/matmul.rs: 16×16×16, f16 inputs, f32 accumulation, subgroups
// of 32), in a module of its own (only those devices compile it).
//   mma_rate: each subgroup loads one A and one B matrix once, then runs `iters` rounds of
//        8 multiply-adds on 4 independent accumulators, and stores them so nothing is dead
//        code. The values come from the uniform, so the compiler cannot fold them.

// Params (binding 0): declared once, in src/bench.rs (`CalibrateParams`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

var<workgroup> ab: array<f16, 512>;     // A, then B: 16 × 16 each
var<workgroup> cs: array<f32, 1024>;    // the 4 accumulators (every subgroup's, overlapping)

@compute @workgroup_size(256)
fn mma_rate(@builtin(local_invocation_index) lid: u32) {
    ab[lid] = f16(P.b * f32(lid % 7u));
    ab[256u + lid] = f16(P.a - P.b * f32(lid % 5u));
    // The accumulators start from zeros in memory (see matmul_coop.wgsl's `tile`).
    for (var i = lid; i < 1024u; i += 256u) {
        cs[i] = 0.0;
    }
    workgroupBarrier();
    let a = coopLoad<coop_mat16x16<f16, A>>(&ab[0], 16u);
    let b = coopLoad<coop_mat16x16<f16, B>>(&ab[256], 16u);
    var c0 = coopLoad<coop_mat16x16<f32, C>>(&cs[0], 16u);
    var c1 = coopLoad<coop_mat16x16<f32, C>>(&cs[256], 16u);
    var c2 = coopLoad<coop_mat16x16<f32, C>>(&cs[512], 16u);
    var c3 = coopLoad<coop_mat16x16<f32, C>>(&cs[768], 16u);
    workgroupBarrier();
    for (var r = 0u; r < P.iters; r = r + 1u) {
        c0 = coopMultiplyAdd(a, b, c0);
        c1 = coopMultiplyAdd(a, b, c1);
        c2 = coopMultiplyAdd(a, b, c2);
        c3 = coopMultiplyAdd(a, b, c3);
        c0 = coopMultiplyAdd(a, b, c0);
        c1 = coopMultiplyAdd(a, b, c1);
        c2 = coopMultiplyAdd(a, b, c2);
        c3 = coopMultiplyAdd(a, b, c3);
    }
    coopStore(c0, &cs[0], 16u);
    coopStore(c1, &cs[256], 16u);
    coopStore(c2, &cs[512], 16u);
    coopStore(c3, &cs[768], 16u);
    workgroupBarrier();
    let s = cs[lid] + cs[256u + lid] + cs[512u + lid] + cs[768u + lid];
    if (s == 12345678.0) {
        out[0] = s;
    }
}
