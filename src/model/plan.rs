//! `--gpu-memory`: what goes on the GPU, in order, and how many routed-expert slots the rest
//! of the budget buys (the [`Slots`] that [`crate::experts`]' cache then serves).

use super::info::{self, TensorClass};
use crate::cache::{CacheFormat, Caches};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::experts::{HostCopy, Slots};
use crate::weights::WeightFiles;

/// A GPU memory budget as the user gave it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GpuMemory {
    Bytes(u64),
    /// Percent of the adapter's device-local memory.
    Percent(f64),
}

impl std::str::FromStr for GpuMemory {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<GpuMemory, String> {
        let t = s.trim();
        let bad = || {
            format!(
                "expected a size such as 24GiB, 1500MiB, 8e9 (bytes) or 80% of the adapter, got {s:?}"
            )
        };
        if let Some(p) = t.strip_suffix('%') {
            let v: f64 = p.trim().parse().map_err(|_| bad())?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(format!("{s:?}: a percentage must be in (0, 100]"));
            }
            return Ok(GpuMemory::Percent(v));
        }
        let split = t
            .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let v: f64 = num.trim().parse().map_err(|_| bad())?;
        let mul: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1.0,
            "k" | "kib" => 1024.0,
            "m" | "mib" => 1024f64.powi(2),
            "g" | "gib" => 1024f64.powi(3),
            "t" | "tib" => 1024f64.powi(4),
            "kb" => 1e3,
            "mb" => 1e6,
            "gb" => 1e9,
            "tb" => 1e12,
            _ => return Err(bad()),
        };
        let b = v * mul;
        if !(b.is_finite() && b >= 1.0 && b < 2f64.powi(63)) {
            return Err(format!("{s:?}: expected a positive size"));
        }
        Ok(GpuMemory::Bytes(b as u64))
    }
}

impl GpuMemory {
    /// Bytes, given the adapter's memory size where it reports one.
    pub fn bytes(self, adapter_memory: Option<u64>) -> Result<u64> {
        match self {
            GpuMemory::Bytes(b) => Ok(b),
            GpuMemory::Percent(p) => match adapter_memory {
                Some(m) => Ok((m as f64 * p / 100.0) as u64),
                None => Err(Error::msg(format!(
                    "--gpu-memory {p}%: this adapter does not report its memory size; give a size (e.g. 20GiB)"
                ))),
            },
        }
    }
}

/// Bytes in GiB, MiB or KiB, whichever reads best.
pub fn gib(b: u64) -> String {
    let f = b as f64;
    if b >= 1 << 30 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", f / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", f / 1024.0)
    }
}

/// Where a budget goes.
#[derive(Clone, Debug)]
pub struct Plan {
    pub budget: u64,
    /// What is placed before the routed experts, in order: (what, bytes).
    pub parts: Vec<(&'static str, u64)>,
    /// The routed-expert slots the rest of the budget buys.
    pub slots: Slots,
    /// The context the caches are reserved for.
    pub ctx: usize,
    /// The cache formats they are reserved in (the one asked for, or the one
    /// `--cache-type auto` chose for the budget): sessions of the model default to it.
    pub cache: CacheFormat,
    /// The bytes reserved for the caches (at `ctx` positions in `cache`) and the scratch.
    pub session_bytes: u64,
    /// The scratch is reserved for the prefill chunks of streamed experts
    /// ([`plan_sized`]).
    pub streamed_chunks: bool,
    /// Bytes of the embedding table where it is in host memory, not in the budget (0: on
    /// the GPU; [`info::Summary::with_host_embeddings`]).
    pub host_embed: u64,
}

impl Plan {
    /// Bytes placed before the routed experts.
    pub fn fixed(&self) -> u64 {
        self.parts.iter().map(|p| p.1).sum()
    }

    /// One paragraph for logs and `bench`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(n, b)| format!("{n} {}", gib(*b)))
            .collect();
        let sl = &self.slots;
        let total = sl.moe_layers() * sl.n_experts;
        let offloaded = sl
            .per_layer
            .iter()
            .filter(|&&s| s > 0 && s < sl.n_experts)
            .count();
        let mut host = match offloaded {
            0 => String::new(),
            n => format!(
                "; the experts' host copy (--expert-host-copy) takes {} of host memory",
                gib((n * sl.n_experts) as u64 * sl.expert_bytes)
            ),
        };
        if self.host_embed > 0 {
            host += &format!(
                "; the embedding table ({}) is in host memory (--host-embeddings)",
                gib(self.host_embed)
            );
        }
        format!(
            "GPU memory plan for {} (caches {}): {}; routed experts {} of {} ({:.1} %) in {} slots of {} (exact: fixed {} B, expert {} B){}{host}",
            gib(self.budget),
            self.cache.name(),
            parts.join(", "),
            sl.resident_experts(),
            total,
            100.0 * sl.resident_experts() as f64 / total.max(1) as f64,
            sl.resident_experts(),
            gib(sl.expert_bytes),
            self.fixed(),
            sl.expert_bytes,
            if self.streamed_chunks {
                "; the scratch holds the larger prefill chunks of streamed experts"
            } else {
                ""
            }
        )
    }
}

/// The share of an adapter's memory sparsa plans to fill when no `--gpu-memory` is given:
/// 85 %, the rest kept for the driver and the rest of the system. Measured on the H200
/// (150.7 GB heap): allocations failed at about 90 % of the heap (135 GB, while growing
/// bf16 caches for 1M positions), though VK_EXT_memory_budget's 95 % threshold was not
/// reached by the heap's count.
pub fn usable(memory: u64) -> u64 {
    memory - memory / 20 * 3
}

/// The weights placed before the routed experts: (what, bytes), in order.
fn weight_parts(s: &info::Summary) -> Vec<(&'static str, u64)> {
    use TensorClass as T;
    let c = |class| s.class(class).gpu_bytes;
    let table = match s.embed_in_host {
        true => "lm_head",
        false => "embeddings/lm_head",
    };
    let mut parts = vec![
        (table, c(T::Embeddings)),
        ("attention + indexer", c(T::Attention) + c(T::Indexer)),
        (
            "dense MLPs, routers, norms",
            c(T::DenseMlp) + c(T::Router) + c(T::Other),
        ),
        ("shared experts", c(T::SharedExperts)),
    ];
    // Where the model runs one, whole also where the experts stream.
    if s.mtp_gpu_bytes > 0 {
        parts.push(("MTP layer", s.mtp_gpu_bytes));
    }
    parts
}

/// MoE layers, and the bytes of one routed expert.
fn experts(cfg: &Config, s: &info::Summary) -> (usize, u64) {
    let n_moe = (0..cfg.num_hidden_layers)
        .filter(|&i| !cfg.is_dense_layer(i))
        .count();
    let routed = s.class(TensorClass::RoutedExperts).gpu_bytes;
    (n_moe, routed / (n_moe * cfg.n_routed_experts).max(1) as u64)
}

/// GPU bytes the adapter has free for sparsa: the [`usable`] part of its memory size where
/// the backend tells (else its largest buffer, the old estimate), less what is allocated now.
pub fn free_memory(gpu: &crate::gpu::Gpu) -> u64 {
    let memory = gpu.memory_size().unwrap_or(gpu.limits.max_buffer_size);
    usable(memory).saturating_sub(gpu.stats().live_buffer_bytes)
}

/// GPU bytes a session's caches and scratch may take once the weights are placed: under a
/// `--gpu-memory` `budget`, what the budget leaves after the weights placed before the routed
/// experts and one expert slot per MoE layer (the least a plan streams with); without one,
/// `free` (the adapter's [`free_memory`] before loading) less every weight.
/// [`crate::model::Model::session_room`] is the same figure measured after loading.
pub fn session_room(cfg: &Config, s: &info::Summary, free: u64, budget: Option<u64>) -> u64 {
    match budget {
        Some(b) => {
            let (n_moe, expert) = experts(cfg, s);
            let least = if cfg.n_routed_experts == 0 {
                0
            } else {
                n_moe as u64 * expert
            };
            let fixed: u64 = weight_parts(s).iter().map(|p| p.1).sum();
            b.saturating_sub(fixed.saturating_add(least))
        }
        None => free.saturating_sub(s.gpu_weight_bytes()),
    }
}

/// The longest context, at most `cap`, whose caches in `format` and whose scratch (for a
/// storage binding of `max_binding` bytes) fit in `room` bytes; 0 when not even one position
/// does. What `sparsa info` reports per cache format and what chat's default context is
/// (`room` from [`session_room`] before loading, [`crate::model::Model::session_room`]
/// after).
pub fn longest_ctx(
    cfg: &Config,
    format: CacheFormat,
    room: u64,
    max_binding: u64,
    cap: usize,
) -> usize {
    let per_token = Caches::bytes_per_token(cfg, format);
    let fits = |ctx: usize| {
        per_token
            .checked_mul(ctx as u64)
            .and_then(|c| {
                // The resident chunks' scratch: where the plan streams experts and the larger
                // chunks' does not fit, it keeps these (plan_sized).
                c.checked_add(crate::model::Session::scratch_bytes(
                    cfg,
                    ctx,
                    max_binding,
                    false,
                ))
            })
            .is_some_and(|b| b <= room)
    };
    // Positions are u32 on the GPU.
    let cap = cap.min(u32::MAX as usize);
    if cap == 0 || !fits(1) {
        return 0;
    }
    // The scratch grows with the context (the score rows), so search: fits(lo) holds.
    let (mut lo, mut hi) = (1, cap);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Place the model in `budget` bytes: embeddings and lm_head, attention and indexer, dense
/// MLPs and routers, shared experts, caches for `ctx` tokens in `cache` (`None`:
/// [`CacheFormat::auto`] with the room the budget leaves after the weights, the scratch and
/// one routed-expert slot per MoE layer), a session's scratch for storage bindings of
/// `max_binding` bytes ([`plan_sized`]); the rest becomes routed-expert slots, spread evenly
/// over the MoE layers (at least one each).
pub fn plan(
    cfg: &Config,
    files: &WeightFiles,
    budget: u64,
    ctx: usize,
    max_binding: u64,
    cache: Option<CacheFormat>,
) -> Result<Plan> {
    let s = info::summarize(cfg, files)?;
    plan_sized(cfg, &s, budget, ctx, max_binding, cache)
}

/// The plan `sized` makes of `s` with the embedding table where `--host-embeddings` (`mode`)
/// puts it: in host memory (out of the budget, [`info::Summary::with_host_embeddings`]) for
/// `On`, and for `Auto` where `host_ok` (the adapter keeps host buffers, [`HostCopy::wanted`])
/// and the plan with the table on the GPU offloads experts or does not fit; on the GPU for
/// `Off`, and always where the LM head is the table (`tied`: `On` is an error there).
pub fn placing_embeddings(
    s: &info::Summary,
    tied: bool,
    mode: HostCopy,
    host_ok: bool,
    sized: impl Fn(&info::Summary) -> Result<Plan>,
) -> Result<Plan> {
    let host = || sized(&s.clone().with_host_embeddings());
    match mode {
        HostCopy::On if tied => Err(Error::msg(
            "--host-embeddings on: this model's LM head is its embedding table, which every step reads whole; it stays on the GPU (use auto or off)",
        )),
        HostCopy::On => host(),
        HostCopy::Off => sized(s),
        HostCopy::Auto => {
            let p = sized(s);
            let offloads = p.as_ref().map_or(true, |p| p.slots.offloads());
            match !tied && offloads && host_ok {
                true => host(),
                false => p,
            }
        }
    }
}

/// [`plan_summary`] with a session's scratch for storage bindings of `max_binding` bytes:
/// for the resident prefill chunks, or, where that plan streams routed experts, for the
/// larger chunks of streamed experts (`WIDE_CHUNK_ROWS` in scratch.rs: fewer uploads a
/// prompt) if the budget still holds the same caches with them.
pub fn plan_sized(
    cfg: &Config,
    s: &info::Summary,
    budget: u64,
    ctx: usize,
    max_binding: u64,
    cache: Option<CacheFormat>,
) -> Result<Plan> {
    let scratch = |streamed| crate::model::Session::scratch_bytes(cfg, ctx, max_binding, streamed);
    let p = plan_summary(cfg, s, budget, ctx, scratch(false), cache)?;
    if !p.slots.offloads() {
        return Ok(p);
    }
    match plan_summary(cfg, s, budget, ctx, scratch(true), cache) {
        Ok(q) if q.slots.offloads() && q.cache == p.cache => Ok(Plan {
            streamed_chunks: true,
            ..q
        }),
        _ => Ok(p),
    }
}

/// [`plan`] for a model described by its [`Summary`](info::Summary) (of the files on disk,
/// or of a tensor list derived from `config.json`: `sparsa info` before downloading), with
/// `scratch` bytes for a session's scratch.
pub fn plan_summary(
    cfg: &Config,
    s: &info::Summary,
    budget: u64,
    ctx: usize,
    scratch: u64,
    cache: Option<CacheFormat>,
) -> Result<Plan> {
    let cache = cache.unwrap_or_else(|| {
        let room = session_room(cfg, s, 0, Some(budget)).saturating_sub(scratch);
        CacheFormat::auto(cfg, ctx, room)
    });
    let caches = Caches::bytes_per_token(cfg, cache).saturating_mul(ctx as u64);
    let mut parts = weight_parts(s);
    parts.push(("KV + indexer caches", caches));
    parts.push(("scratch", scratch));
    let moe: Vec<bool> = (0..cfg.num_hidden_layers)
        .map(|i| !cfg.is_dense_layer(i))
        .collect();
    let e = cfg.n_routed_experts;
    let (n_moe, expert_bytes) = experts(cfg, s);
    let mut p = Plan {
        budget,
        parts,
        slots: Slots {
            per_layer: vec![0; cfg.num_hidden_layers],
            n_experts: e,
            expert_bytes,
        },
        ctx,
        cache,
        session_bytes: caches.saturating_add(scratch),
        streamed_chunks: false,
        host_embed: if s.embed_in_host { s.embed_bytes } else { 0 },
    };
    if n_moe == 0 || e == 0 {
        return Ok(p);
    }
    let fixed = p.fixed();
    let least = fixed + n_moe as u64 * expert_bytes;
    if budget < least {
        let parts: Vec<String> = p
            .parts
            .iter()
            .map(|(n, b)| format!("{n} {}", gib(*b)))
            .collect();
        return Err(Error::msg(format!(
            "--gpu-memory {}: too small; at --ctx {ctx} with caches in {} the model needs {} besides its routed experts ({}) and {} for one expert slot per MoE layer ({n_moe} × {}), {} in all; raise --gpu-memory or lower --ctx{}",
            gib(budget),
            cache.name(),
            gib(fixed),
            parts.join(", "),
            gib(n_moe as u64 * expert_bytes),
            gib(expert_bytes),
            gib(least),
            if cache == CacheFormat::SMALLEST {
                ""
            } else {
                " (or --cache-type fp8/i8, the smallest caches)"
            },
        )));
    }
    let fit = ((budget - fixed) / expert_bytes.max(1)) as usize;
    let per = (fit / n_moe).min(e);
    let mut extra = if per < e { fit - per * n_moe } else { 0 };
    for (i, &m) in moe.iter().enumerate() {
        if m {
            p.slots.per_layer[i] = per + usize::from(extra > 0);
            extra = extra.saturating_sub(1);
        }
    }
    Ok(p)
}

/// How a budget's routed-expert slots are laid over the MoE layers (`--expert-placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Evenly: each MoE layer the same slots (one more for the first ones), each layer's
    /// hottest experts resident.
    #[default]
    Spread,
    /// By whole layers ([`whole_layers`]): fewer offloaded layers, so fewer routing round
    /// trips a decode step.
    Layers,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Placement, String> {
        match s {
            "spread" => Ok(Placement::Spread),
            "layers" => Ok(Placement::Layers),
            _ => Err(format!("expected spread or layers, got {s:?}")),
        }
    }
}

impl Plan {
    /// The plan's expert slots laid out by `placement` (the plan spreads them).
    pub fn placed(mut self, placement: Placement) -> Plan {
        if placement == Placement::Layers {
            whole_layers(&mut self.slots);
        }
        self
    }
}

/// `slots` regrouped by whole layers: as many MoE layers as the same slots hold keep every
/// expert on the GPU (no misses, and at decode no routing round trip), the others one slot
/// each (what a prefill chunk uploads through), the remainder going to the first of those.
/// Under uniform routing the misses are as many as with the slots spread (a layer's hits
/// scale with its slots) and the offloaded layers, each a round trip per decode step, are
/// fewer: 45 instead of 77 for GLM-5 q4 with 558 slots (on the H200 host, hybrid decode
/// 150.6 / 156.3 ms a token against 164.2 / 169.0 spread: BENCHMARKS.md, "H200, midday").
/// Skewed routing hits more with the slots spread (the hottest experts of every layer
/// resident), and a prefill chunk takes more rounds through one slot, so it is not the
/// default (`--expert-placement layers`).
fn whole_layers(slots: &mut Slots) {
    let e = slots.n_experts;
    let moe: Vec<usize> = (0..slots.per_layer.len())
        .filter(|&i| slots.per_layer[i] > 0)
        .collect();
    let total = slots.resident_experts();
    if e < 2 || total >= moe.len() * e {
        return;
    }
    let mut spare = total - moe.len();
    for i in moe {
        let more = spare.min(e - 1);
        slots.per_layer[i] = 1 + more;
        spare -= more;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units_and_refuse_garbage() {
        let b = |s: &str| s.parse::<GpuMemory>();
        assert_eq!(b("1024"), Ok(GpuMemory::Bytes(1024)));
        assert_eq!(b("2GiB"), Ok(GpuMemory::Bytes(2 << 30)));
        assert_eq!(b("1.5 g"), Ok(GpuMemory::Bytes(3 << 29)));
        assert_eq!(b("300MB"), Ok(GpuMemory::Bytes(300_000_000)));
        assert_eq!(b("8e9"), Ok(GpuMemory::Bytes(8_000_000_000)));
        assert_eq!(b("75%"), Ok(GpuMemory::Percent(75.0)));
        for bad in [
            "",
            "abc",
            "-1GiB",
            "0",
            "12 parsecs",
            "150%",
            "0%",
            "nan",
            "inf",
        ] {
            assert!(b(bad).is_err(), "{bad:?} accepted");
        }
        assert!(GpuMemory::Percent(50.0).bytes(None).is_err());
        assert_eq!(GpuMemory::Percent(50.0).bytes(Some(1000)).unwrap(), 500);
    }

    #[test]
    fn whole_layers_keeps_the_slots_and_offloads_fewer_layers() {
        // GLM-5 at 24 GiB: 77 MoE layers of 16 experts, 558 slots spread 7 or 8 a layer.
        let mut per_layer = vec![0; 3];
        per_layer.extend((0..77).map(|i| if i < 19 { 8 } else { 7 }));
        let mut s = Slots {
            per_layer,
            n_experts: 16,
            expert_bytes: 1,
        };
        assert_eq!(s.resident_experts(), 558);
        whole_layers(&mut s);
        assert_eq!(s.resident_experts(), 558);
        assert_eq!(&s.per_layer[..3], &[0, 0, 0], "dense layers keep none");
        let full = s.per_layer.iter().filter(|&&x| x == 16).count();
        let offloaded = s.per_layer.iter().filter(|&&x| x > 0 && x < 16).count();
        // 558 = 77 + 32 · 15 + 1: 32 whole layers, one of 2 slots, 44 of one.
        assert_eq!((full, offloaded), (32, 45));
        assert!(s.per_layer[3..].iter().all(|&x| x >= 1));
        // Every expert already resident, or no room beyond one each: nothing moves.
        for per in [16, 1] {
            let mut t = Slots {
                per_layer: vec![per; 5],
                n_experts: 16,
                expert_bytes: 1,
            };
            whole_layers(&mut t);
            assert_eq!(t.per_layer, vec![per; 5]);
        }
    }

    #[test]
    fn placements_parse_and_lay_out_the_same_slots() {
        assert_eq!("spread".parse(), Ok(Placement::Spread));
        assert_eq!("layers".parse(), Ok(Placement::Layers));
        let bad = "Layers".parse::<Placement>().unwrap_err();
        assert!(bad.contains("spread or layers"), "{bad}");
        let src = crate::model::ModelSource::open(&crate::config::bard_dir()).unwrap();
        let cfg = &src.config;
        let all = plan(cfg, &src.weights, 1 << 40, 256, 2047 << 20, None).unwrap();
        let e = all.slots.n_experts as u64;
        // Room for a third of the experts.
        let budget = all.fixed() + all.slots.moe_layers() as u64 * all.slots.expert_bytes * e / 3;
        let spread = plan(cfg, &src.weights, budget, 256, 2047 << 20, None).unwrap();
        assert!(spread.slots.offloads());
        let n = spread.slots.resident_experts();
        let offloaded = |p: &Plan| {
            let l = &p.slots.per_layer;
            l.iter()
                .filter(|&&x| x > 0 && x < p.slots.n_experts)
                .count()
        };
        let same = spread.clone().placed(Placement::Spread);
        assert_eq!(same.slots.per_layer, spread.slots.per_layer);
        let layers = spread.clone().placed(Placement::Layers);
        assert_eq!(layers.slots.resident_experts(), n);
        assert!(
            offloaded(&layers) < offloaded(&spread),
            "{:?} against {:?}",
            layers.slots.per_layer,
            spread.slots.per_layer
        );
    }

    #[test]
    fn the_bard_model_plans_slots_and_says_what_does_not_fit() {
        let src = crate::model::ModelSource::open(&crate::config::bard_dir()).unwrap();
        let cfg = &src.config;
        let binding = 2047 << 20;
        let p = plan(cfg, &src.weights, 1 << 40, 256, binding, None).unwrap();
        assert!(!p.slots.offloads());
        assert_eq!(p.slots.per_layer[0], 0, "layer 0 is dense");
        assert!(p.slots.per_layer[1..]
            .iter()
            .all(|&s| s == cfg.n_routed_experts));
        // Room for the fixed part and 1.5 experts per MoE layer: one slot each, the spare
        // half-layers' worth going to the first layers.
        let n_moe = p.slots.moe_layers() as u64;
        let budget = p.fixed() + n_moe * p.slots.expert_bytes * 3 / 2;
        let q = plan(cfg, &src.weights, budget, 256, binding, None).unwrap();
        assert!(q.slots.offloads());
        assert_eq!(q.slots.resident_experts() as u64, n_moe * 3 / 2);
        assert!(q.slots.per_layer[1..].iter().all(|&s| s == 1 || s == 2));
        assert!(q.describe().contains("routed experts"));
        // Every MoE layer streams: the host copy holds all their experts.
        let all = n_moe * cfg.n_routed_experts as u64 * q.slots.expert_bytes;
        let copy = format!("host copy (--expert-host-copy) takes {}", gib(all));
        assert!(q.describe().contains(&copy), "{}", q.describe());
        assert!(!p.describe().contains("host copy"));
        let e = plan(cfg, &src.weights, p.fixed(), 256, binding, None).unwrap_err();
        assert!(
            e.0.contains("--gpu-memory") && e.0.contains("lower --ctx"),
            "{e}"
        );
    }

    /// `--host-embeddings`: the table leaves the budget where it is in host memory (its bytes
    /// become slots), `auto` moves it only where experts stream, and a tied LM head keeps it.
    #[test]
    fn host_embeddings_leave_the_budget_where_experts_stream() {
        let (cfg, s) = bard();
        let binding = 2047 << 20;
        let (ctx, f32) = (256, Some(CacheFormat::F32));
        assert!(s.embed_bytes > 0 && !s.embed_in_host);
        let at = |budget: u64, mode, ok, tied| {
            let sized = |s: &info::Summary| plan_sized(&cfg, s, budget, ctx, binding, f32);
            placing_embeddings(&s, tied, mode, ok, sized)
        };
        // Resident: auto leaves the table on the GPU, on moves it.
        let all = at(u64::MAX, HostCopy::Auto, true, false).unwrap();
        assert!(!all.slots.offloads() && all.host_embed == 0);
        let on = at(u64::MAX, HostCopy::On, true, false).unwrap();
        assert_eq!(on.host_embed, s.embed_bytes);
        assert_eq!(all.fixed() - on.fixed(), s.embed_bytes);
        assert!(
            on.describe().contains("embedding table")
                && !all.describe().contains("embedding table")
        );
        // Streamed: auto moves it where the adapter can, and the slots grow by its bytes.
        let n_moe = all.slots.moe_layers() as u64;
        let budget = all.fixed() + n_moe * all.slots.expert_bytes * 3 / 2;
        let gpu = at(budget, HostCopy::Auto, false, false).unwrap();
        let host = at(budget, HostCopy::Auto, true, false).unwrap();
        assert!(gpu.slots.offloads() && gpu.host_embed == 0);
        assert_eq!(host.host_embed, s.embed_bytes);
        let more = (s.embed_bytes / all.slots.expert_bytes) as usize;
        let got = host.slots.resident_experts() - gpu.slots.resident_experts();
        let cap = n_moe as usize * cfg.n_routed_experts - gpu.slots.resident_experts();
        assert!(
            got >= more.min(cap) && got <= more + 1,
            "{got} {more} {cap}"
        );
        assert_eq!(
            at(budget, HostCopy::Off, true, false).unwrap().host_embed,
            0
        );
        // A tied LM head: auto keeps the table, on is an error naming the flag.
        assert_eq!(
            at(budget, HostCopy::Auto, true, true).unwrap().host_embed,
            0
        );
        let e = at(budget, HostCopy::On, true, true).unwrap_err();
        assert!(e.0.contains("--host-embeddings on"), "{e}");
    }

    /// Where a plan streams experts, the scratch is for the larger prefill chunks if the
    /// budget holds it with a slot per MoE layer, else for the resident chunks.
    #[test]
    fn streamed_experts_get_the_larger_chunks_where_they_fit() {
        let (mut cfg, mut s) = bard();
        // GLM-5's widths, where the chunks differ (the built-in model keeps 128 rows), and
        // experts of about GLM-5's size, so that a gigabyte of scratch is worth a few.
        let routed = TensorClass::ALL
            .iter()
            .position(|c| *c == TensorClass::RoutedExperts)
            .unwrap();
        s.classes[routed].gpu_bytes *= 4096;
        cfg.hidden_size = 6144;
        cfg.num_attention_heads = 64;
        cfg.kv_lora_rank = 512;
        cfg.intermediate_size = 12288;
        cfg.moe_intermediate_size = 2048;
        let (ctx, binding, f32) = (1024, 2047 << 20, Some(CacheFormat::F32));
        let scratch = |st| crate::model::Session::scratch_bytes(&cfg, ctx, binding, st);
        let (small, large) = (scratch(false), scratch(true));
        assert!(large > small + (1 << 30), "{small} {large}");
        let all = plan_sized(&cfg, &s, u64::MAX, ctx, binding, f32).unwrap();
        assert!(!all.slots.offloads() && !all.streamed_chunks);
        assert!(all.parts.contains(&("scratch", small)));
        let (n_moe, expert) = (all.slots.moe_layers() as u64, all.slots.expert_bytes);
        let rest = all.fixed() - small;
        let p = plan_sized(
            &cfg,
            &s,
            rest + large + 2 * n_moe * expert,
            ctx,
            binding,
            f32,
        );
        let p = p.unwrap();
        assert!(p.slots.offloads() && p.streamed_chunks);
        assert!(p.parts.contains(&("scratch", large)));
        assert_eq!(p.slots.resident_experts() as u64, 2 * n_moe);
        assert!(p.describe().contains("larger prefill chunks"));
        // Room for one slot a layer beside the resident chunks' scratch only.
        let q = plan_sized(&cfg, &s, rest + small + n_moe * expert, ctx, binding, f32);
        let q = q.unwrap();
        assert!(q.slots.offloads() && !q.streamed_chunks);
        assert!(q.parts.contains(&("scratch", small)));
    }

    fn bard() -> (Config, info::Summary) {
        let src = crate::model::ModelSource::open(&crate::config::bard_dir()).unwrap();
        let s = info::summarize(&src.config, &src.weights).unwrap();
        (src.config, s)
    }

    /// Smaller caches leave more of a budget to routed experts; `auto` takes f32 where the
    /// budget holds it after one slot per MoE layer, else a compact format, and says which.
    #[test]
    fn the_cache_format_is_planned_and_auto_fits_the_budget() {
        let (cfg, s) = bard();
        let (ctx, scratch) = (4096, 1 << 20);
        let all = plan_summary(&cfg, &s, u64::MAX, ctx, scratch, Some(CacheFormat::F32)).unwrap();
        let (n_moe, expert) = (all.slots.moe_layers() as u64, all.slots.expert_bytes);
        let f32_caches = Caches::bytes_per_token(&cfg, CacheFormat::F32) * ctx as u64;
        // Room for the f32 caches and two slots per MoE layer.
        let budget = all.fixed() + 2 * n_moe * expert;
        let f = plan_summary(&cfg, &s, budget, ctx, scratch, Some(CacheFormat::F32)).unwrap();
        let c = plan_summary(&cfg, &s, budget, ctx, scratch, Some(CacheFormat::COMPACT)).unwrap();
        assert_eq!(f.slots.resident_experts() as u64, 2 * n_moe);
        assert!(
            c.slots.resident_experts() > f.slots.resident_experts(),
            "fp8 caches: {} slots, f32: {}",
            c.slots.resident_experts(),
            f.slots.resident_experts()
        );
        assert_eq!((f.cache, c.cache), (CacheFormat::F32, CacheFormat::COMPACT));
        assert!(
            c.describe().contains("(caches fp8/bf16)"),
            "{}",
            c.describe()
        );
        assert_eq!(f.session_bytes, f32_caches + scratch);
        // auto: f32 while the budget holds it besides one slot per layer, then compact.
        let least = all.fixed() + n_moe * expert;
        let auto = |b| plan_summary(&cfg, &s, b, ctx, scratch, None).unwrap().cache;
        assert_eq!(auto(least), CacheFormat::F32);
        assert_eq!(session_room(&cfg, &s, 0, Some(least)), f32_caches + scratch);
        assert_ne!(auto(least - 1), CacheFormat::F32);
        let smallest = Caches::bytes_per_token(&cfg, CacheFormat::SMALLEST) * ctx as u64;
        assert_eq!(auto(least - f32_caches + smallest), CacheFormat::SMALLEST);
        // A budget too small for f32 caches still plans with the compact ones.
        let q = plan_summary(&cfg, &s, least - f32_caches + smallest, ctx, scratch, None);
        assert_eq!(q.unwrap().slots.resident_experts() as u64, n_moe);
        let e = plan_summary(&cfg, &s, least - 1, ctx, scratch, Some(CacheFormat::F32));
        assert!(e.unwrap_err().0.contains("--cache-type fp8/i8"));
    }

    /// The longest context is the most whose caches and scratch fit the room, in every
    /// format, capped; none when one position does not fit.
    #[test]
    fn the_longest_context_fits_caches_and_scratch() {
        let (cfg, _) = bard();
        let binding = 128 << 20;
        for f in CacheFormat::LADDER {
            let per = Caches::bytes_per_token(&cfg, f);
            let need = |n: usize| {
                per * n as u64 + crate::model::Session::scratch_bytes(&cfg, n, binding, false)
            };
            let room = need(5000);
            assert_eq!(
                longest_ctx(&cfg, f, room, binding, usize::MAX),
                5000,
                "{}",
                f.name()
            );
            assert_eq!(longest_ctx(&cfg, f, room - 1, binding, usize::MAX), 4999);
            assert_eq!(longest_ctx(&cfg, f, room, binding, 1024), 1024);
            assert_eq!(longest_ctx(&cfg, f, need(1) - 1, binding, 1024), 0);
        }
        let room = 1 << 30;
        let n = |f| longest_ctx(&cfg, f, room, binding, usize::MAX);
        assert!(n(CacheFormat::SMALLEST) > n(CacheFormat::COMPACT));
        assert!(n(CacheFormat::COMPACT) > 2 * n(CacheFormat::F32));
    }
}
