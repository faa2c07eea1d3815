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
// Workgroup: RC weight rows (output columns; RC a define, 64 or 128) over the whole K, RC / 16
// subgroups of 32, each 16 columns. A K-step of 64: every invocation loads one 16-byte word
// of q4 (32 weights of column lid / 2) and 256 / (2 RC) quads of x (16 rows × 16 quads), and
// stages them as f16 (x as hi and lo halves, the lo times LO_SCALE); each subgroup then runs
// 4 × 2 16×16×16 products (x's hi and lo halves against its 16 columns). The next K-step's
// words and quads are loaded before the products. Results match the f32 kernels to about f32
// rounding.

const RWG: u32 = 2u * RC;           // invocations
const RXQ: u32 = 256u / RWG;        // x quads an invocation stages a K-step
var<workgroup> Rxh: array<vec2<f16>, 16u * HP>;    // [16 x rows][HP pairs]
var<workgroup> Rxl: array<vec2<f16>, 16u * HP>;
var<workgroup> Rw: array<vec2<f16>, RC * HP>;      // [RC weight rows][HP pairs]: B column-major
var<workgroup> Rc: array<f32, RC / 16u * 256u>;    // each subgroup's 16 × 16 outputs, row-major
var<workgroup> r_x: array<u32, 16>;                // x offset of each tile row (NONE: zeros)
var<workgroup> r_y: array<u32, 16>;                // y offset of each tile row (NONE: not stored)
var<workgroup> r_w: array<u32, RC>;                // word offset of each column's row (NONE: zeros)
// [0]: rows of the current batch (16 bytes, as every workgroup array here: the cooperative
// loads and stores need 16-byte aligned workgroup memory).
var<workgroup> r_n: array<u32, 4>;

// What one invocation stages for a K-step.
// x quad i of invocation lid: tile row xq_row / 16, columns 4 (xq_row % 16) ..
fn xq_at(lid: u32, i: u32) -> u32 {
    return lid + RWG * i;
}

struct RowsStage {
    w: vec4<u32>,
    s: f32,
    x: array<vec4<f32>, RXQ>,
}

fn rows_load(lid: u32, k0: u32) -> RowsStage {
    var st: RowsStage;
    for (var i = 0u; i < RXQ; i++) {
        let at = xq_at(lid, i);
        st.x[i] = xquad(r_x[at / 16u], k0 + 4u * (at % 16u));
    }
    st.w = vec4<u32>(0u);
    st.s = 0.0;
    let wo = r_w[lid / 2u];
    let q = k0 / 32u + lid % 2u;
    if (wo != NONE && 32u * q < P.k) {
        st.w = w4[wo + q];
        st.s = q_scale(((wo + q) * EPV) / QB);
    }
    return st;
}

fn rows_store_stage(lid: u32, st: RowsStage) {
    let at = (lid / 2u) * HP + 16u * (lid % 2u);
    for (var j = 0u; j < 4u; j++) {
        let p = q4_pairs(st.w[j], st.s);
        for (var i = 0u; i < 4u; i++) {
            Rw[at + 4u * j + i] = p[i];
        }
    }
    for (var i = 0u; i < RXQ; i++) {
        let at = xq_at(lid, i);
        let xa = (at / 16u) * HP + 2u * (at % 16u);
        let v = st.x[i];
        let a = split_f16(v.xy);
        let b = split_f16(v.zw);
        Rxh[xa] = a.hi;
        Rxh[xa + 1u] = b.hi;
        Rxl[xa] = a.lo;
        Rxl[xa + 1u] = b.lo;
    }
}

// The products of the tile rows in r_x with the columns in r_w, stored at r_y (+ the
// subgroup's column). Uniform control flow; r_x, r_y and r_w written before the call (the
// first barrier here orders them), read until the last.
fn rows_tile(lid: u32) {
    let sg = lid / 32u;
    let lane = lid % 32u;
    let cb = sg * 256u;
    // Accumulators start from zeros in memory (a null cooperative matrix left garbage in
    // them on NVIDIA's driver: matmul_coop.wgsl).
    for (var i = lane; i < 256u; i += 32u) {
        Rc[cb + i] = 0.0;
    }
    workgroupBarrier();
    var c = coopLoadT<coop_mat16x16<f32, C>>(&Rc[cb], 16u);
    var d = coopLoadT<coop_mat16x16<f32, C>>(&Rc[cb], 16u);
    var st = rows_load(lid, 0u);
    for (var k0 = 0u; k0 < P.k; k0 += HK) {
        rows_store_stage(lid, st);
        workgroupBarrier();
        if (k0 + HK < P.k) {
            st = rows_load(lid, k0 + HK);
        }
        for (var kk = 0u; kk < HK / 2u; kk += 8u) {
            let ah = coopLoadT<coop_mat16x16<f16, A>>(&Rxh[kk], HP);
            let al = coopLoadT<coop_mat16x16<f16, A>>(&Rxl[kk], HP);
            let b = coopLoad<coop_mat16x16<f16, B>>(&Rw[16u * sg * HP + kk], HP);
            c = coopMultiplyAdd(ah, b, c);
            d = coopMultiplyAdd(al, b, d);
        }
        workgroupBarrier();
    }
    // Lane l stores tile row l / 2, columns 8 (l % 2) .. + 7 of the subgroup's 16.
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
        let col = 16u * sg + c0 + j;
        if (yo != NONE && r_w[col] != NONE) {
            var s = v[j] + Rc[cb + 16u * t + c0 + j] * (1.0 / LO_SCALE);
            if (P.accumulate == 1u) {
                s += y[yo + col];
            }
            y[yo + col] = s;
        }
    }
    workgroupBarrier();
}

// y[t, n] (+)= Σ_k x[t, k] · W[n, k] for the P.rows ≤ 16 rows of x: workgroup g takes
// weight rows RC g ...
@compute @workgroup_size(RWG)
fn gemv_coop_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let n0 = (wid.x + wid.y * nwg.x) * RC;
    if (lid < 16u) {
        let live = lid < P.rows;
        r_x[lid] = select(NONE, P.x_off + lid * P.x_stride, live);
        r_y[lid] = select(NONE, P.y_off + lid * P.y_stride + n0, live);
    }
    if (lid < RC) {
        r_w[lid] = dense_word_row(n0 + lid);
    }
    rows_tile(lid);
}

// Routed experts at a few token rows, grouped by expert: workgroup g takes RC rows of one
// expert (P.e0 + g / blocks) for every slot routed to it, 16 slots a pass.
@compute @workgroup_size(RWG)
fn gemv_coop_experts_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let b = item_block(wid.x + wid.y * nwg.x, RC);
    let e = P.e0 + b.x;
    let n0 = b.y;
    if (lid < RC) {
        r_w[lid] = expert_word_row(e, n0 + lid);
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
        if (workgroupUniformLoad(&r_n[0]) == 0u) {
            break;
        }
        rows_tile(lid);
    }
}
