//! Prompt reuse: what a finished sequence leaves in memory for the next request on its id (a
//! server slot), and the prompt cache in RAM ([`RamCache`]) that keeps the memory of
//! conversations whose slot another request took. Design: `docs/prompt-cache.md`.
//!
//! A request reuses the longest prefix of its prompt that some kept memory can serve *exactly*:
//! attention KV can be cut at any position, but a hybrid model's recurrent state only at its
//! last position, within the last batch's rollback record, or at a prompt-end checkpoint. Every
//! kept memory belongs to a cache scope (the API key and `cache_salt` of the request that made
//! it): a request never reuses, and so can never observe, memory of another scope.

mod ram;

pub use ram::RamCacheStats;
use ram::{RamCache, Saved};
use specd_backend::{MemoryError, SeqId, SequenceMemory};
use std::collections::BTreeMap;

/// Memory a finished sequence kept: the tokens it holds and the scope that may reuse them.
#[derive(Debug, Clone)]
struct Kept {
    scope: u64,
    tokens: Vec<u32>,
}

/// Where a memory of `n_past` positions can be taken back to without processing anything:
/// any position from `cut_floor` on, and each checkpoint position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Points {
    n_past: usize,
    cut_floor: usize,
    checkpoints: Vec<usize>,
}

impl Points {
    /// How many leading tokens of a prompt that shares `common` tokens with the memory can be
    /// served from it.
    fn usable(&self, common: usize) -> usize {
        if common == 0 {
            0
        } else if common >= self.cut_floor && common <= self.n_past {
            common
        } else {
            self.checkpoints
                .iter()
                .copied()
                .filter(|&p| p > 0 && p <= common)
                .max()
                .unwrap_or(0)
        }
    }
}

/// Tokens of `prompt` a memory holding `tokens` shares with it, leaving at least the prompt's
/// last token to be processed (its logits start the generation).
fn common_prefix(tokens: &[u32], prompt: &[u32]) -> usize {
    tokens
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len().saturating_sub(1))
}

/// Prompt reuse state of an engine: kept memories per sequence and the RAM cache.
#[derive(Debug, Default)]
pub(crate) struct PromptReuse {
    /// Finished sequences keep their memory.
    keep: bool,
    /// Most prompt-end checkpoints kept per sequence (hybrid models).
    max_checkpoints: usize,
    kept: BTreeMap<SeqId, Kept>,
    ram: RamCache,
}

impl PromptReuse {
    pub fn configure(&mut self, mem: &mut dyn SequenceMemory, keep: bool, max_checkpoints: usize) {
        self.keep = keep;
        self.max_checkpoints = max_checkpoints;
        if !keep {
            self.clear(mem);
        }
    }

    pub fn set_ram_limit(&mut self, bytes: usize) {
        self.ram.set_limit(bytes);
    }

    pub fn ram_stats(&self) -> RamCacheStats {
        self.ram.stats()
    }

    /// Frees every kept memory and the RAM cache.
    pub fn clear(&mut self, mem: &mut dyn SequenceMemory) {
        for seq in std::mem::take(&mut self.kept).into_keys() {
            mem.clear(seq);
        }
        self.ram.clear();
    }

    pub fn tokens(&self, seq: SeqId) -> Option<&[u32]> {
        self.kept.get(&seq).map(|k| k.tokens.as_slice())
    }

    /// Where `seq`'s kept memory can be taken back to now.
    fn points(mem: &dyn SequenceMemory, seq: SeqId) -> Points {
        let n_past = mem.n_past(seq);
        Points {
            n_past,
            cut_floor: n_past - mem.rollback_capacity(seq).min(n_past),
            checkpoints: mem
                .checkpoints_of(seq)
                .into_iter()
                .map(|(_, p)| p)
                .collect(),
        }
    }

    /// Prompt tokens a request of `scope` on `seq` would take from `seq`'s own kept memory
    /// (not counting the RAM cache, whose entries any sequence can load).
    pub fn reusable(
        &self,
        mem: &dyn SequenceMemory,
        seq: SeqId,
        scope: u64,
        prompt: &[u32],
    ) -> usize {
        match self.kept.get(&seq) {
            Some(k) if self.keep && k.scope == scope => {
                Self::points(mem, seq).usable(common_prefix(&k.tokens, prompt))
            }
            _ => 0,
        }
    }

    /// Prepares `seq`'s memory for a new prompt and returns how many of its leading tokens are
    /// already in memory. The best of `seq`'s own kept memory and the RAM cache's entries of
    /// `scope` is used (`reuse` false: neither). Memory a different conversation leaves behind
    /// is saved to the RAM cache first.
    pub fn take(
        &mut self,
        mem: &mut dyn SequenceMemory,
        seq: SeqId,
        scope: u64,
        prompt: &[u32],
        reuse: bool,
    ) -> usize {
        let kept = self.kept.remove(&seq);
        if !self.keep {
            mem.clear(seq);
            return 0;
        }
        let common = match &kept {
            Some(k) if reuse && k.scope == scope => common_prefix(&k.tokens, prompt),
            _ => 0,
        };
        let own = Self::points(mem, seq).usable(common);
        // Taken out of the cache before anything is saved into it (which may evict).
        let from_ram = match self.ram.best(scope, prompt) {
            Some((i, n)) if reuse && n > own => Some(self.ram.take(i)),
            _ => None,
        };
        if let Some(k) = kept {
            // Keep what this sequence held unless the new prompt continues it: a different
            // conversation (less than half of it reusable) would destroy it.
            if from_ram.is_some() || own * 2 < mem.n_past(seq) {
                self.stash(mem, seq, k);
            }
        }
        if let Some(entry) = from_ram {
            return match mem.load_sequence(seq, &entry.bytes) {
                Ok(n) if n == entry.tokens.len() => {
                    self.ram.hit();
                    Self::settle(mem, seq, common_prefix(&entry.tokens, prompt))
                }
                _ => {
                    mem.clear(seq);
                    0
                }
            };
        }
        if own == 0 {
            if reuse {
                self.ram.miss();
            }
            mem.clear(seq);
            return 0;
        }
        Self::settle(mem, seq, common)
    }

    /// Takes `seq`'s memory back to the most of its first `common` positions it can serve
    /// exactly; returns that count (0: memory cleared).
    fn settle(mem: &mut dyn SequenceMemory, seq: SeqId, common: usize) -> usize {
        let n_past = mem.n_past(seq);
        if common > 0 && common == n_past {
            return common;
        }
        // Cut memory back to the common prefix where it can be cut exactly.
        if common > 0 && common < n_past && mem.remove_from(seq, common).is_ok() {
            return common;
        }
        // Recurrent state cannot be truncated: restore the latest prompt-end checkpoint that
        // lies within the common prefix.
        let best = mem
            .checkpoints_of(seq)
            .into_iter()
            .filter(|&(_, pos)| pos > 0 && pos <= common)
            .max_by_key(|&(_, pos)| pos);
        if let Some((id, pos)) = best {
            if mem.restore(seq, id).is_ok() {
                return pos;
            }
        }
        mem.clear(seq);
        0
    }

    /// Saves `seq`'s memory (holding `kept`) into the RAM cache, if it is on and the memory
    /// fits it; returns whether it did. The sequence's memory itself is left as it is.
    fn stash(&mut self, mem: &dyn SequenceMemory, seq: SeqId, kept: Kept) -> bool {
        if !self.ram.enabled() || kept.tokens.is_empty() {
            return false;
        }
        let hybrid = mem.is_hybrid();
        let mut points = Self::points(mem, seq);
        // A loaded memory has no rollback record: a hybrid one can only be cut at checkpoints.
        points.cut_floor = if hybrid { points.n_past } else { 0 };
        match mem.save_sequence(seq) {
            Ok(bytes) => self.ram.insert(Saved {
                scope: kept.scope,
                tokens: kept.tokens,
                bytes,
                points,
            }),
            Err(_) => false,
        }
    }

    /// An idle sequence's kept memory goes into the RAM cache and leaves the sequence
    /// (llama-server's `--cache-idle-slots`; the server calls it when a request starts on
    /// another sequence). Returns whether it saved.
    pub fn cache_idle(&mut self, mem: &mut dyn SequenceMemory, seq: SeqId) -> bool {
        let saved = match self.kept.remove(&seq) {
            Some(k) if self.keep => self.stash(mem, seq, k),
            _ => false,
        };
        mem.clear(seq);
        saved
    }

    /// Whether prompt checkpoints are taken: reuse on, a hybrid model, `--ctx-checkpoints` > 0.
    pub fn checkpoints_on(&self, mem: &dyn SequenceMemory) -> bool {
        self.keep && self.max_checkpoints > 0 && mem.is_hybrid()
    }

    /// With reuse on a hybrid model: checkpoints `seq`'s recurrent state where its prompt has
    /// been processed to (the prompt's end, or a mark the request named: a message boundary),
    /// so a later prompt that shares that much but not what follows can restart there. Keeps
    /// the newest `max_checkpoints` per sequence.
    pub fn checkpoint_prompt(&mut self, mem: &mut dyn SequenceMemory, seq: SeqId) {
        if !self.checkpoints_on(mem) {
            return;
        }
        let pos = mem.n_past(seq);
        let mut have = mem.checkpoints_of(seq);
        if pos == 0 || have.iter().any(|&(_, p)| p == pos) {
            return;
        }
        // A full checkpoint budget only evicts older checkpoints, never fails the sequence.
        if let Ok(Some(cp)) = mem.checkpoint(seq) {
            have.push((cp, pos));
        }
        while have.len() > self.max_checkpoints {
            let (old, _) = have.remove(0);
            mem.drop_checkpoint(old);
        }
    }

    /// A finished sequence's memory: freed, or kept (holding `tokens`' prefix) for reuse by
    /// requests of `scope`.
    pub fn retire(&mut self, mem: &mut dyn SequenceMemory, seq: SeqId, scope: u64, tokens: &[u32]) {
        if !self.keep {
            mem.clear(seq);
            return;
        }
        // Accepted drafts past a stop can be in memory but not in `tokens`: cut them off.
        let n_past = mem.n_past(seq);
        let keep = n_past.min(tokens.len());
        if n_past > keep && mem.remove_from(seq, keep).is_err() {
            mem.clear(seq);
            return;
        }
        self.kept.insert(
            seq,
            Kept {
                scope,
                tokens: tokens[..keep].to_vec(),
            },
        );
    }

    /// Slot save: the tokens `seq` kept for `scope` (none if it kept them for another) and its
    /// memory as bytes.
    pub fn save(
        &self,
        mem: &dyn SequenceMemory,
        seq: SeqId,
        scope: u64,
    ) -> Result<(Vec<u32>, Vec<u8>), MemoryError> {
        match self.kept.get(&seq) {
            Some(k) if k.scope == scope => Ok((k.tokens.clone(), mem.save_sequence(seq)?)),
            // No sequence has the id `SeqId::MAX`: it saves as an empty memory.
            _ => Ok((Vec::new(), mem.save_sequence(SeqId::MAX)?)),
        }
    }

    /// Slot restore: `seq` holds `tokens` with the saved memory `state`, reusable by `scope`.
    pub fn restore(
        &mut self,
        mem: &mut dyn SequenceMemory,
        seq: SeqId,
        scope: u64,
        tokens: Vec<u32>,
        state: &[u8],
    ) -> Result<(), String> {
        if !self.keep {
            return Err("prompt reuse is off: a restored memory would not be kept".into());
        }
        self.forget(mem, seq);
        let n = mem.load_sequence(seq, state).map_err(|e| e.to_string())?;
        if n != tokens.len() {
            mem.clear(seq);
            return Err(format!(
                "the saved memory holds {n} positions for {} saved tokens",
                tokens.len()
            ));
        }
        self.kept.insert(seq, Kept { scope, tokens });
        Ok(())
    }

    /// Frees the memory `seq` kept.
    pub fn forget(&mut self, mem: &mut dyn SequenceMemory, seq: SeqId) {
        self.kept.remove(&seq);
        mem.clear(seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(n_past: usize, cut_floor: usize, checkpoints: &[usize]) -> Points {
        Points {
            n_past,
            cut_floor,
            checkpoints: checkpoints.to_vec(),
        }
    }

    #[test]
    fn usable_prefix_follows_what_memory_can_serve() {
        // Attention only: any cut.
        assert_eq!(pts(10, 0, &[]).usable(4), 4);
        assert_eq!(pts(10, 0, &[]).usable(10), 10);
        // Hybrid with a rollback record of 3: cuts from 7 on, else checkpoints.
        assert_eq!(pts(10, 7, &[3, 6]).usable(8), 8);
        assert_eq!(pts(10, 7, &[3, 6]).usable(6), 6);
        assert_eq!(pts(10, 7, &[3, 6]).usable(5), 3);
        assert_eq!(pts(10, 7, &[3, 6]).usable(2), 0);
        // A loaded hybrid memory: its end or a checkpoint.
        assert_eq!(pts(10, 10, &[4]).usable(10), 10);
        assert_eq!(pts(10, 10, &[4]).usable(9), 4);
        assert_eq!(pts(10, 10, &[]).usable(0), 0);
    }

    #[test]
    fn the_last_prompt_token_is_always_processed() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3, 4]), 2);
        assert_eq!(common_prefix(&[], &[7]), 0);
    }
}
