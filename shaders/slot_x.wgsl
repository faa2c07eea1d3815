// The x offset of routed slot s, choice s % P.topk of token row s / P.topk: the token's row
// (rows P.x_stride apart from P.x_off), or where P.x_per_slot is set a row per slot (the
// token rows P.x_row apart where given, else P.topk · P.x_stride; a token's slots P.x_stride
// apart). For the matmul modules and x_to_f16.wgsl, whose params both name these fields.
fn slot_x(s: u32) -> u32 {
    let t = s / P.topk;
    if (P.x_per_slot == 0u) {
        return P.x_off + t * P.x_stride;
    }
    var row = P.topk * P.x_stride;
    if (P.x_row != 0u) {
        row = P.x_row;
    }
    return P.x_off + t * row + (s % P.topk) * P.x_stride;
}
