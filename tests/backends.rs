//! Metal and DX12 are checked, not just claimed. wgpu runs a WGSL shader on Metal by
//! translating it to MSL with naga, on DX12 to HLSL, so a shader naga cannot translate for a
//! backend (or that needs a capability the backend lacks) fails there and nowhere else. This
//! test translates every shader variant the engine compiles for both, as wgpu would:
//!
//! - Variants: every (shader, entry point, defines) the pipeline cache compiles while the
//!   built-in model and every golden test model prefill and decode (greedy, greedy with the
//!   repetition penalty, sampled on the GPU and on the host, dense attention, a long
//!   synthetic context), on the test adapter and on a device opened with WebGPU's default
//!   limits (kernels that size themselves by the limits pick other variants there); plus
//!   the tensor-core GEMMs those runs would have compiled on an adapter with tensor cores
//!   (`kernels::matmul::tensor_core_variants`); plus, for a shader without defines, any entry point
//!   no workload reached (the benchmark's calibration kernels).
//! - Each variant is validated with the capabilities wgpu gives a device opened with the
//!   features the engine requests on that backend (`gpu::device_features`; mapped as wgpu
//!   maps them), then written as MSL for the oldest and newest Metal Shading Language wgpu
//!   targets that matter here (2.4: macOS 12; 4.0: macOS 26) and as HLSL for shader model
//!   5.1 (FXC, what wgpu uses on Windows without `dxcompiler.dll`) and 6.6 (DXC).
//! - A variant that cannot run on a backend is left out only through [`SKIPS`], each with
//!   its reason and a check that the engine never selects it there.
//! - Completeness: every `@compute` entry point in `shaders/` and every shader the crate
//!   declares (`Shader::new` in `src/`) must have been translated, so a new kernel that no
//!   workload reaches fails here instead of going unchecked.
//!
//! What it cannot do here: run the Metal or DXC/FXC compilers on the output (neither exists
//! on Linux). Translation errors and missing capabilities are what it catches; to compile the
//! output on a Mac or Windows machine, `SPARSA_BACKENDS_DUMP=DIR` writes every translation
//! to DIR. docs/PLATFORMS.md says which paths run where.
//!
//! `SPARSA_BACKENDS_LIST=FILE` writes the variants the workloads compiled to FILE, one a line,
//! sorted: a change meant only to make the workloads cheaper must leave it as it was.

use naga::back::{hlsl, msl};
use naga::valid::{Capabilities, ModuleInfo, ValidationFlags, Validator};
use sparsa::cache::{CacheFormat, KeyFormat, LatentFormat};
use sparsa::generate::generate;
use sparsa::gpu::{
    device_features, shader_prelude, tensor_cores_possible, Gpu, ShaderCode, ShaderVariant,
};
use sparsa::kernels::attention::{self, MlaDims, MlaGemmUse, MlaPlan, MlaQueries};
use sparsa::kernels::cache::{CacheRows, Segment};
use sparsa::kernels::matmul::{self, matmul_experts, Routed};
use sparsa::kernels::topk::Selection;
use sparsa::kernels::{indexer, with_cpu_kernels, with_mla_cpu_sg, View};
use sparsa::model::{Model, ModelSource, Session};
use sparsa::sampling::{Sampler, SamplingParams};
use sparsa::weights::{DType, GpuWeight, QFormat, WFormat};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// A variant the engine never compiles on a backend, and why.
struct Skip {
    shader: &'static str,
    backend: wgpu::Backend,
    why: &'static str,
}

const SKIPS: &[Skip] = &[
    Skip {
        shader: "matmul_coop",
        backend: wgpu::Backend::Metal,
        why: "the tensor-core GEMM tile uses 16×16×16 cooperative matrices, and Metal's \
              simdgroup matrices are 8×8 (naga would write simdgroup_half16x16, which Metal \
              does not have); its module is also SPIR-V passed through to the driver. Metal \
              runs the f32 tile (matmul::gemm)",
    },
    Skip {
        shader: "matmul_coop",
        backend: wgpu::Backend::Dx12,
        why: "naga's HLSL writer has no cooperative matrices and wgpu 30 offers none on DX12; \
              the module is also SPIR-V passed through to the driver. DX12 runs the f32 tile \
              (matmul::gemm)",
    },
    Skip {
        shader: "matmul_coop_x1",
        backend: wgpu::Backend::Metal,
        why: "matmul_coop reading x element by element (x rows off 4-float boundaries): \
              skipped for matmul_coop's reasons",
    },
    Skip {
        shader: "matmul_coop_x1",
        backend: wgpu::Backend::Dx12,
        why: "matmul_coop reading x element by element (x rows off 4-float boundaries): \
              skipped for matmul_coop's reasons",
    },
    Skip {
        shader: "matmul_coop_xh",
        backend: wgpu::Backend::Metal,
        why: "matmul_coop loading x's A fragments from an f16 copy (SPARSA_COOP_A_GLOBAL): \
              skipped for matmul_coop's reasons",
    },
    Skip {
        shader: "matmul_coop_xh",
        backend: wgpu::Backend::Dx12,
        why: "matmul_coop loading x's A fragments from an f16 copy (SPARSA_COOP_A_GLOBAL): \
              skipped for matmul_coop's reasons",
    },
    Skip {
        shader: "calibrate_coop",
        backend: wgpu::Backend::Metal,
        why: "the tensor-core peak probe of `bench --calibrate` runs only where the GEMM tile \
              runs on tensor cores (16×16×16 cooperative matrices), which Metal does not",
    },
    Skip {
        shader: "calibrate_coop",
        backend: wgpu::Backend::Dx12,
        why: "the tensor-core peak probe of `bench --calibrate` runs only where the GEMM tile \
              runs on tensor cores, which DX12 under wgpu 30 does not",
    },
];

/// Whether the engine could compile `shader` on `backend` (the gate each [`SKIPS`] entry must
/// be closed by).
fn engine_may_select(shader: &str, backend: wgpu::Backend) -> bool {
    match shader {
        // The only way to matmul_coop: a GEMM on a device with tensor cores, which only
        // Vulkan adapters can have.
        // The tensor-core probe of `bench --calibrate` runs where the tile does.
        "matmul_coop" | "matmul_coop_x1" | "matmul_coop_xh" | "calibrate_coop" => {
            let tensor_cores = tensor_cores_possible(backend);
            let features = device_features(wgpu::Features::all(), tensor_cores);
            tensor_cores || features.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        }
        _ => true,
    }
}

fn skip_of(shader: &str, backend: wgpu::Backend) -> Option<&'static Skip> {
    SKIPS
        .iter()
        .find(|s| s.shader == shader && s.backend == backend)
}

/// The adapter's GPU (lavapipe in CI); fails, never skips, without one.
fn open(limits: sparsa::gpu::LimitsRequest) -> Arc<Gpu> {
    let filter = std::env::var("SPARSA_ADAPTER").ok();
    let gpu = Gpu::open_blocking(filter.as_deref(), limits).expect("a GPU adapter");
    Arc::new(gpu)
}

fn data(family: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(family)
}

/// `n` token ids below `vocab`, deterministic.
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

fn run(s: &mut Session, prompt: &[u32], max_tokens: usize, params: SamplingParams) {
    s.reset();
    let mut sampler = Sampler::new(params);
    generate(s, prompt, max_tokens, &mut sampler, &[], |_| true).expect("generation runs");
}

/// Prefill `prompt_len` tokens and decode a few greedily (the GPU's argmax).
fn greedy(model: &Model, prompt_len: usize) {
    let prompt = tokens(prompt_len, model.config.vocab_size, prompt_len as u64);
    let mut s = model.session(prompt_len + 4).expect("a session");
    run(&mut s, &prompt, 3, SamplingParams::default());
}

/// Sampling with a temperature, top-k, top-p and a penalty.
fn sampled_params() -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.9,
        seed: 7,
        repeat_penalty: 1.1,
        ..Default::default()
    }
}

/// The argmax of a row longer than one pass takes (real models' vocabularies; the test
/// models' are short), alone and as a speculative round's picks before its acceptance.
fn exercise_argmax(gpu: &Gpu) {
    use sparsa::kernels::sample::{argmax, SampleScratch, TokenSlot};
    use sparsa::kernels::spec;
    let n = 150_000u32;
    let x = gpu
        .buffer_from(&vec![0.5f32; 2 * n as usize], "rows")
        .unwrap();
    let ids = gpu.buffer_from(&[0u32; 8], "ids").unwrap();
    let scratch = SampleScratch::new(gpu, n).unwrap();
    let mut rec = gpu.recorder();
    let slot = TokenSlot {
        ids: &ids,
        index: 1,
    };
    argmax(&mut rec, View::new(&x, 0, n), n, slot, &scratch);
    let state = gpu
        .buffer_from(&vec![0u32; spec::state_words(1, 1) as usize], "state")
        .unwrap();
    let round = spec::RoundIds {
        ids: &ids,
        k: 1,
        picks: 2,
        mtp: 4,
    };
    spec::pick_and_accept(
        &mut rec,
        &state,
        (View::new(&x, 0, n), n),
        round,
        0,
        &scratch,
    );
    rec.finish().unwrap();
}

/// Prefill and decode `model` every other way the engine can: with the repetition penalty,
/// sampled on the GPU (top-k) and on the host (top-k 0), every row's logits, dense
/// attention (decode steps over more positions than one tile of sparse MLA: split and
/// combined), and a decode step after a synthetic context long enough for the
/// multi-workgroup top-k. (Which kernels these pick does not depend on the model's sizes
/// beyond what [`greedy`] sees, so the built-in model runs them for all.) A `prompt_len`
/// above the model's top-k makes the indexer's top-k select.
fn every_way(model: &Model, prompt_len: usize) {
    let vocab = model.config.vocab_size;
    let prompt = tokens(prompt_len, vocab, prompt_len as u64);
    let mut s = model.session(prompt_len + 4).expect("a session");
    let penalized = SamplingParams {
        repeat_penalty: 1.3,
        ..Default::default()
    };
    run(&mut s, &prompt, 3, penalized);
    // Sampling changes only the decode steps' kernels, so these prefill one token.
    let sampled = sampled_params();
    run(&mut s, &prompt[..1], 3, sampled.clone());
    let host = SamplingParams {
        top_k: 0,
        ..sampled
    };
    run(&mut s, &prompt[..1], 3, host);
    s.reset();
    s.forward(&prompt, true)
        .expect("prefill with every row's logits");
    let mut dense = Session::open(
        model,
        prompt_len + 4,
        true,
        model.default_cache(prompt_len + 4),
    )
    .expect("a session");
    run(&mut dense, &prompt, 3, SamplingParams::default());

    // Speculative rounds with the model's MTP layer (the built-in model has one; the MTP
    // layer's input takes its own embedding kernel): greedy rounds queued on the GPU and
    // sampled ones on the host.
    let mut spec = model.session(prompt_len + 16).expect("a session");
    if spec.set_drafts(2).is_ok() {
        run(&mut spec, &prompt, 8, SamplingParams::default());
        run(&mut spec, &prompt, 8, sampled_params());
    }

    // Past the first cache segment, in every latent and key format (the int8 keys rotate
    // the indexer's queries), each latent format with one key format: no kernel's variant
    // depends on both, so the nine pairs compile no variant these three do not.
    let context =
        (sparsa::kernels::topk::WIDE_MIN_KEYS as usize + 8).max(sparsa::cache::FIRST_SEGMENT + 8);
    let (latents, keys) = (LatentFormat::ALL, KeyFormat::ALL);
    for i in 0..latents.len().max(keys.len()) {
        let f = CacheFormat {
            latent: latents[i % latents.len()],
            keys: keys[i % keys.len()],
        };
        let mut long = model.session_in(context + 4, f).expect("a long session");
        long.fill_synthetic(context, 1).expect("synthetic fill");
        let mut sampler = Sampler::new(SamplingParams::default());
        generate(&mut long, &prompt[..1], 2, &mut sampler, &[], |_| true).expect("long decode");
    }
}

/// Every GEMV and GEMM `matmul` and `matmul_experts` choose for weights in every stored
/// format at real models' alignment (whole 16-byte rows, whole 32-element blocks), which the
/// golden test models' odd sizes do not reach: the 16-byte and integer-dot GEMVs of decode,
/// and the 128-row GEMM tile of long prefills: the long rows, and each of `row_counts` rows
/// of x over 4352 outputs (only the long rows' kernels depend on the device's limits).
fn exercise_matmul(gpu: &Gpu, row_counts: &[u32]) {
    let formats = [
        WFormat::Float(DType::F32),
        WFormat::Float(DType::BF16),
        WFormat::Float(DType::F16),
        WFormat::Quant(QFormat::Fp8),
        WFormat::Quant(QFormat::Q8 { block: 32 }),
        WFormat::Quant(QFormat::Q4 { block: 32 }),
        WFormat::Quant(QFormat::Q8 { block: 128 }),
        WFormat::Quant(QFormat::Q4 { block: 64 }),
    ];
    // 4352 outputs (300 rows make 3 × 34 tiles of 128: enough for the large tile), and 4352
    // columns for the long rows.
    let (experts, wide, long) = (4u32, 4352usize, 4352usize);
    let max_rows = row_counts.iter().copied().fold(1, u32::max);
    let values: Vec<f32> = (0..wide * 128)
        .map(|i| ((i % 61) as f32 - 30.0) / 64.0)
        .collect();
    let x = vec![0.5f32; (max_rows as usize * 128).max(long)];
    let x = gpu.buffer_from(&x, "x").unwrap();
    let y = gpu.buffer(4 * max_rows as u64 * wide as u64, "y").unwrap();
    let ids: Vec<u32> = (0..2 * max_rows).map(|i| i % experts).collect();
    let ids = gpu.buffer_from(&ids, "expert ids").unwrap();
    let routed = Routed {
        ids: &ids,
        n_experts: experts,
        topk: 2,
    };
    let weight = |format, n: usize, k: usize| {
        let v = &values[..n * k];
        match format {
            WFormat::Float(d) => GpuWeight::from_f32(gpu, v, n, k, d, None, "w"),
            WFormat::Quant(q) => GpuWeight::quantize_f32(gpu, v, n, k, q, None, "w"),
        }
        .unwrap()
    };
    let xq = gpu
        .buffer(matmul::xq_bytes(long as u32, matmul::GEMV_MAX_ROWS), "xq")
        .unwrap();
    // y = x · wᵀ for `rows` rows, and the routed-expert product of `rows` tokens; for a GEMV's
    // rows also with x quantized beforehand (decode's and a verification's quantize_x,
    // matmul_xq and its add).
    let both = |w: &GpuWeight, rows: u32| {
        let (k, n) = (w.cols as u32, w.rows as u32);
        let mut rec = gpu.recorder();
        let (xv, yv) = (View::rows(&x, k), View::rows(&y, n));
        matmul::matmul(&mut rec, xv, w, yv, rows);
        if rows <= 64 {
            let slot_y = View::rows(&y, n / experts);
            matmul_experts(&mut rec, xv, false, w, &routed, slot_y, rows);
        }
        let order = matmul::takes_xq(xv, w).filter(|_| rows <= matmul::GEMV_MAX_ROWS);
        if let Some(order) = order {
            let q = matmul::quantize_x(&mut rec, xv, rows, k, order, &xq);
            matmul::matmul_xq(&mut rec, &q, xv, w, yv);
            matmul::matmul_xq_add(&mut rec, &q, xv, w, yv);
            let slot_y = View::rows(&y, n / experts);
            matmul::matmul_experts_xq(&mut rec, &q, xv, false, w, &routed, slot_y, rows);
        }
        rec.finish().unwrap();
    };
    for format in formats {
        if !row_counts.is_empty() {
            let w = weight(format, wide, 128);
            for &rows in row_counts {
                both(&w, rows);
            }
        }
        // Long rows (GLM-5's dense down projection has 12288 columns): the integer-dot
        // GEMV's x blocks outgrow small workgroup memories, and q4 takes gemv4q instead.
        both(&weight(format, 64, long), 1);
    }
}

/// The rows of x [`exercise_matmul`] takes the GPUs' kernels over: a GEMV pass, GEMV passes,
/// the 64-row tile (and the routed GEMM), and the 128-row tile.
const GPU_ROWS: &[u32] = &[1, 3, 8, 20, 64, 300];

/// [`GPU_ROWS`] for the CPU adapters' kernels, less the 300 rows: they run GEMV passes at any
/// rows, which 20 and 64 rows already take.
const CPU_ROWS: &[u32] = &[1, 3, 8, 20, 64];

/// Sparse MLA's prefill GEMMs (`sparse_mla_gemm`), which a model runs only on tensor cores:
/// 20 query rows of 4 heads over 100 cached positions (up to 100 selected: the values
/// product in two splits, added by `mla_sum`), in f32 and bf16 caches, two segments, rows in
/// blocks of 8.
fn exercise_mla_gemms(gpu: &Gpu) {
    let (rows, heads, kv, dr, keys, topk) = (20u32, 4u32, 64u32, 8u32, 100u32, 100u32);
    let d = MlaDims {
        heads,
        dn: 8,
        dr,
        dv: 8,
        kv_lora: kv,
        scale: 0.1,
    };
    let filled = |n: u32, what| {
        let v: Vec<f32> = (0..n).map(|i| ((i % 13) as f32 - 6.0) / 8.0).collect();
        gpu.buffer_from(&v, what).unwrap()
    };
    let q_abs = filled(rows * heads * kv, "q_abs");
    let q = filled(rows * heads * (8 + dr), "q");
    let o = gpu.buffer(4 * (rows * heads * kv) as u64, "o_lat").unwrap();
    let idx: Vec<u32> = (0..rows * topk).map(|i| (i * 7) % keys).collect();
    let cnt: Vec<u32> = (0..rows).map(|t| (t * 5) % topk).collect();
    let (idx, cnt) = (
        gpu.buffer_from(&idx, "idx").unwrap(),
        gpu.buffer_from(&cnt, "cnt").unwrap(),
    );
    let sel = Selection {
        idx: &idx,
        cnt: &cnt,
        k: topk,
    };
    for (format, words) in [
        (LatentFormat::F32, kv + dr),
        (LatentFormat::Bf16, (kv + dr) / 2),
    ] {
        let segs = [(0, 64), (64, keys - 64)].map(|(lo, len)| Segment {
            buf: filled(len * words, "cache"),
            lo,
            len,
        });
        let cache = CacheRows {
            segs: &segs,
            format,
            row_words: words,
        };
        let queries = MlaQueries {
            absorbed: View::rows(&q_abs, heads * kv),
            q: View::rows(&q, heads * (8 + dr)),
            rows,
            rope: None,
        };
        let plan = MlaPlan::for_rows(rows).with_gemm(MlaGemmUse::Always, 8);
        let mut rec = gpu.recorder();
        let o_lat = View::rows(&o, heads * kv);
        attention::sparse_mla(&mut rec, &queries, &cache, &sel, topk, o_lat, &d, plan);
        rec.finish().unwrap();
    }
}

/// Runs `f`, then prints how long it took.
fn timed(what: &str, f: impl FnOnce()) {
    let t = Instant::now();
    f();
    eprintln!("  {what}: {:.1} s", t.elapsed().as_secs_f64());
}

/// Every variant the workloads make the pipeline cache compile. The groups of workloads run
/// side by side, a thread and a device each: which kernels a recording takes is decided per
/// thread ([`with_cpu_kernels`]), a device compiles one pipeline at a time, and CPU adapters
/// compile a pipeline on one core. The GPUs' kernels take two threads (the built-in model's
/// [`every_way`] alone takes about as long as another group), so that the threads end at
/// about the same time.
fn recorded_variants() -> BTreeSet<ShaderVariant> {
    use sparsa::gpu::LimitsRequest;
    let builtin = ModelSource::builtin().expect("the built-in model");
    let [gpu, builtin_gpu, cpu] = [(); 3].map(|_| open(LimitsRequest::Adapter));
    // WebGPU's default limits (16 KiB of workgroup memory, 256 invocations): the indexer,
    // sparse MLA and the integer-dot GEMV size themselves by the limits.
    let small = open(LimitsRequest::WebGpuDefault);
    eprintln!(
        "workloads on {}, {} KiB of workgroup memory:",
        gpu.adapter.line(),
        gpu.limits.max_compute_workgroup_storage_size / 1024
    );
    std::thread::scope(|s| {
        let jobs = [
            s.spawn(|| {
                // The GPUs' kernels, here and in the next thread (lavapipe, a CPU adapter,
                // would take the CPU adapters' variants).
                timed("the GPUs' kernels: products, golden test models", || {
                    with_cpu_kernels(false, || {
                        exercise_matmul(&gpu, GPU_ROWS);
                        exercise_mla_gemms(&gpu);
                        exercise_argmax(&gpu);
                        for family in [
                            "glm5",
                            "glm52",
                            "glm52-fp8",
                            "glm52-q4",
                            "dsv32",
                            "dsv32-fp8",
                            "dsv32-q8",
                        ] {
                            let model = Model::load(&data(family), gpu.clone(), &mut |_, _| {})
                                .expect("loads");
                            greedy(&model, 40);
                            if family == "glm5" {
                                // The indexer's chunk scores over several rows a workgroup
                                // (off by default: SPARSA_INDEXER_ROWS).
                                indexer::with_rows_kernel(true, || greedy(&model, 40));
                            }
                        }
                    })
                })
            }),
            s.spawn(|| {
                timed("the GPUs' kernels: the built-in model", || {
                    with_cpu_kernels(false, || {
                        let bard =
                            Model::from_source(&builtin, builtin_gpu.clone(), &mut |_, _| {})
                                .expect("loads");
                        every_way(&bard, 100);
                    })
                })
            }),
            s.spawn(|| {
                // The CPU adapters' variants (DX12's WARP is one: they translate for HLSL
                // too).
                timed("the CPU adapters' kernels", || {
                    with_cpu_kernels(true, || {
                        exercise_matmul(&cpu, CPU_ROWS);
                        exercise_argmax(&cpu);
                        let bard = Model::from_source(&builtin, cpu.clone(), &mut |_, _| {})
                            .expect("loads");
                        every_way(&bard, 100);
                        for family in ["glm52-fp8", "glm52-q4", "dsv32"] {
                            let model = Model::load(&data(family), cpu.clone(), &mut |_, _| {})
                                .expect("loads");
                            greedy(&model, 40);
                            if family == "dsv32" {
                                // The sparse MLA of CPU adapters whose subgroups cannot
                                // share the cache rows.
                                with_mla_cpu_sg(false, || greedy(&model, 40));
                            }
                        }
                    })
                })
            }),
            s.spawn(|| {
                // Both kinds of kernels: a browser's fallback adapter is a CPU adapter.
                timed("WebGPU's default limits", || {
                    for cpu_kernels in [false, true] {
                        with_cpu_kernels(cpu_kernels, || {
                            exercise_matmul(&small, &[]);
                            for model in [
                                Model::from_source(&builtin, small.clone(), &mut |_, _| {}),
                                Model::load(&data("glm5"), small.clone(), &mut |_, _| {}),
                            ] {
                                let model = model.expect("loads");
                                greedy(&model, 100);
                                if !cpu_kernels {
                                    // scores_rows in 16 KiB of workgroup memory.
                                    indexer::with_rows_kernel(true, || greedy(&model, 100));
                                }
                            }
                        });
                    }
                })
            }),
        ];
        for j in jobs {
            j.join().expect("a workload thread panicked");
        }
    });
    let all: BTreeSet<ShaderVariant> = [gpu, builtin_gpu, cpu, small]
        .iter()
        .flat_map(|device| device.shader_variants())
        .collect();
    if let Some(path) = std::env::var_os("SPARSA_BACKENDS_LIST") {
        let mut list: Vec<String> = all.iter().map(|v| describe(v) + "\n").collect();
        list.sort();
        std::fs::write(path, list.concat()).expect("SPARSA_BACKENDS_LIST: a writable file");
    }
    all
}

/// `@compute` entry points of a WGSL source, by name.
fn entry_points(source: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = source;
    while let Some(at) = rest.find("@compute") {
        rest = &rest[at..];
        let f = rest.find("fn ").expect("an entry point after @compute");
        let name: String = rest[f + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        out.insert(name);
        rest = &rest[f..];
    }
    out
}

/// Every `Shader::new("name"` in `src/`, so a shader missing from the registries fails.
fn declared_shaders() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, _) in text.match_indices("Shader::new(") {
                    let rest = text[i + "Shader::new(".len()..].trim_start();
                    if let Some(r) = rest.strip_prefix('"') {
                        out.insert(r[..r.find('"').unwrap()].to_string());
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut out);
    out
}

/// One writer target: a backend's language at a version.
#[derive(Clone, Copy, Debug)]
enum Target {
    Msl(u8, u8),
    Hlsl(hlsl::ShaderModel),
}

impl Target {
    fn backend(self) -> wgpu::Backend {
        match self {
            Target::Msl(..) => wgpu::Backend::Metal,
            Target::Hlsl(_) => wgpu::Backend::Dx12,
        }
    }

    /// File name ending of a translation written to `SPARSA_BACKENDS_DUMP`.
    fn file_suffix(self) -> String {
        match self {
            Target::Msl(a, b) => format!("msl{a}{b}.metal"),
            Target::Hlsl(sm) => format!("sm{}.hlsl", sm.to_str().replace('_', "")),
        }
    }

    fn name(self) -> String {
        match self {
            Target::Msl(a, b) => format!("MSL {a}.{b}"),
            Target::Hlsl(sm) => format!("HLSL SM {}", sm.to_str().replace('_', ".")),
        }
    }
}

const TARGETS: [Target; 4] = [
    Target::Msl(2, 4),
    Target::Msl(4, 0),
    Target::Hlsl(hlsl::ShaderModel::V5_1),
    Target::Hlsl(hlsl::ShaderModel::V6_6),
];

/// The naga capabilities of a device opened on `backend` with the features the engine
/// requests there, from an adapter that offers every feature.
fn capabilities(backend: wgpu::Backend) -> Capabilities {
    let features = device_features(wgpu::Features::all(), tensor_cores_possible(backend));
    wgpu_naga_bridge::features_to_naga_capabilities(features, wgpu::DownlevelFlags::all())
}

fn supported(backend: wgpu::Backend) -> Capabilities {
    match backend {
        wgpu::Backend::Metal => msl::supported_capabilities(),
        wgpu::Backend::Dx12 => hlsl::supported_capabilities(),
        b => unreachable!("no writer for {b:?}"),
    }
}

/// MSL resource slots for `entry` as wgpu's Metal backend assigns them for one bind group:
/// buffer slot = binding, and a sizes buffer after them (for `arrayLength`).
fn msl_resources(
    module: &naga::Module,
    info: &ModuleInfo,
    entry: usize,
) -> msl::EntryPointResources {
    let used = info.get_entry_point(entry);
    let mut resources = msl::BindingMap::new();
    let mut next = 0u8;
    for (h, var) in module.global_variables.iter() {
        let Some(binding) = var.binding else { continue };
        if used[h].is_empty() {
            continue;
        }
        let slot = u8::try_from(binding.binding).expect("a binding below 256");
        let mutable = matches!(var.space, naga::AddressSpace::Storage { access }
            if access.contains(naga::StorageAccess::STORE));
        resources.insert(
            binding,
            msl::BindTarget {
                buffer: Some(slot),
                mutable,
                ..Default::default()
            },
        );
        next = next.max(slot + 1);
    }
    msl::EntryPointResources {
        resources,
        immediates_buffer: None,
        sizes_buffer: Some(next),
    }
}

/// Writes `entry` of `module` for `target` with the runtime checks the engine asks wgpu for
/// (buffer bounds checks on, no loop bounding, no integer-division checks).
fn write(
    module: &naga::Module,
    info: &ModuleInfo,
    entry: &str,
    target: Target,
) -> Result<String, String> {
    let ep = module
        .entry_points
        .iter()
        .position(|e| e.name == entry)
        .ok_or_else(|| format!("no entry point {entry}"))?;
    let stage = Some((naga::ShaderStage::Compute, entry.to_string()));
    match target {
        Target::Msl(major, minor) => {
            let restrict = naga::proc::BoundsCheckPolicy::Restrict;
            let options = msl::Options {
                lang_version: (major, minor),
                per_entry_point_map: BTreeMap::from([(
                    entry.to_string(),
                    msl_resources(module, info, ep),
                )]),
                fake_missing_bindings: false,
                bounds_check_policies: naga::proc::BoundsCheckPolicies {
                    index: restrict,
                    buffer: restrict,
                    image_load: restrict,
                    binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
                },
                zero_initialize_workgroup_memory: true,
                force_loop_bounding: false,
                emit_int_div_checks: false,
                ..Default::default()
            };
            let pipeline = msl::PipelineOptions {
                entry_point: stage,
                ..Default::default()
            };
            msl::write_string(module, info, &options, &pipeline)
                .map(|(text, _)| text)
                .map_err(|e| e.to_string())
        }
        Target::Hlsl(shader_model) => {
            let options = hlsl::Options {
                shader_model,
                zero_initialize_workgroup_memory: true,
                restrict_indexing: true,
                force_loop_bounding: false,
                ..Default::default()
            };
            let pipeline = hlsl::PipelineOptions { entry_point: stage };
            let mut text = String::new();
            let mut w = hlsl::Writer::new(&mut text, &options, &pipeline);
            w.write(module, info, None).map_err(|e| e.to_string())?;
            Ok(text)
        }
    }
}

fn describe(v: &ShaderVariant) -> String {
    let defines: Vec<&str> = v
        .defines
        .lines()
        .map(|l| l.trim_start_matches("const ").trim_end_matches(';'))
        .collect();
    format!("{}::{} [{}]", v.shader.name, v.entry, defines.join(", "))
}

/// The variants to translate: those the workloads compiled, the tensor-core GEMMs a device
/// with tensor cores compiles instead of theirs, and the unreached entry points of shaders
/// without defines. Also returns the unreached entry points of shaders with defines.
fn variants() -> (BTreeSet<ShaderVariant>, Vec<String>) {
    let mut variants = recorded_variants();
    let tensor_core: Vec<ShaderVariant> = variants
        .iter()
        .filter(|v| v.shader.name.starts_with("matmul"))
        .flat_map(sparsa::kernels::matmul::tensor_core_variants)
        .collect();
    assert!(
        !tensor_core.is_empty(),
        "no GEMM ran, so no tensor-core variant"
    );
    variants.extend(tensor_core);
    let seen: BTreeSet<&str> = variants.iter().map(|v| v.entry).collect();
    let mut extra = Vec::new();
    let mut unreached = Vec::new();
    for code in registry() {
        for entry in entry_points(code.source) {
            if seen.contains(entry.as_str()) {
                continue;
            }
            let v = ShaderVariant {
                shader: code,
                entry: Box::leak(entry.into_boxed_str()),
                defines: String::new(),
            };
            if naga::front::wgsl::parse_str(&v.source("")).is_ok() {
                extra.push(v);
            } else {
                unreached.push(format!("{}::{}", code.name, v.entry));
            }
        }
    }
    variants.extend(extra);
    (variants, unreached)
}

/// Every shader the crate declares.
fn registry() -> Vec<ShaderCode> {
    let mut all = sparsa::kernels::shaders();
    all.extend(sparsa::bench::SHADERS);
    all
}

/// naga's validation of one module under each backend's capabilities (computed once per
/// distinct set).
struct Validations<'a> {
    module: &'a naga::Module,
    src: &'a str,
    done: BTreeMap<u64, Result<ModuleInfo, String>>,
}

impl Validations<'_> {
    fn on(&mut self, backend: wgpu::Backend) -> &Result<ModuleInfo, String> {
        let caps = capabilities(backend);
        let (module, src) = (self.module, self.src);
        self.done.entry(caps.bits()).or_insert_with(|| {
            Validator::new(ValidationFlags::all(), caps)
                .validate(module)
                .map_err(|e| e.emit_to_string(src))
        })
    }
}

#[test]
fn every_shader_variant_translates_for_metal_and_dx12() {
    let names: BTreeSet<String> = registry().iter().map(|s| s.name.to_string()).collect();
    assert_eq!(
        names,
        declared_shaders(),
        "kernels::shaders() and bench::SHADERS must list every Shader::new in src/"
    );
    let backends = [wgpu::Backend::Metal, wgpu::Backend::Dx12];
    for backend in backends {
        let (caps, supported) = (capabilities(backend), supported(backend));
        assert!(
            supported.contains(caps),
            "{backend:?}: the engine requests features whose capabilities naga's writer lacks: {:?}",
            caps - supported
        );
    }
    for skip in SKIPS {
        assert!(
            !engine_may_select(skip.shader, skip.backend),
            "{} is skipped on {:?} ({}), but the engine may select it there",
            skip.shader,
            skip.backend,
            skip.why
        );
    }

    let t0 = Instant::now();
    let (variants, unreached) = variants();
    let ran = t0.elapsed();
    let dump = std::env::var_os("SPARSA_BACKENDS_DUMP").map(std::path::PathBuf::from);
    if let Some(d) = &dump {
        std::fs::create_dir_all(d).expect("SPARSA_BACKENDS_DUMP: a directory");
    }
    let mut failures = Vec::new();
    let mut per_target: BTreeMap<String, usize> = BTreeMap::new();
    let mut shaders_on: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    let mut vulkan_only = 0;
    for (index, v) in variants.iter().enumerate() {
        let src = v.source(&shader_prelude(wgpu::Features::all(), false));
        let module = match naga::front::wgsl::parse_str(&src) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{}: WGSL: {}", describe(v), e.emit_to_string(&src)));
                continue;
            }
        };
        let mut valid = Validations {
            module: &module,
            src: &src,
            done: BTreeMap::new(),
        };
        for backend in backends {
            let targets = TARGETS.iter().filter(|t| t.backend() == backend);
            if skip_of(v.shader.name, backend).is_some() {
                // wgpu would refuse it there too: it needs features the device lacks.
                assert!(
                    valid.on(backend).is_err(),
                    "{}: skipped on {backend:?}, yet valid with that backend's device features",
                    describe(v)
                );
                for t in targets {
                    *skipped.entry(t.name()).or_default() += 1;
                }
                continue;
            }
            let info = match valid.on(backend) {
                Ok(info) => info,
                Err(e) => {
                    failures.push(format!("{} on {backend:?}: validation: {e}", describe(v)));
                    continue;
                }
            };
            for &target in targets {
                match write(&module, info, v.entry, target) {
                    Ok(text) if !text.is_empty() => {
                        *per_target.entry(target.name()).or_default() += 1;
                        shaders_on
                            .entry(target.name())
                            .or_default()
                            .insert(v.shader.name);
                        if let Some(d) = &dump {
                            let name = format!(
                                "{index:03}.{}.{}.{}",
                                v.shader.name,
                                v.entry,
                                target.file_suffix()
                            );
                            let text = format!("// {}\n{text}", describe(v));
                            std::fs::write(d.join(name), text).unwrap();
                        }
                    }
                    Ok(_) => failures.push(format!("{} as {}: empty", describe(v), target.name())),
                    Err(e) => failures.push(format!("{} as {}: {e}", describe(v), target.name())),
                }
            }
        }
        if backends
            .iter()
            .any(|b| skip_of(v.shader.name, *b).is_some())
        {
            // Left out elsewhere, so it must at least be valid where it runs.
            match valid.on(wgpu::Backend::Vulkan) {
                Ok(_) => vulkan_only += 1,
                Err(e) => failures.push(format!("{} on Vulkan: validation: {e}", describe(v))),
            }
        }
    }

    eprintln!(
        "{} shader variants ({} shaders; the workloads ran in {:.1} s), translated in {:.1} s:",
        variants.len(),
        variants
            .iter()
            .map(|v| v.shader.name)
            .collect::<BTreeSet<_>>()
            .len(),
        ran.as_secs_f64(),
        (t0.elapsed() - ran).as_secs_f64()
    );
    for t in TARGETS {
        let n = per_target.get(&t.name()).copied().unwrap_or(0);
        let s = skipped.get(&t.name()).copied().unwrap_or(0);
        eprintln!("  {:>12}: {n} translated, {s} left out (SKIPS)", t.name());
    }
    eprintln!("  Vulkan only, validated with Vulkan's device features: {vulkan_only}");
    assert!(
        failures.is_empty(),
        "{} variants fail:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(
        unreached.is_empty(),
        "entry points no workload compiled (they need defines: add a workload that runs them): {unreached:?}"
    );

    // Nothing went unchecked: every entry point in shaders/, every shader on every target
    // (bar SKIPS), and every variant on every target.
    let mut all_entries = BTreeSet::new();
    for f in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders")).unwrap() {
        all_entries.extend(entry_points(
            &std::fs::read_to_string(f.unwrap().path()).unwrap(),
        ));
    }
    let done: BTreeSet<String> = variants.iter().map(|v| v.entry.to_string()).collect();
    let missing: Vec<&String> = all_entries.difference(&done).collect();
    assert!(
        missing.is_empty(),
        "entry points never translated: {missing:?}"
    );
    for t in TARGETS {
        let expected: BTreeSet<&str> = registry()
            .iter()
            .map(|s| s.name)
            .filter(|s| skip_of(s, t.backend()).is_none())
            .collect();
        assert_eq!(
            shaders_on.get(&t.name()),
            Some(&expected),
            "{}: shaders translated",
            t.name()
        );
        let n = per_target[&t.name()] + skipped.get(&t.name()).copied().unwrap_or(0);
        assert_eq!(
            n,
            variants.len(),
            "{}: variants translated or skipped",
            t.name()
        );
    }
}
