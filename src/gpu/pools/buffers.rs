//! Buffers: every buffer and bind group sparsa makes is created here (so [`Gpu::stats`]
//! counts them), storage buffers are checked against the binding limit and for creation
//! errors, host bytes are written into buffers (one by one or as a batch copied by a team of
//! threads), and the [`ScratchPool`] keeps kernel scratch buffers by name and the dummy
//! buffer bound where a kernel declares a binding it does not read.

use crate::error::{Error, Result};
use crate::gpu::stats::HostPart;
use crate::gpu::{lock, Gpu};
use std::collections::HashMap;
#[cfg(not(target_arch = "wasm32"))]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// One write of [`Gpu::write_batch`]: `bytes` to `buf` at `offset`.
pub struct Write<'a> {
    pub buf: wgpu::Buffer,
    pub offset: u64,
    pub bytes: std::borrow::Cow<'a, [u8]>,
}

/// Buffers kernels borrow rather than own.
pub(in crate::gpu) struct ScratchPool {
    /// Kernel scratch buffers by name, grown on demand and kept (see [`Gpu::scratch`]).
    named: Mutex<HashMap<&'static str, wgpu::Buffer>>,
    /// A small storage buffer bound where a kernel declares a binding it does not read
    /// (e.g. the scales of float weights).
    dummy: wgpu::Buffer,
}

impl ScratchPool {
    pub(in crate::gpu) fn new(dummy: wgpu::Buffer) -> ScratchPool {
        ScratchPool {
            named: Mutex::default(),
            dummy,
        }
    }
}

impl Gpu {
    /// The scratch buffer `name` with at least `bytes` bytes: created on first use, replaced
    /// by a larger one when a call needs more, else reused. For intermediate results that
    /// live between two dispatches of one kernel (queue order keeps the uses apart).
    pub fn scratch(&self, name: &'static str, bytes: u64) -> Result<wgpu::Buffer> {
        let mut m = lock(&self.scratch.named);
        if let Some(b) = m.get(name) {
            if b.size() >= bytes {
                return Ok(b.clone());
            }
        }
        let b = self.buffer(bytes, name)?;
        m.insert(name, b.clone());
        Ok(b)
    }

    pub fn dummy(&self) -> &wgpu::Buffer {
        &self.scratch.dummy
    }

    /// A storage buffer of `bytes` (rounded up to 4), usable as copy source and destination.
    pub fn buffer(&self, bytes: u64, label: &str) -> Result<wgpu::Buffer> {
        let size = bytes.max(4).div_ceil(4) * 4;
        self.check_binding(size, label)?;
        let created = self.counters.buffer_bytes_created.load(Ordering::Relaxed) + size;
        if crate::fault::injected("GPU_MEMORY").is_some_and(|limit| created > limit) {
            // What a driver reports when the memory is gone (see crate::fault).
            let msg = format!(
                "out of GPU memory on {} (SPARSA_FAULT_GPU_MEMORY): use a smaller --ctx or model, or --gpu-memory SIZE to stream routed experts from the files",
                self.adapter.name
            );
            return Err(Error::msg(format!("buffer {label} ({size} bytes): {msg}")));
        }
        let usage = wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC;
        self.checked_buffer(size, usage, label)
    }

    /// An error where a storage buffer of `size` bytes would not fit one binding.
    fn check_binding(&self, size: u64, label: &str) -> Result<()> {
        if size > self.max_binding() {
            return Err(Error::msg(format!(
                "buffer {label}: {size} bytes exceed the adapter's storage binding limit of {} bytes",
                self.max_binding()
            )));
        }
        Ok(())
    }

    /// A buffer of `size` bytes and `usage`, or the error its creation reported (natively a
    /// failed creation reports to the error handler during the call).
    fn checked_buffer(
        &self,
        size: u64,
        usage: wgpu::BufferUsages,
        label: &str,
    ) -> Result<wgpu::Buffer> {
        let seen = lock(&self.health.errors).len();
        let buf = self.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        });
        let mut errors = lock(&self.health.errors);
        if errors.len() > seen {
            let new: Vec<String> = errors.drain(seen..).collect();
            return Err(Error::msg(format!(
                "buffer {label} ({size} bytes): {}",
                new[0].lines().next().unwrap_or("")
            )));
        }
        Ok(buf)
    }

    /// Whether the device keeps buffers in host memory for the GPU to copy from
    /// ([`Gpu::host_buffer`]: natively mappable primary buffers).
    pub fn host_buffers(&self) -> bool {
        self.device
            .features()
            .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
    }

    /// A buffer of `bytes` (rounded up to 4) in host memory that the GPU copies from
    /// (MAP_READ | COPY_SRC | COPY_DST: with natively mappable primary buffers such a buffer
    /// lives in system RAM, where the GPU reads it over the bus with no host copy in the
    /// way); filled through the queue. An error where the adapter lacks the feature.
    pub fn host_buffer(&self, bytes: u64, label: &str) -> Result<wgpu::Buffer> {
        self.host_buffer_for(bytes, label, wgpu::BufferUsages::empty())
    }

    /// [`Gpu::host_buffer`] that kernels also bind as storage: they read it over the bus
    /// (for tables of which a step reads a few rows, such as the embedding table).
    pub fn host_storage(&self, bytes: u64, label: &str) -> Result<wgpu::Buffer> {
        self.host_buffer_for(bytes, label, wgpu::BufferUsages::STORAGE)
    }

    fn host_buffer_for(
        &self,
        bytes: u64,
        label: &str,
        extra: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        if !self.host_buffers() {
            return Err(Error::msg(format!(
                "buffer {label}: {} cannot keep buffers in host memory for the GPU to read (no MAPPABLE_PRIMARY_BUFFERS)",
                self.adapter.name
            )));
        }
        let size = bytes.max(4).div_ceil(4) * 4;
        if extra.contains(wgpu::BufferUsages::STORAGE) {
            self.check_binding(size, label)?;
        }
        let usage = wgpu::BufferUsages::MAP_READ
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST
            | extra;
        self.checked_buffer(size, usage, label)
    }

    /// Every buffer sparsa makes is created here, so [`Gpu::stats`] can count them.
    pub fn create_buffer(&self, desc: &wgpu::BufferDescriptor) -> wgpu::Buffer {
        self.counters
            .buffers_created
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .buffer_bytes_created
            .fetch_add(desc.size, Ordering::Relaxed);
        self.device.create_buffer(desc)
    }

    /// Every bind group sparsa makes is created here, so [`Gpu::stats`] can count them.
    pub fn create_bind_group(&self, desc: &wgpu::BindGroupDescriptor) -> wgpu::BindGroup {
        self.counters
            .bind_groups_created
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .time(HostPart::BindGroups, || self.device.create_bind_group(desc))
    }

    /// A storage buffer holding `data`.
    pub fn buffer_from<T: bytemuck::Pod>(&self, data: &[T], label: &str) -> Result<wgpu::Buffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buf = self.buffer(bytes.len() as u64, label)?;
        self.write(&buf, 0, bytes);
        Ok(buf)
    }

    /// Write bytes at `offset` (a multiple of 4); a ragged tail is zero-padded to 4 bytes.
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        self.counters.time(HostPart::Writes, || {
            let whole = bytes.len() / 4 * 4;
            if whole > 0 {
                self.queue.write_buffer(buf, offset, &bytes[..whole]);
            }
            if whole < bytes.len() {
                let mut tail = [0u8; 4];
                tail[..bytes.len() - whole].copy_from_slice(&bytes[whole..]);
                self.queue.write_buffer(buf, offset + whole as u64, &tail);
            }
        })
    }

    /// Many writes at once (expert offloading's uploads): large ones go straight into the
    /// API's staging memory, all of them copied by one team of threads that share the bytes
    /// evenly (a single thread's copy out of a memory-mapped file, page faults included, is
    /// far slower than the PCIe link). Large writes need offsets and lengths that are
    /// multiples of 4; small ones go through [`Gpu::write`].
    pub fn write_batch(&self, writes: &[Write]) {
        self.counters.writes.fetch_add(1, Ordering::Relaxed);
        #[cfg(not(target_arch = "wasm32"))]
        {
            const LARGE: usize = 256 << 10;
            let mut views = Vec::new();
            let mut jobs: Vec<(usize, &[u8])> = Vec::new();
            for w in writes {
                let b: &[u8] = &w.bytes;
                let view = (b.len() >= LARGE && b.len().is_multiple_of(4))
                    .then(|| std::num::NonZeroU64::new(b.len() as u64))
                    .flatten()
                    .and_then(|n| self.queue.write_buffer_with(&w.buf, w.offset, n));
                match view {
                    Some(mut v) => {
                        let mut dst = v.slice(..);
                        // As an address, so that the threads may share it.
                        jobs.push((dst.as_raw_element_ptr().as_ptr() as usize, b));
                        views.push(v);
                    }
                    None => self.write(&w.buf, w.offset, b),
                }
            }
            if jobs.is_empty() {
                // Nothing large: no threads to start (an offloaded layer whose experts all
                // hit calls this with nothing at all).
                return;
            }
            let total: usize = jobs.iter().map(|j| j.1.len()).sum();
            let threads = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(16)
                .min(total.div_ceil(LARGE))
                .max(1);
            // Cut every job into pieces of about total / (4 · threads) bytes; threads take
            // pieces in turn.
            let piece = total.div_ceil(4 * threads).max(4096).div_ceil(4) * 4;
            let pieces: Vec<(usize, &[u8])> = jobs
                .iter()
                .flat_map(|&(dst, src)| {
                    src.chunks(piece)
                        .enumerate()
                        .map(move |(i, c)| (dst + i * piece, c))
                })
                .collect();
            let next = AtomicU64::new(0);
            let copy_pieces = || loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&(dst, src)) = pieces.get(i) else {
                    break;
                };
                // SAFETY: `dst` points into a writable staging mapping (one view per job,
                // alive in `views` until the copies are done) with room for the whole job;
                // pieces of one job are disjoint ranges of it, and each piece is copied by
                // exactly one thread from `src`, a range of the caller's bytes (a different
                // allocation).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) }
            };
            if threads == 1 {
                copy_pieces();
            } else {
                std::thread::scope(|sc| {
                    for _ in 0..threads {
                        sc.spawn(copy_pieces);
                    }
                });
            }
            drop(views);
        }
        #[cfg(target_arch = "wasm32")]
        for w in writes {
            self.write(&w.buf, w.offset, &w.bytes);
        }
    }
}
