//! The fuzz targets' seed corpora (`fuzz/corpus/<target>/`) and every input the fuzzer once
//! crashed, hung or ran out of memory on (`fuzz/regressions/<target>/`), run through the same
//! functions the libFuzzer targets call (`sparsa::fuzzing`), on stable Rust and without
//! libFuzzer. Each input must finish without a panic and within a time bound.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Generous for a debug build on a slow CI machine: the fuzzer's own timeout is 10 s on an
/// optimized build, and the seeds take milliseconds.
const LIMIT: Duration = Duration::from_secs(60);

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join(kind)
        .join(target);
    let mut out: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

fn run(target: &str, f: fn(&[u8])) {
    let seeds = inputs("corpus", target);
    assert!(!seeds.is_empty(), "fuzz/corpus/{target} has no seed inputs");
    for path in seeds.iter().chain(inputs("regressions", target).iter()) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let started = Instant::now();
        f(&data);
        let took = started.elapsed();
        assert!(took < LIMIT, "{}: took {took:?}", path.display());
    }
}

#[test]
fn fuzz_corpus_safetensors() {
    run("safetensors", sparsa::fuzzing::safetensors);
}

#[test]
fn fuzz_corpus_shard_index() {
    run("shard_index", sparsa::fuzzing::shard_index);
}

#[test]
fn fuzz_corpus_config() {
    run("config", sparsa::fuzzing::config);
}

#[test]
fn fuzz_corpus_quant_meta() {
    run("quant_meta", sparsa::fuzzing::quant_meta);
}

#[test]
fn fuzz_corpus_tokenizer() {
    run("tokenizer", sparsa::fuzzing::tokenizer);
}

#[test]
fn fuzz_corpus_chat_template() {
    run("chat_template", sparsa::fuzzing::chat_template);
}

#[test]
fn fuzz_corpus_conversation() {
    run("conversation", sparsa::fuzzing::conversation);
}

/// The seeds are real files: most of them must get through the parser, or the fuzzer starts
/// from nothing but error paths.
#[test]
fn fuzz_corpus_seeds_parse() {
    use sparsa::fuzzing::SEPARATOR;
    let split = |d: &[u8]| -> (Vec<u8>, Option<Vec<u8>>) {
        match d.iter().position(|&b| b == SEPARATOR) {
            Some(i) => (d[..i].to_vec(), Some(d[i + 1..].to_vec())),
            None => (d.to_vec(), None),
        }
    };
    for p in inputs("corpus", "config") {
        let (c, g) = split(&std::fs::read(&p).unwrap());
        let g = g.map(|g| String::from_utf8(g).unwrap());
        sparsa::config::Config::from_texts(
            std::str::from_utf8(&c).unwrap(),
            "config.json",
            g.as_deref()
                .map(|g| (g, "generation_config.json".to_string())),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
    for name in ["q8", "q4", "fp8"] {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus/quant_meta")
            .join(name);
        let (c, f) = split(&std::fs::read(&p).unwrap());
        let q = sparsa::config::quantization_config(std::str::from_utf8(&c).unwrap(), "c").unwrap();
        let w = sparsa::weights::WeightFiles::from_owned(vec![("m".into(), f.unwrap())]).unwrap();
        let decoded: usize = w
            .names()
            .map(|n| sparsa::weights::quant::check_stored(&w, n, q, 1 << 16).unwrap())
            .sum();
        assert!(decoded > 0, "{name}: nothing dequantized");
    }
    for p in inputs("corpus", "chat_template") {
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let out = sparsa::fuzzing::chat_template_render(&std::fs::read(&p).unwrap());
        match out {
            Some(Ok(text)) => assert!(!text.is_empty(), "{name}"),
            // Some feature fixtures read arguments (`ws`, ...) that only their own tests pass;
            // the model templates must render.
            Some(Err(_)) if name.starts_with("features_") => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    for p in inputs("corpus", "tokenizer") {
        sparsa::tokenizer::Tokenizer::from_bytes(&std::fs::read(&p).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
}
