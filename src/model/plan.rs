//! `--gpu-memory`: what goes on the GPU, in order, and how many routed-expert slots the rest
//! of the budget buys (the [`Slots`] that [`crate::experts`]' cache then serves).

use super::info::{self, TensorClass};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::experts::Slots;
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
        format!(
            "GPU memory plan for {}: {}; routed experts {} of {} ({:.1} %) in {} slots of {} (exact: fixed {} B, expert {} B)",
            gib(self.budget),
            parts.join(", "),
            sl.resident_experts(),
            total,
            100.0 * sl.resident_experts() as f64 / total.max(1) as f64,
            sl.resident_experts(),
            gib(sl.expert_bytes),
            self.fixed(),
            sl.expert_bytes
        )
    }
}

/// Place the model in `budget` bytes: embeddings and lm_head, attention and indexer, dense
/// MLPs and routers, shared experts, caches for `ctx` tokens, `scratch` bytes; the rest becomes
/// routed-expert slots, spread evenly over the MoE layers (at least one each).
pub fn plan(
    cfg: &Config,
    files: &WeightFiles,
    budget: u64,
    ctx: usize,
    scratch: u64,
) -> Result<Plan> {
    plan_summary(cfg, &info::summarize(cfg, files)?, budget, ctx, scratch)
}

/// [`plan`] for a model described by its [`Summary`](info::Summary): of the files on disk,
/// or of a tensor list derived from `config.json` (`sparsa info` before downloading).
pub fn plan_summary(
    cfg: &Config,
    s: &info::Summary,
    budget: u64,
    ctx: usize,
    scratch: u64,
) -> Result<Plan> {
    use TensorClass as T;
    let c = |class| s.class(class).gpu_bytes;
    let parts = vec![
        ("embeddings/lm_head", c(T::Embeddings)),
        ("attention + indexer", c(T::Attention) + c(T::Indexer)),
        (
            "dense MLPs, routers, norms",
            c(T::DenseMlp) + c(T::Router) + c(T::Other),
        ),
        ("shared experts", c(T::SharedExperts)),
        (
            "KV + indexer caches",
            s.cache_bytes_per_token.saturating_mul(ctx as u64),
        ),
        ("scratch", scratch),
    ];
    let moe: Vec<bool> = (0..cfg.num_hidden_layers)
        .map(|i| !cfg.is_dense_layer(i))
        .collect();
    let n_moe = moe.iter().filter(|&&m| m).count();
    let e = cfg.n_routed_experts;
    let routed = c(T::RoutedExperts);
    let expert_bytes = routed / (n_moe * e).max(1) as u64;
    let mut p = Plan {
        budget,
        parts,
        slots: Slots {
            per_layer: vec![0; cfg.num_hidden_layers],
            n_experts: e,
            expert_bytes,
        },
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
            "--gpu-memory {}: too small; at --ctx {ctx} the model needs {} besides its routed experts ({}) and {} for one expert slot per MoE layer ({n_moe} × {}), {} in all; raise --gpu-memory or lower --ctx",
            gib(budget),
            gib(fixed),
            parts.join(", "),
            gib(n_moe as u64 * expert_bytes),
            gib(expert_bytes),
            gib(least),
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
    fn the_bard_model_plans_slots_and_says_what_does_not_fit() {
        let src = crate::model::ModelSource::open(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/sparsa-bard-12m"),
        )
        .unwrap();
        let cfg = &src.config;
        let p = plan(cfg, &src.weights, 1 << 40, 256, 1 << 20).unwrap();
        assert!(!p.slots.offloads());
        assert_eq!(p.slots.per_layer[0], 0, "layer 0 is dense");
        assert!(p.slots.per_layer[1..]
            .iter()
            .all(|&s| s == cfg.n_routed_experts));
        // Room for the fixed part and 1.5 experts per MoE layer: one slot each, the spare
        // half-layers' worth going to the first layers.
        let n_moe = p.slots.moe_layers() as u64;
        let budget = p.fixed() + n_moe * p.slots.expert_bytes * 3 / 2;
        let q = plan(cfg, &src.weights, budget, 256, 1 << 20).unwrap();
        assert!(q.slots.offloads());
        assert_eq!(q.slots.resident_experts() as u64, n_moe * 3 / 2);
        assert!(q.slots.per_layer[1..].iter().all(|&s| s == 1 || s == 2));
        assert!(q.describe().contains("routed experts"));
        let e = plan(cfg, &src.weights, p.fixed(), 256, 1 << 20).unwrap_err();
        assert!(
            e.0.contains("--gpu-memory") && e.0.contains("lower --ctx"),
            "{e}"
        );
    }
}
