//! sparsa: DeepSeek Sparse Attention models (GLM-5 family, DeepSeek-V3.2) on any wgpu adapter.
//!
//! - [`config`]: `config.json` of `glm_moe_dsa` / `deepseek_v32`.
//! - [`weights`]: memory-mapped safetensors and their upload to the GPU.
//! - [`gpu`]: device, pipeline cache, command recorder.
//! - [`kernels`]: one WGSL kernel family per module, each with its CPU-reference tests.
//! - [`model`]: weights on the GPU and the forward pass.
//! - [`cache`]: latent MLA and indexer-key caches.
//! - [`experts`]: `--gpu-memory` budgets and the routed-expert cache (offloading).
//! - [`generate`]: sampling and the generation loop.
//! - [`quantize`]: conversion to sparsa's q8 / q4 formats.
//! - [`bench`]: `sparsa bench` (speed against the adapter's measured limits).
//! - [`synth`]: random-weight model directories with a release's real shapes and config.
//! - [`chat`]: the model's chat template rendered as transformers renders it.
#[cfg(not(target_arch = "wasm32"))]
pub mod bench;
pub mod cache;
pub mod chat;
pub mod config;
pub mod error;
pub mod experts;
pub mod fault;
pub mod fuzzing;
pub mod generate;
pub mod gpu;
pub mod kernels;
pub mod model;
#[cfg(not(target_arch = "wasm32"))]
pub mod quantize;
pub mod sampling;
#[cfg(not(target_arch = "wasm32"))]
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
