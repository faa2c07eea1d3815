//! Loading a model directory's tensors onto the GPU, checking every shape against config.json.
//!
//! Tensor names are the Hugging Face ones (`model.layers.{i}.self_attn.q_a_proj.weight`, …).
//! Routed experts are accepted per expert (`mlp.experts.{e}.gate_proj.weight`, as the
//! official releases ship) or fused (`mlp.experts.gate_up_proj` `[E, 2I, H]` and
//! `mlp.experts.down_proj` `[E, H, I]`, as transformers 5 saves them). Layers past
//! `num_hidden_layers` are not loaded, but for the first MTP layer ([`Mtp`]).
//!
//! Any matrix may be quantized (FP8 `F8_E4M3` + `<name>_scale_inv`, sparsa q8 `I8` / q4
//! `U8` + `<name>_scale`): the tensor's dtype says which, `config.json`'s
//! `quantization_config` gives q8/q4's block size. Quantized bytes go to the GPU as they are
//! (rows padded to the block); the kernels dequantize in registers. The embedding table
//! must be floating point (the gather kernel reads floats; every release keeps it bf16).

use crate::config::{Config, IndexerKind};
use crate::error::{Error, Result};
use crate::experts::ExpertSource;
use crate::gpu::Gpu;
use crate::weights::quant::stored_format;
use crate::weights::{GpuWeight, QFormat, QuantPart, RowSource, TensorRef, WFormat, WeightFiles};

/// The lightning indexer's own weights (its `wq_b` and `wk` are parts of the layer's
/// [`Layer::q_b`] and [`Layer::qkv_a`]).
pub struct Indexer {
    pub k_norm_w: wgpu::Buffer,
    pub k_norm_b: wgpu::Buffer,
    pub weights_proj: GpuWeight,
}

/// Matrices that multiply the same input, their outputs consecutive columns of one result:
/// stacked by rows into one matrix where their formats agree (one product instead of
/// several: fewer dispatches at decode), else one matrix each.
pub struct Proj {
    pub parts: Vec<GpuWeight>,
}

impl Proj {
    /// Output columns: every part's rows.
    pub fn rows(&self) -> usize {
        self.parts.iter().map(|w| w.rows).sum()
    }

    /// The first part (its format and columns stand for all: the input is shared).
    pub fn first(&self) -> &GpuWeight {
        &self.parts[0]
    }
}

/// A SwiGLU MLP with gate and up fused into one `[2I, H]` matrix (gate rows first).
pub struct SwiGlu {
    pub gate_up: GpuWeight,
    pub down: GpuWeight,
    pub inter: usize,
}

pub struct Moe {
    pub router: GpuWeight,
    pub bias: wgpu::Buffer,
    /// `[E * 2I, H]`: expert e's gate rows then its up rows.
    pub gate_up: GpuWeight,
    /// `[E * H, I]`.
    pub down: GpuWeight,
    /// The shared expert as a dense SwiGLU, where it does not run as a routed expert
    /// (`shared_routed`).
    pub shared: Option<SwiGlu>,
    /// The shared expert is expert E of `gate_up` / `down` (the routed experts are 0..E):
    /// the router appends it to every row's picks with weight 1, and it runs in the same
    /// expert dispatches as the routed ones instead of three of its own. Set where the
    /// experts are resident, the shared expert has their width (`n_shared_experts` = 1) and
    /// its tensors are stored as theirs are.
    pub shared_routed: bool,
    /// Set when the experts stay in the files and `gate_up` / `down` hold only the slots
    /// of [`crate::experts`]'s cache (`[slots * 2I, H]`, `[slots * H, I]`).
    pub source: Option<ExpertSource>,
}

impl Moe {
    /// Expert pairs per row: the router's `k` picks, and the shared expert where it runs
    /// as a routed one.
    pub fn pairs(&self, k: usize) -> usize {
        k + self.shared_routed as usize
    }
}

pub enum Mlp {
    Dense(SwiGlu),
    Moe(Box<Moe>),
}

pub struct Layer {
    pub input_norm: wgpu::Buffer,
    pub post_norm: wgpu::Buffer,
    /// `[q_a | kv_a | indexer wk (full layers)]` over the normalized input.
    pub qkv_a: Proj,
    pub q_a_norm: wgpu::Buffer,
    /// `[q_b | indexer wq_b (full layers)]` over the normalized q LoRA row.
    pub q_b: Proj,
    pub kv_a_norm: wgpu::Buffer,
    pub kv_b: GpuWeight,
    pub o: GpuWeight,
    pub indexer: Option<Indexer>,
    pub mlp: Mlp,
}

pub struct Weights {
    pub embed: GpuWeight,
    /// `None` when tied to the embedding.
    pub lm_head: Option<GpuWeight>,
    pub norm: wgpu::Buffer,
    pub layers: Vec<Layer>,
    /// The multi-token-prediction layer, where loaded.
    pub mtp: Option<Mtp>,
}

impl Weights {
    /// The LM head: `lm_head`, or the embedding where they are tied.
    pub fn head(&self) -> &GpuWeight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Decoder layer `i`: the main model's, then the MTP layer's (`num_hidden_layers`).
    pub fn layer(&self, i: usize) -> Option<&Layer> {
        self.layers.get(i).or_else(|| {
            self.mtp
                .as_ref()
                .filter(|_| i == self.layers.len())
                .map(|m| &m.layer)
        })
    }
}

/// The multi-token-prediction layer (`model.layers.{num_hidden_layers}`), a draft model:
/// the row at position i is `eh_proj · [enorm(embed(t_{i+1})) ; hnorm(h_i)]` (embedding
/// first), with `h_i` the main model's hidden after its final norm; then a full DSA MoE
/// decoder layer with its own caches, `shared_head.norm` and the main LM head. The main
/// embedding and LM head serve it (GLM-5 ships no copies; DeepSeek-V3.2's equal them).
/// Sources: docs/MTP.md.
pub struct Mtp {
    pub enorm: wgpu::Buffer,
    pub hnorm: wgpu::Buffer,
    /// `[H, 2H]`.
    pub eh_proj: GpuWeight,
    /// `shared_head.norm`.
    pub head_norm: wgpu::Buffer,
    pub layer: Layer,
}

/// Progress callback: (bytes uploaded so far, total bytes).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

struct Loader<'a, 'p> {
    gpu: &'a Gpu,
    files: &'a WeightFiles,
    /// q8 / q4 block size from config.json (None: no sparsa quantization declared).
    qconfig: Option<QFormat>,
    done: u64,
    total: u64,
    progress: Progress<'p>,
}

impl<'a> Loader<'a, '_> {
    fn tensor(&self, name: &str) -> Result<TensorRef<'a>> {
        self.files.get(name)
    }

    /// Count uploaded bytes; fails once the GPU's interrupt flag was raised (Ctrl-C).
    fn tick(&mut self, bytes: u64) -> Result<()> {
        self.done += bytes;
        (self.progress)(self.done, self.total);
        if let Some(ms) = crate::fault::injected("SLOW_LOAD_MS") {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        self.gpu.check_interrupt("loading the weights")
    }

    /// A matrix `[rows, cols]` from one tensor.
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<GpuWeight> {
        self.stacked(&[name.to_string()], &[rows], cols, 1, name)
    }

    /// The tensors `names` (`[rows_i, cols]` each) as one [`Proj`]: stacked where they
    /// share a format, else loaded one by one.
    fn proj(
        &mut self,
        names: &[String],
        rows_each: &[usize],
        cols: usize,
        label: &str,
    ) -> Result<Proj> {
        if names.len() > 1 {
            if let Ok(collected) = self.collect(names, rows_each, cols) {
                let w = self.upload_stacked(collected, cols, 1, label, false)?;
                return Ok(Proj { parts: vec![w] });
            }
        }
        let parts = names
            .iter()
            .zip(rows_each)
            .map(|(n, r)| self.matrix(n, *r, cols))
            .collect::<Result<Vec<_>>>()?;
        Ok(Proj { parts })
    }

    /// A floating-point matrix (the embedding table), in host memory that the kernels read
    /// over the bus where `host` ([`crate::gpu::Gpu::host_storage`]).
    fn float_matrix(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        host: bool,
    ) -> Result<GpuWeight> {
        let t = self.files.get(name)?;
        if stored_format(&t, self.qconfig)?.is_some() {
            return Err(Error::msg(format!(
                "tensor {name} in {}: quantized ({:?}), but the embedding table must be F32, BF16 or F16 (`sparsa quantize` keeps it)",
                t.file.display(),
                t.dtype
            )));
        }
        let collected = self.collect(&[name.to_string()], &[rows], cols)?;
        self.upload_stacked(collected, cols, 1, name, host)
    }

    /// A matrix that the kernels need in one storage binding (kv_b: the absorbed
    /// attention reads any head's rows).
    fn single_binding(&mut self, name: &str, rows: usize, cols: usize) -> Result<GpuWeight> {
        let w = self.matrix(name, rows, cols)?;
        if w.chunks.len() > 1 {
            return Err(Error::msg(format!(
                "tensor {name}: {} bytes exceed the adapter's storage binding limit of {} bytes (sparse MLA needs it in one binding)",
                w.bytes(),
                self.gpu.max_binding()
            )));
        }
        Ok(w)
    }

    /// Check that `names` (each `[r_i, cols]`) can stack into one matrix (one format, shapes,
    /// scales present), without reading their values.
    fn collect(
        &self,
        names: &[String],
        rows_each: &[usize],
        cols: usize,
    ) -> Result<(Option<QFormat>, Vec<RowSource<'a>>, u64)> {
        let files = self.files;
        let mut parts = Vec::with_capacity(names.len());
        let mut fmt = None;
        let mut file_bytes = 0u64;
        for (i, (n, r)) in names.iter().zip(rows_each).enumerate() {
            let t = files.get(n)?;
            let f = stored_format(&t, self.qconfig)?;
            if i > 0 && f != fmt {
                return Err(Error::msg(format!(
                    "tensor {n}: stored as {} but {} as {} (one matrix must have one format)",
                    f.map_or("float", |q| q.name()),
                    names[0],
                    fmt.map_or("float", |q| q.name()),
                )));
            }
            fmt = f;
            file_bytes += t.bytes.len() as u64;
            match f {
                None => {
                    t.expect_shape(&[*r, cols])?;
                    parts.push(RowSource::Float(t));
                }
                Some(q) => {
                    let sname = format!("{n}{}", q.scale_suffix());
                    let scale = files.get(&sname).map_err(|_| {
                        Error::msg(format!(
                            "tensor {n} in {}: {} weights need their scales in {sname}, which is missing",
                            t.file.display(),
                            q.name()
                        ))
                    })?;
                    if t.shape.first() != Some(r) {
                        return Err(Error::msg(format!(
                            "tensor {n} in {}: shape {:?}, expected {r} rows from config.json",
                            t.file.display(),
                            t.shape
                        )));
                    }
                    file_bytes += scale.bytes.len() as u64;
                    parts.push(RowSource::Quant(QuantPart { weight: t, scale }));
                }
            }
        }
        Ok((fmt, parts, file_bytes))
    }

    /// A matrix made of several tensors stacked by rows (each `[r_i, cols]`).
    fn stacked(
        &mut self,
        names: &[String],
        rows_each: &[usize],
        cols: usize,
        align: usize,
        label: &str,
    ) -> Result<GpuWeight> {
        let collected = self.collect(names, rows_each, cols)?;
        self.upload_stacked(collected, cols, align, label, false)
    }

    /// Uploads what [`Self::collect`] found as one matrix (a float one into host memory
    /// where `host`: see [`Self::float_matrix`]).
    fn upload_stacked(
        &mut self,
        (fmt, parts, file_bytes): (Option<QFormat>, Vec<RowSource<'a>>, u64),
        cols: usize,
        align: usize,
        label: &str,
        host: bool,
    ) -> Result<GpuWeight> {
        let w = match fmt {
            None => {
                let f: Vec<TensorRef> = parts
                    .into_iter()
                    .filter_map(|p| match p {
                        RowSource::Float(t) => Some(t),
                        RowSource::Quant(_) => None,
                    })
                    .collect();
                GpuWeight::upload_in(self.gpu, &f, cols, align, label, host)?
            }
            Some(q) => {
                let qp: Vec<QuantPart> = parts
                    .into_iter()
                    .filter_map(|p| match p {
                        RowSource::Quant(q) => Some(q),
                        RowSource::Float(_) => None,
                    })
                    .collect();
                GpuWeight::upload_quant(self.gpu, &qp, q, cols, align, None, label)?
            }
        };
        self.tick(file_bytes)?;
        Ok(w)
    }

    /// A small vector as f32.
    fn vector(&mut self, name: &str, len: usize) -> Result<wgpu::Buffer> {
        let t = self.files.get(name)?;
        t.expect_shape(&[len])?;
        let v = t.to_f32()?;
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(Error::msg(format!(
                "tensor {name} in {}: element {i} is {} (weights must be finite)",
                t.file.display(),
                v[i]
            )));
        }
        self.tick(t.bytes.len() as u64)?;
        self.gpu.buffer_from(&v, name)
    }

    fn swiglu(&mut self, p: &str, hidden: usize, inter: usize) -> Result<SwiGlu> {
        let gate_up = self.stacked(
            &[
                format!("{p}.gate_proj.weight"),
                format!("{p}.up_proj.weight"),
            ],
            &[inter, inter],
            hidden,
            1,
            &format!("{p}.gate_up"),
        )?;
        let down = self.matrix(&format!("{p}.down_proj.weight"), hidden, inter)?;
        Ok(SwiGlu {
            gate_up,
            down,
            inter,
        })
    }

    /// How tensor `name` is stored: its quantized format, if any, and its dtype.
    fn storage(&self, name: &str) -> Result<(Option<QFormat>, safetensors::Dtype)> {
        let t = self.files.get(name)?;
        Ok((stored_format(&t, self.qconfig)?, t.dtype))
    }

    /// The routed experts of the MLP at `p`: all of them, or with `slots` < n_routed_experts
    /// that many empty slots and where each expert's tensors are (checked, not read). With
    /// `shared` (the shared expert's prefix), resident per-expert tensors and a shared
    /// expert stored as they are, the shared expert is appended as expert E; the flag says
    /// whether it was.
    fn experts(
        &mut self,
        p: &str,
        cfg: &Config,
        slots: Option<usize>,
        shared: Option<&str>,
    ) -> Result<(GpuWeight, GpuWeight, Option<ExpertSource>, bool)> {
        let (e, h, i) = (
            cfg.n_routed_experts,
            cfg.hidden_size,
            cfg.moe_intermediate_size,
        );
        let slots = slots.filter(|&s| s < e);
        let fused = format!("{p}.experts.gate_up_proj");
        if self.files.contains(&fused) {
            // transformers 5 layout: [E, 2I, H] and [E, H, I] (no `.weight` suffix).
            let t = self.tensor(&fused)?;
            if stored_format(&t, self.qconfig)?.is_some() {
                return Err(Error::msg(format!(
                    "tensor {fused}: quantized fused experts are not supported (store experts per expert, as the releases do)"
                )));
            }
            t.expect_shape(&[e, 2 * i, h])?;
            let dn = format!("{p}.experts.down_proj");
            let d = self.tensor(&dn)?;
            d.expect_shape(&[e, h, i])?;
            if let Some(n) = slots {
                let f = WFormat::Float(t.dtype()?);
                if d.dtype()? != t.dtype()? {
                    return Err(Error::msg(format!(
                        "tensor {dn}: dtype {:?} differs from {:?} of {fused}",
                        d.dtype, t.dtype
                    )));
                }
                let gu = GpuWeight::empty(self.gpu, n * 2 * i, h, f, 2 * i, &fused)?;
                let dw = GpuWeight::empty(self.gpu, n * h, i, f, h, &dn)?;
                self.tick((t.bytes.len() + d.bytes.len()) as u64)?;
                return Ok((
                    gu,
                    dw,
                    Some(ExpertSource::Fused {
                        gate_up: fused,
                        down: dn,
                    }),
                    false,
                ));
            }
            let gu = GpuWeight::upload(self.gpu, &[t], h, 2 * i, &fused)?;
            self.tick(gu.bytes())?;
            // (float only, so GPU bytes equal file bytes)
            let dw = GpuWeight::upload(self.gpu, &[d], i, h, &dn)?;
            self.tick(dw.bytes())?;
            return Ok((gu, dw, None, false));
        }
        let mut gu_names = Vec::with_capacity(2 * e);
        let mut dn_names = Vec::with_capacity(e);
        for x in 0..e {
            gu_names.push(format!("{p}.experts.{x}.gate_proj.weight"));
            gu_names.push(format!("{p}.experts.{x}.up_proj.weight"));
            dn_names.push(format!("{p}.experts.{x}.down_proj.weight"));
        }
        let (gl, dl) = (format!("{p}.experts.gate_up"), format!("{p}.experts.down"));
        if let Some(n) = slots {
            let (gf, gparts, gb) = self.collect(&gu_names, &vec![i; 2 * e], h)?;
            let (df, dparts, db) = self.collect(&dn_names, &vec![h; e], i)?;
            // Each slot matrix takes the format its tensors are stored in (as when resident).
            let format = |f: Option<QFormat>, parts: &[RowSource]| -> Result<WFormat> {
                match (f, parts.first()) {
                    (Some(q), _) => Ok(WFormat::Quant(q)),
                    (None, Some(RowSource::Float(t))) => Ok(WFormat::Float(t.dtype()?)),
                    _ => Err(Error::msg(format!("{gl}: no expert tensors"))),
                }
            };
            let (gfmt, dfmt) = (format(gf, &gparts)?, format(df, &dparts)?);
            let gu = GpuWeight::empty(self.gpu, n * 2 * i, h, gfmt, 2 * i, &gl)?;
            let dw = GpuWeight::empty(self.gpu, n * h, i, dfmt, h, &dl)?;
            self.tick(gb + db)?;
            return Ok((
                gu,
                dw,
                Some(ExpertSource::PerExpert {
                    prefix: format!("{p}.experts"),
                }),
                false,
            ));
        }
        let mut n = e;
        if let Some(sp) = shared {
            let names = ["gate_proj", "up_proj", "down_proj"].map(|m| format!("{sp}.{m}.weight"));
            let mut same = true;
            for (name, like) in names.iter().zip([&gu_names[0], &gu_names[1], &dn_names[0]]) {
                same &= self.files.contains(name) && self.storage(name)? == self.storage(like)?;
            }
            if same {
                let [g, u, d] = names;
                gu_names.extend([g, u]);
                dn_names.push(d);
                n += 1;
            }
        }
        let gu = self.stacked(&gu_names, &vec![i; 2 * n], h, 2 * i, &gl)?;
        let d = self.stacked(&dn_names, &vec![h; n], i, h, &dl)?;
        Ok((gu, d, None, n > e))
    }
}

/// Whether the model's LM head is its embedding table: tied in the config, with no
/// `lm_head.weight` in the files.
pub(super) fn lm_head_is_table(cfg: &Config, files: &WeightFiles) -> bool {
    cfg.tie_word_embeddings && !files.contains("lm_head.weight")
}

/// Upload `files` to the GPU; with `slots` (per layer, from [`crate::model::plan`]) a MoE
/// layer with fewer slots than experts gets empty slots and its experts stay in the files;
/// with `host_embed` the embedding table goes into host memory (the plan left it out).
pub fn load(
    gpu: &Gpu,
    cfg: &Config,
    files: &WeightFiles,
    progress: Progress,
    slots: Option<&[usize]>,
    host_embed: bool,
) -> Result<Weights> {
    let total = files.total_bytes();
    let mut l = Loader {
        gpu,
        files,
        qconfig: cfg.quant,
        done: 0,
        total,
        progress,
    };
    let (h, v) = (cfg.hidden_size, cfg.vocab_size);
    // A tied LM head reads the whole table every step: it stays on the GPU.
    let tied = lm_head_is_table(cfg, files);
    let embed = l.float_matrix("model.embed_tokens.weight", v, h, host_embed && !tied)?;
    let lm_head = if tied {
        None
    } else {
        Some(l.matrix("lm_head.weight", v, h)?)
    };
    let norm = l.vector("model.norm.weight", h)?;
    // The shared expert runs as routed expert E where it can (`Moe::shared_routed`);
    // SPARSA_SHARED_ROUTED=0 keeps it dense (a measurement knob).
    let shared_as_routed = cfg.n_shared_experts == 1
        && std::env::var("SPARSA_SHARED_ROUTED").map_or(true, |v| v != "0");
    let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
    for i in 0..cfg.num_hidden_layers {
        let full = cfg.indexer_types[i] == IndexerKind::Full;
        let kind = (full, cfg.is_dense_layer(i), shared_as_routed);
        layers.push(layer(&mut l, cfg, i, kind, slots.map(|s| s[i]))?);
    }
    // The MTP layer (a draft model; see `Mtp`), where the files hold it: whole, its experts
    // resident also where the other layers' stream (the planner counts it before the slots).
    let n = cfg.num_hidden_layers;
    let mtp = if cfg.num_nextn_predict_layers > 0
        && files.contains(&format!("model.layers.{n}.eh_proj.weight"))
    {
        let p = format!("model.layers.{n}");
        Some(Mtp {
            enorm: l.vector(&format!("{p}.enorm.weight"), h)?,
            hnorm: l.vector(&format!("{p}.hnorm.weight"), h)?,
            eh_proj: l.matrix(&format!("{p}.eh_proj.weight"), h, 2 * h)?,
            head_norm: l.vector(&format!("{p}.shared_head.norm.weight"), h)?,
            layer: layer(&mut l, cfg, n, (true, false, shared_as_routed), None)?,
        })
    } else {
        None
    };
    Ok(Weights {
        embed,
        lm_head,
        norm,
        layers,
        mtp,
    })
}

/// Decoder layer `i` (`model.layers.{i}`); `(full, dense, shared_as_routed)`: it runs its own
/// indexer, its MLP is dense, the shared expert may run as a routed one; `slots`: its
/// expert cache slots where the experts stream.
fn layer(
    l: &mut Loader,
    cfg: &Config,
    i: usize,
    (full, dense, shared_as_routed): (bool, bool, bool),
    slots: Option<usize>,
) -> Result<Layer> {
    let (gpu, files) = (l.gpu, l.files);
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let (dn, dr, dv) = (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim);
    let (ql, kl) = (cfg.q_lora_rank, cfg.kv_lora_rank);
    let p = format!("model.layers.{i}");
    let a = format!("{p}.self_attn");
    let x = format!("{a}.indexer");
    let indexer = if full {
        Some(Indexer {
            k_norm_w: l.vector(&format!("{x}.k_norm.weight"), cfg.index_head_dim)?,
            k_norm_b: l.vector(&format!("{x}.k_norm.bias"), cfg.index_head_dim)?,
            weights_proj: l.matrix(&format!("{x}.weights_proj.weight"), cfg.index_n_heads, h)?,
        })
    } else {
        None
    };
    // The projections that share an input, with the indexer's on full layers.
    let mut names = vec![
        format!("{a}.q_a_proj.weight"),
        format!("{a}.kv_a_proj_with_mqa.weight"),
    ];
    let mut rows = vec![ql, kl + dr];
    if full {
        names.push(format!("{x}.wk.weight"));
        rows.push(cfg.index_head_dim);
    }
    let qkv_a = l.proj(&names, &rows, h, &format!("{a}.qkv_a"))?;
    let mut names = vec![format!("{a}.q_b_proj.weight")];
    let mut rows = vec![heads * (dn + dr)];
    if full {
        names.push(format!("{x}.wq_b.weight"));
        rows.push(cfg.index_n_heads * cfg.index_head_dim);
    }
    let q_b = l.proj(&names, &rows, ql, &format!("{a}.q_b"))?;
    let mlp = if dense {
        Mlp::Dense(l.swiglu(&format!("{p}.mlp"), h, cfg.intermediate_size)?)
    } else {
        let m = format!("{p}.mlp");
        let router = l.matrix(&format!("{m}.gate.weight"), cfg.n_routed_experts, h)?;
        let bname = format!("{m}.gate.e_score_correction_bias");
        let bias = if files.contains(&bname) {
            l.vector(&bname, cfg.n_routed_experts)?
        } else {
            gpu.buffer_from(&vec![0f32; cfg.n_routed_experts], &bname)?
        };
        let sp = format!("{m}.shared_experts");
        let fuse = shared_as_routed.then_some(sp.as_str());
        let (gate_up, down, source, shared_routed) = l.experts(&m, cfg, slots, fuse)?;
        let shared = if cfg.n_shared_experts > 0 && !shared_routed {
            Some(l.swiglu(&sp, h, cfg.moe_intermediate_size * cfg.n_shared_experts)?)
        } else {
            None
        };
        Mlp::Moe(Box::new(Moe {
            router,
            bias,
            gate_up,
            down,
            shared,
            shared_routed,
            source,
        }))
    };
    let layer = Layer {
        input_norm: l.vector(&format!("{p}.input_layernorm.weight"), h)?,
        post_norm: l.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
        qkv_a,
        q_a_norm: l.vector(&format!("{a}.q_a_layernorm.weight"), ql)?,
        q_b,
        kv_a_norm: l.vector(&format!("{a}.kv_a_layernorm.weight"), kl)?,
        kv_b: l.single_binding(&format!("{a}.kv_b_proj.weight"), heads * (dn + dv), kl)?,
        o: l.matrix(&format!("{a}.o_proj.weight"), h, heads * dv)?,
        indexer,
        mlp,
    };
    gpu.check()
        .map_err(|e| e.context(format!("uploading layer {i}")))?;
    Ok(layer)
}
