//! What a dispatch binds: the uniform arena whose 256-byte slots hold the `Params` at
//! binding 0 ([`ParamArena`]), and the cache of bind groups that recorders asking for it
//! reuse ([`BindGroupCache`], see [`Recorder::cache_bind_groups`](crate::gpu::Recorder::cache_bind_groups)).

use crate::gpu::{lock, Gpu};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Size of the uniform arena that holds the `Params` of the dispatches of one submission.
pub(in crate::gpu) const PARAM_ARENA: u64 = 1 << 20;

/// The uniform buffer of [`PARAM_ARENA`] bytes, and the lock a recorder holds while it
/// owns it.
pub(in crate::gpu) struct ParamArena {
    pub(in crate::gpu) buffer: wgpu::Buffer,
    pub(in crate::gpu) lock: Mutex<()>,
}

impl ParamArena {
    pub(in crate::gpu) fn new(buffer: wgpu::Buffer) -> ParamArena {
        ParamArena {
            buffer,
            lock: Mutex::new(()),
        }
    }
}

/// A dispatch's bindings: pipeline (by address), params offset and size, buffers.
pub(in crate::gpu) type BindKey = (usize, u64, u64, Vec<wgpu::Buffer>);
/// Cached bind groups beyond which the cache starts over: room for a full-depth model's
/// decode step (~1,700 dispatches at 78 layers) and its speculative rounds' few-row chunks
/// (forward.rs caches chunks of up to 8 rows).
const BIND_CACHE_MAX: usize = 1 << 15;

/// Bind groups of recorders that asked for caching (see
/// [`Recorder::cache_bind_groups`](crate::gpu::Recorder::cache_bind_groups)).
#[derive(Default)]
pub(in crate::gpu) struct BindGroupCache {
    groups: Mutex<HashMap<BindKey, wgpu::BindGroup>>,
}

impl BindGroupCache {
    /// The key of a dispatch of `pipeline` with the params at `offset` (`size` bytes) and
    /// `buffers`.
    pub(in crate::gpu) fn key(
        pipeline: &Arc<wgpu::ComputePipeline>,
        offset: u64,
        size: u64,
        buffers: &[&wgpu::Buffer],
    ) -> BindKey {
        (
            Arc::as_ptr(pipeline) as usize,
            offset,
            size,
            buffers.iter().map(|b| (*b).clone()).collect::<Vec<_>>(),
        )
    }

    /// The cached bind group of `key`, if any.
    pub(in crate::gpu) fn get(&self, key: &BindKey) -> Option<wgpu::BindGroup> {
        lock(&self.groups).get(key).cloned()
    }

    /// Cache `group` under `key` (starting over once [`BIND_CACHE_MAX`] groups are cached).
    pub(in crate::gpu) fn insert(&self, key: BindKey, group: wgpu::BindGroup) {
        let mut m = lock(&self.groups);
        if m.len() >= BIND_CACHE_MAX {
            m.clear();
        }
        m.insert(key, group);
    }
}

impl Gpu {
    /// Drop the cached bind groups (and with them their hold on buffers).
    pub fn clear_bind_groups(&self) {
        lock(&self.bind_groups.groups).clear();
    }
}
