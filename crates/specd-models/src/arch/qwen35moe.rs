//! `qwen35moe`: Qwen3.5's mixture-of-experts hybrids (Qwen3.5-35B-A3B, 122B-A10B) — qwen35's
//! Gated DeltaNet / gated-attention trunk with a MoE FFN in every block (routed experts and a
//! gated shared expert; [`crate::layers::moe`]). Hyper-parameters as llama.cpp reads them:
//! `expert_count`, `expert_used_count`, `expert_feed_forward_length` (default
//! `feed_forward_length / expert_used_count`), `expert_shared_feed_forward_length` (default
//! `feed_forward_length`); softmax gating, normalised top-k weights, no weight scale. The MTP
//! block (`blk.{n_layer}`, when the file has one) is a gated-attention block with the same MoE
//! FFN.

use super::qwen35::{load_mtp, qwen35_gdn, HybridConfig, HybridTrunk};
use super::Trunk;
use crate::config::{first_of_per_layer, ModelConfig};
use crate::layers::moe::{MoeConfig, MoeFfn};
use crate::weights::Loader;
use crate::ModelError;
use specd_gguf::GgufFile;

/// qwen35moe's own hyper-parameters.
#[derive(Debug, Clone)]
pub struct Qwen35MoeConfig {
    pub hybrid: HybridConfig,
    pub moe: MoeConfig,
}

impl Qwen35MoeConfig {
    pub fn from_gguf(g: &GgufFile, c: &ModelConfig) -> Result<Self, ModelError> {
        let hybrid = HybridConfig::from_gguf(g, c)?;
        let n = c.block_count();
        let opt = |k: &str| -> Result<Option<usize>, ModelError> {
            match g.get(&c.key(k)) {
                Some(_) => first_of_per_layer(g, &c.key(k), n).map(Some),
                None => Ok(None),
            }
        };
        let n_expert = g.get_u32(&c.key("expert_count"))? as usize;
        let n_expert_used = first_of_per_layer(g, &c.key("expert_used_count"), n)?;
        if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
            return Err(ModelError::Invalid(format!(
                "{} {n_expert_used} must be in 1..={n_expert} ({})",
                c.key("expert_used_count"),
                c.key("expert_count")
            )));
        }
        let n_ff = opt("feed_forward_length")?;
        let n_ff_exp = match opt("expert_feed_forward_length")? {
            Some(v) => v,
            None => n_ff.map_or(0, |f| f / n_expert_used),
        };
        let n_ff_shexp = match g.get_opt_u32(&c.key("expert_shared_feed_forward_length"))? {
            Some(v) => v as usize,
            None => n_ff.unwrap_or(0),
        };
        if n_ff_exp == 0 || n_ff_shexp == 0 {
            return Err(ModelError::Invalid(format!(
                "{} / {}: zero-sized experts",
                c.key("expert_feed_forward_length"),
                c.key("expert_shared_feed_forward_length")
            )));
        }
        Ok(Qwen35MoeConfig {
            hybrid,
            moe: MoeConfig {
                n_expert,
                n_expert_used,
                n_ff_exp,
                n_ff_shexp,
            },
        })
    }
}

pub fn load(l: &Loader, c: &ModelConfig) -> Result<Box<dyn Trunk>, ModelError> {
    let own = Qwen35MoeConfig::from_gguf(l.g, c)?;
    let gdn = qwen35_gdn(l, c, &own.hybrid);
    let mut t = HybridTrunk::load(l, c, &own.hybrid, gdn, |i| {
        MoeFfn::load(l, i, c.n_embd, &own.moe)
    })?;
    // The MTP block is a gated-attention block with the trunk's MoE FFN.
    t.mtp = load_mtp(l, c, |i| {
        Ok(Box::new(MoeFfn::load(l, i, c.n_embd, &own.moe)?))
    })?;
    Ok(Box::new(t))
}
