//! Shared helpers for the kernel tests: one GPU for the whole test binary, placed matrices,
//! cache segments; and, from [`crate::testutil`], seeded random inputs and tolerant
//! comparisons.

use crate::gpu::Gpu;
pub use crate::testutil::{
    abs_dot, assert_close, assert_close_plus, x_f16_bound, x_split_bound, Rng,
};
use std::sync::OnceLock;

/// The test GPU (lavapipe in CI). Tests fail, never skip, when no adapter exists.
pub fn gpu() -> &'static Gpu {
    static G: OnceLock<Gpu> = OnceLock::new();
    G.get_or_init(own_gpu)
}

/// A device of the caller's own on the test adapter, for a test that reads what the device
/// counts (host writes, submissions): on [`gpu`] the other test threads add to the counts.
pub fn own_gpu() -> Gpu {
    Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter for the tests")
}

/// A second device on the test adapter opened with WebGPU's default limits (16 KiB of
/// workgroup memory, 128 MiB bindings), for kernels whose shape depends on the limits.
pub fn gpu_default_limits() -> &'static Gpu {
    static G: OnceLock<Gpu> = OnceLock::new();
    G.get_or_init(|| {
        Gpu::open_blocking(
            std::env::var("SPARSA_ADAPTER").ok().as_deref(),
            crate::gpu::LimitsRequest::WebGpuDefault,
        )
        .expect("a GPU adapter for the tests")
    })
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

/// RMSNorm of `x` with weight `w` (`x · rsqrt(mean(x²) + eps) · w`), in f64.
pub fn rms_norm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| *v as f64 * *v as f64).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps as f64).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, w)| (*v as f64 * s * *w as f64) as f32)
        .collect()
}
