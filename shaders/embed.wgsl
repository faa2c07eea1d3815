// Embedding gather from one chunk of the table, converted to f32.
// Defines: W_DTYPE (0 = f32, 1 = bf16, 2 = f16; the table is bound as array<u32>).
// Bindings: 1 = table chunk, 2 = ids (u32), 3 = out (f32); embed_mtp also 4 = enorm's
// weight, 5 = the hidden rows, 6 = hnorm's weight (f32).
// One workgroup per token: rows whose id lies in this chunk are copied; ids >= vocab are
// zeroed by the dispatch of the last chunk; other rows are left alone.
//   embed     out[t] = table[ids[t]]
//   embed_mtp the MTP layer's input row [enorm(table[ids[t]]) ; hnorm(hidden[t])]: out[t,
//             0 .. dim] and, written by the last chunk's dispatch, out[t, dim .. 2 dim]
//             (RMSNorms with eps P.eps, in one dispatch instead of three)
//   embed_mtp_cpu  embed_mtp for CPU adapters: one invocation per row (no workgroup sums,
//             whose barriers lavapipe runs as switches through every SIMD slice)

// Params (binding 0): declared once, in src/kernels/embed.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> enorm: array<f32>;
@group(0) @binding(5) var<storage, read> hid: array<f32>;
@group(0) @binding(6) var<storage, read> hnorm: array<f32>;

const WG: u32 = 256u;

var<workgroup> red: array<f32, WG>;

fn wload(i: u32) -> f32 {
    return w_elem(w[w_word(i)], i);
}

@compute @workgroup_size(256)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= P.n) {
        return;
    }
    let id = ids[P.ids_off + t];
    let ob = P.out_off + t * P.out_stride;
    if (id >= P.row0 && id < P.row0 + P.crow) {
        let base = (id - P.row0) * P.dim;
        for (var c = lid; c < P.dim; c += WG) {
            out[ob + c] = wload(base + c);
        }
    } else if (id >= P.vocab && P.last != 0u) {
        for (var c = lid; c < P.dim; c += WG) {
            out[ob + c] = 0.0;
        }
    }
}

@compute @workgroup_size(256)
fn embed_mtp(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= P.n) {
        return;
    }
    let id = ids[P.ids_off + t];
    let ob = P.out_off + t * P.out_stride;
    let mine = id >= P.row0 && id < P.row0 + P.crow;
    // The embedding row, written as it is read, then scaled by the invocation that wrote
    // each element. The sums run in uniform control flow (every workgroup takes them).
    var ss = 0.0;
    if (mine) {
        let base = (id - P.row0) * P.dim;
        for (var c = lid; c < P.dim; c += WG) {
            let v = wload(base + c);
            out[ob + c] = v;
            ss += v * v;
        }
    }
    let se = inverseSqrt(wg_sum(ss, lid) / f32(P.dim) + P.eps);
    if (mine) {
        for (var c = lid; c < P.dim; c += WG) {
            out[ob + c] = out[ob + c] * se * enorm[c];
        }
    } else if (id >= P.vocab && P.last != 0u) {
        for (var c = lid; c < P.dim; c += WG) {
            out[ob + c] = 0.0;
        }
    }
    if (P.last == 0u) {
        return;
    }
    let hb = P.hid_off + t * P.hid_stride;
    var sh = 0.0;
    for (var c = lid; c < P.dim; c += WG) {
        let v = hid[hb + c];
        sh += v * v;
    }
    let sc = inverseSqrt(wg_sum(sh, lid) / f32(P.dim) + P.eps);
    for (var c = lid; c < P.dim; c += WG) {
        out[ob + P.dim + c] = hid[hb + c] * sc * hnorm[c];
    }
}

@compute @workgroup_size(CPU_WG)
fn embed_mtp_cpu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let t = cpu_item(wid, nwg, lid);
    if (t >= P.n) {
        return;
    }
    let id = ids[P.ids_off + t];
    let ob = P.out_off + t * P.out_stride;
    if (id >= P.row0 && id < P.row0 + P.crow) {
        let base = (id - P.row0) * P.dim;
        var ss = 0.0;
        for (var c = 0u; c < P.dim; c++) {
            let v = wload(base + c);
            out[ob + c] = v;
            ss += v * v;
        }
        let se = inverseSqrt(ss / f32(P.dim) + P.eps);
        for (var c = 0u; c < P.dim; c++) {
            out[ob + c] = out[ob + c] * se * enorm[c];
        }
    } else if (id >= P.vocab && P.last != 0u) {
        for (var c = 0u; c < P.dim; c++) {
            out[ob + c] = 0.0;
        }
    }
    if (P.last == 0u) {
        return;
    }
    let hb = P.hid_off + t * P.hid_stride;
    var sh = 0.0;
    for (var c = 0u; c < P.dim; c++) {
        let v = hid[hb + c];
        sh += v * v;
    }
    let sc = inverseSqrt(sh / f32(P.dim) + P.eps);
    for (var c = 0u; c < P.dim; c++) {
        out[ob + P.dim + c] = hid[hb + c] * sc * hnorm[c];
    }
}
