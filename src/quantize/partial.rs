//! The partial directory of `sparsa quantize` (`<out>.partial`): its manifest, the checks
//! that let a later run resume it, and the final rename to `<out>`.

use crate::error::{Error, Result};
use crate::quantize::Options;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The last step: make the partial directory's files durable, drop its manifest and rename
/// it to `out` (an empty directory at `out` is replaced). When that fails the manifest is
/// put back, so the directory stays resumable.
pub(super) fn finish(partial: &Path, out: &Path, manifest: &Manifest) -> Result<()> {
    let r = publish(partial, out);
    if r.is_err() && partial.is_dir() && !partial.join(MANIFEST).exists() {
        let _ = manifest.save(partial);
    }
    r
}

fn publish(partial: &Path, out: &Path) -> Result<()> {
    let rd = std::fs::read_dir(partial)
        .map_err(|e| Error::msg(format!("{}: cannot list: {e}", partial.display())))?;
    for entry in rd.flatten() {
        let p = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        // The shards were fsynced before they were renamed into place.
        if p.is_file() && name != MANIFEST && !name.ends_with(".safetensors") {
            sync_file(&p)?;
        }
    }
    let m = partial.join(MANIFEST);
    std::fs::remove_file(&m)
        .map_err(|e| Error::msg(format!("{}: cannot remove: {e}", m.display())))?;
    sync_dir(partial)?;
    if out.exists() {
        // check_out_empty passed: an empty directory, which rename cannot replace everywhere.
        std::fs::remove_dir(out).map_err(|e| {
            Error::msg(format!(
                "--out {}: cannot replace it with {}: {e}",
                out.display(),
                partial.display()
            ))
        })?;
    }
    std::fs::rename(partial, out).map_err(|e| {
        Error::msg(format!(
            "--out {}: cannot rename {} to it: {e}",
            out.display(),
            partial.display()
        ))
    })?;
    sync_dir(&parent_dir(out))
}

/// The directory holding `p` (`.` for a bare name).
pub(super) fn parent_dir(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Where a conversion into `out` is written until it is complete: `<out>.partial`, next to
/// `out` (same filesystem, so the final rename is atomic).
pub fn partial_dir(out: &Path) -> Result<PathBuf> {
    let name = out.file_name().ok_or_else(|| {
        Error::msg(format!(
            "--out {}: expected a directory path ending in a name",
            out.display()
        ))
    })?;
    let mut n = name.to_os_string();
    n.push(".partial");
    Ok(out.with_file_name(n))
}

/// The manifest of a partial directory (removed when the conversion is complete).
pub const MANIFEST: &str = "sparsa-quantize.json";

/// Bytes at each end of a shard that its checksum covers.
const SAMPLE_BYTES: u64 = 1 << 20;

/// A partial directory's manifest: what it converts and which shards are finished.
#[derive(Serialize, Deserialize)]
pub(super) struct Manifest {
    /// The source's weight files and config (name, size, mtime), the options and sparsa's
    /// version: a resumed run must have the same.
    pub key: serde_json::Map<String, Value>,
    /// Shards written, fsynced and renamed into place, by file name.
    pub finished: BTreeMap<String, Finished>,
}

#[derive(Serialize, Deserialize, Clone)]
pub(super) struct Finished {
    pub bytes: u64,
    /// FNV-1a (64-bit) of the shard's first and last MiB ([`sample_checksum`]).
    pub sample_fnv1a64: String,
}

impl Manifest {
    /// Written to a temporary file, fsynced and renamed over the old one.
    pub(super) fn save(&self, dir: &Path) -> Result<()> {
        let p = dir.join(MANIFEST);
        let tmp = dir.join(format!("{MANIFEST}.tmp"));
        let text = serde_json::to_string_pretty(self).unwrap_or_default() + "\n";
        let err = |e: std::io::Error| Error::msg(format!("{}: cannot write: {e}", p.display()));
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(text.as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, &p).map_err(err)?;
        sync_dir(dir)
    }
}

/// What a resumed run must share with the run that started `<out>.partial`: the source
/// (`weights`: the safetensors files its tensors are in; its config and shard index) by
/// name, size and modification time, the options and sparsa's version.
pub(super) fn manifest_key(
    src: &Path,
    weights: &[&Path],
    opts: &Options,
) -> Result<serde_json::Map<String, Value>> {
    let path = std::fs::canonicalize(src).unwrap_or_else(|_| src.to_path_buf());
    let mut files: Vec<PathBuf> = weights.iter().map(|p| p.to_path_buf()).collect();
    for f in ["config.json", "model.safetensors.index.json"] {
        if src.join(f).is_file() {
            files.push(src.join(f));
        }
    }
    files.sort();
    files.dedup();
    let mut list = Vec::new();
    for p in files {
        let md = std::fs::metadata(&p)
            .map_err(|e| Error::msg(format!("{}: cannot read: {e}", p.display())))?;
        let mtime = md
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        let name = p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().to_string(),
        );
        list.push(serde_json::json!({"name": name, "bytes": md.len(), "mtime_ns": mtime}));
    }
    let mut keep = opts.keep.clone();
    keep.sort();
    keep.dedup();
    let key = serde_json::json!({
        "sparsa": env!("CARGO_PKG_VERSION"),
        "source": path.to_string_lossy(),
        "source_files": list,
        "format": opts.format.name(),
        "block": opts.format.block(),
        "keep": keep,
        "shard_bytes": opts.shard_bytes,
    });
    Ok(match key {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    })
}

/// How `old` (an earlier run's key) differs from `new`, in the flags' words.
fn key_diff(
    old: &serde_json::Map<String, Value>,
    new: &serde_json::Map<String, Value>,
) -> Vec<String> {
    let show = |k: &str, v: Option<&Value>| match (k, v) {
        (_, None | Some(Value::Null)) => "none".to_string(),
        ("shard_bytes", Some(v)) => format!("{}", v.as_f64().unwrap_or(0.0) / 1e9),
        (_, Some(Value::String(s))) => s.clone(),
        (_, Some(Value::Array(a))) if a.is_empty() => "none".to_string(),
        (_, Some(Value::Array(a))) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(", "),
        (_, Some(v)) => v.to_string(),
    };
    let mut diff = Vec::new();
    for (k, v) in new {
        let o = old.get(k);
        if o == Some(v) {
            continue;
        }
        if k == "source_files" {
            let by_name = |v: Option<&Value>| -> BTreeMap<String, Value> {
                v.and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|f| (f["name"].as_str().unwrap_or("").to_string(), f.clone()))
                    .collect()
            };
            let (a, b) = (by_name(o), by_name(Some(v)));
            let changed: Vec<&str> = a
                .keys()
                .chain(b.keys())
                .filter(|n| a.get(*n) != b.get(*n))
                .map(String::as_str)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            diff.push(format!(
                "source files changed since (size, modification time or presence): {}",
                changed.join(", ")
            ));
            continue;
        }
        let what = match k.as_str() {
            "sparsa" => "sparsa version",
            "source" => "--model",
            "format" => "--format",
            "block" => "--block",
            "keep" => "--keep",
            "shard_bytes" => "--shard-gb",
            other => other,
        };
        diff.push(format!(
            "{what} {} there, {} now",
            show(k, o),
            show(k, Some(v))
        ));
    }
    if old.keys().any(|k| !new.contains_key(k)) && diff.is_empty() {
        diff.push("written by another version of sparsa".into());
    }
    diff
}

/// The manifest of `dir` (`<out>.partial`) when it holds an unfinished conversion with the
/// same `key`; a new, empty one (the directory created) when there is none.
pub(super) fn open_partial(
    dir: &Path,
    key: serde_json::Map<String, Value>,
    restart: bool,
) -> Result<Manifest> {
    let m = dir.join(MANIFEST);
    let exists = dir.symlink_metadata().is_ok();
    let empty = exists
        && std::fs::read_dir(dir)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
    if exists && !empty {
        if !m.is_file() {
            return Err(Error::msg(format!(
                "{}: exists but holds no {MANIFEST}, so it is not an unfinished sparsa \
                 quantize to resume; delete it (or choose another --out)",
                dir.display()
            )));
        }
        if restart {
            std::fs::remove_dir_all(dir)
                .map_err(|e| Error::msg(format!("{}: cannot delete: {e}", dir.display())))?;
        } else {
            let text = std::fs::read_to_string(&m)
                .map_err(|e| Error::msg(format!("{}: cannot read: {e}", m.display())))?;
            let old: Manifest = serde_json::from_str(&text).map_err(|e| {
                Error::msg(format!(
                    "{}: not a manifest this sparsa can read ({e}); delete {} or pass --restart \
                     to start over",
                    m.display(),
                    dir.display()
                ))
            })?;
            let diff = key_diff(&old.key, &key);
            if !diff.is_empty() {
                return Err(Error::msg(format!(
                    "{}: holds an unfinished conversion with other settings ({}); delete it \
                     or pass --restart to start over",
                    dir.display(),
                    diff.join("; ")
                )));
            }
            return Ok(old);
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::msg(format!("{}: cannot create: {e}", dir.display())))?;
    let m = Manifest {
        key,
        finished: BTreeMap::new(),
    };
    m.save(dir)?;
    Ok(m)
}

/// FNV-1a (64-bit, hex) of the first and the last [`SAMPLE_BYTES`] of a file of `size`
/// bytes (all of it when it is smaller than twice that).
pub(super) fn sample_checksum(path: &Path, size: u64) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= x as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    let mut buf = vec![0u8; SAMPLE_BYTES.min(size) as usize];
    f.read_exact(&mut buf)?;
    eat(&buf);
    if size > SAMPLE_BYTES {
        let from = (size - SAMPLE_BYTES).max(SAMPLE_BYTES);
        buf.truncate((size - from) as usize);
        f.seek(SeekFrom::Start(from))?;
        f.read_exact(&mut buf)?;
        eat(&buf);
    }
    Ok(format!("{h:016x}"))
}

/// Whether a shard an earlier run finished is intact: its size and header are the plan's
/// and its checksum is the one recorded. Else why not.
pub(super) fn verify_shard(
    path: &Path,
    head: &[u8],
    size: u64,
    rec: &Finished,
) -> std::result::Result<(), String> {
    let md = std::fs::metadata(path).map_err(|e| format!("cannot read it ({e})"))?;
    if md.len() != size || rec.bytes != size {
        return Err(format!("{} bytes, {size} expected", md.len()));
    }
    let mut got = vec![0u8; head.len()];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut got))
        .map_err(|e| format!("cannot read it ({e})"))?;
    if got != head {
        return Err("its header is not the one planned".into());
    }
    let sum = sample_checksum(path, size).map_err(|e| format!("cannot read it ({e})"))?;
    if sum != rec.sample_fnv1a64 {
        return Err("its content differs from the checksum recorded when it was finished".into());
    }
    Ok(())
}

/// fsync a file's contents.
fn sync_file(p: &Path) -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::msg(format!("{}: cannot sync: {e}", p.display())))
}

/// fsync a directory, so renames and new files in it are durable (Unix; elsewhere a no-op).
pub(super) fn sync_dir(d: &Path) -> Result<()> {
    #[cfg(unix)]
    std::fs::File::open(d)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::msg(format!("{}: cannot sync: {e}", d.display())))?;
    #[cfg(not(unix))]
    let _ = d;
    Ok(())
}
