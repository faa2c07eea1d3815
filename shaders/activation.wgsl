// Activations shared by the kernels that apply them (elementwise.wgsl's SwiGLU, and the
// integer-dot GEMV's SwiGLU prologue in matmul_dot.wgsl): one definition, the same bits.

fn silu(v: f32) -> f32 {
    return v / (1.0 + exp(-v));
}
