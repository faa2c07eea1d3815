// RMSNorm and LayerNorm, one workgroup per row, f32.
// Entry points (bindings: 1 = x, 2 = weight, 3 = y, 4 = bias or quantized y):
//   rms_norm    y = x * rsqrt(mean(x²) + eps) * w
//   rms_norm_q  rms_norm, and y quantized for the integer-dot GEMVs (xquant.wgsl) into
//               binding 4, row r at r · xq_stride(dim); P.q4: q4's element order
//   layer_norm  y = (x - mean) * rsqrt(var + eps) * w + b   (biased variance, two passes)

// Params (binding 0): declared once, in src/kernels/norm.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> xq_out: array<vec4<u32>>;

const WG: u32 = 256u;

var<workgroup> red: array<f32, WG>;

// Workgroup sum of `v` (every invocation gets the result). Uniform control flow only.
fn wg_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

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

@compute @workgroup_size(256)
fn rms_norm_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= P.rows) {
        return;
    }
    let xb = P.x_off + row * P.x_stride;
    let yb = P.y_off + row * P.y_stride;
    let scale = rms_scale(xb, lid);
    // One 32-element block per invocation: y as rms_norm computes it, then quantized.
    let nb = P.dim / 32u;
    for (var bk = lid; bk < nb; bk += WG) {
        var v: array<vec4<f32>, 8>;
        for (var j = 0u; j < 8u; j++) {
            let c = 32u * bk + 4u * j;
            let xv = vec4<f32>(x[xb + c], x[xb + c + 1u], x[xb + c + 2u], x[xb + c + 3u]);
            let g = vec4<f32>(w[c], w[c + 1u], w[c + 2u], w[c + 3u]);
            let o = xv * scale * g;
            y[yb + c] = o.x;
            y[yb + c + 1u] = o.y;
            y[yb + c + 2u] = o.z;
            y[yb + c + 3u] = o.w;
            v[j] = o;
        }
        xq_store(row * xq_stride(P.dim), nb, bk, quant_block_of(v, P.q4 == 1u));
    }
}

@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= P.rows) {
        return;
    }
    let xb = P.x_off + row * P.x_stride;
    let yb = P.y_off + row * P.y_stride;
    var s = 0.0;
    for (var c = lid; c < P.dim; c += WG) {
        s += x[xb + c];
    }
    let mean = wg_sum(s, lid) / f32(P.dim);
    var sq = 0.0;
    for (var c = lid; c < P.dim; c += WG) {
        let d = x[xb + c] - mean;
        sq += d * d;
    }
    let scale = inverseSqrt(wg_sum(sq, lid) / f32(P.dim) + P.eps);
    for (var c = lid; c < P.dim; c += WG) {
        y[yb + c] = (x[xb + c] - mean) * scale * w[c] + b[c];
    }
}
