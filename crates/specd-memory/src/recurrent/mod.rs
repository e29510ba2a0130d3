//! Recurrent (Gated DeltaNet) state of one sequence: a conv window and a delta-rule state per
//! layer, each double-buffered. A batch reads the *pre* buffer and writes the *post* buffer, so the
//! state before the batch survives untouched at no cost — the starting point of every rollback.

pub mod rollback;

use crate::MemoryLayout;
use rollback::{LayerRecord, RollbackKind};
use specd_ops::conv::{causal_conv_silu, window};
use specd_ops::delta_net::{gated_delta_rule, prepare_inputs, GdnGates};
use specd_ops::scratch::Buf;

/// One recurrent layer of one sequence.
#[derive(Debug, Clone)]
pub struct RecLayer {
    conv: [Vec<f32>; 2],
    ssm: [Vec<f32>; 2],
    /// Index of the buffer holding the current state.
    cur: usize,
}

impl RecLayer {
    /// Zeroed state (a new sequence).
    pub fn new(layout: &MemoryLayout) -> Self {
        let c = (layout.conv_kernel - 1) * layout.conv_channels;
        let s = layout.gdn.state_len();
        RecLayer {
            conv: [vec![0.0; c], vec![0.0; c]],
            ssm: [vec![0.0; s], vec![0.0; s]],
            cur: 0,
        }
    }
    /// Current conv and delta-rule state.
    pub fn current(&self) -> (&[f32], &[f32]) {
        (&self.conv[self.cur], &self.ssm[self.cur])
    }
    /// Overwrites the current state (checkpoint restore).
    pub fn set_current(&mut self, conv: &[f32], ssm: &[f32]) {
        self.conv[self.cur].copy_from_slice(conv);
        self.ssm[self.cur].copy_from_slice(ssm);
    }
    /// Makes the other buffer the destination of the next batch: after this, `pre` is the state
    /// before the batch and `post` (now current) receives its result.
    pub(crate) fn flip(&mut self) {
        self.cur ^= 1;
    }
    /// (pre conv, pre ssm, post conv, post ssm).
    pub(crate) fn split(&mut self) -> (&[f32], &[f32], &mut [f32], &mut [f32]) {
        let (c0, c1) = self.conv.split_at_mut(1);
        let (s0, s1) = self.ssm.split_at_mut(1);
        if self.cur == 1 {
            (&c0[0], &s0[0], &mut c1[0], &mut s1[0])
        } else {
            (&c1[0], &s1[0], &mut c0[0], &mut s0[0])
        }
    }
    /// Bytes of both buffers.
    pub fn bytes(&self) -> usize {
        (self.conv[0].len() + self.ssm[0].len()) * 8
    }
}

/// Access to one recurrent layer of one sequence during a batch, handed to the model.
pub struct GdnLayerIo<'a> {
    pub(crate) layer: &'a mut RecLayer,
    pub(crate) record: Option<&'a mut LayerRecord>,
    /// Tokens of the batch before the rollback window (their state is not recorded).
    pub(crate) split: usize,
    pub(crate) layout: MemoryLayout,
    pub(crate) mode: RollbackKind,
}

impl GdnLayerIo<'_> {
    /// Runs conv + gated delta rule for this sequence's `T` rows and returns the per-token output
    /// `T × n_v × d_v`. `mixed` is `T × conv_channels` (the `attn_qkv` projection), `alpha` and
    /// `beta_logits` are `T × n_v`, `conv_w` is `conv_channels × K`. Records what a later rollback
    /// needs, per the configured mode.
    pub fn forward(
        self,
        conv_w: &[f32],
        mixed: &[f32],
        alpha: &[f32],
        beta_logits: &[f32],
        gates: GdnGates<'_>,
    ) -> Buf {
        let lay = self.layout;
        let shape = lay.gdn;
        let (k, c) = (lay.conv_kernel, lay.conv_channels);
        let hist = k - 1;
        let t_len = mixed.len() / c;
        let (pre_conv, pre_ssm, post_conv, post_ssm) = self.layer.split();
        let mut conv_out = Buf::output(mixed.len());
        causal_conv_silu(pre_conv, mixed, conv_w, k, c, &mut conv_out, post_conv);
        let inputs = prepare_inputs(shape, &conv_out, alpha, beta_logits, gates);
        let mut out = Buf::output(t_len * shape.n_v * shape.d_v);
        let Some(rec) = self.record else {
            gated_delta_rule(
                shape,
                pre_ssm,
                post_ssm,
                inputs.range(shape, 0, t_len),
                &mut out,
                None,
            );
            return out;
        };
        let s = self.split;
        let out_v = shape.n_v * shape.d_v;
        // The rollback base: the pre buffer itself, or (for a batch longer than the window) a
        // copy of the state after the first `s` tokens.
        let base = if s > 0 {
            let (o1, o2) = out.split_at_mut(s * out_v);
            gated_delta_rule(
                shape,
                pre_ssm,
                post_ssm,
                inputs.range(shape, 0, s),
                o1,
                None,
            );
            let mut bconv = vec![0f32; hist * c];
            window(pre_conv, mixed, hist, c, s, &mut bconv);
            let bssm = post_ssm.to_vec();
            let snaps = rec.snapshot_target(self.mode, t_len - s, &lay);
            gated_delta_rule(
                shape,
                &bssm,
                post_ssm,
                inputs.range(shape, s, t_len),
                o2,
                snaps,
            );
            Some((bconv, bssm))
        } else {
            let snaps = rec.snapshot_target(self.mode, t_len, &lay);
            gated_delta_rule(
                shape,
                pre_ssm,
                post_ssm,
                inputs.range(shape, 0, t_len),
                &mut out,
                snaps,
            );
            None
        };
        // The window's inputs: all of them (moved, not copied) unless tokens came before it.
        let kept = if s == 0 {
            inputs
        } else {
            inputs.range_owned(shape, s, t_len)
        };
        rec.finish(self.mode, &lay, base, pre_conv, &mixed[s * c..], kept);
        out
    }
}
