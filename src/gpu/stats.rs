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
    /// Writes from the host ([`Gpu::write`], [`Gpu::write_batch`]): a recording is kept for
    /// replay only where none came while it was made ([`Recorder::keep`](super::Recorder::keep)).
    pub(super) writes: AtomicU64,
    /// Where the host's time goes ([`Gpu::host_times`]).
    pub(super) host: [AtomicU64; HOST_PARTS],
}

/// A start time for [`Counters::add`] and the host's own timings (nothing in the browser,
/// which has no clock here: `std::time::Instant` panics there).
#[derive(Clone, Copy)]
pub(crate) struct Stopwatch(#[cfg(not(target_arch = "wasm32"))] std::time::Instant);

impl Stopwatch {
    pub(crate) fn start() -> Stopwatch {
        Stopwatch(
            #[cfg(not(target_arch = "wasm32"))]
            std::time::Instant::now(),
        )
    }

    /// Milliseconds since the start (0 in the browser).
    pub(crate) fn ms(&self) -> f64 {
        #[cfg(not(target_arch = "wasm32"))]
        return self.0.elapsed().as_secs_f64() * 1e3;
        #[cfg(target_arch = "wasm32")]
        0.0
    }
}

/// The parts of [`HostTimes`], in its order.
const HOST_PARTS: usize = 7;

/// One part of the host's time in the GPU layer (see [`HostTimes`]).
#[derive(Clone, Copy)]
pub(super) enum HostPart {
    Pipelines = 0,
    Record,
    BindGroups,
    Encode,
    Submit,
    Writes,
    Submits,
}

impl Counters {
    /// Runs `f`, adding its host time to `part` (natively; the browser has no clock here).
    pub(super) fn time<R>(&self, part: HostPart, f: impl FnOnce() -> R) -> R {
        let watch = Stopwatch::start();
        let r = f();
        self.add(part, watch);
        r
    }

    /// Adds the time since `watch` started to `part`.
    pub(super) fn add(&self, part: HostPart, watch: Stopwatch) {
        #[cfg(not(target_arch = "wasm32"))]
        {
            let ns = watch.0.elapsed().as_nanos() as u64;
            self.host[part as usize].fetch_add(ns, Ordering::Relaxed);
        }
        #[cfg(target_arch = "wasm32")]
        let _ = (part, watch);
    }

    /// Counts one more of `part` (a count, not a time).
    pub(super) fn count(&self, part: HostPart) {
        self.host[part as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Host time spent in the GPU layer since the device was opened, in ms by part, and the
/// queue submissions (native only: zeros in the browser). Differences of two readings say
/// where a decode step's or a speculative round's host time goes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTimes {
    /// Looking up (or compiling) pipelines.
    pub pipelines_ms: f64,
    /// `Recorder::dispatch` (parameters, bind group lookup), bind group creation excluded.
    pub record_ms: f64,
    /// Creating bind groups.
    pub bind_groups_ms: f64,
    /// Encoding command buffers and writing the parameter arena.
    pub encode_ms: f64,
    /// `queue.submit`.
    pub submit_ms: f64,
    /// `queue.write_buffer` from the host (tokens, RoPE tables).
    pub writes_ms: f64,
    pub submits: u64,
}

impl HostTimes {
    /// What happened between `earlier` and this reading, divided by `n` (steps, rounds).
    pub fn since(&self, earlier: &HostTimes, n: u64) -> HostTimes {
        let d = |a: f64, b: f64| (a - b) / n.max(1) as f64;
        HostTimes {
            pipelines_ms: d(self.pipelines_ms, earlier.pipelines_ms),
            record_ms: d(self.record_ms, earlier.record_ms),
            bind_groups_ms: d(self.bind_groups_ms, earlier.bind_groups_ms),
            encode_ms: d(self.encode_ms, earlier.encode_ms),
            submit_ms: d(self.submit_ms, earlier.submit_ms),
            writes_ms: d(self.writes_ms, earlier.writes_ms),
            submits: (self.submits - earlier.submits) / n.max(1),
        }
    }

    /// One line for logs.
    pub fn line(&self) -> String {
        format!(
            "host ms: pipelines {:.3}, record {:.3}, bind groups {:.3}, encode {:.3}, submit {:.3} ({} submissions), writes {:.3}",
            self.pipelines_ms,
            self.record_ms,
            self.bind_groups_ms,
            self.encode_ms,
            self.submit_ms,
            self.submits,
            self.writes_ms
        )
    }
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
            writes: AtomicU64::new(0),
            host: Default::default(),
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

    /// Where the host's time in the GPU layer went so far (see [`HostTimes`]).
    pub fn host_times(&self) -> HostTimes {
        let h = &self.counters.host;
        let ms = |p: HostPart| h[p as usize].load(Ordering::Relaxed) as f64 * 1e-6;
        HostTimes {
            pipelines_ms: ms(HostPart::Pipelines),
            record_ms: ms(HostPart::Record) - ms(HostPart::BindGroups),
            bind_groups_ms: ms(HostPart::BindGroups),
            encode_ms: ms(HostPart::Encode),
            submit_ms: ms(HostPart::Submit),
            writes_ms: ms(HostPart::Writes),
            submits: h[HostPart::Submits as usize].load(Ordering::Relaxed),
        }
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
