//! Writes a [`TestModelSpec`] as a GGUF file.

use crate::rng::WeightRng;
use crate::{TestArch, TestModelError, TestModelSpec, WeightStyle, CORPUS};
use specd_gguf::{GgufWriter, TensorType};
use specd_tokenizer::{pad_vocab, train_bpe, CHATML_TEMPLATE};
use std::path::Path;

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

struct Builder<'a> {
    spec: &'a TestModelSpec,
    w: GgufWriter,
}

impl Builder<'_> {
    /// A 2-D weight `[out, in]` (GGUF ne `[in, out]`) with std 1/√in (times `gain`).
    fn matrix(
        &mut self,
        name: &str,
        rows: usize,
        cols: usize,
        gain: f32,
    ) -> Result<(), TestModelError> {
        let std = gain / (cols as f32).sqrt();
        let data = WeightRng::new(self.spec.seed, name).fill(rows * cols, 0.0, std);
        self.w
            .add_tensor_f32(name, &[cols as u64, rows as u64], self.spec.wtype, &data)?;
        Ok(())
    }
    /// A vector kept in F32.
    fn vector(&mut self, name: &str, data: Vec<f32>) -> Result<(), TestModelError> {
        let n = data.len() as u64;
        self.w.add_tensor_f32(name, &[n], TensorType::F32, &data)?;
        Ok(())
    }
    /// A norm weight (stored as 1 + w, like the converter does).
    fn norm(&mut self, name: &str, n: usize) -> Result<(), TestModelError> {
        let data = WeightRng::new(self.spec.seed, name).fill(n, 1.0, 0.1);
        self.vector(name, data)
    }

    fn attention(&mut self, i: usize, gated: bool, qk_norm: bool) -> Result<(), TestModelError> {
        let s = self.spec;
        let (h, qd, kvd) = (s.n_embd, s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
        self.matrix(
            &format!("blk.{i}.attn_q.weight"),
            if gated { 2 * qd } else { qd },
            h,
            1.0,
        )?;
        self.matrix(&format!("blk.{i}.attn_k.weight"), kvd, h, 1.0)?;
        self.matrix(&format!("blk.{i}.attn_v.weight"), kvd, h, 1.0)?;
        if qk_norm {
            self.norm(&format!("blk.{i}.attn_q_norm.weight"), s.head_dim)?;
            self.norm(&format!("blk.{i}.attn_k_norm.weight"), s.head_dim)?;
        }
        self.matrix(&format!("blk.{i}.attn_output.weight"), h, qd, 1.0)
    }

    fn gdn(&mut self, i: usize) -> Result<(), TestModelError> {
        let s = self.spec;
        let h = s.n_embd;
        let (cd, inner, nv) = (s.conv_dim(), s.ssm_inner(), s.ssm_n_v_heads);
        self.matrix(&format!("blk.{i}.attn_qkv.weight"), cd, h, 1.0)?;
        self.matrix(&format!("blk.{i}.attn_gate.weight"), inner, h, 1.0)?;
        self.matrix(&format!("blk.{i}.ssm_beta.weight"), nv, h, 1.0)?;
        self.matrix(&format!("blk.{i}.ssm_alpha.weight"), nv, h, 1.0)?;
        let k = s.ssm_conv_kernel;
        let conv =
            WeightRng::new(s.seed, &format!("blk.{i}.ssm_conv1d.weight")).fill(cd * k, 0.0, 0.5);
        self.w.add_tensor_f32(
            &format!("blk.{i}.ssm_conv1d.weight"),
            &[k as u64, cd as u64],
            TensorType::F32,
            &conv,
        )?;
        let dt = WeightRng::new(s.seed, &format!("blk.{i}.ssm_dt.bias")).fill(nv, 0.0, 0.5);
        self.vector(&format!("blk.{i}.ssm_dt.bias"), dt)?;
        // A = −exp(A_log) with a slow decay, so the recurrent state carries information.
        let a = WeightRng::new(s.seed, &format!("blk.{i}.ssm_a")).uniform(nv, -1.0, -0.05);
        self.vector(&format!("blk.{i}.ssm_a"), a)?;
        self.norm(&format!("blk.{i}.ssm_norm.weight"), s.ssm_d_state)?;
        self.matrix(&format!("blk.{i}.ssm_out.weight"), h, inner, 1.0)
    }

    fn ffn(&mut self, i: usize) -> Result<(), TestModelError> {
        let s = self.spec;
        self.matrix(&format!("blk.{i}.ffn_gate.weight"), s.n_ff, s.n_embd, 1.0)?;
        self.matrix(&format!("blk.{i}.ffn_up.weight"), s.n_ff, s.n_embd, 1.0)?;
        self.matrix(&format!("blk.{i}.ffn_down.weight"), s.n_embd, s.n_ff, 1.0)
    }
}

/// Generates the model described by `spec` and writes it to `path`.
pub fn write_model(spec: &TestModelSpec, path: &Path) -> Result<(), TestModelError> {
    validate(spec)?;
    let arch = match spec.arch {
        TestArch::Qwen35 => "qwen35",
        TestArch::Llama => "llama",
    };
    let pre = match spec.arch {
        TestArch::Qwen35 => "qwen35",
        TestArch::Llama => "llama-bpe",
    };
    let mut vocab = train_bpe(
        CORPUS,
        spec.n_vocab_trained + SPECIALS.len(),
        pre,
        &SPECIALS,
    )?;
    if vocab.tokens.len() > spec.n_vocab {
        return Err(TestModelError::Invalid(format!(
            "trained vocabulary ({}) exceeds n_vocab {}",
            vocab.tokens.len(),
            spec.n_vocab
        )));
    }
    let id_of = |t: &str| vocab.tokens.iter().position(|x| x == t).map(|i| i as u32);
    let (eot, bos, im_end) = (id_of(SPECIALS[0]), id_of(SPECIALS[1]), id_of(SPECIALS[2]));
    pad_vocab(&mut vocab, spec.n_vocab)?;

    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    let n_blocks = spec.n_layer + usize::from(spec.mtp);
    w.add_string("general.architecture", arch);
    w.add_string("general.name", &format!("specd synthetic {}", spec.name));
    w.add_u32("general.file_type", file_type(spec.wtype));
    w.add_u32(&k("context_length"), spec.n_ctx_train as u32);
    w.add_u32(&k("embedding_length"), spec.n_embd as u32);
    w.add_u32(&k("block_count"), n_blocks as u32);
    w.add_u32(&k("feed_forward_length"), spec.n_ff as u32);
    w.add_u32(&k("attention.head_count"), spec.n_head as u32);
    w.add_u32(&k("attention.head_count_kv"), spec.n_head_kv as u32);
    w.add_u32(&k("attention.key_length"), spec.head_dim as u32);
    w.add_u32(&k("attention.value_length"), spec.head_dim as u32);
    w.add_f32(&k("attention.layer_norm_rms_epsilon"), spec.eps);
    w.add_u32(&k("rope.dimension_count"), spec.n_rot as u32);
    w.add_f32(&k("rope.freq_base"), spec.rope_base);
    w.add_u32(&k("vocab_size"), spec.n_vocab as u32);
    if spec.arch == TestArch::Qwen35 {
        w.add_array_i32(&k("rope.dimension_sections"), &spec.rope_sections);
        w.add_u32(&k("ssm.conv_kernel"), spec.ssm_conv_kernel as u32);
        w.add_u32(&k("ssm.state_size"), spec.ssm_d_state as u32);
        w.add_u32(&k("ssm.group_count"), spec.ssm_n_group as u32);
        w.add_u32(&k("ssm.time_step_rank"), spec.ssm_n_v_heads as u32);
        w.add_u32(&k("ssm.inner_size"), spec.ssm_inner() as u32);
        w.add_u32(
            &k("full_attention_interval"),
            spec.full_attention_interval as u32,
        );
        if spec.mtp {
            w.add_u32(&k("nextn_predict_layers"), 1);
        }
    }
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", pre);
    w.add_array_str("tokenizer.ggml.tokens", &vocab.tokens);
    w.add_array_i32("tokenizer.ggml.token_type", &vocab.token_types);
    w.add_array_str("tokenizer.ggml.merges", &vocab.merges);
    match spec.arch {
        TestArch::Qwen35 => {
            if let Some(id) = im_end {
                w.add_u32("tokenizer.ggml.eos_token_id", id);
            }
            if let Some(id) = eot {
                w.add_u32("tokenizer.ggml.padding_token_id", id);
                w.add_u32("tokenizer.ggml.bos_token_id", id);
            }
            w.add_bool("tokenizer.ggml.add_bos_token", false);
        }
        TestArch::Llama => {
            if let Some(id) = bos {
                w.add_u32("tokenizer.ggml.bos_token_id", id);
            }
            if let Some(id) = im_end {
                w.add_u32("tokenizer.ggml.eos_token_id", id);
            }
            w.add_bool("tokenizer.ggml.add_bos_token", true);
        }
    }
    w.add_string("tokenizer.chat_template", CHATML_TEMPLATE);

    let mut b = Builder { spec, w };
    let (h, v) = (spec.n_embd, spec.n_vocab);
    let emb_std = match spec.style {
        WeightStyle::Varied => 0.02,
        WeightStyle::Repetitive => 1.0,
    };
    let emb = WeightRng::new(spec.seed, "token_embd.weight").fill(v * h, 0.0, emb_std);
    b.w.add_tensor_f32("token_embd.weight", &[h as u64, v as u64], spec.wtype, &emb)?;
    drop(emb);
    b.norm("output_norm.weight", h)?;
    if spec.style == WeightStyle::Varied {
        b.matrix("output.weight", v, h, 1.0)?;
    }
    for i in 0..spec.n_layer {
        b.norm(&format!("blk.{i}.attn_norm.weight"), h)?;
        match spec.arch {
            TestArch::Qwen35 => {
                if spec.is_recurrent(i) {
                    b.gdn(i)?;
                } else {
                    b.attention(i, true, true)?;
                }
                b.norm(&format!("blk.{i}.post_attention_norm.weight"), h)?;
            }
            TestArch::Llama => {
                b.attention(i, false, false)?;
                b.norm(&format!("blk.{i}.ffn_norm.weight"), h)?;
            }
        }
        b.ffn(i)?;
    }
    if spec.mtp {
        let i = spec.n_layer;
        b.matrix(&format!("blk.{i}.nextn.eh_proj.weight"), h, 2 * h, 1.0)?;
        b.norm(&format!("blk.{i}.nextn.enorm.weight"), h)?;
        b.norm(&format!("blk.{i}.nextn.hnorm.weight"), h)?;
        b.norm(&format!("blk.{i}.nextn.shared_head_norm.weight"), h)?;
        b.norm(&format!("blk.{i}.attn_norm.weight"), h)?;
        b.attention(i, true, true)?;
        b.norm(&format!("blk.{i}.post_attention_norm.weight"), h)?;
        b.ffn(i)?;
    }
    b.w.write(path)?;
    Ok(())
}

/// llama.cpp `general.file_type` (`LLAMA_FTYPE_*`) for the matrix type.
fn file_type(t: TensorType) -> u32 {
    match t {
        TensorType::F32 => 0,
        TensorType::F16 => 1,
        TensorType::Q4_0 => 2,
        TensorType::Q8_0 => 7,
        TensorType::BF16 => 32,
        _ => 0,
    }
}

fn validate(s: &TestModelSpec) -> Result<(), TestModelError> {
    let bad = |m: String| Err(TestModelError::Invalid(m));
    if !s.n_head.is_multiple_of(s.n_head_kv) {
        return bad(format!(
            "n_head {} not a multiple of n_head_kv {}",
            s.n_head, s.n_head_kv
        ));
    }
    if s.n_rot > s.head_dim || !s.n_rot.is_multiple_of(2) {
        return bad(format!(
            "n_rot {} invalid for head_dim {}",
            s.n_rot, s.head_dim
        ));
    }
    let block = match s.wtype {
        TensorType::Q8_0 | TensorType::Q4_0 => 32,
        TensorType::F32 | TensorType::F16 | TensorType::BF16 => 1,
        t => return bad(format!("weight type {t:?} is not offered for test models")),
    };
    let mut dims = vec![s.n_embd, s.n_ff, s.n_head * s.head_dim];
    if s.arch == TestArch::Qwen35 {
        dims.push(s.ssm_inner());
        if !s.ssm_n_v_heads.is_multiple_of(s.ssm_n_group) {
            return bad("ssm value heads must be a multiple of key heads".into());
        }
    }
    if dims.iter().any(|d| d % block != 0) {
        return bad(format!(
            "dimensions {dims:?} must be multiples of {block} for {:?}",
            s.wtype
        ));
    }
    if s.arch == TestArch::Llama && s.mtp {
        return bad("MTP blocks exist only for qwen35".into());
    }
    Ok(())
}
