//! Gated DeltaNet layer (docs/qwen35.md §3.5): the input projections (per architecture, see
//! [`GdnInput`]), the conv + recurrence in the sequence memory (which records what a rollback
//! needs), then the gated RMSNorm and output projection.

use super::{gather, scatter, SeqRows};
use crate::config::SsmConfig;
use crate::weights::Loader;
use crate::ModelError;
use specd_memory::Memory;
use specd_ops::activation::mul_silu_inplace;
use specd_ops::delta_net::{GdnGates, GdnShape};
use specd_ops::norm::rms_norm_inplace;
use specd_ops::scratch::Buf;
use specd_ops::{matmul, matmul_many, Weight};

/// A layer's input projections, in the layout the recurrence reads: per row the conv input
/// `q | k | v` (key heads, key heads, value heads), the output gate `z` (value heads), and per
/// value head the β and α logits. Architectures store these projections differently (qwen35:
/// one matrix each; qwen3next: fused, grouped by key head).
pub struct GdnProjected {
    /// `n × conv_dim`.
    pub mixed: Buf,
    /// `n × n_v·d_v`.
    pub z: Buf,
    /// `n × n_v`.
    pub beta: Buf,
    /// `n × n_v`.
    pub alpha: Buf,
}

/// Computes a layer's [`GdnProjected`] from its normed input rows (`n × n_embd`).
pub trait GdnInput: Send + Sync {
    fn project(&self, a: &[f32], n: usize) -> Result<GdnProjected, ModelError>;
}

/// qwen35's input projections: `attn_qkv`, `attn_gate`, `ssm_beta`, `ssm_alpha`.
pub struct SplitInput {
    pub qkv: Weight,
    pub gate: Weight,
    pub beta: Weight,
    pub alpha: Weight,
}

impl SplitInput {
    pub fn load(l: &Loader, i: usize, n_embd: usize, s: &SsmConfig) -> Result<Self, ModelError> {
        let p = |x: &str| format!("blk.{i}.{x}");
        let nv = s.n_v_heads;
        Ok(SplitInput {
            qkv: l.matrix(&p("attn_qkv.weight"), s.conv_dim(), n_embd)?,
            gate: l.matrix(&p("attn_gate.weight"), s.inner, n_embd)?,
            beta: l.matrix(&p("ssm_beta.weight"), nv, n_embd)?,
            alpha: l.matrix(&p("ssm_alpha.weight"), nv, n_embd)?,
        })
    }
}

impl GdnInput for SplitInput {
    fn project(&self, a: &[f32], n: usize) -> Result<GdnProjected, ModelError> {
        let mut o = GdnProjected {
            mixed: Buf::output(n * self.qkv.rows),
            z: Buf::output(n * self.gate.rows),
            beta: Buf::output(n * self.beta.rows),
            alpha: Buf::output(n * self.alpha.rows),
        };
        matmul_many(
            a,
            n,
            &[&self.qkv, &self.gate, &self.beta, &self.alpha],
            &mut [&mut o.mixed, &mut o.z, &mut o.beta, &mut o.alpha],
        )?;
        Ok(o)
    }
}

/// Weights of one Gated DeltaNet layer.
pub struct GatedDeltaNet {
    pub input: Box<dyn GdnInput>,
    /// `conv_dim × K`.
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// −exp(A_log).
    pub a: Vec<f32>,
    /// Gated-norm weight, `d_v`.
    pub norm: Vec<f32>,
    pub out: Weight,
    pub shape: GdnShape,
    pub eps: f32,
}

impl GatedDeltaNet {
    /// Loads `blk.{i}` GDN tensors (qwen35's layout).
    pub fn load(
        l: &Loader,
        i: usize,
        n_embd: usize,
        s: &SsmConfig,
        eps: f32,
    ) -> Result<Self, ModelError> {
        let input = SplitInput::load(l, i, n_embd, s)?;
        Self::load_with(l, i, n_embd, s, eps, Box::new(input))
    }

    /// Loads `blk.{i}`'s conv, gates, norm and output projection around the input projections
    /// `input`.
    pub fn load_with(
        l: &Loader,
        i: usize,
        n_embd: usize,
        s: &SsmConfig,
        eps: f32,
        input: Box<dyn GdnInput>,
    ) -> Result<Self, ModelError> {
        let p = |x: &str| format!("blk.{i}.{x}");
        let cd = s.conv_dim();
        let nv = s.n_v_heads;
        Ok(GatedDeltaNet {
            input,
            conv: l.tensor_f32(&p("ssm_conv1d.weight"), &[s.conv_kernel as u64, cd as u64])?,
            dt_bias: l.vector(&p("ssm_dt.bias"), nv)?,
            a: l.vector(&p("ssm_a"), nv)?,
            norm: l.vector(&p("ssm_norm.weight"), s.d_v())?,
            out: l.matrix(&p("ssm_out.weight"), n_embd, s.inner)?,
            shape: s.gdn_shape(),
            eps,
        })
    }

    /// Runs the layer for all rows (`a`: `n × n_embd`, normed) using recurrent layer `rec_layer`
    /// of each sequence's memory. Returns `n × n_embd`.
    pub fn forward(
        &self,
        a: &[f32],
        n: usize,
        groups: &[SeqRows],
        mem: &mut Memory,
        rec_layer: usize,
    ) -> Result<Buf, ModelError> {
        let (nv, dv) = (self.shape.n_v, self.shape.d_v);
        let inner = nv * dv;
        let cd = 2 * self.shape.n_k * self.shape.d_k + inner;
        let GdnProjected {
            mixed,
            z,
            beta: b,
            alpha: al,
        } = self.input.project(a, n)?;
        let gates = GdnGates {
            dt_bias: &self.dt_bias,
            a: &self.a,
            eps: self.eps,
        };
        // Every row belongs to one group: the scatters write all of `y`.
        let mut y = Buf::output(n * inner);
        for g in groups {
            let ms = gather(&mixed, cd, &g.rows);
            let als = gather(&al, nv, &g.rows);
            let bs = gather(&b, nv, &g.rows);
            let o = mem
                .gdn_layer(g.seq, rec_layer)?
                .forward(&self.conv, &ms, &als, &bs, gates);
            scatter(&o, inner, &g.rows, &mut y);
        }
        // Gated RMSNorm per value head: rms(o_j; w) ⊙ silu(z_j), rows split over the threads.
        specd_ops::parallel::for_each_piece_mut(&mut y, inner, |r, yr| {
            for yh in yr.chunks_exact_mut(dv) {
                rms_norm_inplace(yh, &self.norm, self.eps);
            }
            mul_silu_inplace(yr, &z[r * inner..(r + 1) * inner]);
        });
        let mut out = Buf::output(n * self.out.rows);
        matmul(&y, n, &self.out, &mut out)?;
        Ok(out)
    }
}
