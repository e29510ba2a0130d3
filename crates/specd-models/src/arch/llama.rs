//! `llama`: the Llama family transformer (Llama 2/3, Mistral-style) — attention without QK norm,
//! NORM rotary, dense SwiGLU FFN. Also the trunk of [`super::qwen3`], which differs only in its
//! QK norm and rotary mode.

use super::{Trunk, TrunkMemory};
use crate::config::{per_layer, ModelConfig};
use crate::layers::attention::Attention;
use crate::layers::block::{run_blocks, Block, Mixer};
use crate::layers::ffn::Ffn;
use crate::layers::SeqRows;
use crate::weights::Loader;
use crate::ModelError;
use specd_gguf::GgufFile;
use specd_memory::Memory;
use specd_ops::attention::AttnShape;
use specd_ops::rope::{Rope, RopeMode};

/// llama's own hyper-parameters.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// FFN width per block.
    pub n_ff: Vec<usize>,
}

impl LlamaConfig {
    pub fn from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<Self, ModelError> {
        Ok(LlamaConfig {
            n_ff: per_layer(g, &c.key("feed_forward_length"), c.block_count())?,
        })
    }
}

pub fn rope_mode(_: &GgufFile, _: &str) -> Result<RopeMode, ModelError> {
    Ok(RopeMode::Norm)
}

pub fn load(l: &Loader, c: &ModelConfig) -> Result<Box<dyn Trunk>, ModelError> {
    Ok(Box::new(DenseTrunk::load(l, c, false)?))
}

/// A stack of attention + dense FFN blocks.
pub struct DenseTrunk {
    blocks: Vec<Block<Ffn>>,
    eps: f32,
}

impl DenseTrunk {
    /// Loads `blk.{i}.attn_*`, `ffn_norm`, `ffn_*`; `qk_norm`: the attention carries
    /// `attn_q_norm` / `attn_k_norm` (qwen3).
    pub fn load(l: &Loader, c: &ModelConfig, qk_norm: bool) -> Result<Self, ModelError> {
        let own = LlamaConfig::from_gguf(l.g, c)?;
        let h = c.n_embd;
        let shape = attn_shape(c);
        let mut blocks = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let w = Attention::load(l, i, h, shape, false, qk_norm, c.eps)?;
            blocks.push(Block {
                attn_norm: l.vector(&format!("blk.{i}.attn_norm.weight"), h)?,
                mixer: Mixer::Attention { w, kv_layer: i },
                ffn_norm: l.vector(&format!("blk.{i}.ffn_norm.weight"), h)?,
                ffn: Ffn::load(l, i, h, own.n_ff[i])?,
            });
        }
        Ok(DenseTrunk { blocks, eps: c.eps })
    }
}

/// The attention shape of the shared hyper-parameters.
pub fn attn_shape(c: &ModelConfig) -> AttnShape {
    AttnShape {
        n_head: c.n_head,
        n_kv: c.n_head_kv,
        d_head: c.head_dim,
    }
}

impl Trunk for DenseTrunk {
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
            attn_layers: self.blocks.len(),
            rec_layers: 0,
            ssm: None,
        }
    }
}
