// Greedy token selection on the GPU: the index of the largest value of one logits row, with
// the host's rule (`generate::argmax`, as torch.argmax): the lowest index among equal maxima,
// NaN never chosen unless every value is NaN (then 0), -0 equal to +0.
//
// Two passes. `argmax_part`: workgroup g reduces its slice of the row to (key, index) in
// part[2g], part[2g + 1]. `argmax_final` (one workgroup) reduces the P.parts pairs and writes
// the winning index to io[P.out_off], where the next step's embedding reads its token.
// order_key and wins come from sample_key.wgsl.
// Bindings: 1 = part (u32 pairs), 2 = io: the row as f32 bits (argmax_part) or the output
// ids (argmax_final). One binding for both keeps each pass's bind group to two buffers.

// Params (binding 0): declared once, in src/kernels/sample.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> part: array<u32>;
@group(0) @binding(2) var<storage, read_write> io: array<u32>;

const WG: u32 = 256u;

var<workgroup> wkey: array<u32, WG>;
var<workgroup> widx: array<u32, WG>;

// Tree reduction of this invocation's (k, i) over the workgroup; lane 0 gets the winner.
fn reduce(lid: u32, k: u32, i: u32) {
    wkey[lid] = k;
    widx[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s && wins(wkey[lid + s], widx[lid + s], wkey[lid], widx[lid])) {
            wkey[lid] = wkey[lid + s];
            widx[lid] = widx[lid + s];
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn argmax_part(@builtin(workgroup_id) wid: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = wid.x;
    let start = g * P.per_part;
    let end = min(start + P.per_part, P.n);
    // An empty slice keeps (0, 0xffffffff), which loses to every real element.
    var bk = 0u;
    var bi = 0xffffffffu;
    for (var i = start + lid; i < end; i = i + WG) {
        let k = order_key(io[P.x_off + i]);
        if (wins(k, i, bk, bi)) {
            bk = k;
            bi = i;
        }
    }
    reduce(lid, bk, bi);
    if (lid == 0u) {
        part[2u * g] = wkey[0];
        part[2u * g + 1u] = widx[0];
    }
}

@compute @workgroup_size(256)
fn argmax_final(@builtin(local_invocation_index) lid: u32) {
    var bk = 0u;
    var bi = 0xffffffffu;
    for (var g = lid; g < P.parts; g = g + WG) {
        let k = part[2u * g];
        let i = part[2u * g + 1u];
        if (wins(k, i, bk, bi)) {
            bk = k;
            bi = i;
        }
    }
    reduce(lid, bk, bi);
    if (lid == 0u) {
        io[P.out_off] = widx[0];
    }
}
