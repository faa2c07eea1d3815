//! `sparsa synth`: the configs are the releases' (dims, IndexShare pattern, router groups,
//! parameter totals), the same seed writes the same bytes whatever the thread count, and a
//! model written by the same code with shrunken dims loads in every format and gives finite,
//! non-degenerate logits on the GPU. (A real-dims model is gigabytes: too big for CI.)
//! `SPARSA_SYNTH_KEEP=DIR` keeps the shrunk bf16 models in DIR/<like> for
//! tests/reference/check_synth.py (transformers' logits for the same directory).

use serde_json::{json, Value};
use sparsa::config::{Config, Family, IndexerKind, RopeKind};
use sparsa::gpu::Gpu;
use sparsa::model::{Model, ModelSource};
use sparsa::synth::{plan, release_config, synth_dir, Like, Options};
use sparsa::weights::QFormat;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparsa-synth-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn parse(v: &Value) -> Config {
    Config::from_json(&v.to_string(), "config.json").unwrap()
}

#[test]
fn configs_are_the_releases() {
    // (like, hidden, layers, heads, q_lora, nope, v, inter, index heads, groups, theta, vocab, eps, max pos)
    type Row = (
        Like,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        f64,
        usize,
        f32,
        usize,
    );
    let rows: [Row; 3] = [
        (
            Like::Glm5,
            6144,
            64,
            2048,
            192,
            256,
            12288,
            32,
            1,
            1e6,
            154880,
            1e-5,
            202752,
        ),
        (
            Like::Glm52,
            6144,
            64,
            2048,
            192,
            256,
            12288,
            32,
            1,
            8e6,
            154880,
            1e-5,
            1048576,
        ),
        (
            Like::DeepseekV32,
            7168,
            128,
            1536,
            128,
            128,
            18432,
            64,
            8,
            1e4,
            129280,
            1e-6,
            163840,
        ),
    ];
    for (like, h, heads, ql, dn, dv, inter, ih, groups, theta, vocab, eps, maxpos) in rows {
        let c = parse(&release_config(like, 5, None, false).unwrap().json);
        let what = like.name();
        assert_eq!(
            (
                c.hidden_size,
                c.num_attention_heads,
                c.q_lora_rank,
                c.kv_lora_rank
            ),
            (h, heads, ql, 512),
            "{what}"
        );
        assert_eq!(
            (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim),
            (dn, 64, dv),
            "{what}"
        );
        assert_eq!(
            (c.intermediate_size, c.moe_intermediate_size),
            (inter, 2048),
            "{what}"
        );
        assert_eq!(
            (
                c.n_routed_experts,
                c.num_experts_per_tok,
                c.n_shared_experts
            ),
            (256, 8, 1),
            "{what}"
        );
        assert_eq!(
            (c.n_group, c.topk_group),
            (groups, groups.div_ceil(2)),
            "{what}"
        );
        assert_eq!(
            (c.routed_scaling_factor, c.norm_topk_prob),
            (2.5, true),
            "{what}"
        );
        assert_eq!(
            (c.index_n_heads, c.index_head_dim, c.index_topk),
            (ih, 128, 2048),
            "{what}"
        );
        assert_eq!(
            (c.rope.theta, c.vocab_size, c.rms_norm_eps),
            (theta, vocab, eps),
            "{what}"
        );
        assert_eq!(c.max_position_embeddings, maxpos, "{what}");
        assert_eq!(c.num_hidden_layers, 5);
        assert_eq!(c.dense_layers, [true, false, false, false, false], "{what}");
        assert_eq!(
            c.indexer_rope_interleave,
            like != Like::DeepseekV32,
            "{what}"
        );
        assert!(c.quant.is_none() && !c.tie_word_embeddings);
        match like {
            Like::DeepseekV32 => {
                assert_eq!(c.family, Family::DeepseekV32);
                assert!(matches!(c.rope.kind, RopeKind::Yarn { factor, .. } if factor == 40.0));
                assert!((c.softmax_scale() - 0.13524).abs() < 1e-4);
                assert_eq!(
                    (c.eos_token_ids.clone(), c.bos_token_id),
                    (vec![1], Some(0))
                );
            }
            _ => {
                assert_eq!(c.family, Family::GlmMoeDsa);
                assert_eq!(c.rope.kind, RopeKind::Default);
                assert!((c.softmax_scale() - 0.0625).abs() < 1e-7);
                assert_eq!(c.eos_token_ids, [154820, 154827, 154829]);
            }
        }
    }
    // A single layer is MoE; IndexShare follows GLM-5.2's rule for the first N layers.
    let c = parse(&release_config(Like::Glm5, 1, None, false).unwrap().json);
    assert_eq!(c.dense_layers, [false]);
    let c = parse(&release_config(Like::Glm52, 78, None, false).unwrap().json);
    let full: Vec<usize> = (0..78)
        .filter(|&i| c.indexer_types[i] == IndexerKind::Full)
        .collect();
    let mut want = vec![0, 1, 2];
    want.extend((6..78).step_by(4));
    assert_eq!(full, want);
    let c = parse(&release_config(Like::Glm5, 78, None, false).unwrap().json);
    assert_eq!(c.n_full_layers(), 78);
    // Fewer experts: DeepSeek's router groups stay valid, and the change is reported.
    let r = release_config(Like::DeepseekV32, 2, Some(8), false).unwrap();
    let c = parse(&r.json);
    assert_eq!(
        (
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.n_group,
            c.topk_group
        ),
        (8, 8, 4, 4)
    );
    assert!(
        r.notes.iter().any(|n| n.contains("topk_group")),
        "{:?}",
        r.notes
    );
    let r = release_config(Like::Glm5, 2, Some(4), false).unwrap();
    assert_eq!(parse(&r.json).num_experts_per_tok, 4);
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    assert!(release_config(Like::Glm5, 2, Some(16), false)
        .unwrap()
        .notes
        .is_empty());
    for bad in [(0, None), (2, Some(0)), (2, Some(5000))] {
        assert!(
            release_config(Like::Glm5, bad.0, bad.1, false).is_err(),
            "{bad:?}"
        );
    }
}

/// The full models have the published sizes (744B GLM-5, 671B DeepSeek-V3.2, both
/// without the MTP layer) once the first 3 layers are dense, as released.
#[test]
fn full_size_parameter_counts() {
    for (like, layers, billions) in [(Like::Glm5, 78, 744.0), (Like::DeepseekV32, 61, 671.0)] {
        let mut j = release_config(like, layers, None, false).unwrap().json;
        let types: Vec<&str> = (0..layers)
            .map(|i| if i < 3 { "dense" } else { "sparse" })
            .collect();
        j["first_k_dense_replace"] = json!(3);
        j["mlp_layer_types"] = json!(types);
        let p = plan(&j, None, 4_000_000_000).unwrap();
        let b = p.params as f64 / 1e9;
        assert!(
            (b - billions).abs() / billions < 0.01,
            "{}: {b}B",
            like.name()
        );
        // bf16 everywhere but the f32 router bias (256 per MoE layer).
        assert_eq!(p.bytes, 2 * p.params + 2 * 256 * (layers as u64 - 3));
    }
    // Sizes in each format (GLM-5, 4 layers, 16 experts): q4 is 4.5 bits per quantized
    // weight, FP8 8 bits plus a scale per 128×128 block.
    let j = release_config(Like::Glm5, 4, Some(16), false).unwrap().json;
    let bf16 = plan(&j, None, 4_000_000_000).unwrap();
    let q4 = plan(&j, Some(QFormat::Q4 { block: 32 }), 4_000_000_000).unwrap();
    let fp8 = plan(&j, Some(QFormat::Fp8), 4_000_000_000).unwrap();
    assert_eq!(bf16.params, q4.params);
    // Counted by hand from the table of real dims.
    let (h, v, l) = (6144u64, 154880u64, 4u64);
    let attn = 2048 * h + 64 * 256 * 2048 + 576 * h + 64 * 448 * 512 + h * 64 * 256;
    let norms = 2 * h + 2048 + 512;
    let indexer = 4096 * 2048 + 128 * h + 2 * 128 + 32 * h;
    let dense = 3 * 12288 * h;
    let moe = 16 * h + 16 + 17 * 3 * 2048 * h;
    let params = 2 * v * h + h + l * (attn + norms + indexer) + dense + (l - 1) * moe;
    assert_eq!(bf16.params, params);
    assert_eq!(bf16.bytes, 2 * params + 2 * 16 * (l - 1));
    assert_eq!(bf16.shards, 3);
    assert!(q4.bytes < bf16.bytes / 2 && fp8.bytes < bf16.bytes * 3 / 4);
}

/// A GLM-5 / 5.2 / V3.2 config from `release_config` with every dimension shrunk (the
/// structure — names, dense/MoE layers, IndexShare, router groups, YaRN — unchanged).
fn shrunk(like: Like, layers: usize) -> Value {
    let mut j = release_config(like, layers, Some(8), false).unwrap().json;
    for (k, v) in [
        ("hidden_size", 256),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 4),
        ("q_lora_rank", 160),
        ("kv_lora_rank", 96),
        ("qk_nope_head_dim", 32),
        ("qk_rope_head_dim", 16),
        ("head_dim", 16),
        ("v_head_dim", 24),
        ("intermediate_size", 320),
        ("moe_intermediate_size", 64),
        ("index_n_heads", 4),
        ("index_head_dim", 32),
        ("index_topk", 6),
        ("vocab_size", 700),
        ("max_position_embeddings", 4096),
    ] {
        j[k] = json!(v);
    }
    if let Some(m) = j.as_object_mut() {
        m.remove("qk_head_dim");
        // GLM's pad id (154820) is past the shrunk vocabulary (transformers checks it).
        m.remove("pad_token_id");
    }
    j
}

fn opts(format: Option<QFormat>, seed: u64, threads: usize) -> Options {
    Options {
        format,
        seed,
        shard_bytes: 1_000_000,
        threads,
        zeros: false,
    }
}

fn files_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().to_string(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn same_seed_same_bytes_whatever_the_threads() {
    let j = shrunk(Like::DeepseekV32, 2);
    for format in [None, Some(QFormat::Fp8), Some(QFormat::Q4 { block: 32 })] {
        let (a, b, c) = (tmp("det-a"), tmp("det-b"), tmp("det-c"));
        let ra = synth_dir(&j, &a, &opts(format, 7, 1), &mut |_, _| {}).unwrap();
        let rb = synth_dir(&j, &b, &opts(format, 7, 3), &mut |_, _| {}).unwrap();
        synth_dir(&j, &c, &opts(format, 8, 3), &mut |_, _| {}).unwrap();
        assert_eq!(ra, rb);
        assert!(ra.shards > 1, "{ra:?}");
        let (fa, fb, fc) = (files_of(&a), files_of(&b), files_of(&c));
        assert!(fa == fb, "{format:?}: files differ between 1 and 3 threads");
        let weights = |f: &[(String, Vec<u8>)]| -> Vec<Vec<u8>> {
            f.iter()
                .filter(|(n, _)| n.ends_with(".safetensors"))
                .map(|(_, b)| b.clone())
                .collect()
        };
        assert_ne!(
            weights(&fa),
            weights(&fc),
            "{format:?}: seed 8 wrote seed 7's weights"
        );
        for d in [a, b, c] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// `zeros`: the same files (names, safetensors headers, sizes, side files) as the random
/// model, with every tensor byte zero; quantized formats refused.
#[test]
fn zeros_has_the_same_headers_and_reads_as_zeros() {
    for like in [Like::Glm5, Like::DeepseekV32] {
        // bf16, and q4 (codes and scales zero: every weight zero).
        for format in [None, Some(QFormat::Q4 { block: 32 })] {
            let j = shrunk(like, 2);
            let (a, z) = (tmp("zeros-a"), tmp("zeros-z"));
            let ra = synth_dir(&j, &a, &opts(format, 7, 2), &mut |_, _| {}).unwrap();
            let zo = Options {
                zeros: true,
                ..opts(format, 7, 2)
            };
            let rz = synth_dir(&j, &z, &zo, &mut |_, _| {}).unwrap();
            assert_eq!(ra, rz);
            assert!(rz.shards > 1, "{rz:?}");
            let (fa, fz) = (files_of(&a), files_of(&z));
            assert_eq!(
                fa.iter().map(|f| &f.0).collect::<Vec<_>>(),
                fz.iter().map(|f| &f.0).collect::<Vec<_>>()
            );
            for ((name, ba), (_, bz)) in fa.iter().zip(&fz) {
                if !name.ends_with(".safetensors") {
                    assert!(ba == bz, "{name} differs");
                    continue;
                }
                assert_eq!(ba.len(), bz.len(), "{name}: size");
                let h = 8 + u64::from_le_bytes(ba[..8].try_into().unwrap()) as usize;
                assert!(ba[..h] == bz[..h], "{name}: header differs");
                assert!(bz[h..].iter().all(|&b| b == 0), "{name}: data not zero");
                assert!(
                    ba[h..].iter().any(|&b| b != 0),
                    "{name}: random data all zero"
                );
            }
            for d in [a, z] {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
}

fn gpu() -> Arc<Gpu> {
    Arc::new(Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter"))
}

/// Logits of a short prompt; asserts they are finite and spread out.
fn logits(dir: &Path, gpu: &Arc<Gpu>) -> Vec<f32> {
    let src = ModelSource::open(dir).unwrap();
    let model = Model::from_source(&src, gpu.clone(), &mut |_, _| {}).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 700).collect();
    let mut s = model.session(32).unwrap();
    let l = s.forward(&prompt, true).unwrap();
    assert_eq!((l.rows, l.vocab), (12, 700));
    assert!(l.data.iter().all(|x| x.is_finite()), "{}", dir.display());
    for row in l.data.chunks(700) {
        let mean = row.iter().sum::<f32>() / 700.0;
        let sd = (row.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / 700.0).sqrt();
        assert!(sd > 0.1 && sd < 100.0, "{}: logit std {sd}", dir.display());
    }
    l.data
}

#[test]
fn shrunk_models_load_and_run_in_every_format() {
    let gpu = gpu();
    for (like, layers) in [(Like::Glm5, 2), (Like::Glm52, 8), (Like::DeepseekV32, 3)] {
        let j = shrunk(like, layers);
        let mut base: Option<Vec<f32>> = None;
        for format in [
            None,
            Some(QFormat::Q8 { block: 32 }),
            Some(QFormat::Fp8),
            Some(QFormat::Q4 { block: 64 }),
        ] {
            let what = format!("{} {format:?}", like.name());
            let out = tmp("run");
            let r = synth_dir(&j, &out, &opts(format, 1, 2), &mut |_, _| {}).unwrap();
            let files = sparsa::weights::WeightFiles::open(&out).unwrap();
            assert_eq!(files.names().count(), r.tensors, "{what}");
            assert_eq!(files.total_bytes(), r.bytes, "{what}");
            let dtype = |n: &str| files.get(n).unwrap().dtype;
            let bias = "model.layers.1.mlp.gate.e_score_correction_bias";
            assert_eq!(dtype(bias), safetensors::Dtype::F32, "{what}");
            assert_eq!(dtype("model.embed_tokens.weight"), safetensors::Dtype::BF16);
            let q_b = "model.layers.1.self_attn.q_b_proj.weight";
            let router = "model.layers.1.mlp.gate.weight";
            let wp = "model.layers.0.self_attn.indexer.weights_proj.weight";
            match format {
                None => assert_eq!(dtype(q_b), safetensors::Dtype::BF16),
                Some(QFormat::Fp8) => {
                    assert_eq!(dtype(q_b), safetensors::Dtype::F8_E4M3);
                    assert!(files.contains(&format!("{q_b}_scale_inv")));
                    assert_eq!(dtype("lm_head.weight"), safetensors::Dtype::BF16);
                }
                Some(q) => {
                    assert_eq!(
                        files.get(&format!("{q_b}_scale")).unwrap().shape[1],
                        160usize.div_ceil(q.block())
                    );
                    assert!(files.contains("lm_head.weight_scale"), "{what}");
                }
            }
            assert_eq!(dtype(router), safetensors::Dtype::BF16, "{what}");
            assert_eq!(dtype(wp), safetensors::Dtype::BF16, "{what}");
            if like == Like::Glm52 {
                // Shared (IndexShare) layers carry no indexer.
                assert!(!files.contains("model.layers.3.self_attn.indexer.wk.weight"));
                assert!(files.contains("model.layers.6.self_attn.indexer.wk.weight"));
            }
            let l = logits(&out, &gpu);
            // Every format holds the same underlying values: quantized logits stay close
            // to bf16's (relative to their spread), not an unrelated model's.
            match &base {
                None => base = Some(l),
                Some(b) => {
                    let rms =
                        |v: &[f32]| (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
                    let d: Vec<f32> = l.iter().zip(b).map(|(x, y)| x - y).collect();
                    let rel = rms(&d) / rms(b);
                    assert!(
                        rel < 0.5,
                        "{what}: logits differ from bf16's by {rel} (relative rms)"
                    );
                }
            }
            // SPARSA_SYNTH_KEEP=DIR keeps the bf16 models (for tests/reference/check_synth.py).
            match std::env::var_os("SPARSA_SYNTH_KEEP") {
                Some(keep) if format.is_none() => {
                    let dst = Path::new(&keep).join(like.name());
                    let _ = std::fs::remove_dir_all(&dst);
                    std::fs::create_dir_all(&keep).unwrap();
                    std::fs::rename(&out, &dst).unwrap();
                }
                _ => {
                    let _ = std::fs::remove_dir_all(&out);
                }
            }
        }
    }
}

#[test]
fn cli_refuses_bad_flags_and_reports_sizes() {
    let bin = env!("CARGO_BIN_EXE_sparsa");
    let run = |args: &[&str]| Command::new(bin).arg("synth").args(args).output().unwrap();
    for (args, want) in [
        (
            &[
                "--like", "glm-5", "--layers", "0", "--format", "q4", "--out", "/tmp/x",
            ][..],
            "--layers",
        ),
        (
            &[
                "--like", "llama", "--layers", "2", "--format", "q4", "--out", "/tmp/x",
            ][..],
            "llama",
        ),
        (
            &[
                "--like", "glm-5", "--layers", "2", "--format", "q4", "--block", "48", "--out",
                "/tmp/x",
            ][..],
            "block size 48",
        ),
        (
            &[
                "--like",
                "glm-5",
                "--layers",
                "2",
                "--experts",
                "0",
                "--format",
                "q4",
                "--out",
                "/tmp/x",
            ][..],
            "--experts",
        ),
        (
            &[
                "--like", "glm-5", "--layers", "2", "--format", "q5", "--out", "/tmp/x",
            ][..],
            "q5",
        ),
    ] {
        let o = run(args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && e.contains(want), "{args:?}: {e}");
        assert!(
            !e.contains("panick") && !e.contains("internal error"),
            "{e}"
        );
    }
    let o = run(&[
        "--like",
        "deepseek-v3.2",
        "--layers",
        "4",
        "--experts",
        "16",
        "--format",
        "bf16",
        "--dry-run",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        text.contains("5.30B parameters") && text.contains("10.60 GB"),
        "{text}"
    );
}
