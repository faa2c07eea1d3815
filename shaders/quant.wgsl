// Quantized weight decoding (prepended after weights.wgsl and fp8.wgsl to matmul.wgsl and
// attention.wgsl;
// each declares `wscale: array<u32>`, the chunk's scales).
//
// W_DTYPE 3 = FP8 e4m3fn, 4 = q8 (int8), 5 = q4 (nibble − 8). Rows are padded to a multiple
// of QB elements; element i of a chunk is scaled by scale i / QB. S_BF16 = 1: scales are
// bf16 pairs (q8, q4); 0: f32 (FP8). See src/weights/quant.rs for the file formats.

fn q_scale(b: u32) -> f32 {
    if (S_BF16 == 1u) {
        return bitcast<f32>((wscale[b >> 1u] >> ((b & 1u) * 16u)) << 16u);
    }
    return bitcast<f32>(wscale[b]);
}

// Unscaled element i of a quantized chunk, given the word that holds it.
fn q_raw(word: u32, i: u32) -> f32 {
    if (W_DTYPE == 3u) {
        return e4m3(word >> ((i & 3u) * 8u));
    }
    if (W_DTYPE == 4u) {
        return f32(bitcast<i32>(word << (24u - (i & 3u) * 8u)) >> 24u);
    }
    return f32((word >> ((i & 7u) * 4u)) & 15u) - 8.0;
}

// Element i of a chunk in any format, given the word that holds it.
fn w_any(word: u32, i: u32) -> f32 {
    if (W_DTYPE >= 3u) {
        return q_raw(word, i) * q_scale(i / QB);
    }
    return w_elem(word, i);
}

// Integer codes become floats without an int-to-float conversion (a slow instruction on
// some GPUs): code bits OR 2^23's exponent is the float 2^23 + code, and subtracting
// 2^23 + offset leaves code - offset exactly.
const MAGIC: u32 = 0x4B000000u;

// Four consecutive elements of one 32-bit word of 8-bit codes (FP8 or q8), unscaled.
fn q_bytes4(u: u32) -> vec4<f32> {
    if (W_DTYPE == 3u) {
        return vec4<f32>(e4m3(u), e4m3(u >> 8u), e4m3(u >> 16u), e4m3(u >> 24u));
    }
    // int8 b: (b ^ 0x80) is b + 128 as an unsigned byte.
    let b = ((vec4<u32>(u, u >> 8u, u >> 16u, u >> 24u) & vec4<u32>(255u)) ^ vec4<u32>(128u)) | vec4<u32>(MAGIC);
    return bitcast<vec4<f32>>(b) - vec4<f32>(8388736.0);
}

// Elements 0..3 (lo) or 4..7 (hi) of one 32-bit word of q4 nibbles, unscaled (nibble - 8).
fn q_nib_lo(u: u32) -> vec4<f32> {
    let b = (vec4<u32>(u, u >> 4u, u >> 8u, u >> 12u) & vec4<u32>(15u)) | vec4<u32>(MAGIC);
    return bitcast<vec4<f32>>(b) - vec4<f32>(8388616.0);
}
fn q_nib_hi(u: u32) -> vec4<f32> {
    let b = (vec4<u32>(u >> 16u, u >> 20u, u >> 24u, u >> 28u) & vec4<u32>(15u)) | vec4<u32>(MAGIC);
    return bitcast<vec4<f32>>(b) - vec4<f32>(8388616.0);
}
