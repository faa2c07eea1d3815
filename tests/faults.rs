//! Faults (issue 9): Ctrl-C during load and generation, a lost GPU device, GPU memory running
//! out, a model file that shrinks or changes while it is read. Each must end the process
//! with one `error:` line saying what happened, a non-zero status and no panic.
//!
//! Device loss and out-of-memory are produced with `SPARSA_FAULT_*` (see `src/fault.rs`):
//! lavapipe has no way to lose its device or run out of memory on demand.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{bin, builtin_dir, copy_model, tmpdir};

/// A copy of the built-in model's directory (tests may damage it).
fn model_copy(name: &str) -> PathBuf {
    let dir = tmpdir(&format!("faults-{name}"));
    copy_model(&builtin_dir(), &dir);
    dir
}

/// Waits for the child (at most `limit`), returning its status code and stderr.
fn finish(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut err).unwrap();
            }
            return (status.code(), err);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("sparsa did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The one `error:` line of `stderr`; fails on a panic or more than one error.
fn one_error(stderr: &str) -> String {
    assert!(
        !stderr.contains("panicked") && !stderr.contains("internal error"),
        "{stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {stderr}");
    lines[0].to_string()
}

/// Runs `sparsa generate` with the built-in model (or `model`) and fault variables,
/// expecting failure; returns (status, the error line).
fn generate_fails(model: Option<&Path>, env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let mut c = bin();
    c.arg("generate").args(args);
    if let Some(m) = model {
        c.arg("--model").arg(m);
    }
    c.envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (code, err) = finish(c.spawn().unwrap(), Duration::from_secs(300));
    let code = code.expect("exited normally, not by a signal");
    assert_ne!(code, 0, "expected failure: {err}");
    (code, one_error(&err))
}

/// A `sparsa generate` whose weights upload has started, and the rest of its stderr.
struct Loading {
    child: Child,
    stderr: std::sync::mpsc::Receiver<String>,
}

/// Starts `sparsa generate` with info logs and a slowed upload, and returns once the upload
/// started (the `adapter:` log line comes right before it).
fn start_loading(model: Option<&Path>, slow_ms: &str, extra: &[&str]) -> Loading {
    let mut c = bin();
    c.arg("generate").args(extra);
    if let Some(m) = model {
        c.arg("--model").arg(m);
    }
    let mut child = c
        .env("RUST_LOG", "sparsa=info")
        .env("SPARSA_FAULT_SLOW_LOAD_MS", slow_ms)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "sparsa ended before loading"
        );
        if line.contains("adapter:") {
            break;
        }
    }
    let (tx, stderr) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        let _ = tx.send(rest);
    });
    std::thread::sleep(Duration::from_millis(300));
    Loading { child, stderr }
}

impl Loading {
    fn finish(self) -> (Option<i32>, String) {
        let (code, _) = finish(self.child, Duration::from_secs(300));
        (code, self.stderr.recv().unwrap_or_default())
    }
}

fn sigint(child: &Child) {
    // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(r, 0);
}

#[test]
fn ctrl_c_during_load_reports_and_exits_130() {
    let l = start_loading(None, "40", &["--max-tokens", "4"]);
    sigint(&l.child);
    let (code, err) = l.finish();
    assert_eq!(code, Some(130), "{err}");
    let e = one_error(&err);
    assert_eq!(e, "error: interrupted while loading the weights");
}

#[test]
fn ctrl_c_during_generation_keeps_the_text_and_exits_130() {
    let mut child = bin()
        .args(["generate", "--max-tokens", "900", "--seed", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for generated text past the echoed prompt ("KING RICHARD:").
    let mut out = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while seen.len() < "KING RICHARD:".len() + 20 {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "sparsa ended before generating");
        seen.extend_from_slice(&buf[..n]);
    }
    sigint(&child);
    let mut rest = Vec::new();
    out.read_to_end(&mut rest).unwrap();
    let (code, err) = finish(child, Duration::from_secs(300));
    assert_eq!(code, Some(130), "{err}");
    let e = one_error(&err);
    assert!(
        e.starts_with("error: interrupted after ") && e.ends_with(" generated tokens"),
        "{e}"
    );
    seen.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&seen);
    assert!(
        text.starts_with("KING RICHARD:") && text.ends_with('\n'),
        "{text}"
    );
}

#[test]
fn device_lost_during_load_and_during_generation() {
    for after in ["1", "40"] {
        let (code, e) = generate_fails(
            None,
            &[("SPARSA_FAULT_DEVICE_LOST_AFTER", after)],
            &["--max-tokens", "60"],
        );
        assert_eq!(code, 1);
        assert!(
            e.starts_with("error: GPU device lost on ") && e.contains("start sparsa again"),
            "after {after} submissions: {e}"
        );
    }
}

#[test]
fn gpu_out_of_memory_names_the_buffer() {
    // The weights (14 MB) do not fit.
    let (code, e) = generate_fails(
        None,
        &[("SPARSA_FAULT_GPU_MEMORY", "8000000")],
        &["--max-tokens", "4"],
    );
    assert_eq!(code, 1);
    assert!(
        e.starts_with("error: buffer model.") && e.contains("out of GPU memory on "),
        "{e}"
    );
    // The weights fit; the caches for a long context do not.
    let (_, e) = generate_fails(
        None,
        &[("SPARSA_FAULT_GPU_MEMORY", "60000000")],
        &["--max-tokens", "4", "--ctx", "300000"],
    );
    assert!(
        e.starts_with("error: --ctx 300000: its caches") && e.contains("out of GPU memory"),
        "{e}"
    );
}

#[test]
fn absurd_context_is_refused_before_allocating() {
    let max = usize::MAX.to_string();
    for (args, names) in [
        (
            ["--max-tokens", "4", "--ctx", "4000000000"],
            "--ctx 4000000000",
        ),
        (
            ["--max-tokens", "4", "--ctx", max.as_str()],
            "--ctx 18446744073709551615",
        ),
        (["--max-tokens", max.as_str(), "--ctx", "64"], "--ctx 64"),
    ] {
        let (code, e) = generate_fails(None, &[], &args);
        assert_eq!(code, 1);
        assert!(e.contains(names), "{args:?}: {e}");
    }
}

#[test]
fn model_file_shrinking_during_load_is_reported() {
    let dir = model_copy("shrink");
    let l = start_loading(Some(&dir), "40", &["--prompt", "hi", "--max-tokens", "4"]);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("model.safetensors"))
        .unwrap();
    f.set_len(1_000_000).unwrap();
    let (code, err) = l.finish();
    assert_eq!(code, Some(1), "{err}");
    let e = one_error(&err);
    assert!(
        e.contains("model.safetensors: the file shrank while sparsa was reading it"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn model_file_changing_during_load_is_reported() {
    let dir = model_copy("change");
    let l = start_loading(Some(&dir), "20", &["--prompt", "hi", "--max-tokens", "4"]);
    // Same size, new contents time: another program wrote it.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("model.safetensors"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(60))
        .unwrap();
    let (code, err) = l.finish();
    assert_eq!(code, Some(1), "{err}");
    let e = one_error(&err);
    assert!(
        e.contains("model.safetensors: the file changed while sparsa was reading it"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
