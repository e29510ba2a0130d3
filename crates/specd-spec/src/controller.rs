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
    /// 10% of a single row) is assumed until it is measured.
    pub fn cost(&self, width: usize) -> f64 {
        let w = width.min(self.secs.len() - 1);
        if let Some(s) = self.secs[w] {
            return s;
        }
        let below = (1..w).rev().find_map(|i| self.secs[i].map(|s| (i, s)));
        let above = (w + 1..self.secs.len()).find_map(|i| self.secs[i].map(|s| (i, s)));
        match (below, above) {
            (Some((i0, s0)), Some((i1, s1))) => s0 + (s1 - s0) * (w - i0) as f64 / (i1 - i0) as f64,
            (Some((i0, s0)), None) => s0 * (1.0 + 0.1 * (w - i0) as f64),
            (None, Some((i1, s1))) => s1 / (1.0 + 0.1 * (i1 - w) as f64),
            (None, None) => 1.0 + 0.1 * (w as f64 - 1.0),
        }
    }
}

/// Per-sequence acceptance estimates.
#[derive(Debug, Clone)]
pub struct Controller {
    /// a_i: P(position i accepted | positions < i accepted).
    accept: Vec<f64>,
    /// Draft kept in the shadow of a plain step (first token only matters).
    pub shadow: Option<u32>,
}

const PRIOR: f64 = 0.5;
const ALPHA: f64 = 0.15;

impl Controller {
    /// A controller for drafts of up to `n_max` tokens.
    pub fn new(n_max: usize) -> Self {
        Controller {
            accept: vec![PRIOR; n_max.max(1)],
            shadow: None,
        }
    }
    /// Updates the estimates after a verified draft of `drafted` tokens with `accepted` matches.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        for i in 0..drafted.min(self.accept.len()) {
            if i < accepted {
                self.accept[i] += ALPHA * (1.0 - self.accept[i]);
            } else {
                self.accept[i] += ALPHA * (0.0 - self.accept[i]);
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
    /// Expected tokens from a draft of length n.
    pub fn expected_tokens(&self, n: usize) -> f64 {
        let mut e = 1.0;
        let mut p = 1.0;
        for i in 0..n.min(self.accept.len()) {
            p *= self.accept[i];
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
    pub fn estimates(&self) -> &[f64] {
        &self.accept
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
