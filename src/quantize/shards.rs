//! Safetensors shards as `sparsa quantize` and `sparsa synth` write them: the headers, the
//! deterministic assignment of tensors to shards, the index, and the files a model
//! directory carries besides its weights.

use super::partial::{parent_dir, sync_dir, MANIFEST};
use super::WriteErr;
use crate::error::{Error, Result};
use crate::weights::QFormat;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Fails if `out` exists and is not an empty directory.
pub(crate) fn check_out_empty(out: &Path) -> Result<()> {
    if out.exists()
        && std::fs::read_dir(out)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        return Err(Error::msg(format!(
            "--out {}: exists and is not empty",
            out.display()
        )));
    }
    Ok(())
}

/// One tensor of a safetensors file being written: its header entry.
#[derive(Clone, Debug)]
pub(crate) struct TensorHeader {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub bytes: u64,
}

impl TensorHeader {
    /// The file headers of `name` ([rows, cols]) quantized to `fmt` and of its scale tensor:
    /// q8 `I8` / q4 `U8` codes with a bf16 `<name>_scale`, or FP8 `F8_E4M3` with an f32
    /// `<name>_scale_inv` (shapes from [`QFormat::file_row_bytes`] / [`QFormat::scale_shape`]).
    pub(crate) fn quantized(
        name: &str,
        fmt: QFormat,
        rows: usize,
        cols: usize,
    ) -> [TensorHeader; 2] {
        let (dtype, scale_dtype, scale_size) = match fmt {
            QFormat::Fp8 => ("F8_E4M3", "F32", 4),
            QFormat::Q8 { .. } => ("I8", "BF16", 2),
            QFormat::Q4 { .. } => ("U8", "BF16", 2),
        };
        let row = fmt.file_row_bytes(cols);
        let s = fmt.scale_shape(rows, cols);
        [
            TensorHeader {
                name: name.to_string(),
                dtype,
                shape: vec![rows, row],
                bytes: (rows * row) as u64,
            },
            TensorHeader {
                name: format!("{name}{}", fmt.scale_suffix()),
                dtype: scale_dtype,
                shape: s.to_vec(),
                bytes: (s[0] * s[1] * scale_size) as u64,
            },
        ]
    }
}

/// What [`write_sharded`] wrote.
pub(crate) struct Written {
    pub shards: usize,
    pub bytes: u64,
}

/// Shard boundaries: tensors in order, a new shard when the next tensor would pass
/// `shard_bytes` (a tensor larger than that gets a shard of its own).
pub(crate) fn plan_shards(tensors: &[TensorHeader], shard_bytes: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = vec![vec![]];
    let mut size = 0u64;
    for (i, o) in tensors.iter().enumerate() {
        if size > 0 && size + o.bytes > shard_bytes {
            shards.push(vec![]);
            size = 0;
        }
        size += o.bytes;
        if let Some(s) = shards.last_mut() {
            s.push(i);
        }
    }
    shards
}

/// The files a list of tensors is written to, all decided before a byte is written (the same
/// tensors and options give the same plan, which resuming relies on).
pub(crate) struct ShardPlan {
    /// Tensor indices of each shard, in order.
    pub tensors: Vec<Vec<usize>>,
    /// File names: `model.safetensors`, or `model-0000i-of-0000n.safetensors`.
    pub names: Vec<String>,
    /// Each file's first bytes: the header length and the JSON header (padded with spaces).
    pub heads: Vec<Vec<u8>>,
    /// Each file's size.
    pub sizes: Vec<u64>,
}

impl ShardPlan {
    /// Shards of about `shard_bytes` ([`plan_shards`]), one `model.safetensors` when one is
    /// enough unless `always_index`; every header's `__metadata__` is `meta`.
    pub(crate) fn new(
        tensors: &[TensorHeader],
        shard_bytes: u64,
        always_index: bool,
        meta: &serde_json::Map<String, Value>,
    ) -> ShardPlan {
        let groups = plan_shards(tensors, shard_bytes);
        let n = groups.len();
        let mut p = ShardPlan {
            tensors: Vec::new(),
            names: Vec::new(),
            heads: Vec::new(),
            sizes: Vec::new(),
        };
        for (si, idx) in groups.into_iter().enumerate() {
            p.names.push(if n == 1 && !always_index {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{:05}.safetensors", si + 1, n)
            });
            let mut header = serde_json::Map::new();
            header.insert("__metadata__".into(), Value::Object(meta.clone()));
            let mut off = 0u64;
            for &i in &idx {
                let o = &tensors[i];
                header.insert(
                    o.name.clone(),
                    serde_json::json!({"dtype": o.dtype, "shape": o.shape, "data_offsets": [off, off + o.bytes]}),
                );
                off += o.bytes;
            }
            let mut h = Value::Object(header).to_string();
            while !(h.len() + 8).is_multiple_of(8) {
                h.push(' ');
            }
            let mut head = (h.len() as u64).to_le_bytes().to_vec();
            head.extend_from_slice(h.as_bytes());
            p.sizes.push(head.len() as u64 + off);
            p.heads.push(head);
            p.tensors.push(idx);
        }
        p
    }
}

/// Write one shard to `path`: `head`, then tensors `idx` through `write` (which must write
/// exactly each header's bytes and returns how many it wrote). With `durable`, the file is
/// written as `<path>.tmp`, fsynced and renamed to `path`, so a file at `path` is complete
/// (the temporary file is removed on failure). Returns the tensor bytes written.
pub(super) fn write_shard(
    path: &Path,
    head: &[u8],
    tensors: &[TensorHeader],
    idx: &[usize],
    durable: bool,
    write: &mut dyn FnMut(usize, &mut dyn Write) -> std::result::Result<u64, WriteErr>,
) -> Result<u64> {
    let tmp = if durable {
        let mut n = path.as_os_str().to_os_string();
        n.push(".tmp");
        PathBuf::from(n)
    } else {
        path.to_path_buf()
    };
    let err = |e: std::io::Error| Error::msg(format!("{}: cannot write: {e}", tmp.display()));
    let r = (|| {
        let f = std::fs::File::create(&tmp).map_err(err)?;
        let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
        w.write_all(head).map_err(err)?;
        let mut total = 0u64;
        for &i in idx {
            let o = &tensors[i];
            let written = write(i, &mut w).map_err(|e| match e {
                WriteErr::Io(e) => err(e),
                WriteErr::Other(e) => e,
            })?;
            if written != o.bytes {
                return Err(Error::msg(format!(
                    "internal error: tensor {} has {} bytes, {written} were written",
                    o.name, o.bytes
                )));
            }
            total += o.bytes;
        }
        let f = w.into_inner().map_err(|e| err(e.into_error()))?;
        if durable {
            f.sync_all().map_err(err)?;
        }
        Ok(total)
    })();
    if !durable {
        return r;
    }
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return r;
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        Error::msg(format!(
            "{}: cannot rename to {}: {e}",
            tmp.display(),
            path.display()
        ))
    })?;
    sync_dir(&parent_dir(path))?;
    r
}

/// `model.safetensors.index.json` of `plan` in `dir`.
pub(super) fn write_index(dir: &Path, tensors: &[TensorHeader], plan: &ShardPlan) -> Result<()> {
    let mut weight_map = BTreeMap::new();
    for (idx, name) in plan.tensors.iter().zip(&plan.names) {
        for &i in idx {
            weight_map.insert(tensors[i].name.clone(), name.clone());
        }
    }
    let total: u64 = tensors.iter().map(|t| t.bytes).sum();
    let index = serde_json::json!({
        "metadata": {"total_size": total},
        "weight_map": weight_map,
    });
    let p = dir.join("model.safetensors.index.json");
    std::fs::write(&p, serde_json::to_string_pretty(&index).unwrap_or_default())
        .map_err(|e| Error::msg(format!("{}: cannot write: {e}", p.display())))
}

/// Write `tensors`, in order, into `out` (created): `model.safetensors`, or
/// `model-0000i-of-0000n.safetensors` shards of about `shard_bytes` plus
/// `model.safetensors.index.json` when there is more than one shard (or `always_index`).
/// Every file's `__metadata__` is `meta`. `write(i, w)` writes tensor `i`'s bytes (exactly
/// `tensors[i].bytes` of them) and returns how many it wrote.
pub(crate) fn write_sharded(
    out: &Path,
    tensors: &[TensorHeader],
    shard_bytes: u64,
    always_index: bool,
    meta: &serde_json::Map<String, serde_json::Value>,
    write: &mut dyn FnMut(usize, &mut dyn Write) -> std::result::Result<u64, WriteErr>,
) -> Result<Written> {
    let plan = ShardPlan::new(tensors, shard_bytes, always_index, meta);
    write_plan(out, tensors, &plan, always_index, &mut |si, path| {
        write_shard(
            path,
            &plan.heads[si],
            tensors,
            &plan.tensors[si],
            false,
            write,
        )
    })
}

/// Like [`write_sharded`] with every tensor's bytes zero, written as holes: each shard is
/// its header followed by a `set_len` to its full size, so the files have their real sizes
/// and read as zeros but take no disk space and no time (on file systems with sparse
/// files). For benchmarks where only the shapes matter (`sparsa synth --zeros`).
pub(crate) fn write_sharded_holes(
    out: &Path,
    tensors: &[TensorHeader],
    shard_bytes: u64,
    always_index: bool,
    meta: &serde_json::Map<String, serde_json::Value>,
) -> Result<Written> {
    let plan = ShardPlan::new(tensors, shard_bytes, always_index, meta);
    write_plan(out, tensors, &plan, always_index, &mut |si, path| {
        let err = |e: std::io::Error| Error::msg(format!("{}: cannot write: {e}", path.display()));
        let mut f = std::fs::File::create(path).map_err(err)?;
        f.write_all(&plan.heads[si]).map_err(err)?;
        f.set_len(plan.sizes[si]).map_err(err)?;
        Ok(plan.sizes[si] - plan.heads[si].len() as u64)
    })
}

/// Writes `plan`'s shards into `out` (created) with `shard(i, path)`, which returns the
/// tensor bytes it wrote, then the index where there is more than one shard (or
/// `always_index`).
fn write_plan(
    out: &Path,
    tensors: &[TensorHeader],
    plan: &ShardPlan,
    always_index: bool,
    shard: &mut dyn FnMut(usize, &Path) -> Result<u64>,
) -> Result<Written> {
    std::fs::create_dir_all(out)
        .map_err(|e| Error::msg(format!("--out {}: cannot create: {e}", out.display())))?;
    let mut total = 0u64;
    for si in 0..plan.names.len() {
        total += shard(si, &out.join(&plan.names[si]))?;
    }
    if plan.names.len() > 1 || always_index {
        write_index(out, tensors, plan)?;
    }
    Ok(Written {
        shards: plan.names.len(),
        bytes: total,
    })
}

/// Copy every non-weight file; rewrite config.json's quantization_config. `config.json` is
/// written last, so a directory with one has everything else.
pub(super) fn copy_side_files(src: &Path, out: &Path, fmt: QFormat) -> Result<()> {
    let rd = std::fs::read_dir(src)
        .map_err(|e| Error::msg(format!("{}: cannot list: {e}", src.display())))?;
    let mut config = None;
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let p = entry.path();
        if !p.is_file()
            || name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
            || name == MANIFEST
        {
            continue;
        }
        if name == "config.json" {
            config = Some(p);
            continue;
        }
        let dst = out.join(&name);
        std::fs::copy(&p, &dst)
            .map_err(|e| Error::msg(format!("{}: cannot copy: {e}", dst.display())))?;
    }
    let Some(p) = config else {
        return Ok(()); // Config::from_dir read it: not reached
    };
    let dst = out.join("config.json");
    let text = std::fs::read_to_string(&p)
        .map_err(|e| Error::msg(format!("{}: cannot read: {e}", p.display())))?;
    let mut v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::msg(format!("{}: invalid JSON: {e}", p.display())))?;
    if let Some(m) = v.as_object_mut() {
        m.insert(
            "quantization_config".into(),
            serde_json::json!({
                "quant_method": "sparsa",
                "format": fmt.name(),
                "block_size": fmt.block(),
            }),
        );
    }
    let s = serde_json::to_string_pretty(&v).unwrap_or_default() + "\n";
    std::fs::write(&dst, s).map_err(|e| Error::msg(format!("{}: cannot write: {e}", dst.display())))
}
