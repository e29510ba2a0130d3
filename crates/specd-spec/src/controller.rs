//! The "never slower" controller (docs/speculative.md §5).
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
//! When the draft is verified under a checkpoint (checkpoint rollback, or a draft longer than the
//! fast path's window), `time(n)` also counts the measured checkpoint time and the expected
//! redecode: Σ_{k<n} P(exactly k accepted)·redecode(k+1); otherwise the expected fast rollback, the
//! same sum over its measured cost per kept row.
//!
//! It starts pessimistic, because a request that ends before the estimates settle must not have
//! paid for optimism: every position's prior is [`PRIOR`] (so the first round drafts one or two
//! tokens) and, until two batch widths are measured, a wider batch is assumed to cost
//! [`UNMEASURED_SLOPE`] of a step per extra row (after that, the measured slope is extended).
//! Until a position has [`WARMUP`] observations its estimate is the running mean (prior counted
//! as [`PRIOR_WEIGHT`] observations), so a few rounds of evidence move it at once; after that it
//! is an exponential moving average that follows changes in the text.
//!
//! When it picks zero while a cheap drafter has a draft ready, the draft is kept "in the
//! shadow": the plain step's token tells whether its first position would have been accepted,
//! so acceptance keeps being measured at no cost and speculation resumes when it pays again.
//!
//! A drafter that runs a model (a draft model, the MTP head) costs time whether or not its draft
//! is used, so for it the length is planned *before* drafting ([`Controller::plan`]) with the
//! measured seconds per drafted token in `time(n)`. When that plan is zero nothing is drafted; a
//! one-token probe is made after a growing number of skipped rounds so that a change in the text
//! is noticed, and never once even perfect acceptance could not beat plain decoding at the
//! measured costs. A probe, and any return to drafting after skipped rounds, first feeds the
//! drafter every token it missed; those catch-ups are held to [`PROBE_BUDGET`] of the plain time
//! skipped, priced per missed round from the drafter's own prompt processing until a catch-up
//! has been timed. While a position has fewer than [`EXPLORE_OBS`] observations the plan prices
//! it one standard error above its estimate, so that the request's first token or two (often a
//! miss) do not end drafting in text that accepts nearly everything.
//!
//! A sequence's **first** decision is to draft: its first plan of a model drafter, or the first
//! draft of a cheap one, verifies at least `max(n_min, 1)` tokens whatever the estimates say
//! (as does every probe: a probe that is not verified measures nothing). A user who configured
//! a drafter sees it used on every request (`draft_n > 0`, as llama-server reports), the
//! estimates start from evidence instead of the prior, and the never-slower policy decides from
//! the second round on: a drafter that does not pay has cost one verification.

/// Measured cost of verification batches by width (rows), shared by every sequence, and of the
/// checkpoint-and-redecode rollback where a draft needs it.
///
/// Every cost except the one-row step is kept **in steps**: a sample is divided by the step
/// estimate of the moment it was taken. The choice of a draft length only compares costs with
/// each other, and a host's speed moves in bursts: kept in seconds, a width measured in a fast
/// burst and rarely used since looks cheaper than the one-row step of the slow phase after it,
/// and the controller keeps verifying drafts that cannot pay (BENCHMARKS.md, "Why the
/// controller's rules are what they are", has the measurements behind this and the rules below).
///
/// The step itself is guarded both ways: a one-row sample counts for at most [`STEP_OUTLIER`]
/// times the estimate (one preempted step must not price plain decoding as slow for the hundreds
/// of drafting rounds before the next one-row step), and a batch of several rows that took less
/// than the estimate lowers it to that batch's time (no batch costs less than one of its rows).
#[derive(Debug, Clone)]
pub struct CostModel {
    /// EMA of seconds per one-row decode: the unit of everything else.
    step: Option<f64>,
    /// EMA of the cost of a decode of width w (index w ≥ 2), in steps, if measured.
    units: Vec<Option<f64>>,
    /// Estimated steps of every width (index w), rebuilt from `units` when one changes: the
    /// controller prices every candidate length every round, and on a small model a step is
    /// well under a millisecond.
    table: Vec<f64>,
    /// Seconds of decodes of width w measured before any one-row step (converted to steps when
    /// the first one is).
    pending: Vec<Option<f64>>,
    /// One-row steps since width w (index w) or a redecode keeping w rows (index
    /// `MAX_WIDTH + 1 + w`) was last measured; at [`FORGET_AFTER`] the measurement is dropped.
    age: Vec<u32>,
    /// EMA, in steps, of a checkpoint-and-redecode rollback that kept w rows (index w): restoring
    /// the state and decoding those rows again.
    redecode: Vec<Option<f64>>,
    /// EMA, in steps, of taking a checkpoint before a verification batch.
    checkpoint: Option<f64>,
    /// EMA, in steps per kept row, of a fast rollback (the recurrence replayed over the kept
    /// rows, or a snapshot copied): small, but a verified draft that is not wholly accepted
    /// pays it, and it grows with the rows kept.
    fast_per_row: Option<f64>,
    /// One-row steps since a fast rollback was last measured (forgotten at [`FORGET_AFTER`]).
    fast_age: u32,
    /// Samples behind each width's estimate (index w, capped at [`MAX_WEIGHT`]): its weight
    /// when the widths are made monotone.
    count: Vec<u8>,
    /// Whether the first sample of each kind was seen and dropped (widths at index w, redecodes
    /// at `MAX_WIDTH + 1 + rows`, then the checkpoint and the fast rollback): the first decode
    /// of a width in a process allocates and faults in its buffers, and one such sample can
    /// price drafting out for a whole request.
    warm: Vec<bool>,
    /// One-row steps since a checkpoint was last measured (forgotten at [`FORGET_AFTER`]: the
    /// first checkpoint on a fresh server allocates its buffers and must not price checkpoint
    /// mode out for the rest of the run).
    checkpoint_age: u32,
    /// Drafts of n tokens with n + 1 > this many rows need a checkpoint (and a redecode when not
    /// fully accepted): 0 under checkpoint rollback, the fast path's window under the fast
    /// paths, unlimited without recurrent state.
    fast_window: usize,
    /// Verification batches (two rows or more) decoded since the last one-row step.
    since_step: u32,
}

/// Verification batches after which the one-row step is measured again (one plain round,
/// [`CostModel::wants_step`]). A sequence that always drafts (high acceptance) never decodes a
/// single row, and every width is priced in steps: without a step its samples wait in seconds
/// and the widths keep the prior's slope, far too flat on a MoE model. A stale step misprices
/// plain decoding against the widths the same way. One round in this many costs at most its
/// draft's gain.
const STEP_REFRESH: u32 = 128;

/// Widths the cost model keeps (wider batches are priced as the widest).
const MAX_WIDTH: usize = 65;

/// Most a one-row sample counts for, as a multiple of the step estimate it updates.
const STEP_OUTLIER: f64 = 1.5;

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            step: None,
            units: vec![None; MAX_WIDTH + 1],
            table: Vec::new(),
            pending: vec![None; MAX_WIDTH + 1],
            age: vec![0; 2 * (MAX_WIDTH + 1)],
            redecode: vec![None; MAX_WIDTH + 1],
            checkpoint: None,
            checkpoint_age: 0,
            fast_per_row: None,
            fast_age: 0,
            count: vec![0; MAX_WIDTH + 1],
            warm: vec![false; 2 * (MAX_WIDTH + 1) + 2],
            fast_window: usize::MAX,
            since_step: 0,
        }
    }
}

fn ema(old: Option<f64>, new: f64, rate: f64) -> Option<f64> {
    Some(old.map_or(new, |o| (1.0 - rate) * o + rate * new))
}

/// EMA rate of every measured cost.
const COST_RATE: f64 = 0.2;
/// Most weight one width's estimate gets when the widths are made monotone (about the samples
/// an EMA of rate [`COST_RATE`] remembers).
const MAX_WEIGHT: u8 = 5;
/// Samples below which a width's estimate is forgotten after [`FORGET_FEW_AFTER`] one-row
/// steps instead of [`FORGET_AFTER`].
const FEW_SAMPLES: u8 = 3;
/// One-row steps after which a width measured fewer than [`FEW_SAMPLES`] times is forgotten.
pub const FORGET_FEW_AFTER: u32 = 32;
/// Index in [`CostModel::warm`] of the checkpoint's and the fast rollback's first samples.
const WARM_CHECKPOINT: usize = 2 * (MAX_WIDTH + 1);
const WARM_FAST: usize = WARM_CHECKPOINT + 1;
/// One-row steps after which a width's, a redecode's or the checkpoint's cost measurement is
/// forgotten, so it is priced from its neighbours or the prior again. A cost that makes
/// drafting look dear is never measured again (nothing is drafted), so one slow sample would
/// otherwise stop drafting for good.
pub const FORGET_AFTER: u32 = 256;

impl CostModel {
    /// A cost model for a memory whose fast rollback covers batches of up to `fast_window` rows
    /// (0: every draft is verified under a checkpoint and rolled back by redecode).
    pub fn with_fast_window(fast_window: usize) -> Self {
        CostModel {
            fast_window,
            ..Default::default()
        }
    }
    /// Marks the first sample of kind `i` as seen; true if this is it (to be dropped).
    fn cold(&mut self, i: usize) -> bool {
        !std::mem::replace(&mut self.warm[i], true)
    }
    /// `secs` in steps of the current estimate (None before the first one-row step).
    fn in_steps(&self, secs: f64) -> Option<f64> {
        if !secs.is_finite() || secs < 0.0 {
            return None;
        }
        self.step.map(|s| secs / s)
    }
    /// Records a checkpoint-and-redecode rollback that kept `rows` rows and took `secs`.
    pub fn observe_redecode(&mut self, rows: usize, secs: f64) {
        if let (true, Some(u)) = (rows < self.redecode.len(), self.in_steps(secs)) {
            if self.cold(MAX_WIDTH + 1 + rows) {
                return;
            }
            self.redecode[rows] = ema(self.redecode[rows], u, COST_RATE);
            self.age[MAX_WIDTH + 1 + rows] = 0;
        }
    }
    /// Records a fast rollback (nothing decoded again) that kept `rows` rows and took `secs`.
    pub fn observe_fast_rollback(&mut self, rows: usize, secs: f64) {
        if let (true, Some(u)) = (rows > 0, self.in_steps(secs)) {
            if self.cold(WARM_FAST) {
                return;
            }
            self.fast_per_row = ema(self.fast_per_row, u / rows as f64, COST_RATE);
            self.fast_age = 0;
        }
    }
    /// Estimated seconds of a fast rollback keeping `rows` rows (0 until measured).
    fn fast_rollback_cost(&self, rows: usize) -> f64 {
        self.fast_per_row.unwrap_or(0.0) * rows as f64 * self.cost(1)
    }
    /// Records that taking a checkpoint took `secs`.
    pub fn observe_checkpoint(&mut self, secs: f64) {
        if let Some(u) = self.in_steps(secs) {
            if self.cold(WARM_CHECKPOINT) {
                return;
            }
            self.checkpoint = ema(self.checkpoint, u, COST_RATE);
            self.checkpoint_age = 0;
        }
    }
    /// Whether a draft of `n` tokens is verified under a checkpoint.
    pub fn needs_checkpoint(&self, n: usize) -> bool {
        n > 0 && n + 1 > self.fast_window
    }
    /// Estimated seconds of taking a checkpoint (0 until measured).
    fn checkpoint_cost(&self) -> f64 {
        self.checkpoint.unwrap_or(0.0) * self.cost(1)
    }
    /// Estimated seconds of a redecode keeping `rows` rows: measured, else the cost of a
    /// verification batch of that width (an upper bound: a redecode computes no logits).
    fn redecode_cost(&self, rows: usize) -> f64 {
        match self.redecode.get(rows).copied().flatten() {
            Some(u) => u * self.cost(1),
            None if rows == 0 => 0.0,
            None => self.cost(rows),
        }
    }

    /// Seconds of a one-row step, once one is measured.
    pub fn step_secs(&self) -> Option<f64> {
        self.step
    }
    /// Whether the next round should decode one row (draft nothing) to measure the step the
    /// widths are priced in: none measured since verification batches were, or the last one
    /// is [`STEP_REFRESH`] batches old.
    pub fn wants_step(&self) -> bool {
        let limit = if self.step.is_none() { 1 } else { STEP_REFRESH };
        self.since_step >= limit
    }

    /// The widths the controller prices with, as it sees them now: `(width, steps, measured)`
    /// for every width from 1 to `max_width` — the estimate in one-row steps and whether that
    /// width has samples of its own (else it is priced from its neighbours or the prior).
    pub fn width_table(&self, max_width: usize) -> Vec<(usize, f64, bool)> {
        (1..=max_width.min(MAX_WIDTH))
            .map(|w| {
                // cost() in units of the one-row step (the prior's slope before any step).
                let steps = self.cost(w) / self.cost(1).max(f64::MIN_POSITIVE);
                (w, steps, w == 1 || self.units[w].is_some())
            })
            .collect()
    }

    /// Records that a decode of `width` rows took `secs`.
    pub fn observe(&mut self, width: usize, secs: f64) {
        if width == 0 || width > MAX_WIDTH || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        if width == 1 {
            self.observe_step(secs);
            return;
        }
        self.since_step = self.since_step.saturating_add(1);
        // A batch of several rows never costs less than one row: one that did proves the step
        // estimate too high (measured in a slower moment), and every width is priced in it.
        if self.step.is_some_and(|s| secs < s) {
            self.step = Some(secs);
        }
        if self.cold(width) {
            return;
        }
        match self.in_steps(secs) {
            Some(u) => {
                // A batch never costs more than its rows decoded one by one: a sample above
                // that is the host (or a cold start), not the width.
                let u = u.min(width as f64);
                self.units[width] = ema(self.units[width], u, COST_RATE);
                self.count[width] = (self.count[width] + 1).min(MAX_WEIGHT);
                self.age[width] = 0;
                self.rebuild();
            }
            None => self.pending[width] = ema(self.pending[width], secs, COST_RATE),
        }
    }

    /// A one-row step took `secs`: the step's price, the ageing of every other measurement
    /// (each is forgotten after enough steps), and the widths measured before the first step
    /// converted to steps.
    fn observe_step(&mut self, secs: f64) {
        self.since_step = 0;
        let first = self.step.is_none();
        // One slow sample moves the step by at most STEP_OUTLIER: the step prices plain
        // decoding against drafting, and a sequence that drafts measures it again only
        // every STEP_REFRESH batches, so a single preempted step would make drafting look
        // cheap until then.
        let secs = self.step.map_or(secs, |s| secs.min(STEP_OUTLIER * s));
        self.step = ema(self.step, secs, COST_RATE);
        let mut forgot = false;
        for (i, age) in self.age.iter_mut().enumerate() {
            let m = match i.checked_sub(MAX_WIDTH + 1) {
                None => &mut self.units[i],
                Some(r) => &mut self.redecode[r],
            };
            if m.is_some() {
                *age += 1;
                // A width known from one or two samples is re-priced sooner: cold samples
                // (a fresh process's first batches) price a width too high, and a width
                // priced too high is not drafted for, so not measured again.
                let few = i <= MAX_WIDTH && self.count[i] < FEW_SAMPLES;
                if *age >= if few { FORGET_FEW_AFTER } else { FORGET_AFTER } {
                    *m = None;
                    forgot = true;
                    if i <= MAX_WIDTH {
                        self.count[i] = 0;
                    }
                }
            }
        }
        for (m, age) in [
            (&mut self.checkpoint, &mut self.checkpoint_age),
            (&mut self.fast_per_row, &mut self.fast_age),
        ] {
            if m.is_some() {
                *age += 1;
                if *age >= FORGET_AFTER {
                    *m = None;
                }
            }
        }
        if forgot {
            self.rebuild();
        }
        if first {
            for w in 2..=MAX_WIDTH {
                if let Some(p) = self.pending[w].take() {
                    self.units[w] = self.in_steps(p).map(|u| u.min(w as f64));
                    self.count[w] = 1;
                }
            }
            self.rebuild();
        }
    }
    /// Recomputes `table` from the measured widths.
    fn rebuild(&mut self) {
        let m = self.measured();
        self.table = (0..=MAX_WIDTH).map(|w| units_of(&m, w.max(1))).collect();
    }
    /// Measured widths as `(width, steps)`, each at least [`MIN_SLOPE`] of a step per extra row
    /// above the narrower ones: a batch never costs less than a narrower one (every row is
    /// sampled, at least), whatever a burst of the host made one sample say.
    ///
    /// Made monotone by weighted isotonic regression (pool adjacent violators) of
    /// `u − MIN_SLOPE·(w − 1)`, each width weighted by its samples and the one-row step fixed
    /// at 1: widths that disagree are averaged. A running maximum instead let one high sample
    /// of a width the controller then stopped using (two rows, early in a request) floor every
    /// wider batch for good.
    fn measured(&self) -> Vec<(usize, f64)> {
        let slope = |w: usize| MIN_SLOPE * (w - 1) as f64;
        // Blocks of pooled widths: (Σ weight·v, Σ weight, widths). The first holds the
        // one-row step, whose value stays exactly 1 (it is the unit).
        let mut blocks: Vec<(f64, f64, Vec<usize>)> = vec![(1.0, 1.0, vec![1])];
        let mean = |b: &(f64, f64, Vec<usize>)| b.0 / b.1;
        for (w, u) in self.units.iter().enumerate().skip(2) {
            let Some(u) = *u else { continue };
            let wt = f64::from(self.count[w].max(1));
            blocks.push((wt * (u - slope(w)), wt, vec![w]));
            while blocks.len() >= 2
                && mean(&blocks[blocks.len() - 2]) > mean(&blocks[blocks.len() - 1])
            {
                let Some((s, wt, ws)) = blocks.pop() else {
                    break;
                };
                let anchor = blocks.len() == 1;
                let Some(prev) = blocks.last_mut() else { break };
                if !anchor {
                    prev.0 += s;
                    prev.1 += wt;
                }
                prev.2.extend(ws);
            }
        }
        let mut out = Vec::new();
        for (s, wt, ws) in blocks {
            for w in ws {
                out.push((w, s / wt + slope(w)));
            }
        }
        out
    }
    /// Estimated seconds for a batch of `width` rows (see [`units_of`] for unmeasured widths).
    pub fn cost(&self, width: usize) -> f64 {
        let w = width.clamp(1, MAX_WIDTH);
        let Some(step) = self.step else {
            // Nothing measured in steps yet: relative costs from the prior slope, anchored on
            // the first width measured in seconds if any.
            let unit = (2..=MAX_WIDTH)
                .find_map(|i| {
                    self.pending[i].map(|s| s / (1.0 + UNMEASURED_SLOPE * (i as f64 - 1.0)))
                })
                .unwrap_or(1.0);
            return unit * (1.0 + UNMEASURED_SLOPE * (w as f64 - 1.0));
        };
        step * self.table.get(w).copied().unwrap_or(1.0)
    }
}

/// Steps of a batch of `w` rows from the measured widths `m` (`(width, steps)`, ascending,
/// starting with `(1, 1.0)`). Unmeasured widths are interpolated; beyond the widest measured one
/// the slope of the two widest is extended (at least [`MIN_SLOPE`] of the widest's cost per row);
/// with only the one-row step known, the pessimistic [`UNMEASURED_SLOPE`] per row.
fn units_of(m: &[(usize, f64)], w: usize) -> f64 {
    let i = m.partition_point(|&(mw, _)| mw <= w).max(1); // m[i-1].0 <= w < m[i].0
    let (w0, u0) = m[i - 1];
    if w0 == w {
        u0
    } else if let Some(&(w1, u1)) = m.get(i) {
        u0 + (u1 - u0) * (w - w0) as f64 / (w1 - w0) as f64
    } else if i >= 2 {
        // Extend what this machine's kernels have shown, floored so that noise cannot make rows
        // look free. Without this, a controller that had only tried short drafts kept
        // estimating long ones at the prior's 0.2 step per row and never tried them, even at
        // full acceptance.
        let (wp, up) = m[i - 2];
        let slope = ((u0 - up) / (w0 - wp) as f64).max(MIN_SLOPE * u0);
        u0 + slope * (w - w0) as f64
    } else {
        1.0 + UNMEASURED_SLOPE * (w as f64 - 1.0)
    }
}

/// Per-sequence acceptance estimates.
#[derive(Debug, Clone)]
pub struct Controller {
    /// a_i: P(position i accepted | positions < i accepted).
    accept: Vec<f64>,
    /// Observations of each position so far (saturating at [`EXPLORE_OBS`], past [`WARMUP`]).
    seen: Vec<u32>,
    /// A drafted token that was not verified, kept "in the shadow": `(position, token)`. When
    /// every verified position before it is accepted, the target's own next token says whether
    /// it would have been accepted too — position 0 in a plain step, position n after n
    /// accepted drafts — so that position is measured at no cost.
    pub shadow: Option<(usize, u32)>,
    /// EMA of seconds per drafted token of a model drafter (catch-up decode included).
    draft_secs: Option<f64>,
    /// Rounds [`Controller::plan`] skipped since the last draft.
    skipped: u32,
    /// Skipped rounds after which the next plan probes with one token.
    probe_after: u32,
    /// The model drafter drafted in the previous round too, so this round's drafting time is
    /// its steady-state cost, not a catch-up over the prompt or over skipped rounds.
    drafter_in_sync: bool,
    /// Seconds spent in catch-up rounds of a model drafter (the prompt, probes).
    catch_up_secs: f64,
    /// Estimated seconds of the plain steps taken while the model drafter was skipped.
    skipped_secs: f64,
    /// Rounds since the model drafter last ran: the tokens its next call must catch up on.
    missed: u32,
    /// EMA of a catch-up's seconds per missed round (from catch-ups over at least
    /// [`MIN_MISSED`] rounds), to price the next probe before making it.
    catch_up_per_round: Option<f64>,
    /// No decision made yet: no draft verified, no model drafter planned for. The next
    /// decision drafts.
    first: bool,
    /// The last [`Controller::plan`] was a probe (or the first decision): its draft is verified
    /// whatever the estimates say — a probe that is not verified measures nothing.
    probing: bool,
    /// The last [`Controller::plan`] asked a model drafter for tokens: [`Controller::choose`]
    /// then prices them with the same (optimistic) estimates, or it would throw away drafts the
    /// plan paid for.
    planned: bool,
}

/// Prior acceptance of every draft position: pessimistic, so that speculation has to earn its
/// longer drafts (0.35 makes the first round draft 1–2 tokens).
pub const PRIOR: f64 = 0.35;
/// Observations of a position below which a model drafter's plan prices it optimistically (see
/// [`Controller::plan`]).
pub const EXPLORE_OBS: u32 = 8;
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
/// Least extra cost per row: of a step between measured widths, and of the widest measured
/// width's cost when extrapolating beyond it.
pub const MIN_SLOPE: f64 = 0.02;
/// Skipped rounds before the first probe of a model drafter; doubles after each probe that does
/// not bring drafting back, up to [`PROBE_MAX`].
pub const PROBE_FIRST: u32 = 8;
/// How much faster than plain decoding (expected tokens per second) a draft must promise to be
/// made at all.
pub const DRAFT_MARGIN: f64 = 1.03;
/// Catch-ups over fewer missed rounds than this do not price a missed round (their time is
/// mostly the call's fixed cost).
pub const MIN_MISSED: u32 = 4;
/// One-row steps of catch-up a sequence may spend on top of [`PROBE_BUDGET`]: the early probes,
/// which feed the drafter a few dozen tokens, are what finds text that accepts nearly every
/// draft after a first draft that missed. Held to the budget alone (a draft model's catch-up can
/// cost more per missed round than that share of a step), a drafter skipped after its first
/// draft would never draft again.
pub const PROBE_ALLOWANCE: f64 = 4.0;
/// Longest wait between probes (counted in skipped rounds).
pub const PROBE_MAX: u32 = 128;
/// Most time a skipped model drafter's catch-ups may cost, as a fraction of the plain steps
/// taken while it was skipped: a probe must first feed the drafter every token it missed, and
/// with a small target that catch-up, not the probe's verification, is what costs. A draft
/// model's batched catch-up costs a fixed share of the tokens it missed, so this share is, in
/// the end, what a draft model that never drafts costs.
pub const PROBE_BUDGET: f64 = 0.01;

impl Controller {
    /// A controller for drafts of up to `n_max` tokens.
    pub fn new(n_max: usize) -> Self {
        Controller {
            accept: vec![PRIOR; n_max.max(1)],
            seen: vec![0; n_max.max(1)],
            shadow: None,
            draft_secs: None,
            skipped: 0,
            probe_after: PROBE_FIRST,
            drafter_in_sync: false,
            catch_up_secs: 0.0,
            skipped_secs: 0.0,
            missed: 0,
            catch_up_per_round: None,
            first: true,
            probing: false,
            planned: false,
        }
    }
    /// Records that a model drafter took `secs` for a round that produced `tokens` drafts. A
    /// round after the prompt or after skipped rounds is not counted: the drafter first had to
    /// process every token it missed, which says nothing about the next round's cost.
    pub fn observe_draft_time(&mut self, secs: f64, tokens: usize) {
        let in_sync = std::mem::replace(&mut self.drafter_in_sync, true);
        let missed = std::mem::take(&mut self.missed);
        if !secs.is_finite() || secs < 0.0 {
            return;
        }
        if !in_sync {
            self.catch_up_secs += secs;
            if missed >= MIN_MISSED {
                let per = secs / missed as f64;
                self.catch_up_per_round = ema(self.catch_up_per_round, per, 0.5);
            }
            return;
        }
        let per = secs / tokens.max(1) as f64;
        self.draft_secs = Some(match self.draft_secs {
            None => per,
            Some(old) => 0.7 * old + 0.3 * per,
        });
    }
    /// Seconds per drafted token of a model drafter, once measured.
    pub fn draft_secs_per_token(&self) -> Option<f64> {
        self.draft_secs
    }
    /// Updates the estimates after a verified draft of `drafted` tokens with `accepted` matches.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        self.first = false;
        self.probing = false;
        for i in 0..drafted.min(self.accept.len()) {
            self.update(i, i < accepted);
            if i >= accepted {
                break; // later positions were not observed
            }
        }
    }
    /// One observation of position `i` (all positions before it accepted).
    fn update(&mut self, i: usize, hit: bool) {
        if i >= self.accept.len() {
            return;
        }
        if self.seen[i] == 0 {
            // First evidence for this position: start from what it inherited.
            self.accept[i] = self.estimate(i);
        }
        let hit = if hit { 1.0 } else { 0.0 };
        // Running mean with the prior during warm-up, EMA after.
        let rate = (1.0 / (PRIOR_WEIGHT + self.seen[i] as f64 + 1.0)).max(ALPHA);
        self.accept[i] += rate * (hit - self.accept[i]);
        self.seen[i] = (self.seen[i] + 1).min(WARMUP.max(EXPLORE_OBS));
    }
    /// Resolves the shadow token after a round in which `accepted` drafts were accepted and the
    /// target produced `produced` next: it counts only if it sits right after them. Without
    /// this, a position the controller stopped drafting after an unlucky start was never
    /// observed again, so its pessimistic estimate kept the drafts short for good.
    pub fn resolve_shadow(&mut self, accepted: usize, produced: u32) {
        if let Some((pos, d)) = self.shadow.take() {
            if pos == accepted {
                self.update(pos, d == produced);
            }
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
    /// [`Controller::estimate`] plus one standard error while the position it comes from has
    /// fewer than [`EXPLORE_OBS`] observations: what a model drafter's plan prices. A model
    /// drafter is probed only now and then (each probe first feeds it every token it missed), so
    /// an estimate made of the request's first token or two — often a miss, and never a later
    /// position — kept drafts from being tried again in workloads that accept nearly every
    /// draft; the bonus asks for a few more observations before giving up. It is gone after
    /// [`EXPLORE_OBS`] of them, so a drafter at half acceptance costs at most those few rounds.
    fn optimistic(&self, i: usize) -> f64 {
        let a = self.estimate(i);
        let mut j = i;
        while j > 0 && self.seen[j] == 0 {
            j -= 1;
        }
        let n = self.seen[j];
        if n >= EXPLORE_OBS {
            return a;
        }
        (a + (a * (1.0 - a) / (f64::from(n) + 1.0)).sqrt()).min(1.0)
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
    /// The draft length in `{0} ∪ [n_min, available]` with the best expected tokens per second,
    /// for a draft that is already made (its cost is spent, only verification counts). The
    /// sequence's first decision, and a model drafter's probe (see [`Controller::plan`]),
    /// verify at least `max(n_min, 1)` tokens (none when fewer are available: a draft shorter
    /// than `n_min` is never used). Otherwise 0 while the cost model wants a one-row step
    /// ([`CostModel::wants_step`]).
    pub fn choose(&self, available: usize, n_min: usize, cost: &CostModel) -> usize {
        if !self.first && cost.wants_step() {
            return 0;
        }
        let n = if self.planned {
            self.best(available, n_min, cost, 0.0, |i| self.optimistic(i))
        } else {
            self.best(available, n_min, cost, 0.0, |i| self.estimate(i))
        };
        if (self.first || self.probing) && available >= n_min.max(1) {
            return n.max(n_min.max(1));
        }
        n
    }
    /// For a model drafter, before drafting: how many tokens to ask for (0: skip the drafter this
    /// round), counting the measured drafting time. Mostly [`Controller::choose`] with that cost;
    /// while it says zero, a one-token probe after [`PROBE_FIRST`], then twice as many, … skipped
    /// rounds keeps the acceptance estimate current — unless drafting could not pay even if
    /// every token were accepted, or the catch-ups so far have used up [`PROBE_BUDGET`]. The
    /// sequence's first plan asks for at least `max(n_min, 1)` tokens.
    pub fn plan(&mut self, available: usize, n_min: usize, cost: &CostModel) -> usize {
        self.planned = false;
        if !self.first && cost.wants_step() {
            // A plain round to measure the step: the drafter skips it and catches up next time.
            self.probing = false;
            self.drafter_in_sync = false;
            return 0;
        }
        let d = self.draft_secs.unwrap_or(0.0);
        let n = self.best(available, n_min, cost, d, |i| self.optimistic(i));
        self.probing = false;
        // A draft shorter than n_min is never used: no probe asks for one (near the end of a
        // request fewer tokens may be left).
        let probe = n_min.max(1);
        if self.first && available >= probe {
            self.first = false;
            self.probing = true;
            self.planned = true;
            return n.max(probe);
        }
        // Drafting again after skipped rounds first feeds the drafter every token it missed —
        // dozens of steps after a long skip, which the draft's price per token leaves out — so
        // that resumption is held to the probes' budget (one slow step sample can tip a round's
        // estimate over the line).
        if n > 0 && (self.missed < MIN_MISSED || self.catch_up_affordable(cost)) {
            self.first = false;
            self.skipped = 0;
            self.probe_after = PROBE_FIRST;
            self.planned = true;
            return n;
        }
        self.drafter_in_sync = false;
        if available < probe || self.best(available, n_min, cost, d, |_| 1.0) == 0 {
            return 0;
        }
        self.skipped += 1;
        self.missed += 1;
        // Seconds only once a step is measured: before that the cost model's unit is arbitrary
        // (a second), and a server whose first requests run side by side measures no step
        // (only one sequence's batches are timed), so each skipped round would buy catch-ups
        // priced in that arbitrary unit.
        self.skipped_secs += cost.step_secs().unwrap_or(0.0);
        if self.skipped < self.probe_after || !self.catch_up_affordable(cost) {
            return 0;
        }
        self.skipped = 0;
        self.probe_after = (self.probe_after * 2).min(PROBE_MAX);
        self.probing = true;
        self.planned = true;
        probe
    }
    /// Whether the catch-ups so far and the next one fit in [`PROBE_BUDGET`] of the plain time
    /// skipped, plus [`PROBE_ALLOWANCE`] steps. The next catch-up counts too: it grows with the
    /// rounds missed.
    fn catch_up_affordable(&self, cost: &CostModel) -> bool {
        let next = self
            .catch_up_per_round
            .map_or(0.0, |r| r * self.missed as f64);
        let allowance = PROBE_ALLOWANCE * cost.step_secs().unwrap_or(0.0);
        self.catch_up_secs + next <= PROBE_BUDGET * self.skipped_secs + allowance
    }
    /// Records that a model drafter processed the `tokens` of the prompt in `secs`: the first
    /// price of a catch-up per missed round, before any probe has measured one (unpriced, a first
    /// probe after hundreds of skipped rounds would feed them all whatever the budget).
    pub fn observe_prefill(&mut self, secs: f64, tokens: usize) {
        if secs.is_finite() && secs > 0.0 && tokens >= MIN_MISSED as usize {
            self.catch_up_per_round = ema(self.catch_up_per_round, secs / tokens as f64, 0.5);
        }
    }
    /// Argmax over n of expected tokens / time, with per-position acceptance `acc(i)` and
    /// `draft_secs` per drafted token.
    fn best(
        &self,
        available: usize,
        n_min: usize,
        cost: &CostModel,
        draft_secs: f64,
        acc: impl Fn(usize) -> f64,
    ) -> usize {
        let mut best = (0usize, 1.0 / cost.cost(1));
        let (mut e, mut p) = (1.0, 1.0);
        // Expected rollback time if this draft ends at n: Σ_{k<n} P(exactly k accepted)·r(k+1),
        // r the checkpoint's redecode or the fast rollback keeping k + 1 rows.
        let (mut redecode, mut fast) = (0.0, 0.0);
        for n in 1..=available.min(self.accept.len()) {
            let before = p;
            p *= acc(n - 1);
            e += p;
            redecode += (before - p) * cost.redecode_cost(n);
            fast += (before - p) * cost.fast_rollback_cost(n);
            if n < n_min.max(1) {
                continue;
            }
            let mut t = cost.cost(n + 1) + n as f64 * draft_secs;
            if cost.needs_checkpoint(n) {
                t += cost.checkpoint_cost() + redecode;
            } else {
                t += fast;
            }
            let rate = e / t;
            // Drafting must beat plain decoding by a margin: at break-even the per-round costs
            // the model leaves out (sampling every row, bookkeeping) tip it below plain.
            let margin = if best.0 == 0 { DRAFT_MARGIN } else { 1.0001 };
            if rate > best.1 * margin {
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

    impl CostModel {
        /// As if every kind of cost had had its cold first sample dropped already.
        fn warmed(mut self) -> Self {
            self.warm.fill(true);
            self
        }
    }

    impl Controller {
        /// As if the sequence's first decision (always to draft) were made: what is left is the
        /// pricing.
        fn decided(mut self) -> Self {
            self.first = false;
            self
        }
    }

    /// The trained pair's shape: a one-row step measured at 0.5 ms, wider batches unmeasured
    /// (priced by the prior).
    fn half_ms_step() -> CostModel {
        let mut cost = CostModel::default().warmed();
        for _ in 0..20 {
            cost.observe(1, 0.0005);
        }
        cost
    }

    /// Widths 1..=max_width measured at `step` seconds for one row, `step·slope` more per row.
    fn linear_cost(max_width: usize, step: f64, slope: f64) -> CostModel {
        let mut cost = CostModel::default().warmed();
        for w in 1..=max_width {
            cost.observe(w, step * (1.0 + slope * (w as f64 - 1.0)));
        }
        cost
    }

    #[test]
    fn low_acceptance_chooses_zero_and_high_chooses_long() {
        let cost = linear_cost(17, 0.040, 0.03);
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
    fn wider_batches_extend_the_measured_slope() {
        let mut cost = CostModel::default().warmed();
        cost.observe(1, 0.020);
        // One width known: the prior slope (0.2 of it per row).
        assert!((cost.cost(5) - 0.020 * 1.8).abs() < 1e-12);
        cost.observe(5, 0.032);
        assert!((cost.cost(3) - 0.026).abs() < 1e-12, "interpolated");
        assert!(
            (cost.cost(9) - 0.044).abs() < 1e-12,
            "3 ms per row, extended"
        );
        // Noise that makes rows look free is floored.
        cost.observe(6, 0.031);
        assert!(cost.cost(10) > 0.031 + 4.0 * MIN_SLOPE * 0.031 - 1e-12);
        // At full acceptance the extension lets a controller that has only seen 4-token drafts
        // go longer: with the prior slope it would stay at 4.
        let mut cost = CostModel::default().warmed();
        cost.observe(1, 0.022);
        cost.observe(5, 0.034);
        let mut c = Controller::new(8);
        for _ in 0..50 {
            c.observe(4, 4);
        }
        assert_eq!(c.choose(8, 0, &cost), 8);
    }

    #[test]
    fn always_drafting_still_measures_the_step_the_widths_are_priced_in() {
        // Full acceptance from the start: only 9-row batches, each ~5 steps (a MoE model).
        let mut cost = CostModel::default().warmed();
        let mut c = Controller::new(8);
        for _ in 0..20 {
            c.observe(8, 8);
        }
        cost.observe(9, 0.050);
        // No step: the width waits in seconds and is priced from the prior's slope.
        assert!(cost.wants_step());
        assert_eq!(c.choose(8, 0, &cost), 0, "a plain round measures the step");
        cost.observe(1, 0.010);
        assert!(!cost.wants_step());
        assert!((cost.cost(9) / cost.cost(1) - 5.0).abs() < 1e-9);
        assert_eq!(c.choose(8, 0, &cost), 8);
        // Then once every STEP_REFRESH verification batches.
        for _ in 0..STEP_REFRESH - 1 {
            cost.observe(9, 0.050);
        }
        assert!(!cost.wants_step());
        cost.observe(9, 0.050);
        assert!(cost.wants_step());
        assert_eq!(c.choose(8, 0, &cost), 0);
    }

    #[test]
    fn width_table_reports_steep_moe_widths_as_measured() {
        // MoE-like: each row brings its own experts, so 2 rows cost ~2 steps and 4 rows ~3.4.
        let mut cost = CostModel::default().warmed();
        cost.observe(1, 0.010);
        cost.observe(2, 0.020);
        cost.observe(4, 0.034);
        let t = cost.width_table(5);
        assert_eq!(t.len(), 5);
        let flags: Vec<bool> = t.iter().map(|x| x.2).collect();
        assert_eq!(flags, [true, true, false, true, false]);
        assert!((t[0].1 - 1.0).abs() < 1e-9);
        assert!((t[1].1 - 2.0).abs() < 1e-9, "{t:?}");
        assert!((t[2].1 - 2.7).abs() < 1e-9, "interpolated: {t:?}");
        assert!((t[3].1 - 3.4).abs() < 1e-9, "{t:?}");
        assert!(t[4].1 > t[3].1, "extended: {t:?}");
    }

    #[test]
    fn widths_are_priced_in_steps_of_their_moment() {
        // Two rows measured at 1.1 steps while a step took 20 ms; then the host slows to 40 ms
        // a step and two rows are not measured again: they still cost 1.1 steps, not 22 ms.
        let mut cost = CostModel::default().warmed();
        cost.observe(1, 0.020);
        for _ in 0..FEW_SAMPLES {
            cost.observe(2, 0.022);
        }
        for _ in 0..50 {
            cost.observe(1, 0.040);
        }
        assert!((cost.cost(2) / cost.cost(1) - 1.1).abs() < 1e-9);
        // A sample from a fast burst cannot make a wider batch cheaper than a narrower one…
        let mut cost = CostModel::default().warmed();
        cost.observe(1, 0.040);
        cost.observe(2, 0.020);
        cost.observe(3, 0.050);
        cost.observe(5, 0.045);
        assert!((cost.cost(2) / cost.cost(1) - (1.0 + MIN_SLOPE)).abs() < 1e-9);
        assert!(cost.cost(4) > cost.cost(3) && cost.cost(5) > cost.cost(4));
        // …so after a run of misses a one-token draft is not worth its verification.
        let mut c = Controller::new(4);
        for _ in 0..10 {
            c.observe(1, 0);
        }
        assert_eq!(c.choose(4, 0, &cost), 0);
        // Widths measured before the first one-row step are converted once it is known.
        let mut cost = CostModel::default().warmed();
        cost.observe(3, 0.030);
        assert!(cost.cost(3) > cost.cost(2) && cost.cost(2) > cost.cost(1));
        cost.observe(1, 0.020);
        assert!((cost.cost(3) - 0.030).abs() < 1e-12);
    }

    #[test]
    fn a_cold_sample_is_bounded_and_forgotten() {
        // The first verification on a fresh server took ten steps. It counts as at most two
        // (two rows one by one), and while it stands a full-acceptance controller under
        // checkpoint rollback does not draft — so it would never be measured again.
        let mut cost = CostModel::with_fast_window(0).warmed();
        cost.observe(1, 0.020);
        cost.observe(2, 0.200);
        assert!((cost.cost(2) - 0.040).abs() < 1e-12);
        cost.observe_checkpoint(0.004);
        let mut c = Controller::new(4).decided();
        for _ in 0..20 {
            c.shadow = Some((0, 1));
            c.resolve_shadow(0, 1);
        }
        assert_eq!(c.choose(4, 0, &cost), 0);
        // After FORGET_AFTER one-row steps the sample is gone: priced by the prior, it pays.
        for _ in 0..FORGET_AFTER {
            cost.observe(1, 0.020);
        }
        assert!((cost.cost(2) - 0.020 * (1.0 + UNMEASURED_SLOPE)).abs() < 1e-12);
        assert!(c.choose(4, 0, &cost) > 0);
        // The same for a cold first checkpoint (five steps: no draft of four pays under it).
        cost.observe(2, 0.021);
        cost.observe(3, 0.022);
        cost.observe(5, 0.024);
        cost.observe_checkpoint(0.100);
        assert_eq!(c.choose(4, 0, &cost), 0);
        for _ in 0..FORGET_AFTER {
            cost.observe(1, 0.020);
        }
        assert_eq!(cost.checkpoint_cost(), 0.0);
        assert!(c.choose(4, 0, &cost) > 0);
    }

    #[test]
    fn redecode_rollback_is_counted() {
        // This host's shape: 2 rows cost 1.1 steps, 3 rows 1.2; a redecode costs about a step.
        let fast = linear_cost(9, 0.022, 0.1);
        let mut ckpt = CostModel::with_fast_window(0).warmed();
        for w in 1..=9 {
            ckpt.observe(w, 0.022 * (1.0 + 0.1 * (w as f64 - 1.0)));
            ckpt.observe_redecode(w, 0.020 * (1.0 + 0.1 * (w as f64 - 1.0)));
        }
        ckpt.observe_checkpoint(0.001);
        assert!(!fast.needs_checkpoint(8) && ckpt.needs_checkpoint(1));
        let mut c = Controller::new(8);
        for _ in 0..50 {
            c.observe(1, 1); // the first position is accepted half the time
            c.observe(1, 0);
        }
        // Fast rollback: short drafts pay (~1.5 tokens for 1.1 steps).
        assert!(c.choose(8, 0, &fast) >= 1);
        // Checkpoint: half the rounds redecode a step as well — plain decoding is faster.
        assert_eq!(c.choose(8, 0, &ckpt), 0);
        // At high acceptance the redecode is rare and drafting pays again.
        let mut c = Controller::new(8);
        for _ in 0..50 {
            c.observe(8, 8);
        }
        assert!(c.choose(8, 0, &ckpt) >= 6);
    }

    #[test]
    fn the_first_sample_of_each_cost_is_dropped() {
        // A fresh process: the first 2-row decode faults its buffers in and takes two steps.
        let mut cost = CostModel::default();
        cost.observe(1, 0.020);
        cost.observe(2, 0.040);
        assert!((cost.cost(2) / cost.cost(1) - (1.0 + UNMEASURED_SLOPE)).abs() < 1e-9);
        cost.observe(2, 0.021);
        assert!((cost.cost(2) / cost.cost(1) - 1.05).abs() < 1e-9);
        // The same for the checkpoint and the fast rollback.
        cost.observe_checkpoint(0.060);
        assert_eq!(cost.checkpoint_cost(), 0.0);
        cost.observe_checkpoint(0.002);
        assert!((cost.checkpoint_cost() - 0.002).abs() < 1e-9);
        cost.observe_fast_rollback(1, 0.020);
        assert_eq!(cost.fast_rollback_cost(1), 0.0);
        cost.observe_fast_rollback(2, 0.001);
        assert!((cost.fast_rollback_cost(2) - 0.001).abs() < 1e-9);
    }

    #[test]
    fn a_width_seen_once_or_twice_is_repriced_sooner() {
        let mut cost = CostModel::default().warmed();
        cost.observe(1, 0.020);
        cost.observe(2, 0.040); // a slow sample: two rows at two steps
        cost.observe(4, 0.024);
        for _ in 0..3 {
            cost.observe(4, 0.024);
        }
        for _ in 0..FORGET_FEW_AFTER {
            cost.observe(1, 0.020);
        }
        // Two rows are priced from their neighbours again; four rows (four samples) are kept.
        let c2 = cost.cost(2) / cost.cost(1);
        assert!(c2 < 1.2, "{c2}");
        assert!((cost.cost(4) / cost.cost(1) - 1.2).abs() < 1e-6);
    }

    #[test]
    fn widths_that_disagree_are_pooled_by_their_samples() {
        // Two rows once measured high (1.4 steps) and not used since; four rows measured five
        // times at 1.2. A running maximum priced four rows at 1.44 steps for good.
        let mut cost = CostModel::default().warmed();
        cost.observe(1, 0.020);
        cost.observe(2, 0.028);
        for _ in 0..5 {
            cost.observe(4, 0.024);
        }
        let (c2, c4) = (cost.cost(2) / cost.cost(1), cost.cost(4) / cost.cost(1));
        assert!(c4 < 1.3, "{c4}");
        assert!(c2 < c4 && c2 > 1.0, "{c2}");
        // Agreeing widths are left as measured.
        cost.observe(2, 0.021);
        for _ in 0..10 {
            cost.observe(2, 0.021);
        }
        assert!((cost.cost(4) / cost.cost(1) - 1.2).abs() < 1e-6);
    }

    #[test]
    fn fast_rollback_is_priced_per_kept_row() {
        // 2 rows cost 1.1 steps: at 50 % acceptance a one-token draft pays (1.5 tokens for
        // 1.1 steps) while rolling back is free…
        let mut cost = linear_cost(9, 0.020, 0.1);
        let mut c = Controller::new(8);
        for _ in 0..50 {
            c.observe(1, 1);
            c.observe(1, 0);
        }
        assert!(c.choose(8, 0, &cost) >= 1);
        // …not when a rollback costs a step per kept row: half the rounds pay it.
        cost.observe_fast_rollback(1, 0.020);
        assert_eq!(c.choose(8, 0, &cost), 0);
        // A measurement not renewed is forgotten like the others.
        for _ in 0..FORGET_AFTER {
            cost.observe(1, 0.020);
        }
        assert!(c.choose(8, 0, &cost) >= 1);
    }

    #[test]
    fn expensive_verification_discourages_drafting() {
        // Each extra row costs a full step: speculation cannot pay at 50% acceptance.
        let cost = linear_cost(9, 0.040, 1.0);
        let c = Controller::new(8).decided();
        assert_eq!(c.choose(8, 0, &cost), 0);
    }

    #[test]
    fn the_first_decision_drafts() {
        // Verification costs a full step per row: the estimates alone would never draft.
        let cost = linear_cost(9, 0.040, 1.0);
        // A cheap drafter's first draft is verified, at least n_min long…
        let mut c = Controller::new(8);
        assert_eq!(c.choose(8, 0, &cost), 1);
        assert_eq!(c.choose(8, 4, &cost), 4);
        // …but never shorter than n_min: a draft of 3 is dropped, the next one counts.
        assert_eq!(c.choose(3, 4, &cost), 0);
        c.observe(4, 0);
        assert_eq!(c.choose(8, 4, &cost), 0, "then the estimates decide");
        // A model drafter is asked for n_min tokens at its first plan, and that draft is
        // verified; the second plan is priced.
        let mut c = Controller::new(8);
        assert_eq!(c.plan(8, 4, &cost), 4);
        assert_eq!(c.choose(4, 4, &cost), 4);
        c.observe_draft_time(0.001, 4);
        c.observe(4, 0);
        assert_eq!(c.plan(8, 4, &cost), 0);
        // A first plan whose draft came back short (p-min) is not repeated every round.
        let mut c = Controller::new(8);
        assert_eq!(c.plan(8, 4, &cost), 4);
        assert_eq!(c.choose(2, 4, &cost), 0);
        assert_eq!(c.plan(8, 4, &cost), 0);
        // Near the end of a request, with fewer than n_min tokens left, nothing is asked.
        let mut c = Controller::new(8);
        assert_eq!(c.plan(3, 4, &cost), 0);
        assert_eq!(c.plan(1, 0, &cost), 1);
    }

    #[test]
    fn a_probe_is_verified() {
        // After misses a model drafter is skipped; its probe's one-token draft is verified (a
        // probe that is thrown away measures nothing), the rounds in between are not.
        let cost = linear_cost(9, 0.010, 0.1);
        let mut c = Controller::new(8);
        c.observe_draft_time(0.001, 1);
        c.observe_draft_time(0.001, 1);
        for _ in 0..30 {
            c.observe(4, 0);
        }
        let mut probes = 0;
        for _ in 0..64 {
            let n = c.plan(8, 0, &cost);
            if n == 0 {
                continue;
            }
            probes += 1;
            assert_eq!(c.choose(n, 0, &cost), 1);
            c.observe(1, 0);
            assert_eq!(c.choose(1, 0, &cost), 0, "only the probe's round");
        }
        assert!(probes >= 2, "{probes} probes");
    }

    #[test]
    fn starts_short_and_stops_after_a_few_misses() {
        let cost = CostModel::default().warmed();
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
        let cost = linear_cost(9, 0.040, 0.15);
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
    fn one_slow_step_does_not_make_drafting_look_cheap() {
        // As on the trained pair: a 0.5 ms step, two rows priced by the prior, a draft model
        // at 0.2 ms a token, half its drafts accepted — drafting does not pay.
        let mut cost = half_ms_step();
        let mut c = Controller::new(4).decided();
        for _ in 0..20 {
            c.observe(1, 0);
            c.observe(1, 1);
        }
        assert!((c.expected_tokens(1) - 1.54).abs() < 0.01);
        c.observe_draft_time(0.010, 1); // the catch-up over the prompt: not counted
        c.observe_draft_time(0.0002, 1);
        assert_eq!(c.plan(4, 0, &cost), 0);
        // One preempted step (four times the others) counts as 1.5 steps: the estimate moves
        // by a tenth, not by 60 % (which priced plain decoding below a one-token draft).
        cost.observe(1, 0.002);
        assert!((cost.step_secs().unwrap_or(0.0) - 0.00055).abs() < 1e-12);
        assert_eq!(c.plan(4, 0, &cost), 0);
        // A host that really got slower is followed within a few steps.
        for _ in 0..12 {
            cost.observe(1, 0.001);
        }
        assert!(cost.step_secs().unwrap_or(0.0) > 0.00095);
    }

    #[test]
    fn early_misses_do_not_end_a_model_drafter_for_good() {
        // A 0.5 ms step, two rows priced by the prior, a draft model at 0.2 ms a token.
        let cost = half_ms_step();
        let mut c = Controller::new(8).decided();
        c.observe_draft_time(0.010, 1);
        c.observe_draft_time(0.0002, 1);
        // The request's first token missed, the next two hit: 0.59 by the running mean, which
        // alone does not pay for a one-token draft (1.59 tokens in 0.8 ms against 2 in 1 ms).
        c.observe(1, 0);
        c.observe(1, 1);
        c.observe(1, 1);
        assert!((c.estimate(0) - 0.5875).abs() < 1e-9);
        let n = c.plan(8, 0, &cost);
        assert!(n > 0, "three observations are not the evidence to stop");
        // The draft it asked for is verified: priced alike, not thrown away.
        assert!(c.choose(n, 0, &cost) > 0);
        // At half acceptance the optimism is spent after EXPLORE_OBS observations.
        for _ in 0..20 {
            c.observe(1, 0);
            c.observe(1, 1);
        }
        assert_eq!(c.plan(8, 0, &cost), 0);
    }

    #[test]
    fn a_batch_cheaper_than_the_step_lowers_it() {
        let mut cost = CostModel::default().warmed();
        for _ in 0..5 {
            cost.observe(1, 0.001);
        }
        cost.observe(2, 0.0013);
        assert_eq!(cost.step_secs(), Some(0.001));
        // Two rows in 0.6 ms: one row costs no more than that.
        cost.observe(2, 0.0006);
        assert_eq!(cost.step_secs(), Some(0.0006));
        assert!(cost.cost(1) <= 0.0006);
        assert!(cost.cost(2) >= cost.cost(1));
    }

    #[test]
    fn a_drafter_slower_than_the_target_is_not_asked() {
        let cost = linear_cost(9, 0.010, 0.1);
        let mut c = Controller::new(8);
        // Perfect acceptance, but each drafted token costs two target steps.
        for _ in 0..20 {
            c.observe(4, 4);
        }
        // The first round (a catch-up over the prompt) is not counted, the second is.
        c.observe_draft_time(5.0, 1);
        assert_eq!(c.draft_secs_per_token(), None);
        c.observe_draft_time(0.020, 1);
        for _ in 0..1000 {
            assert_eq!(
                c.plan(8, 0, &cost),
                0,
                "drafting cannot pay: no probes either"
            );
        }
        // A cheap draft is still used in full (the same estimates, no drafting cost).
        assert!(c.choose(8, 0, &cost) >= 6);
    }

    #[test]
    fn skipped_model_drafter_is_probed_with_backoff() {
        let cost = linear_cost(9, 0.010, 0.1);
        let mut c = Controller::new(8);
        c.observe_draft_time(0.001, 1);
        c.observe_draft_time(0.001, 1);
        for _ in 0..30 {
            c.observe(4, 0);
        }
        let probes: Vec<usize> = (0..400)
            .filter(|_| {
                let n = c.plan(8, 0, &cost);
                assert!(n <= 1, "after misses only one-token probes, got {n}");
                n == 1
            })
            .map(|_| 0)
            .collect();
        // 8, 16, 32, 64, 128, 128: six probes in 400 rounds, growing gaps.
        assert!((4..=8).contains(&probes.len()), "{} probes", probes.len());
        // Catch-ups that cost more than the budget delay the next probe: here each costs two
        // plain steps, so a probe needs ~67 skipped steps per catch-up.
        let mut c2 = Controller::new(8);
        c2.observe_draft_time(0.001, 1);
        c2.observe_draft_time(0.001, 1);
        for _ in 0..30 {
            c2.observe(4, 0);
        }
        let mut n_probes = 0;
        for _ in 0..400 {
            if c2.plan(8, 0, &cost) == 1 {
                n_probes += 1;
                c2.observe_draft_time(0.020, 1); // catch-up round
                c2.observe(1, 0);
            }
        }
        assert!((1..=6).contains(&n_probes), "{n_probes} probes");
        assert!(c2.catch_up_secs <= PROBE_BUDGET * c2.skipped_secs + 0.020 + 1e-9);
        // Once the text turns predictable, probes find it and drafting resumes.
        for _ in 0..10 {
            c.observe(1, 1);
        }
        assert!(c.plan(8, 0, &cost) >= 2);
    }

    #[test]
    fn no_probe_budget_accrues_before_a_step_is_measured() {
        // Nothing measured: the cost model prices in an arbitrary unit, not in seconds.
        let cost = CostModel::default();
        let mut c = Controller::new(8);
        c.observe_draft_time(0.001, 1);
        c.observe_draft_time(0.001, 1);
        for _ in 0..30 {
            c.observe(4, 0);
        }
        for _ in 0..400 {
            if c.plan(8, 0, &cost) == 1 {
                c.observe_draft_time(0.005, 1); // a catch-up round
                c.observe(1, 0);
            }
        }
        assert_eq!(c.skipped_secs, 0.0);
        assert!(c.catch_up_secs <= 0.005 + 1e-12, "{}", c.catch_up_secs);
    }

    #[test]
    fn a_probe_is_priced_by_the_rounds_it_must_catch_up_on() {
        // The trained pair's shape: a step 0.45 ms, a catch-up 0.02 ms per missed token. Over
        // 2000 rounds of a drafter that never drafts, catch-ups stay within the budget plus the
        // first probe (which had no price yet): probes that must feed hundreds of tokens wait.
        let cost = linear_cost(9, 0.00045, 0.1);
        let mut c = Controller::new(8);
        let mut missed = 0u32;
        let mut spent = 0.0;
        let mut probes = 0;
        for round in 0..2000 {
            let n = c.plan(8, 0, &cost);
            if n == 0 {
                missed += 1;
                continue;
            }
            let secs = 0.00015 + 0.00002 * missed as f64;
            if round > 0 {
                spent += secs;
                probes += 1;
            }
            missed = 0;
            c.observe_draft_time(secs, 0);
            c.observe(1, 0); // below p-min: nothing drafted
        }
        let budget = PROBE_BUDGET * 2000.0 * 0.00045;
        assert!(probes >= 2, "{probes} probes");
        assert!(
            spent <= budget + 0.00015 + 0.00002 * 16.0,
            "{spent} > {budget}"
        );
    }

    #[test]
    fn catch_ups_stay_within_the_budget_even_when_drafting_would_pay() {
        // The trained pair's shape: a 0.5 ms step; the draft model fed the 100-token prompt in
        // 2 ms (0.02 ms a token, 4 % of a step), which prices a catch-up before any probe.
        let cost = half_ms_step();
        let mut c = Controller::new(8).decided();
        c.observe_prefill(0.002, 100);
        c.observe_draft_time(0.0002, 1);
        c.observe_draft_time(0.0002, 1);
        for _ in 0..10 {
            c.observe(1, 0);
        }
        let (mut missed, mut spent, mut probes) = (0u32, 0.0, 0);
        for round in 0..600 {
            if round == 300 {
                // The text turns predictable: drafting would pay, after a catch-up over every
                // round missed since the last probe.
                for _ in 0..30 {
                    c.observe(1, 1);
                }
            }
            let n = c.plan(8, 0, &cost);
            if n == 0 {
                missed += 1;
                continue;
            }
            let secs = 0.0002 + 0.00002 * f64::from(missed);
            if missed > 0 {
                spent += secs;
                probes += 1;
            }
            missed = 0;
            c.observe_draft_time(secs, n);
            c.observe(n, if round >= 300 { n } else { 0 });
        }
        assert!(
            probes >= 2,
            "{probes} probes: the allowance pays for the early ones"
        );
        let budget = PROBE_BUDGET * 600.0 * 0.0005 + PROBE_ALLOWANCE * 0.0005;
        assert!(spent <= budget, "{spent} > {budget}");
    }

    #[test]
    fn shadow_drafts_recover_acceptance() {
        let mut c = Controller::new(4);
        for _ in 0..30 {
            c.observe(4, 0);
        }
        for _ in 0..30 {
            c.shadow = Some((0, 7));
            c.resolve_shadow(0, 7);
        }
        assert!(c.estimates()[0] > 0.9);
    }

    #[test]
    fn shadow_after_accepted_drafts_measures_the_next_position() {
        let mut c = Controller::new(4);
        // Position 1 starts unlucky: accepted position 0, then a miss, twice.
        c.observe(2, 1);
        c.observe(2, 1);
        let before = c.estimates()[1];
        // One-token drafts, all accepted, with the drafter's second token in the shadow: the
        // target's next token matches it every time.
        for _ in 0..20 {
            c.observe(1, 1);
            c.shadow = Some((1, 5));
            c.resolve_shadow(1, 5);
        }
        assert!(c.estimates()[1] > before + 0.3, "{:?}", c.estimates());
        // A shadow that does not sit right after the accepted drafts says nothing.
        let e = c.estimates()[2];
        c.shadow = Some((2, 5));
        c.resolve_shadow(1, 9);
        assert_eq!(c.estimates()[2], e);
        assert!(c.shadow.is_none());
    }
}
