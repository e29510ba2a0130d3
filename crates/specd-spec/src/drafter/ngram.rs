//! The n-gram drafter family (llama.cpp's `ngram-*` names; our own implementations of the
//! behaviours docs/speculative.md §3 describes). They learn only from tokens of the sequence
//! itself, which are all accepted tokens, so they never need rolling back.

use super::Drafter;
use crate::SpecError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn key_hash(k: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in k {
        h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

/// `ngram-simple`: find the most recent earlier occurrence of the last `n` tokens and propose
/// what followed it.
pub struct NgramSimple {
    pub n: usize,
}

impl Drafter for NgramSimple {
    fn name(&self) -> &'static str {
        "ngram-simple"
    }
    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        let n = self.n;
        if tokens.len() <= n {
            return Ok(Vec::new());
        }
        let key = &tokens[tokens.len() - n..];
        // Scan backwards for the latest earlier match.
        for start in (0..tokens.len() - n).rev() {
            if &tokens[start..start + n] == key {
                let from = start + n;
                let to = (from + n_max).min(tokens.len());
                return Ok(tokens[from..to].to_vec());
            }
        }
        Ok(Vec::new())
    }
}

/// Incremental index of n-gram keys → position right after their latest occurrence.
#[derive(Default)]
struct KeyIndex {
    indexed: usize,
    map: HashMap<u64, usize>,
}

impl KeyIndex {
    fn update(&mut self, tokens: &[u32], n: usize) {
        if tokens.len() < self.indexed {
            // The sequence was replaced (new request in the slot).
            *self = KeyIndex::default();
        }
        // Index keys that end before the last token, so the lookup never matches itself.
        while self.indexed + n < tokens.len() {
            let s = self.indexed;
            self.map.insert(key_hash(&tokens[s..s + n]), s + n);
            self.indexed += 1;
        }
    }
}

/// `ngram-map-k`: hash map from n-token keys to their latest continuation; the draft length
/// adapts: it shrinks to what was accepted last round and grows again after full accepts.
pub struct NgramMapK {
    pub n: usize,
    index: KeyIndex,
    len: usize,
}

impl NgramMapK {
    pub fn new(n: usize) -> Self {
        NgramMapK {
            n,
            index: KeyIndex::default(),
            len: usize::MAX,
        }
    }
}

impl Drafter for NgramMapK {
    fn name(&self) -> &'static str {
        "ngram-map-k"
    }
    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        if tokens.len() <= self.n {
            return Ok(Vec::new());
        }
        self.index.update(tokens, self.n);
        let key = key_hash(&tokens[tokens.len() - self.n..]);
        let Some(&from) = self.index.map.get(&key) else {
            return Ok(Vec::new());
        };
        if tokens[from - self.n..from] != tokens[tokens.len() - self.n..] {
            return Ok(Vec::new()); // hash collision
        }
        let len = n_max.min(self.len.max(1));
        let to = (from + len).min(tokens.len());
        Ok(tokens[from..to].to_vec())
    }
    fn feedback(&mut self, drafted: usize, accepted: usize) {
        self.len = if accepted == drafted {
            (drafted * 2).max(2)
        } else {
            accepted.max(1)
        };
    }
}

/// `ngram-map-k4v`: remembers up to 4 different next tokens per key (with counts) and drafts
/// only while one continuation clearly dominates (at least twice the runner-up).
pub struct NgramMapK4v {
    pub n: usize,
    indexed: usize,
    map: HashMap<u64, Vec<(u32, u32)>>,
}

impl NgramMapK4v {
    pub fn new(n: usize) -> Self {
        NgramMapK4v {
            n,
            indexed: 0,
            map: HashMap::new(),
        }
    }
    fn update(&mut self, tokens: &[u32]) {
        if tokens.len() < self.indexed {
            self.indexed = 0;
            self.map.clear();
        }
        while self.indexed + self.n < tokens.len() {
            let s = self.indexed;
            let next = tokens[s + self.n];
            let e = self
                .map
                .entry(key_hash(&tokens[s..s + self.n]))
                .or_default();
            match e.iter().position(|(t, _)| *t == next) {
                Some(i) => e[i].1 += 1,
                None if e.len() < 4 => e.push((next, 1)),
                None => {
                    // Replace the weakest continuation.
                    if let Some(min) = e.iter_mut().min_by_key(|v| v.1) {
                        *min = (next, 1);
                    }
                }
            }
            self.indexed += 1;
        }
    }
    fn dominant(&self, key: &[u32]) -> Option<u32> {
        let v = self.map.get(&key_hash(key))?;
        let mut best = (0u32, 0u32);
        let mut second = 0u32;
        for &(t, c) in v {
            if c > best.1 {
                second = best.1;
                best = (t, c);
            } else if c > second {
                second = c;
            }
        }
        (best.1 >= 2 * second.max(1) || (second == 0 && best.1 >= 1)).then_some(best.0)
    }
}

impl Drafter for NgramMapK4v {
    fn name(&self) -> &'static str {
        "ngram-map-k4v"
    }
    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        if tokens.len() <= self.n {
            return Ok(Vec::new());
        }
        self.update(tokens);
        let mut ctx: Vec<u32> = tokens[tokens.len() - self.n..].to_vec();
        let mut out = Vec::new();
        while out.len() < n_max {
            let Some(t) = self.dominant(&ctx[ctx.len() - self.n..]) else {
                break;
            };
            out.push(t);
            ctx.push(t);
        }
        Ok(out)
    }
}

/// The fixed-size table behind `ngram-mod`, shared by every sequence of a server.
pub struct ModTable {
    slots: Vec<(u64, u32)>,
    used: usize,
    recent_drafted: u32,
    recent_accepted: u32,
}

impl ModTable {
    /// A table with `size` slots.
    pub fn new(size: usize) -> Arc<Mutex<ModTable>> {
        Arc::new(Mutex::new(ModTable {
            slots: vec![(0, 0); size.max(16)],
            used: 0,
            recent_drafted: 0,
            recent_accepted: 0,
        }))
    }
    fn reset(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = (0, 0));
        self.used = 0;
        self.recent_drafted = 0;
        self.recent_accepted = 0;
    }
    fn insert(&mut self, h: u64, next: u32) {
        let i = (h % self.slots.len() as u64) as usize;
        if self.slots[i].0 == 0 {
            self.used += 1;
        }
        self.slots[i] = (h | 1, next);
        // Full tables predict mostly collisions: start over.
        if self.used * 10 > self.slots.len() * 9 {
            self.reset();
        }
    }
    fn get(&self, h: u64) -> Option<u32> {
        let s = self.slots[(h % self.slots.len() as u64) as usize];
        (s.0 == (h | 1)).then_some(s.1)
    }
}

/// `ngram-mod`: one hash table (n-gram hash → next token) shared across sequences, grown from
/// every accepted token; drafts by chaining lookups; resets itself when it fills up or keeps
/// failing.
pub struct NgramMod {
    pub n: usize,
    table: Arc<Mutex<ModTable>>,
    indexed: usize,
}

impl NgramMod {
    pub fn new(n: usize, table: Arc<Mutex<ModTable>>) -> Self {
        NgramMod {
            n,
            table,
            indexed: 0,
        }
    }
}

impl Drafter for NgramMod {
    fn name(&self) -> &'static str {
        "ngram-mod"
    }
    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        if tokens.len() <= self.n {
            return Ok(Vec::new());
        }
        let Ok(mut t) = self.table.lock() else {
            return Ok(Vec::new());
        };
        if tokens.len() < self.indexed {
            self.indexed = 0;
        }
        while self.indexed + self.n < tokens.len() {
            let s = self.indexed;
            t.insert(key_hash(&tokens[s..s + self.n]), tokens[s + self.n]);
            self.indexed += 1;
        }
        let mut ctx: Vec<u32> = tokens[tokens.len() - self.n..].to_vec();
        let mut out = Vec::new();
        while out.len() < n_max {
            let Some(next) = t.get(key_hash(&ctx[ctx.len() - self.n..])) else {
                break;
            };
            out.push(next);
            ctx.push(next);
        }
        Ok(out)
    }
    fn feedback(&mut self, drafted: usize, accepted: usize) {
        if let Ok(mut t) = self.table.lock() {
            t.recent_drafted += drafted as u32;
            t.recent_accepted += accepted as u32;
            if t.recent_drafted >= 256 {
                // Keeps failing: the table describes text we are no longer writing.
                if t.recent_accepted * 10 < t.recent_drafted {
                    t.reset();
                }
                t.recent_drafted = 0;
                t.recent_accepted = 0;
            }
        }
    }
}

/// Next-token counts per hashed context, one table per context length 1..=4.
pub type NgramTables = [HashMap<u64, HashMap<u32, u32>>; 4];

/// `ngram-cache`: next-token statistics for contexts of 1..=4 tokens from this sequence (and an
/// optional static corpus); drafts from the longest context whose prediction is confident.
pub struct NgramCache {
    indexed: usize,
    tables: NgramTables,
    static_tables: Option<Arc<NgramTables>>,
}

impl NgramCache {
    /// Empty cache (optionally with static statistics built by [`NgramCache::build_static`]).
    pub fn new(static_tables: Option<Arc<NgramTables>>) -> Self {
        NgramCache {
            indexed: 0,
            tables: Default::default(),
            static_tables,
        }
    }
    /// Statistics of a token corpus, to share between sequences.
    pub fn build_static(tokens: &[u32]) -> Arc<NgramTables> {
        let mut c = NgramCache::new(None);
        c.update(tokens, tokens.len() + 1);
        Arc::new(c.tables)
    }
    fn update(&mut self, tokens: &[u32], upto: usize) {
        if tokens.len() < self.indexed {
            self.indexed = 0;
            self.tables = Default::default();
        }
        while self.indexed + 1 < upto.min(tokens.len() + 1) && self.indexed < tokens.len() - 1 {
            let next_pos = self.indexed + 1;
            for n in 1..=4 {
                if next_pos >= n {
                    let k = key_hash(&tokens[next_pos - n..next_pos]);
                    *self.tables[n - 1]
                        .entry(k)
                        .or_default()
                        .entry(tokens[next_pos])
                        .or_default() += 1;
                }
            }
            self.indexed += 1;
        }
    }
    fn predict(&self, ctx: &[u32]) -> Option<u32> {
        for n in (1..=4).rev() {
            if ctx.len() < n {
                continue;
            }
            let k = key_hash(&ctx[ctx.len() - n..]);
            let mut counts: HashMap<u32, u32> = HashMap::new();
            for t in std::iter::once(&self.tables).chain(self.static_tables.as_deref()) {
                if let Some(m) = t[n - 1].get(&k) {
                    for (tok, c) in m {
                        *counts.entry(*tok).or_default() += c;
                    }
                }
            }
            let total: u32 = counts.values().sum();
            if let Some((&tok, &c)) = counts.iter().max_by_key(|(t, c)| (**c, u32::MAX - **t)) {
                // Longer contexts need less evidence.
                let need = if n >= 3 { 1 } else { 2 };
                if c >= need && c * 2 > total {
                    return Some(tok);
                }
            }
        }
        None
    }
}

impl Drafter for NgramCache {
    fn name(&self) -> &'static str {
        "ngram-cache"
    }
    fn draft(&mut self, tokens: &[u32], n_max: usize) -> Result<Vec<u32>, SpecError> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        self.update(tokens, tokens.len());
        let mut ctx: Vec<u32> = tokens[tokens.len().saturating_sub(4)..].to_vec();
        let mut out = Vec::new();
        while out.len() < n_max {
            let Some(t) = self.predict(&ctx) else { break };
            out.push(t);
            ctx.push(t);
            if ctx.len() > 4 {
                ctx.remove(0);
            }
        }
        Ok(out)
    }
}
