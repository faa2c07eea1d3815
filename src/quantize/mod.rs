//! `sparsa quantize`: convert a model directory (f32 / bf16 / f16 / FP8) to sparsa's q8 or q4
//! format, tensor by tensor, with host memory bounded by a group of rows of one tensor.
//!
//! What stays high precision by default (as it is stored): the embedding table (the gather
//! kernel reads floats), every norm, the router (`mlp.gate.weight`) and its correction bias,
//! the indexer's head weights (`indexer.weights_proj`) — small tensors whose precision
//! decides discrete choices (expert and top-k selection). `--keep PATTERN` keeps more.
//! Layers past `num_hidden_layers` are dropped, but for the first MTP layer (the draft model).
//! The output is sharded (`model-0000i-of-0000n.safetensors` + index when more than one
//! shard), and every other file of the directory is copied, `config.json` with its
//! `quantization_config` replaced.
//!
//! Interruption: everything is written into `<out>.partial` next to `<out>` and renamed to
//! `<out>` when complete, so a directory at `<out>` is always a finished conversion. Each shard
//! is written to a `.tmp` file, fsynced and renamed, then recorded in the partial directory's
//! manifest ([`MANIFEST`]: the source's files, the options, sparsa's version, and per finished
//! shard its size and a checksum of its first and last MiB). A later run with the same source
//! and options verifies the recorded shards (size, header equal to the plan's, checksum),
//! keeps those that pass and writes the rest; other options or a changed source are refused
//! unless [`Options::restart`].

use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::info::layer_of;
use crate::weights::quant::{dequantize_rows, quantize_rows, FP8_BLOCK};
use crate::weights::{DType, QFormat, TensorRef, WeightFiles};
use std::io::Write;
use std::path::Path;

mod partial;
mod shards;
use partial::{
    finish, manifest_key, open_partial, sample_checksum, verify_shard, Finished, Manifest,
};
pub use partial::{partial_dir, MANIFEST};
pub(crate) use shards::{
    check_out_empty, plan_shards, write_sharded, write_sharded_holes, TensorHeader,
};
use shards::{copy_side_files, write_index, write_shard, ShardPlan};

pub struct Options {
    pub format: QFormat,
    /// Extra tensors to keep as stored: `*` wildcards, else a substring of the name.
    pub keep: Vec<String>,
    /// Target bytes per output shard.
    pub shard_bytes: u64,
    /// Delete an unfinished earlier conversion into the same `out` (`<out>.partial`) and
    /// start over, instead of resuming it.
    pub restart: bool,
}

/// What [`quantize_dir`] reports as it goes. The callback returns `false` to stop: the
/// conversion then ends with an error and the finished shards stay in `<out>.partial`.
pub enum Event<'a> {
    /// Sent first when an earlier run's `<out>.partial` is resumed: `kept` of `shards` shards
    /// were finished there and pass verification (`done` of `total` source bytes); `redo`
    /// says which finished shards did not and why (they are written again).
    Resuming {
        kept: usize,
        shards: usize,
        done: u64,
        total: u64,
        redo: &'a [String],
    },
    /// `done` of `total` source bytes are converted, `tensor` is being written, and
    /// `shards_done` of `shards` shards are finished.
    Progress {
        done: u64,
        total: u64,
        tensor: &'a str,
        shards_done: usize,
        shards: usize,
    },
}

/// What the conversion did.
pub struct Report {
    pub quantized: usize,
    pub kept: usize,
    pub dropped: usize,
    pub in_bytes: u64,
    pub out_bytes: u64,
    pub shards: usize,
    /// Shards finished by an earlier, interrupted run, verified and kept (not written again).
    pub resumed: usize,
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

/// Convert `src` into `out` (which must not exist or be empty), through `<out>.partial`
/// ([`partial_dir`]): an earlier, unfinished conversion there with the same source and
/// options is resumed (see the module's documentation). `progress` is called as the source is
/// consumed ([`Event`]); when it returns `false` the conversion stops with an error and what is
/// finished stays for a later run.
pub fn quantize_dir(
    src: &Path,
    out: &Path,
    opts: &Options,
    progress: &mut dyn FnMut(Event) -> bool,
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
        resumed: 0,
    };
    let mut plan_files: Vec<&Path> = Vec::new();
    for name in names {
        let t = files.get(name)?;
        report.in_bytes += t.bytes.len() as u64;
        plan_files.push(t.file);
        if layer_of(name).is_some_and(|l| l >= cfg.cache_layers()) {
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
    let shards = ShardPlan::new(&headers, opts.shard_bytes, false, &meta);
    let partial = partial_dir(out)?;
    let mut weights: Vec<&Path> = plan_files;
    weights.sort();
    weights.dedup();
    let key = manifest_key(src, &weights, opts)?;
    let mut manifest = open_partial(&partial, key, opts.restart)?;
    let r = write_partial(
        &WriteJob {
            src,
            plan: &plan,
            headers: &headers,
            shards: &shards,
            partial: &partial,
            fmt,
            total: report.in_bytes,
        },
        &mut manifest,
        progress,
    );
    let n = shards.names.len();
    let kept = manifest.finished.len();
    let resumed = match r {
        Ok(resumed) => resumed,
        Err(e) if kept > 0 => {
            return Err(match e {
                Stopped::Interrupted => Error::msg(format!(
                    "interrupted: {kept} of {n} shards are finished in {}; run the same command to resume",
                    partial.display()
                )),
                Stopped::Failed(e) => Error::msg(format!(
                    "{e} ({kept} of {n} shards are finished in {}: the same command resumes, \
                     --restart starts over)",
                    partial.display()
                )),
            })
        }
        Err(e) => {
            // Nothing worth keeping: leave no directory behind.
            let _ = std::fs::remove_dir_all(&partial);
            return Err(match e {
                Stopped::Interrupted => {
                    Error::msg("interrupted before the first shard was finished")
                }
                Stopped::Failed(e) => e,
            });
        }
    };
    finish(&partial, out, &manifest).map_err(|e| {
        Error::msg(format!(
            "{e} (the conversion is complete in {}: the same command finishes it)",
            partial.display()
        ))
    })?;
    report.shards = n;
    report.out_bytes = headers.iter().map(|h| h.bytes).sum();
    report.resumed = resumed;
    Ok(report)
}

/// Why [`write_partial`] did not finish.
enum Stopped {
    /// The progress callback returned `false`.
    Interrupted,
    Failed(Error),
}

impl From<Error> for Stopped {
    fn from(e: Error) -> Self {
        Stopped::Failed(e)
    }
}

/// What [`write_partial`] writes.
struct WriteJob<'a, 'b> {
    src: &'a Path,
    plan: &'a [Out<'b>],
    headers: &'a [TensorHeader],
    shards: &'a ShardPlan,
    partial: &'a Path,
    fmt: QFormat,
    /// Source bytes (the progress total).
    total: u64,
}

/// Source bytes that writing `o` consumes (a scale tensor re-reads its weight's: 0).
fn source_bytes(o: &Out) -> u64 {
    match &o.plan {
        Plan::Copy(t) => t.bytes.len() as u64,
        Plan::QWeight(s) => {
            s.t.bytes.len() as u64 + s.fp8_scale.as_ref().map_or(0, |x| x.bytes.len() as u64)
        }
        Plan::QScale(_) => 0,
    }
}

/// Everything of the output inside `job.partial`: the shards the manifest does not list as
/// finished (after verifying those it does), then the index and the side files, `config.json`
/// last. Returns how many shards were kept from an earlier run.
fn write_partial(
    job: &WriteJob,
    manifest: &mut Manifest,
    progress: &mut dyn FnMut(Event) -> bool,
) -> std::result::Result<usize, Stopped> {
    let (partial, shards) = (job.partial, job.shards);
    let n = shards.names.len();
    // What an earlier run finished: kept when it still matches the plan.
    let mut finished = vec![false; n];
    let mut redo = Vec::new();
    let recorded = std::mem::take(&mut manifest.finished);
    let had_any = !recorded.is_empty();
    for (name, rec) in recorded {
        let Some(si) = shards.names.iter().position(|f| *f == name) else {
            continue; // impossible with an equal key (same plan); not kept
        };
        let path = partial.join(&name);
        match verify_shard(&path, &shards.heads[si], shards.sizes[si], &rec) {
            Ok(()) => {
                finished[si] = true;
                manifest.finished.insert(name, rec);
            }
            Err(why) => redo.push(format!("{}: {why}", path.display())),
        }
    }
    if had_any {
        // Files of an earlier run's last step, rewritten at the end: until then the
        // directory must not look like a model.
        for f in ["config.json", "model.safetensors.index.json"] {
            let _ = std::fs::remove_file(partial.join(f));
        }
        manifest.save(partial)?;
    }
    let resumed = manifest.finished.len();
    let mut done: u64 = (0..n)
        .filter(|&si| finished[si])
        .flat_map(|si| shards.tensors[si].iter())
        .map(|&i| source_bytes(&job.plan[i]))
        .sum();
    let total = job.total;
    if had_any
        && !progress(Event::Resuming {
            kept: resumed,
            shards: n,
            done: done.min(total),
            total,
            redo: &redo,
        })
    {
        return Err(Stopped::Interrupted);
    }
    let slow = crate::fault::injected("SLOW_QUANTIZE_MS");
    for si in (0..n).filter(|&si| !finished[si]) {
        let shards_done = manifest.finished.len();
        let path = partial.join(&shards.names[si]);
        let mut stopped = false;
        let r = write_shard(
            &path,
            &shards.heads[si],
            job.headers,
            &shards.tensors[si],
            true,
            &mut |i, w| {
                let o = &job.plan[i];
                let written = write_tensor(w, o, job.fmt, &mut |bytes| {
                    done += bytes;
                    let go = progress(Event::Progress {
                        done: done.min(total),
                        total,
                        tensor: &o.header.name,
                        shards_done,
                        shards: n,
                    });
                    stopped |= !go;
                    go
                })?;
                if let Some(ms) = slow {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
                Ok(written)
            },
        );
        if stopped {
            return Err(Stopped::Interrupted);
        }
        r?;
        let sample = sample_checksum(&path, shards.sizes[si])
            .map_err(|e| Error::msg(format!("{}: cannot read back: {e}", path.display())))?;
        manifest.finished.insert(
            shards.names[si].clone(),
            Finished {
                bytes: shards.sizes[si],
                sample_fnv1a64: sample,
            },
        );
        manifest.save(partial)?;
    }
    if n > 1 {
        write_index(partial, job.headers, shards)?;
    }
    copy_side_files(job.src, partial, job.fmt)?;
    // Everything is written: a stop asked for now changes nothing.
    progress(Event::Progress {
        done: total,
        total,
        tensor: "",
        shards_done: n,
        shards: n,
    });
    Ok(resumed)
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

/// Bytes of a copied tensor written between two progress calls.
const COPY_STEP: usize = 64 << 20;

/// Write one planned tensor; returns the bytes written. `step(source_bytes)` is called after
/// each group of rows (a scale tensor reports 0: its weight counted the source); when it
/// returns `false` the write stops with an error.
fn write_tensor(
    w: &mut dyn Write,
    o: &Out,
    fmt: QFormat,
    step: &mut dyn FnMut(u64) -> bool,
) -> std::result::Result<u64, WriteErr> {
    let stop = || WriteErr::Other(Error::msg("stopped"));
    match &o.plan {
        Plan::Copy(t) => {
            for c in t.bytes.chunks(COPY_STEP) {
                w.write_all(c)?;
                if !step(c.len() as u64) {
                    return Err(stop());
                }
            }
            Ok(t.bytes.len() as u64)
        }
        Plan::QWeight(s) | Plan::QScale(s) => {
            let scales = matches!(o.plan, Plan::QScale(_));
            let bf16 = !scales && o.header.dtype == "BF16"; // a kept FP8 tensor, widened
            let src_bytes = source_bytes(o);
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
                // The source consumed so far, in proportion to the rows (sums to all of it).
                let share = |r: usize| (src_bytes as u128 * r as u128 / s.rows as u128) as u64;
                if !step(share(r0 + n) - share(r0)) {
                    return Err(stop());
                }
                r0 += n;
            }
            Ok(n_out)
        }
    }
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
