// The router's GEMV and the routing of a few rows in the same dispatch (a decode step, a
// speculative verification, a small batch). Workgroup (e, r) computes expert e's logit of
// row r, x_r · W[e] (W f32, bf16 or f16 by W_DTYPE, weights.wgsl; row e at word e · ws; x_r
// at x_off + r · x_stride) and publishes it in row r's block of `tally`; the last workgroup
// of row r to finish reads the row's logits and routes it (router_pick.wgsl, prepended),
// pairs from r · stride.
//
// "Last" is counted per row in the first word of its block: a workgroup stores its logit
// atomically, passes a storageBarrier() (a release at device scope: naga gives storage
// barriers Device memory scope), then adds itself to the count; the workgroup that brings it
// to n_experts passes another storageBarrier() (the acquire) before it loads the logits, and
// sets the count back to zero for the next dispatch (dispatches that share `tally` run one
// after another).

// Params (binding 0): declared once, in src/kernels/router.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> idx: array<u32>;
@group(0) @binding(5) var<storage, read_write> weights: array<f32>;
// Per row r, at r · (1 + n_experts): [count, logit of expert 0 (f32 bits), of expert 1, …]
@group(0) @binding(6) var<storage, read_write> tally: array<atomic<u32>>;

var<workgroup> red: array<f32, WG>;
var<workgroup> last: u32;

// This invocation's part of x · W[e]: x from word xo, W[e] from word wb.
fn row_part(xo: u32, wb: u32, lid: u32) -> f32 {
    var acc = vec4<f32>(0.0);
    if (W_DTYPE == 0u) {
        for (var c = lid; c < P.k; c += WG) {
            acc.x += x[xo + c] * bitcast<f32>(w[wb + c]);
        }
    } else {
        // Two 16-bit elements per word; sixteen words in flight per step (a 6,144-wide
        // bf16 row is 12 words per invocation: one round trip).
        let kw = P.k / 2u;
        for (var c0 = 0u; c0 < kw; c0 += 16u * WG) {
            var wv: array<u32, 16>;
            var xv: array<vec2<f32>, 16>;
            for (var i = 0u; i < 16u; i++) {
                let c = min(c0 + i * WG + lid, kw - 1u);
                wv[i] = w[wb + c];
                xv[i] = vec2<f32>(x[xo + 2u * c], x[xo + 2u * c + 1u]);
            }
            for (var i = 0u; i < 16u; i++) {
                if (c0 + i * WG + lid < kw) {
                    let a = w_pair(wv[i]);
                    acc.x += xv[i].x * a.x;
                    acc.y += xv[i].y * a.y;
                }
            }
        }
    }
    return (acc.x + acc.y) + (acc.z + acc.w);
}

@compute @workgroup_size(256)
fn route_gemv(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let e = wid.x + wid.y * nwg.x;
    if (e >= P.n_experts) {
        return;
    }
    let r = wid.z;
    let base = r * (1u + P.n_experts);
    let logit = wg_sum(row_part(P.x_off + r * P.x_stride, e * P.ws, lid), lid);
    if (lid == 0u) {
        atomicStore(&tally[base + 1u + e], bitcast<u32>(logit));
    }
    storageBarrier();
    if (lid == 0u) {
        last = select(0u, 1u, atomicAdd(&tally[base], 1u) == P.n_experts - 1u);
    }
    if (workgroupUniformLoad(&last) == 0u) {
        return;
    }
    storageBarrier();
    for (var i = lid; i < N2; i += WG) {
        var l = 0.0;
        if (i < P.n_experts) {
            l = bitcast<f32>(atomicLoad(&tally[base + 1u + i]));
        }
        set_expert(i, l);
    }
    workgroupBarrier();
    pick_row(lid, r * P.stride);
    if (lid == 0u) {
        atomicStore(&tally[base], 0u);
    }
}
