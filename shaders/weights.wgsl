// Weight decoding shared by every kernel that reads weights in their stored dtype
// (prepended to embed.wgsl, matmul.wgsl and attention.wgsl by src/kernels/mod.rs).
// Weights are bound as array<u32>. W_DTYPE: 0 = f32 (element i is word i); 1 = bf16 and
// 2 = f16 (16-bit element i lives in word i >> 1, the even element in the low half);
// 3 = FP8 and 4 = q8 (byte i in word i >> 2), 5 = q4 (nibble i in word i >> 3); those are
// decoded by quant.wgsl.

// The word that holds element i.
fn w_word(i: u32) -> u32 {
    if (W_DTYPE == 0u) {
        return i;
    }
    if (W_DTYPE == 3u || W_DTYPE == 4u) {
        return i >> 2u;
    }
    if (W_DTYPE == 5u) {
        return i >> 3u;
    }
    return i >> 1u;
}

// Element i, given the word that holds it.
fn w_elem(word: u32, i: u32) -> f32 {
    if (W_DTYPE == 0u) {
        return bitcast<f32>(word);
    }
    if (W_DTYPE == 1u) {
        return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
    }
    return unpack2x16float(word)[i & 1u];
}

// Both 16-bit elements of one word (W_DTYPE 1 or 2), even element first.
fn w_pair(word: u32) -> vec2<f32> {
    if (W_DTYPE == 1u) {
        return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
    }
    return unpack2x16float(word);
}

