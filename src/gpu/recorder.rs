//! Records dispatches and copies, then submits them in one command buffer.
//!
//! Each dispatch's `Params` are packed into the GPU's uniform arena at 256-byte strides;
//! the arena is written once right before the submit. When it fills up the recorder
//! submits what it has and goes on (queue order keeps the earlier reads first).

use super::{Gpu, PARAM_ARENA};
use crate::error::Result;
use std::sync::{Arc, MutexGuard};

const PARAM_STRIDE: u64 = 256;

enum Op {
    Dispatch {
        pipeline: Arc<wgpu::ComputePipeline>,
        group: wgpu::BindGroup,
        wg: [u32; 3],
    },
    Copy {
        src: wgpu::Buffer,
        src_off: u64,
        dst: wgpu::Buffer,
        dst_off: u64,
        size: u64,
    },
}

pub struct Recorder<'g> {
    gpu: &'g Gpu,
    params: Vec<u8>,
    ops: Vec<Op>,
    _arena: MutexGuard<'g, ()>,
}

impl Gpu {
    /// Start recording. Only one recorder exists at a time (it owns the param arena).
    pub fn recorder(&self) -> Recorder<'_> {
        Recorder {
            gpu: self,
            params: Vec::new(),
            ops: Vec::new(),
            _arena: super::lock(&self.arena_lock),
        }
    }
}

impl<'g> Recorder<'g> {
    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    /// Dispatch `pipeline` with `params` at binding 0 and `buffers` at bindings 1.. .
    /// `wg` is the workgroup grid; a zero anywhere skips the dispatch.
    pub fn dispatch<P: bytemuck::Pod>(
        &mut self,
        pipeline: &Arc<wgpu::ComputePipeline>,
        params: &P,
        buffers: &[&wgpu::Buffer],
        wg: [u32; 3],
    ) {
        if wg.contains(&0) {
            return;
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
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &self.gpu.param_arena,
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
        let group = self
            .gpu
            .device
            .create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            });
        self.ops.push(Op::Dispatch {
            pipeline: pipeline.clone(),
            group,
            wg,
        });
        if super::lock(&self.gpu.profile).is_some() {
            let t = std::time::Instant::now();
            self.flush();
            // An error here is reported again by the next check.
            let _ = self.gpu.sync();
            let dt = t.elapsed().as_secs_f64();
            let label = self.gpu.label_of(pipeline);
            if let Some(m) = super::lock(&self.gpu.profile).as_mut() {
                let e = m.entry(label).or_insert((0.0, 0));
                e.0 += dt;
                e.1 += 1;
            }
        }
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
        self.ops.push(Op::Copy {
            src: src.clone(),
            src_off,
            dst: dst.clone(),
            dst_off,
            size,
        });
    }

    /// Submit everything recorded so far (does not wait).
    pub fn flush(&mut self) {
        if self.ops.is_empty() {
            return;
        }
        if !self.params.is_empty() {
            self.gpu
                .queue
                .write_buffer(&self.gpu.param_arena, 0, &self.params);
        }
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        let mut i = 0;
        let ops = std::mem::take(&mut self.ops);
        while i < ops.len() {
            if let Op::Copy {
                src,
                src_off,
                dst,
                dst_off,
                size,
            } = &ops[i]
            {
                enc.copy_buffer_to_buffer(src, *src_off, dst, *dst_off, *size);
                i += 1;
                continue;
            }
            let mut pass = enc.begin_compute_pass(&Default::default());
            while i < ops.len() {
                match &ops[i] {
                    Op::Dispatch {
                        pipeline,
                        group,
                        wg,
                    } => {
                        pass.set_pipeline(pipeline);
                        pass.set_bind_group(0, group, &[]);
                        pass.dispatch_workgroups(wg[0], wg[1], wg[2]);
                        i += 1;
                    }
                    Op::Copy { .. } => break,
                }
            }
        }
        self.gpu.queue.submit([enc.finish()]);
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
