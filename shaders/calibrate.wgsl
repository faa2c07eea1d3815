// Peak-rate probes for `sparsa bench --calibrate`.
//   copy: dst[i] = src[i] over vec4s, grid-stride (the memory bandwidth a kernel can reach).
//   fma_rate: every invocation runs `iters` rounds of 32 fused multiply-adds on 8 independent
//        chains (64 FLOP per round per invocation) in registers, then stores one value so nothing is dead code.
//        The multiplier and addend come from the uniform, so the compiler cannot fold them.

// Params (binding 0): declared once, in src/bench.rs (`CalibrateParams`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> src: array<vec4<f32>>;

@compute @workgroup_size(256)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = P.iters;
    let step = nwg.x * 256u;
    for (var i = gid.x; i < n; i = i + step) {
        dst[i] = src[i];
    }
}

@compute @workgroup_size(256)
fn fma_rate(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    var x0 = f32(i & 7u) * 1e-3;
    var x1 = x0 + 0.1;
    var x2 = x0 + 0.2;
    var x3 = x0 + 0.3;
    var x4 = x0 + 0.4;
    var x5 = x0 + 0.5;
    var x6 = x0 + 0.6;
    var x7 = x0 + 0.7;
    let a = P.a;
    let b = P.b;
    // Each round: 8 chains, 4 steps each (32 FMA between loop tests).
    for (var r = 0u; r < P.iters; r = r + 1u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            x0 = fma(x0, a, b);
            x1 = fma(x1, a, b);
            x2 = fma(x2, a, b);
            x3 = fma(x3, a, b);
            x4 = fma(x4, a, b);
            x5 = fma(x5, a, b);
            x6 = fma(x6, a, b);
            x7 = fma(x7, a, b);
        }
    }
    let s = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
    if (s == 12345.678) {
        out[0] = s;
    }
}
