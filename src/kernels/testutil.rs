//! Shared helpers for the kernel tests: one GPU for the whole test binary, seeded random
//! inputs, and tolerant comparisons.

use crate::gpu::Gpu;
use std::sync::OnceLock;

/// The test GPU (lavapipe in CI). Tests fail, never skip, when no adapter exists.
pub fn gpu() -> &'static Gpu {
    static G: OnceLock<Gpu> = OnceLock::new();
    G.get_or_init(|| {
        Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref())
            .expect("a GPU adapter for the tests")
    })
}

/// A second device on the test adapter opened with WebGPU's default limits (16 KiB of
/// workgroup memory, 128 MiB bindings), for kernels whose shape depends on the limits.
pub fn gpu_default_limits() -> &'static Gpu {
    static G: OnceLock<Gpu> = OnceLock::new();
    G.get_or_init(|| {
        pollster::block_on(Gpu::open(
            std::env::var("SPARSA_ADAPTER").ok().as_deref(),
            crate::gpu::LimitsRequest::WebGpuDefault,
        ))
        .expect("a GPU adapter for the tests")
    })
}

/// A small deterministic generator (xorshift64*), so tests need no extra crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Assert |a - b| <= atol + rtol * |b| elementwise, with a helpful message.
#[track_caller]
pub fn assert_close(got: &[f32], want: &[f32], atol: f32, rtol: f32, what: &str) {
    assert_close_plus(got, want, atol, rtol, &[], what);
}

/// [`assert_close`] with `extra[i]` (where given) added to element i's tolerance.
#[track_caller]
pub fn assert_close_plus(
    got: &[f32],
    want: &[f32],
    atol: f32,
    rtol: f32,
    extra: &[f32],
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0usize, 0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        assert!(
            g.is_finite() == w.is_finite(),
            "{what}[{i}]: got {g}, want {w}"
        );
        let tol = atol + rtol * w.abs() + extra.get(i).copied().unwrap_or(0.0);
        if w.is_finite() && err > tol && err > worst.1 {
            worst = (i, err);
        }
    }
    assert!(
        worst.1 == 0.0,
        "{what}[{}]: got {}, want {} (|Δ| = {})",
        worst.0,
        got[worst.0],
        want[worst.0],
        worst.1
    );
}
