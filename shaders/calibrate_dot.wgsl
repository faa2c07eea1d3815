// Peak-rate probe for `sparsa bench --calibrate`, in a module of its own (browsers without
// WGSL's packed_4x8_integer_dot_product still compile calibrate.wgsl).
//   dot_rate: every invocation runs `iters` rounds of 32 packed 8-bit integer dot products
//        (dot4I8Packed, what the integer-dot GEMVs run) on 8 independent accumulator chains,
//        then stores one value so nothing is dead code. The operands come from the uniform
//        and the invocation index, so the compiler cannot fold them.

// Params (binding 0): declared once, in src/bench.rs (`CalibrateParams`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn dot_rate(@builtin(global_invocation_id) gid: vec3<u32>,
            @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    let b = bitcast<u32>(P.b);
    var s0 = i32(i);
    var s1 = s0 + 1;
    var s2 = s0 + 2;
    var s3 = s0 + 3;
    var s4 = s0 + 4;
    var s5 = s0 + 5;
    var s6 = s0 + 6;
    var s7 = s0 + 7;
    // Each round: 8 chains, 4 steps each (32 dot products between loop tests). Each step is
    // one instruction where the device has one: the chain's value is both the first operand
    // and the addend.
    for (var r = 0u; r < P.iters; r = r + 1u) {
        for (var k = 0u; k < 4u; k = k + 1u) {
            s0 += dot4I8Packed(u32(s0), b);
            s1 += dot4I8Packed(u32(s1), b);
            s2 += dot4I8Packed(u32(s2), b);
            s3 += dot4I8Packed(u32(s3), b);
            s4 += dot4I8Packed(u32(s4), b);
            s5 += dot4I8Packed(u32(s5), b);
            s6 += dot4I8Packed(u32(s6), b);
            s7 += dot4I8Packed(u32(s7), b);
        }
    }
    let s = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    if (s == 12345678) {
        out[0] = f32(s);
    }
}
