//! Helpers shared by the end-to-end tests of the `sparsa` binary: test model directories,
//! hostile variants of them, and running the binary with a time limit.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A run that takes longer than this is a hang: the child is killed and the test fails.
pub const TIMEOUT: Duration = Duration::from_secs(120);

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sparsa"))
}

pub fn data(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(family)
}

pub fn builtin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m")
}

/// A fresh, empty directory for one test.
pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sparsa-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `c` with `stdin` (or none), killing it after [`TIMEOUT`] (a hang fails the test).
pub fn run_with_timeout(mut c: Command, stdin: Option<&[u8]>) -> Output {
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(bytes) = stdin {
        let mut w = child.stdin.take().unwrap();
        let bytes = bytes.to_vec();
        // A child that exits early closes the pipe; that is its business, not a failure.
        std::thread::spawn(move || {
            let _ = w.write_all(&bytes);
        });
    }
    // Drain stdout and stderr on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut out, &mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = std::io::Read::read_to_end(&mut err, &mut v);
        v
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{c:?} did not finish within {TIMEOUT:?} (a hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    }
}

/// Checks that a run failed the way bad input must: a non-zero exit code, no panic, and
/// exactly one `error:` line; returns that line.
pub fn one_error(what: &str, out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "{what}: expected failure, exit 0; stderr: {err}"
    );
    let code = out.status.code();
    assert!(
        matches!(code, Some(1) | Some(2)),
        "{what}: exit code {code:?} (killed by a signal?): {err}"
    );
    for bad in ["panicked", "RUST_BACKTRACE", "internal error"] {
        assert!(!err.contains(bad), "{what}: stderr contains {bad:?}: {err}");
    }
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{what}: one error line expected: {err}");
    lines[0].to_string()
}

/// Runs sparsa expecting failure; returns its one `error:` line.
pub fn fails(args: &[&str], model: Option<&Path>) -> String {
    let mut c = bin();
    c.args(args);
    if let Some(m) = model {
        c.arg("--model").arg(m);
    }
    one_error(&format!("{args:?}"), &run_with_timeout(c, None))
}

/// Copies the regular files of a model directory (not subdirectories) into `dir`.
pub fn copy_model(src: &Path, dir: &Path) {
    for e in std::fs::read_dir(src).unwrap().flatten() {
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
}

/// A copy of a test model directory with a modified config.json.
pub fn variant(family: &str, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let src = data(family);
    let dir = tmpdir(name);
    copy_model(&src, &dir);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// One tensor of a safetensors file, with its dtype as the header spells it.
#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// The tensors of a safetensors file, sorted by name.
pub fn read_tensors(path: &Path) -> Vec<Tensor> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<Tensor> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| Tensor {
            name,
            dtype: format!("{:?}", t.dtype()),
            shape: t.shape().to_vec(),
            data: t.data().to_vec(),
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// A safetensors file's bytes: the 8-byte header length, `header`, then `data`.
pub fn raw_safetensors(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// The header (as JSON) and data section of safetensors bytes.
pub fn split_safetensors(bytes: &[u8]) -> (serde_json::Value, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        bytes[8 + n..].to_vec(),
    )
}

/// Safetensors bytes holding `tensors` back to back, written as given (no validation: the
/// dtype, shape and byte count need not agree).
pub fn write_tensors(tensors: &[Tensor]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
    let mut data = Vec::new();
    for t in tensors {
        let start = data.len();
        data.extend_from_slice(&t.data);
        header.insert(
            t.name.clone(),
            serde_json::json!({ "dtype": t.dtype, "shape": t.shape, "data_offsets": [start, data.len()] }),
        );
    }
    raw_safetensors(
        serde_json::Value::Object(header).to_string().as_bytes(),
        &data,
    )
}

/// A budget that holds everything but the routed experts and `slots` experts per MoE layer.
pub fn budget(
    src: &sparsa::model::ModelSource,
    gpu: &sparsa::gpu::Gpu,
    ctx: usize,
    slots: u64,
    policy: sparsa::experts::Policy,
) -> sparsa::model::Budget {
    use sparsa::model::{plan, Budget, GpuMemory};
    let p = plan(
        &src.config,
        &src.weights,
        1 << 50,
        ctx,
        gpu.max_binding(),
        None,
    )
    .unwrap();
    Budget {
        memory: GpuMemory::Bytes(
            p.fixed() + p.slots.moe_layers() as u64 * p.slots.expert_bytes * slots,
        ),
        ctx,
        cache: None,
        policy,
        prefetch: false,
        cpu: sparsa::experts::CpuExperts::Off,
        cpu_threads: 0,
        placement: Default::default(),
        host_copy: sparsa::experts::HostCopy::Off,
        host_embeddings: sparsa::experts::HostCopy::Off,
    }
}
