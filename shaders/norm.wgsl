// RMSNorm, one workgroup per row, f32 (the indexer key's LayerNorm is done by the cache
// writer that stores the key, cache.wgsl). Entry points (bindings: 1 = x, 2 = weight,
// 3 = y, 4 = quantized y):
//   rms_norm        y = x * rsqrt(mean(x²) + eps) * w
//   rms_norm_q      rms_norm, and y quantized for the integer-dot GEMVs (xquant.wgsl) into
//                   binding 4, row r at r · xq_stride(dim); P.q4: q4's element order
//   combine_norm_q  one row, one workgroup: first x += Σ_j ew[j] · e[j, :] (what
//                   elementwise.wgsl's moe_combine adds: x read-write, 5 = e, 6 = ew), then
//                   rms_norm_q of the new x: the MoE's output and the next layer's input
//                   norm in one dispatch, with the same arithmetic as the two

// Params (binding 0): declared once, in src/kernels/norm.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> xq_out: array<vec4<u32>>;
// combine_norm_q's row (updated in place) and the experts' outputs and weights.
@group(0) @binding(1) var<storage, read_write> hx: array<f32>;
@group(0) @binding(5) var<storage, read> e: array<f32>;
@group(0) @binding(6) var<storage, read> ew: array<f32>;

const WG: u32 = 256u;

var<workgroup> red: array<f32, WG>;

// rsqrt(mean(x²) + eps) of the row at xb, for every invocation.
fn rms_scale(xb: u32, lid: u32) -> f32 {
    // Four independent loads per step: at batch 1 one workgroup does the whole row, and a
    // chain of dependent loads left it waiting on memory (BENCHMARKS.md, "Kernel choices").
    var s4 = vec4<f32>(0.0);
    var c = lid;
    for (; c + 3u * WG < P.dim; c += 4u * WG) {
        let v = vec4<f32>(x[xb + c], x[xb + c + WG], x[xb + c + 2u * WG], x[xb + c + 3u * WG]);
        s4 += v * v;
    }
    for (; c < P.dim; c += WG) {
        let v = x[xb + c];
        s4.x += v * v;
    }
    return scale_of(s4, lid);
}

// rsqrt(mean + eps) from the invocations' partial sums of squares.
fn scale_of(s4: vec4<f32>, lid: u32) -> f32 {
    let total = wg_sum((s4.x + s4.y) + (s4.z + s4.w), lid);
    return inverseSqrt(total / f32(P.dim) + P.eps);
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= P.rows) {
        return;
    }
    let xb = P.x_off + row * P.x_stride;
    let yb = P.y_off + row * P.y_stride;
    let scale = rms_scale(xb, lid);
    var c = lid;
    for (; c + 3u * WG < P.dim; c += 4u * WG) {
        let v = vec4<f32>(x[xb + c], x[xb + c + WG], x[xb + c + 2u * WG], x[xb + c + 3u * WG]);
        let g = vec4<f32>(w[c], w[c + WG], w[c + 2u * WG], w[c + 3u * WG]);
        let o = v * scale * g;
        y[yb + c] = o.x;
        y[yb + c + WG] = o.y;
        y[yb + c + 2u * WG] = o.z;
        y[yb + c + 3u * WG] = o.w;
    }
    for (; c < P.dim; c += WG) {
        y[yb + c] = x[xb + c] * scale * w[c];
    }
}

// One row (decode); workgroup g quantizes blocks 32g .. 32g + 32, eight invocations per
// block, after computing the row's scale itself (the row is small and cached: cheaper than a
// second dispatch).
@compute @workgroup_size(256)
fn rms_norm_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let scale = rms_scale(P.x_off, lid);
    var v = vec4<f32>(0.0);
    let b = (wid.x + wid.y * nwg.x) * (WG / 8u) + lid / 8u;
    let live = b < P.dim / 32u;
    if (live) {
        for (var i = 0u; i < 4u; i++) {
            v[i] = x[P.x_off + block_col(b, lid, i)];
        }
    }
    norm_quant_block(v, scale, b, lid, live);
}

// Column of value i of invocation lid's word in block b (q4's order or natural).
fn block_col(b: u32, lid: u32, i: u32) -> u32 {
    return 32u * b + word_elem(lid & 7u, i, P.q4 == 1u);
}

// The four values `v` of invocation lid's word of block b, normalized (as rms_norm computes
// them) into y and quantized (workgroup-uniform: invocations without a block pass live =
// false).
fn norm_quant_block(v: vec4<f32>, scale: f32, b: u32, lid: u32, live: bool) {
    var o = vec4<f32>(0.0);
    if (live) {
        for (var i = 0u; i < 4u; i++) {
            let c = block_col(b, lid, i);
            o[i] = v[i] * scale * w[c];
            y[P.y_off + c] = o[i];
        }
    }
    quant_word(o, lid, live, 0u, P.dim / 32u, b);
}

// Element c of the row after the experts' outputs are added (written back).
fn combined(c: u32) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < P.topk; j++) {
        s += ew[j] * e[P.e_off + j * P.e_stride + c];
    }
    let v = hx[P.x_off + c] + s;
    hx[P.x_off + c] = v;
    return v;
}

@compute @workgroup_size(256)
fn combine_norm_q(@builtin(local_invocation_index) lid: u32) {
    // The sum of squares in rms_scale's order, of the updated row.
    var s4 = vec4<f32>(0.0);
    var c = lid;
    for (; c + 3u * WG < P.dim; c += 4u * WG) {
        let v = vec4<f32>(combined(c), combined(c + WG), combined(c + 2u * WG), combined(c + 3u * WG));
        s4 += v * v;
    }
    for (; c < P.dim; c += WG) {
        let v = combined(c);
        s4.x += v * v;
    }
    let scale = scale_of(s4, lid);
    // Every invocation's writes of the row visible to the others.
    storageBarrier();
    for (var b0 = 0u; b0 < P.dim / 32u; b0 += WG / 8u) {
        let b = b0 + lid / 8u;
        let live = b < P.dim / 32u;
        var v = vec4<f32>(0.0);
        if (live) {
            for (var i = 0u; i < 4u; i++) {
                v[i] = hx[P.x_off + block_col(b, lid, i)];
            }
        }
        norm_quant_block(v, scale, b, lid, live);
    }
}
