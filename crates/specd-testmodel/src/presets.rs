//! Named model shapes.

use crate::{Mix, TestModelSpec, WeightStyle};
use specd_gguf::TensorType;

/// Architectures the generator writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestArch {
    Qwen35,
    /// qwen35 with a mixture-of-experts FFN in every block.
    Qwen35Moe,
    /// Qwen3-Next: qwen35moe's blocks with NEOX rotary, fused DeltaNet β/α (`ssm_ba`) and value
    /// heads grouped by key head.
    Qwen3Next,
    Llama,
}

impl TestArch {
    /// GGUF `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            TestArch::Qwen35 => "qwen35",
            TestArch::Qwen35Moe => "qwen35moe",
            TestArch::Qwen3Next => "qwen3next",
            TestArch::Llama => "llama",
        }
    }
    /// Gated DeltaNet + gated attention (the Qwen3.5 family's hybrids).
    pub fn is_hybrid(self) -> bool {
        matches!(
            self,
            TestArch::Qwen35 | TestArch::Qwen35Moe | TestArch::Qwen3Next
        )
    }
    /// A mixture-of-experts FFN in every block.
    pub fn is_moe(self) -> bool {
        matches!(self, TestArch::Qwen35Moe | TestArch::Qwen3Next)
    }
}

/// Named shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// qwen35, 4 layers (3 GDN + 1 attention), hidden 64, 2:1 value/key heads — fast tests.
    Qwen35Tiny,
    /// qwen35, 8 layers, hidden 256 — the size of shared/models' trained target.
    Qwen35Small,
    /// qwen35 at Qwen3.5-0.8B shape: 24 layers, hidden 1024, vocab 248320 — benchmarks.
    Qwen35_0_8B,
    /// qwen35 at Qwen3.5-9B shape: 32 layers, hidden 4096, n_ff 12288, 16 query / 4 KV heads of
    /// 256, DeltaNet 32 value / 16 key heads of 128, vocab 248320 — benchmarks only (write it in
    /// a quantised type: ~18 GB as F16).
    Qwen35_9B,
    /// qwen35moe, 4 layers, hidden 64, 8 experts of width 32 (2 per token) + a shared expert
    /// of 64 — fast tests.
    Qwen35MoeTiny,
    /// qwen35moe, 8 layers, hidden 256, 16 experts of width 128 (4 per token) + a shared
    /// expert of 256.
    Qwen35MoeSmall,
    /// qwen35moe at Qwen3.5-35B-A3B's widths: 40 layers (10 × (3 DeltaNet + 1 attention)),
    /// hidden 2048, 256 experts of 512 (8 per token) + a shared expert of 512, 16 query / 2 KV
    /// heads of 256, DeltaNet 32 value / 16 key heads of 128; the test vocabulary. Written as
    /// Q4_K_M (~20 GB): benchmarks only, never in CI.
    Qwen35Moe35bA3b,
    /// The same widths with 4 layers (3 DeltaNet + 1 attention), ~2 GB as Q4_K_M: per-layer
    /// MoE benchmarks.
    Qwen35Moe35bA3b4l,
    /// qwen3next, 4 layers, hidden 64, 8 experts of width 32 (2 per token) + a shared expert of
    /// 64, NEOX rotary over 8 of 32 head dims, 2 value heads per key head — fast tests.
    Qwen3NextTiny,
    /// qwen3next, 8 layers, hidden 256, 16 experts of width 128 (4 per token) + a shared
    /// expert of 256, rotary over 16 of 64 head dims, 2 value heads per key head.
    Qwen3NextSmall,
    /// llama, 2 layers, hidden 64.
    LlamaTiny,
    /// llama, 4 layers, hidden 256.
    LlamaSmall,
}

impl Preset {
    /// Parses a preset name (`qwen35-tiny`, `qwen35-small`, `qwen35-0.8b`, `qwen35-9b`,
    /// `qwen35moe-tiny`, `qwen35moe-small`, `qwen35moe-35b-a3b`, `qwen35moe-35b-a3b-4l`,
    /// `qwen3next-tiny`, `qwen3next-small`, `llama-tiny`,
    /// `llama-small`).
    pub fn parse(s: &str) -> Option<Preset> {
        Some(match s {
            "qwen35-tiny" => Preset::Qwen35Tiny,
            "qwen35-small" => Preset::Qwen35Small,
            "qwen35-0.8b" | "qwen35-0.8B" => Preset::Qwen35_0_8B,
            "qwen35-9b" | "qwen35-9B" => Preset::Qwen35_9B,
            "qwen35moe-tiny" => Preset::Qwen35MoeTiny,
            "qwen35moe-small" => Preset::Qwen35MoeSmall,
            "qwen35moe-35b-a3b" | "qwen35moe-35B-A3B" => Preset::Qwen35Moe35bA3b,
            "qwen35moe-35b-a3b-4l" | "qwen35moe-35B-A3B-4l" => Preset::Qwen35Moe35bA3b4l,
            "qwen3next-tiny" => Preset::Qwen3NextTiny,
            "qwen3next-small" => Preset::Qwen3NextSmall,
            "llama-tiny" => Preset::LlamaTiny,
            "llama-small" => Preset::LlamaSmall,
            _ => return None,
        })
    }
    /// All preset names.
    pub const NAMES: [&'static str; 12] = [
        "qwen35-tiny",
        "qwen35-small",
        "qwen35-0.8b",
        "qwen35-9b",
        "qwen35moe-tiny",
        "qwen35moe-small",
        "qwen35moe-35b-a3b",
        "qwen35moe-35b-a3b-4l",
        "qwen3next-tiny",
        "qwen3next-small",
        "llama-tiny",
        "llama-small",
    ];
}

pub(crate) fn spec(p: Preset) -> TestModelSpec {
    let base = TestModelSpec {
        arch: TestArch::Qwen35,
        name: String::new(),
        // The trained tokens, 3 chat specials and 6 FIM tokens (Qwen2.5/3-Coder's).
        n_vocab: 1030,
        n_vocab_trained: 1021,
        n_embd: 64,
        n_layer: 4,
        n_ff: 128,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 32,
        n_rot: 8,
        rope_base: 1e7,
        rope_sections: [2, 1, 1, 0],
        eps: 1e-6,
        n_ctx_train: 4096,
        ssm_conv_kernel: 4,
        ssm_d_state: 16,
        ssm_n_group: 2,
        ssm_n_v_heads: 4,
        full_attention_interval: 4,
        n_expert: 0,
        n_expert_used: 0,
        n_ff_exp: 0,
        n_ff_shexp: 0,
        mtp: false,
        fim: true,
        wtype: TensorType::F32,
        mix: None,
        style: WeightStyle::Varied,
        seed: 42,
    };
    match p {
        Preset::Qwen35Tiny => TestModelSpec {
            name: "qwen35-tiny".into(),
            ..base
        },
        Preset::Qwen35Small => TestModelSpec {
            name: "qwen35-small".into(),
            n_vocab: 4102,
            n_vocab_trained: 4093,
            n_embd: 256,
            n_layer: 8,
            n_ff: 768,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_rot: 16,
            rope_sections: [3, 3, 2, 0],
            ssm_d_state: 32,
            ssm_n_group: 4,
            ssm_n_v_heads: 8,
            ..base
        },
        Preset::Qwen35_0_8B => TestModelSpec {
            name: "qwen35-0.8b".into(),
            n_vocab: 248_320,
            n_vocab_trained: 8192,
            n_embd: 1024,
            n_layer: 24,
            n_ff: 3584,
            n_head: 8,
            n_head_kv: 2,
            head_dim: 256,
            n_rot: 64,
            rope_sections: [11, 11, 10, 0],
            n_ctx_train: 262_144,
            ssm_d_state: 128,
            ssm_n_group: 16,
            ssm_n_v_heads: 16,
            wtype: TensorType::Q8_0,
            ..base
        },
        // Qwen3.5-9B's text model (config.json of Qwen/Qwen3.5-9B): hidden 4096, 32 layers (8 ×
        // (3 DeltaNet + 1 gated attention)), intermediate 12288, attention 16 q / 4 kv heads of
        // 256 with 64 rotary dims, DeltaNet 32 value / 16 query-key heads of 128, conv 4, vocab
        // 248320, untied LM head.
        Preset::Qwen35_9B => TestModelSpec {
            name: "qwen35-9b".into(),
            n_vocab: 248_320,
            n_vocab_trained: 8192,
            n_embd: 4096,
            n_layer: 32,
            n_ff: 12_288,
            n_head: 16,
            n_head_kv: 4,
            head_dim: 256,
            n_rot: 64,
            rope_sections: [11, 11, 10, 0],
            n_ctx_train: 262_144,
            ssm_d_state: 128,
            ssm_n_group: 16,
            ssm_n_v_heads: 32,
            mix: Some(Mix::Q4_K_M),
            ..base
        },
        Preset::Qwen35MoeTiny => TestModelSpec {
            arch: TestArch::Qwen35Moe,
            name: "qwen35moe-tiny".into(),
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 32,
            n_ff_shexp: 64,
            ..base
        },
        Preset::Qwen35MoeSmall => TestModelSpec {
            arch: TestArch::Qwen35Moe,
            name: "qwen35moe-small".into(),
            n_vocab: 4102,
            n_vocab_trained: 4093,
            n_embd: 256,
            n_layer: 8,
            n_ff: 768,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_rot: 16,
            rope_sections: [3, 3, 2, 0],
            ssm_d_state: 32,
            ssm_n_group: 4,
            ssm_n_v_heads: 8,
            n_expert: 16,
            n_expert_used: 4,
            n_ff_exp: 128,
            n_ff_shexp: 256,
            ..base
        },
        // Qwen3.5-35B-A3B's text model (Qwen/Qwen3.5-35B-A3B's config, as llama.cpp's converter
        // writes it for qwen35moe): hidden 2048, 40 layers of 3 Gated DeltaNet + 1 gated
        // attention, attention 16 q / 2 kv heads of 256 with 64 rotary dims (IMROPE sections
        // 11/11/10), DeltaNet 32 value / 16 query-key heads of 128 and conv 4, 256 routed experts
        // of 512 with 8 per token, one shared expert of 512. The vocabulary stays the test one
        // (4102), so the LM head does not dominate a per-layer benchmark.
        Preset::Qwen35Moe35bA3b => TestModelSpec {
            arch: TestArch::Qwen35Moe,
            name: "qwen35moe-35b-a3b".into(),
            n_vocab: 4102,
            n_vocab_trained: 4093,
            n_embd: 2048,
            n_layer: 40,
            n_ff: 512,
            n_head: 16,
            n_head_kv: 2,
            head_dim: 256,
            n_rot: 64,
            rope_sections: [11, 11, 10, 0],
            n_ctx_train: 262_144,
            ssm_d_state: 128,
            ssm_n_group: 16,
            ssm_n_v_heads: 32,
            n_expert: 256,
            n_expert_used: 8,
            n_ff_exp: 512,
            n_ff_shexp: 512,
            mix: Some(Mix::Q4_K_M),
            ..base
        },
        Preset::Qwen35Moe35bA3b4l => TestModelSpec {
            name: "qwen35moe-35b-a3b-4l".into(),
            n_layer: 4,
            ..spec(Preset::Qwen35Moe35bA3b)
        },
        // Qwen3-Next-80B-A3B's proportions where a tiny model can have them: a quarter of the
        // head rotated, twice as many DeltaNet value heads as key heads.
        Preset::Qwen3NextTiny => TestModelSpec {
            arch: TestArch::Qwen3Next,
            name: "qwen3next-tiny".into(),
            rope_sections: [0; 4],
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 32,
            n_ff_shexp: 64,
            seed: 43,
            ..base
        },
        Preset::Qwen3NextSmall => TestModelSpec {
            arch: TestArch::Qwen3Next,
            name: "qwen3next-small".into(),
            n_vocab: 4102,
            n_vocab_trained: 4093,
            n_embd: 256,
            n_layer: 8,
            n_ff: 768,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_rot: 16,
            rope_sections: [0; 4],
            ssm_d_state: 32,
            ssm_n_group: 4,
            ssm_n_v_heads: 8,
            n_expert: 16,
            n_expert_used: 4,
            n_ff_exp: 128,
            n_ff_shexp: 256,
            seed: 43,
            ..base
        },
        Preset::LlamaTiny => TestModelSpec {
            arch: TestArch::Llama,
            name: "llama-tiny".into(),
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            n_rot: 16,
            rope_base: 10000.0,
            n_layer: 2,
            ..base
        },
        Preset::LlamaSmall => TestModelSpec {
            arch: TestArch::Llama,
            name: "llama-small".into(),
            n_vocab: 4102,
            n_vocab_trained: 4093,
            n_embd: 256,
            n_layer: 4,
            n_ff: 768,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_rot: 64,
            rope_base: 10000.0,
            ..base
        },
    }
}
