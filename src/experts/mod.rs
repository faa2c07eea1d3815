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
#[cfg(not(target_arch = "wasm32"))]
pub mod pool;

pub use policy::{Policy, SlotTable, NONE};

use crate::error::{Error, Result};
use crate::gpu::{BufferCopy, Gpu, Write};
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

/// Where a decode step's missed experts run (`--cpu-experts`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuExperts {
    /// Every miss is uploaded into a slot (the GPU runs every expert).
    Off,
    /// Misses of chunks of at most [`CPU_MAX_ROWS`] rows run on the CPU, except those the
    /// cache takes in (empty slots, hot experts).
    On,
    /// As `On`, but a miss is uploaded instead where the measured rates say uploading is
    /// cheaper (its rows × upload rate above the CPU's rate).
    Auto,
}

/// The most rows a chunk may have for its misses to run on the CPU: a prefill chunk's many
/// rows per expert favour the GPU.
pub const CPU_MAX_ROWS: usize = 16;

impl std::str::FromStr for CpuExperts {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<CpuExperts, String> {
        match s {
            "off" => Ok(CpuExperts::Off),
            "on" => Ok(CpuExperts::On),
            "auto" => Ok(CpuExperts::Auto),
            _ => Err(format!("expected auto, on or off, got {s:?}")),
        }
    }
}

impl std::fmt::Display for CpuExperts {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            CpuExperts::Off => "off",
            CpuExperts::On => "on",
            CpuExperts::Auto => "auto",
        })
    }
}

/// Whether the offloaded layers' experts get a copy in host memory that the GPU copies
/// slots from (`--expert-host-copy`; also whether the embedding table is kept in host memory,
/// `--host-embeddings`, see [`crate::model::Budget`]): an upload is then the GPU's own read
/// over the bus,
/// with no host thread copying, so it runs beside the CPU's experts instead of taking their
/// memory bandwidth twice (a read from the files and a write into staging).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostCopy {
    /// On a discrete GPU (one across a bus: an integrated GPU or a CPU adapter shares the
    /// host's memory, so a copy would only double it) that keeps buffers in host memory,
    /// where the copy takes at most half the host memory available.
    #[default]
    Auto,
    On,
    Off,
}

impl std::str::FromStr for HostCopy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<HostCopy, String> {
        Ok(match s.parse::<CpuExperts>()? {
            CpuExperts::Off => HostCopy::Off,
            CpuExperts::On => HostCopy::On,
            CpuExperts::Auto => HostCopy::Auto,
        })
    }
}

impl HostCopy {
    /// Whether to keep `bytes` in host memory for `gpu` to read: `Auto` on a discrete GPU
    /// that keeps buffers there, where they take at most half the host memory available.
    pub fn wanted(self, gpu: &Gpu, bytes: u64) -> bool {
        match self {
            HostCopy::Off => false,
            HostCopy::On => true,
            HostCopy::Auto => {
                #[cfg(not(target_arch = "wasm32"))]
                let fits = available_memory().is_some_and(|a| bytes <= a / 2);
                #[cfg(target_arch = "wasm32")]
                let fits = {
                    // No host memory to count in a browser: no host buffers either.
                    let _ = bytes;
                    false
                };
                fits && gpu.adapter.is_discrete() && gpu.host_buffers()
            }
        }
    }
}

impl std::fmt::Display for HostCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            HostCopy::Off => "off",
            HostCopy::On => "on",
            HostCopy::Auto => "auto",
        })
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
    /// Of the uploads, those the GPU copied from the experts' host copy
    /// (`--expert-host-copy`), with no host copy in their way, and their bytes.
    pub copied: u64,
    pub copied_bytes: u64,
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
    /// Hybrid runs (`--cpu-experts`): routed pairs computed on the CPU, the experts they
    /// read (one read per expert and chunk) and their bytes, and the host seconds the CPU
    /// spent on them (the GPU's part of the layer runs meanwhile).
    pub cpu_pairs: u64,
    pub cpu_experts: u64,
    pub cpu_bytes: u64,
    pub cpu_s: f64,
    /// Host seconds a submission waited for the CPU's part to finish: the rest of `cpu_s`
    /// overlapped the host's recording of what follows.
    pub cpu_wait_s: f64,
}

impl ExpertStats {
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.uses.max(1) as f64
    }

    /// Bytes uploaded per token.
    pub fn bytes_per_token(&self) -> f64 {
        self.bytes as f64 / self.tokens.max(1) as f64
    }

    /// Host→staging bandwidth of the uploads the host wrote (bytes per second of
    /// `upload_s`).
    pub fn upload_bandwidth(&self) -> f64 {
        (self.bytes - self.copied_bytes) as f64 / self.upload_s.max(1e-9)
    }

    pub fn since(&self, before: &ExpertStats) -> ExpertStats {
        ExpertStats {
            tokens: self.tokens - before.tokens,
            uses: self.uses - before.uses,
            hits: self.hits - before.hits,
            uploads: self.uploads - before.uploads,
            bytes: self.bytes - before.bytes,
            upload_s: self.upload_s - before.upload_s,
            copied: self.copied - before.copied,
            copied_bytes: self.copied_bytes - before.copied_bytes,
            wait_s: self.wait_s - before.wait_s,
            syncs: self.syncs - before.syncs,
            rounds: self.rounds - before.rounds,
            predicted: self.predicted - before.predicted,
            predicted_right: self.predicted_right - before.predicted_right,
            prefetched: self.prefetched - before.prefetched,
            prefetched_used: self.prefetched_used - before.prefetched_used,
            cpu_pairs: self.cpu_pairs - before.cpu_pairs,
            cpu_experts: self.cpu_experts - before.cpu_experts,
            cpu_bytes: self.cpu_bytes - before.cpu_bytes,
            cpu_s: self.cpu_s - before.cpu_s,
            cpu_wait_s: self.cpu_wait_s - before.cpu_wait_s,
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
        if self.copied > 0 {
            l.push_str(&format!(
                "; {} of the uploads ({:.1} MiB per token) copied by the GPU from the host copy",
                self.copied,
                self.copied_bytes as f64 / self.tokens.max(1) as f64 / (1u64 << 20) as f64,
            ));
        }
        if self.cpu_pairs > 0 {
            l.push_str(&format!(
                "; CPU: {} pairs of {} uses ({} expert reads, {:.1} MiB per token) in {:.3} s, {:.2} GB/s, the host waiting {:.3} s of it",
                self.cpu_pairs,
                self.uses,
                self.cpu_experts,
                self.cpu_bytes as f64 / self.tokens.max(1) as f64 / (1u64 << 20) as f64,
                self.cpu_s,
                self.cpu_bytes as f64 / self.cpu_s.max(1e-9) / 1e9,
                self.cpu_wait_s
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

/// The pairs of a hybrid round left to the CPU ([`Offload::serve_hybrid`]).
pub struct CpuPart {
    /// The MoE layer.
    pub layer: usize,
    /// Pairs per row, and the experts' intermediate size (read by the CPU executor, which
    /// the browser build does not have).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    k: usize,
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    inter: usize,
    /// Every pair's expert.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    experts: Vec<u32>,
    /// The missed experts in order of first use, each with the pairs (indices into
    /// `experts`) that chose it.
    order: Vec<(u32, Vec<usize>)>,
}

impl CpuPart {
    /// The pairs the CPU runs, in the order of [`Offload::run_cpu`]'s outputs.
    pub fn pairs(&self) -> impl Iterator<Item = usize> + '_ {
        self.order.iter().flat_map(|(_, ps)| ps.iter().copied())
    }
}

/// The routed-expert cache of a model loaded under a budget.
pub struct Offload {
    pub slots: Slots,
    pub policy: Policy,
    /// Upload the next layer's predicted experts while this layer's run (decode steps).
    pub prefetch: bool,
    files: WeightFiles,
    layers: Vec<Option<Mutex<LayerState>>>,
    /// Per layer, all its experts in host memory where [`HostCopy`] made them (gate_up's
    /// and down's rows, expert x at the place of slot x).
    host: Vec<Option<(GpuWeight, GpuWeight)>>,
    stats: Mutex<ExpertStats>,
    replay: Mutex<Option<Replay>>,
    /// Per layer, the routing of every chunk while recording (`rows × k` ids each).
    trace: Mutex<Option<Vec<Vec<Vec<u32>>>>>,
    /// Expert bytes were read from the files since the last [`Offload::check_files`].
    files_read: AtomicBool,
    /// Where decode steps' misses run.
    pub cpu: CpuExperts,
    /// The CPU executor's threads (`--cpu-threads`), its scratch (intermediates, outputs)
    /// and the measured rates that `Auto` decides by.
    #[cfg(not(target_arch = "wasm32"))]
    pool: Option<pool::Pool>,
    #[cfg(not(target_arch = "wasm32"))]
    scratch: Mutex<(cpu::Scratch, Vec<f32>)>,
    rates: Mutex<Rates>,
}

/// The CPU executor's threads without `--cpu-threads`: one per logical CPU but one, which
/// the host's thread keeps busy (it records the next layer while the CPU's part runs, and
/// polls for the routing); all of them on machines of fewer than 4. A run's outputs do not
/// depend on the count (each output row is one task's).
#[cfg(not(target_arch = "wasm32"))]
pub fn default_cpu_threads() -> usize {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n >= 4 {
        n - 1
    } else {
        n
    }
}

/// How long the executor's idle threads spin for the next job before they sleep: 5 ms on a
/// GPU (a hybrid decode step's offloaded layers come about 1–3 ms apart, so the threads are
/// awake for each; waking sleeping threads cost 0.3 ms a job on the development machine),
/// none on a CPU adapter, whose threads need the cores. `SPARSA_CPU_SPIN_US` sets it (a
/// measurement aid).
#[cfg(not(target_arch = "wasm32"))]
fn cpu_spin(cpu_adapter: bool) -> std::time::Duration {
    let us = crate::knobs::knob!("SPARSA_CPU_SPIN_US", |v| v <= 1_000_000)
        .unwrap_or(if cpu_adapter { 0 } else { 5000 });
    std::time::Duration::from_micros(us as u64)
}

/// How many of a hybrid round's `misses` (of `bytes` each) the GPU copies from the host copy
/// while the CPU computes the others: the count that has the slower of the two ways finish
/// first, by their measured rates (bytes per second; `cpu`, `up`) and the copies' fixed
/// cost a round (`start`, seconds: the submission before them and the matmuls after, which
/// tip the close cases to the CPU); none until the CPU's rate is known (the first hybrid
/// round measures it). `SPARSA_HOST_COPY_SHARE` (percent of the misses) sets it instead, a
/// measurement aid.
#[cfg(not(target_arch = "wasm32"))]
fn copy_lane(
    misses: usize,
    cpu: Option<f64>,
    up: Option<f64>,
    (bytes, start): (f64, f64),
) -> usize {
    if let Some(p) = crate::knobs::knob!("SPARSA_HOST_COPY_SHARE", |v| v <= 100) {
        return (misses as f64 * p as f64 / 100.0).round() as usize;
    }
    let (Some(c), Some(u)) = (cpu, up) else {
        return 0;
    };
    if c <= 0.0 || u <= 0.0 {
        return 0;
    }
    let copies = |n: usize| match n {
        0 => 0.0,
        n => start + n as f64 * bytes / u,
    };
    let time = |n: usize| copies(n).max((misses - n) as f64 * bytes / c);
    (0..=misses)
        .min_by(|&a, &b| time(a).total_cmp(&time(b)))
        .unwrap_or(0)
}

/// The host memory available now (`MemAvailable` of /proc/meminfo), where known.
#[cfg(not(target_arch = "wasm32"))]
fn available_memory() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Rows `row0 .. row0 + n` (of `k` columns) of a matrix stored as `parts` (their rows one
/// after the other) as the CPU executor reads them: a float part in its file type, sliced
/// at any row; a quantized part (`format`) whole, with its scales.
#[cfg(not(target_arch = "wasm32"))]
fn cpu_rows<'a>(
    parts: &[RowSource<'a>],
    format: WFormat,
    row0: usize,
    n: usize,
    k: usize,
) -> Result<cpu::CpuMatrix<'a>> {
    let mut start = 0;
    for p in parts {
        let (t, scale) = p.tensors();
        let rows = t.shape.first().copied().unwrap_or(0);
        if row0 >= start + rows {
            start += rows;
            continue;
        }
        let at = row0 - start;
        return match scale {
            None => {
                let d = t.dtype()?;
                let rb = k * d.size();
                let bytes = t.bytes.get(at * rb..(at + n) * rb).ok_or_else(|| {
                    Error::msg(format!(
                        "{}: rows {at}..{} lie past its bytes",
                        t.name,
                        at + n
                    ))
                })?;
                cpu::CpuMatrix::new(&t.name, WFormat::Float(d), bytes, &[], n, k)
            }
            Some(s) if at == 0 => cpu::CpuMatrix::new(&t.name, format, t.bytes, s.bytes, n, k),
            Some(_) => Err(Error::msg(format!(
                "{}: a quantized matrix is read whole, not from row {at}",
                t.name
            ))),
        };
    }
    Err(Error::msg(format!(
        "an expert matrix of {start} rows has no rows {row0}..{}",
        row0 + n
    )))
}

/// Measured rates (exponential averages), in bytes per second: the CPU executor's (expert
/// bytes times rows per expert) and the uploads' host copies.
#[derive(Default)]
struct Rates {
    /// Read only where the CPU runs experts (natively).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    cpu: Option<f64>,
    upload: Option<f64>,
    /// The GPU's copies from the host copy (measured when it is made).
    copy: Option<f64>,
    /// Seconds a round of those copies costs besides its bytes (measured with `copy`: one
    /// expert's copy submitted and waited for, less its bytes at that rate).
    copy_start: f64,
}

impl Rates {
    fn add(avg: &mut Option<f64>, bytes: f64, secs: f64) {
        if bytes > 0.0 && secs > 0.0 {
            let r = bytes / secs;
            *avg = Some(avg.map_or(r, |a| 0.8 * a + 0.2 * r));
        }
    }
}

impl Offload {
    /// `cpu_threads`: the CPU executor's threads (0: [`default_cpu_threads`]).
    /// `cpu_adapter`: the GPU is a CPU adapter, whose threads need the cores: the executor's
    /// idle threads sleep at once instead of spinning ([`cpu_spin`]).
    pub fn new(
        slots: Slots,
        policy: Policy,
        prefetch: bool,
        files: WeightFiles,
        cpu: CpuExperts,
        cpu_threads: usize,
        cpu_adapter: bool,
    ) -> Result<Offload> {
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
        #[cfg(target_arch = "wasm32")]
        let _ = (cpu_threads, cpu_adapter);
        Ok(Offload {
            slots,
            policy,
            prefetch,
            files,
            layers,
            host: Vec::new(),
            stats: Mutex::new(ExpertStats::default()),
            replay: Mutex::new(None),
            trace: Mutex::new(None),
            files_read: AtomicBool::new(false),
            cpu,
            #[cfg(not(target_arch = "wasm32"))]
            pool: match cpu {
                CpuExperts::Off => None,
                _ => {
                    let threads = match cpu_threads {
                        0 => default_cpu_threads(),
                        n => n,
                    };
                    Some(
                        pool::Pool::new(threads, cpu_spin(cpu_adapter)).map_err(|e| {
                            Error::msg(format!("--cpu-threads {threads}: no threads: {e}"))
                        })?,
                    )
                }
            },
            #[cfg(not(target_arch = "wasm32"))]
            scratch: Mutex::new(Default::default()),
            rates: Mutex::new(Rates::default()),
        })
    }

    /// Whether a chunk of `rows` rows runs its misses on the CPU ([`Offload::serve_hybrid`]).
    pub fn hybrid_for(&self, rows: usize) -> bool {
        cfg!(not(target_arch = "wasm32")) && self.cpu != CpuExperts::Off && rows <= CPU_MAX_ROWS
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

    fn layer(&self, i: usize) -> Result<&Mutex<LayerState>> {
        self.layers[i]
            .as_ref()
            .ok_or_else(|| Error::msg(format!("layer {i} keeps all its experts on the GPU")))
    }

    /// A chunk's routed pairs as the cache serves them: replaced by the replayed routing
    /// where one is set, checked, recorded in the trace; the last prefetch's predictions
    /// and uploads counted against them.
    fn prepare(
        &self,
        i: usize,
        st: &mut LayerState,
        mut experts: Vec<u32>,
        rows: usize,
    ) -> Result<Vec<u32>> {
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
        let mut s = crate::gpu::lock(&self.stats);
        s.predicted += predicted.len() as u64;
        s.predicted_right += right;
        s.prefetched_used += used_ahead;
        Ok(experts)
    }

    /// Serve layer `i`'s routed pairs `experts` (`rows × k` ids from its router): uploads the
    /// experts each round needs into the slots of `gate_up` / `down` and returns, per round,
    /// the slot table for the expert matmuls. `run` records and submits one round's matmuls
    /// (it is called once per round, after that round's uploads were queued), after the
    /// copies it is given (the uploads the GPU makes from the host copy).
    #[allow(clippy::too_many_arguments)]
    pub fn serve(
        &self,
        gpu: &Gpu,
        i: usize,
        source: &ExpertSource,
        experts: Vec<u32>,
        rows: usize,
        gate_up: &GpuWeight,
        down: &GpuWeight,
        mut run: impl FnMut(&[u32], &[BufferCopy]) -> Result<()>,
    ) -> Result<()> {
        let layer = self.layer(i)?;
        let mut st = crate::gpu::lock(layer);
        let experts = self.prepare(i, &mut st, experts, rows)?;
        let rounds = st.table.place(&experts);
        for _ in 0..rows {
            st.table.tick();
        }
        for round in &rounds {
            let mut copies = Vec::new();
            let up = (&round.uploads[..], Some(&mut copies));
            self.stage(gpu, i, &mut st, source, up, (gate_up, down), false)?;
            {
                let mut s = crate::gpu::lock(&self.stats);
                s.uses += round.served as u64;
                s.hits += round.hits as u64;
                s.rounds += 1;
            }
            if let Err(err) = run(&round.slots, &copies) {
                // What the slots hold is unknown now.
                st.table.clear();
                return Err(err);
            }
        }
        Ok(())
    }

    /// [`Offload::serve`] for a chunk of few rows (see [`Offload::hybrid_for`]), in one round:
    /// the pairs left to the CPU go to `cpu` first (it starts [`Offload::run_cpu`] on them
    /// without waiting; not called when every pair runs on the GPU), then the resident
    /// experts (and those the cache takes in, [`SlotTable::place_hybrid`]) run on the GPU
    /// through `run`, which submits them. Returns what `cpu` returned. The CPU's part is the
    /// longer one, so it starts before the host stages, records and submits the GPU's.
    #[cfg(not(target_arch = "wasm32"))]
    #[allow(clippy::too_many_arguments)]
    pub fn serve_hybrid<P>(
        &self,
        gpu: &Gpu,
        i: usize,
        source: &ExpertSource,
        experts: Vec<u32>,
        rows: usize,
        (gate_up, down): (&GpuWeight, &GpuWeight),
        cpu: impl FnOnce(CpuPart) -> Result<P>,
        run: impl FnOnce(&[u32], &[BufferCopy]) -> Result<()>,
    ) -> Result<Option<P>> {
        let layer = self.layer(i)?;
        let mut st = crate::gpu::lock(layer);
        let experts = self.prepare(i, &mut st, experts, rows)?;
        let bytes = self.slots.expert_bytes as f64;
        let copies_here = self.host.get(i).is_some_and(|h| h.is_some());
        let (cpu_rate, up_rate, copy_start) = {
            let r = crate::gpu::lock(&self.rates);
            (
                r.cpu,
                if copies_here { r.copy } else { r.upload },
                r.copy_start,
            )
        };
        // Auto: upload a miss where its rows cost the CPU more than its upload would.
        let rates = match self.cpu {
            CpuExperts::Auto => cpu_rate.zip(up_rate),
            _ => None,
        };
        let pays = |e: u32| {
            rates.is_some_and(|(cpu, up)| {
                let r = experts.iter().filter(|&&x| x == e).count() as f64;
                r * bytes / cpu > bytes / up
            })
        };
        // With the host copy, the GPU's copies are a second way in beside the CPU: a share
        // of the misses goes that way, as many as the two rates split evenly.
        let mut lane = match copies_here {
            true => {
                let costs = (bytes, copy_start);
                copy_lane(st.table.misses(&experts), cpu_rate, up_rate, costs)
            }
            false => 0,
        };
        let upload = |e: u32| {
            let take = lane > 0;
            lane = lane.saturating_sub(1);
            take || pays(e)
        };
        let (round, pairs) = st.table.place_hybrid(&experts, upload);
        for _ in 0..rows {
            st.table.tick();
        }
        {
            let mut s = crate::gpu::lock(&self.stats);
            s.uses += experts.len() as u64;
            s.hits += round.hits as u64;
            s.rounds += 1;
        }
        let started = match pairs.is_empty() {
            true => None,
            false => {
                let mut order: Vec<(u32, Vec<usize>)> = Vec::new();
                for &p in &pairs {
                    match order.iter_mut().find(|(e, _)| *e == experts[p]) {
                        Some((_, ps)) => ps.push(p),
                        None => order.push((experts[p], vec![p])),
                    }
                }
                Some(cpu(CpuPart {
                    layer: i,
                    k: experts.len() / rows.max(1),
                    inter: self.expert_rows(i, (gate_up, down)).0 / 2,
                    experts,
                    order,
                })?)
            }
        };
        let mut copies = Vec::new();
        let up = (&round.uploads[..], Some(&mut copies));
        let staged = self.stage(gpu, i, &mut st, source, up, (gate_up, down), false);
        if let Err(err) = staged.and_then(|_| run(&round.slots, &copies)) {
            // What the slots hold is unknown now.
            st.table.clear();
            return Err(err);
        }
        Ok(started)
    }

    /// The CPU's part of a hybrid round ([`Offload::serve_hybrid`]), from the mapped files:
    /// the missed experts in order of first use, each with the rows that chose it. `x`: the
    /// chunk's rows of the experts' input. The pairs' expert outputs (`hidden` floats each,
    /// before the routing weight), one after another in the order of [`CpuPart::pairs`],
    /// stay in the executor's output scratch for [`Offload::with_cpu_outputs`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run_cpu(
        &self,
        source: &ExpertSource,
        part: &CpuPart,
        x: &[f32],
        (gate_up, down): (&GpuWeight, &GpuWeight),
    ) -> Result<()> {
        let CpuPart {
            layer: i,
            k,
            inter,
            ref experts,
            ref order,
        } = *part;
        let hidden = gate_up.cols;
        let bytes = self.slots.expert_bytes as f64;
        let t0 = std::time::Instant::now();
        let n_pairs: usize = order.iter().map(|(_, ps)| ps.len()).sum();
        let mut jobs = Vec::with_capacity(order.len());
        let mut at = 0;
        let mut pair_of_row = Vec::with_capacity(n_pairs);
        let mut rows_of: Vec<&[f32]> = Vec::with_capacity(n_pairs);
        for (e, ps) in order {
            for &p in ps {
                pair_of_row.push(p);
                rows_of.push(&x[p / k * hidden..(p / k + 1) * hidden]);
            }
            jobs.push((
                self.cpu_expert(source, *e, (inter, hidden), (gate_up, down))?,
                at..at + ps.len(),
            ));
            at += ps.len();
        }
        let jobs: Vec<_> = jobs.into_iter().map(|(e, r)| (e, &rows_of[r])).collect();
        let mut scratch = crate::gpu::lock(&self.scratch);
        let (mid, out) = &mut *scratch;
        out.resize(pair_of_row.len() * hidden, 0.0);
        let pool = self
            .pool
            .as_ref()
            .ok_or_else(|| Error::msg(format!("layer {i}: CPU experts with --cpu-experts off")))?;
        cpu::run_experts(pool, &jobs, out, mid);
        let secs = t0.elapsed().as_secs_f64();
        for (j, (&p, o)) in pair_of_row.iter().zip(out.chunks_exact(hidden)).enumerate() {
            if o.iter().any(|v| !v.is_finite()) && rows_of[j].iter().all(|v| v.is_finite()) {
                return Err(Error::msg(format!(
                    "layer {i}: routed expert {} gave non-finite values on the CPU (its weights in the model files hold NaN or Inf)",
                    experts[p]
                )));
            }
        }
        let per_rows: f64 = order.iter().map(|(_, ps)| ps.len() as f64 * bytes).sum();
        Rates::add(&mut crate::gpu::lock(&self.rates).cpu, per_rows, secs);
        let mut s = crate::gpu::lock(&self.stats);
        s.cpu_pairs += n_pairs as u64;
        s.cpu_experts += order.len() as u64;
        s.cpu_bytes += order.len() as u64 * self.slots.expert_bytes;
        s.cpu_s += secs;
        self.files_read.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// `f` over the outputs of the last [`Offload::run_cpu`] (without copying them out of
    /// the executor's scratch, which the next round reuses).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_cpu_outputs(&self, f: impl FnOnce(&[f32])) {
        f(&crate::gpu::lock(&self.scratch).1)
    }

    /// Runs `job` on the CPU executor's threads without waiting for it (on a thread of its
    /// own without them): a hybrid round's CPU part, while the caller records what follows.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        match &self.pool {
            Some(pool) => pool.spawn(job),
            None => {
                std::thread::spawn(job);
            }
        }
    }

    /// Fault in the pages of the experts in `sources` (the offloaded layers', with their
    /// gate_up and down formats, [`Offload::expert_parts`]) on two
    /// background threads: a first read through the mapping costs a page fault per 4 KiB,
    /// which would otherwise land on the first decode steps that run an expert on the CPU.
    /// Nothing is done without a CPU executor, or where the experts do not fit the host
    /// memory available now (they would only push each other out).
    pub fn prefault(&self, sources: Vec<(ExpertSource, WFormat, WFormat)>) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            if self.pool.is_none() {
                return;
            }
            // Each tensor's place in its mapping: (address, length); the mappings live as
            // long as the clone of the files each thread holds.
            let mut ranges: Vec<(usize, usize)> = Vec::new();
            for (src, fg, fd) in &sources {
                for x in 0..self.slots.n_experts as u32 {
                    let Ok((gu, dn)) = self.expert_parts(src, x, (*fg, *fd)) else {
                        continue;
                    };
                    for p in gu.iter().chain(&dn) {
                        let (t, scale) = p.tensors();
                        for t in std::iter::once(t).chain(scale) {
                            ranges.push((t.bytes.as_ptr() as usize, t.bytes.len()));
                        }
                    }
                }
            }
            let total: usize = ranges.iter().map(|r| r.1).sum();
            if available_memory().is_none_or(|a| total as u64 > a / 2) {
                return;
            }
            // Two threads of their own, not the executor's: decode steps that need the
            // executor meanwhile do not queue behind the faulting.
            for half in 0..2 {
                let keep = self.files.clone();
                let mine: Vec<(usize, usize)> =
                    ranges.iter().skip(half).step_by(2).copied().collect();
                let spawned = std::thread::Builder::new()
                    .name("sparsa-prefault".into())
                    .spawn(move || {
                        let _files = keep;
                        for (at, len) in mine {
                            for o in (0..len).step_by(4096) {
                                // SAFETY: at .. at + len lies in a mapping `_files` keeps alive.
                                unsafe { std::ptr::read_volatile((at + o) as *const u8) };
                            }
                        }
                    });
                // Without the thread, the first reads fault the pages in instead.
                drop(spawned);
            }
        }
        #[cfg(target_arch = "wasm32")]
        let _ = sources;
    }

    /// The RAM read rate on the CPU executor's threads ([`cpu::ram_read_bandwidth`]); None
    /// where the CPU runs no experts.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn ram_bandwidth(&self) -> Option<f64> {
        self.pool.as_ref().map(cpu::ram_read_bandwidth)
    }

    /// Expert `x` of a layer whose experts are in `source`, read in place from the mapped
    /// files ([`Offload::expert_parts`]).
    #[cfg(not(target_arch = "wasm32"))]
    fn cpu_expert(
        &self,
        source: &ExpertSource,
        x: u32,
        (inter, hidden): (usize, usize),
        (gate_up, down): (&GpuWeight, &GpuWeight),
    ) -> Result<cpu::CpuExpert<'_>> {
        let (gu, dn) = self.expert_parts(source, x, (gate_up.format, down.format))?;
        cpu::CpuExpert::new(
            &format!("routed expert {x}"),
            cpu_rows(&gu, gate_up.format, 0, inter, hidden)?,
            cpu_rows(&gu, gate_up.format, inter, inter, hidden)?,
            cpu_rows(&dn, down.format, 0, hidden, inter)?,
        )
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
        // Prefetched experts go with the next submission, whatever records it: written by the
        // host, not copied.
        self.stage(
            gpu,
            i,
            &mut st,
            source,
            (&uploads, None),
            (gate_up, down),
            true,
        )?;
        st.predicted = predicted;
        crate::gpu::lock(&self.stats).prefetched += uploads.len() as u64;
        Ok(())
    }

    /// Queue the writes that put each `(expert, slot)` of `uploads` into the slots of
    /// `gate_up` / `down` (the values checked on an expert's first upload), marking the
    /// experts as prefetched or not, and count them. Where layer `i` has a host copy and
    /// `copies` is given, an upload is instead the GPU's copy from it, added to `copies` for
    /// the caller to record ahead of the matmuls that read the slots.
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &self,
        gpu: &Gpu,
        i: usize,
        st: &mut LayerState,
        source: &ExpertSource,
        (uploads, mut copies): (&[(u32, u32)], Option<&mut Vec<BufferCopy>>),
        (gate_up, down): (&GpuWeight, &GpuWeight),
        prefetched: bool,
    ) -> Result<()> {
        let t0 = Clock::now();
        let (rpe_gu, rpe_dn) = self.expert_rows(i, (gate_up, down));
        let mut writes = Vec::new();
        let (mut bytes, mut copied, mut copied_bytes) = (0, 0, 0);
        for &(x, slot) in uploads {
            let (xs, sl) = (x as usize, slot as usize);
            let by_copy = copies.as_deref_mut().and_then(|out| {
                let (c, b) = self.host_copies(i, xs, sl, (gate_up, down))?;
                out.extend(c);
                Some(b)
            });
            match by_copy {
                Some(b) => {
                    copied += 1;
                    copied_bytes += b;
                    bytes += b;
                }
                None => {
                    let check = !st.checked[xs];
                    let sl = (sl, rpe_gu, rpe_dn);
                    bytes += self.upload(&mut writes, source, x, sl, (gate_up, down), check)?;
                    st.checked[xs] = true;
                }
            }
            st.prefetched[xs] = prefetched;
        }
        if !writes.is_empty() {
            gpu.write_batch(&writes);
            self.files_read.store(true, Ordering::Relaxed);
        }
        let secs = t0.secs();
        Rates::add(
            &mut crate::gpu::lock(&self.rates).upload,
            (bytes - copied_bytes) as f64,
            secs,
        );
        let mut s = crate::gpu::lock(&self.stats);
        s.uploads += uploads.len() as u64;
        s.bytes += bytes;
        s.copied += copied;
        s.copied_bytes += copied_bytes;
        s.upload_s += secs;
        Ok(())
    }

    /// Make the host copy ([`HostCopy`]) of the offloaded layers' experts, where `mode`
    /// says to: `layers` holds each offloaded layer's index, where its experts are and its
    /// slot matrices. Every expert is read from the files once (its values checked, as its
    /// first upload would), written into host memory through the queue a layer at a time,
    /// and the GPU's copy rate from there is measured. Returns the bytes it holds (0: none
    /// made).
    pub fn make_host_copy(
        &mut self,
        gpu: &Gpu,
        mode: HostCopy,
        layers: &[(usize, &ExpertSource, &GpuWeight, &GpuWeight)],
    ) -> Result<u64> {
        let e = self.slots.n_experts;
        let total = layers.len() as u64 * e as u64 * self.slots.expert_bytes;
        if layers.is_empty() || !mode.wanted(gpu, total) {
            return Ok(0);
        }
        let mut host: Vec<Option<(GpuWeight, GpuWeight)>> =
            (0..self.layers.len()).map(|_| None).collect();
        for &(i, src, gu, dn) in layers {
            let (rg, rd) = self.expert_rows(i, (gu, dn));
            let label = format!("layer {i}: the experts' host copy");
            let hg = GpuWeight::empty_in(gpu, e * rg, gu.cols, gu.format, rg, &label, true)?;
            let hd = GpuWeight::empty_in(gpu, e * rd, dn.cols, dn.format, rd, &label, true)?;
            let mut st = crate::gpu::lock(self.layer(i)?);
            let mut writes = Vec::new();
            for x in 0..e {
                let check = !st.checked[x];
                self.upload(&mut writes, src, x as u32, (x, rg, rd), (&hg, &hd), check)?;
                st.checked[x] = true;
            }
            drop(st);
            gpu.write_batch(&writes);
            // Each layer's staging memory is freed before the next layer's is taken.
            gpu.submit([]);
            gpu.sync()?;
            host[i] = Some((hg, hd));
        }
        self.host = host;
        // The GPU's copy rate from there: every expert of the first layer into its slot 0
        // (empty until the first chunk), one submission, best of seven after a warm-up (a
        // rate taken while the host is busy elsewhere, e.g. freeing an earlier process's
        // memory, would give the copies too small a share of each round). Then one expert
        // the same way: what it takes beyond its bytes at that rate is a round's fixed cost.
        let (i, _, gu, dn) = layers[0];
        let probe = |experts: usize| -> Result<(f64, u64)> {
            let (mut best, mut moved) = (f64::MAX, 0);
            for run in 0..8 {
                let mut rec = gpu.recorder();
                moved = 0;
                for x in 0..experts {
                    if let Some((c, b)) = self.host_copies(i, x, 0, (gu, dn)) {
                        rec.copy_all(&c);
                        moved += b;
                    }
                }
                gpu.sync()?;
                let t = Clock::now();
                rec.finish()?;
                if run > 0 {
                    best = best.min(t.secs());
                }
            }
            Ok((best, moved))
        };
        let (all, moved) = probe(e)?;
        if moved > 0 && all > 0.0 {
            let rate = moved as f64 / all;
            let (one, one_moved) = probe(1)?;
            let mut r = crate::gpu::lock(&self.rates);
            r.copy = Some(rate);
            r.copy_start = (one - one_moved as f64 / rate).max(0.0);
        }
        Ok(total)
    }

    /// Rows of one expert in offloaded layer `i`'s slot matrices `gate_up` / `down`.
    fn expert_rows(&self, i: usize, (gate_up, down): (&GpuWeight, &GpuWeight)) -> (usize, usize) {
        let n = self.slots.per_layer[i].max(1);
        (gate_up.rows / n, down.rows / n)
    }

    /// The GPU's copies of expert `x` from layer `i`'s host copy into `slot` of its slot
    /// matrices `gate_up` / `down`, and their bytes; None where the layer has no host copy
    /// (or a range cannot be copied, [`GpuWeight::copy_rows`]).
    fn host_copies(
        &self,
        i: usize,
        x: usize,
        slot: usize,
        (gate_up, down): (&GpuWeight, &GpuWeight),
    ) -> Option<(Vec<BufferCopy>, u64)> {
        let (hg, hd) = self.host.get(i)?.as_ref()?;
        let (rg, rd) = self.expert_rows(i, (gate_up, down));
        let mut copies = hg.copy_rows(x * rg, gate_up, slot * rg, rg)?;
        copies.extend(hd.copy_rows(x * rd, down, slot * rd, rd)?);
        let bytes = copies.iter().map(|c| c.size).sum();
        Some((copies, bytes))
    }

    /// The GPU's copy rate from the host copy, bytes per second, and a round's fixed cost in
    /// seconds (see [`copy_lane`]), where one was made.
    pub fn host_copy_rate(&self) -> Option<(f64, f64)> {
        let r = crate::gpu::lock(&self.rates);
        r.copy.map(|c| (c, r.copy_start))
    }

    /// A submission waited `secs` for a hybrid round's CPU part.
    pub fn count_cpu_wait(&self, secs: f64) {
        crate::gpu::lock(&self.stats).cpu_wait_s += secs;
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

    /// Expert `x`'s tensors in the files as rows in the formats the GPU keeps (`formats`:
    /// gate_up's and down's, which may differ; a quantized matrix comes with its scale
    /// tensor): gate_up's parts (gate's rows, then up's) and down's. What an upload writes,
    /// what the CPU executor reads and what the prefault touches.
    fn expert_parts(
        &self,
        source: &ExpertSource,
        x: u32,
        (fg, fd): (WFormat, WFormat),
    ) -> Result<(Vec<RowSource<'_>>, Vec<RowSource<'_>>)> {
        let f = &self.files;
        let part = |name: &str, format: WFormat| -> Result<RowSource> {
            let t = f.get(name)?;
            Ok(match format {
                WFormat::Quant(q) => {
                    let scale = f.get(&format!("{name}{}", q.scale_suffix()))?;
                    RowSource::Quant(QuantPart { weight: t, scale })
                }
                WFormat::Float(_) => RowSource::Float(t),
            })
        };
        // Expert x's [rows, cols] of a fused float [E, rows, cols] tensor (shape checked at
        // load).
        let slice = |name: &str| -> Result<RowSource> {
            let mut t = f.get(name)?;
            let per = t.bytes.len() / self.slots.n_experts;
            t.bytes = &t.bytes[x as usize * per..(x as usize + 1) * per];
            t.shape = t.shape.get(1..).unwrap_or_default().to_vec();
            t.name = format!("{name}[{x}]");
            Ok(RowSource::Float(t))
        };
        Ok(match source {
            ExpertSource::PerExpert { prefix } => (
                vec![
                    part(&format!("{prefix}.{x}.gate_proj.weight"), fg)?,
                    part(&format!("{prefix}.{x}.up_proj.weight"), fg)?,
                ],
                vec![part(&format!("{prefix}.{x}.down_proj.weight"), fd)?],
            ),
            ExpertSource::Fused { gate_up, down } => (vec![slice(gate_up)?], vec![slice(down)?]),
        })
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
        let (gu, dn) = self.expert_parts(source, x, (gate_up.format, down.format))?;
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

#[cfg(test)]
mod tests {
    use super::copy_lane;

    #[test]
    fn the_copy_lane_takes_the_misses_that_finish_both_ways_first() {
        // H200-like rates: the CPU 86 GB/s, the GPU's copies 53: one of four misses is
        // copied (0.35 of an expert's time at the CPU's rate), two would wait on the copies.
        let free = (1.0, 0.0);
        assert_eq!(copy_lane(4, Some(86e9), Some(53e9), free), 1);
        assert_eq!(copy_lane(8, Some(86e9), Some(53e9), free), 3);
        // Equal rates split evenly; a faster lane takes more; none before the CPU is timed.
        assert_eq!(copy_lane(4, Some(1.0), Some(1.0), free), 2);
        assert_eq!(copy_lane(4, Some(1.0), Some(3.0), free), 3);
        assert_eq!(copy_lane(4, None, Some(3.0), free), 0);
        assert_eq!(copy_lane(0, Some(1.0), Some(1.0), free), 0);
        // The H200 host's rates as measured together (CPU 69 GB/s, copies 48), experts of
        // 21.2 MB: two of four misses copied end at 0.88 ms against the CPU's 0.61, one at
        // 0.44 against 0.92; a copy round's 50 µs of fixed cost tips it to one.
        let expert = 21.2e6;
        assert_eq!(copy_lane(4, Some(69e9), Some(48e9), (expert, 0.0)), 2);
        assert_eq!(copy_lane(4, Some(69e9), Some(48e9), (expert, 50e-6)), 1);
    }
}
