//! `qwen3`: the Qwen3 dense transformer — llama's trunk with QK norm and NEOX rotary.

use super::llama::DenseTrunk;
use super::Trunk;
use crate::config::ModelConfig;
use crate::weights::Loader;
use crate::ModelError;
use specd_gguf::GgufFile;
use specd_ops::rope::RopeMode;

pub fn rope_mode(_: &GgufFile, _: &str) -> Result<RopeMode, ModelError> {
    Ok(RopeMode::Neox)
}

pub fn load(l: &Loader, c: &ModelConfig) -> Result<Box<dyn Trunk>, ModelError> {
    Ok(Box::new(DenseTrunk::load(l, c, true)?))
}
