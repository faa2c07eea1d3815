// Rotary position embedding on dims [rot_off, rot_off + 2 * half) of each head, in place.
// One invocation per (row, head, frequency). Bindings: 1 = dst, 2 = cos_sin. The pairing
// and the rotation are rotary.wgsl's.

// Params (binding 0): declared once, in src/kernels/rope.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;

const WG: u32 = 256u;

struct Job {
    ok: bool,
    t: u32,
    d: vec2<u32>, // the pair's element offsets within the row
    dst: u32,     // offset of the row in dst
    c: f32,
    s: f32,
}

fn job(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> Job {
    var j: Job;
    let g = (wid.x + wid.y * nwg.x) * WG + lid;
    let per_row = P.heads * P.half;
    j.ok = g < P.rows * per_row;
    if (!j.ok) {
        return j;
    }
    j.t = g / per_row;
    let r = g % per_row;
    let i = r % P.half;
    j.d = (r / P.half) * P.head_stride + rotary_dims(i, P.rot_off, P.half, P.interleave != 0u);
    j.dst = P.dst_off + j.t * P.dst_stride;
    let ci = (j.t * P.half + i) * 2u;
    j.c = cs[ci];
    j.s = cs[ci + 1u];
    return j;
}

@compute @workgroup_size(256)
fn rope_inplace(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let j = job(wid, nwg, lid);
    if (!j.ok) {
        return;
    }
    let d = j.dst + j.d;
    let o = rotary(dst[d.x], dst[d.y], j.c, j.s);
    dst[d.x] = o.x;
    dst[d.y] = o.y;
}
