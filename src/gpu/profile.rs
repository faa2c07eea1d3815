//! Per-kernel GPU time, bytes and FLOPs.
//!
//! While profiling is on, every dispatch runs in a compute pass of its own. Where the adapter
//! offers timestamp queries the pass writes a GPU timestamp before and after the dispatch,
//! so the time is the GPU's own; elsewhere each dispatch is submitted alone and waited for
//! (wall time, which includes the submit and wait overhead). Kernel wrappers state what a
//! dispatch must move and compute ([`super::Recorder::cost`]), so a report can divide by the
//! measured bandwidth and FMA rate. [`Gpu::set_profiling`] switches it on and
//! [`Gpu::take_profile`] returns the totals.

use super::{lock, Gpu};
#[cfg(target_arch = "wasm32")]
use crate::error::Error;
use crate::error::Result;
use std::collections::HashMap;
use std::sync::Mutex;

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

/// The profiler while profiling is on, and how it can measure on this device.
pub(super) struct Profiling {
    /// Per-kernel totals while profiling (see [`Gpu::set_profiling`]).
    pub(super) profiler: Mutex<Option<Profiler>>,
    /// Whether the device was opened with timestamp queries.
    timestamps: bool,
}

impl Profiling {
    pub(super) fn new(timestamps: bool) -> Profiling {
        Profiling {
            profiler: Mutex::new(None),
            timestamps,
        }
    }
}

impl Gpu {
    /// Per-kernel profiling: while on, every dispatch runs in a compute pass of its own and
    /// its time (GPU timestamps where the adapter has them, else the wall time of the
    /// dispatch submitted alone), count and stated bytes/FLOPs are added to its kernel's
    /// totals. Slower than normal running; `take_profile` returns and clears the totals.
    pub fn set_profiling(&self, on: bool) {
        let clock = if self.profile.timestamps {
            ProfileClock::Timestamps
        } else {
            ProfileClock::Wall
        };
        *lock(&self.profile.profiler) = on.then(|| Profiler::new(clock));
    }

    /// How `set_profiling` measures on this device.
    pub fn profile_clock(&self) -> ProfileClock {
        if self.profile.timestamps {
            ProfileClock::Timestamps
        } else {
            ProfileClock::Wall
        }
    }

    /// Per-kernel totals since profiling was switched on, largest time first.
    pub fn take_profile(&self) -> Vec<KernelStat> {
        lock(&self.profile.profiler)
            .as_mut()
            .map(|p| p.take())
            .unwrap_or_default()
    }

    /// The resolved timestamps of a profiled submission (native only: the browser cannot
    /// wait inside a recorder's flush, so profiling is not offered there).
    pub(crate) fn read_timestamps(&self, buf: &wgpu::Buffer, bytes: u64) -> Result<Vec<u8>> {
        #[cfg(not(target_arch = "wasm32"))]
        return self.read_bytes(buf, 0, bytes);
        #[cfg(target_arch = "wasm32")]
        {
            let _ = (buf, bytes);
            Err(Error::msg(
                "per-kernel profiling is not available in the browser",
            ))
        }
    }

    /// A timestamp query set of `n` queries (profiling only).
    pub(crate) fn query_set(&self, n: u32) -> wgpu::QuerySet {
        self.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: n.max(2),
        })
    }
}
