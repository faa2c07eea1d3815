//! Expert offloading: run models whose routed experts do not fit the GPU.
//!
//! With `--gpu-memory SIZE`, the loader's plan (`crate::model::plan`) places everything but
//! the routed experts (embeddings, attention and indexer, dense MLPs, shared experts, the
//! caches for the context, scratch) and turns the rest of the budget into a fixed number of
//! expert *slots* per MoE layer ([`Slots`]). A layer with fewer slots than experts keeps its
//! experts in the memory-mapped files; this module is the runtime cache that serves them.
//!
//! Each forward chunk, such a layer's router runs on the GPU as usual; then the host reads
//! the chosen expert ids (`rows × k` u32), asks the layer's [`SlotTable`] where each goes,
//! uploads the missing experts' bytes from the mmap into their slots (through the API's
//! staging memory, no other host copy), and runs the expert matmuls on a slot-index table
//! instead of the expert ids. When a chunk needs more distinct experts than the layer has
//! slots (a prefill chunk with one slot per layer), it runs in rounds, each serving the
//! pairs whose expert it made resident. The kernels are the resident ones: a slot is an
//! expert's rows, in the same layout, so outputs are bit-identical to the resident run.
//!
//! The host waits for the routing of every offloaded layer (one round trip per layer and
//! chunk); uploads go into the one queue, so they run between the layer's router and its
//! expert matmuls. [`ExpertStats`] counts what it costs.

#[cfg(not(target_arch = "wasm32"))]
pub mod cpu;
pub mod policy;

pub use policy::{Policy, SlotTable, NONE};

use crate::error::{Error, Result};
use crate::gpu::{Gpu, Write};
use crate::weights::{GpuWeight, QuantPart, RowSource, WFormat, WeightFiles};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Seconds since an instant, natively (the browser never offloads: no clock needed there).
struct Clock(#[cfg(not(target_arch = "wasm32"))] std::time::Instant);

impl Clock {
    fn now() -> Clock {
        Clock(
            #[cfg(not(target_arch = "wasm32"))]
            std::time::Instant::now(),
        )
    }
    fn secs(&self) -> f64 {
        #[cfg(not(target_arch = "wasm32"))]
        return self.0.elapsed().as_secs_f64();
        #[cfg(target_arch = "wasm32")]
        0.0
    }
}

/// How many routed experts of each layer the GPU holds: a layer with fewer slots than
/// experts keeps the others in the files and streams them through its slots.
#[derive(Clone, Debug)]
pub struct Slots {
    /// Per layer: 0 on dense layers, `n_experts` where the whole layer fits.
    pub per_layer: Vec<usize>,
    /// Routed experts per MoE layer.
    pub n_experts: usize,
    /// GPU bytes of one routed expert (gate, up and down with their scales).
    pub expert_bytes: u64,
}

impl Slots {
    /// Whether some layer streams its experts.
    pub fn offloads(&self) -> bool {
        self.per_layer.iter().any(|&s| s > 0 && s < self.n_experts)
    }

    pub fn resident_experts(&self) -> usize {
        self.per_layer.iter().sum()
    }

    pub fn moe_layers(&self) -> usize {
        self.per_layer.iter().filter(|&&s| s > 0).count()
    }
}

/// Where one MoE layer's routed experts are in the files.
#[derive(Clone, Debug)]
pub enum ExpertSource {
    /// `{prefix}.{e}.{gate,up,down}_proj.weight` (+ scales), as the releases ship them.
    PerExpert { prefix: String },
    /// transformers 5's fused float `[E, 2I, H]` and `[E, H, I]`.
    Fused { gate_up: String, down: String },
}

/// What offloading did since the counters were last taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct ExpertStats {
    /// Tokens run through the MoE layers (rows of the forward chunks).
    pub tokens: u64,
    /// Routed (token, expert) pairs on offloaded layers, and those whose expert was resident.
    pub uses: u64,
    pub hits: u64,
    /// Experts uploaded and their bytes.
    pub uploads: u64,
    pub bytes: u64,
    /// Host seconds spent copying expert bytes into the API's staging memory.
    pub upload_s: f64,
    /// Host seconds spent waiting for the routing of offloaded layers (the GPU finishing
    /// the work queued before it).
    pub wait_s: f64,
    /// Routing readbacks, and rounds of expert matmuls (more than one per readback when a
    /// chunk needs more experts than the layer has slots).
    pub syncs: u64,
    pub rounds: u64,
    /// Prefetch (`--expert-prefetch`): the next layer's experts predicted by applying its
    /// router to this layer's input, how many of them the next layer then chose, the
    /// predicted experts uploaded ahead (missing ones) and how many of those were used.
    pub predicted: u64,
    pub predicted_right: u64,
    pub prefetched: u64,
    pub prefetched_used: u64,
}

impl ExpertStats {
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.uses.max(1) as f64
    }

    /// Bytes uploaded per token.
    pub fn bytes_per_token(&self) -> f64 {
        self.bytes as f64 / self.tokens.max(1) as f64
    }

    /// Host→staging bandwidth of the uploads (bytes per second of `upload_s`).
    pub fn upload_bandwidth(&self) -> f64 {
        self.bytes as f64 / self.upload_s.max(1e-9)
    }

    pub fn since(&self, before: &ExpertStats) -> ExpertStats {
        ExpertStats {
            tokens: self.tokens - before.tokens,
            uses: self.uses - before.uses,
            hits: self.hits - before.hits,
            uploads: self.uploads - before.uploads,
            bytes: self.bytes - before.bytes,
            upload_s: self.upload_s - before.upload_s,
            wait_s: self.wait_s - before.wait_s,
            syncs: self.syncs - before.syncs,
            rounds: self.rounds - before.rounds,
            predicted: self.predicted - before.predicted,
            predicted_right: self.predicted_right - before.predicted_right,
            prefetched: self.prefetched - before.prefetched,
            prefetched_used: self.prefetched_used - before.prefetched_used,
        }
    }

    /// One line for `/stats` and `bench`.
    pub fn line(&self) -> String {
        let mut l = self.cache_line();
        if self.predicted > 0 {
            l.push_str(&format!(
                "; prefetch: {:.1} % of predictions right, {} experts uploaded ahead, {} of them used",
                100.0 * self.predicted_right as f64 / self.predicted as f64,
                self.prefetched,
                self.prefetched_used
            ));
        }
        l
    }

    fn cache_line(&self) -> String {
        format!(
            "experts: hit rate {:.1} % ({} of {} uses), {} uploads, {:.1} MiB per token, staging {:.2} GB/s, stalled {:.3} s on uploads (host copying, GPU idle) + {:.3} s waiting for routing, {} readbacks, {} rounds",
            100.0 * self.hit_rate(),
            self.hits,
            self.uses,
            self.uploads,
            self.bytes_per_token() / (1u64 << 20) as f64,
            self.upload_bandwidth() / 1e9,
            self.upload_s,
            self.wait_s,
            self.syncs,
            self.rounds
        )
    }
}

/// A synthetic routing that replaces the router's choices (benchmarks: random weights route
/// near-uniformly, real models do not). Per layer a fixed random order of the experts; each
/// token draws k distinct ones with probability ∝ 1 / (rank + 1)^s (Zipf).
pub struct Replay {
    s: f64,
    rng: u64,
    order: Vec<Vec<u32>>,
    cdf: Vec<f64>,
}

/// One xorshift64 step.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

impl Replay {
    pub fn zipf(s: f64, n_layers: usize, n_experts: usize, seed: u64) -> Replay {
        let mut rng = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut next = || xorshift(&mut rng);
        let order = (0..n_layers)
            .map(|_| {
                let mut o: Vec<u32> = (0..n_experts as u32).collect();
                for i in (1..o.len()).rev() {
                    o.swap(i, (next() % (i as u64 + 1)) as usize);
                }
                o
            })
            .collect();
        let mut cdf = Vec::with_capacity(n_experts);
        let mut acc = 0.0;
        for r in 0..n_experts {
            acc += 1.0 / ((r + 1) as f64).powf(s);
            cdf.push(acc);
        }
        Replay {
            s,
            rng: next(),
            order,
            cdf,
        }
    }

    pub fn exponent(&self) -> f64 {
        self.s
    }

    fn draw(&mut self, layer: usize, k: usize) -> Vec<u32> {
        let total = *self.cdf.last().unwrap_or(&1.0);
        let mut out: Vec<u32> = Vec::with_capacity(k);
        while out.len() < k.min(self.cdf.len()) {
            let u = (xorshift(&mut self.rng) >> 11) as f64 / (1u64 << 53) as f64 * total;
            let r = self
                .cdf
                .partition_point(|&c| c <= u)
                .min(self.cdf.len() - 1);
            let e = self.order[layer][r];
            if !out.contains(&e) {
                out.push(e);
            }
        }
        out
    }
}

struct LayerState {
    table: SlotTable,
    /// Experts whose bytes were checked on their first upload (finite values).
    checked: Vec<bool>,
    /// Experts uploaded by a prefetch and not used since.
    prefetched: Vec<bool>,
    /// The experts the previous layer predicted for this one's next chunk.
    predicted: Vec<u32>,
}

/// The routed-expert cache of a model loaded under a budget.
pub struct Offload {
    pub slots: Slots,
    pub policy: Policy,
    /// Upload the next layer's predicted experts while this layer's run (decode steps).
    pub prefetch: bool,
    files: WeightFiles,
    layers: Vec<Option<Mutex<LayerState>>>,
    stats: Mutex<ExpertStats>,
    replay: Mutex<Option<Replay>>,
    /// Per layer, the routing of every chunk while recording (`rows × k` ids each).
    trace: Mutex<Option<Vec<Vec<Vec<u32>>>>>,
    /// Expert bytes were read from the files since the last [`Offload::check_files`].
    files_read: AtomicBool,
}

impl Offload {
    pub fn new(slots: Slots, policy: Policy, prefetch: bool, files: WeightFiles) -> Offload {
        let e = slots.n_experts;
        let layers = slots
            .per_layer
            .iter()
            .map(|&s| {
                (s > 0 && s < e).then(|| {
                    Mutex::new(LayerState {
                        table: SlotTable::new(s, e, policy),
                        checked: vec![false; e],
                        prefetched: vec![false; e],
                        predicted: Vec::new(),
                    })
                })
            })
            .collect();
        Offload {
            slots,
            policy,
            prefetch,
            files,
            layers,
            stats: Mutex::new(ExpertStats::default()),
            replay: Mutex::new(None),
            trace: Mutex::new(None),
            files_read: AtomicBool::new(false),
        }
    }

    /// Whether layer `i` streams its experts.
    pub fn offloaded(&self, i: usize) -> bool {
        self.layers.get(i).is_some_and(|l| l.is_some())
    }

    pub fn stats(&self) -> ExpertStats {
        *crate::gpu::lock(&self.stats)
    }

    /// Replace the routers' choices by a synthetic routing (benchmarks only).
    pub fn set_replay(&self, r: Option<Replay>) {
        *crate::gpu::lock(&self.replay) = r;
    }

    /// The Zipf exponent of the replayed routing, if one replaces the routers'.
    pub fn replay_exponent(&self) -> Option<f64> {
        crate::gpu::lock(&self.replay)
            .as_ref()
            .map(|r| r.exponent())
    }

    /// Start (or stop, returning it) recording the routing of every offloaded layer.
    pub fn record_trace(&self, on: bool) -> Option<Vec<Vec<Vec<u32>>>> {
        let mut t = crate::gpu::lock(&self.trace);
        let old = t.take();
        if on {
            *t = Some(vec![Vec::new(); self.layers.len()]);
        }
        old
    }

    /// Serve layer `i`'s routed pairs `experts` (`rows × k` ids from its router): uploads the
    /// experts each round needs into the slots of `gate_up` / `down` and returns, per round,
    /// the slot table for the expert matmuls. `run` records and submits one round's matmuls
    /// (it is called once per round, after that round's uploads were queued).
    #[allow(clippy::too_many_arguments)]
    pub fn serve(
        &self,
        gpu: &Gpu,
        i: usize,
        source: &ExpertSource,
        mut experts: Vec<u32>,
        rows: usize,
        gate_up: &GpuWeight,
        down: &GpuWeight,
        mut run: impl FnMut(&[u32]) -> Result<()>,
    ) -> Result<()> {
        let layer = self.layers[i]
            .as_ref()
            .ok_or_else(|| Error::msg(format!("layer {i} keeps all its experts on the GPU")))?;
        let e = self.slots.n_experts;
        if let Some(r) = crate::gpu::lock(&self.replay).as_mut() {
            let k = experts.len() / rows.max(1);
            experts = (0..rows).flat_map(|_| r.draw(i, k)).collect();
        }
        if let Some(&bad) = experts.iter().find(|&&x| x as usize >= e) {
            return Err(Error::msg(format!(
                "layer {i}: the router chose expert {bad} of {e}"
            )));
        }
        if let Some(t) = crate::gpu::lock(&self.trace).as_mut() {
            t[i].push(experts.clone());
        }
        let mut st = crate::gpu::lock(layer);
        let predicted = std::mem::take(&mut st.predicted);
        let (mut used_ahead, mut right) = (0u64, 0u64);
        for &x in &predicted {
            right += u64::from(experts.contains(&x));
        }
        for &x in &experts {
            if std::mem::take(&mut st.prefetched[x as usize]) {
                used_ahead += 1;
            }
        }
        {
            let mut s = crate::gpu::lock(&self.stats);
            s.predicted += predicted.len() as u64;
            s.predicted_right += right;
            s.prefetched_used += used_ahead;
        }
        let rounds = st.table.place(&experts);
        for _ in 0..rows {
            st.table.tick();
        }
        for round in &rounds {
            self.stage(gpu, &mut st, source, &round.uploads, (gate_up, down), false)?;
            {
                let mut s = crate::gpu::lock(&self.stats);
                s.uses += round.served as u64;
                s.hits += round.hits as u64;
                s.rounds += 1;
            }
            if let Err(err) = run(&round.slots) {
                // What the slots hold is unknown now.
                st.table.clear();
                return Err(err);
            }
        }
        Ok(())
    }

    /// Prefetch for layer `i`: the experts `predicted` for its next chunk (its router applied
    /// to the previous layer's input) are uploaded now, into slots the policy frees; the
    /// writes go with the next submission. Prefetched experts that were already resident
    /// cost nothing.
    pub fn prefetch(
        &self,
        gpu: &Gpu,
        i: usize,
        source: &ExpertSource,
        predicted: Vec<u32>,
        gate_up: &GpuWeight,
        down: &GpuWeight,
    ) -> Result<()> {
        let Some(layer) = self.layers.get(i).and_then(|l| l.as_ref()) else {
            return Ok(());
        };
        let e = self.slots.n_experts;
        if predicted.iter().any(|&x| x as usize >= e) {
            return Err(Error::msg(format!(
                "layer {i}: a prefetch prediction is out of range"
            )));
        }
        let mut st = crate::gpu::lock(layer);
        let uploads = st.table.prefetch(&predicted);
        self.stage(gpu, &mut st, source, &uploads, (gate_up, down), true)?;
        st.predicted = predicted;
        crate::gpu::lock(&self.stats).prefetched += uploads.len() as u64;
        Ok(())
    }

    /// Queue the writes that put each `(expert, slot)` of `uploads` into the slots of
    /// `gate_up` / `down` (the values checked on an expert's first upload), marking the
    /// experts as prefetched or not, and count them.
    fn stage(
        &self,
        gpu: &Gpu,
        st: &mut LayerState,
        source: &ExpertSource,
        uploads: &[(u32, u32)],
        (gate_up, down): (&GpuWeight, &GpuWeight),
        prefetched: bool,
    ) -> Result<()> {
        let t0 = Clock::now();
        let n = st.table.slots();
        let (rpe_gu, rpe_dn) = (gate_up.rows / n, down.rows / n);
        let mut writes = Vec::new();
        let mut bytes = 0;
        for &(x, slot) in uploads {
            let check = !st.checked[x as usize];
            let sl = (slot as usize, rpe_gu, rpe_dn);
            bytes += self.upload(&mut writes, source, x, sl, (gate_up, down), check)?;
            st.checked[x as usize] = true;
            st.prefetched[x as usize] = prefetched;
        }
        gpu.write_batch(&writes);
        self.files_read.store(true, Ordering::Relaxed);
        let mut s = crate::gpu::lock(&self.stats);
        s.uploads += uploads.len() as u64;
        s.bytes += bytes;
        s.upload_s += t0.secs();
        Ok(())
    }

    /// Count a chunk's rows and the wait for a routing readback.
    pub fn count_sync(&self, rows: usize, wait_s: f64, first_layer: bool) {
        let mut s = crate::gpu::lock(&self.stats);
        s.syncs += 1;
        s.wait_s += wait_s;
        if first_layer {
            s.tokens += rows as u64;
        }
    }

    /// Index of the first offloaded layer (where a chunk's tokens are counted).
    pub fn first_layer(&self) -> Option<usize> {
        self.layers.iter().position(|l| l.is_some())
    }

    /// The writes that put expert `x` into slot `slot.0` (`slot.1` / `slot.2`: rows per
    /// expert of gate_up / down).
    fn upload<'a>(
        &'a self,
        writes: &mut Vec<Write<'a>>,
        source: &ExpertSource,
        x: u32,
        (slot, rpe_gu, rpe_dn): (usize, usize, usize),
        (gate_up, down): (&GpuWeight, &GpuWeight),
        check: bool,
    ) -> Result<u64> {
        let f = &self.files;
        // A tensor as rows of `w`'s format (gate_up and down may be stored differently).
        let part = |name: &str, w: &GpuWeight| -> Result<RowSource> {
            let t = f.get(name)?;
            Ok(match w.format {
                WFormat::Quant(q) => {
                    let scale = f.get(&format!("{name}{}", q.scale_suffix()))?;
                    RowSource::Quant(QuantPart { weight: t, scale })
                }
                WFormat::Float(_) => RowSource::Float(t),
            })
        };
        let slice = |name: &str, rows: usize| -> Result<RowSource> {
            let mut t = f.get(name)?;
            let per = t.bytes.len() / self.slots.n_experts;
            t.bytes = &t.bytes[x as usize * per..(x as usize + 1) * per];
            t.shape = vec![rows, t.shape.last().copied().unwrap_or(0)];
            t.name = format!("{name}[{x}]");
            Ok(RowSource::Float(t))
        };
        let (gu, dn) = match source {
            ExpertSource::PerExpert { prefix } => (
                vec![
                    part(&format!("{prefix}.{x}.gate_proj.weight"), gate_up)?,
                    part(&format!("{prefix}.{x}.up_proj.weight"), gate_up)?,
                ],
                vec![part(&format!("{prefix}.{x}.down_proj.weight"), down)?],
            ),
            ExpertSource::Fused {
                gate_up: g,
                down: d,
            } => (vec![slice(g, rpe_gu)?], vec![slice(d, rpe_dn)?]),
        };
        let b = gate_up.write_rows(writes, slot * rpe_gu, &gu, check)?
            + down.write_rows(writes, slot * rpe_dn, &dn, check)?;
        Ok(b)
    }

    /// Fails if a model file changed since it was mapped, when expert bytes were read from
    /// the files since the last call (a chunk that uploaded nothing read nothing, and costs
    /// no `stat` of every shard).
    pub fn check_files(&self) -> Result<()> {
        if self.files_read.swap(false, Ordering::Relaxed) {
            self.files.check_unchanged()?;
        }
        Ok(())
    }
}
