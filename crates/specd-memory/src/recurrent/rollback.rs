//! Rolling recurrent state back by the last `n` tokens of a batch **without running the model**.
//!
//! Two mechanisms (docs/speculative.md §4), selectable so they can be measured against each other:
//!
//! * [`RollbackKind::Replay`] (default): the batch cached, per token and layer, the inputs of the
//!   recurrence (conv inputs; q, k, v, decay, beta). Rolling back to `keep` tokens re-runs only the
//!   recurrence from the untouched pre-batch state over the first `keep` cached tokens — no
//!   weights are read. ~12 K floats per token per layer at 0.8B shape.
//! * [`RollbackKind::Snapshot`]: the batch stored the full state after every token; rolling back
//!   copies snapshot `keep − 1`. Costs a full state (~1 MiB per layer at 0.8B) per token.
//!
//! Both give state bit-identical to never having decoded the rejected tokens, because the replay
//! runs the same kernel in the same order and a snapshot is that very state.
//! [`RollbackKind::Checkpoint`] records nothing (checkpoint-and-redecode only, the baseline).

use crate::recurrent::RecLayer;
use crate::MemoryLayout;
use specd_ops::conv::window;
use specd_ops::delta_net::{gated_delta_rule, GdnInputsOwned};

/// How rejected tokens are taken back out of recurrent state: the one name for it, from the
/// command line (`--spec-rollback`) to the records the memory keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum RollbackKind {
    /// Re-run only the recurrence over the batch's cached per-token inputs (default).
    #[default]
    Replay,
    /// Copy a per-token state snapshot.
    Snapshot,
    /// Keep no records: a checkpoint is taken before verifying and, on a partial accept,
    /// restored and the accepted tokens decoded again through the whole model (llama.cpp's way;
    /// the baseline).
    Checkpoint,
}

impl RollbackKind {
    /// Parses `replay|snapshot|checkpoint` (`fast`: the earlier name of `replay`).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "replay" | "fast" => RollbackKind::Replay,
            "snapshot" => RollbackKind::Snapshot,
            "checkpoint" => RollbackKind::Checkpoint,
            _ => return None,
        })
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            RollbackKind::Replay => "replay",
            RollbackKind::Snapshot => "snapshot",
            RollbackKind::Checkpoint => "checkpoint",
        }
    }

    /// Bytes a record needs per token and recurrent layer.
    pub fn bytes_per_token_layer(self, lay: &MemoryLayout) -> usize {
        let g = lay.gdn;
        let hist = lay.conv_kernel - 1;
        match self {
            RollbackKind::Replay => {
                4 * (lay.conv_channels + 2 * g.n_k * g.d_k + g.n_v * g.d_v + 2 * g.n_v)
            }
            RollbackKind::Snapshot => 4 * (hist * lay.conv_channels + g.state_len()),
            RollbackKind::Checkpoint => 0,
        }
    }
}

/// What one layer kept of the last batch's rollback window.
#[derive(Debug, Default)]
pub struct LayerRecord {
    /// State at the start of the window when the batch was longer than the window (otherwise the
    /// start is the layer's untouched pre-batch buffer).
    base: Option<(Vec<f32>, Vec<f32>)>,
    /// Replay: conv inputs of the window tokens (`n × conv_channels`).
    mixed: Vec<f32>,
    /// Replay: recurrence inputs of the window tokens.
    inputs: GdnInputsOwned,
    /// Snapshot: conv state after each window token (`n × (K−1)·conv_channels`).
    conv_snaps: Vec<f32>,
    /// Snapshot: delta-rule state after each window token (`n × state_len`).
    ssm_snaps: Vec<f32>,
}

impl LayerRecord {
    /// Where the kernel should write per-token snapshots (Snapshot mode only).
    pub(crate) fn snapshot_target(
        &mut self,
        mode: RollbackKind,
        n: usize,
        lay: &MemoryLayout,
    ) -> Option<(&mut [f32], usize)> {
        if mode != RollbackKind::Snapshot {
            return None;
        }
        self.ssm_snaps.resize(n * lay.gdn.state_len(), 0.0);
        Some((&mut self.ssm_snaps, 0))
    }

    /// Completes the record after the layer ran: `base` (if the batch was longer than the
    /// window), the pre-batch conv state, and the window's conv inputs and recurrence inputs.
    pub(crate) fn finish(
        &mut self,
        mode: RollbackKind,
        lay: &MemoryLayout,
        base: Option<(Vec<f32>, Vec<f32>)>,
        pre_conv: &[f32],
        mixed: &[f32],
        inputs: GdnInputsOwned,
    ) {
        let (hist, c) = (lay.conv_kernel - 1, lay.conv_channels);
        let n = mixed.len() / c;
        match mode {
            RollbackKind::Replay => {
                // Into the record's own buffer: no allocation once it has held a batch this wide.
                self.mixed.clear();
                self.mixed.extend_from_slice(mixed);
                self.inputs = inputs;
            }
            RollbackKind::Snapshot => {
                let start = base.as_ref().map_or(pre_conv, |b| &b.0);
                self.conv_snaps.resize(n * hist * c, 0.0);
                for t in 0..n {
                    window(
                        start,
                        mixed,
                        hist,
                        c,
                        t + 1,
                        &mut self.conv_snaps[t * hist * c..][..hist * c],
                    );
                }
            }
            RollbackKind::Checkpoint => {}
        }
        self.base = base;
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let b = self
            .base
            .as_ref()
            .map_or(0, |(c, s)| (c.len() + s.len()) * 4);
        b + self.mixed.len() * 4
            + self.inputs.bytes()
            + (self.conv_snaps.len() + self.ssm_snaps.len()) * 4
    }

    /// Rolls `layer` back so that only the first `keep` window tokens count (`keep` < tokens in
    /// the window), and truncates this record to them.
    pub(crate) fn rollback(
        &mut self,
        layer: &mut RecLayer,
        keep: usize,
        mode: RollbackKind,
        lay: &MemoryLayout,
    ) {
        let (hist, c) = (lay.conv_kernel - 1, lay.conv_channels);
        let shape = lay.gdn;
        if keep == 0 {
            match self.base.take() {
                Some((bc, bs)) => layer.set_current(&bc, &bs),
                // The untouched pre-batch buffer becomes current again: nothing to compute.
                None => layer.flip(),
            }
            *self = LayerRecord::default();
            return;
        }
        let base = self.base.take();
        {
            let (pre_conv, pre_ssm, post_conv, post_ssm) = layer.split();
            let (bconv, bssm): (&[f32], &[f32]) = match &base {
                Some((bc, bs)) => (bc, bs),
                None => (pre_conv, pre_ssm),
            };
            match mode {
                RollbackKind::Replay => {
                    gated_delta_rule(
                        shape,
                        bssm,
                        post_ssm,
                        self.inputs.range(shape, 0, keep),
                        &mut [],
                        None,
                    );
                    window(bconv, &self.mixed, hist, c, keep, post_conv);
                    self.mixed.truncate(keep * c);
                    self.inputs.truncate(shape, keep);
                }
                RollbackKind::Snapshot => {
                    let sl = shape.state_len();
                    post_ssm.copy_from_slice(&self.ssm_snaps[(keep - 1) * sl..keep * sl]);
                    post_conv
                        .copy_from_slice(&self.conv_snaps[(keep - 1) * hist * c..keep * hist * c]);
                    self.ssm_snaps.truncate(keep * sl);
                    self.conv_snaps.truncate(keep * hist * c);
                }
                RollbackKind::Checkpoint => {}
            }
        }
        self.base = base;
    }
}

/// The rollback window of one sequence's last batch, over all its recurrent layers.
#[derive(Debug)]
pub struct BatchRecord {
    /// Tokens in the window (the last `n` tokens of the batch).
    pub n: usize,
    /// Tokens of the batch before the window.
    pub split: usize,
    pub layers: Vec<LayerRecord>,
}

impl BatchRecord {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.bytes()).sum()
    }
}
