// Shared by sample.wgsl and sample_pick.wgsl (prepended to both): the host argmax's order.

// Order-preserving key of f32 bits (larger float, larger key; -0 == +0); NaN is 0, below
// every number (-inf is 0x007fffff).
fn order_key(bits: u32) -> u32 {
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return 0u;
    }
    var b = bits;
    if (b == 0x80000000u) {
        b = 0u;
    }
    if ((b & 0x80000000u) != 0u) {
        return ~b;
    }
    return b | 0x80000000u;
}

// Whether (ka, ia) wins over (kb, ib): the larger key, then the lower index.
fn wins(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    return ka > kb || (ka == kb && ia < ib);
}
