//! Per-kernel GPU time, bytes and FLOPs.
//!
//! While profiling is on, every dispatch runs in a compute pass of its own. Where the adapter
//! offers timestamp queries the pass writes a GPU timestamp before and after the dispatch,
//! so the time is the GPU's own; elsewhere each dispatch is submitted alone and waited for
//! (wall time, which includes the submit and wait overhead). Kernel wrappers state what a
//! dispatch must move and compute ([`super::Recorder::cost`]), so a report can divide by the
//! measured bandwidth and FMA rate.

use std::collections::HashMap;

/// How kernel times were taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileClock {
    /// GPU timestamps around each dispatch.
    Timestamps,
    /// Wall time of each dispatch submitted alone (adapters without timestamp queries).
    Wall,
}

impl ProfileClock {
    pub fn describe(self) -> &'static str {
        match self {
            ProfileClock::Timestamps => "GPU timestamp queries around each dispatch",
            ProfileClock::Wall => {
                "wall time of each dispatch submitted alone (the adapter has no timestamp queries)"
            }
        }
    }
}

/// What one dispatch must read/write from memory and compute (FLOPs, an FMA being 2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    pub bytes: u64,
    pub flops: u64,
    /// Extra label (e.g. the weight format) so different variants are reported apart.
    pub tag: &'static str,
}

/// Totals of one kernel (pipeline label plus the cost's tag).
#[derive(Clone, Debug, Default)]
pub struct KernelStat {
    pub name: String,
    pub seconds: f64,
    pub count: u64,
    pub bytes: u64,
    pub flops: u64,
}

pub(crate) struct Profiler {
    pub clock: ProfileClock,
    stats: HashMap<String, KernelStat>,
}

impl Profiler {
    pub fn new(clock: ProfileClock) -> Profiler {
        Profiler {
            clock,
            stats: HashMap::new(),
        }
    }

    pub fn add(&mut self, name: &str, seconds: f64, cost: Cost) {
        let key = if cost.tag.is_empty() {
            name.to_string()
        } else {
            format!("{name}[{}]", cost.tag)
        };
        let e = self.stats.entry(key.clone()).or_insert_with(|| KernelStat {
            name: key,
            ..Default::default()
        });
        e.seconds += seconds;
        e.count += 1;
        e.bytes += cost.bytes;
        e.flops += cost.flops;
    }

    /// The totals, largest time first.
    pub fn take(&mut self) -> Vec<KernelStat> {
        let mut v: Vec<KernelStat> = self.stats.drain().map(|(_, s)| s).collect();
        v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        v
    }
}
