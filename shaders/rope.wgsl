// Rotary position embedding on dims [rot_off, rot_off + 2 * half) of each head.
// One invocation per (row, head, frequency). Bindings: 1 = dst, 2 = cos_sin, 3 = src.
//   rope_inplace  reads and writes dst
//   rope_copy     reads src, writes only the rotated dims of dst

// Params (binding 0): declared once, in src/kernels/rope.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;
@group(0) @binding(3) var<storage, read> src: array<f32>;

const WG: u32 = 256u;

struct Job {
    ok: bool,
    t: u32,
    ia: u32,   // element offset of a within its head
    ib: u32,   // element offset of b within its head
    head: u32, // offset of the head within its row
    c: f32,
    s: f32,
}

fn job(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> Job {
    var j: Job;
    let gid = (wid.x + wid.y * nwg.x) * WG + lid;
    let per_row = P.heads * P.half;
    j.ok = gid < P.rows * per_row;
    if (!j.ok) {
        return j;
    }
    j.t = gid / per_row;
    let r = gid % per_row;
    let h = r / P.half;
    let i = r % P.half;
    if (P.interleave != 0u) {
        j.ia = P.rot_off + 2u * i;
        j.ib = j.ia + 1u;
    } else {
        j.ia = P.rot_off + i;
        j.ib = j.ia + P.half;
    }
    j.head = h * P.head_stride;
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
    let base = P.dst_off + j.t * P.dst_stride + j.head;
    let a = dst[base + j.ia];
    let b = dst[base + j.ib];
    dst[base + j.ia] = a * j.c - b * j.s;
    dst[base + j.ib] = b * j.c + a * j.s;
}

@compute @workgroup_size(256)
fn rope_copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let j = job(wid, nwg, lid);
    if (!j.ok) {
        return;
    }
    let sb = P.src_off + j.t * P.src_stride + j.head;
    let db = P.dst_off + j.t * P.dst_stride + j.head;
    let a = src[sb + j.ia];
    let b = src[sb + j.ib];
    dst[db + j.ia] = a * j.c - b * j.s;
    dst[db + j.ib] = b * j.c + a * j.s;
}
