// x as f16 rows for the tensor-core tile that loads its A fragments from memory
// (matmul_coop.wgsl, A_GLOBAL): row r < P.rows_pad, element c < P.kpad of the output is
// element c of x's row r rounded to f16 where r < P.rows and c < P.k, else 0 (so the tile's
// last K-step and its rows past the last read zeros). x's row r: from P.x_off, P.x_stride
// apart; or where P.list is set, the row of slot table[P.list + r] (slot_x, slot_x.wgsl:
// the routed experts' rows in the order of their row tiles). Pairs of elements as u32.
//
// Params (binding 0): declared once, in src/kernels/matmul.rs (`HalfParams`, named Params here).

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read> table: array<u32>;

@compute @workgroup_size(256)
fn x_to_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    let pairs = P.kpad / 2u;
    if (i >= P.rows_pad * pairs) {
        return;
    }
    let r = i / pairs;
    let c = 2u * (i % pairs);
    var v = vec2<f32>(0.0);
    if (r < P.rows) {
        var at = P.x_off + r * P.x_stride + c;
        if (P.list != 0u) {
            at = slot_x(table[P.list + r]) + c;
        }
        if (c < P.k) {
            v.x = x[at];
        }
        if (c + 1u < P.k) {
            v.y = x[at + 1u];
        }
    }
    out[i] = pack2x16float(v);
}
