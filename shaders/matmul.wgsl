// Matrix products over a weight chunk in its stored dtype, f32 accumulation.
//
// Defines (prepended by the wrapper):
//   W_DTYPE: 0 = f32, 1 = bf16, 2 = f16 (weights bound as array<u32>; 16-bit element i
//            lives in word i >> 1, low half = even index).
//   T:       rows of x handled by one GEMV workgroup (1 ..= 8; 1 for the other entries).
//
// Entry points (bindings: 1 = x, 2 = weight chunk, 3 = y, 4 = expert ids):
//   gemv          y[t, n] for all t < T, RPW weight rows n per workgroup.
//   gemm          64×64 tiles of (t × n), K-tiles of 16, 4×4 outputs per invocation.
//   gemv_experts  one slot × RPW expert rows per workgroup.
//   gemm_experts  one (expert, 64-column tile) per workgroup; gathers the slots routed to
//                 that expert into 64-row tiles (a grouped GEMM).

struct Params {
    k: u32,         // columns of W = length of the dot products
    n: u32,         // dense: rows of this chunk; experts: rows per expert
    rows: u32,      // dense: rows of x / y; experts: slots (= tokens * topk)
    topk: u32,      // experts only
    x_off: u32,
    x_stride: u32,
    y_off: u32,     // dense: includes the chunk's first row as a column offset
    y_stride: u32,
    row0: u32,      // experts: first stacked row held by this chunk
    crow: u32,      // experts: rows held by this chunk
    x_per_slot: u32,
    e0: u32,        // experts GEMM: first expert (partly) in this chunk
    n_experts: u32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> experts: array<u32>;

const WG: u32 = 256u;
const TPR: u32 = 64u;            // GEMV: invocations per weight row
const RPW: u32 = WG / TPR;       // GEMV: weight rows per workgroup
const NONE: u32 = 0xffffffffu;

// ---- weight fetch -------------------------------------------------------------------

fn wload(i: u32) -> f32 {
    if (W_DTYPE == 0u) {
        return bitcast<f32>(w[i]);
    }
    let word = w[i >> 1u];
    if (W_DTYPE == 1u) {
        return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
    }
    return unpack2x16float(word)[i & 1u];
}

// Elements i and i + 1.
fn wload2(i: u32) -> vec2<f32> {
    if (W_DTYPE == 0u) {
        return vec2<f32>(bitcast<f32>(w[i]), bitcast<f32>(w[i + 1u]));
    }
    if ((i & 1u) == 0u) {
        let word = w[i >> 1u];
        if (W_DTYPE == 1u) {
            return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
        }
        return unpack2x16float(word);
    }
    return vec2<f32>(wload(i), wload(i + 1u));
}

// ---- GEMV ---------------------------------------------------------------------------

var<workgroup> red: array<f32, 2048>;   // WG * T (T <= 8)

// Partial dots of weight row `wbase` (element index of its column 0; NONE = inactive)
// with x rows `xbase + t * P.x_stride`, over this lane's columns.
fn gemv_partial(wbase: u32, xbase: u32, lane: u32) -> array<f32, T> {
    var acc: array<f32, T>;
    if (wbase == NONE) {
        return acc;
    }
    let k = P.k;
    let pairs = k >> 1u;
    for (var p = lane; p < pairs; p += TPR) {
        let c = p << 1u;
        let wv = wload2(wbase + c);
        for (var t = 0u; t < T; t++) {
            let xo = xbase + t * P.x_stride + c;
            acc[t] += wv.x * x[xo] + wv.y * x[xo + 1u];
        }
    }
    if ((k & 1u) == 1u && lane == TPR - 1u) {
        let wv = wload(wbase + k - 1u);
        for (var t = 0u; t < T; t++) {
            acc[t] += wv * x[xbase + t * P.x_stride + k - 1u];
        }
    }
    return acc;
}

// Sums the partials of the TPR lanes of each row group; afterwards red[t * WG + sub * TPR]
// holds the dot of row group `sub` with x row t.
fn gemv_reduce(acc: array<f32, T>, lid: u32) {
    for (var t = 0u; t < T; t++) {
        red[t * WG + lid] = acc[t];
    }
    workgroupBarrier();
    let lane = lid % TPR;
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (lane < s) {
            for (var t = 0u; t < T; t++) {
                red[t * WG + lid] += red[t * WG + lid + s];
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
        wbase = n * P.k;
    }
    let acc = gemv_partial(wbase, P.x_off, lane);
    gemv_reduce(acc, lid);
    if (lane < T && n < P.n) {
        y[P.y_off + lane * P.y_stride + n] = red[lane * WG + sub * TPR];
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
        let e = experts[slot];
        let gr = e * P.n + n;
        if (e < P.n_experts && gr >= P.row0 && gr < P.row0 + P.crow) {
            wbase = (gr - P.row0) * P.k;
            var r = slot / P.topk;
            if (P.x_per_slot != 0u) {
                r = slot;
            }
            xbase = P.x_off + r * P.x_stride;
        }
    }
    let acc = gemv_partial(wbase, xbase, lane);
    gemv_reduce(acc, lid);
    if (lane == 0u && wbase != NONE) {
        y[P.y_off + slot * P.y_stride + n] = red[sub * TPR];
    }
}

// ---- GEMM ---------------------------------------------------------------------------

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

var<workgroup> As: array<f32, 1024>;   // [BK][BM]
var<workgroup> Bs: array<f32, 1024>;   // [BK][BN]

// One BM × BN output tile over the whole K. `xrows[p]`: element offset of x row
// `lid / 16 + 16 p` of the tile (NONE = zero row); `wrows[q]`: element offset in the chunk
// of weight row `lid / 8 + 32 q` of the tile (NONE = zero row). Returns acc[i * 4 + j] for
// tile row `lid / 16 + 16 i`, tile column `lid % 16 + 16 j`. Call in uniform control flow.
fn gemm_tile(xrows: array<u32, 4>, wrows: array<u32, 2>, lid: u32) -> array<f32, 16> {
    var acc: array<f32, 16>;
    let k = P.k;
    let ak = lid % BK;          // A loads: column in the K-tile
    let am = lid / BK;          //          first row (+16 p)
    let bp = lid % 8u;          // B loads: column pair in the K-tile
    let bn = lid / 8u;          //          first row (+32 q)
    let tx = lid % 16u;
    let ty = lid / 16u;
    for (var k0 = 0u; k0 < k; k0 += BK) {
        let ka = k0 + ak;
        for (var p = 0u; p < 4u; p++) {
            var v = 0.0;
            if (xrows[p] != NONE && ka < k) {
                v = x[xrows[p] + ka];
            }
            As[ak * BM + am + 16u * p] = v;
        }
        let kb = k0 + 2u * bp;
        for (var q = 0u; q < 2u; q++) {
            var v = vec2<f32>(0.0);
            if (wrows[q] != NONE) {
                if (kb + 1u < k) {
                    v = wload2(wrows[q] + kb);
                } else if (kb < k) {
                    v.x = wload(wrows[q] + kb);
                }
            }
            Bs[2u * bp * BN + bn + 32u * q] = v.x;
            Bs[(2u * bp + 1u) * BN + bn + 32u * q] = v.y;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            var a: array<f32, 4>;
            var b: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = As[kk * BM + ty + 16u * i];
                b[i] = Bs[kk * BN + tx + 16u * i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] = fma(a[i], b[j], acc[i * 4u + j]);
                }
            }
        }
        workgroupBarrier();
    }
    return acc;
}

@compute @workgroup_size(256)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let mt = (P.rows + BM - 1u) / BM;
    let nt = (P.n + BN - 1u) / BN;
    if (g >= mt * nt) {
        return;
    }
    // Consecutive workgroups share a weight tile (the larger operand).
    let m0 = (g % mt) * BM;
    let n0 = (g / mt) * BN;
    var xrows: array<u32, 4>;
    for (var p = 0u; p < 4u; p++) {
        let t = m0 + lid / BK + 16u * p;
        xrows[p] = select(NONE, P.x_off + t * P.x_stride, t < P.rows);
    }
    var wrows: array<u32, 2>;
    for (var q = 0u; q < 2u; q++) {
        let n = n0 + lid / 8u + 32u * q;
        wrows[q] = select(NONE, n * P.k, n < P.n);
    }
    let acc = gemm_tile(xrows, wrows, lid);
    let tx = lid % 16u;
    let ty = lid / 16u;
    for (var i = 0u; i < 4u; i++) {
        let t = m0 + ty + 16u * i;
        if (t < P.rows) {
            for (var j = 0u; j < 4u; j++) {
                let n = n0 + tx + 16u * j;
                if (n < P.n) {
                    y[P.y_off + t * P.y_stride + n] = acc[i * 4u + j];
                }
            }
        }
    }
}

const LCAP: u32 = BM + WG;              // a partial tile plus one scan block
var<workgroup> slot_list: array<u32, LCAP>;
var<workgroup> slot_cnt: atomic<u32>;
var<workgroup> slot_cnt_u: u32;

@compute @workgroup_size(256)
fn gemm_experts(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let g = wid.x + wid.y * nwg.x;
    let nt = (P.n + BN - 1u) / BN;
    let e = P.e0 + g / nt;
    let n0 = (g % nt) * BN;
    if (e >= P.n_experts || e * P.n + n0 >= P.row0 + P.crow || (e + 1u) * P.n <= P.row0) {
        return;
    }
    // This invocation's weight rows for the B loads (fixed for the whole workgroup).
    var wrows: array<u32, 2>;
    for (var q = 0u; q < 2u; q++) {
        let n = n0 + lid / 8u + 32u * q;
        let gr = e * P.n + n;
        wrows[q] = select(NONE, (gr - P.row0) * P.k, n < P.n && gr >= P.row0 && gr < P.row0 + P.crow);
    }
    if (lid == 0u) {
        atomicStore(&slot_cnt, 0u);
    }
    var s0 = 0u;
    loop {
        // Gather slots routed to e until a full tile is ready or all slots are scanned.
        loop {
            workgroupBarrier();
            if (lid == 0u) {
                slot_cnt_u = atomicLoad(&slot_cnt);
            }
            let c = workgroupUniformLoad(&slot_cnt_u);
            if (c >= BM || s0 >= P.rows) {
                break;
            }
            let s = s0 + lid;
            if (s < P.rows) {
                if (experts[s] == e) {
                    let i = atomicAdd(&slot_cnt, 1u);
                    slot_list[i] = s;
                }
            }
            s0 += WG;
        }
        let c = workgroupUniformLoad(&slot_cnt_u);
        if (c == 0u) {
            break;
        }
        let m = min(c, BM);
        var xrows: array<u32, 4>;
        for (var p = 0u; p < 4u; p++) {
            let i = lid / BK + 16u * p;
            xrows[p] = NONE;
            if (i < m) {
                let s = slot_list[i];
                var r = s / P.topk;
                if (P.x_per_slot != 0u) {
                    r = s;
                }
                xrows[p] = P.x_off + r * P.x_stride;
            }
        }
        let acc = gemm_tile(xrows, wrows, lid);
        let tx = lid % 16u;
        let ty = lid / 16u;
        for (var i = 0u; i < 4u; i++) {
            let li = ty + 16u * i;
            if (li < m) {
                let s = slot_list[li];
                for (var j = 0u; j < 4u; j++) {
                    let n = n0 + tx + 16u * j;
                    let gr = e * P.n + n;
                    if (n < P.n && gr >= P.row0 && gr < P.row0 + P.crow) {
                        y[P.y_off + s * P.y_stride + n] = acc[i * 4u + j];
                    }
                }
            }
        }
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
            atomicStore(&slot_cnt, rest);
        }
    }
}
