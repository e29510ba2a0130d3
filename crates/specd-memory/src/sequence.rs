//! [`Memory`]: all sequences' KV and recurrent state, the batch protocol the model follows, and
//! the rollback / checkpoint entry points.

use crate::checkpoint::{Checkpoint, CheckpointId, CheckpointStore};
use crate::kv::KvLayer;
use crate::recurrent::rollback::{BatchRecord, LayerRecord, RollbackKind};
pub use crate::recurrent::GdnLayerIo;
use crate::recurrent::RecLayer;
use crate::{MemoryConfig, MemoryError, MemoryLayout, MemoryUsage, SeqId};
use std::collections::BTreeMap;

#[derive(Debug)]
pub(crate) struct Sequence {
    /// Positions `0..n_past` are processed.
    pub(crate) n_past: usize,
    pub(crate) kv: Vec<KvLayer>,
    pub(crate) rec: Vec<RecLayer>,
    pub(crate) record: Option<BatchRecord>,
    /// Tokens of the batch in progress, if any.
    pub(crate) in_batch: Option<usize>,
}

/// Memory of every sequence of one model.
#[derive(Debug)]
pub struct Memory {
    layout: MemoryLayout,
    cfg: MemoryConfig,
    seqs: BTreeMap<SeqId, Sequence>,
    checkpoints: CheckpointStore,
}

impl Memory {
    /// Empty memory for a model of the given layout.
    pub fn new(layout: MemoryLayout, cfg: MemoryConfig) -> Self {
        Memory {
            layout,
            cfg,
            seqs: BTreeMap::new(),
            checkpoints: CheckpointStore::default(),
        }
    }

    /// The layout.
    pub fn layout(&self) -> &MemoryLayout {
        &self.layout
    }
    /// The configuration.
    pub fn config(&self) -> &MemoryConfig {
        &self.cfg
    }
    /// Changes the rollback mode (takes effect at the next batch).
    pub fn set_rollback_mode(&mut self, mode: RollbackKind) {
        self.cfg.rollback = mode;
    }

    /// Next position of `seq` (0 for an unknown sequence).
    pub fn n_past(&self, seq: SeqId) -> usize {
        self.seqs.get(&seq).map_or(0, |s| s.n_past)
    }

    /// Live sequence ids.
    pub fn sequences(&self) -> Vec<SeqId> {
        self.seqs.keys().copied().collect()
    }

    /// How many of the last tokens of `seq` can be removed right now without a checkpoint.
    pub fn rollback_capacity(&self, seq: SeqId) -> usize {
        match self.seqs.get(&seq) {
            None => 0,
            Some(s) if !self.layout.is_hybrid() => s.n_past,
            Some(s) => s.record.as_ref().map_or(0, |r| r.n),
        }
    }

    /// Starts a batch of `n` tokens at positions `pos..pos+n` for `seq` (creating the sequence
    /// at position 0). Must be followed by the model's layer calls and [`Memory::end_batch`].
    pub fn begin_batch(&mut self, seq: SeqId, pos: usize, n: usize) -> Result<(), MemoryError> {
        if !self.seqs.contains_key(&seq) {
            if self.seqs.len() >= self.cfg.max_seqs {
                return Err(MemoryError::TooManySequences(self.cfg.max_seqs));
            }
            if pos != 0 {
                return Err(MemoryError::BadPosition {
                    seq,
                    expected: 0,
                    got: pos,
                });
            }
        }
        let lay = self.layout;
        let (kv_k, kv_v) = (self.cfg.kv_type_k, self.cfg.kv_type_v);
        let other_bytes: usize = self
            .seqs
            .iter()
            .filter(|(id, _)| **id != seq)
            .filter_map(|(_, s)| s.record.as_ref().map(|r| r.bytes()))
            .sum();
        let s = self.seqs.entry(seq).or_insert_with(|| Sequence {
            n_past: 0,
            kv: vec![KvLayer::new(kv_k, kv_v); lay.attn_layers],
            rec: (0..lay.rec_layers).map(|_| RecLayer::new(&lay)).collect(),
            record: None,
            in_batch: None,
        });
        if s.in_batch.is_some() {
            return Err(MemoryError::BatchInProgress { seq });
        }
        if pos != s.n_past {
            return Err(MemoryError::BadPosition {
                seq,
                expected: s.n_past,
                got: pos,
            });
        }
        if s.n_past + n > self.cfg.n_ctx {
            return Err(MemoryError::ContextFull {
                seq,
                needed: s.n_past + n,
                n_ctx: self.cfg.n_ctx,
            });
        }
        s.record = None;
        if lay.is_hybrid() {
            for l in &mut s.rec {
                l.flip();
            }
            let mode = self.cfg.rollback;
            let win = n.min(self.cfg.rollback_window);
            let split = n - win;
            let mut need = win * lay.rec_layers * mode.bytes_per_token_layer(&lay);
            if split > 0 {
                need += lay.recurrent_state_bytes();
            }
            if mode != RollbackKind::Checkpoint
                && win > 0
                && other_bytes + need <= self.cfg.rollback_budget
            {
                s.record = Some(BatchRecord {
                    n: win,
                    split,
                    layers: (0..lay.rec_layers)
                        .map(|_| LayerRecord::default())
                        .collect(),
                });
            }
        }
        s.in_batch = Some(n);
        Ok(())
    }

    /// Appends K and V rows (`n × kv_row` each) of attention layer `layer` during a batch.
    pub fn kv_append(
        &mut self,
        seq: SeqId,
        layer: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), MemoryError> {
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(MemoryError::UnknownSequence(seq))?;
        s.kv[layer].append(k, v);
        Ok(())
    }

    /// K and V of attention layer `layer` of `seq` (all positions, including the batch's).
    pub fn kv(&self, seq: SeqId, layer: usize) -> Result<&KvLayer, MemoryError> {
        let s = self
            .seqs
            .get(&seq)
            .ok_or(MemoryError::UnknownSequence(seq))?;
        Ok(&s.kv[layer])
    }

    /// Recurrent layer `layer` of `seq` for the batch in progress.
    pub fn gdn_layer(&mut self, seq: SeqId, layer: usize) -> Result<GdnLayerIo<'_>, MemoryError> {
        let mode = self.cfg.rollback;
        let layout = self.layout;
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(MemoryError::UnknownSequence(seq))?;
        let split = s.record.as_ref().map_or(0, |r| r.split);
        let record = s.record.as_mut().map(|r| &mut r.layers[layer]);
        Ok(GdnLayerIo {
            layer: &mut s.rec[layer],
            record,
            split,
            layout,
            mode,
        })
    }

    /// Completes the batch in progress for `seq`.
    pub fn end_batch(&mut self, seq: SeqId) -> Result<(), MemoryError> {
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(MemoryError::UnknownSequence(seq))?;
        let n = s.in_batch.take().ok_or(MemoryError::UnknownSequence(seq))?;
        s.n_past += n;
        Ok(())
    }

    /// Undoes a batch that failed part-way: KV rows appended so far are removed and the
    /// recurrent state returns to its pre-batch buffer.
    pub fn abort_batch(&mut self, seq: SeqId) {
        let kv_row = self.layout.kv_row;
        if let Some(s) = self.seqs.get_mut(&seq) {
            if s.in_batch.take().is_some() {
                for l in &mut s.kv {
                    l.truncate(s.n_past, kv_row);
                }
                for l in &mut s.rec {
                    l.flip();
                }
                s.record = None;
                if s.n_past == 0 {
                    self.seqs.remove(&seq);
                }
            }
        }
    }

    /// Removes the last `n` tokens of `seq` — KV and recurrent state together, or nothing
    /// (error) if the recurrent part cannot be rolled back that far without a checkpoint.
    pub fn rollback(&mut self, seq: SeqId, n: usize) -> Result<(), MemoryError> {
        let lay = self.layout;
        let mode = self.cfg.rollback;
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(MemoryError::UnknownSequence(seq))?;
        if s.in_batch.is_some() {
            return Err(MemoryError::BatchInProgress { seq });
        }
        if n == 0 {
            return Ok(());
        }
        if n > s.n_past {
            return Err(MemoryError::RollbackUnavailable {
                seq,
                n,
                available: s.n_past,
            });
        }
        if lay.is_hybrid() {
            let avail = s.record.as_ref().map_or(0, |r| r.n);
            if n > avail {
                return Err(MemoryError::RollbackUnavailable {
                    seq,
                    n,
                    available: avail,
                });
            }
            let Some(rec) = s.record.as_mut() else {
                return Err(MemoryError::RollbackUnavailable {
                    seq,
                    n,
                    available: 0,
                });
            };
            let keep = rec.n - n;
            for (l, r) in s.rec.iter_mut().zip(rec.layers.iter_mut()) {
                r.rollback(l, keep, mode, &lay);
            }
            rec.n = keep;
            if keep == 0 {
                s.record = None;
            }
        }
        s.n_past -= n;
        for l in &mut s.kv {
            l.truncate(s.n_past, lay.kv_row);
        }
        self.checkpoints.remove_after(seq, s.n_past);
        Ok(())
    }

    /// llama.cpp-style `seq_rm(seq, p0, -1)`: keeps positions `< p0`.
    pub fn remove_from(&mut self, seq: SeqId, p0: usize) -> Result<(), MemoryError> {
        let n_past = self.n_past(seq);
        if p0 >= n_past {
            return Ok(());
        }
        self.rollback(seq, n_past - p0)
    }

    /// Forgets `seq` entirely (its KV, state and checkpoints are freed).
    pub fn clear(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.checkpoints.remove_seq(seq);
    }

    /// Forgets every sequence.
    pub fn clear_all(&mut self) {
        self.seqs.clear();
        self.checkpoints = CheckpointStore::default();
    }

    /// Stores a checkpoint of `seq`'s recurrent state at its current position. Returns `None`
    /// if the checkpoint budget cannot hold even this one. Attention-only models need none: they
    /// roll back by truncation (returns `None` too).
    pub fn checkpoint(&mut self, seq: SeqId) -> Result<Option<CheckpointId>, MemoryError> {
        if !self.layout.is_hybrid() {
            return Ok(None);
        }
        let Some(s) = self.seqs.get(&seq) else {
            // Nothing decoded yet (a one-token prompt): the checkpoint is the zero state at 0.
            let fresh = RecLayer::new(&self.layout);
            let (c, st) = fresh.current();
            let layers = (0..self.layout.rec_layers)
                .map(|_| (c.to_vec(), st.to_vec()))
                .collect();
            let cp = Checkpoint {
                seq,
                pos: 0,
                layers,
            };
            return Ok(self.checkpoints.insert(cp, self.cfg.checkpoint_budget));
        };
        if s.in_batch.is_some() {
            return Err(MemoryError::BatchInProgress { seq });
        }
        let layers = s
            .rec
            .iter()
            .map(|l| {
                let (c, st) = l.current();
                (c.to_vec(), st.to_vec())
            })
            .collect();
        let cp = Checkpoint {
            seq,
            pos: s.n_past,
            layers,
        };
        Ok(self.checkpoints.insert(cp, self.cfg.checkpoint_budget))
    }

    /// Restores `seq` to checkpoint `id`: recurrent state copied back, KV positions at and after
    /// the checkpoint removed. Fails without changing anything if the checkpoint is gone or the
    /// KV it relies on was removed.
    pub fn restore(&mut self, seq: SeqId, id: CheckpointId) -> Result<(), MemoryError> {
        let cp = self
            .checkpoints
            .get(id)
            .ok_or(MemoryError::CheckpointNotFound(id))?;
        if cp.seq != seq {
            return Err(MemoryError::CheckpointOwner {
                id,
                owner: cp.seq,
                seq,
            });
        }
        let kv_row = self.layout.kv_row;
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(MemoryError::UnknownSequence(seq))?;
        if s.in_batch.is_some() {
            return Err(MemoryError::BatchInProgress { seq });
        }
        if s.n_past < cp.pos {
            return Err(MemoryError::CheckpointNeedsKv {
                seq,
                pos: cp.pos,
                have: s.n_past,
            });
        }
        for (l, (c, st)) in s.rec.iter_mut().zip(&cp.layers) {
            l.set_current(c, st);
        }
        s.n_past = cp.pos;
        s.record = None;
        for l in &mut s.kv {
            l.truncate(cp.pos, kv_row);
        }
        let pos = cp.pos;
        self.checkpoints.remove_after(seq, pos);
        Ok(())
    }

    /// Drops a checkpoint.
    pub fn drop_checkpoint(&mut self, id: CheckpointId) {
        self.checkpoints.remove(id);
    }

    /// Checkpoints of `seq` as (id, position), oldest first.
    pub fn checkpoints_of(&self, seq: SeqId) -> Vec<(CheckpointId, usize)> {
        self.checkpoints.of_seq(seq)
    }

    /// Current (conv, delta-rule) state of recurrent layer `layer` of `seq` (for inspection and
    /// tests).
    pub fn recurrent_state(&self, seq: SeqId, layer: usize) -> Option<(&[f32], &[f32])> {
        self.seqs
            .get(&seq)
            .and_then(|s| s.rec.get(layer))
            .map(|l| l.current())
    }

    pub(crate) fn seq(&self, seq: SeqId) -> Option<&Sequence> {
        self.seqs.get(&seq)
    }
    pub(crate) fn has_seq(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }
    pub(crate) fn n_seqs(&self) -> usize {
        self.seqs.len()
    }
    /// Installs a whole sequence (a loaded saved state); the caller cleared `seq` first.
    pub(crate) fn put_seq(&mut self, seq: SeqId, s: Sequence) {
        self.seqs.insert(seq, s);
    }
    pub(crate) fn checkpoint_ref(&self, id: CheckpointId) -> Option<&Checkpoint> {
        self.checkpoints.get(id)
    }
    /// Stores a checkpoint within the budget (a full budget evicts the oldest; one that cannot
    /// fit at all is dropped: checkpoints only save work).
    pub(crate) fn insert_checkpoint(&mut self, cp: Checkpoint) {
        let _ = self.checkpoints.insert(cp, self.cfg.checkpoint_budget);
    }

    /// What is held right now.
    pub fn usage(&self) -> MemoryUsage {
        let mut u = MemoryUsage {
            sequences: self.seqs.len(),
            checkpoint_bytes: self.checkpoints.bytes(),
            checkpoints: self.checkpoints.len(),
            ..Default::default()
        };
        for s in self.seqs.values() {
            u.kv_cells += s.n_past;
            u.kv_bytes += s.kv.iter().map(|l| l.bytes()).sum::<usize>();
            u.recurrent_bytes += s.rec.iter().map(|l| l.bytes()).sum::<usize>();
            u.rollback_bytes += s.record.as_ref().map_or(0, |r| r.bytes());
        }
        u
    }
}
