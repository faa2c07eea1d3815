//! Opening a device and keeping track of its health: [`Gpu::new`] / [`Gpu::open`] pick an
//! adapter and request the device with the features and limits sparsa uses; the error and
//! device-lost callbacks feed [`Health`], which [`Gpu::check`] and [`Gpu::sync`] turn into
//! errors; every queue submission goes through [`Gpu::submit`]; the interrupt flag stops long
//! host loops.

use super::adapter::{
    device_features, instance, sorted_adapters, tensor_cores_disabled, AdapterSummary,
    LimitsRequest, NO_ADAPTER_HINT,
};
use super::pools::{BindGroupCache, ParamArena, PipelineCache, ScratchPool, PARAM_ARENA};
use super::profile::Profiling;
use super::readback::Readback;
use super::stats::Counters;
use super::stats::HostPart;
use super::{lock, shader_prelude, Gpu};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What went wrong on the device, and the submissions and interrupt that go with it.
pub(super) struct Health {
    /// GPU validation / out-of-memory errors since the last [`Gpu::check`].
    pub(super) errors: Arc<Mutex<Vec<String>>>,
    /// Why the device was lost (driver reset, GPU removed, destroyed), once it was.
    lost: Arc<Mutex<Option<String>>>,
    /// Queue submissions so far (for `SPARSA_FAULT_DEVICE_LOST_AFTER`).
    submits: AtomicU64,
    /// Raised (e.g. by a Ctrl-C handler) to stop a long host loop such as the weight upload
    /// at its next step (see [`Gpu::interrupt_flag`]).
    interrupt: Arc<AtomicBool>,
    /// The first error of host work a submission waited for (a hybrid round's CPU experts,
    /// [`super::Recorder::before_submit`]) since the last [`Gpu::check`].
    pub(super) host: Mutex<Option<crate::error::Error>>,
}

impl Health {
    /// Install the error and device-lost callbacks of `device` (on adapter `adapter_name`).
    fn watch(device: &wgpu::Device, adapter_name: String) -> Health {
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
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
        Health {
            errors,
            lost,
            submits: AtomicU64::new(0),
            interrupt: Arc::default(),
            host: Mutex::default(),
        }
    }
}

impl Gpu {
    /// Open the first adapter whose name contains `filter` (case-insensitive), or the best one.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(filter: Option<&str>) -> Result<Gpu> {
        Self::open_blocking(filter, LimitsRequest::Adapter)
    }

    /// [`Gpu::open`], blocking, one device opened at a time in the process: instances,
    /// adapters and devices created from several threads at once are where drivers are
    /// least tested (the lib tests open two devices from their threads).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_blocking(filter: Option<&str>, limits: LimitsRequest) -> Result<Gpu> {
        static OPENING: Mutex<()> = Mutex::new(());
        let _one = lock(&OPENING);
        pollster::block_on(Self::open(filter, limits))
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
        let tensor_cores = summary.tensor_cores && !tensor_cores_disabled();
        let features = device_features(adapter.features(), tensor_cores);
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
        let subgroup_lanes = if device.features().contains(wgpu::Features::SUBGROUP) {
            summary.subgroup_min
        } else {
            0
        };
        let health = Health::watch(&device, summary.name.clone());
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
            device,
            queue,
            adapter: summary,
            limits,
            tensor_cores,
            exact_gemms: Default::default(),
            subgroup_lanes,
            pipelines: PipelineCache::new(prelude),
            bind_groups: BindGroupCache::default(),
            params: ParamArena::new(param_arena),
            scratch: ScratchPool::new(dummy),
            readback: Readback::default(),
            health,
            // The param arena and the dummy above.
            counters: Counters::new(2, PARAM_ARENA + 16),
            profile: Profiling::new(timestamps),
        })
    }

    /// Whether GEMMs run their tiles on tensor cores (cooperative matrices, 16×16×16, f16
    /// inputs, f32 accumulation; see `shaders/matmul_coop.wgsl`).
    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    /// The fewest invocations of a subgroup, where the device was opened with subgroups;
    /// else 0.
    pub fn subgroup_lanes(&self) -> u32 {
        self.subgroup_lanes
    }

    /// The flag that asks long host loops on this device (the weight upload) to stop: set it
    /// from a signal handler or another thread; they return an error saying they were
    /// interrupted.
    pub fn interrupt_flag(&self) -> Arc<AtomicBool> {
        self.health.interrupt.clone()
    }

    /// Fails with "interrupted while {what}" once [`Gpu::interrupt_flag`] was raised.
    pub fn check_interrupt(&self, what: &str) -> Result<()> {
        if self.health.interrupt.load(Ordering::SeqCst) {
            return Err(Error::msg(format!("interrupted while {what}")));
        }
        Ok(())
    }

    /// Bytes of the adapter's largest device-local memory heap, where the backend tells
    /// (Vulkan); `None` elsewhere (wgpu has no portable query). wgpu builds its Vulkan
    /// backend on these systems only (Cargo.toml's `ash` has the same condition).
    pub fn memory_size(&self) -> Option<u64> {
        // SPARSA_FAULT_GPU_MEMORY pretends the adapter has that much memory.
        let real = self.heap_size();
        match crate::fault::injected("GPU_MEMORY") {
            Some(f) => Some(real.map_or(f, |r| r.min(f))),
            None => real,
        }
    }

    fn heap_size(&self) -> Option<u64> {
        #[cfg(any(
            windows,
            target_os = "linux",
            target_os = "android",
            target_os = "freebsd"
        ))]
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
        #[cfg(not(any(
            windows,
            target_os = "linux",
            target_os = "android",
            target_os = "freebsd"
        )))]
        None
    }

    /// Submit command buffers to the queue (every submission goes through here).
    pub fn submit(&self, commands: impl IntoIterator<Item = wgpu::CommandBuffer>) {
        let index = self
            .counters
            .time(HostPart::Submit, || self.queue.submit(commands));
        self.counters.count(HostPart::Submits);
        *lock(&self.readback.last_submit) = Some(index);
        let n = self.health.submits.fetch_add(1, Ordering::Relaxed) + 1;
        if crate::fault::injected("DEVICE_LOST_AFTER") == Some(n) {
            log::warn!("SPARSA_FAULT_DEVICE_LOST_AFTER={n}: destroying the device");
            self.device.destroy();
        }
    }

    /// Fails once the device is lost, and with the first GPU validation / out-of-memory
    /// error seen since the last check.
    pub fn check(&self) -> Result<()> {
        if let Some(e) = lock(&self.health.host).take() {
            return Err(e);
        }
        if !lock(&self.health.errors).is_empty() {
            // A lost device makes every later call fail validation, and its own callback runs
            // only when the device is waited on: wait (this run is failing anyway), so that
            // the loss, not its symptoms, is what gets reported.
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        }
        if let Some(why) = lock(&self.health.lost).clone() {
            return Err(Error::msg(format!(
                "GPU device lost on {} ({why}); the driver reset or the GPU went away, so this run cannot go on (start sparsa again)",
                self.adapter.name
            )));
        }
        let mut e = lock(&self.health.errors);
        if e.is_empty() {
            Ok(())
        } else {
            // wgpu's first line is only "Validation Error"; what failed follows it.
            let first: Vec<&str> = e[0]
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .take(40)
                .collect();
            let first = first.join(" ");
            let all = std::mem::take(&mut *e);
            log::debug!("all GPU errors: {all:?}");
            Err(Error::msg(format!(
                "GPU error on {}: {first}",
                self.adapter.name
            )))
        }
    }

    /// Record an error for the next [`Gpu::check`] (for wrappers that record work and
    /// cannot return one).
    pub fn report_error(&self, msg: String) {
        log::error!("{msg}");
        lock(&self.health.errors).push(msg);
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
}
