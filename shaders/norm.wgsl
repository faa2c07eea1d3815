// RMSNorm, one workgroup per row, f32 (the indexer key's LayerNorm is done by the cache
// writer that stores the key, cache.wgsl). Entry points (bindings: 1 = x, 2 = weight,
// 3 = y, 4 = quantized y):
//   rms_norm    y = x * rsqrt(mean(x²) + eps) * w
//   rms_norm_cpu  rms_norm for CPU adapters: one invocation per row (no workgroup sum, whose
//               barriers lavapipe runs as switches through every SIMD slice)
//   rms_norm_q  rms_norm, and y quantized for the integer-dot GEMVs (xquant.wgsl) into
//               binding 4, row r at r · xq_stride(dim); P.q4: q4's element order
//   rms_norm_sel  (and _cpu) rms_norm of the one row of x that word P.sel of binding 4
//               names, into y's first row: a speculative round's last accepted row, its
//               index in the round's state (spec.wgsl) bound at 4

// Params (binding 0): declared once, in src/kernels/norm.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> xq_out: array<vec4<u32>>;

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
    let total = wg_sum((s4.x + s4.y) + (s4.z + s4.w), lid);
    return inverseSqrt(total / f32(P.dim) + P.eps);
}

// y = x * scale * w over the row at xb into yb (the workgroup's share of it).
fn norm_row(xb: u32, yb: u32, lid: u32) {
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

// rms_norm_cpu's row: one invocation.
fn norm_row_cpu(xb: u32, yb: u32) {
    var s4 = vec4<f32>(0.0);
    var c = 0u;
    for (; c + 3u < P.dim; c += 4u) {
        let v = vec4<f32>(x[xb + c], x[xb + c + 1u], x[xb + c + 2u], x[xb + c + 3u]);
        s4 += v * v;
    }
    for (; c < P.dim; c++) {
        let v = x[xb + c];
        s4.x += v * v;
    }
    let scale = inverseSqrt(((s4.x + s4.y) + (s4.z + s4.w)) / f32(P.dim) + P.eps);
    for (var i = 0u; i < P.dim; i++) {
        y[yb + i] = x[xb + i] * scale * w[i];
    }
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= P.rows) {
        return;
    }
    norm_row(P.x_off + row * P.x_stride, P.y_off + row * P.y_stride, lid);
}

@compute @workgroup_size(CPU_WG)
fn rms_norm_cpu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let row = cpu_item(wid, nwg, lid);
    if (row >= P.rows) {
        return;
    }
    norm_row_cpu(P.x_off + row * P.x_stride, P.y_off + row * P.y_stride);
}

// The row binding 4's word P.sel names (of P.rows rows; a larger value is clamped to the
// last): a speculative round's last accepted row (its state, spec.wgsl, bound here).
fn selected_row() -> u32 {
    return min(xq_out[P.sel / 4u][P.sel % 4u], P.rows - 1u);
}

// rms_norm of one row of x, the one `selected_row` names, into y's first row (one
// workgroup): the same values as rms_norm gives that row.
@compute @workgroup_size(256)
fn rms_norm_sel(@builtin(local_invocation_index) lid: u32) {
    norm_row(P.x_off + selected_row() * P.x_stride, P.y_off, lid);
}

@compute @workgroup_size(CPU_WG)
fn rms_norm_sel_cpu(@builtin(local_invocation_index) lid: u32) {
    if (lid == 0u) {
        norm_row_cpu(P.x_off + selected_row() * P.x_stride, P.y_off);
    }
}

// P.rows rows (decode: one; a verification: a few), (dim / 32 + 31) / 32 workgroups per
// row; workgroup g of a row quantizes blocks 32g .. 32g + 32, eight invocations per block,
// after computing the row's scale itself (the row is small and cached: cheaper than a
// second dispatch).
@compute @workgroup_size(256)
fn rms_norm_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let nb = P.dim / 32u;
    let per_row = (nb + WG / 8u - 1u) / (WG / 8u);
    let g = wid.x + wid.y * nwg.x;
    let row = g / per_row;
    if (row >= P.rows) {
        return;
    }
    let xb = P.x_off + row * P.x_stride;
    let yb = P.y_off + row * P.y_stride;
    let scale = rms_scale(xb, lid);
    let b = (g % per_row) * (WG / 8u) + lid / 8u;
    let j = lid & 7u;
    let live = b < nb;
    var v = vec4<f32>(0.0);
    if (live) {
        for (var i = 0u; i < 4u; i++) {
            let c = 32u * b + word_elem(j, i, P.q4 == 1u);
            // As rms_norm computes it.
            v[i] = x[xb + c] * scale * w[c];
            y[yb + c] = v[i];
        }
    }
    quant_word(v, lid, live, row * xq_stride(P.dim), nb, b);
}
