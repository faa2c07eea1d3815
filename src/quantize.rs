//! `sparsa quantize`: convert a model directory (f32 / bf16 / f16 / FP8) to sparsa's q8 or q4
//! format, tensor by tensor, with host memory bounded by a group of rows of one tensor.
//!
//! What stays high precision by default (as it is stored): the embedding table (the gather
//! kernel reads floats), every norm, the router (`mlp.gate.weight`) and its correction bias,
//! the indexer's head weights (`indexer.weights_proj`) — small tensors whose precision
//! decides discrete choices (expert and top-k selection). `--keep PATTERN` keeps more.
//! Layers past `num_hidden_layers` (the MTP layer, which sparsa does not run) are dropped.
//! The output is sharded (`model-0000i-of-0000n.safetensors` + index when more than one
//! shard), and every other file of the directory is copied, `config.json` with its
//! `quantization_config` replaced.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::info::layer_of;
use crate::weights::quant::{dequantize_rows, quantize_rows, FP8_BLOCK};
use crate::weights::{DType, QFormat, TensorRef, WeightFiles};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

pub struct Options {
    pub format: QFormat,
    /// Extra tensors to keep as stored: `*` wildcards, else a substring of the name.
    pub keep: Vec<String>,
    /// Target bytes per output shard.
    pub shard_bytes: u64,
}

/// What the conversion did.
pub struct Report {
    pub quantized: usize,
    pub kept: usize,
    pub dropped: usize,
    pub in_bytes: u64,
    pub out_bytes: u64,
    pub shards: usize,
}

/// Names of tensors kept as stored unless told otherwise.
pub fn default_keep(name: &str) -> bool {
    name.contains("embed_tokens")
        || name.contains("norm")
        || name.ends_with("mlp.gate.weight")
        || name.contains("e_score_correction_bias")
        || name.contains("weights_proj")
}

fn glob(pat: &str, name: &str) -> bool {
    if !pat.contains('*') {
        return name.contains(pat);
    }
    let parts: Vec<&str> = pat.split('*').collect();
    let mut rest = name;
    for (i, p) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(p) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(p);
        } else {
            match rest.find(p) {
                Some(at) => rest = &rest[at + p.len()..],
                None => return false,
            }
        }
    }
    rest.is_empty()
}

/// One output tensor: where its bytes come from.
enum Plan<'a> {
    /// Copied as stored.
    Copy(TensorRef<'a>),
    /// Quantized weights of a source matrix (float or FP8 with its scales).
    QWeight(Source<'a>),
    /// Its scales (written from the same source, recomputed).
    QScale(Source<'a>),
}

#[derive(Clone)]
struct Source<'a> {
    t: TensorRef<'a>,
    fp8_scale: Option<TensorRef<'a>>,
    rows: usize,
    cols: usize,
}

struct Out<'a> {
    header: TensorHeader,
    plan: Plan<'a>,
}

/// Rows converted at a time (a multiple of the FP8 block, so FP8 scales line up).
const ROWS_PER_STEP: usize = FP8_BLOCK;

impl Source<'_> {
    /// f32 values of rows `r0 .. r0 + n`.
    fn rows_f32(&self, r0: usize, n: usize) -> Result<Vec<f32>> {
        let k = self.cols;
        match &self.fp8_scale {
            Some(s) => Ok(dequantize_rows(
                QFormat::Fp8,
                &self.t.bytes[r0 * k..(r0 + n) * k],
                &s.bytes[(r0 / FP8_BLOCK) * k.div_ceil(FP8_BLOCK) * 4..],
                r0 % FP8_BLOCK,
                n,
                k,
            )),
            None => {
                let d = self.t.dtype()?;
                let es = d.size();
                Ok(d.to_f32(&self.t.bytes[r0 * k * es..(r0 + n) * k * es]))
            }
        }
    }
}

fn dtype_str(d: safetensors::Dtype) -> Result<&'static str> {
    use safetensors::Dtype as D;
    Ok(match d {
        D::F32 => "F32",
        D::BF16 => "BF16",
        D::F16 => "F16",
        D::F8_E4M3 => "F8_E4M3",
        D::I8 => "I8",
        D::U8 => "U8",
        D::I32 => "I32",
        D::I64 => "I64",
        other => {
            return Err(Error::msg(format!(
                "dtype {other:?} cannot be copied by sparsa quantize"
            )))
        }
    })
}

/// Convert `src` into `out` (which must not exist or be empty). `progress(done, total,
/// tensor)` is called as bytes of the source are consumed.
pub fn quantize_dir(
    src: &Path,
    out: &Path,
    opts: &Options,
    progress: &mut dyn FnMut(u64, u64, &str),
) -> Result<Report> {
    let fmt = opts.format;
    if matches!(fmt, QFormat::Fp8) {
        return Err(Error::msg(
            "--format: sparsa writes q8 or q4 (FP8 checkpoints are read as released)",
        ));
    }
    QFormat::check_block(fmt.block(), "--block")?;
    let cfg = Config::from_dir(src)?;
    if matches!(cfg.quant, Some(QFormat::Q8 { .. } | QFormat::Q4 { .. })) {
        return Err(Error::msg(format!(
            "{}: already in sparsa's {} format (quantize from the original checkpoint)",
            src.display(),
            cfg.quant.map_or("", |q| q.name())
        )));
    }
    let files = WeightFiles::open(src)?;
    check_out_empty(out)?;
    // Plan every output tensor (sorted by name, so the output is deterministic).
    let mut names: Vec<&str> = files.names().collect();
    names.sort_unstable();
    let mut plan: Vec<Out> = Vec::new();
    let mut report = Report {
        quantized: 0,
        kept: 0,
        dropped: 0,
        in_bytes: 0,
        out_bytes: 0,
        shards: 0,
    };
    for name in names {
        let t = files.get(name)?;
        report.in_bytes += t.bytes.len() as u64;
        if layer_of(name).is_some_and(|l| l >= cfg.num_hidden_layers) {
            report.dropped += 1;
            continue;
        }
        if name.ends_with("_scale_inv") && files.contains(name.trim_end_matches("_scale_inv")) {
            continue; // consumed with its FP8 weight
        }
        let fp8 = t.dtype == safetensors::Dtype::F8_E4M3;
        let fp8_scale =
            if fp8 {
                Some(files.get(&format!("{name}_scale_inv")).map_err(|_| {
                    Error::msg(format!("tensor {name}: FP8 without {name}_scale_inv"))
                })?)
            } else {
                None
            };
        let keep = default_keep(name) || opts.keep.iter().any(|p| glob(p, name));
        let matrix = t.shape.len() == 2 && name.ends_with(".weight");
        let floaty = fp8 || DType::from_safetensors(t.dtype, name).is_ok();
        if !matrix || !floaty || (keep && !fp8) {
            plan.push(Out {
                header: TensorHeader {
                    name: name.to_string(),
                    dtype: dtype_str(t.dtype)?,
                    shape: t.shape.clone(),
                    bytes: t.bytes.len() as u64,
                },
                plan: Plan::Copy(t),
            });
            report.kept += 1;
            continue;
        }
        let (rows, cols) = (t.shape[0], t.shape[1]);
        let s = Source {
            t,
            fp8_scale,
            rows,
            cols,
        };
        if keep {
            // A kept FP8 tensor becomes bf16 (q8/q4 directories hold no FP8).
            plan.push(Out {
                header: TensorHeader {
                    name: name.to_string(),
                    dtype: "BF16",
                    shape: vec![rows, cols],
                    bytes: (rows * cols * 2) as u64,
                },
                plan: Plan::QWeight(s),
            });
            report.kept += 1;
            continue;
        }
        let [weight, scale] = TensorHeader::quantized(name, fmt, rows, cols);
        plan.push(Out {
            header: weight,
            plan: Plan::QWeight(s.clone()),
        });
        plan.push(Out {
            header: scale,
            plan: Plan::QScale(s),
        });
        report.quantized += 1;
    }
    let headers: Vec<TensorHeader> = plan.iter().map(|o| o.header.clone()).collect();
    let mut meta = serde_json::Map::new();
    meta.insert("format".into(), "pt".into());
    meta.insert("sparsa_quant".into(), fmt.name().into());
    meta.insert("block_size".into(), fmt.block().to_string().into());
    let total = report.in_bytes;
    let mut done = 0u64;
    let written = write_sharded(
        out,
        &headers,
        opts.shard_bytes,
        false,
        &meta,
        &mut |i, w| {
            let o = &plan[i];
            let n = write_tensor(w, o, fmt)?;
            if !matches!(o.plan, Plan::QScale(_)) {
                done += match &o.plan {
                    Plan::Copy(t) => t.bytes.len() as u64,
                    Plan::QWeight(s) | Plan::QScale(s) => {
                        s.t.bytes.len() as u64
                            + s.fp8_scale.as_ref().map_or(0, |x| x.bytes.len() as u64)
                    }
                };
                progress(done.min(total), total, &o.header.name);
            }
            Ok(n)
        },
    )?;
    report.shards = written.shards;
    report.out_bytes = written.bytes;
    copy_side_files(src, out, fmt)?;
    progress(total, total, "");
    Ok(report)
}

/// An error while writing a tensor: I/O errors are reported with the file's path.
pub(crate) enum WriteErr {
    Io(std::io::Error),
    Other(Error),
}

impl From<std::io::Error> for WriteErr {
    fn from(e: std::io::Error) -> Self {
        WriteErr::Io(e)
    }
}
impl From<Error> for WriteErr {
    fn from(e: Error) -> Self {
        WriteErr::Other(e)
    }
}

/// Write one planned tensor; returns the bytes written.
fn write_tensor(w: &mut dyn Write, o: &Out, fmt: QFormat) -> std::result::Result<u64, WriteErr> {
    match &o.plan {
        Plan::Copy(t) => {
            w.write_all(t.bytes)?;
            Ok(t.bytes.len() as u64)
        }
        Plan::QWeight(s) | Plan::QScale(s) => {
            let scales = matches!(o.plan, Plan::QScale(_));
            let bf16 = !scales && o.header.dtype == "BF16"; // a kept FP8 tensor, widened
            let mut n_out = 0u64;
            let mut r0 = 0;
            while r0 < s.rows {
                let n = ROWS_PER_STEP.min(s.rows - r0);
                let v = s.rows_f32(r0, n)?;
                if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                    return Err(Error::msg(format!(
                        "tensor {}: element {} is {} (weights must be finite)",
                        s.t.name,
                        r0 * s.cols + i,
                        v[i]
                    ))
                    .into());
                }
                let bytes = if bf16 {
                    DType::BF16.from_f32(&v)
                } else {
                    let (qw, qs) = quantize_rows(fmt, &v, s.cols);
                    if scales {
                        qs
                    } else {
                        qw
                    }
                };
                w.write_all(&bytes)?;
                n_out += bytes.len() as u64;
                r0 += n;
            }
            Ok(n_out)
        }
    }
}

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
    let shards = plan_shards(tensors, shard_bytes);
    std::fs::create_dir_all(out)
        .map_err(|e| Error::msg(format!("--out {}: cannot create: {e}", out.display())))?;
    let n_shards = shards.len();
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    for (si, idx) in shards.iter().enumerate() {
        let fname = if n_shards == 1 && !always_index {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", si + 1, n_shards)
        };
        let path = out.join(&fname);
        let mut header = serde_json::Map::new();
        header.insert(
            "__metadata__".into(),
            serde_json::Value::Object(meta.clone()),
        );
        let mut off = 0u64;
        for &i in idx {
            let o = &tensors[i];
            header.insert(
                o.name.clone(),
                serde_json::json!({"dtype": o.dtype, "shape": o.shape, "data_offsets": [off, off + o.bytes]}),
            );
            off += o.bytes;
            weight_map.insert(o.name.clone(), fname.clone());
        }
        let mut h = serde_json::Value::Object(header).to_string();
        while !(h.len() + 8).is_multiple_of(8) {
            h.push(' ');
        }
        let err = |e: std::io::Error| Error::msg(format!("{}: cannot write: {e}", path.display()));
        let f = std::fs::File::create(&path).map_err(err)?;
        let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
        w.write_all(&(h.len() as u64).to_le_bytes()).map_err(err)?;
        w.write_all(h.as_bytes()).map_err(err)?;
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
        w.flush().map_err(err)?;
    }
    if n_shards > 1 || always_index {
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        let p = out.join("model.safetensors.index.json");
        std::fs::write(&p, serde_json::to_string_pretty(&index).unwrap_or_default())
            .map_err(|e| Error::msg(format!("{}: cannot write: {e}", p.display())))?;
    }
    Ok(Written {
        shards: n_shards,
        bytes: total,
    })
}

/// Copy every non-weight file; rewrite config.json's quantization_config.
fn copy_side_files(src: &Path, out: &Path, fmt: QFormat) -> Result<()> {
    let rd = std::fs::read_dir(src)
        .map_err(|e| Error::msg(format!("{}: cannot list: {e}", src.display())))?;
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let p = entry.path();
        if !p.is_file() || name.ends_with(".safetensors") || name == "model.safetensors.index.json"
        {
            continue;
        }
        let dst = out.join(&name);
        if name == "config.json" {
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
            std::fs::write(&dst, s)
                .map_err(|e| Error::msg(format!("{}: cannot write: {e}", dst.display())))?;
        } else {
            std::fs::copy(&p, &dst)
                .map_err(|e| Error::msg(format!("{}: cannot copy: {e}", dst.display())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_patterns() {
        assert!(glob("lm_head", "lm_head.weight"));
        assert!(glob(
            "*.mlp.experts.*.down_proj.weight",
            "model.layers.3.mlp.experts.7.down_proj.weight"
        ));
        assert!(!glob("*.down_proj", "model.layers.3.mlp.down_proj.weight"));
        assert!(default_keep(
            "model.layers.0.self_attn.indexer.weights_proj.weight"
        ));
        assert!(default_keep("model.layers.2.mlp.gate.weight"));
        assert!(!default_keep("model.layers.2.mlp.gate_proj.weight"));
        assert!(!default_keep("lm_head.weight"));
        assert_eq!(layer_of("model.layers.12.mlp.gate.weight"), Some(12));
        assert_eq!(layer_of("model.norm.weight"), None);
    }
}
