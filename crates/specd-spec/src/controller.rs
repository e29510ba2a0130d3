//! The "never slower" controller (speculative.md §5).
//!
//! Per sequence it keeps an estimate of the probability that draft position i is accepted given
//! that all before it were (an exponential moving average), and it shares with all sequences a
//! measured cost of verification batches of each width. Each round it picks the draft length n
//! (zero included) that maximises expected tokens per second:
//!
//! ```text
//! E[tokens | n] = 1 + Σ_{i=1..n} Π_{j≤i} a_j        time(n) = c(n+1) + n·draft_cost
//! ```
//!
//! It starts pessimistic, because a request that ends before the estimates settle must not have
//! paid for optimism: every position's prior is [`PRIOR`] (so the first round drafts one or two
//! tokens) and unmeasured batch widths are assumed to cost [`UNMEASURED_SLOPE`] of a step per
//! extra row. Until a position has [`WARMUP`] observations its estimate is the running mean
//! (prior counted as [`PRIOR_WEIGHT`] observations), so a few rounds of evidence move it at once;
//! after that it is an exponential moving average that follows changes in the text.
//!
//! When it picks zero while a cheap drafter has a draft ready, the draft is kept "in the
//! shadow": the plain step's token tells whether its first position would have been accepted,
//! so acceptance keeps being measured at no cost and speculation resumes when it pays again.

/// Measured cost of verification batches by width (rows), shared by every sequence.
#[derive(Debug, Clone)]
pub struct CostModel {
    /// EMA of seconds per decode call of width w (index w), if measured.
    secs: Vec<Option<f64>>,
    /// Seconds per drafted token for drafters that run a model.
    pub draft_secs_per_token: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            secs: vec![None; 66],
            draft_secs_per_token: 0.0,
        }
    }
}

impl CostModel {
    /// Records that a decode of `width` rows took `secs`.
    pub fn observe(&mut self, width: usize, secs: f64) {
        if width >= self.secs.len() || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let s = &mut self.secs[width];
        *s = Some(match *s {
            None => secs,
            Some(old) => 0.8 * old + 0.2 * secs,
        });
    }
    /// Estimated seconds for a batch of `width` rows. Unmeasured widths are interpolated between
    /// measured ones; beyond the widest measured one a conservative slope (each extra row costs
    /// [`UNMEASURED_SLOPE`] of a single row) is assumed until it is measured.
    pub fn cost(&self, width: usize) -> f64 {
        let w = width.min(self.secs.len() - 1);
        if let Some(s) = self.secs[w] {
            return s;
        }
        let below = (1..w).rev().find_map(|i| self.secs[i].map(|s| (i, s)));
        let above = (w + 1..self.secs.len()).find_map(|i| self.secs[i].map(|s| (i, s)));
        match (below, above) {
            (Some((i0, s0)), Some((i1, s1))) => s0 + (s1 - s0) * (w - i0) as f64 / (i1 - i0) as f64,
            (Some((i0, s0)), None) => s0 * (1.0 + UNMEASURED_SLOPE * (w - i0) as f64),
            (None, Some((i1, s1))) => s1 / (1.0 + UNMEASURED_SLOPE * (i1 - w) as f64),
            (None, None) => 1.0 + UNMEASURED_SLOPE * (w as f64 - 1.0),
        }
    }
}

/// Per-sequence acceptance estimates.
#[derive(Debug, Clone)]
pub struct Controller {
    /// a_i: P(position i accepted | positions < i accepted).
    accept: Vec<f64>,
    /// Observations of each position so far (saturating at [`WARMUP`]).
    seen: Vec<u32>,
    /// Draft kept in the shadow of a plain step (first token only matters).
    pub shadow: Option<u32>,
}

/// Prior acceptance of every draft position: pessimistic, so that speculation has to earn its
/// longer drafts (0.35 makes the first round draft 1–2 tokens).
pub const PRIOR: f64 = 0.35;
/// Weight of the prior in observations.
pub const PRIOR_WEIGHT: f64 = 1.0;
/// Observations after which a position's estimate becomes an EMA with rate [`ALPHA`].
pub const WARMUP: u32 = 5;
/// Discount per position for a position not yet observed, applied to the last observed one.
pub const INHERIT: f64 = 0.95;
/// EMA rate once warmed up.
pub const ALPHA: f64 = 0.15;
/// Assumed extra cost per row of an unmeasured batch width, as a fraction of a measured one.
pub const UNMEASURED_SLOPE: f64 = 0.2;

impl Controller {
    /// A controller for drafts of up to `n_max` tokens.
    pub fn new(n_max: usize) -> Self {
        Controller {
            accept: vec![PRIOR; n_max.max(1)],
            seen: vec![0; n_max.max(1)],
            shadow: None,
        }
    }
    /// Updates the estimates after a verified draft of `drafted` tokens with `accepted` matches.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        for i in 0..drafted.min(self.accept.len()) {
            if self.seen[i] == 0 {
                // First evidence for this position: start from what it inherited.
                self.accept[i] = self.estimate(i);
            }
            let hit = if i < accepted { 1.0 } else { 0.0 };
            // Running mean with the prior during warm-up, EMA after.
            let rate = (1.0 / (PRIOR_WEIGHT + self.seen[i] as f64 + 1.0)).max(ALPHA);
            self.accept[i] += rate * (hit - self.accept[i]);
            self.seen[i] = (self.seen[i] + 1).min(WARMUP);
            if i >= accepted {
                break; // later positions were not observed
            }
        }
    }
    /// Resolves a shadow draft against the token the plain step produced.
    pub fn resolve_shadow(&mut self, produced: u32) {
        if let Some(d) = self.shadow.take() {
            self.observe(1, usize::from(d == produced));
        }
    }
    /// Estimate for position `i`: its own once observed; before that, the previous position's
    /// estimate discounted by [`INHERIT`] (a run of accepted tokens predicts the next one, but
    /// not quite as well), or [`PRIOR`] for the first position.
    fn estimate(&self, i: usize) -> f64 {
        let mut j = i;
        while j > 0 && self.seen[j] == 0 {
            j -= 1;
        }
        if self.seen[j] == 0 {
            return PRIOR;
        }
        self.accept[j] * INHERIT.powi((i - j) as i32)
    }
    /// Expected tokens from a draft of length n.
    pub fn expected_tokens(&self, n: usize) -> f64 {
        let mut e = 1.0;
        let mut p = 1.0;
        for i in 0..n.min(self.accept.len()) {
            p *= self.estimate(i);
            e += p;
        }
        e
    }
    /// The draft length in `{0} ∪ [n_min, available]` with the best expected tokens per second.
    pub fn choose(&self, available: usize, n_min: usize, cost: &CostModel) -> usize {
        let mut best = (0usize, 1.0 / cost.cost(1));
        for n in n_min.max(1)..=available {
            let t = cost.cost(n + 1) + n as f64 * cost.draft_secs_per_token;
            let rate = self.expected_tokens(n) / t;
            if rate > best.1 * 1.0001 {
                best = (n, rate);
            }
        }
        best.0
    }
    /// Current estimates (for statistics).
    pub fn estimates(&self) -> Vec<f64> {
        (0..self.accept.len()).map(|i| self.estimate(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_acceptance_chooses_zero_and_high_chooses_long() {
        let mut cost = CostModel::default();
        for w in 1..=17 {
            cost.observe(w, 0.040 * (1.0 + 0.03 * (w as f64 - 1.0)));
        }
        let mut c = Controller::new(16);
        for _ in 0..50 {
            c.observe(4, 0);
        }
        assert_eq!(c.choose(16, 0, &cost), 0);
        let mut c = Controller::new(16);
        for _ in 0..50 {
            c.observe(16, 16);
        }
        assert!(c.choose(16, 0, &cost) >= 12);
    }

    #[test]
    fn expensive_verification_discourages_drafting() {
        let mut cost = CostModel::default();
        for w in 1..=9 {
            // Each extra row costs a full step: speculation cannot pay at 50% acceptance.
            cost.observe(w, 0.040 * w as f64);
        }
        let c = Controller::new(8);
        assert_eq!(c.choose(8, 0, &cost), 0);
    }

    #[test]
    fn starts_short_and_stops_after_a_few_misses() {
        let cost = CostModel::default();
        let mut c = Controller::new(8);
        let first = c.choose(8, 0, &cost);
        assert!((1..=2).contains(&first), "first round drafts {first}");
        let mut rounds = 0;
        while c.choose(8, 0, &cost) > 0 {
            c.observe(c.choose(8, 0, &cost), 0);
            rounds += 1;
            assert!(rounds < 4, "still drafting after {rounds} misses");
        }
    }

    #[test]
    fn full_acceptance_grows_the_draft_quickly() {
        let mut cost = CostModel::default();
        for w in 1..=9 {
            cost.observe(w, 0.040 * (1.0 + 0.15 * (w as f64 - 1.0)));
        }
        let mut c = Controller::new(8);
        let mut lens = Vec::new();
        for _ in 0..10 {
            let n = c.choose(8, 0, &cost);
            lens.push(n);
            c.observe(n, n);
        }
        assert_eq!(*lens.last().unwrap(), 8, "{lens:?}");
        assert!(lens.iter().position(|&n| n == 8).unwrap() <= 6, "{lens:?}");
    }

    #[test]
    fn shadow_drafts_recover_acceptance() {
        let mut c = Controller::new(4);
        for _ in 0..30 {
            c.observe(4, 0);
        }
        for _ in 0..30 {
            c.shadow = Some(7);
            c.resolve_shadow(7);
        }
        assert!(c.estimates()[0] > 0.9);
    }
}
