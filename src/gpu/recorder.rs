//! Records dispatches and copies, then submits them in one command buffer.
//!
//! Each dispatch's `Params` are packed into the GPU's uniform arena at 256-byte strides;
//! the arena is written once right before the submit. When it fills up the recorder
//! submits what it has and goes on (queue order keeps the earlier reads first).
//!
//! What a recorder holds can be kept ([`Recorder::keep`]) and submitted again later as it
//! is ([`Recorder::replay`]): the same pipelines, bind groups and parameter bytes, without
//! the host walking the model again. Work whose every dispatch is the same each time (a
//! speculative round whose positions the GPU keeps) is recorded once and replayed.

use super::pools::{BindGroupCache, PARAM_ARENA};
use super::profile::{Cost, ProfileClock};
use super::stats::{HostPart, Stopwatch};
use super::{Gpu, Kernel, KernelParams};
use crate::error::Result;
use std::sync::{Arc, MutexGuard};

const PARAM_STRIDE: u64 = 256;
/// Dispatches per submission while profiling with timestamps (two queries each).
const PROFILE_BATCH: usize = 1024;

#[derive(Clone)]
enum Op {
    Dispatch {
        pipeline: Arc<wgpu::ComputePipeline>,
        group: wgpu::BindGroup,
        wg: [u32; 3],
        cost: Cost,
    },
    Copy(BufferCopy),
}

/// `size` bytes from `src_off` in `src` to `dst_off` in `dst`: a copy to record
/// ([`Recorder::copy_all`]), e.g. an expert upload the GPU makes from host memory.
#[derive(Clone, Debug)]
pub struct BufferCopy {
    pub src: wgpu::Buffer,
    pub src_off: u64,
    pub dst: wgpu::Buffer,
    pub dst_off: u64,
    pub size: u64,
}

pub struct Recorder<'g> {
    gpu: &'g Gpu,
    params: Vec<u8>,
    ops: Vec<Op>,
    /// The cost stated for the next dispatch.
    cost: Cost,
    /// Reuse bind groups across recorders (see [`Recorder::cache_bind_groups`]).
    cache: bool,
    /// Submit after this many dispatches (0: only at [`Recorder::flush`]); see
    /// [`Recorder::submit_every`].
    every: usize,
    /// What must be done before the next submission ([`Recorder::before_submit`]).
    pending: Option<Box<dyn FnOnce() -> Result<()> + 'g>>,
    /// Whether anything was submitted yet, and the device's host writes when recording
    /// began: what [`Recorder::keep`] checks.
    flushed: bool,
    writes0: u64,
    /// Whether it records a prompt's prefill ([`Recorder::set_prefill`]).
    prefill: bool,
    _arena: MutexGuard<'g, ()>,
}

/// Dispatches and copies with their parameter bytes, kept by [`Recorder::keep`] to be
/// submitted again by [`Recorder::replay`]. Its bind groups hold the buffers they name: a
/// recording whose buffers were since replaced (a cache that grew) must not be replayed,
/// which its keeper tracks.
#[derive(Clone)]
pub struct Recording {
    ops: Vec<Op>,
    params: Vec<u8>,
}

impl Recording {
    /// The dispatches it holds.
    pub fn dispatches(&self) -> usize {
        self.ops
            .iter()
            .filter(|o| matches!(o, Op::Dispatch { .. }))
            .count()
    }
}

impl Gpu {
    /// Start recording. Only one recorder exists at a time (it owns the param arena).
    pub fn recorder(&self) -> Recorder<'_> {
        Recorder {
            gpu: self,
            params: Vec::new(),
            ops: Vec::new(),
            cost: Cost::default(),
            cache: false,
            every: 0,
            pending: None,
            flushed: false,
            prefill: false,
            writes0: self
                .counters
                .writes
                .load(std::sync::atomic::Ordering::Relaxed),
            _arena: super::lock(&self.params.lock),
        }
    }
}

impl<'g> Recorder<'g> {
    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// Keep this recorder's bind groups in the device's cache and reuse identical ones (same
    /// pipeline, params slot and buffers): a decode step records the same dispatches every
    /// token, so after the first token no bind group is created. Only for long-lived
    /// buffers (a model's weights, caches and scratch): the cache holds them until
    /// [`Gpu::clear_bind_groups`].
    pub fn cache_bind_groups(&mut self, on: bool) {
        self.cache = on;
    }

    /// Mark what this recorder records as a prompt's prefill: its tensor-core GEMMs of q4
    /// weights may then take x as one f16 value ([`Gpu::set_exact_gemms`]). Decode steps,
    /// batched steps and speculative verifications are not marked: their GEMMs stay as
    /// precise as f32, so batching and drafts keep the tokens of plain decoding.
    pub fn set_prefill(&mut self, on: bool) {
        self.prefill = on;
    }

    /// Whether the GEMMs recorded here keep x as precise as f32: everywhere but a prefill
    /// ([`Recorder::set_prefill`]), and there too where the device's GEMMs are exact.
    pub fn exact_gemms(&self) -> bool {
        !self.prefill || self.gpu.exact_gemms()
    }

    /// Submit what is recorded after every `n` dispatches (0: once, at the end), so that
    /// the GPU starts on a long recording's first layers while the host records the rest:
    /// for work the host waits for as soon as it is recorded (a speculative round's
    /// verification, a prompt chunk). A pipelined decode step, recorded while the GPU runs
    /// the previous one, gains nothing from it.
    pub fn submit_every(&mut self, n: usize) {
        self.every = n;
    }

    /// State the bytes the next dispatch must move and the FLOPs it must compute (for the
    /// profiler's report; `tag` tells variants of one kernel apart, e.g. weight formats).
    pub fn cost(&mut self, bytes: u64, flops: u64, tag: &'static str) {
        self.cost = Cost { bytes, flops, tag };
    }

    /// Dispatch `kernel` with `params` at binding 0 and `buffers` at bindings 1.. .
    /// `wg` is the workgroup grid; a zero anywhere skips the dispatch.
    pub fn dispatch<P: KernelParams>(
        &mut self,
        kernel: &Kernel<P>,
        params: &P,
        buffers: &[&wgpu::Buffer],
        wg: [u32; 3],
    ) {
        if wg.contains(&0) {
            return;
        }
        let gpu = self.gpu;
        let cost = gpu.counters.time(HostPart::Record, || {
            self.record(kernel, params, buffers, wg)
        });
        let pipeline = &kernel.pipeline;
        let clock = super::lock(&self.gpu.profile.profiler)
            .as_ref()
            .map(|p| p.clock);
        match clock {
            Some(ProfileClock::Timestamps) if self.ops.len() >= PROFILE_BATCH => self.flush(),
            None if self.every > 0 && self.ops.len() >= self.every => self.flush(),
            None | Some(ProfileClock::Timestamps) => {}
            Some(ProfileClock::Wall) => {
                let t = std::time::Instant::now();
                self.flush();
                // An error here is reported again by the next check.
                let _ = self.gpu.sync();
                let dt = t.elapsed().as_secs_f64();
                let label = self.gpu.label_of(pipeline);
                if let Some(p) = super::lock(&self.gpu.profile.profiler).as_mut() {
                    p.add(&label, dt, cost);
                }
            }
        }
    }

    /// The dispatch's parameters into the arena, its bind group (cached or made) and its
    /// op; returns its stated cost.
    fn record<P: KernelParams>(
        &mut self,
        kernel: &Kernel<P>,
        params: &P,
        buffers: &[&wgpu::Buffer],
        wg: [u32; 3],
    ) -> Cost {
        let pipeline = &kernel.pipeline;
        self.gpu
            .counters
            .dispatches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if log::log_enabled!(log::Level::Trace) {
            log::trace!("dispatch {} {wg:?}", self.gpu.label_of(pipeline));
        }
        let bytes = bytemuck::bytes_of(params);
        assert!(
            bytes.len() as u64 <= PARAM_STRIDE,
            "kernel params larger than {PARAM_STRIDE} bytes"
        );
        if self.params.len() as u64 + PARAM_STRIDE > PARAM_ARENA {
            self.flush();
        }
        let offset = self.params.len() as u64;
        self.params.extend_from_slice(bytes);
        self.params.resize((offset + PARAM_STRIDE) as usize, 0);
        let size = (bytes.len() as u64).div_ceil(16) * 16;
        let key = self
            .cache
            .then(|| BindGroupCache::key(pipeline, offset, size, buffers));
        let cached = key.as_ref().and_then(|k| self.gpu.bind_groups.get(k));
        let group = match cached {
            Some(g) => g,
            None => {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.gpu.params.buffer,
                        offset,
                        size: std::num::NonZeroU64::new(size),
                    }),
                }];
                for (i, b) in buffers.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: b.as_entire_binding(),
                    });
                }
                let g = self.gpu.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                });
                if let Some(k) = key {
                    self.gpu.bind_groups.insert(k, g.clone());
                }
                g
            }
        };
        let cost = std::mem::take(&mut self.cost);
        self.ops.push(Op::Dispatch {
            pipeline: pipeline.clone(),
            group,
            wg,
            cost,
        });
        cost
    }

    /// Everything recorded so far, kept to be submitted again by [`Recorder::replay`]; None
    /// where submitting it again as it is would not repeat this recording: part of it was
    /// submitted already, the host wrote to a buffer meanwhile (written again by the
    /// caller, not by the replay), a job waits for the submission, or the profiler is on.
    /// Replaying is for recordings whose dispatches read only what the GPU itself keeps
    /// (positions in a state buffer), so that the same commands do the next step's work.
    pub fn keep(&self) -> Option<Recording> {
        let writes = self
            .gpu
            .counters
            .writes
            .load(std::sync::atomic::Ordering::Relaxed);
        let profiling = super::lock(&self.gpu.profile.profiler).is_some();
        let clean = !self.flushed
            && self.pending.is_none()
            && writes == self.writes0
            && !profiling
            && !self.ops.is_empty();
        clean.then(|| Recording {
            ops: self.ops.clone(),
            params: self.params.clone(),
        })
    }

    /// Records `r` again, as it was kept: into a recorder that has recorded nothing yet,
    /// so that its parameters land in the arena slots its bind groups name.
    pub fn replay(&mut self, r: &Recording) {
        assert!(
            self.ops.is_empty() && self.params.is_empty() && !self.flushed,
            "a recording is replayed only into a fresh recorder"
        );
        let n = r.dispatches() as u64;
        self.gpu
            .counters
            .dispatches
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        self.ops.extend(r.ops.iter().cloned());
        self.params.extend_from_slice(&r.params);
    }

    /// Copy `size` bytes (multiple of 4) between buffers, in order with the dispatches.
    pub fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        size: u64,
    ) {
        if size == 0 {
            return;
        }
        self.ops.push(Op::Copy(BufferCopy {
            src: src.clone(),
            src_off,
            dst: dst.clone(),
            dst_off,
            size,
        }));
    }

    /// Record each of `copies` ([`Recorder::copy`]).
    pub fn copy_all(&mut self, copies: &[BufferCopy]) {
        for c in copies {
            self.copy(&c.src, c.src_off, &c.dst, c.dst_off, c.size);
        }
    }

    /// Has `job` run before the next submission, whatever makes it (the host's writes it
    /// makes, such as a hybrid round's CPU outputs, land before the dispatches recorded
    /// since, which read them). Meanwhile the host goes on recording. An error it returns
    /// is reported by the next [`Gpu::check`]. A job already pending runs first.
    pub fn before_submit(&mut self, job: impl FnOnce() -> Result<()> + 'g) {
        self.run_pending();
        self.pending = Some(Box::new(job));
    }

    fn run_pending(&mut self) {
        if let Some(job) = self.pending.take() {
            if let Err(e) = job() {
                super::lock(&self.gpu.health.host).get_or_insert(e);
            }
        }
    }

    /// Submit everything recorded so far (does not wait, except while profiling with
    /// timestamps, when it reads the timestamps back).
    pub fn flush(&mut self) {
        if self.ops.is_empty() {
            self.run_pending();
            return;
        }
        let watch = Stopwatch::start();
        self.flushed = true;
        let ops = std::mem::take(&mut self.ops);
        let timed = super::lock(&self.gpu.profile.profiler)
            .as_ref()
            .is_some_and(|p| p.clock == ProfileClock::Timestamps);
        let queries = timed.then(|| self.gpu.query_set(2 * ops.len() as u32));
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        let mut i = 0;
        let mut n_disp = 0u32;
        while i < ops.len() {
            if let Op::Copy(c) = &ops[i] {
                enc.copy_buffer_to_buffer(&c.src, c.src_off, &c.dst, c.dst_off, c.size);
                i += 1;
                continue;
            }
            let desc = wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: queries.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
                    query_set: q,
                    beginning_of_pass_write_index: Some(2 * n_disp),
                    end_of_pass_write_index: Some(2 * n_disp + 1),
                }),
            };
            let mut pass = enc.begin_compute_pass(&desc);
            while i < ops.len() {
                match &ops[i] {
                    Op::Dispatch {
                        pipeline,
                        group,
                        wg,
                        ..
                    } => {
                        pass.set_pipeline(pipeline);
                        pass.set_bind_group(0, group, &[]);
                        pass.dispatch_workgroups(wg[0], wg[1], wg[2]);
                        i += 1;
                        n_disp += 1;
                        if queries.is_some() {
                            break;
                        }
                    }
                    Op::Copy(_) => break,
                }
            }
        }
        let Some(qs) = queries else {
            let commands = enc.finish();
            self.gpu.counters.add(HostPart::Encode, watch);
            // A pending job (its writes) only now: the commands were encoded meanwhile.
            self.write_params();
            self.gpu.submit([commands]);
            return;
        };
        let bytes = 16 * n_disp as u64;
        let resolve = self.gpu.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps"),
            size: bytes.max(16),
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        enc.resolve_query_set(&qs, 0..2 * n_disp, &resolve, 0);
        let commands = enc.finish();
        self.write_params();
        self.gpu.submit([commands]);
        match self.gpu.read_timestamps(&resolve, bytes) {
            Ok(raw) => {
                let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&raw);
                let period = self.gpu.queue.get_timestamp_period() as f64 * 1e-9;
                let mut j = 0;
                let mut prof = super::lock(&self.gpu.profile.profiler);
                for op in &ops {
                    if let Op::Dispatch { pipeline, cost, .. } = op {
                        let dt = ticks[2 * j + 1].saturating_sub(ticks[2 * j]) as f64 * period;
                        if let Some(p) = prof.as_mut() {
                            p.add(&self.gpu.label_of(pipeline), dt, *cost);
                        }
                        j += 1;
                    }
                }
            }
            Err(e) => log::error!("profiler: {e}"),
        }
    }

    /// Before a submission: the pending job, then the parameter arena (both writes land
    /// before the submission's commands).
    fn write_params(&mut self) {
        self.run_pending();
        if !self.params.is_empty() {
            self.gpu
                .queue
                .write_buffer(&self.gpu.params.buffer, 0, &self.params);
        }
        self.params.clear();
    }

    /// Submit and wait for the GPU; reports GPU errors.
    pub fn finish(mut self) -> Result<()> {
        self.flush();
        self.gpu.sync()
    }
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use crate::error::Error;
    use crate::gpu::Gpu;

    fn gpu() -> Gpu {
        Gpu::new(std::env::var("SPARSA_ADAPTER").ok().as_deref()).expect("a GPU adapter")
    }

    /// Only a recorder marked as a prefill may round x to f16 in its GEMMs, and not on a
    /// device whose GEMMs are exact: decode steps, batches and verifications never do.
    #[test]
    fn only_a_prefill_on_a_device_not_exact_rounds_x() {
        let g = gpu();
        let mut rec = g.recorder();
        assert!(
            rec.exact_gemms(),
            "a recorder is exact unless marked as a prefill"
        );
        rec.set_prefill(true);
        assert!(!rec.exact_gemms(), "a prefill may round x");
        g.set_exact_gemms(true);
        assert!(rec.exact_gemms(), "--exact-gemms keeps a prefill exact");
        rec.set_prefill(false);
        g.set_exact_gemms(false);
        assert!(rec.exact_gemms());
    }

    /// A pending job's writes land before the copies of the submission that waited for it,
    /// though they were recorded before the job ran.
    #[test]
    fn a_pending_job_writes_before_the_submission_that_waits_for_it() {
        let gpu = gpu();
        let a = gpu.buffer(16, "a").unwrap();
        let b = gpu.buffer(16, "b").unwrap();
        let mut rec = gpu.recorder();
        rec.copy(&a, 0, &b, 0, 16);
        let (g, a2) = (&gpu, &a);
        rec.before_submit(move || {
            g.write(a2, 0, bytemuck::cast_slice(&[1.0f32, 2.0, 3.0, 4.0]));
            Ok(())
        });
        rec.finish().unwrap();
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&gpu.read_bytes(&b, 0, 16).unwrap());
        assert_eq!(got, [1.0, 2.0, 3.0, 4.0]);
    }

    /// A second job runs the first before it is held: neither is lost.
    #[test]
    fn a_second_pending_job_runs_the_first() {
        let gpu = gpu();
        let (c, d) = (gpu.buffer(4, "c").unwrap(), gpu.buffer(4, "d").unwrap());
        let g = &gpu;
        let mut rec = gpu.recorder();
        rec.before_submit(|| {
            g.write(&c, 0, bytemuck::bytes_of(&5.0f32));
            Ok(())
        });
        rec.before_submit(|| {
            g.write(&d, 0, bytemuck::bytes_of(&6.0f32));
            Ok(())
        });
        drop(rec);
        for (buf, want) in [(&c, 5.0f32), (&d, 6.0)] {
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(&gpu.read_bytes(buf, 0, 4).unwrap());
            assert_eq!(got, [want]);
        }
    }

    /// A pending job's error is reported once, by the next check.
    #[test]
    fn a_pending_job_error_is_reported_by_the_next_check() {
        let gpu = gpu();
        let mut rec = gpu.recorder();
        rec.before_submit(|| Err(Error::msg("layer 3: the CPU experts' job panicked")));
        drop(rec);
        let err = gpu.check().unwrap_err().to_string();
        assert!(err.contains("layer 3"), "{err}");
        gpu.check().unwrap();
    }
}
