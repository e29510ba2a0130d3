//! Hyper-parameters of the supported architectures, read from GGUF metadata the way llama.cpp
//! reads them (see shared/docs/qwen35.md §1).

use crate::ModelError;
use specd_gguf::GgufFile;
use specd_ops::rope::RopeMode;

/// Supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Qwen3.5 dense hybrid: Gated DeltaNet + gated attention.
    Qwen35,
    /// Llama family transformer (Llama 2/3, Mistral-style): NORM rope, no QK norm.
    Llama,
    /// Qwen3 dense transformer: NEOX rope, QK norm.
    Qwen3,
}

impl Arch {
    /// GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen35 => "qwen35",
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
        }
    }
    /// Parses `general.architecture`; known-but-unsupported architectures get their own error.
    pub fn parse(s: &str) -> Result<Arch, ModelError> {
        match s {
            "qwen35" => Ok(Arch::Qwen35),
            "llama" => Ok(Arch::Llama),
            "qwen3" => Ok(Arch::Qwen3),
            "qwen35moe" | "qwen3next" | "qwen3moe" | "qwen2" | "mistral3" | "gemma3" | "phi3" => {
                Err(ModelError::UnsupportedArch(s.to_string()))
            }
            _ => Err(ModelError::UnknownArch(s.to_string())),
        }
    }
}

/// Kind of a trunk layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Attention,
    /// Gated DeltaNet.
    Recurrent,
}

/// Gated DeltaNet dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsmConfig {
    pub conv_kernel: usize,
    /// d_k (= d_v).
    pub d_state: usize,
    /// n_k key heads.
    pub n_group: usize,
    /// n_v value heads.
    pub n_v_heads: usize,
    /// D_v = n_v · d_v.
    pub inner: usize,
}

impl SsmConfig {
    pub fn key_dim(&self) -> usize {
        self.n_group * self.d_state
    }
    pub fn d_v(&self) -> usize {
        self.inner / self.n_v_heads
    }
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.inner
    }
}

/// Everything the forward pass needs to know about the shapes.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    /// Trunk layers (block_count − nextn_predict_layers).
    pub n_layer: usize,
    /// MTP (NextN) blocks after the trunk.
    pub n_nextn: usize,
    pub n_ff: Vec<usize>,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    pub rope_mode: RopeMode,
    pub eps: f32,
    pub layer_kinds: Vec<LayerKind>,
    pub ssm: Option<SsmConfig>,
    pub n_ctx_train: usize,
}

impl ModelConfig {
    /// Reads and validates the hyper-parameters.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let arch_name = g.get_str("general.architecture")?;
        let arch = Arch::parse(arch_name)?;
        let p = |k: &str| format!("{arch_name}.{k}");
        let n_embd = g.get_u32(&p("embedding_length"))? as usize;
        let block_count = g.get_u32(&p("block_count"))? as usize;
        let n_nextn = g.get_opt_u32(&p("nextn_predict_layers"))?.unwrap_or(0) as usize;
        if n_nextn > block_count {
            return Err(ModelError::Invalid(format!(
                "nextn_predict_layers {n_nextn} exceeds block_count {block_count}"
            )));
        }
        let n_layer = block_count - n_nextn;
        let n_ff: Vec<usize> = g
            .get_u32_per_layer(&p("feed_forward_length"), block_count)?
            .into_iter()
            .map(|v| v as usize)
            .collect();
        let n_head = first_of_per_layer(g, &p("attention.head_count"), block_count)?;
        let n_head_kv = match g.get(&p("attention.head_count_kv")) {
            Some(_) => first_of_per_layer(g, &p("attention.head_count_kv"), block_count)?,
            None => n_head,
        };
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::Invalid(format!(
                "head_count {n_head} must be a positive multiple of head_count_kv {n_head_kv}"
            )));
        }
        let head_dim = match g.get_opt_u32(&p("attention.key_length"))? {
            Some(v) => v as usize,
            None => n_embd / n_head,
        };
        if let Some(vl) = g.get_opt_u32(&p("attention.value_length"))? {
            if vl as usize != head_dim {
                return Err(ModelError::Invalid(format!(
                    "attention.value_length {vl} != key_length {head_dim} is not supported"
                )));
            }
        }
        let n_rot = g
            .get_opt_u32(&p("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        if n_rot == 0 || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::Invalid(format!(
                "{}: {n_rot} is invalid for head dim {head_dim}",
                p("rope.dimension_count")
            )));
        }
        let rope_base = g.get_opt_f32(&p("rope.freq_base"))?.unwrap_or(10000.0);
        let eps = g.get_f32(&p("attention.layer_norm_rms_epsilon"))?;
        let n_ctx_train = g.get_u32(&p("context_length"))? as usize;
        // Values that load but make every output NaN or empty are the file's error, named here.
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(ModelError::Invalid(format!(
                "{}: {rope_base} is not a positive finite number",
                p("rope.freq_base")
            )));
        }
        if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
            return Err(ModelError::Invalid(format!(
                "{}: {eps} is not a finite number in (0, 1)",
                p("attention.layer_norm_rms_epsilon")
            )));
        }
        if n_ctx_train == 0 {
            return Err(ModelError::Invalid(format!(
                "{}: a context length of 0",
                p("context_length")
            )));
        }
        let n_vocab = match g.get_opt_u32(&p("vocab_size"))? {
            Some(v) => v as usize,
            None => g
                .tensor_info("token_embd.weight")?
                .dims
                .get(1)
                .copied()
                .unwrap_or(0) as usize,
        };
        let (rope_mode, layer_kinds, ssm) = match arch {
            Arch::Llama => (RopeMode::Norm, vec![LayerKind::Attention; n_layer], None),
            Arch::Qwen3 => (RopeMode::Neox, vec![LayerKind::Attention; n_layer], None),
            Arch::Qwen35 => {
                let secs = g.get_array_i32(&p("rope.dimension_sections"))?;
                if secs.len() != 4 || secs.iter().any(|&s| s < 0) {
                    return Err(ModelError::Invalid(format!(
                        "{}: expected 4 non-negative sections, got {secs:?}",
                        p("rope.dimension_sections")
                    )));
                }
                let sections = [
                    secs[0] as u32,
                    secs[1] as u32,
                    secs[2] as u32,
                    secs[3] as u32,
                ];
                let ssm = SsmConfig {
                    conv_kernel: g.get_u32(&p("ssm.conv_kernel"))? as usize,
                    d_state: g.get_u32(&p("ssm.state_size"))? as usize,
                    n_group: g.get_u32(&p("ssm.group_count"))? as usize,
                    n_v_heads: g.get_u32(&p("ssm.time_step_rank"))? as usize,
                    inner: g.get_u32(&p("ssm.inner_size"))? as usize,
                };
                if ssm.conv_kernel < 2
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
                let kinds = match g.get(&p("attention.recurrent_layers")) {
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
                        let interval =
                            g.get_opt_u32(&p("full_attention_interval"))?.unwrap_or(4) as usize;
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
                (RopeMode::IMrope { sections }, kinds, Some(ssm))
            }
        };
        if n_embd == 0 || n_layer == 0 || n_vocab == 0 || head_dim == 0 {
            return Err(ModelError::Invalid("zero-sized model dimension".into()));
        }
        Ok(ModelConfig {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_nextn,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_base,
            rope_mode,
            eps,
            layer_kinds,
            ssm,
            n_ctx_train,
        })
    }

    /// Number of attention layers in the trunk.
    pub fn n_attn_layers(&self) -> usize {
        self.layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::Attention)
            .count()
    }
    /// Number of recurrent layers in the trunk.
    pub fn n_rec_layers(&self) -> usize {
        self.layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::Recurrent)
            .count()
    }
}

/// A "scalar or per-layer array" key where specd needs one value for all layers.
fn first_of_per_layer(g: &GgufFile, key: &str, n: usize) -> Result<usize, ModelError> {
    let v = g.get_u32_per_layer(key, n)?;
    let first = v.first().copied().unwrap_or(0);
    if v.iter().any(|&x| x != first && x != 0) {
        return Err(ModelError::Invalid(format!(
            "{key}: per-layer values that differ are not supported"
        )));
    }
    Ok(first as usize)
}
