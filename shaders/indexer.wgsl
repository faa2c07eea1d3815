// Lightning-indexer scores in f32:
//   out[t, s] = Σ_h (w[t, h] · w_scale) · relu(q[t, h, :] · keys[s, :]) · scale,
//   out[t, s] = -inf for s > pos0 + t.
//
// One workgroup = one query row t and WG consecutive keys; invocation i owns key s0 + i.
// The dim axis is walked in chunks of DC: the chunk of q for all heads (HEADS × DC) is
// staged in workgroup memory and read as a broadcast, the invocation's DC key values sit
// in registers, and the per-head partial dots accumulate in a private array (one per head)
// until the whole dim is done; then ReLU, head weights and the sum. Each key element is
// read from memory once per query row.
//
// Defines: WG (keys per workgroup = invocations), HEADS (= heads), DC (dim chunk).
// The output is written as raw bits so -inf never goes through float arithmetic.

struct Params {
    q_off: u32,
    q_stride: u32,
    w_off: u32,
    w_stride: u32,
    k_off: u32,
    k_stride: u32,
    o_off: u32,
    o_stride: u32,
    rows: u32,
    dim: u32,
    n_keys: u32,
    pos0: u32,
    key_blocks: u32,
    _pad: u32,
    w_scale: f32,
    scale: f32,
}

const NEG_INF_BITS: u32 = 0xff800000u;

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> keys: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;

var<workgroup> qs: array<f32, HEADS * DC>;
var<workgroup> ws: array<f32, HEADS>;

@compute @workgroup_size(WG)
fn scores(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    if (g >= P.rows * P.key_blocks) {
        return;
    }
    let t = g / P.key_blocks;
    let s0 = (g % P.key_blocks) * WG;
    let s = s0 + lid;
    let last = P.pos0 + t;
    let o = P.o_off + t * P.o_stride + s;
    if (s0 > last) {
        // Whole block in the causal future.
        if (s < P.n_keys) {
            out[o] = NEG_INF_BITS;
        }
        return;
    }
    let qbase = P.q_off + t * P.q_stride;
    for (var h = lid; h < HEADS; h = h + WG) {
        ws[h] = w[P.w_off + t * P.w_stride + h] * P.w_scale;
    }
    let live = s < P.n_keys && s <= last;
    let kbase = P.k_off + s * P.k_stride;
    var acc: array<f32, HEADS>;
    for (var h = 0u; h < HEADS; h = h + 1u) {
        acc[h] = 0.0;
    }
    for (var d0 = 0u; d0 < P.dim; d0 = d0 + DC) {
        workgroupBarrier();
        for (var i = lid; i < HEADS * DC; i = i + WG) {
            let h = i / DC;
            let d = d0 + i % DC;
            var v = 0.0;
            if (d < P.dim) {
                v = q[qbase + h * P.dim + d];
            }
            qs[i] = v;
        }
        workgroupBarrier();
        var kr: array<f32, DC>;
        for (var c = 0u; c < DC; c = c + 1u) {
            var v = 0.0;
            if (live && d0 + c < P.dim) {
                v = keys[kbase + d0 + c];
            }
            kr[c] = v;
        }
        for (var h = 0u; h < HEADS; h = h + 1u) {
            var p = 0.0;
            for (var c = 0u; c < DC; c = c + 1u) {
                p = p + qs[h * DC + c] * kr[c];
            }
            acc[h] = acc[h] + p;
        }
    }
    workgroupBarrier();
    if (live) {
        var total = 0.0;
        for (var h = 0u; h < HEADS; h = h + 1u) {
            total = total + ws[h] * max(acc[h], 0.0);
        }
        out[o] = bitcast<u32>(total * P.scale);
    } else if (s < P.n_keys) {
        out[o] = NEG_INF_BITS;
    }
}
