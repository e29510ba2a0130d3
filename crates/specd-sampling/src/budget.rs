//! The reasoning budget (llama-server's `--reasoning-budget`, a request's
//! `reasoning_budget_tokens` / `thinking_budget_tokens`): once a thinking block has run for its
//! budget of tokens, the sampler forces the closing sequence (an optional message, then the
//! end tag) token by token, and the model answers from there.
//!
//! The state is a function of the accepted tokens only, kept as one entry per accepted token,
//! so rejected speculative tokens are undone exactly with the rest of the sampler's history
//! and a speculative generation forces at the very positions a plain one does.

/// Where a generation stands with its thinking block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Outside a thinking block (before it opens, or after it closed): nothing is forced.
    Idle,
    /// Inside one, with this many tokens of budget left.
    Counting(usize),
    /// The budget is spent: the next token is `forced[i]`.
    Forcing(usize),
}

/// The budget of one generation.
#[derive(Debug, Clone)]
pub struct ReasoningBudget {
    start: Vec<u32>,
    ends: Vec<Vec<u32>>,
    forced: Vec<u32>,
    budget: usize,
    /// Phase after each accepted token (the first entry: before any).
    phases: Vec<Phase>,
    /// The accepted tokens, for matching the tags.
    tokens: Vec<u32>,
}

impl ReasoningBudget {
    /// A budget of `budget` tokens for blocks opened by `start` and closed by any of `ends`;
    /// `forced` (an optional message's tokens, then the first end tag's) closes a block whose
    /// budget ran out. Returns `None` when the tags are empty (a model without thinking).
    pub fn new(
        start: Vec<u32>,
        ends: Vec<Vec<u32>>,
        forced: Vec<u32>,
        budget: usize,
    ) -> Option<Self> {
        let ends: Vec<Vec<u32>> = ends.into_iter().filter(|e| !e.is_empty()).collect();
        if start.is_empty() || ends.is_empty() || forced.is_empty() {
            return None;
        }
        Some(ReasoningBudget {
            start,
            ends,
            forced,
            budget,
            phases: vec![Phase::Idle],
            tokens: Vec::new(),
        })
    }

    /// Feeds tokens that precede the generation (the end of the prompt, where a template may
    /// have opened the thinking block) as if accepted, and forgets them as history: they are
    /// never undone.
    pub fn prime(&mut self, prompt_tail: &[u32]) {
        for &t in prompt_tail {
            self.accept(t);
        }
        let last = self.phase();
        self.phases = vec![last];
    }

    fn phase(&self) -> Phase {
        self.phases.last().copied().unwrap_or(Phase::Idle)
    }

    /// The token the budget forces next, if it forces one.
    pub fn forced(&self) -> Option<u32> {
        match self.phase() {
            Phase::Forcing(i) => self.forced.get(i).copied(),
            _ => None,
        }
    }

    /// The rest of the closing sequence while forcing (the forced token first).
    pub fn forced_rest(&self) -> Option<&[u32]> {
        match self.phase() {
            Phase::Forcing(i) => self.forced.get(i..),
            _ => None,
        }
    }

    /// Advances past an accepted token.
    pub fn accept(&mut self, token: u32) {
        self.tokens.push(token);
        let ends_with = |seq: &[u32]| self.tokens.ends_with(seq);
        let next = match self.phase() {
            Phase::Idle if ends_with(&self.start) => self.open(),
            Phase::Idle => Phase::Idle,
            // An end tag closes the block, also one the budget ran out in the middle of (a tag
            // of several tokens is counted token by token).
            Phase::Counting(_) | Phase::Forcing(_) if self.ends.iter().any(|e| ends_with(e)) => {
                Phase::Idle
            }
            Phase::Counting(left) if left <= 1 => Phase::Forcing(0),
            Phase::Counting(left) => Phase::Counting(left - 1),
            // Only the forced token moves the forcing on: a token of the prompt's end seen
            // while priming (the blank after an opening tag) leaves the whole sequence to force.
            Phase::Forcing(i) if self.forced.get(i) != Some(&token) => Phase::Forcing(i),
            Phase::Forcing(i) if i + 1 >= self.forced.len() => Phase::Idle,
            Phase::Forcing(i) => Phase::Forcing(i + 1),
        };
        self.phases.push(next);
    }

    /// The phase a newly opened block starts in (a budget of 0 closes it at once).
    fn open(&self) -> Phase {
        if self.budget == 0 {
            Phase::Forcing(0)
        } else {
            Phase::Counting(self.budget)
        }
    }

    /// Undoes the last `n` accepted tokens.
    pub fn rollback(&mut self, n: usize) {
        let n = n.min(self.phases.len() - 1);
        self.phases.truncate(self.phases.len() - n);
        self.tokens.truncate(self.tokens.len().saturating_sub(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: u32 = 1;
    const CLOSE: u32 = 2;

    fn budget(n: usize) -> ReasoningBudget {
        ReasoningBudget::new(vec![OPEN], vec![vec![CLOSE]], vec![9, CLOSE], n).expect("tags")
    }

    /// Runs a "model" that always wants `want`, taking forced tokens when the budget forces.
    fn run(b: &mut ReasoningBudget, want: u32, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| {
                let t = b.forced().unwrap_or(want);
                b.accept(t);
                t
            })
            .collect()
    }

    #[test]
    fn forces_the_closing_sequence_after_the_budget() {
        let mut b = budget(3);
        b.prime(&[5, OPEN]);
        assert_eq!(run(&mut b, 7, 7), vec![7, 7, 7, 9, CLOSE, 7, 7]);
    }

    #[test]
    fn a_block_closed_in_time_is_left_alone_and_a_new_one_gets_a_new_budget() {
        let mut b = budget(3);
        b.prime(&[OPEN]);
        for t in [7, CLOSE, 7, 7, 7, 7, OPEN] {
            assert_eq!(b.forced(), None);
            b.accept(t);
        }
        assert_eq!(run(&mut b, 7, 5), vec![7, 7, 7, 9, CLOSE]);
    }

    #[test]
    fn budget_zero_closes_at_once_and_no_block_means_nothing_forced() {
        let mut b = budget(0);
        b.prime(&[OPEN, 8]);
        assert_eq!(run(&mut b, 7, 3), vec![9, CLOSE, 7]);
        let mut b = budget(0);
        assert_eq!(run(&mut b, 7, 3), vec![7, 7, 7]);
    }

    #[test]
    fn rollback_then_the_same_tokens_gives_the_same_forcing() {
        let mut b = budget(2);
        b.prime(&[OPEN]);
        b.accept(7);
        let before = b.clone();
        b.accept(7);
        b.accept(9);
        b.rollback(2);
        assert_eq!(b.forced(), before.forced());
        assert_eq!(run(&mut b, 7, 3), run(&mut before.clone(), 7, 3));
        // Never past the priming.
        b.rollback(100);
        assert_eq!(run(&mut b, 7, 4), vec![7, 7, 9, CLOSE]);
    }

    #[test]
    fn an_end_tag_the_budget_runs_out_in_still_closes_the_block() {
        // A prompt whose thinking block is opened and closed (thinking off), with a budget
        // that runs out inside the multi-token end tag: nothing is forced after it.
        let mut b =
            ReasoningBudget::new(vec![3, 4], vec![vec![5, 6, 8]], vec![5, 6, 8], 2).expect("tags");
        b.prime(&[3, 4, 5, 6, 8, 7]);
        assert_eq!(b.forced(), None);
        assert_eq!(run(&mut b, 7, 3), vec![7, 7, 7]);
    }

    #[test]
    fn multi_token_tags() {
        let mut b =
            ReasoningBudget::new(vec![3, 4], vec![vec![5, 6]], vec![5, 6], 2).expect("tags");
        b.prime(&[3, 4]);
        assert_eq!(run(&mut b, 7, 5), vec![7, 7, 5, 6, 7]);
        assert!(ReasoningBudget::new(vec![], vec![vec![5]], vec![5], 1).is_none());
    }
}
