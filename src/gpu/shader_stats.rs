//! What the driver's compiler made of each kernel: its statistics through
//! VK_KHR_pipeline_executable_properties (registers, spills, instruction counts: whatever the
//! driver reports; NVIDIA's include the register count, lavapipe's the LLVM IR size).
//!
//! wgpu neither enables that extension nor asks for the statistics when it creates a
//! pipeline, so this opens a second Vulkan device of its own on the same physical device,
//! with every feature the device offers and the extension on, and compiles each variant the
//! pipeline cache holds again there: the same WGSL through naga to SPIR-V (as the
//! tensor-core shaders are compiled; wgpu's own translation of the others differs in
//! details such as its SPIR-V version), a pipeline created with the statistics captured,
//! then destroyed. A measurement aid for tuning kernels (`sparsa bench --shader-stats`);
//! nothing runs on that device. Where wgpu builds no Vulkan backend (macOS, the browser) it
//! is an error.

use super::Gpu;
use crate::error::{Error, Result};

/// One kernel variant and its compiled executables' statistics, `(name, value)`.
#[derive(Clone, Debug)]
pub struct ShaderStats {
    /// `shader::entry`.
    pub label: String,
    /// The defines, `NAME = value` separated by spaces.
    pub defines: String,
    pub stats: Vec<(String, String)>,
}

impl ShaderStats {
    /// One line: the label, each statistic, then the defines.
    pub fn line(&self) -> String {
        let stats: Vec<String> = self.stats.iter().map(|(n, v)| format!("{n} {v}")).collect();
        format!("{}: {} [{}]", self.label, stats.join(", "), self.defines)
    }
}

impl Gpu {
    /// The driver's statistics for every variant the pipeline cache has compiled so far
    /// (see the module's doc). Fails on adapters other than Vulkan's, and where the driver
    /// lacks the extension.
    pub fn shader_stats(&self) -> Result<Vec<ShaderStats>> {
        #[cfg(any(
            windows,
            target_os = "linux",
            target_os = "android",
            target_os = "freebsd"
        ))]
        return vulkan::shader_stats(self);
        #[cfg(not(any(
            windows,
            target_os = "linux",
            target_os = "android",
            target_os = "freebsd"
        )))]
        Err(Error::msg("--shader-stats: only on Vulkan adapters"))
    }
}

#[cfg(any(
    windows,
    target_os = "linux",
    target_os = "android",
    target_os = "freebsd"
))]
mod vulkan {
    use super::{Error, Gpu, Result, ShaderStats};
    use crate::gpu::{spirv, ShaderVariant};
    use ash::vk;

    /// [`Gpu::shader_stats`] on a Vulkan adapter.
    pub(super) fn shader_stats(gpu: &Gpu) -> Result<Vec<ShaderStats>> {
        // SAFETY: only the instance, physical device and entry are read from the HAL
        // device; everything made below is made on a device of our own and destroyed here.
        let dev = unsafe { gpu.device.as_hal::<wgpu::hal::api::Vulkan>() }.ok_or_else(|| {
            Error::msg("--shader-stats: the adapter is not a Vulkan device".to_string())
        })?;
        let shared = dev.shared_instance();
        let own = OwnDevice::open(shared.raw_instance(), dev.raw_physical_device())?;
        let prelude = &gpu.pipelines.prelude;
        gpu.shader_variants()
            .into_iter()
            .map(|v| own.stats(&v, prelude))
            .collect()
    }

    /// A Vulkan device with pipeline executable statistics enabled.
    struct OwnDevice {
        device: ash::Device,
        props: ash::khr::pipeline_executable_properties::Device,
    }

    impl OwnDevice {
        fn open(inst: &ash::Instance, pd: vk::PhysicalDevice) -> Result<OwnDevice> {
            let vkerr =
                |what: &str, e: vk::Result| Error::msg(format!("--shader-stats: {what}: {e}"));
            // SAFETY: `pd` belongs to the live instance `inst`; the feature structs chained
            // below outlive the calls that read and write them.
            unsafe {
                let exts = inst
                    .enumerate_device_extension_properties(pd)
                    .map_err(|e| vkerr("device extensions", e))?;
                let has = |name: &std::ffi::CStr| {
                    exts.iter()
                        .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
                };
                let pe_name = ash::khr::pipeline_executable_properties::NAME;
                if !has(pe_name) {
                    return Err(Error::msg(format!(
                        "--shader-stats: the driver does not offer {}",
                        pe_name.to_string_lossy()
                    )));
                }
                let coop = has(ash::khr::cooperative_matrix::NAME);
                let api = inst.get_physical_device_properties(pd).api_version;
                let v13 = vk::api_version_major(api) > 1 || vk::api_version_minor(api) >= 3;
                let mut names = vec![pe_name.as_ptr()];
                if coop {
                    names.push(ash::khr::cooperative_matrix::NAME.as_ptr());
                }
                // Every feature the device has: the shaders' capabilities (f16, 8-bit storage,
                // integer dot products, subgroups, the Vulkan memory model, cooperative
                // matrices) then never fail for want of one.
                let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
                let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
                let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
                let mut fpe = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
                let mut fcm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
                let mut features = vk::PhysicalDeviceFeatures2::default()
                    .push_next(&mut f11)
                    .push_next(&mut f12)
                    .push_next(&mut fpe);
                if v13 {
                    features = features.push_next(&mut f13);
                }
                if coop {
                    features = features.push_next(&mut fcm);
                }
                inst.get_physical_device_features2(pd, &mut features);
                let family = inst
                    .get_physical_device_queue_family_properties(pd)
                    .iter()
                    .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
                    .ok_or_else(|| Error::msg("--shader-stats: no compute queue family"))?;
                let priorities = [1.0f32];
                let queues = [vk::DeviceQueueCreateInfo::default()
                    .queue_family_index(family as u32)
                    .queue_priorities(&priorities)];
                let info = vk::DeviceCreateInfo::default()
                    .queue_create_infos(&queues)
                    .enabled_extension_names(&names)
                    .push_next(&mut features);
                let device = inst
                    .create_device(pd, &info, None)
                    .map_err(|e| vkerr("device", e))?;
                let props = ash::khr::pipeline_executable_properties::Device::new(inst, &device);
                Ok(OwnDevice { device, props })
            }
        }

        /// Compiles `v` (on a device whose shader prelude is `prelude`) with its statistics
        /// captured, and returns them.
        fn stats(&self, v: &ShaderVariant, prelude: &str) -> Result<ShaderStats> {
            let label = format!("{}::{}", v.shader.name, v.entry);
            let fail = |what: &str, e: vk::Result| Error::msg(format!("{label}: {what}: {e}"));
            let src = v.source(prelude);
            let coop = src.contains("wgpu_cooperative_matrix");
            let c = spirv::compile_with(&src, v.entry, coop)?;
            let bindings: Vec<vk::DescriptorSetLayoutBinding> = c
                .layout
                .iter()
                .map(|e| {
                    let ty = match e.ty {
                        wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Uniform,
                            ..
                        } => vk::DescriptorType::UNIFORM_BUFFER,
                        _ => vk::DescriptorType::STORAGE_BUFFER,
                    };
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(e.binding)
                        .descriptor_type(ty)
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let entry = std::ffi::CString::new(v.entry).expect("entry names have no NUL");
            let d = &self.device;
            // SAFETY: every object is created on this device from valid create infos (naga's
            // validated SPIR-V, its reflected bindings) and destroyed before returning; the
            // pipeline is never bound or run.
            unsafe {
                let set = d
                    .create_descriptor_set_layout(
                        &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                        None,
                    )
                    .map_err(|e| fail("descriptor set layout", e))?;
                let sets = [set];
                let layout = d
                    .create_pipeline_layout(
                        &vk::PipelineLayoutCreateInfo::default().set_layouts(&sets),
                        None,
                    )
                    .map_err(|e| fail("pipeline layout", e))?;
                let module = d
                    .create_shader_module(
                        &vk::ShaderModuleCreateInfo::default().code(&c.words),
                        None,
                    )
                    .map_err(|e| fail("shader module", e))?;
                let stage = vk::PipelineShaderStageCreateInfo::default()
                    .stage(vk::ShaderStageFlags::COMPUTE)
                    .module(module)
                    .name(&entry);
                let info = [vk::ComputePipelineCreateInfo::default()
                    .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR)
                    .stage(stage)
                    .layout(layout)];
                let made = d.create_compute_pipelines(vk::PipelineCache::null(), &info, None);
                let out = match made {
                    Ok(p) => {
                        let stats = self.read(p[0]);
                        d.destroy_pipeline(p[0], None);
                        stats.map_err(|e| fail("statistics", e))
                    }
                    Err((_, e)) => Err(fail("pipeline", e)),
                };
                d.destroy_shader_module(module, None);
                d.destroy_pipeline_layout(layout, None);
                d.destroy_descriptor_set_layout(set, None);
                Ok(ShaderStats {
                    label,
                    defines: v.defines.replace('\n', " ").trim().to_string(),
                    stats: out?,
                })
            }
        }

        /// Every executable's statistics of pipeline `p` (named `executable: statistic` where
        /// a pipeline has several executables).
        ///
        /// # Safety
        /// `p` is a live pipeline of this device created with statistics captured.
        unsafe fn read(
            &self,
            p: vk::Pipeline,
        ) -> std::result::Result<Vec<(String, String)>, vk::Result> {
            let execs = self
                .props
                .get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(p))?;
            let mut out = Vec::new();
            for (i, ex) in execs.iter().enumerate() {
                let prefix = if execs.len() > 1 {
                    format!(
                        "{}: ",
                        ex.name_as_c_str()
                            .map_or("?".into(), |n| n.to_string_lossy())
                    )
                } else {
                    String::new()
                };
                let info = vk::PipelineExecutableInfoKHR::default()
                    .pipeline(p)
                    .executable_index(i as u32);
                for st in self.props.get_pipeline_executable_statistics(&info)? {
                    let name = st
                        .name_as_c_str()
                        .map_or("?".into(), |n| n.to_string_lossy());
                    let value = match st.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                            (st.value.b32 != 0).to_string()
                        }
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => st.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => {
                            st.value.u64.to_string()
                        }
                        vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => {
                            format!("{:.3}", st.value.f64)
                        }
                        _ => "?".into(),
                    };
                    out.push((format!("{prefix}{name}"), value));
                }
            }
            Ok(out)
        }
    }

    impl Drop for OwnDevice {
        fn drop(&mut self) {
            // SAFETY: nothing made on the device outlives `stats`, which destroys it all.
            unsafe { self.device.destroy_device(None) };
        }
    }
}
