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

/// `--prefill-chunk`: the prompt prefilled in chunks of 5 rows gives transformers' greedy
/// tokens too; 0 and more than 8192 rows are refused naming the flag.
#[test]
fn prefill_chunk_keeps_the_greedy_reference_and_is_checked() {
    let prompt = reference_tokens("dsv32", "tokens_0");
    let want = reference_tokens("dsv32", "greedy_0");
    let out = greedy_ids(&prompt, want.len(), &["--prefill-chunk", "5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {err}");
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), join(&want));
    for bad in ["0", "8193", "x"] {
        let e = fails(&["generate", "--prefill-chunk", bad], None);
        assert!(e.contains("--prefill-chunk"), "{bad}: {e}");
    }
    // The chunks bench runs are the ones asked for (the built-in model's default is 128).
    let out = bin()
        .args([
            "bench",
            "--context",
            "64",
            "--prompt-len",
            "40",
            "--decode",
            "2",
        ])
        .args(["--no-profile", "--prefill-chunk", "16"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("(chunks of 16 rows)"), "{text}");
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

/// `sparsa bench ARGS --json FILE` on the built-in model (in a temporary directory named
/// `name`), which must succeed: its printed report and its JSON.
fn bench_json(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let json = tmpdir(name).join("bench.json");
    let out = bin()
        // Recorded in the report (a knob no code reads).
        .env("SPARSA_TEST_MARK", "3")
        .arg("bench")
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), r)
}

#[test]
fn bench_reports_dsa_dense_kernels_and_calibration() {
    // The built-in model on this adapter: a short prefill, one decode step at a synthetic
    // context longer than index_topk (64), DSA and dense, profiled and calibrated.
    let (text, r) = bench_json(
        "bench",
        &[
            "--calibrate",
            "--dense",
            "--context",
            "300",
            "--prompt-len",
            "20",
            "--decode",
            "1",
        ],
    );
    assert!(text.contains("decode at context 300 (dsa"), "{text}");
    assert!(text.contains("decode at context 300 (dense"), "{text}");
    // The SPARSA_* variables the figures ran under, in the JSON and the text.
    let env = r["environment"].as_array().unwrap();
    assert!(env.iter().any(|v| v == "SPARSA_TEST_MARK=3"), "{env:?}");
    assert!(
        text.contains("knobs:") && text.contains("SPARSA_TEST_MARK=3"),
        "{text}"
    );
    let cal = &r["calibration"];
    assert!(cal["copy_bytes_per_s"].as_f64().unwrap() > 0.0, "{cal}");
    assert!(cal["fma_flops_per_s"].as_f64().unwrap() > 0.0, "{cal}");
    assert!(cal["int_dots_per_s"].as_f64().unwrap() > 0.0, "{cal}");
    // The tensor-core rate: measured where the GEMM tile runs on tensor cores, else null.
    match &cal["mma_flops_per_s"] {
        serde_json::Value::Null => {}
        v => assert!(v.as_f64().is_some_and(|m| m > 0.0), "{cal}"),
    }
    assert!(cal.get("mma_flops_per_s").is_some(), "{cal}");
    assert_eq!(r["prefill"][0]["tokens"], 20);
    // The built-in model (hidden 256) prefills in chunks of 128 rows.
    assert_eq!(r["prefill"][0]["chunk_rows"], 128);
    assert!(
        text.contains("prefill 20 tokens: ") && text.contains("tok/s (chunks of 128 rows)"),
        "{text}"
    );
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
    // DSA runs the indexer (`scores`, or `scores_cpu` on CPU adapters) and top-k; dense
    // selects every position instead.
    let (dsa, dense) = (names(0), names(1));
    let indexer = |n: &String| n.starts_with("indexer::scores");
    assert_eq!(decode[0]["attention"], "dsa");
    assert!(dsa.iter().any(indexer), "{dsa:?}");
    assert!(dsa.iter().any(|n| n.starts_with("topk")), "{dsa:?}");
    assert!(!dense.iter().any(indexer), "{dense:?}");
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
    // The dispatches a greedy step records are the profiled step's kernel calls.
    for d in decode {
        let calls: u64 = d["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["count"].as_u64().unwrap())
            .sum();
        assert_eq!(d["dispatches_per_token"].as_u64(), Some(calls), "{d}");
        assert!(d["ms_host_median"].as_f64().unwrap() > 0.0, "{d}");
    }
}

/// `sparsa bench --batch`: a line and a JSON entry per width (and one sequence's, the base)
/// with a positive speed and its ratio to one sequence's; a batched step is one forward for
/// all its rows, so it makes about as many dispatches as one sequence's step and moves less
/// than twice its bytes (every weight read once). Bad widths are refused before loading.
#[test]
fn bench_batch_reports_each_width_against_one_sequence() {
    let (text, r) = bench_json(
        "bench-batch",
        &["--batch", "2", "--context", "200", "--decode", "2"],
    );
    // "batched decode at 200, 2 sequences: 49.623 ms a step, 40.3 tok/s together (1.35x
    // one sequence's)": its tok/s and ratio.
    let printed = |width: usize| -> (f64, f64) {
        let head = format!("batched decode at 200, {width} sequences: ");
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&head))
            .unwrap_or_else(|| panic!("no line for {width} sequences: {text}"));
        let number_before = |end: &str| -> f64 {
            let before = &line[..line.find(end).unwrap_or_else(|| panic!("{line}"))];
            let start = before.rfind([' ', '(']).map_or(0, |i| i + 1);
            before[start..].parse().unwrap_or_else(|_| panic!("{line}"))
        };
        (
            number_before(" tok/s together"),
            number_before("x one sequence's"),
        )
    };
    let (one, base) = printed(1);
    let (two, ratio) = printed(2);
    assert!(one > 0.0 && two > 0.0, "{text}");
    assert_eq!(base, 1.0, "{text}");
    assert!(ratio > 0.0, "{text}");
    let batch = r["batch"].as_array().unwrap();
    assert_eq!(batch.len(), 2, "{batch:?}");
    let sum = |b: &serde_json::Value, field: &str| -> u64 {
        b["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k[field].as_u64().unwrap())
            .sum()
    };
    for (b, width) in batch.iter().zip([1, 2]) {
        assert_eq!(b["width"], width, "{b}");
        assert_eq!(b["context"], 200, "{b}");
        let tok_per_s = b["tok_per_s"].as_f64().unwrap();
        let ms = b["ms_step_median"].as_f64().unwrap();
        assert!(tok_per_s > 0.0 && ms > 0.0, "{b}");
        assert!(
            (tok_per_s - width as f64 * 1e3 / ms).abs() < 1e-6 * tok_per_s,
            "{b}"
        );
        assert!(sum(b, "count") > 0, "{b}");
    }
    let tok = |i: usize| batch[i]["tok_per_s"].as_f64().unwrap();
    assert_eq!(batch[0]["vs_one"].as_f64(), Some(1.0));
    let vs_one = batch[1]["vs_one"].as_f64().unwrap();
    assert!((vs_one - tok(1) / tok(0)).abs() < 1e-9, "{vs_one}");
    assert!(
        (vs_one - ratio).abs() < 0.006,
        "printed {ratio}, JSON {vs_one}"
    );
    // One forward for both rows: not two steps' dispatches, nor two reads of the weights.
    let (calls, bytes) = (|i| sum(&batch[i], "count"), |i| sum(&batch[i], "bytes"));
    assert!(
        calls(1) < 2 * calls(0),
        "dispatches of a step of 2 vs 1: {} vs {}",
        calls(1),
        calls(0)
    );
    assert!(
        bytes(1) < 2 * bytes(0),
        "bytes of a step of 2 vs 1: {} vs {}",
        bytes(1),
        bytes(0)
    );
    for bad in ["0", "abc", "65", "2,-1"] {
        let e = fails(&["bench", "--batch", bad], None);
        assert!(
            e.contains("--batch") && e.contains("expected batch widths from 1 to 64"),
            "--batch {bad}: {e}"
        );
    }
    // The batched steps are all it measures: the other measurements' flags are refused.
    for other in [&["--dense"][..], &["--verify", "3"]] {
        let args: Vec<&str> = ["bench", "--batch", "2"]
            .iter()
            .chain(other)
            .copied()
            .collect();
        let e = fails(&args, None);
        assert!(e.contains("--batch") && e.contains(other[0]), "{e}");
    }
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

/// The `--gpu-memory` budget (bytes) that holds the golden model `family` at `ctx` positions
/// with one routed-expert slot per MoE layer, as the loader plans it on this adapter.
fn one_slot_per_layer(family: &str, ctx: usize) -> u64 {
    let src = sparsa::model::ModelSource::open(&data(family)).unwrap();
    let gpu = sparsa::gpu::Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).unwrap();
    let binding = gpu.max_binding();
    let p = sparsa::model::plan(&src.config, &src.weights, 1 << 50, ctx, binding, None).unwrap();
    p.fixed() + p.slots.moe_layers() as u64 * p.slots.expert_bytes
}

/// `--gpu-memory` with room for one routed expert per MoE layer: the experts stream through
/// the cache and the greedy ids are still transformers' (auto keeps f32 caches); a budget one
/// byte smaller, with f32 caches, is a one-line error saying what is needed.
#[test]
fn generate_streaming_experts_is_greedy_reference() {
    let prompt = reference_tokens("dsv32", "tokens_0");
    let want = reference_tokens("dsv32", "greedy_0");
    let one_slot = one_slot_per_layer("dsv32", prompt.len() + want.len());
    let run = |budget: u64, cache: &str| {
        let b = budget.to_string();
        greedy_ids(
            &prompt,
            want.len(),
            &[
                "--expert-policy",
                "lru",
                "--gpu-memory",
                &b,
                "--cache-type",
                cache,
            ],
        )
    };
    // auto keeps f32 caches: the budget holds them besides one slot per layer.
    let out = run(one_slot, "auto");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {err}");
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), join(&want));
    // A byte less: auto would take compact caches; f32 ones do not fit.
    let out = run(one_slot - 1, "f32");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("error: --gpu-memory") && err.contains("one expert slot per MoE layer"),
        "stderr: {err}"
    );
}

/// `bench --gpu-memory` with the misses on the CPU: the offloading lines, and a token's time
/// split into the CPU's experts, the routing waits and the upload stalls.
#[test]
fn bench_reports_where_an_offloaded_token_goes() {
    let dir = data("dsv32");
    let budget = one_slot_per_layer("dsv32", 80).to_string();
    let (text, _) = bench_json(
        "bench-offload",
        &[
            "--model",
            dir.to_str().unwrap(),
            "--gpu-memory",
            &budget,
            "--cpu-experts",
            "on",
            "--context",
            "64",
            "--decode",
            "4",
            "--prompt-len",
            "0",
            "--no-profile",
        ],
    );
    assert!(text.contains("expert offloading"), "{text}");
    assert!(text.contains("; CPU: "), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("a token's time, host clock"))
        .unwrap_or_else(|| panic!("no time split: {text}"));
    // "... CPU experts X ms (... then waiting W ms ...), waiting ... routing Y ms, stalled on
    // uploads Z ms; ..."
    let ms_after = |label: &str| -> f64 {
        let rest = &line[line
            .find(label)
            .unwrap_or_else(|| panic!("{label}: {line}"))
            + label.len()..];
        rest.trim_start()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(ms_after("CPU experts") > 0.0, "{line}");
    // How long the host waited for them at its next submission.
    assert!(ms_after("then waiting") > 0.0, "{line}");
    assert!(ms_after("routing") > 0.0, "{line}");
    assert!(ms_after("stalled on uploads") >= 0.0, "{line}");
}

/// The CPU-expert flags: a bad value names the flag and what it takes; without
/// `--gpu-memory` they are refused (nothing streams, so nothing runs on the CPU).
#[test]
fn cpu_expert_flags_are_checked() {
    let g = ["generate", "-p", "hi", "--gpu-memory", "64MB"];
    let err = fails(&[&g[..], &["--cpu-experts", "maybe"]].concat(), None);
    assert!(
        err.contains("--cpu-experts") && err.contains("auto, on or off"),
        "{err}"
    );
    for n in ["0", "5000", "x"] {
        let err = fails(&[&g[..], &["--cpu-threads", n]].concat(), None);
        assert!(err.contains("--cpu-threads"), "{err}");
    }
    let mut c = bin();
    c.args(["generate", "-p", "hi", "--cpu-experts", "on"]);
    let out = common::run_with_timeout(c, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("required") && err.contains("--gpu-memory"),
        "{err}"
    );
}

fn ok_text(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The built-in model's `generate`: the prompt from stdin and from --file, the echoed text
/// being exactly the tokenizer's decoding of prompt + generated ids (no space added or lost
/// at the first token), --stop, and the seed printed by -v repeating the run.
#[test]
fn generate_reads_stdin_and_files_and_detokenizes_in_context() {
    let prompt = "ROMEO:";
    let run = |args: &[&str], stdin: Option<&[u8]>| {
        let mut c = bin();
        c.arg("generate").args(args);
        ok_text(&common::run_with_timeout(c, stdin))
    };
    let piped = run(&["-n", "6", "--seed", "5"], Some(prompt.as_bytes()));
    let flag = run(&["-p", prompt, "-n", "6", "--seed", "5"], None);
    assert_eq!(piped, flag, "stdin and -p give the same run");
    let file = tmpdir("generate-file").join("prompt.txt");
    std::fs::write(&file, prompt).unwrap();
    let from_file = run(
        &["-f", file.to_str().unwrap(), "-n", "6", "--seed", "5"],
        None,
    );
    assert_eq!(from_file, flag, "--file gives the same run");

    // The text printed is the decoding of the whole token sequence, prompt first.
    let ids = run(
        &["-p", prompt, "-n", "6", "--seed", "5", "--print-ids"],
        None,
    );
    let ids: Vec<u32> = ids.trim().split(',').map(|x| x.parse().unwrap()).collect();
    let src = sparsa::model::ModelSource::builtin().unwrap();
    let tok = src.tokenizer().unwrap();
    let p = tok.encode(prompt).unwrap();
    let mut all = p.clone();
    all.extend(&ids);
    let whole = tok.decode(&all).unwrap();
    let head = tok.decode(&p).unwrap();
    assert_eq!(
        flag.strip_suffix('\n').unwrap(),
        format!("{prompt}{}", &whole[head.len()..]),
        "ids {ids:?}"
    );

    // --stop cuts the text before the stop string; -v prints a seed that repeats the run.
    let generated = &flag[prompt.len()..];
    let cut: String = generated.chars().skip(2).take(3).collect();
    let stopped = run(
        &["-p", prompt, "-n", "6", "--seed", "5", "--stop", &cut],
        None,
    );
    let at = generated.find(&cut).unwrap();
    assert_eq!(stopped, format!("{prompt}{}\n", &generated[..at]));
    let mut c = bin();
    c.args(["generate", "-n", "4", "-v", "--temperature", "1.5"]);
    let out = common::run_with_timeout(c, None);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let seed = stderr
        .split_whitespace()
        .skip_while(|w| *w != "seed")
        .nth(1)
        .expect("-v prints the seed")
        .to_string();
    let again = run(&["-n", "4", "--temperature", "1.5", "--seed", &seed], None);
    assert_eq!(ok_text(&out), again, "the printed seed repeats the run");
}

#[test]
fn generate_flag_values_are_explained() {
    let e = fails(&["generate", "--max-tokens", "-2"], None);
    assert!(e.contains("-1 for no limit"), "{e}");
    let e = fails(&["generate", "--temperature", "-1"], None);
    assert!(e.contains("--temperature -1: expected a number ≥ 0"), "{e}");
    let e = fails(&["generate", "--min-p", "2"], None);
    assert!(e.contains("--min-p 2"), "{e}");
    for cmd in ["generate", "chat", "info", "bench"] {
        let e = fails(&[cmd, "--cache-type", "q4"], None);
        assert!(
            e.contains("--cache-type") && e.contains("'q4'") && e.contains("expected auto, f32"),
            "{cmd}: {e}"
        );
    }
    let e = fails(&["generate", "--file", "/nonexistent/prompt.txt"], None);
    assert!(
        e.contains("--file /nonexistent/prompt.txt: cannot read"),
        "{e}"
    );
}

/// `sparsa info | head -1` and `sparsa generate | head -c 1`: the reader goes away, sparsa
/// ends quietly (SIGPIPE, as `cat` does), never with an internal error.
#[test]
fn a_closed_pipe_ends_quietly() {
    use std::process::Stdio;
    for args in [
        &["info"][..],
        &["generate", "-n", "200", "--ignore-eos"][..],
    ] {
        let mut child = bin()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut first = [0u8; 1];
        std::io::Read::read_exact(&mut out, &mut first).unwrap();
        drop(out);
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("error"), "{args:?}: {err}");
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert!(
                o.status.success() || o.status.signal() == Some(libc_sigpipe()),
                "{args:?}: {:?}",
                o.status
            );
        }
    }
}

#[cfg(unix)]
fn libc_sigpipe() -> i32 {
    13
}
