// ---- A few rows of x on tensor cores (gemv_coop_rows, gemv_coop_experts_rows) ----------
// Put after matmul.wgsl in the tensor-core shaders (matmul_coop.wgsl's constants, `hi_part`,
// LO_SCALE and `xquad` are used). q4 weights only (one f16 value each, exact: see
// matmul_coop.wgsl), whole 32-element words sharing one scale (QB % 32 == 0), K a multiple
// of 32.
//
// A batched decode step or a speculative verification multiplies 2–16 rows of x by the
// same weights. The integer-dot GEMVs (matmul_dot.wgsl) take every weight word against every
// x row with 16 dot4 each, which bounds them at several rows; here a weight is decoded once
// and the tensor cores take it against all rows at once (16 rows a product, those past the
// real ones zero).
//
// Workgroup: two subgroups of 32 and RC weight rows (output columns; RC a define, 64 or 128),
// RC / 2 a subgroup: CT = RC / 32 tiles of 16 columns, each against x's hi and lo halves, so
// each x fragment loaded from workgroup memory feeds CT products. A K-step of 64: each
// invocation loads RC / 32 words of q4 (16 bytes, 32 weights of one column) and up to 4 quads
// of x (only the real rows: the rows past them stay zero), and stages them as f16 quads (x as
// hi and lo halves, the lo times LO_SCALE), 8-byte stores that do not meet on a bank. The next K-step's words and quads are loaded before the
// products. Results match the f32 kernels to about f32 rounding.
//
// Split K: the dense entry's workgroup g takes column block g % blocks over the K range
// P.seg_n · (g / blocks) .. + P.seg_n (P.splits ranges), so that a small matrix still fills
// the GPU with workgroups instead of walking all of K in a few; with more than one range its
// sums go to a scratch buffer (rows P.n apart, ranges P.y_split apart) and
// `gemv_coop_rows_sum` adds them up in order.

const RWG: u32 = 64u;               // invocations
const CT: u32 = RC / 32u;           // 16-column tiles of a subgroup
const RK: u32 = 64u;                // K per staged step
const HQ: u32 = RK / 4u + 2u;       // row stride of the stages in f16 quads (144 bytes)
var<workgroup> Rxh: array<vec4<f16>, 16u * HQ>;    // [16 x rows][HQ quads]
var<workgroup> Rxl: array<vec4<f16>, 16u * HQ>;
var<workgroup> Rw: array<vec4<f16>, RC * HQ>;      // [RC weight rows][HQ quads]: B column-major
var<workgroup> Rc: array<f32, 512>;                // each subgroup's 16 × 16 outputs, row-major
var<workgroup> r_x: array<u32, 16>;                // x offset of each tile row (NONE: zeros)
var<workgroup> r_y: array<u32, 16>;                // y offset of each tile row (NONE: not stored)
var<workgroup> r_w: array<u32, RC>;                // word offset of each column's row (NONE: zeros)
// [0]: rows of the current batch (16 bytes, as every workgroup array here: the cooperative
// loads and stores need 16-byte aligned workgroup memory).
var<workgroup> r_n: array<u32, 4>;

// One q4 word to stage: 32 weights of a column and their scale.
struct RowsWord {
    w: vec4<u32>,
    s: f32,
}

// What one invocation stages for a K-step: words lid + 64 i (column (lid + 64 i) / 2, its
// half (lid + 64 i) % 2 of the K-step) and x quads lid + 64 i (tile row (lid + 64 i) / 16,
// elements 4 ((lid + 64 i) % 16) ..). Fields, not arrays: indexed in a loop, NVIDIA's
// compiler put arrays in local memory (matmul_coop.wgsl).
struct RowsStage {
    w0: RowsWord,
    w1: RowsWord,
    w2: RowsWord,
    w3: RowsWord,
    x0: vec4<f32>,
    x1: vec4<f32>,
    x2: vec4<f32>,
    x3: vec4<f32>,
}

fn rows_word(lid: u32, i: u32, k0: u32, ke: u32) -> RowsWord {
    let j = lid + RWG * i;
    let wo = r_w[j / 2u];
    let q = k0 / 32u + j % 2u;
    var r = RowsWord(vec4<u32>(0u), 0.0);
    if (wo != NONE && 32u * q < ke) {
        r.w = w4[wo + q];
        r.s = q_scale(((wo + q) * EPV) / QB);
    }
    return r;
}

// x quad lid + 64 i of the K-step at k0: zeros past the m live rows and past ke.
fn rows_quad(lid: u32, i: u32, k0: u32, ke: u32, m: u32) -> vec4<f32> {
    let q = lid + RWG * i;
    let k = k0 + 4u * (q % 16u);
    if (q / 16u >= m || k >= ke) {
        return vec4<f32>(0.0);
    }
    return xquad(r_x[q / 16u], k);
}

fn rows_load(lid: u32, k0: u32, ke: u32, m: u32) -> RowsStage {
    var st: RowsStage;
    st.w0 = rows_word(lid, 0u, k0, ke);
    st.w1 = rows_word(lid, 1u, k0, ke);
    if (CT == 4u) {
        st.w2 = rows_word(lid, 2u, k0, ke);
        st.w3 = rows_word(lid, 3u, k0, ke);
    }
    st.x0 = rows_quad(lid, 0u, k0, ke, m);
    st.x1 = rows_quad(lid, 1u, k0, ke, m);
    st.x2 = rows_quad(lid, 2u, k0, ke, m);
    st.x3 = rows_quad(lid, 3u, k0, ke, m);
    return st;
}

// Word lid + 64 i as 8 quads of f16 weights (a nibble times the scale: exact, see
// matmul_coop.wgsl), stored 8 bytes at a time. The columns' rows are 144 bytes apart, so a
// half-subgroup's 8 columns × 2 halves would meet on the same banks in pairs; the second
// half stores each u32's two quads in the opposite order, which puts them on the other 16.
fn rows_store_word(lid: u32, i: u32, r: RowsWord) {
    let j = lid + RWG * i;
    let h = j % 2u;
    let at = (j / 2u) * HQ + 8u * h;
    if (ROWS_DIAG == 3u) {
        // Measurement aid (kernels/matmul.rs): the loads kept, nothing stored.
        if (r.w.x == 0x12345678u && r.s == 1.5) {
            Rw[at] = vec4<f16>(1.0);
        }
        return;
    }
    for (var v = 0u; v < 4u; v++) {
        var a = vec4<f16>(q_nib_lo(r.w[v]) * r.s);
        var b = vec4<f16>(q_nib_hi(r.w[v]) * r.s);
        if (ROWS_DIAG == 1u) {
            // Measurement aid: no decoding, the loads kept.
            a = vec4<f16>(select(f16(0.5), f16(1.0), r.w[v] == 7u));
            b = a;
        }
        let flip = h == 1u;
        Rw[at + 2u * v + h] = select(a, b, flip);
        Rw[at + 2u * v + 1u - h] = select(b, a, flip);
    }
}

// Only the live rows: the others stay as rows_tile zeroed them.
fn rows_store_quad(lid: u32, i: u32, v: vec4<f32>, m: u32) {
    let q = lid + RWG * i;
    if (q / 16u < m) {
        let xa = (q / 16u) * HQ + q % 16u;
        let hi = bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xffffe000u));
        Rxh[xa] = vec4<f16>(hi);
        Rxl[xa] = vec4<f16>((v - hi) * LO_SCALE);
    }
}

fn rows_store(lid: u32, st: RowsStage, m: u32) {
    rows_store_word(lid, 0u, st.w0);
    rows_store_word(lid, 1u, st.w1);
    if (CT == 4u) {
        rows_store_word(lid, 2u, st.w2);
        rows_store_word(lid, 3u, st.w3);
    }
    rows_store_quad(lid, 0u, st.x0, m);
    rows_store_quad(lid, 1u, st.x1, m);
    rows_store_quad(lid, 2u, st.x2, m);
    rows_store_quad(lid, 3u, st.x3, m);
}

// Subgroup sg's 16 × 16 tile c (hi products) and d (lo products, times LO_SCALE) stored at
// r_y (+ the tile's columns ct0 ..): lane l takes tile row l / 2, columns 8 (l % 2) .. + 7.
// Uniform control flow (its barriers).
fn rows_put(lid: u32, c: coop_mat16x16<f32, C>, d: coop_mat16x16<f32, C>, ct0: u32, add: bool) {
    let sg = lid / 32u;
    let lane = lid % 32u;
    let cb = sg * 256u;
    let t = lane / 2u;
    let c0 = 8u * (lane % 2u);
    coopStoreT(c, &Rc[cb], 16u);
    workgroupBarrier();
    var v: array<f32, 8>;
    for (var j = 0u; j < 8u; j++) {
        v[j] = Rc[cb + 16u * t + c0 + j];
    }
    workgroupBarrier();
    coopStoreT(d, &Rc[cb], 16u);
    workgroupBarrier();
    let yo = r_y[t];
    for (var j = 0u; j < 8u; j++) {
        let col = ct0 + c0 + j;
        if (yo != NONE && r_w[col] != NONE) {
            var s = v[j] + Rc[cb + 16u * t + c0 + j] * (1.0 / LO_SCALE);
            if (add) {
                s += y[yo + col];
            }
            y[yo + col] = s;
        }
    }
    workgroupBarrier();
}

// The products of the first m tile rows in r_x with the columns in r_w over K from kb to ke,
// stored at r_y (+ the column; added to y's values where `add`). Uniform control flow; r_x,
// r_y and r_w written before the call (the first barrier here orders them), read until the
// last.
fn rows_tile(lid: u32, kb: u32, ke: u32, m: u32, add: bool) {
    let sg = lid / 32u;
    // The x rows past m stay zero; the accumulators start from zeros in memory (a null
    // cooperative matrix left garbage in them on NVIDIA's driver: matmul_coop.wgsl).
    for (var i = lid; i < 16u * HQ; i += RWG) {
        Rxh[i] = vec4<f16>(0.0);
        Rxl[i] = vec4<f16>(0.0);
    }
    for (var i = lid; i < 512u; i += RWG) {
        Rc[i] = 0.0;
    }
    workgroupBarrier();
    var c0 = coopLoadT<coop_mat16x16<f32, C>>(&Rc[0], 16u);
    var c1 = coopLoadT<coop_mat16x16<f32, C>>(&Rc[0], 16u);
    var c2 = coopLoadT<coop_mat16x16<f32, C>>(&Rc[0], 16u);
    var c3 = coopLoadT<coop_mat16x16<f32, C>>(&Rc[0], 16u);
    var d0 = coopLoadT<coop_mat16x16<f32, C>>(&Rc[0], 16u);
    var d1 = coopLoadT<coop_mat16x16<f32, C>>(&Rc[0], 16u);
    var d2 = coopLoadT<coop_mat16x16<f32, C>>(&Rc[0], 16u);
    var d3 = coopLoadT<coop_mat16x16<f32, C>>(&Rc[0], 16u);
    // The subgroup's first column, as a staged quad.
    let nb = (RC / 2u) * sg * HQ;
    var st = rows_load(lid, kb, ke, m);
    for (var k0 = kb; k0 < ke; k0 += RK) {
        rows_store(lid, st, m);
        workgroupBarrier();
        if (k0 + RK < ke) {
            st = rows_load(lid, k0 + RK, ke, m);
        }
        for (var kk = 0u; kk < select(RK / 4u, 0u, ROWS_DIAG == 2u); kk += 4u) {
            let ah = coopLoadT<coop_mat16x16<f16, A>>(&Rxh[kk], HQ);
            let al = coopLoadT<coop_mat16x16<f16, A>>(&Rxl[kk], HQ);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&Rw[nb + kk], HQ);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&Rw[nb + 16u * HQ + kk], HQ);
            c0 = coopMultiplyAdd(ah, b0, c0);
            d0 = coopMultiplyAdd(al, b0, d0);
            c1 = coopMultiplyAdd(ah, b1, c1);
            d1 = coopMultiplyAdd(al, b1, d1);
            if (CT == 4u) {
                let b2 = coopLoad<coop_mat16x16<f16, B>>(&Rw[nb + 32u * HQ + kk], HQ);
                let b3 = coopLoad<coop_mat16x16<f16, B>>(&Rw[nb + 48u * HQ + kk], HQ);
                c2 = coopMultiplyAdd(ah, b2, c2);
                d2 = coopMultiplyAdd(al, b2, d2);
                c3 = coopMultiplyAdd(ah, b3, c3);
                d3 = coopMultiplyAdd(al, b3, d3);
            }
        }
        workgroupBarrier();
    }
    let ct0 = (RC / 2u) * sg;
    rows_put(lid, c0, d0, ct0, add);
    rows_put(lid, c1, d1, ct0 + 16u, add);
    if (CT == 4u) {
        rows_put(lid, c2, d2, ct0 + 32u, add);
        rows_put(lid, c3, d3, ct0 + 48u, add);
    }
}

// y[t, n] (+)= Σ_k x[t, k] · W[n, k] for the P.rows ≤ 16 rows of x: workgroup g takes
// weight rows RC (g % blocks) .. over K range g / blocks (above).
@compute @workgroup_size(RWG)
fn gemv_coop_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let blocks = (P.n + RC - 1u) / RC;
    let g = wid.x + wid.y * nwg.x;
    if (g >= blocks * P.splits) {
        return;
    }
    let n0 = (g % blocks) * RC;
    let sp = g / blocks;
    let kb = sp * P.seg_n;
    let ke = min(P.k, kb + P.seg_n);
    let split = P.splits > 1u;
    if (lid < 16u) {
        let live = lid < P.rows;
        var yo = P.y_off + lid * P.y_stride + n0;
        if (split) {
            yo = sp * P.y_split + lid * P.n + n0;
        }
        r_x[lid] = select(NONE, P.x_off + lid * P.x_stride, live);
        r_y[lid] = select(NONE, yo, live);
    }
    for (var i = lid; i < RC; i += RWG) {
        r_w[i] = dense_word_row(n0 + i);
    }
    rows_tile(lid, kb, ke, min(P.rows, 16u), !split && P.accumulate == 1u);
}

// The split sums of gemv_coop_rows added up in order (binding 1: the scratch) into y
// (binding 2 here), P.rows × P.n of them.
@group(0) @binding(2) var<storage, read_write> rows_out: array<f32>;

@compute @workgroup_size(256)
fn gemv_coop_rows_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (i >= P.rows * P.n) {
        return;
    }
    var s = 0.0;
    for (var sp = 0u; sp < P.splits; sp++) {
        s += x[sp * P.y_split + i];
    }
    let o = P.y_off + (i / P.n) * P.y_stride + i % P.n;
    if (P.accumulate == 1u) {
        s += rows_out[o];
    }
    rows_out[o] = s;
}

// Routed experts at a few token rows, grouped by expert: workgroup g takes RC rows of one
// expert (P.e0 + g / blocks) for every slot routed to it, 16 slots a pass.
@compute @workgroup_size(RWG)
fn gemv_coop_experts_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let b = item_block(wid.x + wid.y * nwg.x, RC);
    let e = P.e0 + b.x;
    let n0 = b.y;
    for (var i = lid; i < RC; i += RWG) {
        r_w[i] = expert_word_row(e, n0 + i);
    }
    // Invocation 0 lists the next (up to 16) slots routed to e, from slot s on.
    var s = 0u;
    loop {
        if (lid == 0u) {
            var m = 0u;
            for (; s < P.rows && m < 16u; s++) {
                if (expert_of(s) == e) {
                    r_x[m] = slot_x(s);
                    r_y[m] = P.y_off + s * P.y_stride + n0;
                    m++;
                }
            }
            for (var i = m; i < 16u; i++) {
                r_x[i] = NONE;
                r_y[i] = NONE;
            }
            r_n[0] = m;
        }
        let m = workgroupUniformLoad(&r_n[0]);
        if (m == 0u) {
            break;
        }
        rows_tile(lid, 0u, P.k, m, false);
    }
}
