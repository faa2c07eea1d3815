// Shared by sample.wgsl and spec.wgsl (prepended to both, after sample_key.wgsl): one
// workgroup's argmax of a slice of a row, by the host's order. The including file declares
// WG (the workgroup's invocations) and `row_bits(i)`, element i of the rows as f32 bits.

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

// The winner of elements start .. end of the row at row_bits(x0 ..) into wkey[0], widx[0] (an
// empty slice keeps (0, 0xffffffff), which loses to every real element). Uniform control
// flow only.
fn reduce_slice(x0: u32, start: u32, end: u32, lid: u32) {
    var bk = 0u;
    var bi = 0xffffffffu;
    for (var i = start + lid; i < end; i = i + WG) {
        let k = order_key(row_bits(x0 + i));
        if (wins(k, i, bk, bi)) {
            bk = k;
            bi = i;
        }
    }
    reduce(lid, bk, bi);
}
