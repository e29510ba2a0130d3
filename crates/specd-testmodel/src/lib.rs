//! Synthetic GGUF models for tests and benchmarks.
//!
//! The files have exactly the tensor names, shapes and metadata of real `qwen35` / `llama` GGUFs
//! written by llama.cpp's converter (so llama.cpp loads them too, and the two engines can be
//! compared on the same file), random weights from a seeded generator, and a real byte-level BPE
//! tokenizer trained on text this crate carries (`corpus/`).
//!
//! Two weight styles, chosen on purpose (docs/qwen35.md §8): [`WeightStyle::Varied`] (small
//! embeddings, untied random LM head → varied continuations with small top-1 margins, a sharp
//! numerical test and real draft rejections) and [`WeightStyle::Repetitive`] (large tied embeddings
//! → greedy output that loops, which n-gram drafters love).

pub mod mix;
mod presets;
mod rng;
mod writer;

pub use mix::{Mix, Quant};
pub use presets::{Preset, TestArch};
pub use writer::{quant_of, tensor_types, write_model};

use specd_gguf::TensorType;

/// Errors while generating a model.
#[derive(Debug, thiserror::Error)]
pub enum TestModelError {
    #[error(transparent)]
    Gguf(#[from] specd_gguf::GgufError),
    #[error(transparent)]
    Tokenizer(#[from] specd_tokenizer::TokenizerError),
    #[error("invalid test model spec: {0}")]
    Invalid(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// How the random weights are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightStyle {
    /// Small embeddings and an untied LM head: varied output.
    Varied,
    /// Unit embeddings tied to the LM head: repetitive output.
    Repetitive,
}

/// Everything that defines a synthetic model.
#[derive(Debug, Clone)]
pub struct TestModelSpec {
    pub arch: TestArch,
    pub name: String,
    /// Total vocabulary (trained BPE tokens + specials + unused padding).
    pub n_vocab: usize,
    /// Tokens the BPE trainer may learn (before specials and padding).
    pub n_vocab_trained: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    /// IMROPE sections (qwen35).
    pub rope_sections: [i32; 4],
    pub eps: f32,
    pub n_ctx_train: usize,
    /// Gated DeltaNet (qwen35).
    pub ssm_conv_kernel: usize,
    pub ssm_d_state: usize,
    pub ssm_n_group: usize,
    pub ssm_n_v_heads: usize,
    pub full_attention_interval: usize,
    /// Mixture of experts (qwen35moe): experts per layer, experts per token, a routed expert's
    /// FFN width and the shared expert's (unused by the other architectures).
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
    /// Append one MTP (NextN) block.
    pub mtp: bool,
    /// Qwen2.5/3-Coder's fill-in-the-middle tokens in the vocabulary (after the trained ones),
    /// named by the `tokenizer.ggml.fim_*_token_id` keys.
    pub fim: bool,
    /// Type of 2-D weight matrices (norms and small vectors stay F32, as llama.cpp's quantizer
    /// leaves them), used when `mix` is `None`. Rows whose length does not fit the type's block
    /// get llama.cpp's fallback type (see [`mix`]).
    pub wtype: TensorType,
    /// A llama-quantize mix (per-tensor types as `llama-quantize` would choose them); overrides
    /// `wtype`.
    pub mix: Option<Mix>,
    pub style: WeightStyle,
    pub seed: u64,
}

impl TestModelSpec {
    /// The spec of a preset.
    pub fn preset(p: Preset) -> Self {
        presets::spec(p)
    }
    /// Conv channels of a GDN layer.
    pub fn conv_dim(&self) -> usize {
        2 * self.ssm_n_group * self.ssm_d_state + self.ssm_inner()
    }
    /// GDN value width n_v · d_v (d_v = d_state).
    pub fn ssm_inner(&self) -> usize {
        self.ssm_n_v_heads * self.ssm_d_state
    }
    /// Is trunk layer `i` recurrent?
    pub fn is_recurrent(&self, i: usize) -> bool {
        self.arch.is_hybrid() && !(i + 1).is_multiple_of(self.full_attention_interval)
    }
}

/// The text the tokenizer is trained on.
pub const CORPUS: &str = include_str!("../corpus/python-stdlib.py.txt");
