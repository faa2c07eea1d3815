// Rotary position embedding's pairing and rotation, shared by rope.wgsl and the cache
// writers that rotate rows themselves (cache.wgsl).

// The two dims frequency i rotates, from rot_off: (2i, 2i + 1) interleaved, else the
// half-split pair (i, i + half) (NeoX).
fn rotary_dims(i: u32, rot_off: u32, half: u32, interleave: bool) -> vec2<u32> {
    if (interleave) {
        return vec2<u32>(rot_off + 2u * i, rot_off + 2u * i + 1u);
    }
    return vec2<u32>(rot_off + i, rot_off + i + half);
}

// (a, b) rotated: (a cos − b sin, b cos + a sin).
fn rotary(a: f32, b: f32, c: f32, s: f32) -> vec2<f32> {
    return vec2<f32>(a * c - b * s, b * c + a * s);
}
