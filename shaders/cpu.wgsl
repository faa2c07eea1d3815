// Shared by the CPU adapters' kernels (src/kernels/mod.rs, `cpu_kernels`, whose CPU_WG is
// this one): their workgroup size (mla_cpu, scores_cpu, rms_norm_cpu, topk_cpu, route_cpu),
// and, for those with one invocation per item (rms_norm_cpu, topk_cpu, route_cpu), an
// invocation's item over a grid of one or two dimensions.
const CPU_WG: u32 = 8u;

fn cpu_item(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * CPU_WG + lid;
}
