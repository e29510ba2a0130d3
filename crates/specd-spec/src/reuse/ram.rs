//! The prompt cache in RAM: saved sequence memories (KV, recurrent state and its prompt-end
//! checkpoints, as [`specd_backend::SequenceMemory::save_sequence`] writes them) of conversations whose
//! slot was taken by another, bounded in bytes, least recently used evicted first. An entry
//! moves back into whichever sequence serves its conversation's next request.

use super::{common_prefix, Points};

/// One saved memory.
#[derive(Debug)]
pub(super) struct Saved {
    pub scope: u64,
    pub tokens: Vec<u32>,
    pub bytes: Vec<u8>,
    /// Where the memory, once loaded, can be taken back to.
    pub points: Points,
}

/// Counters of the RAM cache (server metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RamCacheStats {
    /// Byte limit (0: the cache is off).
    pub limit: usize,
    pub entries: usize,
    /// Bytes of the saved memories held.
    pub bytes: usize,
    /// Requests whose prompt prefix was restored from the cache.
    pub hits: u64,
    /// Requests (prompt reuse allowed) that found no reusable prefix anywhere.
    pub misses: u64,
    /// Memories saved into the cache.
    pub saves: u64,
    /// Entries dropped to stay within the limit.
    pub evictions: u64,
}

#[derive(Debug, Default)]
pub(super) struct RamCache {
    /// Oldest use first.
    entries: Vec<Saved>,
    stats: RamCacheStats,
}

impl RamCache {
    pub fn set_limit(&mut self, bytes: usize) {
        self.stats.limit = bytes;
        self.evict_to(bytes);
    }

    pub fn enabled(&self) -> bool {
        self.stats.limit > 0
    }

    pub fn stats(&self) -> RamCacheStats {
        RamCacheStats {
            entries: self.entries.len(),
            ..self.stats
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.stats.bytes = 0;
    }

    pub fn hit(&mut self) {
        self.stats.hits += 1;
    }

    pub fn miss(&mut self) {
        self.stats.misses += 1;
    }

    /// The entry of `scope` that serves most of `prompt` and how much (ties: the most recently
    /// used), if any serves some.
    pub fn best(&self, scope: u64, prompt: &[u32]) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            if e.scope != scope {
                continue;
            }
            let n = e.points.usable(common_prefix(&e.tokens, prompt));
            if n > 0 && best.is_none_or(|(_, b)| n >= b) {
                best = Some((i, n));
            }
        }
        best
    }

    /// Removes entry `i` (from [`RamCache::best`]) to load it.
    pub fn take(&mut self, i: usize) -> Saved {
        let e = self.entries.remove(i);
        self.stats.bytes -= e.bytes.len();
        e
    }

    /// Adds a memory as the most recently used entry, replacing one of the same scope and
    /// tokens, evicting the least recently used ones past the limit. A memory larger than the
    /// whole limit is not kept; returns whether it was.
    pub fn insert(&mut self, e: Saved) -> bool {
        let limit = self.stats.limit;
        if e.bytes.len() > limit {
            return false;
        }
        if let Some(i) = self
            .entries
            .iter()
            .position(|x| x.scope == e.scope && x.tokens == e.tokens)
        {
            self.take(i);
        }
        self.evict_to(limit - e.bytes.len());
        self.stats.bytes += e.bytes.len();
        self.stats.saves += 1;
        self.entries.push(e);
        true
    }

    /// Drops least recently used entries until at most `bytes` are held.
    fn evict_to(&mut self, bytes: usize) {
        while self.stats.bytes > bytes && !self.entries.is_empty() {
            self.take(0);
            self.stats.evictions += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(scope: u64, tokens: &[u32], size: usize) -> Saved {
        Saved {
            scope,
            tokens: tokens.to_vec(),
            bytes: vec![0; size],
            points: Points {
                n_past: tokens.len(),
                cut_floor: 0,
                checkpoints: Vec::new(),
            },
        }
    }

    #[test]
    fn evicts_least_recently_used_within_the_byte_limit() {
        let mut c = RamCache::default();
        c.set_limit(100);
        c.insert(saved(0, &[1, 2, 3], 40));
        c.insert(saved(0, &[4, 5, 6], 40));
        c.insert(saved(0, &[7, 8, 9], 40)); // evicts [1,2,3]
        let s = c.stats();
        assert_eq!((s.entries, s.bytes, s.evictions, s.saves), (2, 80, 1, 3));
        assert!(c.best(0, &[1, 2, 3, 4]).is_none());
        assert_eq!(c.best(0, &[4, 5, 6, 0]), Some((0, 3)));
        c.insert(saved(0, &[9], 101)); // larger than the limit: not kept
        assert_eq!(c.stats().entries, 2);
    }

    #[test]
    fn scopes_never_see_each_other() {
        let mut c = RamCache::default();
        c.set_limit(1000);
        c.insert(saved(1, &[1, 2, 3, 4], 10));
        assert!(c.best(2, &[1, 2, 3, 4, 5]).is_none());
        assert_eq!(c.best(1, &[1, 2, 3, 4, 5]), Some((0, 4)));
        // Same scope and tokens: replaced, not duplicated.
        c.insert(saved(1, &[1, 2, 3, 4], 10));
        assert_eq!(c.stats().entries, 1);
        let e = c.take(0);
        assert_eq!(e.tokens, vec![1, 2, 3, 4]);
        assert_eq!(c.stats().bytes, 0);
    }

    #[test]
    fn off_keeps_nothing() {
        let mut c = RamCache::default();
        c.insert(saved(0, &[1], 1));
        assert_eq!(c.stats().entries, 0);
        assert!(!c.enabled());
    }
}
