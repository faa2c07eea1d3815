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
    /// RoPE's cos/sin for `rows` rows of `half` frequencies (rope.rs's layout), at random
    /// angles in [0, 3).
    pub fn cos_sin(&mut self, rows: usize, half: usize) -> Vec<f32> {
        (0..rows * half)
            .flat_map(|_| {
                let a = self.uniform() * 3.0;
                [a.cos(), a.sin()]
            })
            .collect()
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

/// A `rows × cols` f32 matrix placed in a buffer at element `off` with row stride `stride`,
/// every other element holding `fill`: NaN shows a kernel that reads outside its matrix, a
/// sentinel one that writes outside it ([`Placed::read`] checks).
pub struct Placed {
    pub buf: wgpu::Buffer,
    pub rows: usize,
    pub cols: usize,
    pub off: usize,
    pub stride: usize,
    fill: f32,
}

impl Placed {
    /// `data` (row-major, `cols` per row) at `(off, stride)`, one row's padding after the
    /// last row.
    pub fn new(
        g: &Gpu,
        data: &[f32],
        cols: usize,
        (off, stride): (usize, usize),
        fill: f32,
    ) -> Placed {
        assert!(stride >= cols && data.len().is_multiple_of(cols.max(1)));
        let rows = data.len() / cols.max(1);
        let mut all = vec![fill; off + (rows + 1) * stride];
        for (r, row) in data.chunks(cols.max(1)).enumerate() {
            all[off + r * stride..][..cols].copy_from_slice(row);
        }
        Placed {
            buf: g.buffer_from(&all, "placed").expect("test buffer"),
            rows,
            cols,
            off,
            stride,
            fill,
        }
    }

    /// An output matrix: everything holds `fill` until a kernel writes it.
    pub fn filled(g: &Gpu, rows: usize, cols: usize, at: (usize, usize), fill: f32) -> Placed {
        Placed::new(g, &vec![fill; rows * cols], cols, at, fill)
    }

    pub fn view(&self) -> crate::kernels::View<'_> {
        crate::kernels::View::new(&self.buf, self.off as u32, self.stride as u32)
    }

    /// The matrix read back (row-major); fails naming `what` if an element outside it is no
    /// longer `fill`.
    #[track_caller]
    pub fn read(&self, g: &Gpu, what: &str) -> Vec<f32> {
        let all = g
            .read_f32(&self.buf, 0, (self.buf.size() / 4) as usize)
            .expect("readback");
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for (i, v) in all.iter().enumerate() {
            let inside = i >= self.off && {
                let (r, c) = ((i - self.off) / self.stride, (i - self.off) % self.stride);
                r < self.rows && c < self.cols
            };
            if inside {
                out.push(*v);
            } else {
                assert!(
                    v.to_bits() == self.fill.to_bits(),
                    "{what}: element {i} outside the matrix changed to {v}"
                );
            }
        }
        out
    }
}

/// Cache rows of `row_words` words each, uploaded as segments of `seg_len` rows (one
/// buffer per segment, the last one partial), as `cache::CacheRows` lists them.
pub fn cache_segments(
    g: &Gpu,
    words: &[u32],
    row_words: usize,
    seg_len: usize,
) -> Vec<crate::kernels::cache::Segment> {
    words
        .chunks(row_words * seg_len)
        .enumerate()
        .map(|(i, w)| crate::kernels::cache::Segment {
            buf: g
                .buffer_from(w, &format!("cache segment {i}"))
                .expect("a test cache segment"),
            lo: (i * seg_len) as u32,
            len: (w.len() / row_words) as u32,
        })
        .collect()
}

/// The most the integer-dot GEMV's x may add to |x · w|: each x value is held to within
/// its 32-block's max|x| / 64516 (matmul_dot.wgsl), so Σ over blocks of that times Σ|w|.
pub fn x_split_bound(x: &[f32], w: &[f32]) -> f32 {
    let per_block = x.chunks(32).zip(w.chunks(32)).map(|(xb, wb)| {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        amax / 64516.0 * wb.iter().map(|v| v.abs()).sum::<f32>()
    });
    per_block.sum::<f32>() * 1.01
}
