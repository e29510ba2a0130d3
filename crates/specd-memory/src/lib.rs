//! Per-sequence memory for hybrid models, built so that speculative decoding can take back
//! rejected tokens cheaply and exactly.
//!
//! * **Attention KV** ([`kv`]): K and V rows by position; removing positions `[p, ∞)` truncates
//!   them (one contiguous buffer per sequence and layer, so no orphan cells can exist).
//! * **Recurrent state** ([`recurrent`]): conv window + delta-rule state per Gated DeltaNet layer,
//!   double-buffered so the state before the last batch stays untouched. Rolling back the last `n`
//!   tokens of a batch ([`recurrent::rollback`]) either re-runs only the recurrence over cached
//!   per-token inputs (`Replay`, default) or copies a per-token snapshot (`Snapshot`) — the model is
//!   never run again.
//! * **Checkpoints** ([`checkpoint`]): copies of the recurrent state at a position, for
//!   checkpoint-and-redecode (the fallback) and prompt reuse. Bounded in bytes.
//!
//! * **Saved state** ([`Memory::save_sequence`] / [`Memory::load_sequence`]): one sequence's
//!   memory as bytes, for the server's slot save and restore.
//!
//! A rollback of a hybrid sequence changes both parts or, if it cannot be done, nothing.

pub mod checkpoint;
pub mod kv;
pub mod recurrent;
mod saved;
mod sequence;

pub use checkpoint::CheckpointId;
pub use kv::KvType;
pub use recurrent::rollback::RollbackKind;
pub use sequence::{GdnLayerIo, Memory};

use specd_ops::delta_net::GdnShape;

/// Sequence identifier (llama.cpp's `llama_seq_id`).
pub type SeqId = u32;

/// Shapes of the state one sequence needs.
#[derive(Debug, Clone, Copy)]
pub struct MemoryLayout {
    /// Number of attention layers.
    pub attn_layers: usize,
    /// Floats per position of K (and of V) in one attention layer: `n_kv × d_head`.
    pub kv_row: usize,
    /// Number of recurrent (Gated DeltaNet) layers.
    pub rec_layers: usize,
    /// Conv kernel size K (the conv state keeps K−1 inputs).
    pub conv_kernel: usize,
    /// Conv channels (`2·key_dim + value_dim`).
    pub conv_channels: usize,
    /// Delta-rule state shape (unused when `rec_layers == 0`).
    pub gdn: GdnShape,
}

impl MemoryLayout {
    /// Bytes of one K+V position across all attention layers, with an `f32` cache.
    pub fn kv_bytes_per_pos(&self) -> usize {
        self.attn_layers * self.kv_row * 2 * 4
    }
    /// Bytes of the recurrent state of one sequence (one buffer).
    pub fn recurrent_state_bytes(&self) -> usize {
        if self.rec_layers == 0 {
            return 0;
        }
        self.rec_layers * ((self.conv_kernel - 1) * self.conv_channels + self.gdn.state_len()) * 4
    }
    /// True if the model has recurrent layers.
    pub fn is_hybrid(&self) -> bool {
        self.rec_layers > 0
    }
}

/// Memory configuration.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    /// Maximum positions per sequence (context size).
    pub n_ctx: usize,
    /// Maximum number of live sequences.
    pub max_seqs: usize,
    /// How recurrent state is rolled back without running the model.
    pub rollback: RollbackKind,
    /// How many of the last tokens of a batch can be rolled back without a checkpoint (the
    /// verification width, draft n_max + 1, is what matters).
    pub rollback_window: usize,
    /// Byte bound for rollback records (cached inputs or snapshots) over all sequences.
    pub rollback_budget: usize,
    /// Byte bound for checkpoints over all sequences; the oldest are evicted beyond it.
    pub checkpoint_budget: usize,
    /// Element type of cached keys.
    pub kv_type_k: KvType,
    /// Element type of cached values.
    pub kv_type_v: KvType,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            n_ctx: 4096,
            max_seqs: 16,
            rollback: RollbackKind::Replay,
            rollback_window: 17,
            rollback_budget: 512 << 20,
            checkpoint_budget: 1 << 30,
            kv_type_k: KvType::F32,
            kv_type_v: KvType::F32,
        }
    }
}

/// What the memory holds right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub sequences: usize,
    /// Positions held in the KV cache, summed over sequences.
    pub kv_cells: usize,
    pub kv_bytes: usize,
    pub recurrent_bytes: usize,
    /// Bytes of rollback records (cached recurrence inputs or per-token snapshots).
    pub rollback_bytes: usize,
    pub checkpoint_bytes: usize,
    pub checkpoints: usize,
}

/// Errors of sequence memory. No error leaves a sequence half-changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MemoryError {
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    #[error("too many sequences (max {0})")]
    TooManySequences(usize),
    #[error("sequence {seq}: position {got} given, next position is {expected}")]
    BadPosition {
        seq: SeqId,
        expected: usize,
        got: usize,
    },
    #[error("sequence {seq}: context full ({needed} positions needed, n_ctx {n_ctx})")]
    ContextFull {
        seq: SeqId,
        needed: usize,
        n_ctx: usize,
    },
    #[error(
        "sequence {seq}: cannot roll back {n} tokens without a checkpoint ({available} available)"
    )]
    RollbackUnavailable {
        seq: SeqId,
        n: usize,
        available: usize,
    },
    #[error("checkpoint {0:?} not found (evicted or dropped)")]
    CheckpointNotFound(CheckpointId),
    #[error("checkpoint {id:?} belongs to sequence {owner}, not {seq}")]
    CheckpointOwner {
        id: CheckpointId,
        owner: SeqId,
        seq: SeqId,
    },
    #[error("sequence {seq}: checkpoint at position {pos} needs KV positions that were removed (have {have})")]
    CheckpointNeedsKv { seq: SeqId, pos: usize, have: usize },
    #[error("sequence {seq}: a batch is already in progress")]
    BatchInProgress { seq: SeqId },
    #[error("saved sequence state: {0}")]
    BadSavedState(String),
}
