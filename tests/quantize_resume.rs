//! `sparsa quantize` survives interruption: it writes into `<out>.partial` and renames it to
//! `<out>` when complete, and a stopped conversion resumes from its finished shards, which are
//! verified (a damaged one is written again) and never mixed with other options or a changed
//! source. The tiny glm52 golden model in shards of 50 kB gives several shards.

use sparsa::quantize::{partial_dir, quantize_dir, Event, Options, Report, MANIFEST};
use sparsa::weights::QFormat;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

mod common;
use common::{bin, data, tmpdir};

const SHARD_BYTES: u64 = 50_000;

fn opts(format: QFormat) -> Options {
    Options {
        format,
        keep: vec![],
        shard_bytes: SHARD_BYTES,
        restart: false,
    }
}

const Q8: QFormat = QFormat::Q8 { block: 32 };

/// The `Resuming` event's (kept, shards, redo).
type Resumed = (usize, usize, Vec<String>);

/// Converts `src` into `out`, stopping once `stop_after` shards are finished (if given);
/// also returns the `Resuming` event when there was one.
fn convert(
    src: &Path,
    out: &Path,
    o: &Options,
    stop_after: Option<usize>,
) -> (sparsa::Result<Report>, Option<Resumed>) {
    let mut resuming = None;
    let r = quantize_dir(src, out, o, &mut |e| match e {
        Event::Resuming {
            kept, shards, redo, ..
        } => {
            resuming = Some((kept, shards, redo.to_vec()));
            true
        }
        Event::Progress { shards_done, .. } => stop_after.is_none_or(|k| shards_done < k),
    });
    (r, resuming)
}

/// Every file of `dir` with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().to_string(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// The shard files in `dir`.
fn shards(dir: &Path) -> Vec<String> {
    files(dir)
        .into_keys()
        .filter(|n| n.ends_with(".safetensors"))
        .collect()
}

/// The uninterrupted conversion of `src` with `o`.
fn reference(name: &str, src: &Path, o: &Options) -> (PathBuf, BTreeMap<String, Vec<u8>>) {
    let out = tmpdir(name).join("q");
    let (r, resuming) = convert(src, &out, o, None);
    let r = r.unwrap();
    assert!(resuming.is_none() && r.resumed == 0);
    assert!(r.shards >= 6, "{} shards: the tests need several", r.shards);
    assert!(!partial_dir(&out).unwrap().exists());
    let f = files(&out);
    assert!(
        !f.contains_key(MANIFEST),
        "the manifest is not part of the output"
    );
    (out, f)
}

/// Removes the test directories: those holding `outs` (`tmpdir(..)/q`) and `dirs`.
fn clean(outs: &[&Path], dirs: &[&Path]) {
    for o in outs {
        let d = o.parent().expect("an output inside its test directory");
        assert!(d.starts_with(std::env::temp_dir()) && d != std::env::temp_dir());
        let _ = std::fs::remove_dir_all(d);
    }
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Identity of a file on disk: rewriting it (temporary file + rename) changes it.
#[cfg(unix)]
fn inode(p: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap())
}
#[cfg(not(unix))]
fn inode(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().len()
}

#[test]
fn interrupted_quantize_resumes_to_the_same_bytes() {
    let src = data("glm52");
    let o = opts(Q8);
    let (reference_dir, want) = reference("resume-ref", &src, &o);
    let out = tmpdir("resume").join("q");
    let partial = partial_dir(&out).unwrap();
    let (r, _) = convert(&src, &out, &o, Some(2));
    let e = r.err().expect("stopped").0;
    assert!(
        e.contains("interrupted")
            && e.contains(&format!("2 of {} shards", shards_of(&want)))
            && e.contains(&partial.display().to_string())
            && e.contains("resume"),
        "{e}"
    );
    // Nothing at --out; the partial directory holds exactly the finished shards and does not
    // look like a model.
    assert!(!out.exists());
    let done = shards(&partial);
    assert_eq!(done.len(), 2, "{done:?}");
    for f in &done {
        assert_eq!(&files(&partial)[f], &want[f], "{f}");
    }
    assert!(!partial.join("config.json").exists());
    assert!(sparsa::config::Config::from_dir(&partial).is_err());
    let before: Vec<u64> = done.iter().map(|f| inode(&partial.join(f))).collect();
    // A hard link keeps the old file alive, so a rewrite cannot reuse its inode number.
    let keep_alive = tmpdir("resume-links");
    for f in &done {
        std::fs::hard_link(partial.join(f), keep_alive.join(f)).unwrap();
    }
    let (r, resuming) = convert(&src, &out, &o, None);
    let r = r.unwrap();
    assert_eq!(resuming, Some((2, shards_of(&want), vec![])));
    assert_eq!(r.resumed, 2);
    assert!(!partial.exists());
    assert_eq!(
        files(&out),
        want,
        "resumed output differs from an uninterrupted one"
    );
    let after: Vec<u64> = done.iter().map(|f| inode(&out.join(f))).collect();
    assert_eq!(before, after, "the finished shards were written again");
    // A second interruption of a resumed run, at another shard, resumes too.
    let out2 = tmpdir("resume-twice").join("q");
    for k in [1, 4] {
        let (r, _) = convert(&src, &out2, &o, Some(k));
        assert!(r.is_err());
    }
    let (r, resuming) = convert(&src, &out2, &o, None);
    assert_eq!(r.unwrap().resumed, 4);
    assert_eq!(resuming.map(|r| r.0), Some(4));
    assert_eq!(files(&out2), want);
    clean(&[&out, &out2, &reference_dir], &[&keep_alive]);
}

fn shards_of(f: &BTreeMap<String, Vec<u8>>) -> usize {
    f.keys().filter(|n| n.ends_with(".safetensors")).count()
}

#[test]
fn damaged_finished_shards_are_written_again() {
    let src = data("glm52");
    let o = opts(Q8);
    let (reference_dir, want) = reference("damaged-ref", &src, &o);
    let out = tmpdir("damaged").join("q");
    let partial = partial_dir(&out).unwrap();
    assert!(convert(&src, &out, &o, Some(4)).0.is_err());
    let done = shards(&partial);
    assert_eq!(done.len(), 4);
    let path = |i: usize| partial.join(&done[i]);
    // 0: truncated; 1: a byte of its header changed; 2: its last byte changed; 3: intact.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path(0))
        .unwrap();
    f.set_len(f.metadata().unwrap().len() - 10).unwrap();
    drop(f);
    let mut b = std::fs::read(path(1)).unwrap();
    b[20] ^= 0x01;
    std::fs::write(path(1), b).unwrap();
    let mut b = std::fs::read(path(2)).unwrap();
    *b.last_mut().unwrap() ^= 0x40;
    std::fs::write(path(2), b).unwrap();
    let intact = inode(&path(3));
    let keep_alive = tmpdir("damaged-links");
    std::fs::hard_link(path(3), keep_alive.join("x")).unwrap();
    let (r, resuming) = convert(&src, &out, &o, None);
    let r = r.unwrap();
    let (kept, _, redo) = resuming.expect("a resume");
    assert_eq!((kept, r.resumed), (1, 1));
    assert_eq!(redo.len(), 3, "{redo:?}");
    for (i, why) in ["bytes", "header", "checksum"].iter().enumerate() {
        assert!(
            redo[i].contains(&done[i]) && redo[i].contains(why),
            "{}",
            redo[i]
        );
    }
    assert_eq!(files(&out), want);
    assert_eq!(inode(&out.join(&done[3])), intact);
    clean(&[&out, &reference_dir], &[&keep_alive]);
}

#[test]
fn other_options_or_a_changed_source_are_refused() {
    // A copy of the source, whose weights file can be touched.
    let src = tmpdir("changed-src");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(data("glm52").join(f), src.join(f)).unwrap();
    }
    let o = opts(Q8);
    let out = tmpdir("changed").join("q");
    let partial = partial_dir(&out).unwrap();
    assert!(convert(&src, &out, &o, Some(1)).0.is_err());
    let manifest = std::fs::read(partial.join(MANIFEST)).unwrap();
    let refused = |o: &Options, what: &[&str]| {
        let e = convert(&src, &out, o, None).0.err().expect("refused").0;
        assert!(
            e.contains(&partial.display().to_string()) && e.contains("--restart"),
            "{e}"
        );
        for w in what {
            assert!(e.contains(w), "{w}: {e}");
        }
        // Nothing was changed.
        assert_eq!(std::fs::read(partial.join(MANIFEST)).unwrap(), manifest);
        assert_eq!(shards(&partial).len(), 1);
        assert!(!out.exists());
    };
    refused(
        &opts(QFormat::Q4 { block: 32 }),
        &["--format q8 there, q4 now"],
    );
    refused(
        &opts(QFormat::Q8 { block: 64 }),
        &["--block 32 there, 64 now"],
    );
    let mut k = opts(Q8);
    k.keep = vec!["lm_head".into()];
    refused(&k, &["--keep none there, lm_head now"]);
    let mut s = opts(Q8);
    s.shard_bytes = 60_000;
    refused(&s, &["--shard-gb 0.00005 there, 0.00006 now"]);
    // The source's weights changed since (here only their modification time).
    let f = std::fs::File::options()
        .write(true)
        .open(src.join("model.safetensors"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(60))
        .unwrap();
    drop(f);
    refused(&o, &["source files changed", "model.safetensors"]);
    // --restart starts over.
    let mut r = opts(QFormat::Q4 { block: 32 });
    r.restart = true;
    let (rep, resuming) = convert(&src, &out, &r, None);
    assert!(resuming.is_none());
    assert_eq!(rep.unwrap().resumed, 0);
    assert!(!partial.exists() && out.join("config.json").exists());
    // A directory at <out>.partial that sparsa did not write is never deleted.
    let out2 = tmpdir("foreign").join("q");
    let p2 = partial_dir(&out2).unwrap();
    std::fs::create_dir_all(&p2).unwrap();
    std::fs::write(p2.join("notes.txt"), b"mine").unwrap();
    let mut r = opts(Q8);
    r.restart = true;
    let e = convert(&src, &out2, &r, None).0.err().expect("refused").0;
    assert!(
        e.contains(&p2.display().to_string()) && e.contains(MANIFEST),
        "{e}"
    );
    assert!(p2.join("notes.txt").exists());
    clean(&[&out, &out2], &[&src]);
}

/// Ctrl-C during `sparsa quantize` ends it with status 130 and a message saying the same
/// command resumes; it does, printing how many shards were already done.
#[cfg(unix)]
#[test]
fn ctrl_c_during_quantize_then_the_same_command_resumes() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let src = data("glm52");
    // --shard-gb as the CLI turns it into bytes.
    let gb = "0.00005";
    let o = Options {
        shard_bytes: (gb.parse::<f64>().unwrap() * 1e9) as u64,
        ..opts(Q8)
    };
    let (reference_dir, want) = reference("ctrl-c-ref", &src, &o);
    let out = tmpdir("ctrl-c").join("q");
    let partial = partial_dir(&out).unwrap();
    let cmd = || {
        let mut c = bin();
        c.args(["quantize", "--format", "q8", "--shard-gb", gb, "--model"])
            .arg(&src)
            .arg("--out")
            .arg(&out);
        c
    };
    let mut child = cmd()
        .env("SPARSA_FAULT_SLOW_QUANTIZE_MS", "20")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for a finished shard in the manifest.
    let t0 = Instant::now();
    loop {
        let m = std::fs::read_to_string(partial.join(MANIFEST)).unwrap_or_default();
        if m.contains("\"model-00001-of-") {
            break;
        }
        if child.try_wait().unwrap().is_some() || t0.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "no shard was finished: {:?} {}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let e: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(e.len(), 1, "{err}");
    assert!(
        e[0].starts_with("error: interrupted: ")
            && e[0].contains(&partial.display().to_string())
            && e[0].ends_with("run the same command to resume"),
        "{}",
        e[0]
    );
    assert!(!out.exists());
    let kept = shards(&partial).len();
    assert!(kept >= 1 && kept < shards_of(&want), "{kept} shards kept");
    let o = cmd().output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "resuming: {kept} of {} shards already done",
            shards_of(&want)
        )),
        "{err}"
    );
    assert_eq!(files(&out), want);
    clean(&[&out, &reference_dir], &[]);
}
