// FP8 e4m3fn (1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits; no infinities,
// largest finite value 448): decoding for FP8 weights (quant.wgsl) and FP8 latent cache rows
// (mla.wgsl), encoding for the cache writer (cache.wgsl). src/kernels/cache.rs has the same
// conversions on the CPU for the tests.

// The e4m3fn value of the low byte of v. Subnormals are computed as m · 2⁻⁹, so the
// result does not depend on how the device treats f32 denormals.
fn e4m3(v: u32) -> f32 {
    let e = (v >> 3u) & 15u;
    let m = v & 7u;
    var a = f32(m) * 0.001953125;
    if (e != 0u) {
        a = bitcast<f32>(((e + 120u) << 23u) | (m << 20u));
    }
    return select(a, -a, (v & 0x80u) != 0u);
}

// The e4m3fn code (low byte) nearest to x, ties to even, saturating at ±448.
fn e4m3_encode(x: f32) -> u32 {
    let s = select(0u, 0x80u, x < 0.0);
    let a = min(abs(x), 448.0);
    if (a < 0.015625) {
        // Subnormal codes 0..7 step 2⁻⁹; 8 rounds up to the smallest normal, code 8.
        return u32(round(a * 512.0)) | s;
    }
    let bits = bitcast<u32>(a);
    let frac = bitcast<f32>((bits & 0x007fffffu) | 0x3f800000u);
    var m = u32(round((frac - 1.0) * 8.0));
    var eb = (bits >> 23u) - 120u;
    if (m == 8u) {
        m = 0u;
        eb = eb + 1u;
    }
    return min((eb << 3u) | m, 0x7eu) | s;
}
