//! The sequence-memory operations the engine, the drafters and the prompt reuse use: positions,
//! truncation, rollback within the window, checkpoints, save / load of one sequence, usage. Each
//! backend keeps its sequences' state where its layers run; the bookkeeping every backend shares
//! (configuration, byte budgets, checkpoint ids, the save format's errors) is `specd-memory`'s.

use specd_memory::{CheckpointId, MemoryConfig, MemoryError, MemoryUsage, SeqId};

/// One context's sequences. A failed operation leaves the sequence as it was.
pub trait SequenceMemory {
    /// The configuration the memory was made with.
    fn config(&self) -> &MemoryConfig;
    /// True if the model has recurrent layers (rollback then needs records or checkpoints).
    fn is_hybrid(&self) -> bool;
    /// Positions held for `seq` (0 for an unknown sequence).
    fn n_past(&self, seq: SeqId) -> usize;
    /// The live sequences.
    fn sequences(&self) -> Vec<SeqId>;
    /// How many of the last tokens of `seq` [`SequenceMemory::rollback`] can take back.
    fn rollback_capacity(&self, seq: SeqId) -> usize;
    /// Takes back the last `n` tokens of `seq`, within the rollback window, without running the
    /// model again.
    fn rollback(&mut self, seq: SeqId, n: usize) -> Result<(), MemoryError>;
    /// Removes positions `p0..` of `seq` (attention only; a hybrid sequence can only be cut
    /// where it can be rolled back to).
    fn remove_from(&mut self, seq: SeqId, p0: usize) -> Result<(), MemoryError>;
    /// Forgets `seq` and its checkpoints.
    fn clear(&mut self, seq: SeqId);
    /// Saves the recurrent state of `seq` at its current position (`None` for a model without
    /// recurrent layers, which needs none).
    fn checkpoint(&mut self, seq: SeqId) -> Result<Option<CheckpointId>, MemoryError>;
    /// Takes `seq` back to checkpoint `id`.
    fn restore(&mut self, seq: SeqId, id: CheckpointId) -> Result<(), MemoryError>;
    /// Drops a checkpoint (no-op if it is gone).
    fn drop_checkpoint(&mut self, id: CheckpointId);
    /// The checkpoints of `seq` and their positions, oldest first.
    fn checkpoints_of(&self, seq: SeqId) -> Vec<(CheckpointId, usize)>;
    /// `seq`'s memory as bytes (the slot file format; `SeqId::MAX`: an empty sequence).
    fn save_sequence(&self, seq: SeqId) -> Result<Vec<u8>, MemoryError>;
    /// Replaces `seq`'s memory by saved bytes; returns the positions loaded.
    fn load_sequence(&mut self, seq: SeqId, bytes: &[u8]) -> Result<usize, MemoryError>;
    /// What the memory holds now.
    fn usage(&self) -> MemoryUsage;
}
