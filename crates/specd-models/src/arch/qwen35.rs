//! `qwen35`: the Qwen3.5 dense hybrid — Gated DeltaNet layers and gated attention (3:1 by
//! default), IMROPE, dense SwiGLU FFN, optional MTP head (qwen35.md). Its hybrid trunk is shared
//! with [`super::qwen35moe`], which swaps the FFN.

use super::{Trunk, TrunkMemory};
use crate::config::{per_layer, LayerKind, ModelConfig, SsmConfig};
use crate::layers::attention::Attention;
use crate::layers::block::{run_blocks, Block, FeedForward, Mixer};
use crate::layers::ffn::Ffn;
use crate::layers::gdn::GatedDeltaNet;
use crate::layers::mtp::Mtp;
use crate::layers::SeqRows;
use crate::weights::Loader;
use crate::ModelError;
use specd_gguf::GgufFile;
use specd_memory::Memory;
use specd_ops::rope::{Rope, RopeMode};

/// The hybrid's mixer hyper-parameters (shared by qwen35 and qwen35moe).
#[derive(Debug, Clone)]
pub struct HybridConfig {
    pub ssm: SsmConfig,
    /// Mixer of each trunk layer.
    pub layer_kinds: Vec<LayerKind>,
}

impl HybridConfig {
    pub fn from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<Self, ModelError> {
        let p = |k: &str| c.key(k);
        let ssm = SsmConfig {
            conv_kernel: g.get_u32(&p("ssm.conv_kernel"))? as usize,
            d_state: g.get_u32(&p("ssm.state_size"))? as usize,
            n_group: g.get_u32(&p("ssm.group_count"))? as usize,
            n_v_heads: g.get_u32(&p("ssm.time_step_rank"))? as usize,
            inner: g.get_u32(&p("ssm.inner_size"))? as usize,
            tiled: true,
        };
        if !(2..=specd_ops::conv::MAX_K).contains(&ssm.conv_kernel)
            || ssm.n_group == 0
            || ssm.n_v_heads == 0
            || !ssm.n_v_heads.is_multiple_of(ssm.n_group)
            || !ssm.inner.is_multiple_of(ssm.n_v_heads)
            || ssm.d_v() != ssm.d_state
        {
            return Err(ModelError::Invalid(format!(
                "inconsistent ssm dimensions {ssm:?}"
            )));
        }
        let n_layer = c.n_layer;
        let layer_kinds = match g.get(&p("attention.recurrent_layers")) {
            Some(_) => {
                let flags = g.get_array_bool(&p("attention.recurrent_layers"))?;
                if flags.len() < n_layer {
                    return Err(ModelError::Invalid(format!(
                        "{} has {} entries for {n_layer} layers",
                        p("attention.recurrent_layers"),
                        flags.len()
                    )));
                }
                flags[..n_layer]
                    .iter()
                    .map(|&r| {
                        if r {
                            LayerKind::Recurrent
                        } else {
                            LayerKind::Attention
                        }
                    })
                    .collect()
            }
            None => {
                let interval = g.get_opt_u32(&p("full_attention_interval"))?.unwrap_or(4) as usize;
                if interval == 0 {
                    return Err(ModelError::Invalid("full_attention_interval is 0".into()));
                }
                (0..n_layer)
                    .map(|i| {
                        if (i + 1) % interval == 0 {
                            LayerKind::Attention
                        } else {
                            LayerKind::Recurrent
                        }
                    })
                    .collect()
            }
        };
        Ok(HybridConfig { ssm, layer_kinds })
    }
}

/// IMROPE with the file's four sections.
pub fn rope_mode(g: &GgufFile, arch: &str) -> Result<RopeMode, ModelError> {
    let key = format!("{arch}.rope.dimension_sections");
    let secs = g.get_array_i32(&key)?;
    if secs.len() != 4 || secs.iter().any(|&s| s < 0) {
        return Err(ModelError::Invalid(format!(
            "{key}: expected 4 non-negative sections, got {secs:?}"
        )));
    }
    let sections = [
        secs[0] as u32,
        secs[1] as u32,
        secs[2] as u32,
        secs[3] as u32,
    ];
    Ok(RopeMode::IMrope { sections })
}

pub fn load(l: &Loader, c: &ModelConfig) -> Result<Box<dyn Trunk>, ModelError> {
    let hc = HybridConfig::from_gguf(l.g, c)?;
    let n_ff = per_layer(l.g, &c.key("feed_forward_length"), c.block_count())?;
    let mut t = HybridTrunk::load(l, c, &hc, qwen35_gdn(l, c, &hc), |i| {
        Ffn::load(l, i, c.n_embd, n_ff[i])
    })?;
    t.mtp = load_mtp(l, c, |i| Ok(Box::new(Ffn::load(l, i, c.n_embd, n_ff[i])?)))?;
    Ok(Box::new(t))
}

/// Loads block `i`'s Gated DeltaNet in qwen35's layout.
pub fn qwen35_gdn<'a>(
    l: &'a Loader,
    c: &'a ModelConfig,
    hc: &'a HybridConfig,
) -> impl FnMut(usize) -> Result<GatedDeltaNet, ModelError> + 'a {
    move |i| GatedDeltaNet::load(l, i, c.n_embd, &hc.ssm, c.eps)
}

/// The file's MTP block (`blk.{n_layer}`) if it has one, its FFN from `ffn(i)`.
pub fn load_mtp(
    l: &Loader,
    c: &ModelConfig,
    ffn: impl FnOnce(usize) -> Result<Box<dyn FeedForward>, ModelError>,
) -> Result<Option<Mtp>, ModelError> {
    if c.n_nextn == 0 {
        return Ok(None);
    }
    if c.n_nextn != 1 {
        return Err(ModelError::Invalid(format!(
            "{} MTP blocks (only 1 is supported)",
            c.n_nextn
        )));
    }
    let i = c.n_layer;
    let shape = super::llama::attn_shape(c);
    let f = ffn(i)?;
    Ok(Some(Mtp::load(l, i, c.n_embd, c.n_vocab, f, shape, c.eps)?))
}

/// Gated DeltaNet and gated-attention blocks with FFN `F`.
pub struct HybridTrunk<F> {
    blocks: Vec<Block<F>>,
    pub mtp: Option<Mtp>,
    n_attn: usize,
    n_rec: usize,
    ssm: SsmConfig,
    eps: f32,
}

impl<F: FeedForward> HybridTrunk<F> {
    /// Loads the trunk's blocks (`attn_norm`, the mixer, `post_attention_norm`): block `i`'s
    /// Gated DeltaNet (on recurrent layers) from `gdn(i)`, its FFN from `ffn(i)`.
    pub fn load(
        l: &Loader,
        c: &ModelConfig,
        hc: &HybridConfig,
        mut gdn: impl FnMut(usize) -> Result<GatedDeltaNet, ModelError>,
        mut ffn: impl FnMut(usize) -> Result<F, ModelError>,
    ) -> Result<Self, ModelError> {
        let h = c.n_embd;
        let shape = super::llama::attn_shape(c);
        let mut blocks = Vec::with_capacity(c.n_layer);
        let (mut n_attn, mut n_rec) = (0, 0);
        for i in 0..c.n_layer {
            let mixer = match hc.layer_kinds[i] {
                LayerKind::Attention => {
                    let w = Attention::load(l, i, h, shape, true, true, c.eps)?;
                    n_attn += 1;
                    Mixer::Attention {
                        w,
                        kv_layer: n_attn - 1,
                    }
                }
                LayerKind::Recurrent => {
                    let w = gdn(i)?;
                    n_rec += 1;
                    Mixer::Recurrent {
                        w,
                        rec_layer: n_rec - 1,
                    }
                }
            };
            blocks.push(Block {
                attn_norm: l.vector(&format!("blk.{i}.attn_norm.weight"), h)?,
                mixer,
                ffn_norm: l.vector(&format!("blk.{i}.post_attention_norm.weight"), h)?,
                ffn: ffn(i)?,
            });
        }
        Ok(HybridTrunk {
            blocks,
            mtp: None,
            n_attn,
            n_rec,
            ssm: hc.ssm,
            eps: c.eps,
        })
    }
}

impl<F: FeedForward> Trunk for HybridTrunk<F> {
    fn forward(
        &self,
        x: &mut [f32],
        n: usize,
        groups: &[SeqRows],
        rope: &Rope,
        mem: &mut Memory,
    ) -> Result<(), ModelError> {
        run_blocks(&self.blocks, x, n, groups, rope, mem, self.eps)
    }
    fn memory(&self) -> TrunkMemory {
        TrunkMemory {
            attn_layers: self.n_attn,
            rec_layers: self.n_rec,
            ssm: Some(self.ssm),
        }
    }
    fn mtp(&self) -> Option<&Mtp> {
        self.mtp.as_ref()
    }
}
