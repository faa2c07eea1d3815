//! Hostile inputs: broken, inconsistent or absurd model files, configs, prompts and flags.
//! Each case runs the real binary and expects a non-zero exit code and exactly one `error:`
//! line naming the file, tensor, field or flag at fault — never a panic, a hang (the helper
//! kills the child after two minutes) or a silently wrong answer. Most cases fail before a GPU
//! is opened; those that need the weights checked against the config use the tiny test models.

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// A short greedy generation with token ids (no tokenizer needed).
const GEN: &[&str] = &[
    "generate",
    "--tokens",
    "1,2",
    "--max-tokens",
    "1",
    "--temperature",
    "0",
];

fn gen_fails(dir: &Path) -> String {
    fails(GEN, Some(dir))
}

/// Asserts that the error line contains every one of `want`.
fn expect(e: &str, want: &[&str]) {
    // Shown with --nocapture: the table in docs/ROBUSTNESS.md is these lines.
    println!("{e}");
    for w in want {
        assert!(e.contains(w), "expected {w:?} in: {e}");
    }
}

/// A copy of a test model with one file replaced by `bytes`.
fn with_file(family: &str, name: &str, file: &str, bytes: &[u8]) -> PathBuf {
    let dir = tmpdir(name);
    copy_model(&data(family), &dir);
    std::fs::write(dir.join(file), bytes).unwrap();
    dir
}

/// A copy of a single-file test model with its tensors edited.
fn with_tensors(family: &str, name: &str, edit: impl FnOnce(&mut Vec<Tensor>)) -> PathBuf {
    let mut t = read_tensors(&data(family).join("model.safetensors"));
    edit(&mut t);
    with_file(family, name, "model.safetensors", &write_tensors(&t))
}

/// A copy of glm52 whose model.safetensors header was edited (the data kept as it is).
fn with_header(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let bytes = std::fs::read(data("glm52").join("model.safetensors")).unwrap();
    let (mut h, body) = split_safetensors(&bytes);
    edit(&mut h);
    with_file(
        "glm52",
        name,
        "model.safetensors",
        &raw_safetensors(h.to_string().as_bytes(), &body),
    )
}

fn tensor<'a>(t: &'a mut [Tensor], name: &str) -> &'a mut Tensor {
    t.iter_mut().find(|x| x.name == name).unwrap()
}

/// Writes the 16- or 32-bit pattern `bits` at element `i` of a tensor's data.
fn poke(t: &mut Tensor, i: usize, bits: u32) {
    match t.dtype.as_str() {
        "F32" => t.data[4 * i..4 * i + 4].copy_from_slice(&bits.to_le_bytes()),
        _ => t.data[2 * i..2 * i + 2].copy_from_slice(&(bits as u16).to_le_bytes()),
    }
}

const GLM_ST: &str = "model.safetensors";
const Q_A: &str = "model.layers.0.self_attn.q_a_proj.weight";

// ---- the safetensors container ----

#[test]
fn truncated_shard_mid_tensor() {
    let b = std::fs::read(data("glm52").join(GLM_ST)).unwrap();
    let d = with_file("glm52", "trunc-data", GLM_ST, &b[..b.len() / 2]);
    expect(&gen_fails(&d), &[GLM_ST, "truncated"]);
}

#[test]
fn truncated_shard_mid_header() {
    let b = std::fs::read(data("glm52").join(GLM_ST)).unwrap();
    let d = with_file("glm52", "trunc-header", GLM_ST, &b[..1000]);
    expect(&gen_fails(&d), &[GLM_ST, "header"]);
}

#[test]
fn header_length_larger_than_file() {
    let mut b = std::fs::read(data("glm52").join(GLM_ST)).unwrap();
    let n = b.len() as u64 + 100;
    b[..8].copy_from_slice(&n.to_le_bytes());
    let d = with_file("glm52", "hdr-long", GLM_ST, &b);
    expect(&gen_fails(&d), &[GLM_ST, "header", &n.to_string()]);
}

#[test]
fn header_length_absurd() {
    let mut b = std::fs::read(data("glm52").join(GLM_ST)).unwrap();
    b[..8].copy_from_slice(&(1u64 << 63).to_le_bytes());
    let d = with_file("glm52", "hdr-absurd", GLM_ST, &b);
    expect(&gen_fails(&d), &[GLM_ST, "header"]);
}

#[test]
fn header_not_json() {
    let d = with_file(
        "glm52",
        "hdr-notjson",
        GLM_ST,
        &raw_safetensors(b"this is not json", &[]),
    );
    expect(&gen_fails(&d), &[GLM_ST, "JSON"]);
}

#[test]
fn header_not_utf8() {
    let d = with_file(
        "glm52",
        "hdr-utf8",
        GLM_ST,
        &raw_safetensors(b"{\"a\xff\xfe\": 1}", &[]),
    );
    expect(&gen_fails(&d), &[GLM_ST, "UTF-8"]);
}

#[test]
fn header_not_an_object() {
    let d = with_file(
        "glm52",
        "hdr-array",
        GLM_ST,
        &raw_safetensors(b"[1, 2]", &[]),
    );
    expect(&gen_fails(&d), &[GLM_ST]);
}

#[test]
fn empty_safetensors_file() {
    let d = with_file("glm52", "empty-st", GLM_ST, b"");
    expect(&gen_fails(&d), &[GLM_ST, "empty"]);
}

#[test]
fn offsets_out_of_bounds() {
    let d = with_header("off-oob", |h| {
        h["model.norm.weight"]["data_offsets"] = serde_json::json!([2_000_000, 2_000_176]);
    });
    expect(
        &gen_fails(&d),
        &[GLM_ST, "model.norm.weight", "data_offsets"],
    );
}

#[test]
fn offsets_overlapping() {
    let d = with_header("off-overlap", |h| {
        let other = h["model.layers.0.input_layernorm.weight"]["data_offsets"].clone();
        h["model.norm.weight"]["data_offsets"] = other;
    });
    expect(&gen_fails(&d), &[GLM_ST, "data_offsets"]);
}

#[test]
fn offsets_reversed() {
    let d = with_header("off-rev", |h| {
        let o = h["model.norm.weight"]["data_offsets"].clone();
        h["model.norm.weight"]["data_offsets"] = serde_json::json!([o[1], o[0]]);
    });
    expect(
        &gen_fails(&d),
        &[GLM_ST, "model.norm.weight", "data_offsets"],
    );
}

#[test]
fn data_size_disagrees_with_dtype_and_shape() {
    let d = with_header("size", |h| {
        h["model.norm.weight"]["shape"] = serde_json::json!([80]);
    });
    expect(&gen_fails(&d), &[GLM_ST, "model.norm.weight", "bytes"]);
}

#[test]
fn unknown_dtype() {
    let d = with_header("dtype-unknown", |h| {
        h["model.norm.weight"]["dtype"] = "Q7".into();
    });
    expect(&gen_fails(&d), &[GLM_ST, "Q7"]);
}

#[test]
fn shape_overflows() {
    let d = with_header("shape-overflow", |h| {
        h["model.norm.weight"]["shape"] = serde_json::json!([1u64 << 40, 1u64 << 40]);
    });
    expect(&gen_fails(&d), &[GLM_ST, "model.norm.weight"]);
}

// ---- tensors against config.json ----

#[test]
fn dtype_disagrees_with_config_i64_norm() {
    let d = with_tensors("glm52", "dtype-i64", |t| {
        let n = tensor(t, "model.norm.weight");
        n.dtype = "I64".into();
        n.data = vec![0; 88 * 8];
    });
    expect(&gen_fails(&d), &["model.norm.weight", GLM_ST, "I64"]);
}

#[test]
fn integer_matrix_without_quantization_config() {
    let d = with_tensors("glm52", "dtype-i8", |t| {
        let q = tensor(t, Q_A);
        q.dtype = "I8".into();
        q.data.truncate(44 * 88);
    });
    expect(&gen_fails(&d), &[Q_A, "I8", "quantization_config"]);
}

#[test]
fn shape_disagrees_with_config() {
    let d = with_tensors("glm52", "shape-t", |t| tensor(t, Q_A).shape = vec![88, 44]);
    expect(&gen_fails(&d), &[Q_A, "[88, 44]", "[44, 88]"]);
}

#[test]
fn missing_tensor() {
    let name = "model.layers.3.self_attn.o_proj.weight";
    let d = with_tensors("glm52", "missing", |t| t.retain(|x| x.name != name));
    expect(&gen_fails(&d), &[name, "missing"]);
}

#[test]
fn zero_length_tensor() {
    let d = with_tensors("glm52", "zero-len", |t| {
        let n = tensor(t, "model.norm.weight");
        n.shape = vec![0];
        n.data.clear();
    });
    expect(&gen_fails(&d), &["model.norm.weight", "[0]", "[88]"]);
}

#[test]
fn duplicate_tensor_across_shards() {
    let t = read_tensors(&data("glm52").join(GLM_ST));
    let dir = tmpdir("dup");
    copy_model(&data("glm52"), &dir);
    std::fs::remove_file(dir.join(GLM_ST)).unwrap();
    let (a, b) = t.split_at(t.len() / 2);
    let mut b = b.to_vec();
    b.push(a[0].clone());
    std::fs::write(dir.join("a.safetensors"), write_tensors(a)).unwrap();
    std::fs::write(dir.join("b.safetensors"), write_tensors(&b)).unwrap();
    expect(
        &gen_fails(&dir),
        &[&a[0].name, "a.safetensors", "b.safetensors", "twice"],
    );
}

#[test]
fn nan_in_f16_weight() {
    let d = with_tensors("glm52", "nan-f16", |t| poke(tensor(t, Q_A), 100, 0x7E00));
    expect(&gen_fails(&d), &[Q_A, GLM_ST, "100", "NaN"]);
}

#[test]
fn inf_in_f16_weight() {
    let name = "model.layers.4.mlp.experts.7.down_proj.weight";
    let d = with_tensors("glm52", "inf-f16", |t| poke(tensor(t, name), 5, 0xFC00));
    expect(&gen_fails(&d), &[name, GLM_ST, "element 5", "inf"]);
}

#[test]
fn nan_in_bf16_embedding() {
    let name = "model.embed_tokens.weight";
    let d = with_tensors("glm52-fp8", "nan-bf16", |t| {
        assert_eq!(tensor(t, name).dtype, "BF16");
        poke(tensor(t, name), 1234, 0x7FC1)
    });
    expect(&gen_fails(&d), &[name, GLM_ST, "1234", "NaN"]);
}

#[test]
fn nan_in_f32_vector() {
    let name = "model.layers.3.mlp.gate.e_score_correction_bias";
    let d = with_tensors("glm52", "nan-f32", |t| {
        poke(tensor(t, name), 3, 0x7FC0_0000)
    });
    expect(&gen_fails(&d), &[name, GLM_ST, "element 3", "NaN"]);
}

#[test]
fn nan_in_q8_scale() {
    let file = "model-00001-of-00002.safetensors";
    let name = "lm_head.weight_scale";
    let mut t = read_tensors(&data("dsv32-q8").join(file));
    poke(tensor(&mut t, name), 0, 0x7FC0);
    let d = with_file("dsv32-q8", "nan-q8", file, &write_tensors(&t));
    expect(&gen_fails(&d), &[name, file, "NaN"]);
}

#[test]
fn fp8_scale_of_the_wrong_shape() {
    let name = format!("{Q_A}_scale_inv");
    let d = with_tensors("glm52-fp8", "fp8-scale", |t| {
        let s = tensor(t, &name);
        let n: usize = s.shape.iter().product();
        s.shape = vec![n, 1];
    });
    expect(&gen_fails(&d), &[&name, "expected"]);
}

#[test]
fn fp8_weight_without_its_scale() {
    let name = format!("{Q_A}_scale_inv");
    let d = with_tensors("glm52-fp8", "fp8-noscale", |t| t.retain(|x| x.name != name));
    expect(&gen_fails(&d), &[Q_A, &name, "missing"]);
}

// ---- model.safetensors.index.json ----

fn index_variant(name: &str, edit: impl FnOnce(&mut String)) -> PathBuf {
    let dir = tmpdir(name);
    copy_model(&data("dsv32-q8"), &dir);
    let p = dir.join("model.safetensors.index.json");
    let mut s = std::fs::read_to_string(&p).unwrap();
    edit(&mut s);
    std::fs::write(&p, s).unwrap();
    dir
}

#[test]
fn index_names_a_missing_shard() {
    let d = index_variant("idx-missing", |s| {
        *s = s.replacen(
            "model-00002-of-00002.safetensors",
            "model-00003-of-00003.safetensors",
            1,
        )
    });
    expect(&gen_fails(&d), &["model-00003-of-00003.safetensors"]);
}

#[test]
fn index_path_traversal() {
    let d = index_variant("idx-traversal", |s| {
        *s = s.replacen(
            "model-00002-of-00002.safetensors",
            "../model-00002-of-00002.safetensors",
            1,
        )
    });
    expect(
        &gen_fails(&d),
        &[
            "model.safetensors.index.json",
            "../model-00002-of-00002.safetensors",
        ],
    );
}

#[test]
fn index_invalid_json() {
    let d = index_variant("idx-json", |s| s.truncate(s.len() / 2));
    expect(&gen_fails(&d), &["model.safetensors.index.json", "JSON"]);
}

#[test]
fn index_without_weight_map() {
    let d = index_variant("idx-nomap", |s| *s = s.replace("weight_map", "weights"));
    expect(
        &gen_fails(&d),
        &["model.safetensors.index.json", "weight_map"],
    );
}

#[test]
fn index_lists_a_tensor_in_the_wrong_shard() {
    let d = index_variant("idx-wrong", |s| {
        *s = s.replacen(
            "\"lm_head.weight\": \"model-00001-of-00002.safetensors\"",
            "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"",
            1,
        )
    });
    expect(
        &gen_fails(&d),
        &["lm_head.weight", "model-00002-of-00002.safetensors"],
    );
}

// ---- config.json ----

#[test]
fn config_invalid_json() {
    let d = with_file("glm52", "cfg-json", "config.json", b"{\"model_type\": ");
    expect(&gen_fails(&d), &["config.json", "JSON"]);
}

#[test]
fn config_not_utf8() {
    let d = with_file(
        "glm52",
        "cfg-utf8",
        "config.json",
        b"{\"model_type\": \"\xff\"}",
    );
    expect(&gen_fails(&d), &["config.json", "UTF-8"]);
}

#[test]
fn config_not_an_object() {
    let d = with_file("glm52", "cfg-array", "config.json", b"[1, 2, 3]");
    expect(&gen_fails(&d), &["config.json", "object"]);
}

#[test]
fn config_missing_field() {
    let d = variant("glm52", "cfg-missing", |c| {
        c.as_object_mut().unwrap().remove("vocab_size");
    });
    expect(&gen_fails(&d), &["config.json", "vocab_size", "missing"]);
}

#[test]
fn config_wrong_type() {
    let d = variant("glm52", "cfg-type", |c| c["hidden_size"] = "88".into());
    expect(&gen_fails(&d), &["config.json", "hidden_size", "integer"]);
}

#[test]
fn config_negative_dimension() {
    let d = variant("glm52", "cfg-neg", |c| c["num_hidden_layers"] = (-1).into());
    expect(&gen_fails(&d), &["config.json", "num_hidden_layers", "-1"]);
}

#[test]
fn config_zero_heads() {
    let d = variant("glm52", "cfg-zero", |c| c["num_attention_heads"] = 0.into());
    expect(
        &gen_fails(&d),
        &["config.json", "num_attention_heads", "positive"],
    );
}

#[test]
fn config_index_topk_zero() {
    let d = variant("glm52", "cfg-topk0", |c| c["index_topk"] = 0.into());
    expect(&gen_fails(&d), &["config.json", "index_topk"]);
}

#[test]
fn config_odd_rope_dim() {
    let d = variant("glm52", "cfg-rope", |c| c["qk_rope_head_dim"] = 15.into());
    expect(&gen_fails(&d), &["config.json", "qk_rope_head_dim", "even"]);
}

#[test]
fn config_experts_not_divisible_by_groups() {
    let d = variant("dsv32", "cfg-groups", |c| c["n_group"] = 5.into());
    expect(
        &gen_fails(&d),
        &["config.json", "n_routed_experts", "n_group"],
    );
}

#[test]
fn config_fractional_dimension() {
    let d = variant("glm52", "cfg-frac", |c| c["kv_lora_rank"] = 35.5.into());
    expect(&gen_fails(&d), &["config.json", "kv_lora_rank"]);
}

/// Absurd sizes are refused from config.json alone, before anything is allocated (a model
/// of these dimensions would need terabytes); the error names the field.
fn absurd(name: &str, field: &str, value: serde_json::Value) {
    let d = variant("glm52", name, |c| {
        c[field] = value;
        // Let the per-layer lists follow num_hidden_layers.
        c.as_object_mut().unwrap().remove("indexer_types");
        c.as_object_mut().unwrap().remove("mlp_layer_types");
    });
    expect(&gen_fails(&d), &["config.json", field]);
    // `info` reads the same config and must refuse it the same way, without a GPU.
    expect(&fails(&["info"], Some(&d)), &["config.json", field]);
}

#[test]
fn config_hidden_size_2_pow_40() {
    absurd("cfg-hidden", "hidden_size", (1u64 << 40).into());
}

#[test]
fn config_vocab_2_pow_50() {
    absurd("cfg-vocab", "vocab_size", (1u64 << 50).into());
}

#[test]
fn config_billion_layers() {
    absurd("cfg-layers", "num_hidden_layers", 1_000_000_000u64.into());
}

#[test]
fn config_billion_experts() {
    absurd("cfg-experts", "n_routed_experts", 1_000_000_000u64.into());
}

#[test]
fn config_huge_intermediate_size() {
    absurd("cfg-inter", "moe_intermediate_size", (1u64 << 36).into());
}

#[test]
fn config_huge_max_position_embeddings() {
    absurd(
        "cfg-maxpos",
        "max_position_embeddings",
        10_000_000_000_000u64.into(),
    );
}

#[test]
fn config_huge_index_topk() {
    absurd("cfg-topk", "index_topk", (1u64 << 39).into());
}

// ---- the model directory ----

#[test]
fn model_dir_is_a_file() {
    let d = data("glm52").join("config.json");
    expect(&gen_fails(&d), &["config.json", "not a directory"]);
}

#[cfg(unix)]
#[test]
fn model_dir_symlink_loop() {
    let dir = tmpdir("cycle-dir");
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    expect(
        &gen_fails(&a),
        &[&a.display().to_string(), "symbolic links"],
    );
}

#[cfg(unix)]
#[test]
fn config_symlink_loop() {
    let dir = tmpdir("cycle-cfg");
    copy_model(&data("glm52"), &dir);
    std::fs::remove_file(dir.join("config.json")).unwrap();
    std::os::unix::fs::symlink(dir.join("config.json"), dir.join("config.json")).unwrap();
    expect(&gen_fails(&dir), &["config.json", "symbolic links"]);
}

#[test]
fn shard_is_a_directory() {
    // A weight file that cannot be read (a directory: unreadable even by root).
    let dir = tmpdir("shard-dir");
    copy_model(&data("glm52"), &dir);
    std::fs::remove_file(dir.join(GLM_ST)).unwrap();
    std::fs::create_dir(dir.join(GLM_ST)).unwrap();
    expect(&gen_fails(&dir), &[GLM_ST, "not a file"]);
}

#[test]
fn directory_without_weights() {
    let dir = tmpdir("noweights");
    std::fs::copy(data("glm52").join("config.json"), dir.join("config.json")).unwrap();
    expect(&gen_fails(&dir), &["no weights", "model.safetensors"]);
}

#[test]
fn directory_without_tokenizer_given_a_prompt() {
    let e = fails(&["generate", "--prompt", "hello"], Some(&data("dsv32")));
    expect(&e, &["tokenizer.json", "--tokens"]);
}

/// The built-in model's directory (it has a tokenizer) with one file replaced.
fn bard_with(name: &str, file: &str, bytes: &[u8]) -> PathBuf {
    let dir = tmpdir(name);
    copy_model(&builtin_dir(), &dir);
    std::fs::write(dir.join(file), bytes).unwrap();
    dir
}

#[test]
fn tokenizer_json_corrupt() {
    let d = bard_with(
        "tok-corrupt",
        "tokenizer.json",
        b"{\"model\": {\"type\": \"BPE\"",
    );
    let e = fails(
        &["generate", "--prompt", "hi", "--max-tokens", "1"],
        Some(&d),
    );
    expect(&e, &["tokenizer.json"]);
}

#[test]
fn tokenizer_json_is_a_directory() {
    let dir = tmpdir("tok-dir");
    copy_model(&builtin_dir(), &dir);
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    std::fs::create_dir(dir.join("tokenizer.json")).unwrap();
    let e = fails(
        &["generate", "--prompt", "hi", "--max-tokens", "1"],
        Some(&dir),
    );
    expect(&e, &["tokenizer.json"]);
}

fn chat_fails(dir: &Path, stdin: &[u8], extra: &[&str]) -> String {
    let mut c = bin();
    c.args(["chat", "--temperature", "0", "--max-tokens", "2"])
        .args(extra)
        .arg("--model")
        .arg(dir);
    one_error("chat", &run_with_timeout(c, Some(stdin)))
}

#[test]
fn tokenizer_config_corrupt() {
    let d = bard_with(
        "tokcfg-corrupt",
        "tokenizer_config.json",
        b"{\"chat_template\": ",
    );
    expect(&chat_fails(&d, b"hi\n", &[]), &["tokenizer_config.json"]);
}

fn bard_template(name: &str, template: &str) -> PathBuf {
    let dir = tmpdir(name);
    copy_model(&builtin_dir(), &dir);
    std::fs::write(dir.join("chat_template.jinja"), template).unwrap();
    dir
}

#[test]
fn chat_template_raises() {
    let d = bard_template("tpl-raise", "{{ raise_exception('no chatting today') }}");
    expect(
        &chat_fails(&d, b"hi\n", &[]),
        &["chat template", "no chatting today"],
    );
}

#[test]
fn chat_template_syntax_error() {
    let d = bard_template("tpl-syntax", "{% for m in messages %}{{ m.content }");
    expect(&chat_fails(&d, b"hi\n", &[]), &["chat_template.jinja"]);
}

#[test]
fn chat_template_runs_forever() {
    let d = bard_template(
        "tpl-loop",
        "{% for a in range(10000) %}{% for b in range(10000) %}{% for c in range(10000) %}{% endfor %}{% endfor %}{% endfor %}",
    );
    expect(&chat_fails(&d, b"hi\n", &[]), &["chat template"]);
}

#[test]
fn chat_template_recurses_forever() {
    let d = bard_template(
        "tpl-recurse",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    );
    expect(&chat_fails(&d, b"hi\n", &[]), &["chat template"]);
}

#[test]
fn chat_invalid_utf8_on_stdin() {
    let e = chat_fails(&builtin_dir(), b"hi \xff\xfe there\n", &[]);
    expect(&e, &["stdin", "UTF-8"]);
}

#[test]
fn chat_message_longer_than_the_context() {
    let long = "word ".repeat(400) + "\n";
    let e = chat_fails(&builtin_dir(), long.as_bytes(), &["--ctx", "64"]);
    expect(&e, &["--ctx 64", "too long"]);
}

// ---- prompts and flags ----

#[test]
fn empty_prompt() {
    expect(
        &fails(&["generate", "--prompt", ""], None),
        &["--prompt", "empty"],
    );
}

#[test]
fn empty_token_list() {
    expect(
        &fails(&["generate", "--tokens", ","], Some(&data("glm52"))),
        &["--tokens"],
    );
}

#[test]
fn prompt_longer_than_the_context() {
    let e = fails(
        &[
            "generate",
            "--prompt",
            "KING RICHARD: now is the winter",
            "--ctx",
            "4",
            "--max-tokens",
            "1",
        ],
        None,
    );
    expect(&e, &["--ctx 4", "needs"]);
}

#[test]
fn max_tokens_zero() {
    expect(
        &fails(&["generate", "--max-tokens", "0"], None),
        &["--max-tokens"],
    );
}

#[test]
fn ctx_zero() {
    expect(
        &fails(&["generate", "--ctx", "0", "--max-tokens", "1"], None),
        &["--ctx"],
    );
}

#[test]
fn token_id_out_of_range() {
    let e = fails(&["generate", "--tokens", "3,2290,1"], Some(&data("dsv32")));
    expect(&e, &["2290", "vocab"]);
}

#[test]
fn token_id_not_a_number() {
    expect(
        &fails(&["generate", "--tokens", "1,two,3"], Some(&data("dsv32"))),
        &["--tokens", "two"],
    );
}

#[test]
fn unknown_flag() {
    expect(
        &fails(&["generate", "--prompt", "x", "--frobnicate"], None),
        &["--frobnicate"],
    );
}

#[test]
fn unknown_command() {
    expect(&fails(&["summon"], None), &["summon"]);
}

#[test]
fn ctx_not_a_number() {
    expect(
        &fails(&["generate", "--ctx", "abc"], None),
        &["--ctx", "abc"],
    );
}

#[test]
fn temperature_negative() {
    expect(
        &fails(&["generate", "--temperature=-1", "--max-tokens", "1"], None),
        &["--temperature", "-1"],
    );
}

#[test]
fn temperature_nan() {
    expect(
        &fails(
            &["generate", "--temperature", "NaN", "--max-tokens", "1"],
            None,
        ),
        &["--temperature", "NaN"],
    );
}

#[test]
fn top_p_above_one() {
    expect(
        &fails(&["generate", "--top-p", "2", "--max-tokens", "1"], None),
        &["--top-p", "2"],
    );
}

#[test]
fn chat_top_p_zero() {
    let e = chat_fails(&builtin_dir(), b"hi\n", &["--top-p", "0"]);
    expect(&e, &["--top-p", "0"]);
}

#[cfg(unix)]
#[test]
fn invalid_utf8_argument() {
    use std::os::unix::ffi::OsStrExt;
    let mut c = bin();
    c.args(["generate", "--prompt"])
        .arg(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    let e = one_error("invalid UTF-8 --prompt", &run_with_timeout(c, None));
    expect(&e, &["--prompt", "UTF-8"]);
}

#[test]
fn quantize_truncated_source() {
    let b = std::fs::read(data("glm52").join(GLM_ST)).unwrap();
    let d = with_file("glm52", "quant-trunc", GLM_ST, &b[..b.len() - 10]);
    let out = tmpdir("quant-trunc-out").join("q");
    let e = fails(
        &["quantize", "--format", "q8", "--out", out.to_str().unwrap()],
        Some(&d),
    );
    expect(&e, &[GLM_ST, "truncated"]);
}

#[test]
fn quantize_bad_block() {
    let out = tmpdir("quant-block").join("q");
    let e = fails(
        &[
            "quantize",
            "--format",
            "q8",
            "--block",
            "7",
            "--out",
            out.to_str().unwrap(),
        ],
        Some(&data("glm52")),
    );
    expect(&e, &["--block", "7"]);
}

const HUGE: &str = "18446744073709551615";

#[test]
fn max_tokens_overflowing_the_context() {
    let e = fails(&["generate", "--max-tokens", HUGE], None);
    expect(&e, &["--max-tokens", HUGE]);
}

#[test]
fn ctx_huge() {
    let e = fails(&["generate", "--ctx", HUGE, "--max-tokens", "1"], None);
    expect(
        &e,
        &[
            &format!("--ctx {HUGE}"),
            "positions than the GPU kernels index",
        ],
    );
}

#[test]
fn chat_ctx_huge() {
    let e = chat_fails(&builtin_dir(), b"hi\n", &["--ctx", HUGE]);
    expect(&e, &[&format!("--ctx {HUGE}")]);
}

#[test]
fn info_with_a_huge_ctx_reports_without_overflow() {
    // Not an error: `info` only reports what the caches would take.
    let mut c = bin();
    c.args(["info", "--ctx", HUGE]);
    let out = run_with_timeout(c, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("memory plan at --ctx {HUGE}")),
        "{text}"
    );
}
