//! Adapters: the wgpu instance, listing and ranking the adapters it sees, what `sparsa
//! devices` prints about each ([`AdapterSummary`]), which limits a device is opened with
//! ([`LimitsRequest`]), and whether an adapter has the tensor cores the GEMM tile can use.

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
    /// The fewest invocations a subgroup of the adapter has (where `subgroups`).
    pub subgroup_min: u32,
    pub timestamps: bool,
    /// Tensor cores usable by the GEMM tile (see `tensor_core_support`).
    pub tensor_cores: bool,
}

impl AdapterSummary {
    pub(super) fn of(adapter: &wgpu::Adapter) -> Self {
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
            subgroup_min: info.subgroup_min_size,
            timestamps: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            tensor_cores: tensor_core_support(adapter),
        }
    }

    /// Whether the adapter runs on the CPU (lavapipe, SwiftShader, a browser's fallback
    /// adapter): a few workgroups fill its cores, and idle lanes cost as much as busy ones.
    pub fn is_cpu(&self) -> bool {
        self.device_type == format!("{:?}", wgpu::DeviceType::Cpu)
    }

    /// A GPU with memory of its own across a bus (not integrated, not a CPU adapter).
    pub fn is_discrete(&self) -> bool {
        self.device_type == format!("{:?}", wgpu::DeviceType::DiscreteGpu)
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
pub(super) const NO_ADAPTER_HINT: &str = "no GPU adapter found: install a Vulkan driver (on Debian/Ubuntu without a GPU: `apt-get install mesa-vulkan-drivers` for the lavapipe software rasterizer)";
#[cfg(target_arch = "wasm32")]
pub(super) const NO_ADAPTER_HINT: &str =
    "no WebGPU adapter: this browser has WebGPU turned off or offers no adapter for it";

pub(super) fn instance() -> wgpu::Instance {
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
pub(super) async fn sorted_adapters(inst: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    let opts = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::HighPerformance,
        ..Default::default()
    };
    inst.request_adapter(&opts).await.ok().into_iter().collect()
}

#[cfg(not(target_arch = "wasm32"))]
pub(super) async fn sorted_adapters(inst: &wgpu::Instance) -> Vec<wgpu::Adapter> {
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

/// Which device limits [`Gpu::open`](super::Gpu::open) asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LimitsRequest {
    /// Everything the adapter offers (the default: larger bindings, more invocations).
    #[default]
    Adapter,
    /// WebGPU's default limits (128 MiB storage bindings, 8 storage buffers per stage,
    /// 256 invocations per workgroup), what every WebGPU adapter supports.
    WebGpuDefault,
}

/// Whether `adapter` offers what the tensor-core GEMM tile needs: cooperative matrices of
/// 16×16×16 with f16 inputs and f32 accumulation, f16 in shaders, subgroups of exactly 32
/// (the tile maps subgroup `lid / 32` to its outputs) and 36 KiB of workgroup memory
/// (its f16 staging tiles and f32 output tile: 4 × 5 KiB + 16 KiB).
/// Native only: browsers do not offer cooperative matrices.
fn tensor_core_support(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    if cfg!(target_arch = "wasm32") || !tensor_cores_possible(info.backend) {
        return false;
    }
    let f = adapter.features();
    f.contains(TENSOR_CORE_FEATURES)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.limits().max_compute_workgroup_storage_size >= COOP_WORKGROUP_BYTES
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            p.m_size == 16
                && p.n_size == 16
                && p.k_size == 16
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// Workgroup memory a device must offer for the tensor-core shaders: the GEMM tile's stages,
/// which matmul_coop.wgsl sizes to 46 KB with its output buffer and row offsets, and the
/// entries' own arrays (gemm_experts' row lists, 1 KB); the calibration probe takes less.
/// The tests check both against this. NVIDIA's Vulkan driver offers 48 KB.
pub const COOP_WORKGROUP_BYTES: u32 = 47 * 1024;

/// Whether the tensor-core tile can run on `backend`: only on Vulkan. Its module is SPIR-V
/// handed to the driver as is ([`spirv`](super::spirv)), which no other backend takes;
/// Metal's cooperative matrices (simdgroup matrices) are 8×8, not the tile's 16×16, and
/// wgpu 30 offers none on DX12, whose HLSL writer lacks them. Elsewhere GEMMs run the f32
/// tile (docs/PLATFORMS.md).
pub fn tensor_cores_possible(backend: wgpu::Backend) -> bool {
    backend == wgpu::Backend::Vulkan
}

/// The features a device is opened with, of those the adapter `offers`: timestamps (the
/// profiler), subgroups (`gemv_cpu_sg`), natively mappable primary buffers, and with
/// `tensor_cores` the tile's features. These decide what shaders may use (wgpu validates
/// them against the device's features), so the backend test validates every variant with
/// them.
pub fn device_features(offers: wgpu::Features, tensor_cores: bool) -> wgpu::Features {
    let mut wanted = wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SUBGROUP;
    // Host-memory staging buffers that the GPU copies from (expert uploads): mappable
    // buffers with COPY_SRC and MAP_READ live in host memory, MAP_WRITE ones may live in
    // GPU memory behind the PCIe BAR, where the host's writes are slower.
    if !cfg!(target_arch = "wasm32") {
        wanted |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
    }
    if tensor_cores {
        wanted |= TENSOR_CORE_FEATURES;
    }
    offers & wanted
}

/// The features the tensor-core tile needs: f16, cooperative matrices, and passthrough
/// shaders (its SPIR-V is patched for the memory model; see [`spirv`](super::spirv)).
const TENSOR_CORE_FEATURES: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    .union(wgpu::Features::PASSTHROUGH_SHADERS);

/// `SPARSA_TENSOR_CORES=0` keeps the f32 GEMM tile on adapters that have tensor cores (for
/// side-by-side measurements, or a driver that mishandles them).
pub(super) fn tensor_cores_disabled() -> bool {
    std::env::var("SPARSA_TENSOR_CORES").is_ok_and(|v| v == "0")
}
