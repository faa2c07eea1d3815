// Embedding gather from one chunk of the table, converted to f32.
// Defines: W_DTYPE (0 = f32, 1 = bf16, 2 = f16; the table is bound as array<u32>).
// Bindings: 1 = table chunk, 2 = ids (u32), 3 = out (f32).
// One workgroup per token: rows whose id lies in this chunk are copied; ids >= vocab are
// zeroed by the dispatch of the last chunk; other rows are left alone.

// Params (binding 0): declared once, in src/kernels/embed.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;

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
