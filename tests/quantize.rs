//! `sparsa quantize` on a generated model of ~0.9 GB: host memory stays bounded (the
//! conversion streams 128-row steps of one tensor at a time), the output is a loadable,
//! correctly described directory, and bad input is refused with a clear message.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sparsa")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparsa-quantize-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Writes a safetensors file of bf16 tensors whose bytes repeat a finite pattern.
fn write_bf16_safetensors(path: &Path, tensors: &[(String, Vec<usize>)]) -> u64 {
    let mut header = serde_json::Map::new();
    let mut off = 0u64;
    for (name, shape) in tensors {
        let n = shape.iter().product::<usize>() as u64 * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}),
        );
        off += n;
    }
    let mut h = serde_json::Value::Object(header).to_string();
    while !(h.len() + 8).is_multiple_of(8) {
        h.push(' ');
    }
    // 64 KiB of bf16 values in (-0.05, 0.05).
    let mut state = 0x9E3779B97F4A7C15u64;
    let pattern: Vec<u8> = (0..32768)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            half::bf16::from_f32(v).to_le_bytes()
        })
        .collect();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(h.as_bytes()).unwrap();
    let mut left = off;
    while left > 0 {
        let n = left.min(pattern.len() as u64) as usize;
        f.write_all(&pattern[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
    off
}

/// A GLM-5.2-shaped model directory (3 layers: dense, MoE, MoE) of about 0.9 GB.
fn synthetic_model(dir: &Path) -> u64 {
    std::fs::create_dir_all(dir).unwrap();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(base.join("config.json")).unwrap()).unwrap();
    let (h, v, e, mi, di, l) = (1024usize, 4096usize, 64usize, 1024usize, 2048usize, 3usize);
    let c = cfg.as_object_mut().unwrap();
    for (k, x) in [
        ("hidden_size", h),
        ("vocab_size", v),
        ("n_routed_experts", e),
        ("moe_intermediate_size", mi),
        ("intermediate_size", di),
        ("num_hidden_layers", l),
    ] {
        c.insert(k.into(), x.into());
    }
    c.insert(
        "mlp_layer_types".into(),
        serde_json::json!(["dense", "sparse", "sparse"]),
    );
    c.insert(
        "indexer_types".into(),
        serde_json::json!(["full", "shared", "full"]),
    );
    c.remove("index_topk_pattern");
    // The built-in model ships quantized; this synthetic one is plain bf16.
    c.remove("quantization_config");
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string(&cfg).unwrap(),
    )
    .unwrap();
    let cf = sparsa::config::Config::from_dir(dir).unwrap();
    let (heads, ql, kl) = (cf.num_attention_heads, cf.q_lora_rank, cf.kv_lora_rank);
    let (dn, dr, dv) = (cf.qk_nope_head_dim, cf.qk_rope_head_dim, cf.v_head_dim);
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, h]),
        ("lm_head.weight".into(), vec![v, h]),
        ("model.norm.weight".into(), vec![h]),
    ];
    for i in 0..l {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        for (n, s) in [
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            t.push((format!("{p}.{n}"), s));
        }
        for (n, s) in [
            ("q_a_proj.weight", vec![ql, h]),
            ("q_a_layernorm.weight", vec![ql]),
            ("q_b_proj.weight", vec![heads * (dn + dr), ql]),
            ("kv_a_proj_with_mqa.weight", vec![kl + dr, h]),
            ("kv_a_layernorm.weight", vec![kl]),
            ("kv_b_proj.weight", vec![heads * (dn + dv), kl]),
            ("o_proj.weight", vec![h, heads * dv]),
        ] {
            t.push((format!("{a}.{n}"), s));
        }
        if cf.indexer_types[i] == sparsa::config::IndexerKind::Full {
            let (ih, id) = (cf.index_n_heads, cf.index_head_dim);
            for (n, s) in [
                ("wq_b.weight", vec![ih * id, ql]),
                ("wk.weight", vec![id, h]),
                ("k_norm.weight", vec![id]),
                ("k_norm.bias", vec![id]),
                ("weights_proj.weight", vec![ih, h]),
            ] {
                t.push((format!("{a}.indexer.{n}"), s));
            }
        }
        let m = format!("{p}.mlp");
        if i == 0 {
            for (n, s) in [
                ("gate_proj", vec![di, h]),
                ("up_proj", vec![di, h]),
                ("down_proj", vec![h, di]),
            ] {
                t.push((format!("{m}.{n}.weight"), s));
            }
        } else {
            t.push((format!("{m}.gate.weight"), vec![e, h]));
            t.push((format!("{m}.gate.e_score_correction_bias"), vec![e]));
            for x in 0..e {
                for (n, s) in [
                    ("gate_proj", vec![mi, h]),
                    ("up_proj", vec![mi, h]),
                    ("down_proj", vec![h, mi]),
                ] {
                    t.push((format!("{m}.experts.{x}.{n}.weight"), s));
                }
            }
            for (n, s) in [
                ("gate_proj", vec![mi, h]),
                ("up_proj", vec![mi, h]),
                ("down_proj", vec![h, mi]),
            ] {
                t.push((format!("{m}.shared_experts.{n}.weight"), s));
            }
        }
    }
    write_bf16_safetensors(&dir.join("model.safetensors"), &t)
}

fn rss_anon_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("RssAnon:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Waits for `child`, sampling its anonymous RSS every 5 ms: (exit status, peak kB).
fn wait_peak_rss(child: &mut std::process::Child) -> (std::process::ExitStatus, u64) {
    let pid = child.id();
    let mut peak = 0u64;
    loop {
        if let Some(kb) = rss_anon_kb(pid) {
            peak = peak.max(kb);
        }
        if let Some(s) = child.try_wait().unwrap() {
            return (s, peak);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn quantize_streams_a_large_model_with_bounded_memory() {
    let src = tmp("src");
    let out = tmp("out");
    let bytes = synthetic_model(&src);
    assert!(bytes > 800_000_000, "synthetic model is {bytes} bytes");
    let mut child = Command::new(bin())
        .args(["quantize", "--model"])
        .arg(&src)
        .arg("--out")
        .arg(&out)
        .args(["--format", "q4", "--shard-gb", "0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, peak) = wait_peak_rss(&mut child);
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "quantize failed: {err}");
    eprintln!(
        "{err}peak anonymous RSS {} MB for a {} MB model",
        peak / 1024,
        bytes / 1_000_000
    );
    // Host memory: bounded by a few row groups and the write buffer, not the model.
    assert!(peak * 1024 < bytes / 10, "peak anonymous RSS {peak} kB");
    // Sharded output with an index that names every tensor, and q4 where expected.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    assert!(map.contains_key("model.layers.1.mlp.experts.63.down_proj.weight_scale"));
    assert!(map.contains_key("model.embed_tokens.weight"));
    assert!(
        !map.contains_key("model.embed_tokens.weight_scale"),
        "embeddings stay bf16"
    );
    assert!(
        !map.contains_key("model.layers.1.mlp.gate.weight_scale"),
        "router stays bf16"
    );
    let shards: std::collections::BTreeSet<&str> =
        map.values().filter_map(|v| v.as_str()).collect();
    assert!(
        shards.len() >= 3,
        "expected several shards, got {}",
        shards.len()
    );
    let cfg = sparsa::config::Config::from_dir(&out).unwrap();
    assert_eq!(cfg.quant, Some(sparsa::weights::QFormat::Q4 { block: 32 }));
    // `sparsa info` describes it without a GPU upload.
    let info = Command::new(bin())
        .args(["info", "--model"])
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.status.success() && text.contains("routed experts") && text.contains("q4"),
        "{text}"
    );
    // Loading it: on lavapipe GPU buffers live in host memory, so what the loader itself
    // adds is the anonymous RSS beyond the GPU bytes (weights + caches).
    let gpu_mb = text
        .lines()
        .find(|l| l.starts_with("memory plan"))
        .and_then(|l| l.split(" weights ").nth(1))
        .and_then(|x| x.split(" MB").next())
        .and_then(|x| x.parse::<f64>().ok())
        .expect("weights MB in sparsa info");
    let mut child = Command::new(bin())
        .args([
            "generate",
            "--tokens",
            "1,2,3",
            "--max-tokens",
            "1",
            "--model",
        ])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (status, peak) = wait_peak_rss(&mut child);
    assert!(status.success(), "loading the quantized model failed");
    let extra_mb = peak as f64 / 1024.0 - gpu_mb;
    eprintln!(
        "load: peak anonymous RSS {} MB, GPU weights {gpu_mb} MB",
        peak / 1024
    );
    assert!(
        extra_mb < 200.0,
        "loader overhead {extra_mb} MB beyond the GPU bytes"
    );
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn quantize_refuses_bad_requests() {
    let out = tmp("bad");
    let run = |args: &[&str]| {
        let o = Command::new(bin()).args(args).output().unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let glm52 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/glm52");
    let o = out.to_str().unwrap();
    let e = run(&[
        "quantize",
        "--model",
        glm52.to_str().unwrap(),
        "--out",
        o,
        "--format",
        "q8",
        "--block",
        "48",
    ]);
    assert!(e.contains("block size 48"), "{e}");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("x"), b"x").unwrap();
    let e = run(&[
        "quantize",
        "--model",
        glm52.to_str().unwrap(),
        "--out",
        o,
        "--format",
        "q4",
    ]);
    assert!(e.contains("not empty"), "{e}");
    let e = run(&[
        "quantize",
        "--model",
        "/nonexistent",
        "--out",
        "/tmp/x",
        "--format",
        "q4",
    ]);
    assert!(e.contains("/nonexistent"), "{e}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A copy of an FP8 golden with one byte of `tensor` set to `byte`.
fn corrupt_fp8(name: &str, tensor: &str, at: usize, byte: u8) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/glm52-fp8");
    let dst = tmp(name);
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let mut bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let (n, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let info = meta.info(tensor).unwrap();
    bytes[8 + n + info.data_offsets.0 + at] = byte;
    std::fs::write(dst.join("model.safetensors"), bytes).unwrap();
    dst
}

#[test]
fn fp8_nan_and_bad_scales_are_load_errors() {
    let run = |dir: &Path| {
        let o = Command::new(bin())
            .args([
                "generate",
                "--tokens",
                "1,2,3",
                "--max-tokens",
                "1",
                "--model",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let w = "model.layers.1.self_attn.q_b_proj.weight";
    for byte in [0x7F, 0xFF] {
        let d = corrupt_fp8("nan", w, 300, byte);
        let e = run(&d);
        assert!(e.contains(w) && e.contains("NaN"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
    // An infinite scale (f32 bytes 00 00 80 7F).
    let s = "model.layers.2.mlp.shared_experts.down_proj.weight_scale_inv";
    let d = corrupt_fp8("inf", s, 3, 0x7F);
    let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
    let (n, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let off = 8 + n + meta.info(s).unwrap().data_offsets.0;
    let mut b = bytes.clone();
    b[off..off + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    std::fs::write(d.join("model.safetensors"), b).unwrap();
    let e = run(&d);
    assert!(e.contains(s) && e.contains("infinite"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn fp8_release_converts_to_q8_and_runs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/dsv32-fp8");
    let out = tmp("fp8-q8");
    let o = Command::new(bin())
        .args(["quantize", "--model"])
        .arg(&src)
        .arg("--out")
        .arg(&out)
        .args(["--format", "q8", "--keep", "o_proj"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let files = sparsa::weights::WeightFiles::open(&out).unwrap();
    let mut n_q = 0;
    for name in files.names() {
        let t = files.get(name).unwrap();
        assert_ne!(t.dtype, safetensors::Dtype::F8_E4M3, "{name} is still FP8");
        assert!(!name.ends_with("_scale_inv"), "{name}");
        if name.contains("o_proj") {
            // Kept FP8 tensors are dequantized to bf16.
            assert_eq!(t.dtype, safetensors::Dtype::BF16, "{name}");
        }
        n_q += (t.dtype == safetensors::Dtype::I8) as usize;
    }
    assert!(n_q > 10, "{n_q} q8 tensors");
    let o = Command::new(bin())
        .args([
            "generate",
            "--tokens",
            "5,6,7,8",
            "--max-tokens",
            "4",
            "--temperature",
            "0",
            "--print-ids",
            "--model",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&out);
}
