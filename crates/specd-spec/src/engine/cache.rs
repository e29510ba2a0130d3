//! The prompt cache as the server sees it, in one place: prompt reuse on a sequence id (a
//! server slot), the RAM cache, slot save / restore. The work is [`crate::reuse`]'s; these are
//! the engine's doors to it, each refusing to touch a running sequence.

use super::Engine;
use crate::reuse::RamCacheStats;
use crate::SpecError;
use specd_backend::SeqId;

impl Engine {
    /// Prompt reuse across requests on the same sequence id (server slots). With `keep` on, a
    /// finished sequence keeps its memory, and [`Engine::add`] on that id processes only the part
    /// of the new prompt that kept memory does not already cover (see [`crate::reuse`]): the
    /// common prefix is kept when memory can be cut there (attention KV truncation, or the last
    /// batch's recurrent rollback record), otherwise a hybrid model's recurrent state is
    /// restored from the checkpoint taken at the end of an earlier prompt (at most
    /// `max_checkpoints` per sequence, within the memory's checkpoint byte budget); failing
    /// both, the prompt is processed from the start. Off (the default): finished sequences free
    /// their memory. Turning it off frees all kept memory and the RAM cache.
    pub fn set_prompt_cache(&mut self, keep: bool, max_checkpoints: usize) {
        self.reuse.configure(&mut *self.ctx, keep, max_checkpoints);
    }

    /// The prompt cache in RAM: with prompt reuse on, the memory of a conversation whose
    /// sequence another request takes is saved (up to `bytes` in all, least recently used
    /// dropped first) and restored into whichever sequence serves its next request. 0: off.
    pub fn set_ram_cache(&mut self, bytes: usize) {
        self.reuse.set_ram_limit(bytes);
    }

    /// Counters of the RAM cache.
    pub fn ram_cache_stats(&self) -> RamCacheStats {
        self.reuse.ram_stats()
    }

    /// Frees every finished sequence's kept memory and the RAM cache.
    pub fn clear_prompt_cache(&mut self) {
        self.reuse.clear(&mut *self.ctx);
    }

    /// Prompt tokens a running sequence took from kept memory instead of processing them.
    pub fn n_cached(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.n_cached)
    }

    /// Tokens a finished sequence left in its kept memory (prompt reuse), if any.
    pub fn cached_tokens(&self, seq: SeqId) -> Option<&[u32]> {
        self.reuse.tokens(seq)
    }

    /// Leading tokens of `prompt` a request of cache scope `scope` would take from what the
    /// idle sequence `seq` kept (0 for a running one): what the server's slot choice compares.
    pub fn reusable_prefix(&self, seq: SeqId, scope: u64, prompt: &[u32]) -> usize {
        if self.seqs.contains_key(&seq) {
            return 0;
        }
        self.reuse.reusable(&*self.ctx, seq, scope, prompt)
    }

    /// Slot save: the tokens an idle sequence kept for prompt reuse by `scope` and its memory
    /// as bytes ([`specd_backend::SequenceMemory::save_sequence`]: KV, recurrent state, prompt
    /// checkpoints). Memory kept for another scope saves as empty.
    pub fn save_kept(&self, seq: SeqId, scope: u64) -> Result<(Vec<u32>, Vec<u8>), SpecError> {
        if self.seqs.contains_key(&seq) {
            return Err(SpecError::Invalid(format!("sequence {seq} is running")));
        }
        Ok(self.reuse.save(&*self.ctx, seq, scope)?)
    }

    /// Slot restore: makes an idle sequence hold `tokens` with the memory saved by
    /// [`Engine::save_kept`], so the next request of `scope` on it reuses them like its own
    /// earlier prompt. On error the sequence's kept memory is freed (as a failed restore leaves
    /// it in llama-server).
    pub fn restore_kept(
        &mut self,
        seq: SeqId,
        scope: u64,
        tokens: Vec<u32>,
        state: &[u8],
    ) -> Result<(), SpecError> {
        if self.seqs.contains_key(&seq) {
            return Err(SpecError::Invalid(format!("sequence {seq} is running")));
        }
        let n_vocab = self.backend.info().n_vocab;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            self.forget(seq);
            return Err(SpecError::Invalid(format!(
                "saved token {t} out of vocabulary ({n_vocab})"
            )));
        }
        self.reuse
            .restore(&mut *self.ctx, seq, scope, tokens, state)
            .map_err(SpecError::Invalid)
    }

    /// llama-server's `--cache-idle-slots` for one idle sequence: its kept memory is saved into
    /// the RAM cache and freed, so that its conversation continues from the cache in whichever
    /// sequence serves it next. No effect on a running sequence. Returns whether it saved.
    pub fn cache_idle(&mut self, seq: SeqId) -> bool {
        if self.seqs.contains_key(&seq) {
            return false;
        }
        self.reuse.cache_idle(&mut *self.ctx, seq)
    }

    /// Frees the memory a finished sequence kept (no effect on a running sequence).
    pub fn forget(&mut self, seq: SeqId) {
        if self.seqs.contains_key(&seq) {
            return;
        }
        self.reuse.forget(&mut *self.ctx, seq);
    }
}
