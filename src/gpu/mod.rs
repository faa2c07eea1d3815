//! The wgpu device, buffers, the pipeline cache and the command recorder.
//!
//! Conventions every kernel follows:
//! - `@group(0) @binding(0)` is a uniform `Params` struct (the wrapper's `#[repr(C)]` twin);
//!   storage buffers follow at bindings 1, 2, … in the order the wrapper passes them.
//! - Buffers are always bound whole (offset 0); element offsets travel in `Params`.
//! - Defines are prepended to the WGSL source as `const NAME = VALUE;` lines, and a pipeline
//!   is cached by (shader name, entry point, defines).

mod profile;
mod recorder;
#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod spirv;

pub use profile::{Cost, KernelStat, ProfileClock};
pub use recorder::Recorder;

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What `sparsa devices` prints about one adapter.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub max_storage_binding: u64,
    pub max_buffer: u64,
    pub max_invocations: u32,
    pub max_storage_buffers_per_stage: u32,
    pub max_workgroup_storage: u32,
    pub shader_f16: bool,
    pub subgroups: bool,
    pub timestamps: bool,
    /// Tensor cores usable by the GEMM tile (see [`tensor_core_support`]).
    pub tensor_cores: bool,
}

impl AdapterSummary {
    fn of(adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        let l = adapter.limits();
        let f = adapter.features();
        AdapterSummary {
            name: info.name.clone(),
            backend: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info)
                .trim()
                .to_string(),
            max_storage_binding: l.max_storage_buffer_binding_size,
            max_buffer: l.max_buffer_size,
            max_invocations: l.max_compute_invocations_per_workgroup,
            max_storage_buffers_per_stage: l.max_storage_buffers_per_shader_stage,
            max_workgroup_storage: l.max_compute_workgroup_storage_size,
            shader_f16: f.contains(wgpu::Features::SHADER_F16),
            subgroups: f.contains(wgpu::Features::SUBGROUP),
            timestamps: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            tensor_cores: tensor_core_support(adapter),
        }
    }

    /// One line for logs and `sparsa devices`.
    pub fn line(&self) -> String {
        format!(
            "{} ({}, {}) max binding {} MiB, max buffer {} MiB, {} invocations/workgroup, {} storage buffers/stage, f16 {}, subgroups {}, timestamps {}, tensor cores {}",
            self.name,
            self.backend,
            self.device_type,
            self.max_storage_binding >> 20,
            self.max_buffer >> 20,
            self.max_invocations,
            self.max_storage_buffers_per_stage,
            yes(self.shader_f16),
            yes(self.subgroups),
            yes(self.timestamps),
            yes(self.tensor_cores)
        )
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

#[cfg(not(target_arch = "wasm32"))]
const NO_ADAPTER_HINT: &str = "no GPU adapter found: install a Vulkan driver (on Debian/Ubuntu without a GPU: `apt-get install mesa-vulkan-drivers` for the lavapipe software rasterizer)";
#[cfg(target_arch = "wasm32")]
const NO_ADAPTER_HINT: &str =
    "no WebGPU adapter: this browser has WebGPU turned off or offers no adapter for it";

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    // Where the driver reports a memory budget (Vulkan's VK_EXT_memory_budget: NVIDIA, AMD,
    // lavapipe), creating a buffer past 95 % of it is an out-of-memory error instead of an
    // allocation the driver may overcommit and the system kill the process for later.
    desc.memory_budget_thresholds = wgpu::MemoryBudgetThresholds {
        for_resource_creation: Some(95),
        for_device_loss: None,
    };
    wgpu::Instance::new(desc)
}

/// Every adapter wgpu can see, best first (discrete, integrated, then software).
#[cfg(not(target_arch = "wasm32"))]
pub fn list_adapters() -> Vec<AdapterSummary> {
    pollster::block_on(sorted_adapters(&instance()))
        .iter()
        .map(AdapterSummary::of)
        .collect()
}

/// The browser offers one adapter, through `navigator.gpu.requestAdapter`.
#[cfg(target_arch = "wasm32")]
async fn sorted_adapters(inst: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    let opts = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    };
    inst.request_adapter(&opts).await.ok().into_iter().collect()
}

#[cfg(not(target_arch = "wasm32"))]
async fn sorted_adapters(inst: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    let mut v = inst.enumerate_adapters(wgpu::Backends::all()).await;
    v.sort_by_key(|a| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    });
    // The GL backend duplicates adapters and lacks compute features we rely on.
    v.retain(|a| a.get_info().backend != wgpu::Backend::Gl);
    v
}

type PipelineKey = (&'static str, &'static str, String);
/// A dispatch's bindings: pipeline (by address), params offset and size, buffers.
pub(crate) type BindKey = (usize, u64, u64, Vec<wgpu::Buffer>);
/// Cached bind groups beyond which the cache starts over.
pub(crate) const BIND_CACHE_MAX: usize = 8192;

/// Which device limits [`Gpu::open`] asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LimitsRequest {
    /// Everything the adapter offers (the default: larger bindings, more invocations).
    #[default]
    Adapter,
    /// WebGPU's default limits (128 MiB storage bindings, 8 storage buffers per stage,
    /// 256 invocations per workgroup), what every WebGPU adapter supports.
    WebGpuDefault,
}

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub adapter: AdapterSummary,
    pub limits: wgpu::Limits,
    /// Lines put before every shader's source: the `enable` directives this device needs
    /// (see [`shader_prelude`]).
    prelude: String,
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
    errors: Arc<Mutex<Vec<String>>>,
    pub(crate) param_arena: wgpu::Buffer,
    pub(crate) arena_lock: Mutex<()>,
    /// A small storage buffer bound where a kernel declares a binding it does not read
    /// (e.g. the scales of float weights).
    dummy: wgpu::Buffer,
    /// `name::entry` of each pipeline (by address), for the profiler.
    labels: Mutex<HashMap<usize, String>>,
    /// Per-kernel totals while profiling (see [`Gpu::set_profiling`]).
    pub(crate) profile: Mutex<Option<profile::Profiler>>,
    /// Whether the device was opened with timestamp queries.
    timestamps: bool,
    /// Whether the device was opened with f16 cooperative matrices for the GEMM tile.
    tensor_cores: bool,
    /// Bind groups of recorders that asked for caching (see [`Recorder::cache_bind_groups`]).
    pub(crate) bind_groups: Mutex<HashMap<BindKey, wgpu::BindGroup>>,
    /// Kernel scratch buffers by name, grown on demand and kept (see [`Gpu::scratch`]).
    scratch: Mutex<HashMap<&'static str, wgpu::Buffer>>,
    /// Raised (e.g. by a Ctrl-C handler) to stop a long host loop such as the weight upload
    /// at its next step (see [`Gpu::interrupt_flag`]).
    interrupt: Arc<AtomicBool>,
    /// Why the device was lost (driver reset, GPU removed, destroyed), once it was.
    lost: Arc<Mutex<Option<String>>>,
    /// Queue submissions so far (for `SPARSA_FAULT_DEVICE_LOST_AFTER`).
    submits: AtomicU64,
    /// The mappable buffer readbacks copy into, kept between reads and replaced only by a
    /// larger one (`None` while a read has it).
    staging: Mutex<Option<wgpu::Buffer>>,
    /// The latest queue submission (see [`Gpu::last_submission`]).
    last_submit: Mutex<Option<wgpu::SubmissionIndex>>,
    /// Buffers and bind groups created through [`Gpu::create_buffer`] and
    /// [`Gpu::create_bind_group`] (see [`Gpu::stats`]).
    buffers_created: AtomicU64,
    buffer_bytes_created: AtomicU64,
    bind_groups_created: AtomicU64,
}

/// One write of [`Gpu::write_batch`]: `bytes` to `buf` at `offset`.
pub struct Write<'a> {
    pub buf: wgpu::Buffer,
    pub offset: u64,
    pub bytes: std::borrow::Cow<'a, [u8]>,
}

/// Counts of GPU objects, for leak checks and `sparsa chat`'s `/stats` (see [`Gpu::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Buffers sparsa created since the device was opened, and their bytes.
    pub buffers_created: u64,
    pub buffer_bytes_created: u64,
    /// Bind groups sparsa created since the device was opened.
    pub bind_groups_created: u64,
    /// Buffers alive in wgpu's backend (wgpu's internal staging buffers included), and the
    /// device memory bound to them; 0 where wgpu keeps no counters (the browser).
    pub live_buffers: u64,
    pub live_buffer_bytes: u64,
    /// Bind groups alive in wgpu's backend.
    pub live_bind_groups: u64,
    /// Bytes the backend's memory allocator has handed out, and the bytes of the memory
    /// blocks it holds, where it reports them (Vulkan, D3D12).
    pub allocated_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
}

impl GpuStats {
    /// One line for `/stats` and logs.
    pub fn line(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut s = format!(
            "GPU buffers: live {} ({:.1} MiB), created {} ({:.1} MiB) | bind groups: live {}, created {}",
            self.live_buffers,
            mib(self.live_buffer_bytes),
            self.buffers_created,
            mib(self.buffer_bytes_created),
            self.live_bind_groups,
            self.bind_groups_created,
        );
        if let (Some(a), Some(r)) = (self.allocated_bytes, self.reserved_bytes) {
            s.push_str(&format!(
                " | allocator: {:.1} MiB in use, {:.1} MiB reserved",
                mib(a),
                mib(r)
            ));
        }
        s
    }
}

/// Size of the uniform arena that holds the `Params` of the dispatches of one submission.
pub(crate) const PARAM_ARENA: u64 = 1 << 20;

impl Gpu {
    /// Open the first adapter whose name contains `filter` (case-insensitive), or the best one.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(filter: Option<&str>) -> Result<Gpu> {
        pollster::block_on(Self::open(filter, LimitsRequest::Adapter))
    }

    /// [`Gpu::new`] for every platform (the browser cannot block on the adapter and device
    /// requests), with a choice of limits.
    pub async fn open(filter: Option<&str>, limits: LimitsRequest) -> Result<Gpu> {
        let inst = instance();
        let adapters = sorted_adapters(&inst).await;
        let adapter = match filter {
            Some(f) => {
                let fl = f.to_lowercase();
                let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
                adapters
                    .into_iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&fl))
                    .ok_or_else(|| {
                        Error::msg(format!(
                            "--adapter {f:?}: no adapter name contains it (adapters: {})",
                            names.join(", ")
                        ))
                    })?
            }
            None => adapters
                .into_iter()
                .next()
                .ok_or_else(|| Error::msg(NO_ADAPTER_HINT))?,
        };
        Self::from_adapter(adapter, limits).await
    }

    async fn from_adapter(adapter: wgpu::Adapter, request: LimitsRequest) -> Result<Gpu> {
        let summary = AdapterSummary::of(&adapter);
        let limits = match request {
            LimitsRequest::Adapter => adapter.limits(),
            LimitsRequest::WebGpuDefault => wgpu::Limits::default(),
        };
        // Only features the adapter offers are requested.
        let mut wanted = wgpu::Features::TIMESTAMP_QUERY;
        // Host-memory staging buffers that the GPU copies from (expert uploads): mappable
        // buffers with COPY_SRC and MAP_READ live in host memory, MAP_WRITE ones may live in
        // GPU memory behind the PCIe BAR, where the host's writes are slower.
        #[cfg(not(target_arch = "wasm32"))]
        {
            wanted |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        let tensor_cores = summary.tensor_cores && !tensor_cores_disabled();
        if tensor_cores {
            wanted |= TENSOR_CORE_FEATURES;
        }
        let features = adapter.features() & wanted;
        let timestamps = features.contains(wgpu::Features::TIMESTAMP_QUERY);
        let experimental_features = if tensor_cores {
            // SAFETY: wgpu marks cooperative matrices (and passthrough shaders) experimental
            // because their validation is incomplete: a shader could misuse them without an
            // error. The only shader that uses them (matmul_coop.wgsl) passes naga's
            // validator, and its cooperative loads and stores stay inside their workgroup
            // arrays (the last element a 16 × 16 load of the staged tiles reads is
            // (48 + 15) · 40 + 16 + 15 = 2551 < 2560; the output tile is 64 × 64 of 4096).
            // The matmul tests check it against the CPU reference on an adapter that has
            // tensor cores (BENCHMARKS.md, "Tensor cores", says where they ran).
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("sparsa"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features,
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
            .await
            .map_err(|e| {
                Error::msg(format!("adapter {}: cannot open device: {e}", summary.name))
            })?;
        let prelude = shader_prelude(device.features(), cfg!(target_arch = "wasm32"));
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        let adapter_name = summary.name.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let msg = match &e {
                wgpu::Error::OutOfMemory { .. } => format!(
                    "out of GPU memory on {adapter_name} ({e}): use a smaller --ctx or model, or --gpu-memory SIZE to stream routed experts from the files"
                ),
                _ => e.to_string(),
            };
            log::debug!("wgpu: {msg}");
            lock(&sink).push(msg);
        }));
        let lost: Arc<Mutex<Option<String>>> = Arc::default();
        let lost_sink = lost.clone();
        device.set_device_lost_callback(move |reason, msg| {
            log::debug!("GPU device lost ({reason:?}): {msg}");
            let why = if msg.is_empty() {
                format!("{reason:?}")
            } else {
                format!("{reason:?}: {msg}")
            };
            *lock(&lost_sink) = Some(why);
        });
        let param_arena = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: PARAM_ARENA,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dummy"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(Gpu {
            staging: Mutex::new(None),
            last_submit: Mutex::new(None),
            // The param arena and the dummy above.
            buffers_created: AtomicU64::new(2),
            buffer_bytes_created: AtomicU64::new(PARAM_ARENA + 16),
            bind_groups_created: AtomicU64::new(0),
            device,
            queue,
            adapter: summary,
            limits,
            prelude,
            pipelines: Mutex::default(),
            labels: Mutex::default(),
            dummy,
            profile: Mutex::new(None),
            timestamps,
            tensor_cores,
            scratch: Mutex::default(),
            bind_groups: Mutex::default(),
            errors,
            param_arena,
            arena_lock: Mutex::new(()),
            interrupt: Arc::default(),
            lost,
            submits: AtomicU64::new(0),
        })
    }

    /// Whether GEMMs run their tiles on tensor cores (cooperative matrices, 16×16×16, f16
    /// inputs, f32 accumulation; see `shaders/matmul_coop.wgsl`).
    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    /// The flag that asks long host loops on this device (the weight upload) to stop: set it
    /// from a signal handler or another thread; they return an error saying they were
    /// interrupted.
    pub fn interrupt_flag(&self) -> Arc<AtomicBool> {
        self.interrupt.clone()
    }

    /// Fails with "interrupted while {what}" once [`Gpu::interrupt_flag`] was raised.
    pub fn check_interrupt(&self, what: &str) -> Result<()> {
        if self.interrupt.load(Ordering::SeqCst) {
            return Err(Error::msg(format!("interrupted while {what}")));
        }
        Ok(())
    }

    /// Bytes of the adapter's largest device-local memory heap, where the backend tells
    /// (Vulkan); `None` elsewhere (wgpu has no portable query).
    pub fn memory_size(&self) -> Option<u64> {
        #[cfg(not(target_arch = "wasm32"))]
        {
            // SAFETY: the HAL device is only read (one query of the physical device's memory
            // properties); nothing is created or destroyed through it.
            let dev = unsafe { self.device.as_hal::<wgpu::hal::api::Vulkan>() }?;
            let inst = dev.shared_instance().raw_instance();
            // SAFETY: the physical device handle belongs to this live instance.
            let props =
                unsafe { inst.get_physical_device_memory_properties(dev.raw_physical_device()) };
            props.memory_heaps[..props.memory_heap_count as usize]
                .iter()
                .filter(|h| h.flags.contains(ash::vk::MemoryHeapFlags::DEVICE_LOCAL))
                .map(|h| h.size)
                .max()
        }
        #[cfg(target_arch = "wasm32")]
        None
    }

    /// Largest buffer we bind as one storage binding.
    pub fn max_binding(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
            & !255
    }

    /// Submit command buffers to the queue (every submission goes through here).
    pub fn submit(&self, commands: impl IntoIterator<Item = wgpu::CommandBuffer>) {
        let index = self.queue.submit(commands);
        *lock(&self.last_submit) = Some(index);
        let n = self.submits.fetch_add(1, Ordering::Relaxed) + 1;
        if crate::fault::injected("DEVICE_LOST_AFTER") == Some(n) {
            log::warn!("SPARSA_FAULT_DEVICE_LOST_AFTER={n}: destroying the device");
            self.device.destroy();
        }
    }

    /// Fails once the device is lost, and with the first GPU validation / out-of-memory
    /// error seen since the last check.
    pub fn check(&self) -> Result<()> {
        if !lock(&self.errors).is_empty() {
            // A lost device makes every later call fail validation, and its own callback runs
            // only when the device is waited on: wait (this run is failing anyway), so that
            // the loss, not its symptoms, is what gets reported.
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        }
        if let Some(why) = lock(&self.lost).clone() {
            return Err(Error::msg(format!(
                "GPU device lost on {} ({why}); the driver reset or the GPU went away, so this run cannot go on (start sparsa again)",
                self.adapter.name
            )));
        }
        let mut e = lock(&self.errors);
        if e.is_empty() {
            Ok(())
        } else {
            let first = e[0].lines().next().unwrap_or("").to_string();
            let all = std::mem::take(&mut *e);
            log::debug!("all GPU errors: {all:?}");
            Err(Error::msg(format!(
                "GPU error on {}: {first}",
                self.adapter.name
            )))
        }
    }

    /// The scratch buffer `name` with at least `bytes` bytes: created on first use, replaced
    /// by a larger one when a call needs more, else reused. For intermediate results that
    /// live between two dispatches of one kernel (queue order keeps the uses apart).
    pub fn scratch(&self, name: &'static str, bytes: u64) -> Result<wgpu::Buffer> {
        let mut m = lock(&self.scratch);
        if let Some(b) = m.get(name) {
            if b.size() >= bytes {
                return Ok(b.clone());
            }
        }
        let b = self.buffer(bytes, name)?;
        m.insert(name, b.clone());
        Ok(b)
    }

    /// Drop the cached bind groups (and with them their hold on buffers).
    pub fn clear_bind_groups(&self) {
        lock(&self.bind_groups).clear();
    }

    /// Record an error for the next [`Gpu::check`] (for wrappers that record work and
    /// cannot return one).
    pub fn report_error(&self, msg: String) {
        log::error!("{msg}");
        lock(&self.errors).push(msg);
    }

    /// A storage buffer of `bytes` (rounded up to 4), usable as copy source and destination.
    pub fn buffer(&self, bytes: u64, label: &str) -> Result<wgpu::Buffer> {
        let size = bytes.max(4).div_ceil(4) * 4;
        if size > self.max_binding() {
            return Err(Error::msg(format!(
                "buffer {label}: {size} bytes exceed the adapter's storage binding limit of {} bytes",
                self.max_binding()
            )));
        }
        let created = self.buffer_bytes_created.load(Ordering::Relaxed) + size;
        if crate::fault::injected("GPU_MEMORY").is_some_and(|limit| created > limit) {
            // What a driver reports when the memory is gone (see crate::fault).
            let msg = format!(
                "out of GPU memory on {} (SPARSA_FAULT_GPU_MEMORY): use a smaller --ctx or model, or --gpu-memory SIZE to stream routed experts from the files",
                self.adapter.name
            );
            return Err(Error::msg(format!("buffer {label} ({size} bytes): {msg}")));
        }
        let seen = lock(&self.errors).len();
        let buf = self.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        // Natively a failed creation reports to the error handler during the call.
        let mut errors = lock(&self.errors);
        if errors.len() > seen {
            let new: Vec<String> = errors.drain(seen..).collect();
            return Err(Error::msg(format!(
                "buffer {label} ({size} bytes): {}",
                new[0].lines().next().unwrap_or("")
            )));
        }
        Ok(buf)
    }

    /// Every buffer sparsa makes is created here, so [`Gpu::stats`] can count them.
    pub fn create_buffer(&self, desc: &wgpu::BufferDescriptor) -> wgpu::Buffer {
        self.buffers_created.fetch_add(1, Ordering::Relaxed);
        self.buffer_bytes_created
            .fetch_add(desc.size, Ordering::Relaxed);
        self.device.create_buffer(desc)
    }

    /// Every bind group sparsa makes is created here, so [`Gpu::stats`] can count them.
    pub fn create_bind_group(&self, desc: &wgpu::BindGroupDescriptor) -> wgpu::BindGroup {
        self.bind_groups_created.fetch_add(1, Ordering::Relaxed);
        self.device.create_bind_group(desc)
    }

    /// Buffers and bind groups created so far and alive now, and the allocator's totals (a
    /// few atomic loads; the allocator report walks its allocations, so this is for
    /// `/stats` and tests, not for every token).
    pub fn stats(&self) -> GpuStats {
        let hal = self.device.get_internal_counters().hal;
        let n = |v: isize| v.max(0) as u64;
        let report = self.device.generate_allocator_report();
        GpuStats {
            buffers_created: self.buffers_created.load(Ordering::Relaxed),
            buffer_bytes_created: self.buffer_bytes_created.load(Ordering::Relaxed),
            bind_groups_created: self.bind_groups_created.load(Ordering::Relaxed),
            live_buffers: n(hal.buffers.read()),
            live_buffer_bytes: n(hal.buffer_memory.read()),
            live_bind_groups: n(hal.bind_groups.read()),
            allocated_bytes: report.as_ref().map(|r| r.total_allocated_bytes),
            reserved_bytes: report.as_ref().map(|r| r.total_reserved_bytes),
        }
    }

    /// A storage buffer holding `data`.
    pub fn buffer_from<T: bytemuck::Pod>(&self, data: &[T], label: &str) -> Result<wgpu::Buffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buf = self.buffer(bytes.len() as u64, label)?;
        self.write(&buf, 0, bytes);
        Ok(buf)
    }

    /// Write bytes at `offset` (a multiple of 4); a ragged tail is zero-padded to 4 bytes.
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        let whole = bytes.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(buf, offset, &bytes[..whole]);
        }
        if whole < bytes.len() {
            let mut tail = [0u8; 4];
            tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
            self.queue.write_buffer(buf, offset + whole as u64, &tail);
        }
    }

    /// Many writes at once (expert offloading's uploads): large ones go straight into the
    /// API's staging memory, all of them copied by one team of threads that share the bytes
    /// evenly (a single thread's copy out of a memory-mapped file, page faults included, is
    /// far slower than the PCIe link). Large writes need offsets and lengths that are
    /// multiples of 4; small ones go through [`Gpu::write`].
    pub fn write_batch(&self, writes: &[Write]) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            const LARGE: usize = 256 << 10;
            let mut views = Vec::new();
            let mut jobs: Vec<(usize, &[u8])> = Vec::new();
            for w in writes {
                let b: &[u8] = &w.bytes;
                let view = (b.len() >= LARGE && b.len().is_multiple_of(4))
                    .then(|| std::num::NonZeroU64::new(b.len() as u64))
                    .flatten()
                    .and_then(|n| self.queue.write_buffer_with(&w.buf, w.offset, n));
                match view {
                    Some(mut v) => {
                        let mut dst = v.slice(..);
                        // As an address, so that the threads may share it.
                        jobs.push((dst.as_raw_element_ptr().as_ptr() as usize, b));
                        views.push(v);
                    }
                    None => self.write(&w.buf, w.offset, b),
                }
            }
            let total: usize = jobs.iter().map(|j| j.1.len()).sum();
            let threads = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(16)
                .min(total.div_ceil(LARGE))
                .max(1);
            // Cut every job into pieces of about total / (4 · threads) bytes; threads take
            // pieces in turn.
            let piece = total.div_ceil(4 * threads).max(4096).div_ceil(4) * 4;
            let pieces: Vec<(usize, &[u8])> = jobs
                .iter()
                .flat_map(|&(dst, src)| {
                    src.chunks(piece)
                        .enumerate()
                        .map(move |(i, c)| (dst + i * piece, c))
                })
                .collect();
            let next = AtomicU64::new(0);
            std::thread::scope(|sc| {
                for _ in 0..threads {
                    sc.spawn(|| loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(&(dst, src)) = pieces.get(i) else {
                            break;
                        };
                        // SAFETY: `dst` points into a writable staging mapping (one view per
                        // job, alive in `views` until the scope ends) with room for the
                        // whole job; pieces of one job are disjoint ranges of it, and each
                        // piece is copied by exactly one thread from `src`, a range of the
                        // caller's bytes (a different allocation).
                        unsafe {
                            std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len())
                        }
                    });
                }
            });
            drop(views);
        }
        #[cfg(target_arch = "wasm32")]
        for w in writes {
            self.write(&w.buf, w.offset, &w.bytes);
        }
    }

    /// Copy `bytes` bytes from `offset` in `buf` back to the host (waits for the GPU).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_bytes(&self, buf: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        pollster::block_on(self.read_bytes_async(buf, offset, bytes))
    }

    /// [`Gpu::read_bytes`] for every platform: natively the GPU is waited for before the
    /// first await (so the future is ready at once); in the browser the future resolves
    /// when the buffer is mapped.
    pub async fn read_bytes_async(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>> {
        let size = bytes.div_ceil(4) * 4;
        // The staging buffer is taken out of its slot for the read (a read that overlaps
        // another, only possible in the browser, makes its own) and put back after it.
        let kept = lock(&self.staging).take();
        let staging = match kept {
            Some(b) if b.size() >= size.max(4) => b,
            old => self.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: size.max(4).max(old.map_or(0, |b| b.size())),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, size);
        self.submit([enc.finish()]);
        let data = self.read_mapped_async(&staging, bytes, None).await?;
        let mut slot = lock(&self.staging);
        if slot.as_ref().is_none_or(|b| b.size() < staging.size()) {
            *slot = Some(staging);
        }
        Ok(data)
    }

    /// The first `bytes` bytes of the mappable buffer `buf`, once the submission `after` (or,
    /// with `None`, every submission so far) has finished on the GPU; later submissions may
    /// still run. The buffer is unmapped again before this returns.
    pub async fn read_mapped_async(
        &self,
        buf: &wgpu::Buffer,
        bytes: u64,
        after: Option<wgpu::SubmissionIndex>,
    ) -> Result<Vec<u8>> {
        let slice = buf.slice(..bytes.div_ceil(4).max(1) * 4);
        let (tx, rx) = oneshot();
        slice.map_async(wgpu::MapMode::Read, move |r| tx.send(r));
        // In the browser this returns at once: the device is polled by the browser itself.
        let wait = wgpu::PollType::Wait {
            submission_index: after,
            timeout: None,
        };
        if let Err(e) = self.device.poll(wait) {
            self.check()?;
            return Err(Error::msg(format!(
                "GPU wait failed on {}: {e}",
                self.adapter.name
            )));
        }
        let mapped = rx.await;
        if !matches!(mapped, Some(Ok(()))) {
            // A device lost after the awaited submission fails the map; its callback runs
            // when the device is waited on, so the loss is what gets reported.
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        }
        self.check()?;
        mapped
            .ok_or_else(|| Error::msg("GPU readback was dropped"))?
            .map_err(|e| Error::msg(format!("GPU readback failed: {e}")))?;
        let data = slice
            .get_mapped_range()
            .map_err(|e| Error::msg(format!("GPU readback failed: {e}")))?[..bytes as usize]
            .to_vec();
        buf.unmap();
        Ok(data)
    }

    /// The latest queue submission, to wait for with [`Gpu::read_mapped_async`].
    pub fn last_submission(&self) -> Option<wgpu::SubmissionIndex> {
        lock(&self.last_submit).clone()
    }

    pub async fn read_f32_async(
        &self,
        buf: &wgpu::Buffer,
        offset_elems: u64,
        n: usize,
    ) -> Result<Vec<f32>> {
        let b = self
            .read_bytes_async(buf, offset_elems * 4, n as u64 * 4)
            .await?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_f32(&self, buf: &wgpu::Buffer, offset_elems: u64, n: usize) -> Result<Vec<f32>> {
        pollster::block_on(self.read_f32_async(buf, offset_elems, n))
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_u32(&self, buf: &wgpu::Buffer, offset_elems: u64, n: usize) -> Result<Vec<u32>> {
        let b = self.read_bytes(buf, offset_elems * 4, n as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }

    /// Wait until all submitted work is done (in the browser: report the GPU errors seen so
    /// far; waiting happens in [`Gpu::read_bytes_async`]).
    pub fn sync(&self) -> Result<()> {
        if let Err(e) = self.device.poll(wgpu::PollType::wait_indefinitely()) {
            self.check()?;
            return Err(Error::msg(format!(
                "GPU wait failed on {}: {e}",
                self.adapter.name
            )));
        }
        self.check()
    }

    /// The pipeline for `entry` of shader `name`, compiled with `defines` once and cached.
    /// `defines` are `(NAME, WGSL literal)` pairs, e.g. `("WG", "256u")`.
    pub fn pipeline(
        &self,
        name: &'static str,
        source: &'static str,
        entry: &'static str,
        defines: &[(&str, String)],
    ) -> Arc<wgpu::ComputePipeline> {
        let header = define_lines(defines);
        let key = (name, entry, header.clone());
        if let Some(p) = lock(&self.pipelines).get(&key) {
            return p.clone();
        }
        let prelude = if source.contains("subgroup") {
            self.prelude.as_str()
        } else {
            ""
        };
        let src = shader_source(prelude, &header, source);
        let (module, layout) = if split_enables(source).0.contains("wgpu_cooperative_matrix") {
            let (module, layout) = self.coop_module(name, &src, entry);
            (module, Some(layout))
        } else {
            let desc = wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            };
            (self.shader_module(desc), None)
        };
        let p = Arc::new(
            self.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(&format!("{name}::{entry}")),
                    layout: layout.as_ref(),
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: Default::default(),
                    cache: None,
                }),
        );
        lock(&self.labels).insert(Arc::as_ptr(&p) as usize, format!("{name}::{entry}"));
        lock(&self.pipelines).insert(key, p.clone());
        p
    }

    /// Per-kernel profiling: while on, every dispatch runs in a compute pass of its own and
    /// its time (GPU timestamps where the adapter has them, else the wall time of the
    /// dispatch submitted alone), count and stated bytes/FLOPs are added to its kernel's
    /// totals. Slower than normal running; `take_profile` returns and clears the totals.
    pub fn set_profiling(&self, on: bool) {
        let clock = if self.timestamps {
            ProfileClock::Timestamps
        } else {
            ProfileClock::Wall
        };
        *lock(&self.profile) = on.then(|| profile::Profiler::new(clock));
    }

    /// How `set_profiling` measures on this device.
    pub fn profile_clock(&self) -> ProfileClock {
        if self.timestamps {
            ProfileClock::Timestamps
        } else {
            ProfileClock::Wall
        }
    }

    /// Per-kernel totals since profiling was switched on, largest time first.
    pub fn take_profile(&self) -> Vec<KernelStat> {
        lock(&self.profile)
            .as_mut()
            .map(|p| p.take())
            .unwrap_or_default()
    }

    /// A shader with cooperative matrices: SPIR-V from naga with workgroup memory ordered
    /// under the Vulkan memory model ([`spirv::compile`]), as a passthrough module, and its
    /// pipeline layout. The sources are sparsa's own and validated by naga on every run
    /// (tests included), so a failure here is a bug: it panics with naga's message.
    #[cfg(not(target_arch = "wasm32"))]
    fn coop_module(
        &self,
        name: &str,
        src: &str,
        entry: &str,
    ) -> (wgpu::ShaderModule, wgpu::PipelineLayout) {
        let (words, entries) = match spirv::compile(src, entry) {
            Ok(x) => x,
            Err(e) => panic!("shader {name}: {e}"),
        };
        let desc = wgpu::ShaderModuleDescriptorPassthrough {
            label: Some(name),
            entry_points: std::borrow::Cow::Owned(vec![wgpu::PassthroughShaderEntryPoint {
                name: entry.to_string().into(),
                workgroup_size: (256, 1, 1),
            }]),
            spirv: Some(std::borrow::Cow::Owned(words)),
            ..Default::default()
        };
        // SAFETY: the words are naga's SPIR-V for a module naga validated, changed only by
        // `spirv::publish_workgroup_memory` (memory-operand and barrier-semantics bits that
        // the Vulkan memory model the module already declares defines; covered by its unit
        // test), with buffer and index bounds checks compiled in. The bind group layout
        // passed with it is naga's reflection of the same module.
        let module = unsafe { self.device.create_shader_module_passthrough(desc) };
        let bgl = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(name),
                entries: &entries,
            });
        let layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(name),
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
        (module, layout)
    }

    #[cfg(target_arch = "wasm32")]
    fn coop_module(
        &self,
        name: &str,
        _src: &str,
        _entry: &str,
    ) -> (wgpu::ShaderModule, wgpu::PipelineLayout) {
        unreachable!("shader {name}: cooperative matrices are native only")
    }

    /// Compile a shader module. Natively without wgpu's loop bounding and integer-division
    /// checks (see the SAFETY comment); in the browser the WebGPU implementation applies its
    /// own checks and the plain call is used.
    fn shader_module(&self, desc: wgpu::ShaderModuleDescriptor) -> wgpu::ShaderModule {
        if cfg!(target_arch = "wasm32") {
            return self.device.create_shader_module(desc);
        }
        let checks = wgpu::ShaderRuntimeChecks {
            bounds_checks: shader_bounds_checks(),
            force_loop_bounding: false,
            int_div_checks: false,
            ..wgpu::ShaderRuntimeChecks::checked()
        };
        // SAFETY: two checks are off by default. Loop bounding stops infinite loops from being
        // undefined behaviour: every loop in sparsa's shaders runs a counter over a finite
        // range (their own source, never user input), so none is infinite. Integer-division
        // checks guard against dividing by zero (or i32::MIN by -1): every divisor in the
        // shaders is a nonzero define or a Params field the wrappers compute as nonzero
        // (tile counts, strides, head counts; the wrappers return early on empty shapes),
        // and no signed division by -1 occurs. Buffer bounds checks stay on unless
        // SPARSA_SHADER_BOUNDS_CHECKS=0 asks otherwise (a measurement aid; the kernels'
        // index arithmetic is tested against CPU references).
        unsafe { self.device.create_shader_module_trusted(desc, checks) }
    }

    /// The resolved timestamps of a profiled submission (native only: the browser cannot
    /// wait inside a recorder's flush, so profiling is not offered there).
    pub(crate) fn read_timestamps(&self, buf: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        #[cfg(not(target_arch = "wasm32"))]
        return self.read_bytes(buf, 0, bytes);
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (buf, bytes);
            Err(Error::msg(
                "per-kernel profiling is not available in the browser",
            ))
        }
    }

    /// A timestamp query set of `n` queries (profiling only).
    pub(crate) fn query_set(&self, n: u32) -> wgpu::QuerySet {
        self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: n.max(2),
        })
    }

    pub fn dummy(&self) -> &wgpu::Buffer {
        &self.dummy
    }

    pub(crate) fn label_of(&self, p: &Arc<wgpu::ComputePipeline>) -> String {
        lock(&self.labels)
            .get(&(Arc::as_ptr(p) as usize))
            .cloned()
            .unwrap_or_else(|| "?".into())
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

/// `const NAME = value;` lines for `defines`.
pub(crate) fn define_lines(defines: &[(&str, String)]) -> String {
    defines
        .iter()
        .map(|(k, v)| format!("const {k} = {v};\n"))
        .collect()
}

/// A shader source's leading `enable` directives, and the rest.
fn split_enables(source: &str) -> (&str, &str) {
    let body = source.trim_start();
    let split = body
        .lines()
        .take_while(|l| l.starts_with("enable "))
        .map(|l| l.len() + 1)
        .sum::<usize>()
        .min(body.len());
    body.split_at(split)
}

/// A shader's full source: the device prelude, the source's own leading `enable`
/// directives (which must come before any declaration), the defines, then the rest.
pub(crate) fn shader_source(prelude: &str, header: &str, source: &str) -> String {
    let (enables, rest) = split_enables(source);
    format!("{prelude}{enables}{header}{rest}")
}

/// Whether `adapter` offers what the tensor-core GEMM tile needs: cooperative matrices of
/// 16×16×16 with f16 inputs and f32 accumulation, f16 in shaders, subgroups of exactly 32
/// (the tile maps subgroup `lid / 32` to its outputs) and 36 KiB of workgroup memory
/// (its f16 staging tiles and f32 output tile: 4 × 5 KiB + 16 KiB).
/// Native only: browsers do not offer cooperative matrices.
fn tensor_core_support(adapter: &wgpu::Adapter) -> bool {
    if cfg!(target_arch = "wasm32") {
        return false;
    }
    let f = adapter.features();
    let info = adapter.get_info();
    f.contains(TENSOR_CORE_FEATURES)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.limits().max_compute_workgroup_storage_size >= 36 * 1024
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            p.m_size == 16
                && p.n_size == 16
                && p.k_size == 16
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// The features the tensor-core tile needs: f16, cooperative matrices, and passthrough
/// shaders (its SPIR-V is patched for the memory model; see [`spirv`]).
const TENSOR_CORE_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    .union(wgpu::Features::PASSTHROUGH_SHADERS);

/// `SPARSA_TENSOR_CORES=0` keeps the f32 GEMM tile on adapters that have tensor cores (for
/// side-by-side measurements, or a driver that mishandles them).
fn tensor_cores_disabled() -> bool {
    std::env::var("SPARSA_TENSOR_CORES").is_ok_and(|v| v == "0")
}

/// The `enable` directives put before a shader's source on a device with `features`.
/// Browsers require `enable subgroups;` before subgroup builtins, which native wgpu (naga)
/// rejects, so the line is generated for the web build only; the `.wgsl` files stay one
/// source for both.
pub fn shader_prelude(features: wgpu::Features, web: bool) -> String {
    let mut p = String::new();
    if web && features.contains(wgpu::Features::SUBGROUP) {
        p.push_str("enable subgroups;\n");
    }
    p
}

/// A one-value channel whose receiver is a future (`None` when the sender was dropped
/// unsent): how a `map_async` callback hands its result to an `async fn`.
fn oneshot<T>() -> (OneshotTx<T>, OneshotRx<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        closed: false,
        waker: None,
    }));
    (OneshotTx(slot.clone()), OneshotRx(slot))
}

struct Slot<T> {
    value: Option<T>,
    closed: bool,
    waker: Option<std::task::Waker>,
}

struct OneshotTx<T>(Arc<Mutex<Slot<T>>>);
struct OneshotRx<T>(Arc<Mutex<Slot<T>>>);

impl<T> OneshotTx<T> {
    fn send(self, v: T) {
        lock(&self.0).value = Some(v);
        // Drop wakes the receiver.
    }
}

impl<T> Drop for OneshotTx<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = lock(&self.0);
            s.closed = true;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> std::future::Future for OneshotRx<T> {
    type Output = Option<T>;
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        let mut s = lock(&self.0);
        if let Some(v) = s.value.take() {
            return std::task::Poll::Ready(Some(v));
        }
        if s.closed {
            return std::task::Poll::Ready(None);
        }
        s.waker = Some(cx.waker().clone());
        std::task::Poll::Pending
    }
}

/// Lock a mutex even if a panicking thread poisoned it: the data behind our locks (an
/// error list, the pipeline cache, the param arena) stays valid whatever a panic interrupted.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether shaders get wgpu's buffer bounds checks (on unless SPARSA_SHADER_BOUNDS_CHECKS=0).
fn shader_bounds_checks() -> bool {
    std::env::var("SPARSA_SHADER_BOUNDS_CHECKS").map_or(true, |v| v != "0")
}

/// The WGSL literal of a u32 define.
pub fn u(v: impl Into<u64>) -> String {
    format!("{}u", v.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prelude_enables_subgroups_only_in_the_browser() {
        let sg = wgpu::Features::SUBGROUP;
        assert_eq!(shader_prelude(sg, true), "enable subgroups;\n");
        assert_eq!(shader_prelude(sg, false), "", "naga rejects the directive");
        assert_eq!(shader_prelude(wgpu::Features::empty(), true), "");
    }

    #[test]
    fn oneshot_delivers_a_value_or_none_when_the_sender_is_dropped() {
        let (tx, rx) = oneshot();
        tx.send(7u32);
        assert_eq!(pollster::block_on(rx), Some(7));
        let (tx, rx) = oneshot::<u32>();
        let waiter = std::thread::spawn(move || pollster::block_on(rx));
        drop(tx);
        assert_eq!(waiter.join().unwrap(), None);
    }
}
