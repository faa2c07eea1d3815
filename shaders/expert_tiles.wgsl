// The routed experts' row tiles for `gemm_experts` (matmul.wgsl): one workgroup sorts a
// chunk's slots by expert and cuts each expert's slots into tiles of up to P.tm rows, so
// that the GEMM runs one workgroup per (tile, column block) instead of one per (expert,
// column block) walking all of its expert's rows in turn. The workgroups of one column
// block's tiles then read the same weights at about the same time (the walk kept a block of
// every expert's weights in flight, more than the L2 cache holds on a big GPU), and a row
// tile no longer waits for its expert's others.
//
// Output (binding 2, u32): [0] the tile count; tile i at 1 + 3 i: (expert, first entry of
// the sorted list, rows); the sorted list from P.list: the slots of expert 0, then of expert
// 1, ... Within an expert the slots' order depends on the atomics, which does not change a
// result: each output row of a tile is its own row's products.
//
// Params (binding 0): declared once, in src/kernels/matmul.rs (`TileParams`, named Params here).

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> experts: array<u32>;
@group(0) @binding(2) var<storage, read_write> table: array<u32>;

const WG: u32 = 256u;
const MAX_EXPERTS: u32 = 1024u;     // kernels/matmul.rs: EXPERT_TILES_MAX
const PER: u32 = MAX_EXPERTS / WG;  // experts each invocation counts and cuts

var<workgroup> count: array<atomic<u32>, MAX_EXPERTS>;
// Invocation i's sums of slots and of tiles over its PER experts, then their inclusive scan.
var<workgroup> sums: array<vec2<u32>, WG>;

@compute @workgroup_size(256)
fn expert_tiles(@builtin(local_invocation_index) lid: u32) {
    for (var i = 0u; i < PER; i++) {
        atomicStore(&count[lid * PER + i], 0u);
    }
    workgroupBarrier();
    for (var s = lid; s < P.slots; s += WG) {
        let e = experts[s];
        if (e < P.n_experts) {
            atomicAdd(&count[e], 1u);
        }
    }
    workgroupBarrier();
    // Slots and tiles of this invocation's experts, then the scan over invocations.
    var own = vec2<u32>(0u);
    for (var i = 0u; i < PER; i++) {
        let c = atomicLoad(&count[lid * PER + i]);
        own += vec2<u32>(c, (c + P.tm - 1u) / P.tm);
    }
    sums[lid] = own;
    workgroupBarrier();
    for (var d = 1u; d < WG; d *= 2u) {
        var v = sums[lid];
        if (lid >= d) {
            v += sums[lid - d];
        }
        workgroupBarrier();
        sums[lid] = v;
        workgroupBarrier();
    }
    // This invocation's first slot entry and tile; its experts' tiles, and their cursors.
    var at = sums[lid] - own;
    for (var i = 0u; i < PER; i++) {
        let e = lid * PER + i;
        let c = atomicLoad(&count[e]);
        for (var r = 0u; r < c; r += P.tm) {
            let t = 1u + 3u * at.y;
            table[t] = e;
            table[t + 1u] = at.x + r;
            table[t + 2u] = min(P.tm, c - r);
            at.y += 1u;
        }
        at.x += c;
    }
    if (lid == WG - 1u) {
        table[0] = at.y;
    }
    workgroupBarrier();
    // The cursors: each expert's first entry (the exclusive scan of the counts).
    var first = sums[lid].x - own.x;
    for (var i = 0u; i < PER; i++) {
        let e = lid * PER + i;
        let c = atomicLoad(&count[e]);
        atomicStore(&count[e], first);
        first += c;
    }
    workgroupBarrier();
    for (var s = lid; s < P.slots; s += WG) {
        let e = experts[s];
        if (e < P.n_experts) {
            table[P.list + atomicAdd(&count[e], 1u)] = s;
        }
    }
}
