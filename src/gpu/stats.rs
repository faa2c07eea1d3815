//! Counts of GPU objects: the buffers, buffer bytes and bind groups sparsa created
//! ([`Counters`], bumped by [`Gpu::create_buffer`] and [`Gpu::create_bind_group`]) and what
//! wgpu's backend reports alive, gathered by [`Gpu::stats`] into a [`GpuStats`] for leak
//! checks and `sparsa chat`'s `/stats`.

use super::Gpu;
use std::sync::atomic::{AtomicU64, Ordering};

/// Buffers and bind groups created through [`Gpu::create_buffer`] and
/// [`Gpu::create_bind_group`] (see [`Gpu::stats`]).
pub(super) struct Counters {
    pub(super) buffers_created: AtomicU64,
    pub(super) buffer_bytes_created: AtomicU64,
    pub(super) bind_groups_created: AtomicU64,
    /// Dispatches recorded ([`Gpu::dispatches_recorded`]).
    pub(super) dispatches: AtomicU64,
}

impl Counters {
    /// Counters that start at `buffers` buffers of `bytes` bytes in all (those the device
    /// made for itself) and no bind groups.
    pub(super) fn new(buffers: u64, bytes: u64) -> Counters {
        Counters {
            buffers_created: AtomicU64::new(buffers),
            buffer_bytes_created: AtomicU64::new(bytes),
            bind_groups_created: AtomicU64::new(0),
            dispatches: AtomicU64::new(0),
        }
    }
}

/// Counts of GPU objects, for leak checks and `sparsa chat`'s `/stats` (see [`Gpu::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Buffers sparsa created since the device was opened, and their bytes.
    pub buffers_created: u64,
    pub buffer_bytes_created: u64,
    /// Bind groups sparsa created since the device was opened.
    pub bind_groups_created: u64,
    /// Buffers alive in wgpu's backend (wgpu's internal staging buffers included), and the
    /// device memory bound to them; 0 where wgpu keeps no counters (the browser).
    pub live_buffers: u64,
    pub live_buffer_bytes: u64,
    /// Bind groups alive in wgpu's backend.
    pub live_bind_groups: u64,
    /// Bytes the backend's memory allocator has handed out, and the bytes of the memory
    /// blocks it holds, where it reports them (Vulkan, D3D12).
    pub allocated_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
}

impl GpuStats {
    /// One line for `/stats` and logs.
    pub fn line(&self) -> String {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let mut s = format!(
            "GPU buffers: live {} ({:.1} MiB), created {} ({:.1} MiB) | bind groups: live {}, created {}",
            self.live_buffers,
            mib(self.live_buffer_bytes),
            self.buffers_created,
            mib(self.buffer_bytes_created),
            self.live_bind_groups,
            self.bind_groups_created,
        );
        if let (Some(a), Some(r)) = (self.allocated_bytes, self.reserved_bytes) {
            s.push_str(&format!(
                " | allocator: {:.1} MiB in use, {:.1} MiB reserved",
                mib(a),
                mib(r)
            ));
        }
        s
    }
}

impl Gpu {
    /// Compute dispatches recorded since the device was opened (what `sparsa bench` divides
    /// by the tokens of a step: dispatches per token and per layer).
    pub fn dispatches_recorded(&self) -> u64 {
        self.counters.dispatches.load(Ordering::Relaxed)
    }

    /// Buffers and bind groups created so far and alive now, and the allocator's totals (a
    /// few atomic loads; the allocator report walks its allocations, so this is for
    /// `/stats` and tests, not for every token).
    pub fn stats(&self) -> GpuStats {
        let hal = self.device.get_internal_counters().hal;
        let n = |v: isize| v.max(0) as u64;
        let report = self.device.generate_allocator_report();
        GpuStats {
            buffers_created: self.counters.buffers_created.load(Ordering::Relaxed),
            buffer_bytes_created: self.counters.buffer_bytes_created.load(Ordering::Relaxed),
            bind_groups_created: self.counters.bind_groups_created.load(Ordering::Relaxed),
            live_buffers: n(hal.buffers.read()),
            live_buffer_bytes: n(hal.buffer_memory.read()),
            live_bind_groups: n(hal.bind_groups.read()),
            allocated_bytes: report.as_ref().map(|r| r.total_allocated_bytes),
            reserved_bytes: report.as_ref().map(|r| r.total_reserved_bytes),
        }
    }
}
