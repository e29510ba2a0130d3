//! The CPU backend: model architectures, their batched forward pass on the CPU kernels, and
//! the seam's interfaces over them ([`backend`]).
//!
//! * [`config`]: the hyper-parameters every architecture shares, read from GGUF metadata.
//! * [`arch`]: one module per architecture (qwen35, qwen35moe, llama, qwen3): its own
//!   hyper-parameters and trunk; the registry of `general.architecture` names.
//! * [`weights`]: tensors → kernel-ready weights (borrowed from the memory map when the type has
//!   a native kernel, dequantised otherwise).
//! * [`layers`]: one module per layer kind (gated attention, Gated DeltaNet, dense and MoE FFN,
//!   MTP head) and the residual block they form.
//! * [`model`]: [`Model::decode`] — llama.cpp's `llama_decode` in spirit: rows of
//!   (token, position, sequence, wants-logits) from several sequences → logits for chosen rows.

pub mod arch;
pub mod backend;
pub mod config;
pub mod iq3s_q4k;
pub mod layers;
pub mod model;
pub mod output;
pub mod vocab;
pub mod weights;

pub use backend::{CpuBackend, CpuContext};
pub use config::{Arch, LayerKind, ModelConfig};
pub use model::{Model, ModelOptions};
pub use output::{DecodeOutput, HostHidden};
pub use specd_backend::{Batch, BatchRow};
pub use specd_memory::{KvType, Memory, MemoryConfig, RollbackKind, SeqId};

/// Errors while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] specd_gguf::GgufError),
    #[error(transparent)]
    Memory(#[from] specd_memory::MemoryError),
    #[error(transparent)]
    Ops(#[from] specd_ops::OpsError),
    #[error(transparent)]
    Tokenizer(#[from] specd_tokenizer::TokenizerError),
    #[error("architecture '{0}' is not supported yet")]
    UnsupportedArch(String),
    #[error("architecture '{0}' is unknown to specd")]
    UnknownArch(String),
    #[error("invalid model: {0}")]
    Invalid(String),
    #[error("invalid batch: {0}")]
    BadBatch(String),
}
