//! One module per architecture, each with its own hyper-parameters (read from GGUF on top of the
//! shared [`ModelConfig`]) and its own trunk (the blocks between the embedding and the output
//! norm), built from the shared layers in [`crate::layers`]. [`REGISTRY`] maps GGUF's
//! `general.architecture` to the module: adding an architecture is its module, a line there and
//! a test preset.

pub mod llama;
pub mod qwen3;
pub mod qwen35;
pub mod qwen35moe;
pub mod qwen3next;

use crate::config::{ModelConfig, SsmConfig};
use crate::layers::mtp::Mtp;
use crate::layers::SeqRows;
use crate::weights::Loader;
use crate::ModelError;
use specd_gguf::GgufFile;
use specd_memory::Memory;
use specd_ops::rope::{Rope, RopeMode};

/// Supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Qwen3.5 dense hybrid: Gated DeltaNet + gated attention.
    Qwen35,
    /// Qwen3.5 mixture-of-experts hybrid (Qwen3.5-35B-A3B, 122B-A10B): qwen35's mixers, a routed
    /// MoE FFN with a gated shared expert.
    Qwen35Moe,
    /// Qwen3-Next (Qwen3-Next-80B-A3B, Qwen3-Coder-Next): the MoE hybrid with NEOX rotary,
    /// fused DeltaNet projections and value heads grouped by key head.
    Qwen3Next,
    /// Llama family transformer (Llama 2/3, Mistral-style): NORM rope, no QK norm.
    Llama,
    /// Qwen3 dense transformer: NEOX rope, QK norm.
    Qwen3,
}

/// What the model needs of an architecture: its rotary mode and its trunk.
pub struct ArchDef {
    pub arch: Arch,
    /// GGUF `general.architecture`, also the prefix of its hyper-parameter keys.
    pub name: &'static str,
    /// The rotary mode (and its own keys, e.g. IMROPE sections), from the file.
    pub rope_mode: fn(&GgufFile, &str) -> Result<RopeMode, ModelError>,
    /// Reads the architecture's own hyper-parameters and loads its trunk.
    pub load: LoadTrunk,
}

/// Reads an architecture's own hyper-parameters and loads its trunk.
pub type LoadTrunk = fn(&Loader, &ModelConfig) -> Result<Box<dyn Trunk>, ModelError>;

/// The architectures specd runs.
pub const REGISTRY: &[ArchDef] = &[
    ArchDef {
        arch: Arch::Qwen35,
        name: "qwen35",
        rope_mode: qwen35::rope_mode,
        load: qwen35::load,
    },
    ArchDef {
        arch: Arch::Qwen35Moe,
        name: "qwen35moe",
        rope_mode: qwen35::rope_mode,
        load: qwen35moe::load,
    },
    ArchDef {
        arch: Arch::Qwen3Next,
        name: "qwen3next",
        rope_mode: qwen3next::rope_mode,
        load: qwen3next::load,
    },
    ArchDef {
        arch: Arch::Llama,
        name: "llama",
        rope_mode: llama::rope_mode,
        load: llama::load,
    },
    ArchDef {
        arch: Arch::Qwen3,
        name: "qwen3",
        rope_mode: qwen3::rope_mode,
        load: qwen3::load,
    },
];

/// Architectures llama.cpp runs that specd knows of but does not run yet: a clearer error than
/// "unknown".
const NOT_YET: &[&str] = &["qwen3moe", "qwen2", "mistral3", "gemma3", "phi3"];

impl Arch {
    /// The architecture's entry in [`REGISTRY`].
    pub fn def(self) -> &'static ArchDef {
        REGISTRY
            .iter()
            .find(|d| d.arch == self)
            .expect("every Arch has a registry entry")
    }
    /// GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        self.def().name
    }
    /// Parses `general.architecture`; known-but-unsupported architectures get their own error.
    pub fn parse(s: &str) -> Result<Arch, ModelError> {
        if let Some(d) = REGISTRY.iter().find(|d| d.name == s) {
            return Ok(d.arch);
        }
        if NOT_YET.contains(&s) {
            return Err(ModelError::UnsupportedArch(s.to_string()));
        }
        // The file's string, cut for the message: a hostile file may make it megabytes long.
        let shown: String = s.chars().take(64).collect();
        let more = if shown.len() < s.len() { "…" } else { "" };
        Err(ModelError::UnknownArch(format!("{shown}{more}")))
    }
}

/// The per-sequence memory a trunk needs: KV layers, recurrent layers and their shape.
#[derive(Debug, Clone, Copy)]
pub struct TrunkMemory {
    pub attn_layers: usize,
    pub rec_layers: usize,
    pub ssm: Option<SsmConfig>,
}

/// An architecture's trunk, loaded.
pub trait Trunk: Send + Sync {
    /// Runs every block over the residual stream `x` (`n × n_embd`, the embeddings on entry),
    /// rows grouped by sequence in `groups`.
    fn forward(
        &self,
        x: &mut [f32],
        n: usize,
        groups: &[SeqRows],
        rope: &Rope,
        mem: &mut Memory,
    ) -> Result<(), ModelError>;
    /// Memory each sequence needs.
    fn memory(&self) -> TrunkMemory;
    /// The multi-token-prediction head, if the file has one this architecture runs.
    fn mtp(&self) -> Option<&Mtp> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_architecture_has_one_registry_entry() {
        for a in [
            Arch::Qwen35,
            Arch::Qwen35Moe,
            Arch::Qwen3Next,
            Arch::Llama,
            Arch::Qwen3,
        ] {
            assert_eq!(REGISTRY.iter().filter(|d| d.arch == a).count(), 1);
            assert_eq!(a.def().arch, a);
        }
        assert_eq!(REGISTRY.len(), 5, "a new Arch variant needs its line above");
    }
}
