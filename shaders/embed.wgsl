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

// Whether the table row of `id` lies in this dispatch's chunk.
fn in_chunk(id: u32) -> bool {
    return id >= P.row0 && id < P.row0 + P.crow;
}

// Row t's embedding into out at ob, columns first, first + step, ..: the table row where
// its id lies in this chunk, zeros where the id is past the table (the last chunk's
// dispatch), else nothing. Returns the sum of squares of what this invocation wrote.
fn gather(id: u32, ob: u32, first: u32, step: u32) -> f32 {
    var ss = 0.0;
    if (in_chunk(id)) {
        let base = (id - P.row0) * P.dim;
        for (var c = first; c < P.dim; c += step) {
            let v = wload(base + c);
            out[ob + c] = v;
            ss += v * v;
        }
    } else if (id >= P.vocab && P.last != 0u) {
        for (var c = first; c < P.dim; c += step) {
            out[ob + c] = 0.0;
        }
    }
    return ss;
}

// rsqrt(mean + eps) of a row whose squares sum to `total`.
fn rms(total: f32) -> f32 {
    return inverseSqrt(total / f32(P.dim) + P.eps);
}

// The MTP input's second half for row t: hnorm(hidden[t]) into out[ob + dim ..], with the
// scale `sc` of the hidden row at hb (columns first, first + step, ..).
fn hidden_half(hb: u32, ob: u32, sc: f32, first: u32, step: u32) {
    for (var c = first; c < P.dim; c += step) {
        out[ob + P.dim + c] = hid[hb + c] * sc * hnorm[c];
    }
}

// This invocation's sum of squares of the hidden row at hb (columns first, first + step, ..).
fn hidden_ss(hb: u32, first: u32, step: u32) -> f32 {
    var sh = 0.0;
    for (var c = first; c < P.dim; c += step) {
        let v = hid[hb + c];
        sh += v * v;
    }
    return sh;
}

// enorm's scale `se` applied to the embedding row gather wrote (each element by the
// invocation that wrote it).
fn enorm_half(ob: u32, se: f32, first: u32, step: u32) {
    for (var c = first; c < P.dim; c += step) {
        out[ob + c] = out[ob + c] * se * enorm[c];
    }
}

@compute @workgroup_size(256)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= P.n) {
        return;
    }
    _ = gather(ids[P.ids_off + t], P.out_off + t * P.out_stride, lid, WG);
}

// The sums run in uniform control flow: every workgroup takes them.
@compute @workgroup_size(256)
fn embed_mtp(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= P.n) {
        return;
    }
    let id = ids[P.ids_off + t];
    let ob = P.out_off + t * P.out_stride;
    let se = rms(wg_sum(gather(id, ob, lid, WG), lid));
    if (in_chunk(id)) {
        enorm_half(ob, se, lid, WG);
    }
    if (P.last == 0u) {
        return;
    }
    let hb = P.hid_off + t * P.hid_stride;
    hidden_half(hb, ob, rms(wg_sum(hidden_ss(hb, lid, WG), lid)), lid, WG);
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
    let se = rms(gather(id, ob, 0u, 1u));
    if (in_chunk(id)) {
        enorm_half(ob, se, 0u, 1u);
    }
    if (P.last == 0u) {
        return;
    }
    let hb = P.hid_off + t * P.hid_stride;
    hidden_half(hb, ob, rms(hidden_ss(hb, 0u, 1u)), 0u, 1u);
}
