//! `sparsa info` before downloading: a directory holding only a release's `config.json`
//! (perhaps with its shard index) is planned from the config — parameters, bytes per format,
//! the `--gpu-memory` plan — with the tensor list `sparsa synth` writes; and a directory with
//! a bad or missing config is a clear error naming the file. `SPARSA_INFO_KEEP=DIR` keeps
//! the three releases' full-depth config.json files in DIR/<release>/ (docs/REAL_MODELS.md's
//! figures are `sparsa info` on them).

mod common;

use common::{bin, run_with_timeout, tmpdir};
use serde_json::{json, Value};
use sparsa::config::Config;
use sparsa::model::info::summarize_tensors;
use sparsa::synth::{check_index, has_weights, plan, release_config, tensor_list, ConfigDir, Like};
use sparsa::weights::QFormat;
use std::path::{Path, PathBuf};

/// The release's `config.json` at full depth: 78 layers (GLM-5, 5.2) or 61 (DeepSeek-V3.2),
/// the first 3 dense, 256 routed experts.
fn release(like: Like) -> Value {
    let layers = match like {
        Like::DeepseekV32 => 61,
        _ => 78,
    };
    let mut j = release_config(like, layers, None, false).unwrap().json;
    let types: Vec<&str> = (0..layers)
        .map(|i| if i < 3 { "dense" } else { "sparse" })
        .collect();
    j["first_k_dense_replace"] = json!(3);
    j["mlp_layer_types"] = json!(types);
    j.as_object_mut().unwrap().remove("sparsa_synth");
    j
}

/// A directory holding only `config.json`.
fn config_dir(name: &str, config: &Value) -> PathBuf {
    let d = tmpdir(name);
    std::fs::write(
        d.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    d
}

fn info(dir: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut c = bin();
    c.args(["info", "--model"]).arg(dir).args(extra);
    let out = run_with_timeout(c, None);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const FORMATS: [Option<QFormat>; 4] = [
    None,
    Some(QFormat::Fp8),
    Some(QFormat::Q8 { block: 32 }),
    Some(QFormat::Q4 { block: 32 }),
];

/// Each release's config alone gives the parameters and bytes of `sparsa synth`'s plan for
/// the same config, in every format; GLM-5 is the published 744B / ~40.8B active.
#[test]
fn config_only_dirs_are_planned_like_synth() {
    for like in Like::ALL {
        let j = release(like);
        let d = config_dir(&format!("cfg-{}", like.name()), &j);
        if let Some(keep) = std::env::var_os("SPARSA_INFO_KEEP") {
            let k = Path::new(&keep).join(like.name());
            std::fs::create_dir_all(&k).unwrap();
            std::fs::copy(d.join("config.json"), k.join("config.json")).unwrap();
        }
        assert!(!has_weights(&d));
        let cd = ConfigDir::open(&d).unwrap();
        assert!(cd.index.is_none());
        assert_eq!(cd.stored_format(), None, "{}: bf16 release", like.name());
        let mut file_bytes = Vec::new();
        for f in FORMATS {
            let mut cfg: Config = cd.config.clone();
            cfg.quant = f;
            let s = summarize_tensors(&cfg, &tensor_list(&cfg, f).unwrap()).unwrap();
            let p = plan(&j, f, 4_000_000_000).unwrap();
            assert_eq!(s.params_total, p.params, "{} {f:?}", like.name());
            let bytes: u64 = s.classes.iter().map(|c| c.file_bytes).sum();
            assert_eq!(bytes, p.bytes, "{} {f:?}", like.name());
            assert_eq!(s.skipped_tensors, 0);
            file_bytes.push(bytes);
            if like == Like::Glm5 {
                // The published ~40.8B active leaves out the input embedding table (a token
                // reads one row of it); sparsa's count includes it.
                let table = (cfg.vocab_size * cfg.hidden_size) as f64 / 1e9;
                let (b, a) = (s.params_total as f64 / 1e9, s.params_active as f64 / 1e9);
                assert!((b - 744.0).abs() < 7.0, "GLM-5 total {b}B");
                assert!((a - table - 40.8).abs() < 0.3, "GLM-5 active {a}B");
            }
        }
        // bf16 > q8 > fp8 > q4: q8 has a bf16 scale per 32 columns, FP8 an f32 one per
        // 128×128 block; q4 is about 4.5 bits per quantized weight.
        let [bf16, fp8, q8, q4] = file_bytes[..] else {
            unreachable!()
        };
        assert!(
            q4 < fp8 && fp8 < q8 && q8 < bf16,
            "{}: {file_bytes:?}",
            like.name()
        );
        assert!(
            q4 < bf16 * 3 / 10 && fp8 > bf16 / 2,
            "{}: {file_bytes:?}",
            like.name()
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// The binary plans a config-only GLM-5.2 directory in the format asked for, without a
/// weight file; the figures it prints are the library's.
#[test]
fn info_on_a_config_only_dir_prints_the_plan() {
    let j = release(Like::Glm52);
    let d = config_dir("cli-glm52", &j);
    let (ok, out, err) = info(
        &d,
        &["--format", "q4", "--gpu-memory", "80GiB", "--ctx", "131072"],
    );
    assert!(ok && !err.contains("panicked"), "{err}\n{out}");
    let p = plan(&j, Some(QFormat::Q4 { block: 32 }), 4_000_000_000).unwrap();
    for want in [
        "config.json only".to_string(),
        format!("parameters: {:.2}B total", p.params as f64 / 1e9),
        "planned as q4 (block 32) (--format".into(),
        format!(
            "  {:<22} {:>12}",
            "q4 (block 32)",
            format!("{:.1} GB", p.bytes as f64 / 1e9)
        ),
        "memory plan at --ctx 131072".into(),
        "GPU memory plan for 80.00 GiB".into(),
        "fits this adapter: ".into(),
    ] {
        assert!(out.contains(&want), "no {want:?} in:\n{out}");
    }
    // Without --format: bf16 (no index, no quantization_config); the default context is
    // the model's max_position_embeddings.
    let (ok, out, err) = info(&d, &[]);
    assert!(ok, "{err}");
    assert!(
        out.contains("planned as bf16 (no shard index or quantization_config")
            && out.contains("memory plan at --ctx 1048576")
            && out.contains("fits this adapter: "),
        "{out}"
    );
    // A budget too small for the non-expert part is a "no" with the context that would fit.
    let (ok, out, err) = info(&d, &["--format", "q4", "--gpu-memory", "20GiB"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("fits this adapter: no") && out.contains("--ctx"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// With the shard index of an FP8 release (names only; the MTP layer's tensors listed too),
/// the index's format is the default, its names are checked against the config's, and a
/// download in progress (one shard of two) is still planned from the config.
#[test]
fn the_shard_index_gives_the_format_and_is_checked() {
    let mut j = release(Like::DeepseekV32);
    j["quantization_config"] = json!({"quant_method": "fp8", "fmt": "e4m3",
        "activation_scheme": "dynamic", "weight_block_size": [128, 128]});
    let d = config_dir("index-dsv32", &j);
    let cfg = ConfigDir::open(&d).unwrap().config;
    let list = tensor_list(&cfg, Some(QFormat::Fp8)).unwrap();
    let mut map = serde_json::Map::new();
    for (i, t) in list.iter().enumerate() {
        let shard = if i < list.len() / 2 { 1 } else { 2 };
        map.insert(
            t.name.clone(),
            format!("model-0000{shard}-of-00002.safetensors").into(),
        );
    }
    let mtp = [
        "model.layers.61.eh_proj.weight",
        "model.layers.61.enorm.weight",
    ];
    for n in mtp {
        map.insert(n.into(), "model-00002-of-00002.safetensors".into());
    }
    let total: u64 = list.iter().map(|t| t.bytes).sum::<u64>() + 1_000_000;
    let index = json!({"metadata": {"total_size": total}, "weight_map": map});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    std::fs::write(d.join("model-00001-of-00002.safetensors"), b"").unwrap();
    assert!(!has_weights(&d), "one shard of two is not a model");
    let cd = ConfigDir::open(&d).unwrap();
    let ix = cd.index.as_ref().unwrap();
    assert_eq!((ix.shards.len(), ix.shards_present), (2, 1));
    assert_eq!(ix.total_size, Some(total));
    assert_eq!(cd.stored_format(), Some(QFormat::Fp8));
    let check = check_index(&cd.config, ix, &list);
    assert!(check.matches() && check.past_layers == 2, "{check:?}");
    // A name the config implies but the index lacks is reported.
    let fewer: Vec<_> = list[1..].to_vec();
    let mut ix2 = ix.clone();
    ix2.names.retain(|n| n != &list[0].name);
    assert_eq!(
        check_index(&cd.config, &ix2, &fewer).missing,
        Vec::<String>::new()
    );
    assert_eq!(
        check_index(&cd.config, &ix2, &list).missing,
        vec![list[0].name.clone()]
    );

    let (ok, out, err) = info(&d, &["--ctx", "4096"]);
    assert!(ok, "{err}\n{out}");
    for want in [
        "planned as fp8 (128×128 blocks) (the shard index",
        "(1 present here)",
        "every tensor the config implies is in the index",
        "2 more past layer 60",
        "leaving 1.0 MB for the tensors past them",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A directory without config.json, or with a config that is not JSON or lacks a field, is
/// a one-line error naming the file.
#[test]
fn bad_or_missing_config_is_a_clear_error() {
    let d = tmpdir("info-noconfig");
    let (ok, _, err) = info(&d, &[]);
    assert!(
        !ok && err.contains("config.json") && !err.contains("panicked"),
        "{err}"
    );

    std::fs::write(d.join("config.json"), "{ not json").unwrap();
    let (ok, _, err) = info(&d, &["--format", "q4"]);
    assert!(
        !ok && err.contains(&d.join("config.json").display().to_string())
            && err.contains("invalid JSON")
            && !err.contains("panicked"),
        "{err}"
    );

    let mut j = release(Like::Glm5);
    j.as_object_mut().unwrap().remove("hidden_size");
    std::fs::write(d.join("config.json"), j.to_string()).unwrap();
    let (ok, _, err) = info(&d, &[]);
    assert!(
        !ok && err.contains("config.json")
            && err.contains("hidden_size")
            && !err.contains("panicked"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

fn info_builtin(extra: &[&str], env: &[(&str, &str)]) -> String {
    let mut c = bin();
    c.arg("info").args(extra).envs(env.iter().copied());
    let out = run_with_timeout(c, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `sparsa info --ctx N` prints the caches at N in the format used, a line per cache format
/// with its bytes per token and the longest context it fits in the adapter's memory, and
/// chat's default context; the old one-binding limit is gone (caches span bindings).
#[test]
fn info_prints_every_cache_format_and_the_context_it_fits() {
    use sparsa::cache::{CacheFormat, Caches};
    let mut cfg = Config::from_dir(&common::builtin_dir()).unwrap();
    // info describes a run without --draft: no caches for the MTP layer.
    cfg.keep_mtp(false);
    let out = info_builtin(&["--ctx", "4096"], &[]);
    let per = |f| Caches::bytes_per_token(&cfg, f);
    assert!(
        out.contains("caches f32/f32 (auto: the most precise whose caches fit the adapter's")
            && out.contains(&format!("{} B per token", per(CacheFormat::F32)))
            && out.contains("cache formats: bytes per token, and the longest context"),
        "{out}"
    );
    for f in CacheFormat::LADDER {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("  {:<10} ", f.name())))
            .unwrap_or_else(|| panic!("no line for {}: {out}", f.name()));
        assert!(
            line.contains(&format!(" {} B/token  fits ", per(f))),
            "{line}"
        );
        assert_eq!(line.ends_with("<- used"), f == CacheFormat::F32, "{line}");
    }
    assert!(
        out.contains(
            "chat's default context (without --ctx): 1024 (the built-in model's training length)"
        ),
        "{out}"
    );
    assert!(!out.contains("binding allows"), "{out}");

    // --cache-type names the format used, and the plan under a budget reserves its caches.
    let out = info_builtin(
        &[
            "--ctx",
            "4096",
            "--cache-type",
            "fp8/i8",
            "--gpu-memory",
            "1GiB",
        ],
        &[],
    );
    assert!(
        out.contains("caches fp8/i8 (--cache-type)")
            && out.contains("GPU memory plan for 1.00 GiB (caches fp8/i8)")
            && out.contains(&format!(
                "KV + indexer caches {:.1} MiB",
                (per(CacheFormat::SMALLEST) * 4096) as f64 / (1 << 20) as f64
            )),
        "{out}"
    );
    let line = out.lines().find(|l| l.starts_with("  fp8/i8 ")).unwrap();
    assert!(line.ends_with("<- used"), "{line}");

    // An adapter with little memory: f32 does not fit max_position_embeddings, auto takes a
    // compact format, and with too little, a format fits nothing.
    let out = info_builtin(
        &["--ctx", "1024"],
        &[("SPARSA_FAULT_GPU_MEMORY", "30500000")],
    );
    assert!(
        out.contains("(the longest whose fp8/i8 caches fit the adapter's")
            && !out.contains("caches f32/f32 (auto"),
        "{out}"
    );
    let out = info_builtin(&[], &[("SPARSA_FAULT_GPU_MEMORY", "17000000")]);
    assert!(
        out.lines()
            .filter(|l| l.starts_with("  ") && l.contains("B/token  fits: no"))
            .count()
            == 4,
        "{out}"
    );
}

/// The config-only plan reserves the caches in the format asked for, and smaller caches
/// leave more experts resident.
#[test]
fn the_plan_reserves_caches_in_their_format() {
    let j = release(Like::Glm52);
    let d = config_dir("cli-glm52-caches", &j);
    let slots = |cache: &str| {
        let (ok, out, err) = info(
            &d,
            &[
                "--format",
                "q4",
                "--gpu-memory",
                "300GiB",
                "--ctx",
                "1048576",
                "--cache-type",
                cache,
            ],
        );
        assert!(ok, "{err}\n{out}");
        let line = out
            .lines()
            .find(|l| l.starts_with("GPU memory plan for 300.00 GiB"))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string();
        assert!(line.contains(&format!("(caches {cache})")), "{line}");
        let n: usize = line
            .split("routed experts ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        n
    };
    let (f32, fp8) = (slots("f32/f32"), slots("fp8/bf16"));
    assert!(fp8 > f32, "resident experts: fp8 caches {fp8}, f32 {f32}");
    let _ = std::fs::remove_dir_all(&d);
}
