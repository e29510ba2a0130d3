//! Model architectures and the batched decode API.
//!
//! * [`config`]: hyper-parameters read from GGUF metadata (qwen35 hybrid, llama, qwen3).
//! * [`weights`]: tensors → kernel-ready weights (borrowed from the memory map when the type has
//!   a native kernel, dequantised otherwise).
//! * [`layers`]: one module per layer kind (gated attention, Gated DeltaNet, FFN, MTP head).
//! * [`model`]: [`Model::decode`] — llama.cpp's `llama_decode` in spirit: rows of
//!   (token, position, sequence, wants-logits) from several sequences → logits for chosen rows.

pub mod batch;
pub mod config;
pub mod layers;
pub mod model;
pub mod vocab;
pub mod weights;

pub use batch::{Batch, BatchRow, DecodeOutput};
pub use config::{Arch, LayerKind, ModelConfig};
pub use model::{Model, ModelOptions};
pub use specd_memory::{KvType, Memory, MemoryConfig, RollbackMode, SeqId};

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
