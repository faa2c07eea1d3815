//! Whole-model checks against transformers 5.24.0 (eager, f32) goldens made by
//! `tests/reference/make_goldens.py`: tiny random-weight GLM-5-style (all layers full),
//! GLM-5.2-style (IndexShare) and DeepSeek-V3.2-style (router groups, YaRN) models whose
//! `index_topk` is much smaller than the prompts, so sparse attention really selects.
//!
//! Tolerance: the engine and transformers both compute in f32 but sum in different orders
//! (tiled matmuls, absorbed vs expanded MLA, online softmax), so logits differ by float
//! rounding that grows through the layers. Measured on lavapipe: max |Δ| 2.3e-5 (glm5),
//! 2.8e-5 (glm52), 4.6e-5 (dsv32) on logits of magnitude O(1). We allow
//! |Δ| ≤ 5e-4 + 1e-4·|ref|: ~10× the rounding we see, and far below what a wrong kernel or
//! a single changed top-k choice causes (≥ 0.05, see the dense-vs-sparse check below).

mod common;

use sparsa::experts::{CpuExperts, Policy};
use sparsa::gpu::Gpu;
use sparsa::model::{Model, ModelSource};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The adapter, its GEMMs exact (`Gpu::set_exact_gemms`): the tolerance holds f32 rounding,
/// which x as one f16 value (q4's default on tensor cores) exceeds; `fast_gpu` checks that.
fn gpu() -> Arc<Gpu> {
    static G: OnceLock<Arc<Gpu>> = OnceLock::new();
    G.get_or_init(|| {
        let g = Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter");
        g.set_exact_gemms(true);
        Arc::new(g)
    })
    .clone()
}

/// The adapter as users get it (GEMMs not exact: on tensor cores, q4's take x as one f16
/// value).
fn fast_gpu() -> Arc<Gpu> {
    static G: OnceLock<Arc<Gpu>> = OnceLock::new();
    G.get_or_init(|| {
        Arc::new(Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter"))
    })
    .clone()
}

fn data(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(family)
}

pub struct Reference {
    pub prompts: Vec<Vec<u32>>,
    pub logits: Vec<Vec<f32>>,
    pub dense: Vec<Vec<f32>>,
    pub greedy: Vec<Vec<u32>>,
}

fn reference(family: &str) -> Reference {
    let bytes =
        std::fs::read(data(family).join("reference.safetensors")).expect("reference.safetensors");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid reference file");
    let f32s = |n: &str| -> Vec<f32> { bytemuck::pod_collect_to_vec(st.tensor(n).unwrap().data()) };
    let ids = |n: &str| -> Vec<u32> {
        let v: Vec<i32> = bytemuck::pod_collect_to_vec(st.tensor(n).unwrap().data());
        v.into_iter().map(|x| x as u32).collect()
    };
    let mut r = Reference {
        prompts: vec![],
        logits: vec![],
        dense: vec![],
        greedy: vec![],
    };
    let mut i = 0;
    while st.tensor(&format!("tokens_{i}")).is_ok() {
        r.prompts.push(ids(&format!("tokens_{i}")));
        r.logits.push(f32s(&format!("logits_{i}")));
        r.dense.push(f32s(&format!("logits_dense_{i}")));
        r.greedy.push(ids(&format!("greedy_{i}")));
        i += 1;
    }
    assert!(i > 0, "{family}: no prompts in the reference");
    r
}

fn argmax(v: &[f32]) -> usize {
    sparsa::generate::argmax(v) as usize
}

/// How far `got` is from `want`: max |Δ|, and the largest multiple of the tolerance
/// (5e-4 + 1e-4·|ref|, see the top) with the index of its logit. Panics on a length mismatch
/// or a logit that is not finite.
fn distance(what: &str, got: &[f32], want: &[f32]) -> (f32, f32, usize) {
    assert_eq!(got.len(), want.len(), "{what}: logits length");
    let (mut max, mut over, mut at) = (0f32, 0f32, 0);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        assert!(d.is_finite(), "{what}: logit {i} is {g}, want {w}");
        let o = d / (5e-4 + 1e-4 * w.abs());
        if o > over {
            (over, at) = (o, i);
        }
        max = max.max(d);
    }
    (max, over, at)
}

/// The positions (rows of `vocab` logits) whose argmax differs, as failures of `what`.
fn argmax_flips(what: &str, got: &[f32], want: &[f32], vocab: usize) -> Vec<String> {
    got.chunks(vocab)
        .zip(want.chunks(vocab))
        .enumerate()
        .filter(|(_, (g, w))| argmax(g) != argmax(w))
        .map(|(t, _)| format!("{what}: argmax differs at position {t}"))
        .collect()
}

/// max |Δ|. A logit past the tolerance (the worst one) and each position whose argmax
/// differs are added to `fails`, so that one run reports every disagreement.
fn compare(what: &str, got: &[f32], want: &[f32], vocab: usize, fails: &mut Vec<String>) -> f32 {
    let (max, over, i) = distance(what, got, want);
    if over > 1.0 {
        fails.push(format!(
            "{what}: logit [{}, {}] = {}, want {} ({over:.1}× the tolerance; max |Δ| {max:.3e})",
            i / vocab,
            i % vocab,
            got[i],
            want[i]
        ));
    }
    fails.extend(argmax_flips(what, got, want, vocab));
    max
}

/// From a reset session: the greedy continuation of `prompt` is `want` (else a failure).
fn check_greedy(
    s: &mut sparsa::model::Session,
    prompt: &[u32],
    want: &[u32],
    what: &str,
    fails: &mut Vec<String>,
) {
    s.reset();
    let mut sampler = sparsa::generate::Sampler::new(Default::default());
    let (out, _) =
        sparsa::generate::generate(s, prompt, want.len(), &mut sampler, &[], |_| true).unwrap();
    if out != want {
        fails.push(format!(
            "{what}: greedy continuation {out:?}, want {want:?}"
        ));
    }
}

/// Panics with every failure `fails` holds.
fn pass(family: &str, fails: Vec<String>) {
    assert!(fails.is_empty(), "{family}:\n{}", fails.join("\n"));
}

fn check_family(family: &str) {
    let r = reference(family);
    let model = Model::load(&data(family), gpu(), &mut |_, _| {}).expect("model loads");
    let vocab = model.config.vocab_size;
    let mut worst = 0f32;
    let mut fails = vec![];
    for (i, prompt) in r.prompts.iter().enumerate() {
        // Prefill logits for every position.
        let mut s = model.session(prompt.len() + r.greedy[i].len()).unwrap();
        let got = s.forward(prompt, true).unwrap();
        worst = worst.max(compare(
            &format!("{family} prompt {i}"),
            &got.data,
            &r.logits[i],
            vocab,
            &mut fails,
        ));
        // The same prompt prefilled in chunks of 13 rows (chunks see keys cached by earlier
        // chunks, and cross index_topk mid-prompt).
        s.reset();
        s.chunk = 13;
        let got = s.forward(prompt, true).unwrap();
        worst = worst.max(compare(
            &format!("{family} prompt {i} in chunks"),
            &got.data,
            &r.logits[i],
            vocab,
            &mut fails,
        ));
        // Greedy continuation with the caches, token by token.
        let what = format!("{family} prompt {i}");
        check_greedy(&mut s, prompt, &r.greedy[i], &what, &mut fails);
    }
    eprintln!("{family}: max |Δlogit| vs transformers = {worst:.3e}");
    pass(family, fails);
}

/// The default GEMMs (`fast_gpu`: on tensor cores, x as one f16 value for q4 weights, the
/// 128-row tile) against transformers. x's rounding (2^-11 relative) exceeds the f32
/// tolerance by design, and on these random-weight models it flips an index top-k choice or
/// an argmax at near ties (H100, 2026-12-07: one position of 194, max |Δ| 0.79), so this
/// asks for the same greedy tokens and the same argmax at 99 % of positions, and prints the
/// logits' distance as a multiple of the tolerance (BENCHMARKS.md has the figures; the
/// trained built-in model's q4 quality both ways is in docs/QUANTIZATION.md). Adapters
/// without tensor cores compute exactly either way.
fn check_default_gemms(family: &str) {
    let r = reference(family);
    let model = Model::load(&data(family), fast_gpu(), &mut |_, _| {}).expect("model loads");
    let vocab = model.config.vocab_size;
    let (mut worst, mut over, mut positions) = (0f32, 0f32, 0usize);
    let (mut flips, mut fails) = (vec![], vec![]);
    for (i, prompt) in r.prompts.iter().enumerate() {
        let mut s = model.session(prompt.len() + r.greedy[i].len()).unwrap();
        let got = s.forward(prompt, true).unwrap();
        let what = format!("{family} prompt {i}, default GEMMs");
        let (max, o, _) = distance(&what, &got.data, &r.logits[i]);
        (worst, over) = (worst.max(max), over.max(o));
        positions += prompt.len();
        flips.extend(argmax_flips(&what, &got.data, &r.logits[i], vocab));
        check_greedy(&mut s, prompt, &r.greedy[i], &what, &mut fails);
    }
    eprintln!(
        "{family}, default GEMMs ({}): max |Δlogit| vs transformers = {worst:.3e}, {over:.1}× the f32 tolerance; argmax differs at {} of {positions} positions",
        fast_gpu().adapter.line(),
        flips.len()
    );
    if flips.len() * 100 > positions {
        fails.extend(flips);
    }
    pass(family, fails);
}

#[test]
fn glm52_q4_default_gemms_keep_greedy_tokens() {
    check_default_gemms("glm52-q4");
}

/// Hybrid expert execution (`--cpu-experts on`, issue 22) against transformers: one GPU
/// slot per MoE layer and the prompts fed in chunks of 5 rows (at most 16 take the hybrid
/// path), so nearly every routed expert of the prefill and of the greedy continuation runs
/// on the CPU. Same tolerance, same argmax, same greedy tokens.
fn check_cpu_experts(family: &str) {
    let r = reference(family);
    let src = ModelSource::open(&data(family)).expect("model source");
    let ctx = r
        .prompts
        .iter()
        .zip(&r.greedy)
        .map(|(p, g)| p.len() + g.len())
        .max()
        .unwrap_or(1);
    let mut b = common::budget(&src, &gpu(), ctx, 1, Policy::Lru);
    b.cpu = CpuExperts::On;
    let model = Model::from_source_within(&src, gpu(), &mut |_, _| {}, Some(&b)).expect("loads");
    let off = model.offload.as_ref().expect("experts stream");
    let vocab = model.config.vocab_size;
    let mut worst = 0f32;
    let mut fails = vec![];
    for (i, prompt) in r.prompts.iter().enumerate() {
        let mut s = model.session(ctx).unwrap();
        s.chunk = 5;
        let got = s.forward(prompt, true).unwrap();
        let what = format!("{family} prompt {i}, CPU experts");
        worst = worst.max(compare(&what, &got.data, &r.logits[i], vocab, &mut fails));
        check_greedy(&mut s, prompt, &r.greedy[i], &what, &mut fails);
    }
    pass(family, fails);
    let st = off.stats();
    assert!(
        st.cpu_pairs * 2 > st.uses,
        "most pairs ran on the CPU: {st:?}"
    );
    eprintln!(
        "{family} with CPU experts ({} of {} pairs): max |Δlogit| vs transformers = {worst:.3e}",
        st.cpu_pairs, st.uses
    );
}

#[test]
fn glm52_with_cpu_experts_matches_transformers() {
    check_cpu_experts("glm52");
}

// A test of its own (the slowest of the goldens on lavapipe: the test threads run it beside
// the glm52 one).
#[test]
fn dsv32_with_cpu_experts_matches_transformers() {
    check_cpu_experts("dsv32");
}

#[test]
fn q4_and_fp8_experts_on_the_cpu_match_transformers() {
    check_cpu_experts("glm52-q4");
    check_cpu_experts("dsv32-fp8");
}

/// The same weights with index_topk ≥ the prompt are dense: they must match transformers'
/// dense logits, and differ clearly from the sparse ones (top-k really selects).
fn check_dense(family: &str) {
    let r = reference(family);
    let dir = data(family);
    let mut cfg = sparsa::config::Config::from_dir(&dir).unwrap();
    cfg.index_topk = 1 << 20;
    let files = sparsa::weights::WeightFiles::open(&dir).unwrap();
    let model = Model::from_parts(
        cfg,
        &files,
        gpu(),
        dir.display().to_string(),
        &mut |_, _| {},
    )
    .unwrap();
    let vocab = model.config.vocab_size;
    let mut fails = vec![];
    for (i, prompt) in r.prompts.iter().enumerate() {
        let mut s = model.session(prompt.len()).unwrap();
        let got = s.forward(prompt, true).unwrap();
        compare(
            &format!("{family} dense prompt {i}"),
            &got.data,
            &r.dense[i],
            vocab,
            &mut fails,
        );
        let diff = got
            .data
            .iter()
            .zip(&r.logits[i])
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            diff > 0.05,
            "{family} prompt {i}: dense and sparse logits differ by only {diff}"
        );
    }
    pass(family, fails);
}

#[test]
fn glm5_matches_transformers() {
    check_family("glm5");
}

#[test]
fn glm52_indexshare_matches_transformers() {
    check_family("glm52");
}

#[test]
fn dsv32_matches_transformers() {
    check_family("dsv32");
}

#[test]
fn glm5_dense_topk_changes_output() {
    check_dense("glm5");
}

#[test]
fn glm52_dense_topk_changes_output() {
    check_dense("glm52");
}

#[test]
fn dsv32_dense_topk_changes_output() {
    check_dense("dsv32");
}

/// FP8 releases as shipped (e4m3 weights, 128×128 `_scale_inv` blocks with partial blocks at
/// the edges, special codes): transformers ran on exactly these weights (dequantized in
/// f32 by `make_fp8_goldens.py`, since its CPU FP8 loader mishandles partial blocks), so
/// the f32 tolerance applies unchanged.
#[test]
fn glm52_fp8_matches_transformers() {
    check_family("glm52-fp8");
}

#[test]
fn dsv32_fp8_sharded_matches_transformers() {
    check_family("dsv32-fp8");
}

/// sparsa's own q8 / q4 formats as `sparsa quantize` writes them (row blocks of 32 with
/// partial tails, bf16 scales, q4 nibbles), made by `tests/reference/make_quant_goldens.py`:
/// transformers ran on exactly the dequantized weights, so the f32 tolerance applies.
#[test]
fn glm52_q4_matches_transformers() {
    check_family("glm52-q4");
}

#[test]
fn dsv32_q8_sharded_matches_transformers() {
    check_family("dsv32-q8");
}

#[test]
fn glm52_q4_dense_topk_changes_output() {
    check_dense("glm52-q4");
}

#[test]
fn dsv32_q8_dense_topk_changes_output() {
    check_dense("dsv32-q8");
}

/// `sparsa quantize` on the committed bf16 source reproduces the committed q8 / q4
/// directory byte for byte (weights, scales, shards, index, config.json).
fn quantize_reproduces(family: &str) {
    let dir = data(family);
    let info: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("reference.json")).expect("reference.json"),
    )
    .expect("valid reference.json");
    let q = &info["quantization"];
    let flags: Vec<&str> = q["quantize_flags"]
        .as_array()
        .expect("quantize_flags")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let out = std::env::temp_dir().join(format!("sparsa-golden-{}-{family}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_sparsa"))
        .arg("quantize")
        .arg("--model")
        .arg(dir.join("source"))
        .arg("--out")
        .arg(&out)
        .args(&flags)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "sparsa quantize failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let want = q["quantized_sha256"].as_object().expect("quantized_sha256");
    let mut written: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    written.sort();
    let mut listed: Vec<String> = want.keys().cloned().collect();
    listed.sort();
    assert_eq!(
        written, listed,
        "{family}: files written by sparsa quantize"
    );
    for f in &written {
        let got = std::fs::read(out.join(f)).unwrap();
        let committed = std::fs::read(dir.join(f)).unwrap();
        assert!(
            got == committed,
            "{family}: {f} differs from the committed file"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn glm52_q4_quantize_is_reproducible() {
    quantize_reproduces("glm52-q4");
}

#[test]
fn dsv32_q8_quantize_is_reproducible() {
    quantize_reproduces("dsv32-q8");
}
