//! Taking the rejected tokens of a verification batch back out of the target's memory.
//!
//! Attention KV is truncated; recurrent state uses the memory's fast rollback (replayed
//! recurrence or snapshot) and falls back to checkpoint-and-redecode — restore the state saved
//! before verification and decode the accepted tokens again through the whole model — only when
//! the fast path cannot cover the draft or checkpoint mode was chosen.

use crate::stats::SpecStats;
use crate::SpecError;
use specd_backend::{Batch, CheckpointId, Context, SeqId};

/// How the rejected rows were taken out (for the controller's cost model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolledBack {
    /// Nothing was rejected.
    Nothing,
    /// Fast path: nothing decoded again.
    Fast,
    /// Checkpoint restored and the kept rows decoded again.
    Redecode,
}

/// After verifying `fed` tokens (starting at position `start`) of which the first `keep` are
/// accepted, removes the rest. `checkpoint` is the state at `start` if one was taken.
pub fn rollback_rejected(
    ctx: &mut dyn Context,
    seq: SeqId,
    start: usize,
    fed: &[u32],
    keep: usize,
    checkpoint: Option<CheckpointId>,
    stats: &mut SpecStats,
) -> Result<RolledBack, SpecError> {
    let reject = fed.len() - keep;
    let mut done = RolledBack::Nothing;
    if reject > 0 {
        let fast = checkpoint.is_none() && ctx.rollback(seq, reject).is_ok();
        if fast {
            stats.rollbacks_fast += 1;
            done = RolledBack::Fast;
        } else {
            let Some(id) = checkpoint else {
                // No checkpoint and no fast path: only possible if the fast path was expected
                // to cover the draft; report it rather than corrupting state.
                return Err(SpecError::Invalid(format!(
                    "sequence {seq}: cannot roll back {reject} tokens (no checkpoint)"
                )));
            };
            ctx.restore(seq, id)?;
            if keep > 0 {
                let b = Batch::from_tokens(&fed[..keep], start as u32, seq, false);
                let mut b = b;
                for r in &mut b.rows {
                    r.logits = false;
                }
                ctx.decode_new(&b)?;
            }
            stats.rollbacks_checkpoint += 1;
            stats.redecoded_tokens += keep as u64;
            done = RolledBack::Redecode;
        }
    }
    if let Some(id) = checkpoint {
        ctx.drop_checkpoint(id);
    }
    Ok(done)
}
