//! sparsa: DeepSeek Sparse Attention models (GLM-5 family, DeepSeek-V3.2) on any wgpu adapter.
//!
//! The modules are floors; each uses only the floors below it (`tests/layers.rs` checks it,
//! the README's "Architecture" section draws the map):
//!
//! - [`error`], [`fault`], [`knobs`]: errors; fault injection for the robustness tests; the
//!   measurement knobs (environment variables read once where they are used).
//! - [`gpu`]: the device, pipeline / bind-group / buffer pools, readback, the command
//!   recorder; [`sampling`]: the host's token sampler; [`tokenizer`].
//! - [`weights`]: memory-mapped safetensors, quantized formats, upload to the GPU.
//! - [`config`]: `config.json` of `glm_moe_dsa` / `deepseek_v32`.
//! - [`kernels`]: one WGSL kernel family per module, each with its CPU-reference tests;
//!   [`cache`]: latent MLA and indexer-key caches; [`experts`]: the routed-expert cache that
//!   streams experts under `--gpu-memory`.
//! - [`model`]: loading (and the `--gpu-memory` plan) and the forward pass.
//! - [`generate`]: the generation loop and stop strings; [`quantize`]: conversion to
//!   sparsa's q8 / q4 formats.
//! - [`chat`]: the model's chat template rendered as transformers renders it, and
//!   conversations; [`synth`]: random-weight model directories with a release's shapes.
//! - [`mod@bench`]: `sparsa bench` (speed against the adapter's measured limits); [`fuzzing`];
//!   `serve`: the OpenAI-compatible HTTP server of `sparsa serve` (the `serve` feature).
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
pub mod knobs;
pub mod model;
#[cfg(not(target_arch = "wasm32"))]
pub mod quantize;
pub mod sampling;
#[cfg(all(feature = "serve", not(target_arch = "wasm32")))]
pub mod serve;
#[cfg(not(target_arch = "wasm32"))]
pub mod synth;
#[cfg(test)]
pub(crate) mod testutil;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};
