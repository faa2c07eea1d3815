// A GEMM on tensor cores with no staging through workgroup memory (after matmul_coop.wgsl,
// whose split_f16, q4_pairs and LO_SCALE it uses): x split beforehand into f16 hi and lo
// planes (`split_x`), the weights decoded beforehand into f16 rows (`dequant_w`), and each
// subgroup loading its matrices straight from those buffers.
//
// Layouts (elements of f16): x planes [Mp rows][P.ws], hi from 0, lo (times LO_SCALE) from
// P.row0; weights [n][P.ws]. P.ws is a multiple of 16 and at least P.k; x's columns past
// P.k and rows past P.rows are zeros, so every matrix load is whole.
//
// Routed experts (`sort_slots`, `split_x_sorted`, `gemm_direct_experts`): the slots are
// sorted by expert into plane rows, each expert's run starting on a multiple of 64 (so a
// workgroup's 64 rows share an expert). `ord` (u32, R = P.crow rows): ord[i] the slot of
// plane row i (NONE for padding), ord[R + t] the expert of row tile t, ord[R + R / 64] the
// rows used.

@group(0) @binding(1) var<storage, read> xa: array<f16>;
@group(0) @binding(2) var<storage, read> wb: array<f16>;
@group(0) @binding(3) var<storage, read_write> yh: array<vec2<f16>>;
@group(0) @binding(3) var<storage, read_write> ord_out: array<u32>;
@group(0) @binding(4) var<storage, read> ord: array<u32>;

// Pair p of the planes (P.crow rows of P.ws) from x at element `at` (NONE: zeros), its
// column c.
fn split_pair(p: u32, at: u32, c: u32) {
    var v = vec2<f32>(0.0);
    if (at != NONE) {
        if (c < P.k) {
            v.x = x[at];
        }
        if (c + 1u < P.k) {
            v.y = x[at + 1u];
        }
    }
    // Binding 2 (the weights) is in these entries' layouts: the recorder binds buffers in order.
    if (P.accumulate == 0xb0b0u) {
        v.x += f32(w[0]);
    }
    let s = split_f16(v);
    yh[p] = s.hi;
    yh[P.row0 / 2u + p] = s.lo;
}

// split_x: pair p of the planes, from x rows P.rows of P.k at P.x_off, P.x_stride apart.
@compute @workgroup_size(256)
fn split_x(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let p = (wid.x + wid.y * nwg.x) * 256u + lid;
    let half_ws = P.ws / 2u;
    if (p >= P.crow * half_ws) {
        return;
    }
    let r = p / half_ws;
    let c = 2u * (p % half_ws);
    var at = NONE;
    if (r < P.rows) {
        at = P.x_off + r * P.x_stride + c;
    }
    split_pair(p, at, c);
}

// split_x_sorted: pair p of the planes, plane row r from slot ord[r]'s x row (`slot_x`);
// rows past those used are left as they are.
@compute @workgroup_size(256)
fn split_x_sorted(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let p = (wid.x + wid.y * nwg.x) * 256u + lid;
    let half_ws = P.ws / 2u;
    let r = p / half_ws;
    if (r >= ord[P.crow + P.crow / 64u]) {
        return;
    }
    let c = 2u * (p % half_ws);
    let s = ord[r];
    var at = NONE;
    if (s != NONE) {
        at = slot_x(s) + c;
    }
    split_pair(p, at, c);
}

var<workgroup> e_cnt: array<atomic<u32>, 256>;
var<workgroup> e_off: array<u32, 257>;

// sort_slots (one workgroup): the P.rows slots (experts from binding 5, P.n_experts ≤ 256
// of them) sorted by expert into `ord_out` (layout above).
@compute @workgroup_size(256)
fn sort_slots(@builtin(local_invocation_index) lid: u32) {
    // Bindings 1, 2 and 4 are in this entry's layout: the recorder binds buffers in order.
    if (P.accumulate == 0xb0b0u) {
        ord_out[0] = bitcast<u32>(x[0]) + w[0] + wscale[0];
    }
    atomicStore(&e_cnt[lid], 0u);
    workgroupBarrier();
    for (var s = lid; s < P.rows; s += 256u) {
        let e = live_expert(s);
        if (e != NONE) {
            atomicAdd(&e_cnt[e], 1u);
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        var o = 0u;
        for (var e = 0u; e < P.n_experts; e++) {
            e_off[e] = o;
            o += (atomicLoad(&e_cnt[e]) + 63u) / 64u * 64u;
        }
        e_off[P.n_experts] = o;
    }
    workgroupBarrier();
    let total = e_off[P.n_experts];
    let tiles = P.crow / 64u;
    for (var i = lid; i < total; i += 256u) {
        ord_out[i] = NONE;
    }
    for (var t = lid; t < total / 64u; t += 256u) {
        var e = 0u;
        while (e_off[e + 1u] <= 64u * t) {
            e++;
        }
        ord_out[P.crow + t] = e;
    }
    if (lid == 0u) {
        ord_out[P.crow + tiles] = total;
    }
    atomicStore(&e_cnt[lid], 0u);
    storageBarrier();
    workgroupBarrier();
    for (var s = lid; s < P.rows; s += 256u) {
        let e = live_expert(s);
        if (e != NONE) {
            ord_out[e_off[e] + atomicAdd(&e_cnt[e], 1u)] = s;
        }
    }
}

// dequant_w: q4 word i of P.n rows of P.ws elements from element P.x_off of the chunk, as 4
// f16 pairs.
@compute @workgroup_size(256)
fn dequant_w(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= P.n * P.ws / 8u) {
        return;
    }
    let e = P.x_off + 8u * i;
    var scale = q_scale(e / QB);
    // Binding 1 (x) is in this entry's layout: the recorder binds buffers in order.
    if (P.accumulate == 0xb0b0u) {
        scale += x[0];
    }
    let q = q4_pairs(w[e / 8u], scale);
    for (var j = 0u; j < 4u; j++) {
        yh[4u * i + j] = q[j];
    }
}

// DRN: 16-column matrices a subgroup (4 or 2, `SPARSA_DIRECT_RN`); a workgroup's columns.
const DCOLS: u32 = 32u * DRN;

var<workgroup> dzero: array<f32, 256>;
var<workgroup> dedge: array<f32, 2048>;    // two 16 × 16 blocks per subgroup: hi and lo sums

// y at plane rows r0 .. + 15, columns n0 .. + 15 (< P.n) from subgroup sg's blocks of
// `dedge`: the hi products plus the lo products / LO_SCALE. Plane row r is y row r (< P.rows)
// or, `sorted`, slot ord[r]. (naga 30 writes no SPIR-V for arithmetic on cooperative
// matrices, so the sum is taken here.)
fn edge_store(r0: u32, n0: u32, sg: u32, lane: u32, sorted: bool) {
    subgroupBarrier();
    for (var i = lane; i < 256u; i += 32u) {
        var r = r0 + i / 16u;
        if (sorted) {
            r = ord[r];
        }
        let n = n0 + i % 16u;
        if (r < P.rows && n < P.n) {
            y[P.y_off + r * P.y_stride + n] = dedge[512u * sg + i] + dedge[512u * sg + 256u + i] / LO_SCALE;
        }
    }
    subgroupBarrier();
}

// The 32 × 16 DRN block of subgroup sg at plane row r0, column n0 (weight rows wrow + n of
// `wb`), into y through `edge_store`. Called by whole workgroups (lid < 128).
fn direct_block(r0: u32, n0: u32, wrow: u32, lid: u32, sorted: bool) {
    let sg = lid / 32u;
    let lane = lid % 32u;
    dzero[lid] = 0.0;
    dzero[lid + 128u] = 0.0;
    workgroupBarrier();
    var c00 = coopLoadT<coop_mat16x16<f32, C>>(&dzero[0], 16u);
    var c01 = c00; var c02 = c00; var c03 = c00;
    var c10 = c00; var c11 = c00; var c12 = c00; var c13 = c00;
    var d00 = c00; var d01 = c00; var d02 = c00; var d03 = c00;
    var d10 = c00; var d11 = c00; var d12 = c00; var d13 = c00;
    // Weight rows past P.n read row P.n - 1 again (their columns are not stored).
    let nl = P.n - 1u;
    let b0 = (wrow + min(n0, nl)) * P.ws;
    let b1 = (wrow + min(n0 + 16u, nl)) * P.ws;
    let b2 = (wrow + min(n0 + 32u, nl)) * P.ws;
    let b3 = (wrow + min(n0 + 48u, nl)) * P.ws;
    let a0 = r0 * P.ws;
    let a1 = a0 + 16u * P.ws;
    let l0 = P.row0 + a0;
    let l1 = P.row0 + a1;
    // DPF = 1: the next K-step's matrices are loaded before this one's products.
    var ah0 = coopLoadT<coop_mat16x16<f16, A>>(&xa[a0], P.ws);
    var ah1 = coopLoadT<coop_mat16x16<f16, A>>(&xa[a1], P.ws);
    var al0 = coopLoadT<coop_mat16x16<f16, A>>(&xa[l0], P.ws);
    var al1 = coopLoadT<coop_mat16x16<f16, A>>(&xa[l1], P.ws);
    var w0 = coopLoad<coop_mat16x16<f16, B>>(&wb[b0], P.ws);
    var w1 = coopLoad<coop_mat16x16<f16, B>>(&wb[b1], P.ws);
    var w2 = coopLoad<coop_mat16x16<f16, B>>(&wb[b2], P.ws);
    var w3 = coopLoad<coop_mat16x16<f16, B>>(&wb[b3], P.ws);
    for (var k = 0u; k < P.ws; k += 16u) {
        if (DPF == 0u) {
            ah0 = coopLoadT<coop_mat16x16<f16, A>>(&xa[a0 + k], P.ws);
            ah1 = coopLoadT<coop_mat16x16<f16, A>>(&xa[a1 + k], P.ws);
            al0 = coopLoadT<coop_mat16x16<f16, A>>(&xa[l0 + k], P.ws);
            al1 = coopLoadT<coop_mat16x16<f16, A>>(&xa[l1 + k], P.ws);
            w0 = coopLoad<coop_mat16x16<f16, B>>(&wb[b0 + k], P.ws);
            w1 = coopLoad<coop_mat16x16<f16, B>>(&wb[b1 + k], P.ws);
            if (DRN == 4u) {
                w2 = coopLoad<coop_mat16x16<f16, B>>(&wb[b2 + k], P.ws);
                w3 = coopLoad<coop_mat16x16<f16, B>>(&wb[b3 + k], P.ws);
            }
        }
        // The next K-step (the last one again at the end: in bounds, unused).
        let kn = min(k + 16u, P.ws - 16u);
        let nah0 = coopLoadT<coop_mat16x16<f16, A>>(&xa[a0 + kn], P.ws);
        let nah1 = coopLoadT<coop_mat16x16<f16, A>>(&xa[a1 + kn], P.ws);
        let nal0 = coopLoadT<coop_mat16x16<f16, A>>(&xa[l0 + kn], P.ws);
        let nal1 = coopLoadT<coop_mat16x16<f16, A>>(&xa[l1 + kn], P.ws);
        let nw0 = coopLoad<coop_mat16x16<f16, B>>(&wb[b0 + kn], P.ws);
        let nw1 = coopLoad<coop_mat16x16<f16, B>>(&wb[b1 + kn], P.ws);
        // (DRN = 2: unused, so not loaded.)
        let nw2 = coopLoad<coop_mat16x16<f16, B>>(&wb[b2 + kn], P.ws);
        let nw3 = coopLoad<coop_mat16x16<f16, B>>(&wb[b3 + kn], P.ws);
        c00 = coopMultiplyAdd(ah0, w0, c00);
        c01 = coopMultiplyAdd(ah0, w1, c01);
        if (DRN == 4u) {
            c02 = coopMultiplyAdd(ah0, w2, c02);
            c03 = coopMultiplyAdd(ah0, w3, c03);
        }
        c10 = coopMultiplyAdd(ah1, w0, c10);
        c11 = coopMultiplyAdd(ah1, w1, c11);
        if (DRN == 4u) {
            c12 = coopMultiplyAdd(ah1, w2, c12);
            c13 = coopMultiplyAdd(ah1, w3, c13);
        }
        d00 = coopMultiplyAdd(al0, w0, d00);
        d01 = coopMultiplyAdd(al0, w1, d01);
        if (DRN == 4u) {
            d02 = coopMultiplyAdd(al0, w2, d02);
            d03 = coopMultiplyAdd(al0, w3, d03);
        }
        d10 = coopMultiplyAdd(al1, w0, d10);
        d11 = coopMultiplyAdd(al1, w1, d11);
        if (DRN == 4u) {
            d12 = coopMultiplyAdd(al1, w2, d12);
            d13 = coopMultiplyAdd(al1, w3, d13);
        }
        if (DPF == 1u) {
            ah0 = nah0; ah1 = nah1; al0 = nal0; al1 = nal1;
            w0 = nw0; w1 = nw1;
            if (DRN == 4u) {
                w2 = nw2; w3 = nw3;
            }
        }
    }
    coopStoreT(c00, &dedge[512u * sg], 16u);
    coopStoreT(d00, &dedge[512u * sg + 256u], 16u);
    edge_store(r0 + 0u, n0 + 0u, sg, lane, sorted);
    coopStoreT(c01, &dedge[512u * sg], 16u);
    coopStoreT(d01, &dedge[512u * sg + 256u], 16u);
    edge_store(r0 + 0u, n0 + 16u, sg, lane, sorted);
    if (DRN == 4u) {
        coopStoreT(c02, &dedge[512u * sg], 16u);
        coopStoreT(d02, &dedge[512u * sg + 256u], 16u);
        edge_store(r0 + 0u, n0 + 32u, sg, lane, sorted);
}
    if (DRN == 4u) {
        coopStoreT(c03, &dedge[512u * sg], 16u);
        coopStoreT(d03, &dedge[512u * sg + 256u], 16u);
        edge_store(r0 + 0u, n0 + 48u, sg, lane, sorted);
}
    coopStoreT(c10, &dedge[512u * sg], 16u);
    coopStoreT(d10, &dedge[512u * sg + 256u], 16u);
    edge_store(r0 + 16u, n0 + 0u, sg, lane, sorted);
    coopStoreT(c11, &dedge[512u * sg], 16u);
    coopStoreT(d11, &dedge[512u * sg + 256u], 16u);
    edge_store(r0 + 16u, n0 + 16u, sg, lane, sorted);
    if (DRN == 4u) {
        coopStoreT(c12, &dedge[512u * sg], 16u);
        coopStoreT(d12, &dedge[512u * sg + 256u], 16u);
        edge_store(r0 + 16u, n0 + 32u, sg, lane, sorted);
}
    if (DRN == 4u) {
        coopStoreT(c13, &dedge[512u * sg], 16u);
        coopStoreT(d13, &dedge[512u * sg + 256u], 16u);
        edge_store(r0 + 16u, n0 + 48u, sg, lane, sorted);
}
}

// gemm_direct: a workgroup of 4 subgroups computes 64 × DCOLS of y (2 × 2 subgroups of 32 × 16 DRN).
@compute @workgroup_size(128)
fn gemm_direct(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let col_tiles = (P.n + DCOLS - 1u) / DCOLS;
    let sg = lid / 32u;
    let r0 = 64u * (g / col_tiles) + 32u * (sg % 2u);
    let n0 = DCOLS * (g % col_tiles) + DCOLS / 2u * (sg / 2u);
    direct_block(r0, n0, 0u, lid, false);
}

// gemm_direct_experts: gemm_direct over the sorted planes, row tile t by expert ord[R + t]'s
// weights, for the experts P.seg_lo .. + P.seg_n whose rows (P.e_rows each, P.n of them
// multiplied) `wb` holds from row 0.
@compute @workgroup_size(128)
fn gemm_direct_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let col_tiles = (P.n + DCOLS - 1u) / DCOLS;
    let t = g / col_tiles;
    if (64u * t >= ord[P.crow + P.crow / 64u]) {
        return;
    }
    let e = ord[P.crow + t];
    if (e < P.seg_lo || e >= P.seg_lo + P.seg_n) {
        return;
    }
    let sg = lid / 32u;
    let r0 = 64u * t + 32u * (sg % 2u);
    let n0 = DCOLS * (g % col_tiles) + DCOLS / 2u * (sg / 2u);
    direct_block(r0, n0, (e - P.seg_lo) * P.e_rows, lid, true);
}
