//! Probe: a GEMM on cooperative matrices loaded straight from storage buffers (f16 x as hi
//! and lo halves, f16 weights), no workgroup staging. Measures what such a tile reaches on
//! the GLM-5 prefill shapes. Tensor-core devices only.
//!
//!     cargo run --release --example coop_probe -- [reps]
use sparsa::gpu::{Gpu, KernelParams, Shader};

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    m: u32,
    n: u32,
    k: u32,
    lo: u32,
}
impl KernelParams for Params {
    const WGSL: &'static str = "struct Params {\n m: u32,\n n: u32,\n k: u32,\n lo: u32,\n}\n";
}

/// The kernel with `ra` × `cb` 16 × 16 accumulators a subgroup (8 subgroups as 4 × 2).
fn source(ra: usize, cb: usize, lo: bool) -> String {
    let mut s = String::from(
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
@group(0) @binding(0) var<uniform> P: Params;\n\
@group(0) @binding(1) var<storage, read> ah: array<f16>;\n\
@group(0) @binding(2) var<storage, read> bw: array<f16>;\n\
@group(0) @binding(3) var<storage, read_write> y: array<f32>;\n\
@group(0) @binding(4) var<storage, read> al: array<f16>;\n\
var<workgroup> zs: array<f32, 256>;\n\
@compute @workgroup_size(256)\n\
fn direct(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {\n\
  zs[lid] = 0.0;\n  workgroupBarrier();\n  let g = wid.x + wid.y * nwg.x;\n  let sg = lid / 32u;\n  let ks = P.k;\n  let ns = P.n;\n",
    );
    s += &format!("  let mt = P.m / {}u;\n", 64 * ra);
    s += &format!(
        "  let m0 = (g % mt) * {}u + (sg % 4u) * {}u;\n",
        64 * ra,
        16 * ra
    );
    s += &format!(
        "  let n0 = (g / mt) * {}u + (sg / 4u) * {}u;\n",
        32 * cb,
        16 * cb
    );

    for i in 0..ra {
        for j in 0..cb {
            s += &format!("  var c{i}{j} = coopLoadT<coop_mat16x16<f32, C>>(&zs[0], 16u);\n");
            if lo {
                s += &format!("  var d{i}{j} = coopLoadT<coop_mat16x16<f32, C>>(&zs[0], 16u);\n");
            }
        }
    }
    s += "  for (var k = 0u; k < P.k; k += 16u) {\n";
    for i in 0..ra {
        s += &format!("    let ia{i} = (m0 + {}u) * ks + k;\n    let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&ah[ia{i}], ks);\n", 16 * i);
    }
    for j in 0..cb {
        s += &format!("    let ib{j} = (n0 + {}u) * ks + k;\n    let b{j} = coopLoad<coop_mat16x16<f16, B>>(&bw[ib{j}], ks);\n", 16 * j);
    }
    for i in 0..ra {
        for j in 0..cb {
            s += &format!("    c{i}{j} = coopMultiplyAdd(a{i}, b{j}, c{i}{j});\n");
        }
    }
    if lo {
        for i in 0..ra {
            s += &format!("      let l{i} = coopLoadT<coop_mat16x16<f16, A>>(&al[ia{i}], ks);\n");
        }
        for i in 0..ra {
            for j in 0..cb {
                s += &format!("      d{i}{j} = coopMultiplyAdd(l{i}, b{j}, d{i}{j});\n");
            }
        }
    }
    s += "  }\n";
    for i in 0..ra {
        for j in 0..cb {
            s += &format!(
                "  let iy{i}{j} = (m0 + {}u) * ns + n0 + {}u;\n  coopStoreT(c{i}{j}, &y[iy{i}{j}], ns);\n",
                16 * i,
                16 * j
            );
            if lo {
                s += &format!("  coopStoreT(d{i}{j}, &y[iy{i}{j}], ns);\n");
            }
        }
    }
    s += "}\n";
    s
}

fn main() -> sparsa::Result<()> {
    let reps: u32 = std::env::args()
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    if std::env::args().nth(1).as_deref() == Some("check") {
        for (ra, cb) in [(1usize, 1usize), (1, 2), (2, 4), (4, 4)] {
            let body = match std::env::var("SRC") {
                Ok(f) => std::fs::read_to_string(f).unwrap(),
                Err(_) => source(ra, cb, std::env::var("LO").is_ok()),
            };
            if std::env::var("DUMP").is_ok() {
                println!("{body}");
            }
            let (en, rest) = body.split_at(body.find("@group").unwrap());
            let src = format!("{en}{}{rest}", Params::WGSL);
            let module = naga::front::wgsl::parse_str(&src).expect("parse");
            let info = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .validate(&module)
            .expect("valid");
            let r = naga::proc::BoundsCheckPolicy::Restrict;
            let options = naga::back::spv::Options {
                lang_version: (1, 6),
                bounds_check_policies: naga::proc::BoundsCheckPolicies {
                    index: r,
                    buffer: r,
                    image_load: r,
                    binding_array: r,
                },
                ..Default::default()
            };
            let pipeline = naga::back::spv::PipelineOptions {
                shader_stage: naga::ShaderStage::Compute,
                entry_point: "direct".to_string(),
            };
            let words =
                naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline)).expect("spv");
            println!("{ra}x{cb}: {} words", words.len());
        }
        println!("ok");
        return Ok(());
    }
    let gpu = Gpu::new(None)?;
    let cal = sparsa::bench::calibrate(&gpu)?;
    println!("{}", gpu.adapter.line());
    let peak = cal.mma_flops_per_s.expect("tensor cores");
    println!("peak {:.1} TFLOP/s", peak / 1e12);
    let shapes: &[(&str, u32, u32)] = &[
        ("gate_up", 4096, 6144),
        ("down", 6144, 2048),
        ("q_b", 20480, 2048),
        ("o", 6144, 16384),
    ];
    let max_m = 2048u32;
    let a: Vec<u16> = (0..max_m as usize * 16384)
        .map(|i| half::f16::from_f32(((i * 37 % 101) as f32 - 50.0) / 50.0).to_bits())
        .collect();
    let ah = gpu.buffer_from(&a, "ah")?;
    let al = gpu.buffer_from(&a, "al")?;
    drop(a);
    let y = gpu.buffer(4 * max_m as u64 * 20480, "y")?;
    for (ra, cb, lo) in [
        (1usize, 2usize, false),
        (2, 2, false),
        (2, 4, false),
        (4, 4, false),
        (1, 2, true),
        (2, 2, true),
        (2, 4, true),
    ] {
        let src: &'static str = Box::leak(source(ra, cb, lo).into_boxed_str());
        let name: &'static str = Box::leak(format!("coop_probe_{ra}x{cb}_{lo}").into_boxed_str());
        let shader: &'static Shader<Params> = Box::leak(Box::new(Shader::new(name, src)));
        let pipe = gpu.pipeline(shader, "direct", &[]);
        for &(sname, n, k) in shapes {
            let bv: Vec<u16> = (0..n as usize * k as usize)
                .map(|i| half::f16::from_f32(((i * 13 % 61) as f32 - 30.0) / 300.0).to_bits())
                .collect();
            let b = gpu.buffer_from(&bv, "b")?;
            drop(bv);
            for m in [512u32, 2048] {
                {
                    let p = Params {
                        m,
                        n,
                        k,
                        lo: lo as u32,
                    };
                    let groups = (m / (64 * ra as u32)) * n.div_ceil(32 * cb as u32);
                    let run = |r: u32| -> sparsa::Result<()> {
                        let mut rec = gpu.recorder();
                        for _ in 0..r {
                            if lo {
                                rec.dispatch(&pipe, &p, &[&ah, &b, &y, &al], gpu.grid(groups));
                            } else {
                                rec.dispatch(&pipe, &p, &[&ah, &b, &y], gpu.grid(groups));
                            }
                        }
                        rec.finish()
                    };
                    let t = std::time::Instant::now();
                    while t.elapsed().as_secs_f64() < 0.2 {
                        run(reps)?;
                        gpu.sync()?;
                    }
                    gpu.set_profiling(true);
                    run(reps)?;
                    let ks = gpu.take_profile();
                    gpu.set_profiling(false);
                    let secs: f64 = ks.iter().map(|s| s.seconds).sum::<f64>() / reps as f64;
                    let flop = 2.0 * m as f64 * n as f64 * k as f64;
                    println!(
                        "{ra}x{cb} {sname:<8} m {m:>5} lo {lo:>5}: {:>8.1} us {:>6.1} TFLOP/s {:>5.1} %",
                        secs * 1e6,
                        flop / secs / 1e12,
                        100.0 * flop / secs / peak
                    );
                }
            }
        }
    }
    Ok(())
}
