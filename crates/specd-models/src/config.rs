//! Hyper-parameters every architecture shares, read from GGUF metadata the way llama.cpp reads
//! them (see docs/qwen35.md §1). Each architecture reads its own on top of these (its
//! module under [`crate::arch`]).

use crate::ModelError;
use specd_gguf::GgufFile;
use specd_ops::delta_net::GdnShape;
use specd_ops::rope::RopeMode;

pub use crate::arch::Arch;

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
    /// Value head `j` reads key head `j % n_k` (qwen35's GGUFs, whose value heads the converter
    /// reorders) rather than `j / (n_v / n_k)` (qwen3next's, grouped by key head).
    pub tiled: bool,
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
    /// The recurrence's head shape.
    pub fn gdn_shape(&self) -> GdnShape {
        GdnShape {
            n_k: self.n_group,
            n_v: self.n_v_heads,
            d_k: self.d_state,
            d_v: self.d_v(),
            tiled: self.tiled,
        }
    }
}

/// The hyper-parameters the model around the trunk needs (embedding, attention shapes, rotary
/// table, output head); the trunk's own are in its architecture's config.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    /// Trunk layers (block_count − nextn_predict_layers).
    pub n_layer: usize,
    /// MTP (NextN) blocks after the trunk.
    pub n_nextn: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    pub rope_mode: RopeMode,
    pub eps: f32,
    pub n_ctx_train: usize,
}

impl ModelConfig {
    /// Reads and validates the shared hyper-parameters (the rotary mode is the architecture's).
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let arch_name = g.get_str("general.architecture")?;
        let arch = Arch::parse(arch_name)?;
        let p = |k: &str| format!("{arch_name}.{k}");
        let n_embd = g.get_u32(&p("embedding_length"))? as usize;
        let block_count = g.get_u32(&p("block_count"))? as usize;
        check_block_count(g, &p("block_count"), block_count)?;
        let n_nextn = g.get_opt_u32(&p("nextn_predict_layers"))?.unwrap_or(0) as usize;
        if n_nextn > block_count {
            return Err(ModelError::Invalid(format!(
                "nextn_predict_layers {n_nextn} exceeds block_count {block_count}"
            )));
        }
        let n_layer = block_count - n_nextn;
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
        let rope_mode = (arch.def().rope_mode)(g, arch_name)?;
        if n_embd == 0 || n_layer == 0 || n_vocab == 0 || head_dim == 0 {
            return Err(ModelError::Invalid("zero-sized model dimension".into()));
        }
        Ok(ModelConfig {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_nextn,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_base,
            rope_mode,
            eps,
            n_ctx_train,
        })
    }

    /// The full key of this architecture's hyper-parameter `k` (`qwen35.ssm.state_size`).
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch.name())
    }

    /// Blocks in the file (trunk and MTP).
    pub fn block_count(&self) -> usize {
        self.n_layer + self.n_nextn
    }
}

/// `block_count` sizes per-layer tables before any block's tensors are read, so it is held to the
/// file first: the blocks with tensors (`blk.N.…`) must be exactly `0..block_count`. A count the
/// file cannot back (2^31 in a 33 MB file) is an error here, not an allocation of gigabytes.
fn check_block_count(g: &GgufFile, key: &str, block_count: usize) -> Result<(), ModelError> {
    let mut blocks = std::collections::BTreeSet::new();
    for t in g.tensors() {
        let Some(rest) = t.name.strip_prefix("blk.") else {
            continue;
        };
        let index = rest.split('.').next().and_then(|i| i.parse::<usize>().ok());
        match index {
            Some(i) => blocks.insert(i),
            None => {
                return Err(ModelError::Invalid(format!(
                    "tensor '{}': no block number after 'blk.'",
                    t.name
                )))
            }
        };
    }
    let have = |n: usize| match n {
        0 => "no block tensors".to_string(),
        n => format!("tensors for {n} blocks"),
    };
    if block_count == 0 {
        return Err(ModelError::Invalid(format!(
            "{key} is 0 (the file has {})",
            have(blocks.len())
        )));
    }
    if let Some(missing) = (0..block_count).find(|i| !blocks.contains(i)) {
        return Err(ModelError::Invalid(format!(
            "{key} is {block_count}, but the file has {}: block {missing} has no tensors",
            have(blocks.len())
        )));
    }
    if let Some(&extra) = blocks.range(block_count..).next() {
        return Err(ModelError::Invalid(format!(
            "{key} is {block_count}, but the file has tensors for block {extra} (blk.{extra}.…)"
        )));
    }
    Ok(())
}

/// A "scalar or per-layer array" key where specd needs one value for all layers.
pub(crate) fn first_of_per_layer(g: &GgufFile, key: &str, n: usize) -> Result<usize, ModelError> {
    let v = g.get_u32_per_layer(key, n)?;
    let first = v.first().copied().unwrap_or(0);
    if v.iter().any(|&x| x != first && x != 0) {
        return Err(ModelError::Invalid(format!(
            "{key}: per-layer values that differ are not supported"
        )));
    }
    Ok(first as usize)
}

/// A "scalar or per-layer array" key, one value per block.
pub(crate) fn per_layer(g: &GgufFile, key: &str, n: usize) -> Result<Vec<usize>, ModelError> {
    Ok(g.get_u32_per_layer(key, n)?
        .into_iter()
        .map(|v| v as usize)
        .collect())
}
