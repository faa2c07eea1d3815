//! One module per WGSL kernel family (`shaders/<name>.wgsl`), each with its Rust wrapper
//! and its tests against a plain-Rust CPU reference.
//!
//! Each module declares its shader once: the source, embedded with `include_str!` (kernels
//! that read weights get `weights.wgsl`, dtype decoding, prepended, and those that may read
//! quantized weights `quant.wgsl` too), and its `Params` with `kernel_params!`, whose WGSL
//! struct the pipeline cache puts before the source.
//!
//! Wrappers only record work into a [`Recorder`]; nothing waits for the GPU.
//! All activations are f32. A [`View`] is a row-major f32 matrix inside a buffer:
//! element (r, c) lives at `offset + r * stride + c`.

pub mod attention;
pub mod cache;
pub mod elementwise;
pub mod embed;
pub mod indexer;
pub mod matmul;
pub mod norm;
pub mod rope;
pub mod router;
pub mod sample;
pub mod spec;
pub mod topk;

#[cfg(test)]
pub(crate) mod testutil;

pub use crate::gpu::Recorder;
use crate::gpu::ShaderCode;

/// Every kernel shader (the backend test checks that each entry point of each was
/// translated for Metal and DX12).
pub fn shaders() -> Vec<ShaderCode> {
    [
        attention::SHADERS,
        cache::SHADERS,
        elementwise::SHADERS,
        embed::SHADERS,
        indexer::SHADERS,
        matmul::SHADERS,
        norm::SHADERS,
        rope::SHADERS,
        router::SHADERS,
        sample::SHADERS,
        spec::SHADERS,
        topk::SHADERS,
    ]
    .concat()
}

/// Whether kernels on `gpu` take their CPU adapters' variants (`gemv_cpu`, `gemv_cpu_experts`,
/// `gemvt_cpu`, their `_cpu1` forms for rows that are not whole 16-byte words, `mla_cpu`, `rms_norm_cpu`, `topk_cpu`, `route_cpu`, and a few rows' router as
/// two dispatches rather than `route_gemv`): on CPU adapters (lavapipe), unless
/// `SPARSA_CPU_KERNELS=0` (a measurement aid). A CPU adapter runs a storage load whose address may
/// differ between invocations as a loop over its SIMD lanes (a bounds check, a scalar load and an
/// insert per lane and component), and a workgroup barrier as a switch through every SIMD slice of
/// the workgroup; these variants load each value once for more of its uses and do without barriers
/// (BENCHMARKS.md, "lavapipe: kernels for CPU adapters"). [`with_cpu_kernels`] decides for a thread
/// instead.
pub(crate) fn cpu_kernels(gpu: &crate::gpu::Gpu) -> bool {
    if let Some(forced) = FORCE_CPU_KERNELS.with(|f| f.get()) {
        return forced;
    }
    gpu.adapter.is_cpu() && crate::knobs::knob_on!("SPARSA_CPU_KERNELS")
}

/// The workgroup size of a kernel whose rows reduce through workgroup memory: `gpu_size` on
/// GPUs, [`CPU_WG`] where [`cpu_kernels`] holds (llvmpipe runs each barrier as a switch
/// through every SIMD slice of 8 invocations, so a smaller workgroup reduces through fewer,
/// cheaper barriers).
pub(crate) fn reduce_workgroup(gpu: &crate::gpu::Gpu, gpu_size: u32) -> u32 {
    if cpu_kernels(gpu) {
        CPU_WG
    } else {
        gpu_size
    }
}

/// Loop iterations one invocation of a CPU adapter's kernel may run (`mla_cpu`, `scores_cpu`,
/// `topk_cpu`, `route_cpu`).
/// llvmpipe (lavapipe) counts every loop iteration of an invocation against one limit of
/// 65,535 and past it leaves each loop at once, which would silently drop work (a
/// 2,000-position split of a 310-wide query did in `mla_cpu`'s tests); the kernels' hosts
/// keep each invocation to half of it.
pub(crate) const CPU_LOOPS: u32 = 32_768;

/// Invocations of a workgroup of the CPU adapters' small-workgroup kernels (`mla_cpu`,
/// `scores_cpu`, `rms_norm_cpu`, `topk_cpu`, `route_cpu`; CPU_WG in shaders/cpu.wgsl).
pub(crate) const CPU_WG: u32 = 8;

thread_local! {
    /// Set by [`with_cpu_kernels`]: what [`cpu_kernels`] answers on this thread.
    static FORCE_CPU_KERNELS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the kernels this thread records taking the CPU adapters' variants (`on`)
/// or the GPUs' ones, whatever the adapter: for tests, which check both kinds on one
/// adapter.
pub fn with_cpu_kernels<R>(on: bool, f: impl FnOnce() -> R) -> R {
    with_forced(&FORCE_CPU_KERNELS, on, f)
}

/// Runs `f` with `cell` answering `on` on this thread, then as before (the tests' override
/// of a choice a knob or the adapter makes).
pub(crate) fn with_forced<R>(
    cell: &'static std::thread::LocalKey<std::cell::Cell<Option<bool>>>,
    on: bool,
    f: impl FnOnce() -> R,
) -> R {
    let before = cell.with(|c| c.replace(Some(on)));
    let r = f();
    cell.with(|c| c.set(before));
    r
}

thread_local! {
    /// Set by [`with_mla_cpu_sg`]: whether the CPU adapters' sparse MLA may take its
    /// subgroup kernel on this thread.
    static FORCE_MLA_CPU_SG: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the CPU adapters' sparse MLA recorded on this thread taking `mla_cpu_sg`
/// where it fits (`on`) or `mla_cpu` (not `on`): for tests, which check both kernels on one
/// adapter.
pub fn with_mla_cpu_sg<R>(on: bool, f: impl FnOnce() -> R) -> R {
    with_forced(&FORCE_MLA_CPU_SG, on, f)
}

/// What [`with_mla_cpu_sg`] set on this thread.
fn forced_mla_cpu_sg() -> Option<bool> {
    FORCE_MLA_CPU_SG.with(|c| c.get())
}

/// The query rows of a chunk over the positions scored for it: row `t < rows` is at
/// position `pos0 + t` and sees the positions `s ≤ pos0 + t` of the `n_keys` scored
/// (causal attention over the cache).
///
/// With `places`, each row says where it sits instead (`shaders/places.wgsl`): two words per
/// row, the cache row of its sequence's position 0 (`lo`) and its position `pos` (< `n_keys`),
/// so the rows of several sequences whose caches share one pooled buffer run in one
/// dispatch (a batched decode step, `crate::model::Session::step_batch`). Row `t` then sees
/// positions `s ≤ pos` of its own sequence, at cache rows `lo + s`; `pos0` is unused. The
/// kernels that take it: the cache stores, the indexer's scores, top-k and select-all
/// (which output cache rows, `lo + s`, for sparse MLA to read). A row's cache rows must lie
/// in one segment of the cache, or `lo` be 0. `one_sequence`: the placed rows are all of
/// one sequence (one `lo`: a session's own chunk) at consecutive positions, so a kernel may
/// share the keys it reads between rows (the indexer's `scores_rows`) and the attention may
/// pair rows over their prefix selections; rows without places always are.
#[derive(Clone, Copy, Debug)]
pub struct Causal<'a> {
    pub rows: u32,
    pub n_keys: u32,
    pub pos0: u32,
    pub places: Option<&'a wgpu::Buffer>,
    pub one_sequence: bool,
}

impl<'a> Causal<'a> {
    /// `rows` rows of one sequence from position `pos0`, over `n_keys` positions.
    pub fn chunk(rows: u32, n_keys: u32, pos0: u32) -> Causal<'a> {
        Causal {
            rows,
            n_keys,
            pos0,
            places: None,
            // Places set later over this (`..Causal::chunk(..)`) are several sequences'
            // unless said otherwise.
            one_sequence: false,
        }
    }

    /// Whether every row is of one sequence: without places, or placed with `one_sequence`.
    pub(crate) fn of_one_sequence(&self) -> bool {
        self.places.is_none() || self.one_sequence
    }

    /// `P.ragged` of the kernels that take places: 1 with them.
    pub(crate) fn ragged(&self) -> u32 {
        self.places.is_some() as u32
    }

    /// [`Causal::ragged`], and the buffer to bind (a dummy without places).
    pub(crate) fn places_binding(&self, gpu: &'a crate::gpu::Gpu) -> (u32, &'a wgpu::Buffer) {
        (self.ragged(), self.places.unwrap_or(gpu.dummy()))
    }
}

/// `(pos0, rows)`: `rows` rows of one sequence from position `pos0` (the cache stores' form).
impl From<(u32, u32)> for Causal<'_> {
    fn from((pos0, rows): (u32, u32)) -> Self {
        Causal::chunk(rows, pos0 + rows, pos0)
    }
}

/// A row-major f32 matrix inside a buffer: element (r, c) at `offset + r * stride + c`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u32,
    pub stride: u32,
}

impl<'a> View<'a> {
    pub fn new(buf: &'a wgpu::Buffer, offset: u32, stride: u32) -> Self {
        View {
            buf,
            offset,
            stride,
        }
    }
    /// Rows of `stride` elements starting at element 0.
    pub fn rows(buf: &'a wgpu::Buffer, stride: u32) -> Self {
        View {
            buf,
            offset: 0,
            stride,
        }
    }
    /// The same matrix starting `cols` columns further right.
    pub fn col(self, cols: u32) -> Self {
        View {
            offset: self.offset + cols,
            ..self
        }
    }
    /// The same matrix starting `rows` rows further down.
    pub fn row(self, rows: u32) -> Self {
        View {
            offset: self.offset + rows * self.stride,
            ..self
        }
    }
}
