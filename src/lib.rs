//! sparsa: DeepSeek Sparse Attention models (GLM-5 family, DeepSeek-V3.2) on any wgpu adapter.
pub mod error;
pub mod gpu;

pub use error::{Error, Result};
pub mod config;
pub mod kernels;
pub mod weights;
