//! Reading GPU buffers back to the host: a copy into a mappable staging buffer (kept between
//! reads and replaced only by a larger one), mapped once the GPU has finished the submission
//! it waits for. Natively the reads block on the GPU; in the browser they are futures that
//! resolve when the buffer is mapped.

use super::oneshot::oneshot;
use super::{lock, Gpu, Recorder};
use crate::error::{Error, Result};
use std::sync::Mutex;

/// The staging buffer and the latest submission, which readbacks wait for.
#[derive(Default)]
pub(super) struct Readback {
    /// The mappable buffer readbacks copy into, kept between reads and replaced only by a
    /// larger one (`None` while a read has it).
    staging: Mutex<Option<wgpu::Buffer>>,
    /// The latest queue submission (see [`Gpu::last_submission`]).
    pub(super) last_submit: Mutex<Option<wgpu::SubmissionIndex>>,
}

/// The longest a short wait in the middle of a step polls before it blocks (where
/// [`Gpu::spin_waits`]): the routing read-back's, a hybrid round's CPU part's.
pub const SPIN_LIMIT: std::time::Duration = std::time::Duration::from_millis(100);

/// A read-back whose copies into the staging buffer are recorded ([`Recorder::stage_read`]):
/// each part's (offset in the buffer, bytes).
pub struct StagedRead {
    staging: wgpu::Buffer,
    parts: Vec<(u64, u64)>,
    size: u64,
}

impl Recorder<'_> {
    /// Records copies of `parts` (`(buffer, offset, bytes)`, offsets multiples of 4) into the
    /// read-back staging buffer: they go with the work recorded so far, in one submission,
    /// and [`Gpu::read_staged`] waits for them once it is flushed.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn stage_read(&mut self, parts: &[(&wgpu::Buffer, u64, u64)]) -> StagedRead {
        let r = self.gpu().staging_for(parts);
        for (&(buf, offset, _), &(to, len)) in parts.iter().zip(&r.parts) {
            self.copy(buf, offset, &r.staging, to, len.div_ceil(4) * 4);
        }
        r
    }
}

impl Gpu {
    /// Copy `bytes` bytes from `offset` in `buf` back to the host (waits for the GPU).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_bytes(&self, buf: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>> {
        pollster::block_on(self.read_bytes_async(buf, offset, bytes))
    }

    /// [`Gpu::read_bytes`] for every platform: natively the GPU is waited for before the
    /// first await (so the future is ready at once); in the browser the future resolves
    /// when the buffer is mapped.
    pub async fn read_bytes_async(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>> {
        let mut parts = self.read_parts_async(&[(buf, offset, bytes)]).await?;
        Ok(parts.pop().unwrap_or_default())
    }

    /// The parts [`Recorder::stage_read`] copied, once the submission that carries the
    /// copies has run. For short waits in the middle of a step (an offloaded layer's
    /// routing): on a GPU the thread polls without sleeping until the data is there
    /// (see [`Gpu::spin_waits`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_staged(&self, r: StagedRead) -> Result<Vec<Vec<u8>>> {
        pollster::block_on(self.finish_read(r, self.spin_waits()))
    }

    /// Whether the host polls instead of sleeping for the short waits in the middle of a
    /// step ([`Gpu::read_staged`], a hybrid round's CPU part): on a GPU, not on a CPU
    /// adapter, whose threads need the cores. On the H200, full-depth GLM-5 q4 hybrid
    /// decode: 70.1–70.6 ms a token waiting for the offloaded layers' routing against
    /// 75.0–75.3 sleeping (BENCHMARKS.md, "Hybrid decode: the CPU's part overlapped").
    /// `SPARSA_SPIN_WAIT=0` never polls; `=1` polls in every read-back (measurement aids).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn spin_waits(&self) -> bool {
        crate::knobs::knob!("SPARSA_SPIN_WAIT", |v| v <= 1).unwrap_or(1) == 1
            && !self.adapter.is_cpu()
    }

    /// Several `(buffer, offset, bytes)` ranges copied back in one submission and one wait
    /// (offsets multiples of 4), sleeping while it waits (see [`Gpu::read_bytes_async`]).
    /// Within a recorded step, [`Recorder::stage_read`] puts the copies in the step's own
    /// submission instead.
    pub async fn read_parts_async(
        &self,
        parts: &[(&wgpu::Buffer, u64, u64)],
    ) -> Result<Vec<Vec<u8>>> {
        let r = self.staging_for(parts);
        let mut enc = self.device.create_command_encoder(&Default::default());
        for (&(buf, offset, _), &(to, len)) in parts.iter().zip(&r.parts) {
            enc.copy_buffer_to_buffer(buf, offset, &r.staging, to, len.div_ceil(4) * 4);
        }
        self.submit([enc.finish()]);
        self.finish_read(r, false).await
    }

    /// Where `parts` go in the staging buffer, each at a 4-byte multiple as copies require.
    /// The buffer is taken out of its slot for the read (a read that overlaps another, only
    /// possible in the browser, makes its own) and put back after it.
    fn staging_for(&self, parts: &[(&wgpu::Buffer, u64, u64)]) -> StagedRead {
        let mut at = Vec::with_capacity(parts.len());
        let mut size = 0u64;
        for &(_, _, bytes) in parts {
            at.push((size, bytes));
            size += bytes.div_ceil(4) * 4;
        }
        let kept = lock(&self.readback.staging).take();
        let staging = match kept {
            Some(b) if b.size() >= size.max(4) => b,
            old => self.create_buffer(&wgpu::BufferDescriptor {
                label: Some("readback"),
                size: size.max(4).max(old.map_or(0, |b| b.size())),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        StagedRead {
            staging,
            parts: at,
            size,
        }
    }

    /// Maps the staging buffer of `r` once every submission so far has run, puts it back in
    /// its slot and splits it into the parts.
    async fn finish_read(&self, r: StagedRead, spin: bool) -> Result<Vec<Vec<u8>>> {
        let data = self.read_mapped(&r.staging, r.size, None, spin).await?;
        let mut slot = lock(&self.readback.staging);
        if slot.as_ref().is_none_or(|b| b.size() < r.staging.size()) {
            *slot = Some(r.staging);
        }
        Ok(r.parts
            .iter()
            .map(|&(to, len)| data[to as usize..(to + len) as usize].to_vec())
            .collect())
    }

    /// The first `bytes` bytes of the mappable buffer `buf`, once the submission `after` (or,
    /// with `None`, every submission so far) has finished on the GPU; later submissions may
    /// still run. The buffer is unmapped again before this returns.
    pub async fn read_mapped_async(
        &self,
        buf: &wgpu::Buffer,
        bytes: u64,
        after: Option<wgpu::SubmissionIndex>,
    ) -> Result<Vec<u8>> {
        self.read_mapped(buf, bytes, after, false).await
    }

    /// [`Gpu::read_mapped_async`], polling without sleeping first where `spin`.
    async fn read_mapped(
        &self,
        buf: &wgpu::Buffer,
        bytes: u64,
        after: Option<wgpu::SubmissionIndex>,
        spin: bool,
    ) -> Result<Vec<u8>> {
        let slice = buf.slice(..bytes.div_ceil(4).max(1) * 4);
        let (tx, rx) = oneshot();
        slice.map_async(wgpu::MapMode::Read, move |r| tx.send(r));
        #[cfg(target_arch = "wasm32")]
        let _ = spin;
        // Natively, poll without blocking until the map completes (up to 100 ms, then
        // block): a round trip per offloaded layer then does not pay a sleeping thread's
        // wake-up. It keeps one core busy waiting.
        #[cfg(not(target_arch = "wasm32"))]
        if spin || crate::knobs::knob!("SPARSA_SPIN_WAIT", |v| v <= 1) == Some(1) {
            let t0 = std::time::Instant::now();
            while !rx.is_ready() && t0.elapsed() < SPIN_LIMIT {
                let _ = self.device.poll(wgpu::PollType::Poll);
                std::hint::spin_loop();
            }
        }
        // In the browser this returns at once: the device is polled by the browser itself.
        let wait = wgpu::PollType::Wait {
            submission_index: after,
            timeout: None,
        };
        if let Err(e) = self.device.poll(wait) {
            self.check()?;
            return Err(Error::msg(format!(
                "GPU wait failed on {}: {e}",
                self.adapter.name
            )));
        }
        let mapped = rx.await;
        if !matches!(mapped, Some(Ok(()))) {
            // A device lost after the awaited submission fails the map; its callback runs
            // when the device is waited on, so the loss is what gets reported.
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        }
        self.check()?;
        mapped
            .ok_or_else(|| Error::msg("GPU readback was dropped"))?
            .map_err(|e| Error::msg(format!("GPU readback failed: {e}")))?;
        let data = slice
            .get_mapped_range()
            .map_err(|e| Error::msg(format!("GPU readback failed: {e}")))?[..bytes as usize]
            .to_vec();
        buf.unmap();
        Ok(data)
    }

    /// The latest queue submission, to wait for with [`Gpu::read_mapped_async`].
    pub fn last_submission(&self) -> Option<wgpu::SubmissionIndex> {
        lock(&self.readback.last_submit).clone()
    }

    pub async fn read_f32_async(
        &self,
        buf: &wgpu::Buffer,
        offset_elems: u64,
        n: usize,
    ) -> Result<Vec<f32>> {
        let b = self
            .read_bytes_async(buf, offset_elems * 4, n as u64 * 4)
            .await?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_f32(&self, buf: &wgpu::Buffer, offset_elems: u64, n: usize) -> Result<Vec<f32>> {
        pollster::block_on(self.read_f32_async(buf, offset_elems, n))
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_u32(&self, buf: &wgpu::Buffer, offset_elems: u64, n: usize) -> Result<Vec<u32>> {
        let b = self.read_bytes(buf, offset_elems * 4, n as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }
}
