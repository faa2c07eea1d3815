// The weight products of absorbed MLA: absorb_q and up_v (the attention itself is mla.wgsl).
//
// Both entry points share one set of binding declarations (the wrapper passes buffers in
// binding order):
//   1 in0  (f32, read): q (absorb_q) / o_lat (up_v)
//   2 wts  (u32, read): kv_b weight in W_DTYPE
//   3 out0 (f32, rw)  : q_abs / o
//   4 wscale (u32, read): kv_b scales (a dummy buffer for float weights)
//
// Defines (every pipeline of this file sets all of them):
//   W_DTYPE: 0 = f32, 1 = bf16, 2 = f16 (weight element i in word i >> 1, low half even),
//            3 = FP8, 4 = q8, 5 = q4 (quant.wgsl; QB elements per scale, S_BF16)
//   TR: query rows per workgroup
//   DS: absorb_q's slices of the dn axis per column (1, or 4 for one query row: each
//       invocation then walks a quarter of dn, and the workgroup covers WG / 4 columns)

const WG: u32 = 256u;
const DCH: u32 = 64u;   // absorb_q: dn chunk staged in workgroup memory
const KCH: u32 = 128u;  // up_v: kv_lora chunk staged in workgroup memory
const VT: u32 = 16u;    // up_v: outputs per workgroup (16 invocations each)

// Params (binding 0): declared once, in src/kernels/attention.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> in0: array<f32>;
@group(0) @binding(2) var<storage, read> wts: array<u32>;
@group(0) @binding(3) var<storage, read_write> out0: array<f32>;
@group(0) @binding(4) var<storage, read> wscale: array<u32>;

// Element (row, col) of kv_b.
fn wget(row: u32, col: u32) -> f32 {
    let i = row * P.w_stride + col;
    return w_any(wts[w_word(i)], i);
}

// ---------------------------------------------------------------------------------------
// absorb_q: q_abs[t, h*kv_lora + c] = Σ_{d<dn} q[t, h*(dn+dr) + d] · W[h*(dn+dv) + d, c].
// Workgroup: one head, WG / DS columns c, TR rows; q chunks staged, W read along rows
// (consecutive c per invocation: coalesced), each W element used by TR rows. With DS > 1
// (decode) the DS invocations of a column split dn and sum through workgroup memory: a
// quarter of the dependent loads per invocation and 4× the workgroups.

var<workgroup> qs: array<f32, TR * DCH>;

@compute @workgroup_size(256)
fn absorb_q(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    let n_rt = (P.rows + TR - 1u) / TR;
    if (g >= P.tiles * P.heads * n_rt) {
        return;
    }
    let ct = g % P.tiles;
    let rest = g / P.tiles;
    let h = rest % P.heads;
    let r0 = (rest / P.heads) * TR;
    let cw = WG / DS;
    let ds = lid / cw;
    let c = ct * cw + lid % cw;
    let hq = P.dn + P.dr;
    let wrow0 = h * (P.dn + P.dv);
    var acc: array<f32, TR>;
    for (var r = 0u; r < TR; r = r + 1u) {
        acc[r] = 0.0;
    }
    for (var d0 = 0u; d0 < P.dn; d0 = d0 + DCH) {
        workgroupBarrier();
        for (var i = lid; i < TR * DCH; i = i + WG) {
            let r = i / DCH;
            let d = d0 + i % DCH;
            var v = 0.0;
            if (r0 + r < P.rows && d < P.dn) {
                v = in0[P.a_off + (r0 + r) * P.a_stride + h * hq + d];
            }
            qs[i] = v;
        }
        workgroupBarrier();
        if (c < P.kv_lora) {
            let dend = min(DCH, P.dn - d0);
            for (var dd = ds; dd < dend; dd = dd + DS) {
                let wv = wget(wrow0 + d0 + dd, c);
                for (var r = 0u; r < TR; r = r + 1u) {
                    acc[r] = acc[r] + qs[r * DCH + dd] * wv;
                }
            }
        }
    }
    if (DS > 1u) {
        // TR = 1 here: the slices' sums of each column.
        red[lid] = acc[0];
        workgroupBarrier();
        if (ds == 0u) {
            for (var j = 1u; j < DS; j = j + 1u) {
                acc[0] = acc[0] + red[j * cw + lid];
            }
        }
    }
    if (c < P.kv_lora && ds == 0u) {
        for (var r = 0u; r < TR; r = r + 1u) {
            if (r0 + r < P.rows) {
                out0[P.o_off + (r0 + r) * P.o_stride + h * P.kv_lora + c] = acc[r];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// up_v: o[t, h*dv + v] = Σ_c W[h*(dn+dv) + dn + v, c] · o_lat[t, h*kv_lora + c].
// Workgroup: one head, VT outputs v (16 invocations each, striding along the W row:
// coalesced), TR rows; o_lat chunks staged; partial sums reduced in workgroup memory.

var<workgroup> ols: array<f32, TR * KCH>;
var<workgroup> red: array<f32, TR * WG>;

@compute @workgroup_size(256)
fn up_v(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    let n_rt = (P.rows + TR - 1u) / TR;
    if (g >= P.tiles * P.heads * n_rt) {
        return;
    }
    let vt = g % P.tiles;
    let rest = g / P.tiles;
    let h = rest % P.heads;
    let r0 = (rest / P.heads) * TR;
    let kvl = P.kv_lora;
    let lane = lid % VT;
    let v = vt * VT + lid / VT;
    let wrow = h * (P.dn + P.dv) + P.dn + v;
    var acc: array<f32, TR>;
    for (var r = 0u; r < TR; r = r + 1u) {
        acc[r] = 0.0;
    }
    for (var c0 = 0u; c0 < kvl; c0 = c0 + KCH) {
        workgroupBarrier();
        for (var i = lid; i < TR * KCH; i = i + WG) {
            let r = i / KCH;
            let c = c0 + i % KCH;
            var x = 0.0;
            if (r0 + r < P.rows && c < kvl) {
                x = in0[P.a_off + (r0 + r) * P.a_stride + h * kvl + c];
            }
            ols[i] = x;
        }
        workgroupBarrier();
        if (v < P.dv) {
            let cend = min(KCH, kvl - c0);
            for (var cc = lane; cc < cend; cc = cc + VT) {
                let wv = wget(wrow, c0 + cc);
                for (var r = 0u; r < TR; r = r + 1u) {
                    acc[r] = acc[r] + wv * ols[r * KCH + cc];
                }
            }
        }
    }
    for (var r = 0u; r < TR; r = r + 1u) {
        red[r * WG + lid] = acc[r];
    }
    workgroupBarrier();
    if (lid < VT * TR) {
        let r = lid / VT;
        let vl = lid % VT;
        let v2 = vt * VT + vl;
        var sum = 0.0;
        for (var i = 0u; i < VT; i = i + 1u) {
            sum = sum + red[r * WG + vl * VT + i];
        }
        if (v2 < P.dv && r0 + r < P.rows) {
            out0[P.o_off + (r0 + r) * P.o_stride + h * P.dv + v2] = sum;
        }
    }
}
