// Small elementwise kernels, one invocation per output element (r, c).
// Bindings: 1 = output (read_write), 2 = first input, 3 = second input.
//   add          o[r, c] += a[r, c]
//   swiglu       o[r, c] = silu(a[r, c]) * a[u_off + r * u_stride + c]  (g and u in one buffer)
//   swiglu2      o[r, c] = silu(a[r, c]) * b[r, c]                      (g, u in two buffers)
//   swiglu_q     swiglu, eight invocations per 32 columns, and o's rows quantized for the
//                integer-dot GEMVs (xquant.wgsl) into binding 3, row r at r · xq_stride(dim);
//                P.topk = 1: q4's element order
//   moe_combine  o[r, c] += Σ_j b[r * topk + j] · a[r * topk + j, c]
//   fill_random  o[r, c] = uniform in [-√3, √3) (unit variance) from a hash of (seed, r, c);
//                the seed travels in `topk`. For synthetic caches in `sparsa bench`.

// Params (binding 0): declared once, in src/kernels/elementwise.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> xq_out: array<vec4<u32>>;

const WG: u32 = 256u;

// (row, column) of this invocation; row = P.rows when out of range.
fn rc(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> vec2<u32> {
    let i = (wid.x + wid.y * nwg.x) * WG + lid;
    let r = i / P.dim;
    return vec2<u32>(r, i - r * P.dim);
}

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let p = rc(wid, nwg, lid);
    if (p.x >= P.rows) {
        return;
    }
    o[P.o_off + p.x * P.o_stride + p.y] += a[P.a_off + p.x * P.a_stride + p.y];
}

@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let p = rc(wid, nwg, lid);
    if (p.x >= P.rows) {
        return;
    }
    let g = a[P.a_off + p.x * P.a_stride + p.y];
    let u = a[P.b_off + p.x * P.b_stride + p.y];
    o[P.o_off + p.x * P.o_stride + p.y] = silu(g) * u;
}

@compute @workgroup_size(256)
fn swiglu2(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let p = rc(wid, nwg, lid);
    if (p.x >= P.rows) {
        return;
    }
    let g = a[P.a_off + p.x * P.a_stride + p.y];
    let u = b[P.b_off + p.x * P.b_stride + p.y];
    o[P.o_off + p.x * P.o_stride + p.y] = silu(g) * u;
}

// Eight invocations per 32-column block, each the 4 values of one quantized word.
@compute @workgroup_size(256)
fn swiglu_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let nb = P.dim / 32u;
    let rb = word_slot((wid.x + wid.y * nwg.x) * WG + lid, nb);
    let r = rb.x;
    let b = rb.y;
    let j = lid & 7u;
    let live = r < P.rows;
    var v = vec4<f32>(0.0);
    if (live) {
        for (var i = 0u; i < 4u; i++) {
            let c = 32u * b + word_elem(j, i, P.topk == 1u);
            let g = a[P.a_off + r * P.a_stride + c];
            let u = a[P.b_off + r * P.b_stride + c];
            v[i] = silu(g) * u;
            o[P.o_off + r * P.o_stride + c] = v[i];
        }
    }
    quant_word(v, lid, live, r * xq_stride(P.dim), nb, b);
}

@compute @workgroup_size(256)
fn moe_combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let p = rc(wid, nwg, lid);
    if (p.x >= P.rows) {
        return;
    }
    var s = 0.0;
    for (var j = 0u; j < P.topk; j++) {
        let slot = p.x * P.topk + j;
        s += b[slot] * a[P.a_off + slot * P.a_stride + p.y];
    }
    o[P.o_off + p.x * P.o_stride + p.y] += s;
}

// A 32-bit integer hash (xorshift-multiply rounds).
fn hash32(x0: u32) -> u32 {
    var x = x0;
    x = (x ^ (x >> 16u)) * 0x7feb352du;
    x = (x ^ (x >> 15u)) * 0x846ca68bu;
    return x ^ (x >> 16u);
}

@compute @workgroup_size(256)
fn fill_random(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let p = rc(wid, nwg, lid);
    if (p.x >= P.rows) {
        return;
    }
    let h = hash32(hash32(p.x ^ hash32(P.topk)) ^ (p.y * 0x9e3779b9u));
    let u01 = f32(h >> 8u) * (1.0 / 16777216.0);
    o[P.o_off + p.x * P.o_stride + p.y] = (2.0 * u01 - 1.0) * 1.7320508;
}
