//! What the device keeps and hands out again, one pool per job: compiled pipelines
//! ([`pipelines`]), the param arena and cached bind groups ([`bind_groups`]), and buffers,
//! named scratch buffers among them ([`buffers`]).

pub(super) mod bind_groups;
pub(super) mod buffers;
pub(super) mod pipelines;

pub(super) use bind_groups::{BindGroupCache, ParamArena, PARAM_ARENA};
pub(super) use buffers::ScratchPool;
pub(super) use pipelines::PipelineCache;
