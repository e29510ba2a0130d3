//! `qwen3next`: Qwen3-Next-80B-A3B and Qwen3-Coder-Next. The Qwen3.5 family's hybrid trunk
//! (Gated DeltaNet and gated attention, `attn_norm` / `post_attention_norm`, [`HybridTrunk`])
//! with qwen35moe's MoE FFN in every block and the same hyper-parameter keys
//! ([`Qwen35MoeConfig`]); what differs, as llama.cpp computes it (`src/models/qwen3next.cpp`):
//!
//! * NEOX rotary over `rope.dimension_count` dimensions (a quarter of the head), not IMROPE;
//! * the DeltaNet's value heads are grouped by key head: value head `j` reads key head
//!   `j / (n_v / n_k)` (qwen35's converter reorders them so that it reads `j % n_k`);
//! * the DeltaNet's β and α logits come from one matrix `ssm_ba`, grouped by key head: for key
//!   head `g`, its `r = n_v / n_k` β rows, then its `r` α rows;
//! * older files (earlier converters) fuse q, k, v and the output gate z into one `ssm_in`,
//!   grouped by key head the same way: `q (d_k) | k (d_k) | v (r·d_v) | z (r·d_v)` per key
//!   head; newer ones store qwen35's `attn_qkv` + `attn_gate`.
//!
//! The MTP block (`blk.{n_layer}`, where the file has one) is qwen35moe's: gated attention and
//! the MoE FFN.

use super::qwen35::{load_mtp, HybridTrunk};
use super::qwen35moe::Qwen35MoeConfig;
use super::Trunk;
use crate::config::{ModelConfig, SsmConfig};
use crate::layers::gdn::{GatedDeltaNet, GdnInput, GdnProjected};
use crate::layers::moe::MoeFfn;
use crate::weights::Loader;
use crate::ModelError;
use specd_gguf::GgufFile;
use specd_ops::rope::RopeMode;
use specd_ops::scratch::Buf;
use specd_ops::{matmul_many, Weight};

pub fn rope_mode(_: &GgufFile, _: &str) -> Result<RopeMode, ModelError> {
    Ok(RopeMode::Neox)
}

pub fn load(l: &Loader, c: &ModelConfig) -> Result<Box<dyn Trunk>, ModelError> {
    let mut own = Qwen35MoeConfig::from_gguf(l.g, c)?;
    own.hybrid.ssm.tiled = false;
    let ssm = own.hybrid.ssm;
    let gdn = |i| {
        let input = NextInput::load(l, i, c.n_embd, &ssm)?;
        GatedDeltaNet::load_with(l, i, c.n_embd, &ssm, c.eps, Box::new(input))
    };
    let mut t = HybridTrunk::load(l, c, &own.hybrid, gdn, |i| {
        MoeFfn::load(l, i, c.n_embd, &own.moe)
    })?;
    t.mtp = load_mtp(l, c, |i| {
        Ok(Box::new(MoeFfn::load(l, i, c.n_embd, &own.moe)?))
    })?;
    Ok(Box::new(t))
}

/// How a file stores the DeltaNet's q, k, v and z projections.
enum Qkvz {
    /// `attn_qkv` (`q | k | v`, already in the recurrence's layout) and `attn_gate` (z).
    Split { qkv: Weight, gate: Weight },
    /// `ssm_in`, grouped by key head.
    Fused(Weight),
}

/// qwen3next's DeltaNet input projections, reordered into [`GdnProjected`]'s layout.
struct NextInput {
    qkvz: Qkvz,
    /// `ssm_ba`: `2·n_v × n_embd`, grouped by key head.
    ba: Weight,
    ssm: SsmConfig,
}

impl NextInput {
    fn load(l: &Loader, i: usize, n_embd: usize, s: &SsmConfig) -> Result<Self, ModelError> {
        let p = |x: &str| format!("blk.{i}.{x}");
        let qkv = p("attn_qkv.weight");
        let qkvz = if l.has(&qkv) || !l.has(&p("ssm_in.weight")) {
            Qkvz::Split {
                qkv: l.matrix(&qkv, s.conv_dim(), n_embd)?,
                gate: l.matrix(&p("attn_gate.weight"), s.inner, n_embd)?,
            }
        } else {
            Qkvz::Fused(l.matrix(&p("ssm_in.weight"), s.conv_dim() + s.inner, n_embd)?)
        };
        Ok(NextInput {
            qkvz,
            ba: l.matrix(&p("ssm_ba.weight"), 2 * s.n_v_heads, n_embd)?,
            ssm: *s,
        })
    }
}

impl GdnInput for NextInput {
    fn project(&self, a: &[f32], n: usize) -> Result<GdnProjected, ModelError> {
        let s = &self.ssm;
        let (nk, nv, dk) = (s.n_group, s.n_v_heads, s.d_state);
        // Value heads (and their β, α) per key head.
        let r = nv / nk;
        let (cd, inner) = (s.conv_dim(), s.inner);
        let mut ba = Buf::output(n * 2 * nv);
        let (mixed, z) = match &self.qkvz {
            Qkvz::Split { qkv, gate } => {
                let mut mixed = Buf::output(n * cd);
                let mut z = Buf::output(n * inner);
                matmul_many(
                    a,
                    n,
                    &[qkv, gate, &self.ba],
                    &mut [&mut mixed, &mut z, &mut ba],
                )?;
                (mixed, z)
            }
            Qkvz::Fused(w) => {
                let mut qkvz = Buf::output(n * (cd + inner));
                matmul_many(a, n, &[w, &self.ba], &mut [&mut qkvz, &mut ba])?;
                // The copies below fill every element of both.
                let mut mixed = Buf::output(n * cd);
                let mut z = Buf::output(n * inner);
                // Per key head g: q_g, k_g, its r value heads, their r gates.
                let vg = r * s.d_v();
                let group = 2 * dk + 2 * vg;
                for (row, (m, zr)) in qkvz
                    .chunks_exact(cd + inner)
                    .zip(mixed.chunks_exact_mut(cd).zip(z.chunks_exact_mut(inner)))
                {
                    for (g, src) in row.chunks_exact(group).enumerate() {
                        m[g * dk..][..dk].copy_from_slice(&src[..dk]);
                        m[nk * dk + g * dk..][..dk].copy_from_slice(&src[dk..2 * dk]);
                        m[2 * nk * dk + g * vg..][..vg].copy_from_slice(&src[2 * dk..2 * dk + vg]);
                        zr[g * vg..][..vg].copy_from_slice(&src[2 * dk + vg..]);
                    }
                }
                (mixed, z)
            }
        };
        let mut beta = Buf::output(n * nv);
        let mut alpha = Buf::output(n * nv);
        for (row, (b, al)) in ba
            .chunks_exact(2 * nv)
            .zip(beta.chunks_exact_mut(nv).zip(alpha.chunks_exact_mut(nv)))
        {
            for (g, src) in row.chunks_exact(2 * r).enumerate() {
                b[g * r..][..r].copy_from_slice(&src[..r]);
                al[g * r..][..r].copy_from_slice(&src[r..]);
            }
        }
        Ok(GdnProjected {
            mixed,
            z,
            beta,
            alpha,
        })
    }
}
