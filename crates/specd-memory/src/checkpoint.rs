//! Checkpoints of recurrent state, bounded in bytes: the oldest are evicted when a new one would
//! exceed the budget. A checkpoint holds only the recurrent part and the position; attention KV
//! below that position is append-only and stays in the cache, so copying it would only waste
//! memory (restoring checks it is still there).

use crate::SeqId;
use std::collections::BTreeMap;

/// Handle to a stored checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckpointId(pub u64);

/// Recurrent state of one sequence at a position.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub seq: SeqId,
    /// Tokens `0..pos` had been processed.
    pub pos: usize,
    /// Per recurrent layer: conv state then delta-rule state.
    pub layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl Checkpoint {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(c, s)| (c.len() + s.len()) * 4)
            .sum()
    }
}

/// All checkpoints, in creation order.
#[derive(Debug, Default)]
pub struct CheckpointStore {
    next: u64,
    items: BTreeMap<CheckpointId, Checkpoint>,
    bytes: usize,
    /// Checkpoints evicted so far (reported in statistics).
    pub evicted: u64,
}

impl CheckpointStore {
    /// Stores `cp`, evicting the oldest checkpoints until it fits in `budget`. Returns `None` if
    /// it cannot fit even alone.
    pub fn insert(&mut self, cp: Checkpoint, budget: usize) -> Option<CheckpointId> {
        let b = cp.bytes();
        if b > budget {
            return None;
        }
        while self.bytes + b > budget {
            let Some((&id, _)) = self.items.iter().next() else {
                break;
            };
            self.remove(id);
            self.evicted += 1;
        }
        let id = CheckpointId(self.next);
        self.next += 1;
        self.bytes += b;
        self.items.insert(id, cp);
        Some(id)
    }
    /// Looks a checkpoint up.
    pub fn get(&self, id: CheckpointId) -> Option<&Checkpoint> {
        self.items.get(&id)
    }
    /// Drops one checkpoint.
    pub fn remove(&mut self, id: CheckpointId) -> Option<Checkpoint> {
        let cp = self.items.remove(&id)?;
        self.bytes -= cp.bytes();
        Some(cp)
    }
    /// Drops every checkpoint of `seq`.
    pub fn remove_seq(&mut self, seq: SeqId) {
        let ids: Vec<_> = self
            .items
            .iter()
            .filter(|(_, c)| c.seq == seq)
            .map(|(i, _)| *i)
            .collect();
        for id in ids {
            self.remove(id);
        }
    }
    /// Drops checkpoints of `seq` past position `pos` (they describe removed tokens).
    pub fn remove_after(&mut self, seq: SeqId, pos: usize) {
        let ids: Vec<_> = self
            .items
            .iter()
            .filter(|(_, c)| c.seq == seq && c.pos > pos)
            .map(|(i, _)| *i)
            .collect();
        for id in ids {
            self.remove(id);
        }
    }
    /// Checkpoints of `seq` as (id, position), oldest first.
    pub fn of_seq(&self, seq: SeqId) -> Vec<(CheckpointId, usize)> {
        self.items
            .iter()
            .filter(|(_, c)| c.seq == seq)
            .map(|(i, c)| (*i, c.pos))
            .collect()
    }
    /// Bytes held by all checkpoints.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// Number of checkpoints.
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}
