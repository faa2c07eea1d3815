// Greedy token selection on the GPU: the index of the largest value of one logits row, with
// the host's rule (`generate::argmax`, as torch.argmax): the lowest index among equal maxima,
// NaN never chosen unless every value is NaN (then 0), -0 equal to +0.
//
// Two passes over P.rows rows (x_stride apart; a batched step picks all its rows at once).
// `argmax_part`: workgroup (g, r) reduces its slice of row r to (key, index) in
// part[2(r · parts + g)] and the word after. `argmax_final` (one workgroup per row) reduces
// row r's P.parts pairs and writes the winning index to io[P.out_off + r], where the next
// step's embedding reads its token.
// Rows of up to 8,192 (src/kernels/sample.rs, ONE_PASS_MAX) take one pass instead:
// `argmax_one`, one workgroup per row, reads the row from io and writes the index to
// part[P.out_off + r].
// order_key and wins come from sample_key.wgsl, reduce and reduce_slice from
// argmax_reduce.wgsl.
// Bindings: 1 = part (u32 pairs; the output ids in argmax_one), 2 = io: the row as f32 bits
// (argmax_part, argmax_one) or the output ids (argmax_final). One binding for both keeps
// each pass's bind group to two buffers.

// Params (binding 0): declared once, in src/kernels/sample.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> part: array<u32>;
@group(0) @binding(2) var<storage, read_write> io: array<u32>;

// Invocations: 256, or 8 on CPU adapters (define SWG), where each of the reduction's
// barriers switches through every SIMD slice of 8 (3 levels of one slice instead of 8 of 32).
const WG: u32 = SWG;

// argmax_reduce.wgsl reads the rows from io.
fn row_bits(i: u32) -> u32 {
    return io[i];
}

@compute @workgroup_size(SWG)
fn argmax_part(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = wid.x;
    let r = wid.y;
    let start = g * P.per_part;
    reduce_slice(P.x_off + r * P.x_stride, start, min(start + P.per_part, P.n), lid);
    if (lid == 0u) {
        let at = 2u * (r * P.parts + g);
        part[at] = wkey[0];
        part[at + 1u] = widx[0];
    }
}

@compute @workgroup_size(SWG)
fn argmax_final(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    var bk = 0u;
    var bi = 0xffffffffu;
    for (var g = lid; g < P.parts; g = g + WG) {
        let at = 2u * (r * P.parts + g);
        let k = part[at];
        let i = part[at + 1u];
        if (wins(k, i, bk, bi)) {
            bk = k;
            bi = i;
        }
    }
    reduce(lid, bk, bi);
    if (lid == 0u) {
        io[P.out_off + r] = widx[0];
    }
}

@compute @workgroup_size(SWG)
fn argmax_one(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    reduce_slice(P.x_off + r * P.x_stride, 0u, P.n, lid);
    if (lid == 0u) {
        part[P.out_off + r] = widx[0];
    }
}
