//! The seam between the speculative engine and the hardware (docs/architecture.md).
//!
//! The engine, the drafters and the prompt reuse (`specd-spec`) see a model only through these
//! interfaces, at the level of llama.cpp's context and memory — not of a tensor library: batch
//! invariance, which exact speculation rests on, is a property each backend owns.
//!
//! * [`Backend`]: a loaded model — its [`ModelInfo`], tokenizer and device — making contexts.
//! * [`Context`]: sequences' memory ([`SequenceMemory`]) and [`Context::decode`] of a [`Batch`]
//!   of rows of several sequences into an [`Output`]; [`MtpContext`]: the MTP head.
//! * [`Output`]: logits read per row, the top token answered by the backend, hidden states as
//!   opaque [`HiddenRows`].
//!
//! Calls are made per step, so `dyn` dispatch costs nothing measurable. Adding a backend means
//! implementing [`Backend`], [`Context`], [`Output`] and [`MtpContext`], and adding it to the
//! conformance suite (`crates/specd-conformance`).

pub mod backend;
pub mod batch;
pub mod context;
pub mod error;
pub mod memory;
pub mod output;

pub use backend::{Backend, DeviceInfo, ModelInfo};
pub use batch::{Batch, BatchRow};
pub use context::{Context, Decoded, MtpContext};
pub use error::BackendError;
pub use memory::SequenceMemory;
pub use output::{argmax_prob, HiddenRows, Output};
pub use specd_memory::{
    CheckpointId, KvType, MemoryConfig, MemoryError, MemoryUsage, RollbackKind, SeqId,
};
