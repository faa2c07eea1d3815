// Matrix products over a weight chunk in its stored dtype, f32 accumulation.
//
// Defines (prepended by the wrapper):
//   W_DTYPE: 0 = f32, 1 = bf16, 2 = f16 (weights bound as array<u32>; 16-bit element i
//            lives in word i >> 1, low half = even index); 3 = FP8, 4 = q8, 5 = q4 with
//            scales in binding 4 (quant.wgsl; QB elements per scale, S_BF16).
//   T:       rows of x handled by one GEMV workgroup (1 ..= 8; 1 for the other entries).
//   TPR4, RR, EPV: gemv4's lanes per weight row, weight rows per lane, elements per 16 bytes.
//
// Entry points (bindings: 1 = x, 2 = weight chunk, 3 = y, 4 = scales (a dummy buffer for
// float weights), 5 = expert ids):
//   gemv          y[t, n] for all t < T, RPW weight rows n per workgroup.
//   gemv4         the same over 16-byte words (aligned rows and x), RR rows per lane.
//   gemv4q        gemv4 for one x row and quantized weights, 4 rows per lane.
//   gemm          64×TN tiles of (t × n) by `tile`: matmul_tile.wgsl (tile64: TN = 64, K-tiles
//                 of 16, 4×4 outputs per invocation) or matmul_coop.wgsl (tensor cores; TN
//                 64 or 128, a define from kernels/matmul.rs).
//   gemm128       128×128 tiles, K-tiles of 8, 8×8 outputs per invocation (large products).
//   gemv_experts  one slot × RPW expert rows per workgroup.
//   gemv_cpu1, gemv_cpu1_experts, gemvt_cpu1
//                 CPU adapters' GEMVs for any rows and x: a lane per output, no barrier.
//   gemm_experts  one (expert, TN-column tile) per workgroup; gathers the slots routed to
//                 that expert into TM-row tiles (a grouped GEMM); with P.e_list, one (row
//                 tile, column tile) per workgroup from expert_tiles.wgsl's table.

// Params (binding 0): declared once, in src/kernels/matmul.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> wscale: array<u32>;
@group(0) @binding(5) var<storage, read> experts: array<u32>;

const WG: u32 = 256u;
const TPR: u32 = 64u;            // GEMV: invocations per weight row
const RPW: u32 = WG / TPR;       // GEMV: weight rows per workgroup
const NONE: u32 = 0xffffffffu;

// Routed products: the expert slot `s` runs, read from the ids (binding 5), or s % topk
// where P.e_direct is set (a per-head product: slot = head, no ids).
fn expert_of(s: u32) -> u32 {
    if (P.e_direct != 0u) {
        return s % P.topk;
    }
    return experts[s];
}

// Stacked weight row of expert e's row n: its block starts at e · e_rows, its rows at r_lo
// of the block (a window of P.n rows; all of them, from 0, for MoE experts).
fn expert_row(e: u32, n: u32) -> u32 {
    return e * P.e_rows + P.r_lo + n;
}

// The expert slot `s` runs, NONE for a slot past P.rows or an id past the stacked experts.
fn live_expert(s: u32) -> u32 {
    if (s >= P.rows) {
        return NONE;
    }
    let e = expert_of(s);
    return select(NONE, e, e < P.n_experts);
}

// ---- weight fetch -------------------------------------------------------------------

fn wload(i: u32) -> f32 {
    return w_any(w[w_word(i)], i);
}

// Elements i and i + 1.
fn wload2(i: u32) -> vec2<f32> {
    if (W_DTYPE == 0u) {
        return vec2<f32>(bitcast<f32>(w[i]), bitcast<f32>(w[i + 1u]));
    }
    if (W_DTYPE >= 3u) {
        // i is even and rows hold whole blocks: both elements share a word and a scale.
        let word = w[w_word(i)];
        return vec2<f32>(q_raw(word, i), q_raw(word, i + 1u)) * q_scale(i / QB);
    }
    if ((i & 1u) == 0u) {
        return w_pair(w[i >> 1u]);
    }
    return vec2<f32>(wload(i), wload(i + 1u));
}

// ---- GEMV ----------------------------------------------------------------------------
// Accumulators live in vectors, never in indexed private arrays (those end up in local
// memory behind bounds checks on some drivers).

struct Acc8 {
    lo: vec4<f32>,   // x rows 0..3
    hi: vec4<f32>,   // x rows 4..7
}

// Dots of weight pair `wv` with columns c, c + 1 of the T x rows; `xo` = row 0's offset of c.
fn pair_dots(wv: vec2<f32>, xo: u32) -> Acc8 {
    let xs = P.x_stride;
    var r = Acc8(vec4<f32>(0.0), vec4<f32>(0.0));
    r.lo.x = dot(wv, vec2<f32>(x[xo], x[xo + 1u]));
    if (T > 1u) { r.lo.y = dot(wv, vec2<f32>(x[xo + xs], x[xo + xs + 1u])); }
    if (T > 2u) { r.lo.z = dot(wv, vec2<f32>(x[xo + 2u * xs], x[xo + 2u * xs + 1u])); }
    if (T > 3u) { r.lo.w = dot(wv, vec2<f32>(x[xo + 3u * xs], x[xo + 3u * xs + 1u])); }
    if (T > 4u) { r.hi.x = dot(wv, vec2<f32>(x[xo + 4u * xs], x[xo + 4u * xs + 1u])); }
    if (T > 5u) { r.hi.y = dot(wv, vec2<f32>(x[xo + 5u * xs], x[xo + 5u * xs + 1u])); }
    if (T > 6u) { r.hi.z = dot(wv, vec2<f32>(x[xo + 6u * xs], x[xo + 6u * xs + 1u])); }
    if (T > 7u) { r.hi.w = dot(wv, vec2<f32>(x[xo + 7u * xs], x[xo + 7u * xs + 1u])); }
    return r;
}

// Partial dots of weight row `wbase` (element index of its column 0; NONE = inactive)
// with the T x rows starting at `xbase`, over this lane's columns: column pairs `lane`,
// `lane + step`, ... of the row's `step` lanes (`step` = 1: the lane takes the whole row).
fn gemv_partial(wbase: u32, xbase: u32, lane: u32, step: u32) -> Acc8 {
    var acc = Acc8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (wbase == NONE) {
        return acc;
    }
    let k = P.k;
    let pairs = k >> 1u;
    var p = lane;
    // Four independent pairs per step keep more loads in flight.
    for (; p + 3u * step < pairs; p += 4u * step) {
        let c0 = p << 1u;
        let c1 = c0 + 2u * step;
        let c2 = c1 + 2u * step;
        let c3 = c2 + 2u * step;
        let w0 = wload2(wbase + c0);
        let w1 = wload2(wbase + c1);
        let w2 = wload2(wbase + c2);
        let w3 = wload2(wbase + c3);
        let d0 = pair_dots(w0, xbase + c0);
        let d1 = pair_dots(w1, xbase + c1);
        let d2 = pair_dots(w2, xbase + c2);
        let d3 = pair_dots(w3, xbase + c3);
        acc.lo += (d0.lo + d1.lo) + (d2.lo + d3.lo);
        if (T > 4u) {
            acc.hi += (d0.hi + d1.hi) + (d2.hi + d3.hi);
        }
    }
    for (; p < pairs; p += step) {
        let c = p << 1u;
        let d = pair_dots(wload2(wbase + c), xbase + c);
        acc.lo += d.lo;
        acc.hi += d.hi;
    }
    if ((k & 1u) == 1u && lane == step - 1u) {
        // The odd last column, as a pair with a zero weight.
        let c = k - 1u;
        let d = pair_dots(vec2<f32>(wload(wbase + c), 0.0), xbase + c);
        acc.lo += d.lo;
        acc.hi += d.hi;
    }
    return acc;
}

var<workgroup> red: array<vec4<f32>, 512>;   // [lo | hi] × WG

// Sums the partials of the TPR lanes of each row group; afterwards red[sub * TPR] (rows
// 0..3) and red[WG + sub * TPR] (rows 4..7) hold the dots of row group `sub`.
fn gemv_reduce(acc: Acc8, lid: u32) {
    red[lid] = acc.lo;
    if (T > 4u) {
        red[WG + lid] = acc.hi;
    }
    workgroupBarrier();
    let lane = lid % TPR;
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            red[lid] += red[lid + s];
            if (T > 4u) {
                red[WG + lid] += red[WG + lid + s];
            }
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256)
fn gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let sub = lid / TPR;
    let lane = lid % TPR;
    let n = g * RPW + sub;
    var wbase = NONE;
    if (n < P.n) {
        wbase = n * P.ws;
    }
    gemv_reduce(gemv_partial(wbase, P.x_off, lane, TPR), lid);
    if (lane < T && n < P.n) {
        let v = red[(lane / 4u) * WG + sub * TPR];
        store_one(P.y_off + lane * P.y_stride + n, v[lane % 4u]);
    }
}

@compute @workgroup_size(256)
fn gemv_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let groups = (P.n + RPW - 1u) / RPW;
    let slot = g / groups;
    let sub = lid / TPR;
    let lane = lid % TPR;
    let n = (g % groups) * RPW + sub;
    var wbase = NONE;
    var xbase = 0u;
    if (slot < P.rows && n < P.n) {
        let e = expert_of(slot);
        let gr = expert_row(e, n);
        if (e < P.n_experts && gr >= P.row0 && gr < P.row0 + P.crow) {
            wbase = (gr - P.row0) * P.ws;
            xbase = slot_x(slot);
        }
    }
    gemv_reduce(gemv_partial(wbase, xbase, lane, TPR), lid);
    if (lane == 0u && wbase != NONE) {
        y[P.y_off + slot * P.y_stride + n] = red[sub * TPR].x;
    }
}

// ---- GEMV for CPU adapters, any rows ---------------------------------------------------
// For what gemv_cpu cannot read (x rows off 4-float boundaries, weight rows that are not
// whole 16-byte words: odd model sizes): one lane walks a whole weight row, so no lanes
// split a sum and there is no workgroup memory and no barrier, which a CPU adapter pays for
// by switching every invocation (gemv's 64-lane reduction took 2.6 ms a call on lavapipe for
// a test model's 88-column rows).

// The output a lane of these kernels computes: lanes in dispatch order.
fn cpu1_item(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WGC + lid;
}

// Component t of the sums of the T x rows.
fn acc8_row(a: Acc8, t: u32) -> f32 {
    return select(a.lo, a.hi, t >= 4u)[t % 4u];
}

// y[t, n] for the T x rows, one weight row n per lane.
@compute @workgroup_size(WGC)
fn gemv_cpu1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let n = cpu1_item(wid, nwg, lid);
    if (n >= P.n) {
        return;
    }
    let acc = gemv_partial(n * P.ws, P.x_off, 0u, 1u);
    for (var t = 0u; t < T; t++) {
        store_one(P.y_off + t * P.y_stride + n, acc8_row(acc, t));
    }
}

// gemv_experts for CPU adapters: one lane per (slot, row of its expert).
@compute @workgroup_size(WGC)
fn gemv_cpu1_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let item = cpu1_item(wid, nwg, lid);
    let slot = item / P.n;
    let n = item % P.n;
    let e = live_expert(slot);
    if (e == NONE) {
        return;
    }
    let gr = expert_row(e, n);
    if (gr >= P.row0 && gr < P.row0 + P.crow) {
        let acc = gemv_partial((gr - P.row0) * P.ws, slot_x(slot), 0u, 1u);
        y[P.y_off + slot * P.y_stride + n] = acc.lo.x;
    }
}

// gemvt_cpu for rows that are not whole 16-byte words: one lane per (slot, column) walks the
// window's rows element by element.
@compute @workgroup_size(WGC)
fn gemvt_cpu1(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let item = cpu1_item(wid, nwg, lid);
    let slot = item / P.k;
    let c = item % P.k;
    let e = live_expert(slot);
    if (e == NONE) {
        return;
    }
    let xb = slot_x(slot);
    var acc = 0.0;
    for (var d = 0u; d < P.n; d++) {
        let gr = expert_row(e, d);
        if (gr >= P.row0 && gr < P.row0 + P.crow) {
            acc += x[xb + d] * wload((gr - P.row0) * P.ws + c);
        }
    }
    y[P.y_off + slot * P.y_stride + c] = acc;
}

// ---- GEMV over 16-byte words -----------------------------------------------------------
// For rows of a whole number of 16-byte words (quantized: k a multiple of EPV, so only real
// columns are read) and x rows starting on 4-float boundaries:
// each lane loads one vec4<u32> of RR weight rows (EPV elements each) per step and the
// matching x floats as vec4s. Workgroup: WG / TPR4 row groups of TPR4 lanes, each group RR
// consecutive weight rows. Extra defines: TPR4, RR (1 or 2), EPV (8 for 16-bit, 4 for f32).

@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w4: array<vec4<u32>>;

struct W8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn unpack_w(v: vec4<u32>) -> W8 {
    if (W_DTYPE == 0u) {
        return W8(bitcast<vec4<f32>>(v), vec4<f32>(0.0));
    }
    if (W_DTYPE == 1u) {
        let l = v << vec4<u32>(16u);
        let h = v & vec4<u32>(0xffff0000u);
        return W8(bitcast<vec4<f32>>(vec4<u32>(l.x, h.x, l.y, h.y)), bitcast<vec4<f32>>(vec4<u32>(l.z, h.z, l.w, h.w)));
    }
    return W8(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)), vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
}

// 16 bytes of 8-bit (16 elements) or 4-bit (32 elements) codes, unscaled.
struct WQ {
    a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>,
    e: vec4<f32>, f: vec4<f32>, g: vec4<f32>, h: vec4<f32>,
}

fn unpack_q(v: vec4<u32>) -> WQ {
    if (W_DTYPE == 5u) {
        return WQ(q_nib_lo(v.x), q_nib_hi(v.x), q_nib_lo(v.y), q_nib_hi(v.y),
                  q_nib_lo(v.z), q_nib_hi(v.z), q_nib_lo(v.w), q_nib_hi(v.w));
    }
    let z = vec4<f32>(0.0);
    return WQ(q_bytes4(v.x), q_bytes4(v.y), q_bytes4(v.z), q_bytes4(v.w), z, z, z, z);
}

fn xdotq(w: WQ, xi: u32) -> f32 {
    var s = (dot(w.a, x4[xi]) + dot(w.b, x4[xi + 1u])) + (dot(w.c, x4[xi + 2u]) + dot(w.d, x4[xi + 3u]));
    if (EPV == 32u) {
        s += (dot(w.e, x4[xi + 4u]) + dot(w.f, x4[xi + 5u])) + (dot(w.g, x4[xi + 6u]) + dot(w.h, x4[xi + 7u]));
    }
    return s;
}

// Dots of one 16-byte word of codes at word index `wi` of the chunk (scale applied once).
fn dotsq(v: vec4<u32>, wi: u32, xi: u32, xs4: u32) -> Acc8 {
    let w = unpack_q(v);
    let s = q_scale((wi * EPV) / QB);
    var r = Acc8(vec4<f32>(0.0), vec4<f32>(0.0));
    r.lo.x = xdotq(w, xi);
    if (T > 1u) { r.lo.y = xdotq(w, xi + xs4); }
    if (T > 2u) { r.lo.z = xdotq(w, xi + 2u * xs4); }
    if (T > 3u) { r.lo.w = xdotq(w, xi + 3u * xs4); }
    if (T > 4u) { r.hi.x = xdotq(w, xi + 4u * xs4); }
    if (T > 5u) { r.hi.y = xdotq(w, xi + 5u * xs4); }
    if (T > 6u) { r.hi.z = xdotq(w, xi + 6u * xs4); }
    if (T > 7u) { r.hi.w = xdotq(w, xi + 7u * xs4); }
    r.lo *= s;
    r.hi *= s;
    return r;
}

// Dots of the 16-byte word at index `wi` with the T x rows at vec4 index `xi`.
fn dots_word(wi: u32, xi: u32, xs4: u32) -> Acc8 {
    if (W_DTYPE >= 3u) {
        return dotsq(w4[wi], wi, xi, xs4);
    }
    return dots8(unpack_w(w4[wi]), xi, xs4);
}

// x row t's EPV floats at vec4 index `xi` (+ t * stride4).
fn xdot(w: W8, xi: u32) -> f32 {
    if (EPV == 4u) {
        return dot(w.lo, x4[xi]);
    }
    return dot(w.lo, x4[xi]) + dot(w.hi, x4[xi + 1u]);
}

fn dots8(w: W8, xi: u32, xs4: u32) -> Acc8 {
    var r = Acc8(vec4<f32>(0.0), vec4<f32>(0.0));
    r.lo.x = xdot(w, xi);
    if (T > 1u) { r.lo.y = xdot(w, xi + xs4); }
    if (T > 2u) { r.lo.z = xdot(w, xi + 2u * xs4); }
    if (T > 3u) { r.lo.w = xdot(w, xi + 3u * xs4); }
    if (T > 4u) { r.hi.x = xdot(w, xi + 4u * xs4); }
    if (T > 5u) { r.hi.y = xdot(w, xi + 5u * xs4); }
    if (T > 6u) { r.hi.z = xdot(w, xi + 6u * xs4); }
    if (T > 7u) { r.hi.w = xdot(w, xi + 7u * xs4); }
    return r;
}

// Tree-sums `va` and `vb` over the TPR4 lanes of each group; every invocation gets its
// group's sums.
fn reduce_pair(va: vec4<f32>, vb: vec4<f32>, lid: u32) -> Acc8 {
    red[lid] = va;
    red[WG + lid] = vb;
    workgroupBarrier();
    let lane = lid % TPR4;
    for (var s = TPR4 / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            red[lid] += red[lid + s];
            red[WG + lid] += red[WG + lid + s];
        }
        workgroupBarrier();
    }
    let g0 = lid - lane;
    let r = Acc8(red[g0], red[WG + g0]);
    workgroupBarrier();
    return r;
}

struct Acc8x2 {
    a: Acc8,
    b: Acc8,
}

// This lane's partial dots of weight rows at 16-byte word offsets `wa` and `wb` (NONE =
// inactive; `wb` only used when RR = 2) with the T x rows at vec4 offset `xb`.
fn gemv4_partial(wa: u32, wb: u32, xb: u32, lane: u32) -> Acc8x2 {
    var a = Acc8(vec4<f32>(0.0), vec4<f32>(0.0));
    var b = Acc8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (wa != NONE) {
        let kw = P.k / EPV;
        let xs4 = P.x_stride / 4u;
        let wb2 = select(wa, wb, RR > 1u && wb != NONE);
        for (var q = lane; q < kw; q += TPR4) {
            let xi = xb + q * (EPV / 4u);
            let da = dots_word(wa + q, xi, xs4);
            a.lo += da.lo;
            a.hi += da.hi;
            if (RR > 1u) {
                let db = dots_word(wb2 + q, xi, xs4);
                b.lo += db.lo;
                b.hi += db.hi;
            }
        }
    }
    return Acc8x2(a, b);
}

@compute @workgroup_size(256)
fn gemv4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let sub = lid / TPR4;
    let lane = lid % TPR4;
    let na = (g * (WG / TPR4) + sub) * RR;
    let nb = na + 1u;
    let rw = P.ws / EPV;                // 16-byte words per weight row
    let part = gemv4_partial(select(NONE, na * rw, na < P.n), select(NONE, nb * rw, nb < P.n), P.x_off / 4u, lane);
    let a = part.a;
    let b = part.b;
    let lo = reduce_pair(a.lo, b.lo, lid);
    var hi = Acc8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (T > 4u) {
        hi = reduce_pair(a.hi, b.hi, lid);
    }
    if (lane < T) {
        let t = lane;
        let ya = select(lo.lo, hi.lo, t >= 4u)[t % 4u];
        let yb = select(lo.hi, hi.hi, t >= 4u)[t % 4u];
        if (na < P.n) {
            store_one(P.y_off + t * P.y_stride + na, ya);
        }
        if (RR > 1u && nb < P.n) {
            store_one(P.y_off + t * P.y_stride + nb, yb);
        }
    }
}

// gemv4q: one x row (T = 1), quantized weights, 4 consecutive weight rows per lane. The x
// floats of a step are loaded once into registers and used for all 4 rows: the L1 traffic
// for x, which bounds the GEMV when the weight bytes per element are few, drops 4-fold
// against one row per lane.
struct X8 {
    a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>,
    e: vec4<f32>, f: vec4<f32>, g: vec4<f32>, h: vec4<f32>,
}

fn dotq_x(wi: u32, x: X8) -> f32 {
    let w = unpack_q(w4[wi]);
    var s = (dot(w.a, x.a) + dot(w.b, x.b)) + (dot(w.c, x.c) + dot(w.d, x.d));
    if (EPV == 32u) {
        s += (dot(w.e, x.e) + dot(w.f, x.f)) + (dot(w.g, x.g) + dot(w.h, x.h));
    }
    return s * q_scale((wi * EPV) / QB);
}

// The 4 rows' word offsets `wo` with NONE (a row that does not exist) replaced by a live
// row's, whose sum is then computed but not used; all NONE stays all NONE.
fn live_rows(wo: vec4<u32>) -> vec4<u32> {
    var live = NONE;
    for (var j = 0u; j < 4u; j++) {
        if (live == NONE && wo[j] != NONE) {
            live = wo[j];
        }
    }
    return select(vec4<u32>(live), wo, wo != vec4<u32>(NONE));
}

// The 4 rows' partial dots of this lane with the x row at vec4 offset `xb`; `wo` holds the
// rows' word offsets, NONE for a row that does not exist (all NONE: zeros).
fn quad_partial(wo: vec4<u32>, xb: u32, lane: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    let w = live_rows(wo);
    if (w.x == NONE) {
        return acc;
    }
    let kw = P.k / EPV;
    for (var q = lane; q < kw; q += TPR4) {
        let x = load_xw(xb + q * (EPV / 4u));
        acc += vec4<f32>(dotq_x(w.x + q, x), dotq_x(w.y + q, x), dotq_x(w.z + q, x), dotq_x(w.w + q, x));
    }
    return acc;
}

// The first of the 4 dense rows lane group lid / TPR4 of workgroup g takes (4 rows per
// lane, WG / TPR4 * 4 rows per workgroup).
fn dense_quad_row(g: u32, lid: u32) -> u32 {
    return (g * (WG / TPR4) + lid / TPR4) * 4u;
}

// Workgroup g's item (slot or expert) and first row, where each item's P.n rows go to
// workgroups in blocks of `per` rows.
fn item_block(g: u32, per: u32) -> vec2<u32> {
    let blocks = (P.n + per - 1u) / per;
    return vec2<u32>(g / blocks, (g % blocks) * per);
}

// For a routed GEMV with 4 rows per lane: workgroup g's item (slot or expert) among the
// P.n-row blocks of WG / TPR4 * 4 rows, and the first of the 4 rows lid's lane group takes.
fn block_quad_row(g: u32, lid: u32) -> vec2<u32> {
    let b = item_block(g, WG / TPR4 * 4u);
    return vec2<u32>(b.x, b.y + lid / TPR4 * 4u);
}

// Word offset of dense weight row n, NONE past P.n.
fn dense_word_row(n: u32) -> u32 {
    return select(NONE, n * (P.ws / EPV), n < P.n);
}

// Word offset in this chunk of expert e's row n, NONE where the row is past the expert or
// outside the chunk (a chunk boundary inside an expert).
fn expert_word_row(e: u32, n: u32) -> u32 {
    let gr = expert_row(e, n);
    let live = n < P.n && gr >= P.row0 && gr < P.row0 + P.crow;
    return select(NONE, (gr - P.row0) * (P.ws / EPV), live);
}

// Word offsets of the dense weight rows n0 .. n0 + 3 (4 rows per lane), NONE past P.n.
fn dense_quad(n0: u32) -> vec4<u32> {
    return vec4<u32>(dense_word_row(n0), dense_word_row(n0 + 1u), dense_word_row(n0 + 2u), dense_word_row(n0 + 3u));
}

// Word offsets in this chunk of expert e's rows n0 .. n0 + 3 ([`expert_word_row`]).
fn expert_quad(e: u32, n0: u32) -> vec4<u32> {
    return vec4<u32>(expert_word_row(e, n0), expert_word_row(e, n0 + 1u), expert_word_row(e, n0 + 2u), expert_word_row(e, n0 + 3u));
}

// Writes y[at] = v, or with P.accumulate adds v to it (the residual add folded in).
fn store_one(at: u32, v: f32) {
    var s = v;
    if (P.accumulate == 1u) {
        s += y[at];
    }
    y[at] = s;
}

// Writes (or, with P.accumulate, adds to: the residual add folded in) the rows that exist
// of a lane group's 4 sums: y[at + j] for wo[j] != NONE.
fn store_quad(v: vec4<f32>, wo: vec4<u32>, at: u32) {
    for (var j = 0u; j < 4u; j++) {
        if (wo[j] != NONE) {
            store_one(at + j, v[j]);
        }
    }
}

// Reduces the lanes' partial dots and writes (or adds to) the rows that exist: y[base + n0 + j].
fn quad_store(acc: vec4<f32>, wo: vec4<u32>, base: u32, n0: u32, lid: u32) {
    let r = reduce_pair(acc, vec4<f32>(0.0), lid);
    if (lid % TPR4 == 0u) {
        store_quad(r.lo, wo, base + n0);
    }
}

@compute @workgroup_size(256)
fn gemv4q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let n0 = dense_quad_row(g, lid);
    let wo = dense_quad(n0);
    quad_store(quad_partial(wo, P.x_off / 4u, lid % TPR4), wo, P.y_off, n0, lid);
}

// gemv4q for routed experts: one slot per workgroup, WG / TPR4 * 4 rows of its expert, 4
// rows per lane sharing the x loads.
@compute @workgroup_size(256)
fn gemv4q_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let at = block_quad_row(g, lid);
    let slot = at.x;
    let lane = lid % TPR4;
    let n0 = at.y;
    var wo = vec4<u32>(NONE);
    var xb = 0u;
    let e = live_expert(slot);
    if (e != NONE) {
        xb = slot_x(slot) / 4u;
        wo = expert_quad(e, n0);
    }
    quad_store(quad_partial(wo, xb, lane), wo, P.y_off + slot * P.y_stride, n0, lid);
}

// ---- transposed GEMV per slot: y[s, c] = Σ_{d < n} x[s, d] · W_e[d, c] ----------------
// The rows of a window (expert_row) weighted by x and summed: absorbed MLA's query
// absorption at decode, one slot per head. Workgroup: one slot × TW 16-byte words of
// columns. Its invocations walk the window's rows in TG groups (row d in group d % TG), each
// loading its column word of the row and accumulating the word's EPV columns; the groups'
// sums meet in workgroup memory, 8 columns of each word per round.
const TW: u32 = 8u;
const TG: u32 = WG / TW;

// The 16-byte word at index wi decoded and scaled (one scale per word, as the GEMVs assume):
// EPV values in order, zeros after them.
fn word_vals(v: vec4<u32>, wi: u32) -> WQ {
    let z = vec4<f32>(0.0);
    if (W_DTYPE >= 3u) {
        let s = q_scale((wi * EPV) / QB);
        let q = unpack_q(v);
        return WQ(q.a * s, q.b * s, q.c * s, q.d * s, q.e * s, q.f * s, q.g * s, q.h * s);
    }
    let f = unpack_w(v);
    return WQ(f.lo, f.hi, z, z, z, z, z, z);
}

fn wq_axpy(acc: ptr<function, WQ>, a: f32, v: WQ) {
    (*acc).a += a * v.a;
    (*acc).b += a * v.b;
    if (EPV > 8u) {
        (*acc).c += a * v.c;
        (*acc).d += a * v.d;
    }
    if (EPV > 16u) {
        (*acc).e += a * v.e;
        (*acc).f += a * v.f;
        (*acc).g += a * v.g;
        (*acc).h += a * v.h;
    }
}

fn wq_part(v: WQ, i: u32) -> vec4<f32> {
    switch i {
        case 0u: { return v.a; }
        case 1u: { return v.b; }
        case 2u: { return v.c; }
        case 3u: { return v.d; }
        case 4u: { return v.e; }
        case 5u: { return v.f; }
        case 6u: { return v.g; }
        default: { return v.h; }
    }
}

@compute @workgroup_size(256)
fn gemvt_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let kw = P.k / EPV;
    let slabs = (kw + TW - 1u) / TW;
    let slot = g / slabs;
    let w0 = (g % slabs) * TW;
    let cw = w0 + lid % TW;
    let rg = lid / TW;
    let z = vec4<f32>(0.0);
    var acc = WQ(z, z, z, z, z, z, z, z);
    // Uniform across the workgroup: every invocation has the same slot and expert.
    var live = false;
    if (slot < P.rows) {
        let e = expert_of(slot);
        live = e < P.n_experts;
        if (live && cw < kw) {
            let xb = slot_x(slot);
            let rw = P.ws / EPV;
            for (var d = rg; d < P.n; d += TG) {
                let gr = expert_row(e, d);
                if (gr >= P.row0 && gr < P.row0 + P.crow) {
                    let wi = (gr - P.row0) * rw + cw;
                    wq_axpy(&acc, x[xb + d], word_vals(w4[wi], wi));
                }
            }
        }
    }
    for (var r = 0u; r < EPV / 4u; r += 2u) {
        red[2u * lid] = wq_part(acc, r);
        red[2u * lid + 1u] = wq_part(acc, r + 1u);
        workgroupBarrier();
        if (lid < TW * 8u) {
            let ow = lid / 8u;
            let j = lid % 8u;
            var sum = 0.0;
            for (var q = 0u; q < TG; q++) {
                sum += red[2u * (q * TW + ow) + j / 4u][j % 4u];
            }
            if (live && w0 + ow < kw && 4u * r + j < EPV) {
                y[P.y_off + slot * P.y_stride + (w0 + ow) * EPV + 4u * r + j] = sum;
            }
        }
        workgroupBarrier();
    }
}

// One slot (T = 1) per workgroup, WG / TPR4 * RR rows of its expert.
@compute @workgroup_size(256)
fn gemv4_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let per = WG / TPR4 * RR;
    let groups = (P.n + per - 1u) / per;
    let slot = g / groups;
    let sub = lid / TPR4;
    let lane = lid % TPR4;
    let na = (g % groups) * per + sub * RR;
    let nb = na + 1u;
    let rw = P.ws / EPV;
    var wa = NONE;
    var wb = NONE;
    var xb = 0u;
    var e = 0u;
    if (slot < P.rows) {
        e = expert_of(slot);
        if (e < P.n_experts) {
            xb = slot_x(slot) / 4u;
            let ga = expert_row(e, na);
            if (na < P.n && ga >= P.row0 && ga < P.row0 + P.crow) {
                wa = (ga - P.row0) * rw;
            }
            let gb = ga + 1u;
            if (nb < P.n && gb >= P.row0 && gb < P.row0 + P.crow) {
                wb = (gb - P.row0) * rw;
            }
        }
    }
    // Row b may lie in this chunk when row a does not (a chunk boundary inside an expert).
    var part: Acc8x2;
    if (wa == NONE) {
        part = gemv4_partial(wb, NONE, xb, lane);
        part.b = part.a;
        part.a = Acc8(vec4<f32>(0.0), vec4<f32>(0.0));
    } else {
        part = gemv4_partial(wa, wb, xb, lane);
    }
    let r = reduce_pair(part.a.lo, part.b.lo, lid);
    if (lane == 0u) {
        let base = P.y_off + slot * P.y_stride;
        if (wa != NONE) {
            y[base + na] = r.lo.x;
        }
        if (RR > 1u && wb != NONE) {
            y[base + nb] = r.hi.x;
        }
    }
}

// ---- GEMV for CPU adapters: RR = 4 or 8 weight rows per lane, T x rows ---------------
// On a CPU adapter (lavapipe) a storage load whose address may differ between invocations
// runs as a loop over the SIMD lanes: a bounds check, a scalar load and an insert per lane
// and component, about 40 vector FMAs' time for a vec4. gemv4 loads each x word once per
// pair of weight rows, so at 8 x rows nine in ten of its loads are x and its cost grows
// with the rows. Here a lane takes RR weight rows (one or two quads) and loads each x row's
// word once for all of them. Workgroups of WGC lanes, TPR4 lanes per row group splitting
// K; the partials meet in workgroup memory behind one barrier.
const CQ: u32 = RR / 4u;             // quads of weight rows per lane (1 or 2)
const CG: u32 = max(WGC / TPR4, 1u); // row groups per workgroup (the max: other entries' TPR4)

// The words at index q of a quad's 4 rows (word offsets `wo`, all live), decoded and scaled.
struct WQ4 {
    a: WQ, b: WQ, c: WQ, d: WQ,
}

fn quad_words(wo: vec4<u32>, q: u32) -> WQ4 {
    return WQ4(word_vals(w4[wo.x + q], wo.x + q), word_vals(w4[wo.y + q], wo.y + q),
               word_vals(w4[wo.z + q], wo.z + q), word_vals(w4[wo.w + q], wo.w + q));
}

// The EPV floats of x at vec4 index xi (zeros after them).
fn load_xw(xi: u32) -> X8 {
    let z = vec4<f32>(0.0);
    var x = X8(x4[xi], z, z, z, z, z, z, z);
    if (EPV > 4u) {
        x.b = x4[xi + 1u];
    }
    if (EPV > 8u) {
        x.c = x4[xi + 2u];
        x.d = x4[xi + 3u];
    }
    if (EPV > 16u) {
        x.e = x4[xi + 4u];
        x.f = x4[xi + 5u];
        x.g = x4[xi + 6u];
        x.h = x4[xi + 7u];
    }
    return x;
}

fn wdot(w: WQ, x: X8) -> f32 {
    var s = dot(w.a, x.a);
    if (EPV > 4u) {
        s += dot(w.b, x.b);
    }
    if (EPV > 8u) {
        s += dot(w.c, x.c) + dot(w.d, x.d);
    }
    if (EPV > 16u) {
        s += (dot(w.e, x.e) + dot(w.f, x.f)) + (dot(w.g, x.g) + dot(w.h, x.h));
    }
    return s;
}

fn quad_dots(w: WQ4, x: X8) -> vec4<f32> {
    return vec4<f32>(wdot(w.a, x), wdot(w.b, x), wdot(w.c, x), wdot(w.d, x));
}

// The dots of x's EPV floats with the lane's quads (b's only when CQ = 2).
fn cpu_row_x(wa: WQ4, wb: WQ4, x: X8) -> Acc8 {
    var r = Acc8(quad_dots(wa, x), vec4<f32>(0.0));
    if (CQ > 1u) {
        r.hi = quad_dots(wb, x);
    }
    return r;
}

// The dots of the x row at vec4 index xi with the lane's quads.
fn cpu_row(wa: WQ4, wb: WQ4, xi: u32) -> Acc8 {
    return cpu_row_x(wa, wb, load_xw(xi));
}

var<workgroup> cred: array<vec4<f32>, WGC * 16u>;   // [lane][x row][quad]

// Sums of the lane's quads of weight rows (b: the second, CQ = 2) per x row: a WQ's field t
// (a, b, .. h) holds x row t's 4 sums.
struct QuadsT {
    a: WQ,
    b: WQ,
}

// The lane's partial sums over its words of rows `oa` (and `ob`) with the T x rows at vec4
// offset xb (rows xs4 apart).
fn cpu_partial(oa: vec4<u32>, ob: vec4<u32>, xb: u32, xs4: u32, lid: u32) -> QuadsT {
    let z = vec4<f32>(0.0);
    var a = WQ(z, z, z, z, z, z, z, z);
    var b = WQ(z, z, z, z, z, z, z, z);
    if (oa.x != NONE) {
        let kw = P.k / EPV;
        for (var q = lid % TPR4; q < kw; q += TPR4) {
            let wa = quad_words(oa, q);
            var wb = wa;
            if (CQ > 1u) {
                wb = quad_words(ob, q);
            }
            let xi = xb + q * (EPV / 4u);
            let r0 = cpu_row(wa, wb, xi); a.a += r0.lo; b.a += r0.hi;
            if (T > 1u) { let r1 = cpu_row(wa, wb, xi + xs4); a.b += r1.lo; b.b += r1.hi; }
            if (T > 2u) { let r2 = cpu_row(wa, wb, xi + 2u * xs4); a.c += r2.lo; b.c += r2.hi; }
            if (T > 3u) { let r3 = cpu_row(wa, wb, xi + 3u * xs4); a.d += r3.lo; b.d += r3.hi; }
            if (T > 4u) { let r4 = cpu_row(wa, wb, xi + 4u * xs4); a.e += r4.lo; b.e += r4.hi; }
            if (T > 5u) { let r5 = cpu_row(wa, wb, xi + 5u * xs4); a.f += r5.lo; b.f += r5.hi; }
            if (T > 6u) { let r6 = cpu_row(wa, wb, xi + 6u * xs4); a.g += r6.lo; b.g += r6.hi; }
            if (T > 7u) { let r7 = cpu_row(wa, wb, xi + 7u * xs4); a.h += r7.lo; b.h += r7.hi; }
        }
    }
    return QuadsT(a, b);
}

// Writes (or adds to) the T x rows' sums of the lane group's rows that exist: y[at + t ·
// P.y_stride + n0 + 4 j + i] for quad j's wo[i] != NONE. With several lanes per group the
// partials `p` meet in workgroup memory first and the group's first lane stores.
fn cpu_store(p: QuadsT, woa: vec4<u32>, wob: vec4<u32>, at: u32, n0: u32, lid: u32) {
    if (TPR4 > 1u) {
        for (var t = 0u; t < T; t++) {
            cred[lid * 16u + 2u * t] = wq_part(p.a, t);
            cred[lid * 16u + 2u * t + 1u] = wq_part(p.b, t);
        }
        workgroupBarrier();
    }
    if (lid % TPR4 != 0u) {
        return;
    }
    for (var t = 0u; t < T; t++) {
        var sa = wq_part(p.a, t);
        var sb = wq_part(p.b, t);
        for (var l = 1u; l < TPR4; l++) {
            sa += cred[(lid + l) * 16u + 2u * t];
            sb += cred[(lid + l) * 16u + 2u * t + 1u];
        }
        let row = at + t * P.y_stride + n0;
        store_quad(sa, woa, row);
        if (CQ > 1u) {
            store_quad(sb, wob, row + 4u);
        }
    }
}

// The lane's two quads' word offsets (`woa`, `wob`) with every row that does not exist
// replaced by a live row of either quad, whose sums are computed but not stored (a chunk
// boundary inside an expert can leave quad a empty and b not); no live row: all NONE.
fn live_quads(woa: vec4<u32>, wob: vec4<u32>) -> array<vec4<u32>, 2> {
    let la = live_rows(woa);
    let lb = live_rows(wob);
    let a = select(la, vec4<u32>(lb.x), la.x == NONE);
    return array<vec4<u32>, 2>(a, select(lb, vec4<u32>(a.x), lb.x == NONE));
}

// The word offsets of the lane group's quads of dense rows from n0 (the second: NONE unless
// CQ = 2).
fn dense_quads(n0: u32) -> array<vec4<u32>, 2> {
    var wob = vec4<u32>(NONE);
    if (CQ > 1u) {
        wob = dense_quad(n0 + 4u);
    }
    return array<vec4<u32>, 2>(dense_quad(n0), wob);
}

// The first weight row of lid's lane group in workgroup g's block of WGC / TPR4 · RR rows.
fn cpu_row0(g: u32, lid: u32) -> u32 {
    return g * (CG * RR) + lid / TPR4 * RR;
}

@compute @workgroup_size(WGC)
fn gemv_cpu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let n0 = cpu_row0(wid.x + wid.y * nwg.x, lid);
    let w = dense_quads(n0);
    let l = live_quads(w[0], w[1]);
    cpu_store(cpu_partial(l[0], l[1], P.x_off / 4u, P.x_stride / 4u, lid), w[0], w[1], P.y_off, n0, lid);
}

// gemv_cpu for routed experts: one slot (T = 1) per workgroup, WGC / TPR4 · RR rows of its
// expert.
@compute @workgroup_size(WGC)
fn gemv_cpu_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let b = item_block(wid.x + wid.y * nwg.x, CG * RR);
    let slot = b.x;
    let n0 = b.y + lid / TPR4 * RR;
    var woa = vec4<u32>(NONE);
    var wob = vec4<u32>(NONE);
    var xb = 0u;
    let e = live_expert(slot);
    if (e != NONE) {
        xb = slot_x(slot) / 4u;
        woa = expert_quad(e, n0);
        if (CQ > 1u) {
            wob = expert_quad(e, n0 + 4u);
        }
    }
    let l = live_quads(woa, wob);
    cpu_store(cpu_partial(l[0], l[1], xb, 0u, lid), woa, wob, P.y_off + slot * P.y_stride, n0, lid);
}

// gemvt_experts for CPU adapters: one lane per (slot, column word) walks all the window's
// rows itself, so no lanes split a sum (no workgroup memory, no barrier) and no lane idles
// past a narrow product's columns.
@compute @workgroup_size(WGC)
fn gemvt_cpu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let kw = P.k / EPV;
    let item = (wid.x + wid.y * nwg.x) * WGC + lid;
    let slot = item / kw;
    let cw = item % kw;
    let e = live_expert(slot);
    if (e == NONE) {
        return;
    }
    let z = vec4<f32>(0.0);
    var acc = WQ(z, z, z, z, z, z, z, z);
    let xb = slot_x(slot);
    let rw = P.ws / EPV;
    for (var d = 0u; d < P.n; d++) {
        let gr = expert_row(e, d);
        if (gr >= P.row0 && gr < P.row0 + P.crow) {
            let wi = (gr - P.row0) * rw + cw;
            wq_axpy(&acc, x[xb + d], word_vals(w4[wi], wi));
        }
    }
    let yb = P.y_off + slot * P.y_stride + cw * EPV;
    for (var r = 0u; r < EPV / 4u; r++) {
        let v = wq_part(acc, r);
        y[yb + 4u * r] = v.x;
        y[yb + 4u * r + 1u] = v.y;
        y[yb + 4u * r + 2u] = v.z;
        y[yb + 4u * r + 3u] = v.w;
    }
}

// ---- GEMM, 64×64 tiles ----------------------------------------------------------------
// Invocation (tx, ty) = (lid % 16, lid / 16) owns tile rows 4 ty .. 4 ty + 3 and columns
// 4 tx .. 4 tx + 3. Tiles are stored k-major as vec4s of 4 consecutive rows / columns.

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

var<workgroup> As: array<vec4<f32>, 256>;   // [BK][BM / 4]
var<workgroup> Bs: array<vec4<f32>, 256>;   // [BK][BN / 4]

struct Acc16 {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
}

fn xload(row: u32, k: u32) -> f32 {
    if (row == NONE || k >= P.k) {
        return 0.0;
    }
    return x[row + k];
}

// The query row whose selected positions `gather_row` reads (mla_values sets them): its
// first index in binding 5 and its count.
var<private> g_first: u32;
var<private> g_count: u32;

// Element offset in this dispatch's cache segment of the row of selected position k of
// the query row set in g_first / g_count: NONE past the count or outside the segment
// (P.seg_lo .. P.seg_lo + P.seg_n).
fn gather_row(k: u32) -> u32 {
    if (k >= g_count) {
        return NONE;
    }
    return seg_row(sel_pos(g_first + k));
}

// mla_logits / mla_values (float weights: no scales) take the selected positions in binding 4
// and their counts in binding 5: bindings every tile entry has, so that the gather in wpair
// adds none to the others' layouts.
fn sel_pos(i: u32) -> u32 {
    return wscale[i];
}
fn sel_count(t: u32) -> u32 {
    return experts[t];
}

// The element offset of cache position `pos` in this dispatch's segment, NONE outside it.
fn seg_row(pos: u32) -> u32 {
    if (pos < P.seg_lo || pos - P.seg_lo >= P.seg_n) {
        return NONE;
    }
    return (pos - P.seg_lo) * P.ws;
}

fn wpair(row: u32, k: u32) -> vec2<f32> {
    if (row == NONE || k >= P.k) {
        return vec2<f32>(0.0);
    }
    if (P.w_t == 2u) {
        // Transposed and gathered (mla_values): K index k is the cache row of the query's
        // k-th selected position, `row` the column.
        let ra = gather_row(k);
        let rb = gather_row(k + 1u);
        var v = vec2<f32>(0.0);
        if (ra != NONE) {
            v.x = wload(row + ra);
        }
        if (rb != NONE) {
            v.y = wload(row + rb);
        }
        return v;
    }
    if (P.w_t != 0u) {
        // Transposed: `row` is the column's first element, K runs down the rows.
        var b = 0.0;
        if (k + 1u < P.k) {
            b = wload(row + (k + 1u) * P.ws);
        }
        return vec2<f32>(wload(row + k * P.ws), b);
    }
    if (k + 1u < P.k) {
        return wload2(row + k);
    }
    return vec2<f32>(wload(row + k), 0.0);
}

// One 64 × 64 output tile over the whole K. `xr[p]`: element offset of x for tile row
// `lid / 16 + 16 p` (NONE = zero row); `wr[q]`: element offset in the chunk of weight row
// `lid / 8 + 32 q` (NONE = zero row). The K loop stops at `kend` (≤ P.k: past it x or the
// weights must be zero; bounds are P.k's). Call in uniform control flow.
fn tile64(xr: vec4<u32>, wr: vec2<u32>, lid: u32, kend: u32) -> Acc16 {
    var acc = Acc16(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    let ak = lid % BK;
    let am = lid / BK;           // + 16 p: vec4 index am / 4 + 4 p, component am % 4
    let bp = lid % 8u;
    let bn = lid / 8u;           // + 32 q: vec4 index bn / 4 + 8 q, component bn % 4
    let tx = lid % 16u;
    let ty = lid / 16u;
    let ai = ak * (BM / 4u) + am / 4u;
    let ac = am % 4u;
    let bi = 2u * bp * (BN / 4u) + bn / 4u;
    let bc = bn % 4u;
    // The next K-tile's values are loaded into registers while this one is computed.
    var pa = vec4<f32>(xload(xr.x, ak), xload(xr.y, ak), xload(xr.z, ak), xload(xr.w, ak));
    var pb0 = wpair(wr.x, 2u * bp);
    var pb1 = wpair(wr.y, 2u * bp);
    for (var k0 = 0u; k0 < kend; k0 += BK) {
        As[ai][ac] = pa.x;
        As[ai + 4u][ac] = pa.y;
        As[ai + 8u][ac] = pa.z;
        As[ai + 12u][ac] = pa.w;
        Bs[bi][bc] = pb0.x;
        Bs[bi + BN / 4u][bc] = pb0.y;
        Bs[bi + 8u][bc] = pb1.x;
        Bs[bi + 8u + BN / 4u][bc] = pb1.y;
        workgroupBarrier();
        let ka = k0 + BK + ak;
        pa = vec4<f32>(xload(xr.x, ka), xload(xr.y, ka), xload(xr.z, ka), xload(xr.w, ka));
        let kb = k0 + BK + 2u * bp;
        pb0 = wpair(wr.x, kb);
        pb1 = wpair(wr.y, kb);
        for (var kk = 0u; kk < BK; kk++) {
            let a = As[kk * (BM / 4u) + ty];
            let b = Bs[kk * (BN / 4u) + tx];
            acc.r0 = fma(vec4<f32>(a.x), b, acc.r0);
            acc.r1 = fma(vec4<f32>(a.y), b, acc.r1);
            acc.r2 = fma(vec4<f32>(a.z), b, acc.r2);
            acc.r3 = fma(vec4<f32>(a.w), b, acc.r3);
        }
        workgroupBarrier();
    }
    return acc;
}

// Stores tile row `i` of an invocation's 4 × 4 block: y[base + c] for columns n0 + 4 tx + j < nmax.
fn store4(base: u32, n: u32, nmax: u32, v: vec4<f32>) {
    if (n < nmax) { y[base + n] = v.x; }
    if (n + 1u < nmax) { y[base + n + 1u] = v.y; }
    if (n + 2u < nmax) { y[base + n + 2u] = v.z; }
    if (n + 3u < nmax) { y[base + n + 3u] = v.w; }
}

// Stores an invocation's part of a TM × TN tile (what `tile` returned): its rows
// t0 + 64 rh .. + 3 below `tmax`, `ys` apart from `base`, columns n0 + 64 h + 4 (lid % 16) .. + 3
// below P.n, for each block TN / 64 · rh + h.
fn store_tile(acc: array<Acc16, TM / 64u * (TN / 64u)>, base: u32, ys: u32, t0: u32, tmax: u32, n0: u32, lid: u32) {
    for (var rh = 0u; rh < TM / 64u; rh++) {
        let t = t0 + 64u * rh;
        let at = base + 64u * rh * ys;
        for (var h = 0u; h < TN / 64u; h++) {
            let a = acc[(TN / 64u) * rh + h];
            let nc = n0 + 64u * h + 4u * (lid % 16u);
            if (t < tmax) { store4(at, nc, P.n, a.r0); }
            if (t + 1u < tmax) { store4(at + ys, nc, P.n, a.r1); }
            if (t + 2u < tmax) { store4(at + 2u * ys, nc, P.n, a.r2); }
            if (t + 3u < tmax) { store4(at + 3u * ys, nc, P.n, a.r3); }
        }
    }
}

@compute @workgroup_size(256)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let mt = (P.rows + TM - 1u) / TM;
    let nt = (P.n + TN - 1u) / TN;
    if (g >= mt * nt) {
        return;
    }
    // Consecutive workgroups share a weight tile (the larger operand).
    let m0 = (g % mt) * TM;
    let n0 = (g / mt) * TN;
    var xr: array<u32, TM / 16u>;
    for (var p = 0u; p < TM / 16u; p++) {
        let t = m0 + lid / 16u + 16u * p;
        xr[p] = select(NONE, P.x_off + t * P.x_stride, t < P.rows);
    }
    var wr: array<u32, TN / 32u>;
    for (var q = 0u; q < TN / 32u; q++) {
        let n = n0 + lid / 8u + 32u * q;
        wr[q] = select(NONE, n * P.ws, n < P.n);
    }
    let acc = tile(xr, wr, lid, P.k);
    let t0 = m0 + 4u * (lid / 16u);
    store_tile(acc, P.y_off + t0 * P.y_stride, P.y_stride, t0, P.rows, n0, lid);
}

// ---- GEMM, 128×128 tiles ----------------------------------------------------------------
// Invocation (tx, ty) owns rows 4 ty + {0..3} and 64 + 4 ty + {0..3}, columns likewise.

const CM: u32 = 128u;
const CK: u32 = 8u;

var<workgroup> As2: array<vec4<f32>, 256>;   // [CK][CM / 4]
var<workgroup> Bs2: array<vec4<f32>, 256>;   // [CK][CM / 4]

@compute @workgroup_size(256)
fn gemm128(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let mt = (P.rows + CM - 1u) / CM;
    let nt = (P.n + CM - 1u) / CM;
    if (g >= mt * nt) {
        return;
    }
    let m0 = (g % mt) * CM;
    let n0 = (g / mt) * CM;
    // A loads: column lid % 8, rows lid / 8 + 32 p. B loads: pair lid % 4, rows lid / 4 + 64 q.
    let ak = lid % CK;
    let am = lid / CK;
    var xr = vec4<u32>(NONE);
    for (var p = 0u; p < 4u; p++) {
        let t = m0 + am + 32u * p;
        if (t < P.rows) {
            xr[p] = P.x_off + t * P.x_stride;
        }
    }
    let bp = lid % 4u;
    let bn = lid / 4u;
    var wr = vec2<u32>(NONE);
    for (var q = 0u; q < 2u; q++) {
        let n = n0 + bn + 64u * q;
        if (n < P.n) {
            wr[q] = n * P.ws;
        }
    }
    let tx = lid % 16u;
    let ty = lid / 16u;
    var c00 = vec4<f32>(0.0); var c01 = vec4<f32>(0.0); var c02 = vec4<f32>(0.0); var c03 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0); var c11 = vec4<f32>(0.0); var c12 = vec4<f32>(0.0); var c13 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0); var c21 = vec4<f32>(0.0); var c22 = vec4<f32>(0.0); var c23 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0); var c31 = vec4<f32>(0.0); var c32 = vec4<f32>(0.0); var c33 = vec4<f32>(0.0);
    let ai = ak * (CM / 4u) + am / 4u;
    let ac = am % 4u;
    let bi = 2u * bp * (CM / 4u) + bn / 4u;
    let bc = bn % 4u;
    // The next K-tile's values are loaded into registers while this one is computed.
    var pa = vec4<f32>(xload(xr.x, ak), xload(xr.y, ak), xload(xr.z, ak), xload(xr.w, ak));
    var pb0 = wpair(wr.x, 2u * bp);
    var pb1 = wpair(wr.y, 2u * bp);
    for (var k0 = 0u; k0 < P.k; k0 += CK) {
        As2[ai][ac] = pa.x;
        As2[ai + 8u][ac] = pa.y;
        As2[ai + 16u][ac] = pa.z;
        As2[ai + 24u][ac] = pa.w;
        Bs2[bi][bc] = pb0.x;
        Bs2[bi + CM / 4u][bc] = pb0.y;
        Bs2[bi + 16u][bc] = pb1.x;
        Bs2[bi + 16u + CM / 4u][bc] = pb1.y;
        workgroupBarrier();
        let ka = k0 + CK + ak;
        pa = vec4<f32>(xload(xr.x, ka), xload(xr.y, ka), xload(xr.z, ka), xload(xr.w, ka));
        let kb = k0 + CK + 2u * bp;
        pb0 = wpair(wr.x, kb);
        pb1 = wpair(wr.y, kb);
        for (var kk = 0u; kk < CK; kk++) {
            let a0 = As2[kk * (CM / 4u) + ty];
            let a1 = As2[kk * (CM / 4u) + 16u + ty];
            let b0 = Bs2[kk * (CM / 4u) + tx];
            let b1 = Bs2[kk * (CM / 4u) + 16u + tx];
            // rows 4 ty + i (a0) and 64 + 4 ty + i (a1); columns b0 | b1.
            c00 = fma(vec4<f32>(a0.x), b0, c00); c01 = fma(vec4<f32>(a0.x), b1, c01);
            c02 = fma(vec4<f32>(a0.y), b0, c02); c03 = fma(vec4<f32>(a0.y), b1, c03);
            c10 = fma(vec4<f32>(a0.z), b0, c10); c11 = fma(vec4<f32>(a0.z), b1, c11);
            c12 = fma(vec4<f32>(a0.w), b0, c12); c13 = fma(vec4<f32>(a0.w), b1, c13);
            c20 = fma(vec4<f32>(a1.x), b0, c20); c21 = fma(vec4<f32>(a1.x), b1, c21);
            c22 = fma(vec4<f32>(a1.y), b0, c22); c23 = fma(vec4<f32>(a1.y), b1, c23);
            c30 = fma(vec4<f32>(a1.z), b0, c30); c31 = fma(vec4<f32>(a1.z), b1, c31);
            c32 = fma(vec4<f32>(a1.w), b0, c32); c33 = fma(vec4<f32>(a1.w), b1, c33);
        }
        workgroupBarrier();
    }
    let ta = m0 + 4u * ty;
    let tb = ta + 64u;
    let na = n0 + 4u * tx;
    let nb = na + 64u;
    let ys = P.y_stride;
    if (ta < P.rows) { store4(P.y_off + ta * ys, na, P.n, c00); store4(P.y_off + ta * ys, nb, P.n, c01); }
    if (ta + 1u < P.rows) { store4(P.y_off + (ta + 1u) * ys, na, P.n, c02); store4(P.y_off + (ta + 1u) * ys, nb, P.n, c03); }
    if (ta + 2u < P.rows) { store4(P.y_off + (ta + 2u) * ys, na, P.n, c10); store4(P.y_off + (ta + 2u) * ys, nb, P.n, c11); }
    if (ta + 3u < P.rows) { store4(P.y_off + (ta + 3u) * ys, na, P.n, c12); store4(P.y_off + (ta + 3u) * ys, nb, P.n, c13); }
    if (tb < P.rows) { store4(P.y_off + tb * ys, na, P.n, c20); store4(P.y_off + tb * ys, nb, P.n, c21); }
    if (tb + 1u < P.rows) { store4(P.y_off + (tb + 1u) * ys, na, P.n, c22); store4(P.y_off + (tb + 1u) * ys, nb, P.n, c23); }
    if (tb + 2u < P.rows) { store4(P.y_off + (tb + 2u) * ys, na, P.n, c30); store4(P.y_off + (tb + 2u) * ys, nb, P.n, c31); }
    if (tb + 3u < P.rows) { store4(P.y_off + (tb + 3u) * ys, na, P.n, c32); store4(P.y_off + (tb + 3u) * ys, nb, P.n, c33); }
}

// ---- grouped GEMM for routed experts ------------------------------------------------------

const LCAP: u32 = TM + WG;              // a partial tile plus one scan block
var<workgroup> slot_list: array<u32, LCAP>;
// The counts are 16 bytes each, not 4: the tensor-core tile's cooperative loads and stores
// need 16-byte aligned workgroup memory, and on the H200 a 4-byte scalar here moved the tile
// arrays off it (wrong values; mla_coop.wgsl found it).
var<workgroup> slot_cnt: array<atomic<u32>, 4>;  // [0]
var<workgroup> slot_cnt_u: array<u32, 4>;        // [0]

// `slot_x(s)`, the x offset of slot s, comes from slot_x.wgsl.

// Stores one row of an invocation's block for slot list entry `li` (if li < m).
fn store_slot(li: u32, m: u32, e: u32, nc: u32, v: vec4<f32>) {
    if (li >= m) {
        return;
    }
    let base = P.y_off + slot_list[li] * P.y_stride;
    for (var j = 0u; j < 4u; j++) {
        let n = nc + j;
        let gr = expert_row(e, n);
        if (n < P.n && gr >= P.row0 && gr < P.row0 + P.crow) {
            y[base + n] = v[j];
        }
    }
}

// Per-head GEMM: slot t · topk + h is token row t's head h, which runs block h
// (rows e_rows apart; the window from r_lo), or its transpose where P.w_t is set. One
// workgroup per (head, row tile, column tile), no slot lists. Weights in one chunk (checked
// by kernels/matmul.rs).
@compute @workgroup_size(256)
fn gemm_heads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let tokens = P.rows / P.topk;
    let mt = (tokens + TM - 1u) / TM;
    let nt = (P.n + TN - 1u) / TN;
    let e = g / (mt * nt);
    if (e >= P.n_experts) {
        return;
    }
    // Consecutive workgroups share a weight tile.
    let m0 = (g % mt) * TM;
    let n0 = ((g / mt) % nt) * TN;
    var wr: array<u32, TN / 32u>;
    for (var q = 0u; q < TN / 32u; q++) {
        let n = n0 + lid / 8u + 32u * q;
        wr[q] = NONE;
        if (n < P.n) {
            if (P.w_t != 0u) {
                wr[q] = expert_row(e, 0u) * P.ws + n;
            } else {
                wr[q] = expert_row(e, n) * P.ws;
            }
        }
    }
    var xr: array<u32, TM / 16u>;
    for (var p = 0u; p < TM / 16u; p++) {
        let t = m0 + lid / 16u + 16u * p;
        xr[p] = NONE;
        if (t < tokens) {
            xr[p] = slot_x(t * P.topk + e);
        }
    }
    let acc = tile(xr, wr, lid, P.k);
    var yrow = P.topk * P.y_stride;
    if (P.y_row != 0u) {
        yrow = P.y_row;
    }
    let t0 = m0 + 4u * (lid / 16u);
    store_tile(acc, P.y_off + t0 * yrow + e * P.y_stride, yrow, t0, tokens, n0, lid);
}

// Invocation lid's weight rows of expert e for the B loads of the column block at n0 (the
// offsets `tile` takes; NONE past the expert or outside the chunk).
fn expert_wr(e: u32, n0: u32, lid: u32) -> array<u32, TN / 32u> {
    var wr: array<u32, TN / 32u>;
    for (var q = 0u; q < TN / 32u; q++) {
        let n = n0 + lid / 8u + 32u * q;
        let gr = expert_row(e, n);
        wr[q] = NONE;
        if (n < P.n && gr >= P.row0 && gr < P.row0 + P.crow) {
            wr[q] = (gr - P.row0) * P.ws;
        }
    }
    return wr;
}

// Invocation lid's x rows for the A loads of slot list entries 0 .. m - 1: each entry's
// slot's row of x, or where P.x_copy is set, rows first + i of a copy of x in the order of
// the sorted list (the copy's rows P.x_stride apart from P.x_off).
fn slot_xr(first: u32, m: u32, lid: u32) -> array<u32, TM / 16u> {
    var xr: array<u32, TM / 16u>;
    for (var p = 0u; p < TM / 16u; p++) {
        let i = lid / 16u + 16u * p;
        xr[p] = NONE;
        if (i < m) {
            if (P.x_copy != 0u) {
                xr[p] = P.x_off + (first + i) * P.x_stride;
            } else {
                xr[p] = slot_x(slot_list[i]);
            }
        }
    }
    return xr;
}

// Stores a tile's outputs: rows for slot list entries 0 .. m - 1, expert e's columns n0 ...
fn store_expert_tile(acc: array<Acc16, TM / 64u * (TN / 64u)>, m: u32, e: u32, n0: u32, lid: u32) {
    for (var rh = 0u; rh < TM / 64u; rh++) {
        let l0 = 64u * rh + 4u * (lid / 16u);
        for (var h = 0u; h < TN / 64u; h++) {
            let a = acc[(TN / 64u) * rh + h];
            let nc = n0 + 64u * h + 4u * (lid % 16u);
            store_slot(l0, m, e, nc, a.r0);
            store_slot(l0 + 1u, m, e, nc, a.r1);
            store_slot(l0 + 2u, m, e, nc, a.r2);
            store_slot(l0 + 3u, m, e, nc, a.r3);
        }
    }
}

@compute @workgroup_size(256)
fn gemm_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    if (P.e_list != 0u) {
        gemm_experts_listed(wid.x + wid.y * nwg.x, lid);
        return;
    }
    let b = item_block(wid.x + wid.y * nwg.x, TN);
    let e = P.e0 + b.x;
    let n0 = b.y;
    if (e >= P.n_experts || expert_row(e, n0) >= P.row0 + P.crow || expert_row(e, P.n) <= P.row0) {
        return;
    }
    let wr = expert_wr(e, n0, lid);
    if (lid == 0u) {
        atomicStore(&slot_cnt[0], 0u);
    }
    var s0 = 0u;
    loop {
        // Gather slots routed to e until a full tile is ready or all slots are scanned.
        loop {
            workgroupBarrier();
            if (lid == 0u) {
                slot_cnt_u[0] = atomicLoad(&slot_cnt[0]);
            }
            let c = workgroupUniformLoad(&slot_cnt_u[0]);
            if (c >= TM || s0 >= P.rows) {
                break;
            }
            let s = s0 + lid;
            if (s < P.rows) {
                if (expert_of(s) == e) {
                    let i = atomicAdd(&slot_cnt[0], 1u);
                    slot_list[i] = s;
                }
            }
            s0 += WG;
        }
        let c = workgroupUniformLoad(&slot_cnt_u[0]);
        if (c == 0u) {
            break;
        }
        let m = min(c, TM);
        let xr = slot_xr(0u, m, lid);
        store_expert_tile(tile(xr, wr, lid, P.k), m, e, n0, lid);
        // Move the slots beyond this tile to the front.
        let rest = c - m;
        var keep = 0u;
        if (lid < rest) {
            keep = slot_list[m + lid];
        }
        workgroupBarrier();
        if (lid < rest) {
            slot_list[lid] = keep;
        }
        if (lid == 0u) {
            atomicStore(&slot_cnt[0], rest);
        }
    }
}

// gemm_experts over the tiles expert_tiles.wgsl cut (binding 5 holds its table, the sorted
// slots from P.e_list): workgroup g takes tile g / (column blocks), the column block's TN
// columns, so that the workgroups running together share a column block's weights.
fn gemm_experts_listed(g: u32, lid: u32) {
    let blocks = (P.n + TN - 1u) / TN;
    let t = g / blocks;
    let n0 = (g % blocks) * TN;
    if (lid == 0u) {
        slot_cnt_u[0] = NONE;
        if (t < experts[0]) {
            slot_cnt_u[0] = experts[1u + 3u * t];
            slot_cnt_u[1] = experts[2u + 3u * t];
            slot_cnt_u[2] = experts[3u + 3u * t];
        }
    }
    let e = workgroupUniformLoad(&slot_cnt_u[0]);
    if (e == NONE || expert_row(e, n0) >= P.row0 + P.crow || expert_row(e, P.n) <= P.row0) {
        return;
    }
    let first = workgroupUniformLoad(&slot_cnt_u[1]);
    let m = workgroupUniformLoad(&slot_cnt_u[2]);
    let wr = expert_wr(e, n0, lid);
    if (lid < m) {
        slot_list[lid] = experts[P.e_list + first + lid];
    }
    workgroupBarrier();
    let xr = slot_xr(first, m, lid);
    store_expert_tile(tile(xr, wr, lid, P.k), m, e, n0, lid);
}

// ---- sparse MLA's two products over a block of query rows as GEMMs ----------------------
// For query row t of the block (chunk row P.q_row0 + t) and its n = min(counts, topk)
// selected positions s_j = sel_pos((P.q_row0 + t) · topk + j); x rows are per (t, head)
// (P.heads of them a query row, P.x_stride apart), the weights are the cache segment
// (binding 2, rows P.ws elements apart). One workgroup per (t, 64 heads, TN columns).
var<workgroup> mla_n: array<u32, 4>;   // [0]: the row's count (16 bytes: see gemm_experts)

// A workgroup's part: its split of the selected positions (mla_values; P.splits of
// them), its query row of the block, first head and first column.
struct MlaTile {
    s: u32,
    t: u32,
    h0: u32,
    c0: u32,
}

// Chunk row i of block row t: P.q_row0 + t (i = 0), or with rows in groups (mla_logits,
// P.q_group = G > 1: block row t is chunk rows q_row0 + G t .., P.heads / G heads each)
// member i of the group (kernels/matmul.rs, `MlaGemm::group`).
fn mla_row(t: u32, i: u32) -> u32 {
    return P.q_row0 + max(P.q_group, 1u) * t + i;
}

// The chunk row whose selection block row t reads: its group's last, whose selection holds
// the others'.
fn mla_sel_row(t: u32) -> u32 {
    return mla_row(t, max(P.q_group, 1u) - 1u);
}

// Workgroup g's part; invocation 0 puts the row's count in mla_n. Workgroups past the
// last split (a grid rounded up) get s ≥ P.splits.
fn mla_tile(g: u32, lid: u32) -> MlaTile {
    let ht = (P.heads + TM - 1u) / TM;
    let nt = (P.n + TN - 1u) / TN;
    let per = max(P.rows * ht * nt, 1u);
    let r = g % per;
    let t = r / (nt * ht);
    if (lid == 0u) {
        mla_n[0] = min(sel_count(mla_sel_row(t)), P.topk);
    }
    return MlaTile(g / per, t, ((r / nt) % ht) * TM, (r % nt) * TN);
}

// Row r (0..3) of an invocation's 4 × 4 block.
fn acc_row(a: Acc16, r: u32) -> vec4<f32> {
    return select(select(a.r0, a.r1, r == 1u), select(a.r2, a.r3, r == 3u), r >= 2u);
}

// x offsets of the tile rows (heads h0 + lid / 16 + 16 p of block row t), from column col.
fn mla_xr(t: u32, h0: u32, lid: u32, col: u32) -> array<u32, TM / 16u> {
    var xr: array<u32, TM / 16u>;
    for (var p = 0u; p < TM / 16u; p++) {
        let h = h0 + lid / 16u + 16u * p;
        xr[p] = select(NONE, P.x_off + (t * P.heads + h) * P.x_stride + col, h < P.heads);
    }
    return xr;
}

// A position outside every segment: a logit whose probability is 0.
const ABSENT_LOGIT: f32 = -1.0e30;

// Logits: y[(t · heads + h) · y_stride + j] = x[t, h, :] · cache[s_j, :P.k] for j < n with
// s_j in this segment; the others get ABSENT_LOGIT from the first segment's dispatch
// (P.accumulate = 0) and are left as they are by the later ones. Columns are positions j.
@compute @workgroup_size(256)
fn mla_logits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let at = mla_tile(g, lid);
    let n = workgroupUniformLoad(&mla_n[0]);
    let t = at.t;
    let j0 = at.c0;
    if (at.s >= P.splits || j0 >= n) {
        return;
    }
    let first = mla_sel_row(t) * P.topk;
    // Heads per chunk row (P.heads / G where rows go in groups of G).
    let qh = P.heads / max(P.q_group, 1u);
    var wr: array<u32, TN / 32u>;
    for (var q = 0u; q < TN / 32u; q++) {
        let j = j0 + lid / 8u + 32u * q;
        wr[q] = NONE;
        if (j < n) {
            wr[q] = seg_row(sel_pos(first + j));
        }
    }
    let acc = tile(mla_xr(t, at.h0, lid, 0u), wr, lid, P.k);
    for (var rb = 0u; rb < TM / 64u * (TN / 64u); rb++) {
        let b = rb % (TN / 64u);
        let jc = j0 + 64u * b + 4u * (lid % 16u);
        var keep = vec4<bool>(false);
        var absent = vec4<bool>(false);
        for (var i = 0u; i < 4u; i++) {
            if (jc + i < n) {
                keep[i] = seg_row(sel_pos(first + jc + i)) != NONE;
                absent[i] = !keep[i] && P.accumulate == 0u;
            }
        }
        for (var r = 0u; r < 4u; r++) {
            let h = at.h0 + 64u * (rb / (TN / 64u)) + 4u * (lid / 16u) + r;
            if (h >= P.heads) {
                break;
            }
            let row = acc_row(acc[rb], r);
            let base = P.y_off + (t * P.heads + h) * P.y_stride + jc;
            // In a group, the row's own count ends its columns (n, the group's, otherwise).
            var own = n;
            if (P.q_group > 1u) {
                own = min(sel_count(mla_row(t, h / qh)), P.topk);
            }
            for (var i = 0u; i < 4u; i++) {
                if (jc + i >= own) {
                    break;
                }
                if (keep[i]) {
                    y[base + i] = row[i];
                } else if (absent[i]) {
                    y[base + i] = ABSENT_LOGIT;
                }
            }
        }
    }
}

// Values: y[s · y_split + t · y_stride + h · P.n + c] (= or, with P.accumulate, +=)
// Σ_j x[t, h, j] · cache[s_j, c] over this segment's s_j, c < P.n, j in split s (P.k
// positions from s · P.k); x rows are the probabilities over j. A split past the row's
// count writes zeros.
@compute @workgroup_size(256)
fn mla_values(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let at = mla_tile(g, lid);
    let n = workgroupUniformLoad(&mla_n[0]);
    let t = at.t;
    if (at.s >= P.splits) {
        return;
    }
    let j0 = at.s * P.k;
    // Uniform (from n and P), for the tile's K loop; g_count, a private, would not be.
    let count = select(0u, min(n - j0, P.k), n > j0);
    g_first = (P.q_row0 + t) * P.topk + j0;
    g_count = count;
    var wr: array<u32, TN / 32u>;
    for (var q = 0u; q < TN / 32u; q++) {
        let c = at.c0 + lid / 8u + 32u * q;
        wr[q] = select(NONE, c, c < P.n);
    }
    let acc = tile(mla_xr(t, at.h0, lid, j0), wr, lid, count);
    for (var rb = 0u; rb < TM / 64u * (TN / 64u); rb++) {
        let c = at.c0 + 64u * (rb % (TN / 64u)) + 4u * (lid % 16u);
        for (var r = 0u; r < 4u; r++) {
            let h = at.h0 + 64u * (rb / (TN / 64u)) + 4u * (lid / 16u) + r;
            if (h >= P.heads) {
                break;
            }
            let row = acc_row(acc[rb], r);
            let base = P.y_off + at.s * P.y_split + t * P.y_stride + h * P.n + c;
            for (var i = 0u; i < 4u; i++) {
                if (c + i < P.n) {
                    if (P.accumulate != 0u) {
                        y[base + i] += row[i];
                    } else {
                        y[base + i] = row[i];
                    }
                }
            }
        }
    }
}
