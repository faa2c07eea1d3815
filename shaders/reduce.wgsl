// Workgroup reductions shared by several shaders. The including shader declares
// `const WG: u32` (a power of two, its workgroup size) and `var<workgroup> red: array<f32, WG>`.

// Workgroup sum of `v` (every invocation gets the result). Uniform control flow only.
fn wg_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}
