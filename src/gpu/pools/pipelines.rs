//! The pipeline cache: a shader's source is assembled (the device prelude, the shader's own
//! `enable` lines, its `Params` struct, the defines, then the rest), compiled once per
//! (shader name, entry point, defines) and kept, with the `name::entry` label the profiler
//! reports it under and the variant it was compiled from ([`Gpu::shader_variants`]). Shaders
//! with cooperative matrices go through sparsa's own SPIR-V path ([`spirv::compile`]); the
//! others are compiled by wgpu with the runtime checks stated in [`Gpu::shader_module`].

#[cfg(not(target_arch = "wasm32"))]
use crate::gpu::spirv;
use crate::gpu::stats::HostPart;
use crate::gpu::{lock, Gpu, Kernel, KernelParams, Shader, ShaderVariant};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

/// Compiled pipelines and their labels.
pub(in crate::gpu) struct PipelineCache {
    /// Lines put before every shader's source: the `enable` directives this device needs
    /// (see [`shader_prelude`]).
    pub(in crate::gpu) prelude: String,
    /// Each pipeline with the variant it was compiled from, filed by a hash of (name,
    /// entry, defines) computed without allocating ([`variant_hash`]): a decode step looks up
    /// every dispatch's pipeline (1,641 at 78 layers), and building the define text for a
    /// key cost about a microsecond each.
    compiled: Mutex<HashMap<u64, Vec<Compiled>>>,
    /// Held while a pipeline compiles: one compile at a time per device. On the H200 the
    /// lib tests (4 threads, each compiling its kernels on first use with the driver's
    /// shader cache cold) hung before any GPU test finished in 2 of 4 runs (2026-12-04);
    /// compiles are once per variant, so waiting costs little.
    compiling: Mutex<()>,
    /// `name::entry` of each pipeline (by address), for the profiler.
    labels: Mutex<HashMap<usize, String>>,
    /// The pipelines [`Gpu::pipeline_n`] found, by numbers: its key hashes a few words
    /// where [`PipelineCache::compiled`]'s hashes every define's text, and its callers
    /// build no define text unless the variant is new. On an H100 the text lookups took
    /// ~0.2 ms of each speculative round's ~0.8 ms of recording (~235 dispatches).
    numbered: Mutex<HashMap<NumKey, Arc<wgpu::ComputePipeline>, BuildHasherDefault<WordHasher>>>,
}

/// Most defines a [`Gpu::pipeline_n`] variant has (each call site checks its own count
/// against it when it compiles: `kernels::matmul`'s tensor-core tile has the most).
pub(crate) const NUM_DEFINES: usize = 32;

/// A variant by numbers ([`Gpu::pipeline_n`]): where the shader's name and the entry's
/// text lie (the same text at two addresses files a variant twice, never two variants as
/// one), and the defines' values; their names are the call site's, fixed with its entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct NumKey {
    shader: (usize, usize),
    entry: (usize, usize),
    len: usize,
    values: [u32; NUM_DEFINES],
}

/// A hasher for keys of a few machine words ([`NumKey`]): a rotate, xor and multiply per
/// word, where the standard one runs SipHash over each byte.
#[derive(Default)]
struct WordHasher(u64);

impl WordHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl std::hash::Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.add(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.add(v);
    }
    fn write_usize(&mut self, v: usize) {
        self.add(v as u64);
    }
}

/// A pipeline in [`PipelineCache::compiled`]: the variant it was compiled from, with its
/// defines as given.
struct Compiled {
    variant: ShaderVariant,
    defines: Vec<(String, String)>,
    pipeline: Arc<wgpu::ComputePipeline>,
}

impl Compiled {
    fn is(&self, name: &str, entry: &str, defines: &[(&str, String)]) -> bool {
        self.variant.shader.name == name
            && self.variant.entry == entry
            && self.defines.len() == defines.len()
            && self
                .defines
                .iter()
                .zip(defines)
                .all(|((k, v), (k2, v2))| k == k2 && v == v2)
    }
}

/// The hash [`PipelineCache::compiled`] files a pipeline under.
fn variant_hash(name: &str, entry: &str, defines: &[(&str, String)]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (name, entry).hash(&mut h);
    for (k, v) in defines {
        (k, v.as_str()).hash(&mut h);
    }
    h.finish()
}

impl PipelineCache {
    pub(in crate::gpu) fn new(prelude: String) -> PipelineCache {
        PipelineCache {
            prelude,
            compiled: Mutex::default(),
            compiling: Mutex::default(),
            labels: Mutex::default(),
            numbered: Mutex::default(),
        }
    }
}

impl Gpu {
    /// The pipeline for `entry` of `shader`, compiled with `defines` once and cached.
    /// `defines` are `(NAME, WGSL literal)` pairs, e.g. `("WG", "256u")`.
    pub fn pipeline<P: KernelParams>(
        &self,
        shader: &Shader<P>,
        entry: &'static str,
        defines: &[(&str, String)],
    ) -> Kernel<P> {
        self.counters.time(HostPart::Pipelines, || {
            let hash = variant_hash(shader.name, entry, defines);
            let find = || {
                lock(&self.pipelines.compiled).get(&hash).and_then(|v| {
                    v.iter()
                        .find(|c| c.is(shader.name, entry, defines))
                        .map(|c| c.pipeline.clone())
                })
            };
            let mut found = find();
            let mut _compiling = None;
            if found.is_none() {
                _compiling = Some(lock(&self.pipelines.compiling));
                // Another thread may have compiled it meanwhile.
                found = find();
            }
            let pipeline = match found {
                Some(p) => p,
                None => {
                    let variant = ShaderVariant {
                        shader: shader.code(),
                        entry,
                        defines: define_lines(defines),
                    };
                    let pipeline = self.compile(&variant);
                    lock(&self.pipelines.compiled)
                        .entry(hash)
                        .or_default()
                        .push(Compiled {
                            variant,
                            defines: defines
                                .iter()
                                .map(|(k, v)| (k.to_string(), v.clone()))
                                .collect(),
                            pipeline: pipeline.clone(),
                        });
                    pipeline
                }
            };
            Kernel::new(pipeline)
        })
    }

    /// [`Gpu::pipeline`] for defines that are all u32 literals, given as `names` and their
    /// `values` (at most 24): looked up by the numbers, and the define text is built only
    /// for a variant not seen before. For kernels recorded many times a step (the GEMVs).
    pub fn pipeline_n<P: KernelParams>(
        &self,
        shader: &Shader<P>,
        entry: &'static str,
        names: &[&str],
        values: &[u32],
    ) -> Kernel<P> {
        assert!(names.len() == values.len() && values.len() <= NUM_DEFINES);
        let at = |s: &str| (s.as_ptr() as usize, s.len());
        let mut key = NumKey {
            shader: at(shader.name),
            entry: at(entry),
            len: values.len(),
            values: [0; NUM_DEFINES],
        };
        key.values[..values.len()].copy_from_slice(values);
        let found = self.counters.time(HostPart::Pipelines, || {
            lock(&self.pipelines.numbered).get(&key).cloned()
        });
        if let Some(p) = found {
            return Kernel::new(p);
        }
        let defines: Vec<(&str, String)> = names
            .iter()
            .zip(values)
            .map(|(n, v)| (*n, crate::gpu::u(*v)))
            .collect();
        let kernel = self.pipeline(shader, entry, &defines);
        lock(&self.pipelines.numbered).insert(key, kernel.pipeline.clone());
        kernel
    }

    /// Compiles `variant` into a pipeline and files its label.
    fn compile(&self, variant: &ShaderVariant) -> Arc<wgpu::ComputePipeline> {
        let (name, source, entry) = (variant.shader.name, variant.shader.source, variant.entry);
        let start = crate::gpu::Stopwatch::start();
        let src = variant.source(&self.pipelines.prelude);
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
                    compilation_options: wgpu::PipelineCompilationOptions {
                        zero_initialize_workgroup_memory: zero_workgroup_memory(),
                        ..Default::default()
                    },
                    cache: None,
                }),
        );
        lock(&self.pipelines.labels).insert(Arc::as_ptr(&p) as usize, format!("{name}::{entry}"));
        log::debug!(
            "compiled {name}::{entry} [{}] in {:.1} ms",
            variant.defines.replace('\n', " "),
            start.ms()
        );
        p
    }

    /// Every variant the pipeline cache has compiled on this device so far, sorted (the
    /// backend test translates them for Metal and DX12).
    pub fn shader_variants(&self) -> Vec<ShaderVariant> {
        let mut v: Vec<ShaderVariant> = lock(&self.pipelines.compiled)
            .values()
            .flatten()
            .map(|c| c.variant.clone())
            .collect();
        v.sort();
        v
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
        let spirv::Compiled {
            words,
            layout: entries,
            workgroup_bytes,
        } = match spirv::compile(src, entry) {
            Ok(x) => x,
            Err(e) => panic!("shader {name}: {e}"),
        };
        let limit = self.device.limits().max_compute_workgroup_storage_size;
        assert!(
            workgroup_bytes <= limit,
            "shader {name} ({entry}): {workgroup_bytes} bytes of workgroup memory, the device allows {limit}"
        );
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

    pub(crate) fn label_of(&self, p: &Arc<wgpu::ComputePipeline>) -> String {
        lock(&self.pipelines.labels)
            .get(&(Arc::as_ptr(p) as usize))
            .cloned()
            .unwrap_or_else(|| "?".into())
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
/// directives (which must come before any declaration), its `Params` struct, the defines,
/// then the rest.
pub(crate) fn shader_source(prelude: &str, params: &str, header: &str, source: &str) -> String {
    let (enables, rest) = split_enables(source);
    format!("{prelude}{enables}{params}{header}{rest}")
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

/// Whether shaders get wgpu's buffer bounds checks (on unless SPARSA_SHADER_BOUNDS_CHECKS=0).
fn shader_bounds_checks() -> bool {
    std::env::var("SPARSA_SHADER_BOUNDS_CHECKS").map_or(true, |v| v != "0")
}

/// Whether wgpu zeroes a kernel's workgroup memory before it runs (its default: every
/// workgroup stores zeros over all of it first, then waits at a barrier).
/// SPARSA_ZERO_WORKGROUP_MEMORY=0 turns that off (a measurement aid).
fn zero_workgroup_memory() -> bool {
    cfg!(target_arch = "wasm32")
        || std::env::var("SPARSA_ZERO_WORKGROUP_MEMORY").map_or(true, |v| v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::gpu::kernel_params! {
        struct TestParams {
            n: u32,
            _pad0: u32,
            _pad1: u32,
            _pad2: u32,
        }
    }

    /// A test's own shader, not one of the crate's (tests/backends.rs lists those by the
    /// literal names given to the constructor).
    const TEST_NAME: &str = "pipeline_n_test";
    const TEST: Shader<TestParams> = Shader::new(
        TEST_NAME,
        "@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1) fn main() { out[0] = A + B + P.n; }
",
    );

    /// A variant found by numbers is the one the define text names, and each set of
    /// values its own.
    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn pipelines_by_numbers_are_the_variants_their_text_names() {
        let gpu = Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter");
        let names = ["A", "B"];
        let a = gpu.pipeline_n(&TEST, "main", &names, &[3, 4]);
        let text = gpu.pipeline(&TEST, "main", &[("A", "3u".into()), ("B", "4u".into())]);
        assert!(Arc::ptr_eq(&a.pipeline, &text.pipeline));
        let again = gpu.pipeline_n(&TEST, "main", &names, &[3, 4]);
        assert!(Arc::ptr_eq(&a.pipeline, &again.pipeline));
        let other = gpu.pipeline_n(&TEST, "main", &names, &[4, 3]);
        assert!(!Arc::ptr_eq(&a.pipeline, &other.pipeline));
        // Each runs its own constants.
        for (k, want) in [(&a, 3 + 4 + 5), (&other, 4 + 3 + 5)] {
            let out = gpu.buffer(4, "out").unwrap();
            let mut rec = gpu.recorder();
            rec.dispatch(
                k,
                &TestParams {
                    n: 5,
                    ..Default::default()
                },
                &[&out],
                [1, 1, 1],
            );
            rec.finish().unwrap();
            let got: Vec<u32> = bytemuck::pod_collect_to_vec(&gpu.read_bytes(&out, 0, 4).unwrap());
            assert_eq!(got, [want]);
        }
    }

    #[test]
    fn prelude_enables_subgroups_only_in_the_browser() {
        let sg = wgpu::Features::SUBGROUP;
        assert_eq!(shader_prelude(sg, true), "enable subgroups;\n");
        assert_eq!(shader_prelude(sg, false), "", "naga rejects the directive");
        assert_eq!(shader_prelude(wgpu::Features::empty(), true), "");
    }
}
