//! The `sparsa` binary end to end: the commands the acceptance checks use, and clear
//! one-line errors for bad input.

mod common;

use common::{bin, data, fails, tmpdir, variant};
use std::path::Path;

fn reference_tokens(family: &str, name: &str) -> Vec<i32> {
    let bytes = std::fs::read(data(family).join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    bytemuck::pod_collect_to_vec(st.tensor(name).unwrap().data())
}

fn join(ids: &[i32]) -> String {
    ids.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `sparsa generate` on the dsv32 test model: `n` greedy ids after `prompt`, printed as ids.
fn greedy_ids(prompt: &[i32], n: usize, extra: &[&str]) -> std::process::Output {
    bin()
        .args(["generate", "--model"])
        .arg(data("dsv32"))
        .args([
            "--tokens",
            &join(prompt),
            "--temperature",
            "0",
            "--print-ids",
        ])
        .args(extra)
        .args(["--max-tokens", &n.to_string()])
        .output()
        .unwrap()
}

#[test]
fn generate_print_ids_is_greedy_reference() {
    let prompt = reference_tokens("dsv32", "tokens_0");
    let want = reference_tokens("dsv32", "greedy_0");
    let out = greedy_ids(&prompt, want.len(), &[]);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim(), join(&want));
}

#[test]
fn logits_writes_safetensors() {
    let prompt = reference_tokens("glm52", "tokens_1");
    let dir = tmpdir("logits");
    let file = dir.join("out.safetensors");
    let out = bin()
        .args(["logits", "--model"])
        .arg(data("glm52"))
        .args(["--tokens", &join(&prompt), "--out"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor("logits").unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    assert_eq!(t.shape()[0], prompt.len());
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(t.data());
    let bytes = std::fs::read(data("glm52").join("reference.safetensors")).unwrap();
    let r = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let want: Vec<f32> = bytemuck::pod_collect_to_vec(r.tensor("logits_1").unwrap().data());
    let max = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max < 1e-2, "max |Δ| {max}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn missing_model_dir() {
    let e = fails(
        &["generate", "--tokens", "1,2"],
        Some(Path::new("/nonexistent/model")),
    );
    assert!(e.contains("/nonexistent/model"), "{e}");
}

#[test]
fn not_a_dsa_model() {
    let d = variant("glm52", "llama", |c| c["model_type"] = "llama".into());
    let e = fails(&["generate", "--tokens", "1,2"], Some(&d));
    assert!(e.contains("model_type") && e.contains("llama"), "{e}");
}

#[test]
fn missing_config_field() {
    let d = variant("glm52", "nofield", |c| {
        c.as_object_mut().unwrap().remove("kv_lora_rank");
    });
    let e = fails(
        &["logits", "--tokens", "1,2", "--out", "/tmp/x.safetensors"],
        Some(&d),
    );
    assert!(e.contains("kv_lora_rank"), "{e}");
}

#[test]
fn missing_tensor() {
    let d = variant("glm52", "moretensors", |c| {
        let n = c["num_hidden_layers"].as_u64().unwrap();
        c["num_hidden_layers"] = (n + 1).into();
        c.as_object_mut().unwrap().remove("indexer_types");
        c.as_object_mut().unwrap().remove("mlp_layer_types");
    });
    let e = fails(&["generate", "--tokens", "1,2"], Some(&d));
    assert!(e.contains("missing") && e.contains("model.layers."), "{e}");
}

#[test]
fn shape_mismatch() {
    let d = variant("glm52", "shape", |c| {
        let n = c["q_lora_rank"].as_u64().unwrap();
        c["q_lora_rank"] = (n + 2).into();
    });
    let e = fails(&["generate", "--tokens", "1,2"], Some(&d));
    assert!(
        e.contains("model.layers.0") && e.contains("shape") && e.contains("expected"),
        "{e}"
    );
}

#[test]
fn token_out_of_range_and_bad_ids() {
    let e = fails(
        &["generate", "--tokens", "1,99999999", "--max-tokens", "1"],
        Some(&data("glm52")),
    );
    assert!(e.contains("99999999"), "{e}");
    let out = bin()
        .args(["generate", "--tokens", "1,x"])
        .arg("--model")
        .arg(data("glm52"))
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn prompt_without_tokenizer() {
    let e = fails(&["generate", "--prompt", "hello"], Some(&data("glm52")));
    assert!(e.contains("tokenizer.json"), "{e}");
}

#[test]
fn devices_lists_an_adapter() {
    let out = bin().arg("devices").output().unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("max binding"), "{s}");
}

#[test]
fn bench_reports_dsa_dense_kernels_and_calibration() {
    // The built-in model on this adapter: a short prefill, one decode step at a synthetic
    // context longer than index_topk (64), DSA and dense, profiled and calibrated.
    let dir = tmpdir("bench");
    let json = dir.join("bench.json");
    let out = bin()
        .args(["bench", "--calibrate", "--dense", "--context", "300"])
        .args(["--prompt-len", "20", "--decode", "1", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("decode at context 300 (dsa"), "{text}");
    assert!(text.contains("decode at context 300 (dense"), "{text}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cal = &r["calibration"];
    assert!(cal["copy_bytes_per_s"].as_f64().unwrap() > 0.0, "{cal}");
    assert!(cal["fma_flops_per_s"].as_f64().unwrap() > 0.0, "{cal}");
    assert_eq!(r["prefill"][0]["tokens"], 20);
    let decode = r["decode"].as_array().unwrap();
    assert_eq!(decode.len(), 2);
    let names = |i: usize| -> Vec<String> {
        decode[i]["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["name"].as_str().unwrap().to_string())
            .collect()
    };
    // DSA runs the indexer and top-k; dense selects every position instead.
    let (dsa, dense) = (names(0), names(1));
    assert_eq!(decode[0]["attention"], "dsa");
    assert!(dsa.iter().any(|n| n == "indexer::scores"), "{dsa:?}");
    assert!(dsa.iter().any(|n| n.starts_with("topk")), "{dsa:?}");
    assert!(!dense.iter().any(|n| n == "indexer::scores"), "{dense:?}");
    assert!(dense.iter().any(|n| n == "topk::select_all"), "{dense:?}");
    // Weight GEMVs state their bytes: the step moves at least the built-in model's q8 bytes
    // of one token's active weights (several MB).
    let bytes: u64 = decode[0]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["bytes"].as_u64().unwrap())
        .sum();
    assert!(bytes > 1_000_000, "bytes moved per step: {bytes}");
}

#[test]
fn bench_rejects_a_context_the_adapter_cannot_hold() {
    let out = bin()
        .args(["bench", "--context", "4000000000", "--prompt-len", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--context 4000000000"), "{err}");
}

/// `--gpu-memory` with room for one routed expert per MoE layer: the experts stream through
/// the cache and the greedy ids are still transformers'; a budget one byte smaller is a
/// one-line error saying what is needed.
#[test]
fn generate_streaming_experts_is_greedy_reference() {
    let prompt = reference_tokens("dsv32", "tokens_0");
    let want = reference_tokens("dsv32", "greedy_0");
    let src = sparsa::model::ModelSource::open(&data("dsv32")).unwrap();
    let gpu = sparsa::gpu::Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).unwrap();
    let ctx = prompt.len() + want.len();
    let scratch = sparsa::model::Session::scratch_bytes(&src.config, ctx, gpu.max_binding());
    let p = sparsa::model::plan(&src.config, &src.weights, 1 << 50, ctx, scratch).unwrap();
    let one_slot = p.fixed() + p.slots.moe_layers() as u64 * p.slots.expert_bytes;
    let run = |budget: u64| {
        let b = budget.to_string();
        greedy_ids(
            &prompt,
            want.len(),
            &["--expert-policy", "lru", "--gpu-memory", &b],
        )
    };
    let out = run(one_slot);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {err}");
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), join(&want));
    let out = run(one_slot - 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("error: --gpu-memory") && err.contains("one expert slot per MoE layer"),
        "stderr: {err}"
    );
}
