//! The wgpu device, buffers, the pipeline cache and the command recorder.
//!
//! Conventions every kernel follows:
//! - `@group(0) @binding(0)` is a uniform `Params` struct, declared once in the wrapper
//!   with `kernel_params!` (its WGSL twin is generated; see `params`); storage buffers
//!   follow at bindings 1, 2, … in the order the wrapper passes them.
//! - Buffers are always bound whole (offset 0); element offsets travel in `Params`.
//! - Defines are prepended to the WGSL source as `const NAME = VALUE;` lines, and a pipeline
//!   is cached by (shader name, entry point, defines).
//!
//! [`Gpu`] is made of parts, each in the file that does its job: `adapter` finds and
//! describes adapters; `device` opens the device and tracks its errors, loss, submissions
//! and interrupt flag; `pools` holds the pipeline cache, the param arena and bind-group
//! cache, and buffer creation with the named scratch buffers; `readback` (with
//! `oneshot`) reads buffers back; `stats` counts GPU objects; `profile` times kernels;
//! `recorder` records and submits dispatches; `spirv` compiles the tensor-core shaders;
//! `shader_stats` asks the driver what it compiled (registers and the like).

mod adapter;
mod device;
mod oneshot;
mod params;
mod pools;
mod profile;
mod readback;
mod recorder;
mod shader_stats;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod spirv;
mod stats;

#[cfg(not(target_arch = "wasm32"))]
pub use adapter::list_adapters;
pub use adapter::{
    device_features, tensor_cores_possible, AdapterSummary, LimitsRequest, COOP_WORKGROUP_BYTES,
};
pub(crate) use params::kernel_params;
pub use params::{Kernel, KernelParams, Shader, ShaderCode, ShaderVariant, WgslScalar};
pub use pools::buffers::Write;
pub use pools::pipelines::shader_prelude;
/// For the kernel tests that assemble a shader's source as the pipeline cache does.
#[cfg(test)]
pub(crate) use pools::pipelines::shader_source;
pub(crate) use pools::pipelines::{define_lines, NUM_DEFINES};
pub use profile::{Cost, KernelStat, ProfileClock};
pub use readback::{StagedRead, SPIN_LIMIT};
pub use recorder::{BufferCopy, Recorder, Recording};
pub use shader_stats::ShaderStats;
pub(crate) use stats::Stopwatch;
pub use stats::{GpuStats, HostTimes};

use std::sync::Mutex;

/// An open device and what sparsa keeps on it.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub adapter: AdapterSummary,
    pub limits: wgpu::Limits,
    /// Whether the device was opened with f16 cooperative matrices for the GEMM tile.
    tensor_cores: bool,
    /// Whether the tensor-core GEMMs keep x as precise as f32 for every weight format (see
    /// [`Gpu::set_exact_gemms`]).
    exact_gemms: std::sync::atomic::AtomicBool,
    /// [`Gpu::subgroup_lanes`], read once when the device opens (every matmul asks).
    subgroup_lanes: u32,
    /// Compiled pipelines, their labels and the shader prelude.
    pipelines: pools::PipelineCache,
    /// Bind groups of recorders that asked for caching (see [`Recorder::cache_bind_groups`]).
    bind_groups: pools::BindGroupCache,
    /// The uniform arena of the dispatches' `Params`, owned by one recorder at a time.
    params: pools::ParamArena,
    /// Named kernel scratch buffers (see [`Gpu::scratch`]) and the dummy binding.
    scratch: pools::ScratchPool,
    /// The staging buffer of readbacks and the latest submission.
    readback: readback::Readback,
    /// GPU errors, device loss, the submission count and the interrupt flag.
    health: device::Health,
    /// Buffers and bind groups created (see [`Gpu::stats`]).
    counters: stats::Counters,
    /// The profiler while profiling (see [`Gpu::set_profiling`]) and whether the device
    /// has timestamp queries.
    profile: profile::Profiling,
}

impl Gpu {
    /// Make the GEMMs that record from now on take x as hi and lo f16 halves (as precise as
    /// f32) for every weight format, or (`false`, the default) let the tensor-core GEMMs of
    /// q4 weights in a prompt's prefill ([`Recorder::set_prefill`]) take x as one f16 value:
    /// their 128-row tile, about 1.5× the prefill (`kernels::matmul`, `coop_x_f16`). For the
    /// goldens, which hold f32 rounding, and `--exact-gemms`. Adapters without tensor cores
    /// compute in f32 either way.
    pub fn set_exact_gemms(&self, on: bool) {
        self.exact_gemms
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// See [`Gpu::set_exact_gemms`].
    pub fn exact_gemms(&self) -> bool {
        self.exact_gemms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Largest buffer we bind as one storage binding.
    pub fn max_binding(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
            & !255
    }

    /// Largest workgroup count per dimension.
    pub fn max_groups(&self) -> u32 {
        self.limits.max_compute_workgroups_per_dimension
    }

    /// Spread `n` workgroups over x and y (kernels recover the linear id as
    /// `wid.x + wid.y * nwg.x`).
    pub fn grid(&self, n: u32) -> [u32; 3] {
        let m = self.max_groups();
        if n <= m {
            [n.max(1), 1, 1]
        } else {
            let y = n.div_ceil(m);
            [n.div_ceil(y), y, 1]
        }
    }
}

/// Lock a mutex even if a panicking thread poisoned it: the data behind our locks (an
/// error list, the pipeline cache, the param arena) stays valid whatever a panic interrupted.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The WGSL literal of a u32 define.
pub fn u(v: impl Into<u64>) -> String {
    format!("{}u", v.into())
}
