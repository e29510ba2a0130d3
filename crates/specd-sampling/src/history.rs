//! Token history with an incrementally maintained penalty window.

use std::collections::HashMap;

/// Every token seen so far (prompt, then accepted tokens) plus the occurrence
/// count of each token inside the penalty window (the newest `window` tokens).
///
/// Counts are what the penalties read, so two windows holding the same
/// multiset of tokens penalise identically whatever the order. They are
/// updated in O(1) per accepted or rolled-back token, which keeps the cost
/// independent of the window size (it may be the whole history).
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    tokens: Vec<u32>,
    /// `None` = unbounded window (`repeat_last_n == -1`).
    window: Option<usize>,
    /// Disabled when no penalty can apply: the counts are then never read.
    track: bool,
    counts: HashMap<u32, u32>,
}

impl History {
    pub(crate) fn new(window: Option<usize>, track: bool) -> Self {
        Self {
            tokens: Vec::new(),
            window,
            track: track && window != Some(0),
            counts: HashMap::new(),
        }
    }

    pub(crate) fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Occurrences per token in the current window (empty when untracked).
    pub(crate) fn counts(&self) -> &HashMap<u32, u32> {
        &self.counts
    }

    fn inc(&mut self, t: u32) {
        *self.counts.entry(t).or_insert(0) += 1;
    }

    fn dec(&mut self, t: u32) {
        if let Some(c) = self.counts.get_mut(&t) {
            *c -= 1;
            if *c == 0 {
                // Removing zeros keeps the map size bounded by the window and
                // avoids penalising absent tokens with a zero count.
                self.counts.remove(&t);
            }
        }
    }

    pub(crate) fn push(&mut self, t: u32) {
        self.tokens.push(t);
        if !self.track {
            return;
        }
        self.inc(t);
        if let Some(n) = self.window {
            let len = self.tokens.len();
            if len > n {
                // The token that just slid out of the window.
                self.dec(self.tokens[len - 1 - n]);
            }
        }
    }

    pub(crate) fn truncate(&mut self, len: usize) {
        while self.tokens.len() > len {
            let Some(t) = self.tokens.pop() else { break };
            if !self.track {
                continue;
            }
            self.dec(t);
            if let Some(n) = self.window {
                let l = self.tokens.len();
                if l >= n {
                    // The token that slides back into the window.
                    self.inc(self.tokens[l - n]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn recount(tokens: &[u32], window: Option<usize>) -> HashMap<u32, u32> {
        let start = window.map_or(0, |n| tokens.len().saturating_sub(n));
        let mut m = HashMap::new();
        for &t in &tokens[start..] {
            *m.entry(t).or_insert(0) += 1;
        }
        m
    }

    #[test]
    fn window_slides_and_rolls_back() {
        let mut h = History::new(Some(3), true);
        for t in [1, 2, 1, 3, 3] {
            h.push(t);
        }
        // Window = [1, 3, 3].
        assert_eq!(h.counts(), &HashMap::from([(1, 1), (3, 2)]));
        h.truncate(3);
        // Window = [1, 2, 1] again.
        assert_eq!(h.counts(), &HashMap::from([(1, 2), (2, 1)]));
        h.truncate(10); // growing is a no-op
        assert_eq!(h.tokens(), &[1, 2, 1]);
    }

    #[test]
    fn untracked_history_keeps_tokens_only() {
        let mut h = History::new(Some(0), true);
        h.push(4);
        h.push(4);
        assert!(h.counts().is_empty());
        assert_eq!(h.tokens(), &[4, 4]);
        h.truncate(0);
        assert!(h.tokens().is_empty());
    }

    proptest! {
        #[test]
        fn counts_match_a_recount(
            ops in prop::collection::vec((0u32..6, 0usize..4, any::<bool>()), 0..200),
            window in prop::option::of(1usize..8),
        ) {
            let mut h = History::new(window, true);
            for (tok, back, is_push) in ops {
                if is_push {
                    h.push(tok);
                } else {
                    h.truncate(h.tokens().len().saturating_sub(back));
                }
                prop_assert_eq!(h.counts(), &recount(h.tokens(), window));
            }
        }
    }
}
