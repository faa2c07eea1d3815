// MoE routing of rows whose router logits a matmul wrote (router_pick.wgsl, prepended, has
// the rule): one workgroup per row, row t's logits at l_off + t · l_stride, its pairs at
// t · stride.

// Params (binding 0): declared once, in src/kernels/router.rs (`Params`), and put before this source.

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> idx: array<u32>;
@group(0) @binding(4) var<storage, read_write> weights: array<f32>;

@compute @workgroup_size(256)
fn route(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = wid.x + wid.y * nwg.x;
    if (t >= P.rows) {
        return;
    }
    let lb = P.l_off + t * P.l_stride;
    for (var e = lid; e < N2; e = e + WG) {
        set_expert(e, select(0.0, logits[lb + min(e, P.n_experts - 1u)], e < P.n_experts));
    }
    workgroupBarrier();
    pick_row(lid, t * P.stride);
}
