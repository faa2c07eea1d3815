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

// For a kernel that rotates values as it reads them (queries: mla.wgsl, indexer.wgsl):
// element j (< 2 · half) of the rotated slice belongs to frequency .x, its pair partner is
// element .y, and .z = 1 where j is the pair's first element (a in `rotary`).
fn rotary_partner(j: u32, half: u32, interleave: bool) -> vec3<u32> {
    if (interleave) {
        return vec3<u32>(j / 2u, j ^ 1u, u32((j & 1u) == 0u));
    }
    if (j < half) {
        return vec3<u32>(j, j + half, 1u);
    }
    return vec3<u32>(j - half, j - half, 0u);
}

// Element v of a pair rotated, its partner o: `rotary`'s arithmetic for one side.
fn rotary_one(v: f32, o: f32, c: f32, s: f32, first: bool) -> f32 {
    if (first) {
        return v * c - o * s;
    }
    return v * c + o * s;
}
