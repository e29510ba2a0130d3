//! Writes a [`TestModelSpec`] as a GGUF file.

use crate::mix::{self, ModelInfo, Quant};
use crate::rng::WeightRng;
use crate::{TestArch, TestModelError, TestModelSpec, WeightStyle, CORPUS};
use specd_gguf::{quant, GgufError, GgufWriter, TensorSink, TensorType};
use specd_tokenizer::{pad_vocab, train_bpe, TokenType, CHATML_TEMPLATE};
use std::path::Path;

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Qwen2.5/3-Coder's fill-in-the-middle tokens (control tokens, in their vocabulary's order),
/// with the `tokenizer.ggml.*_token_id` key that names each: prefix, middle, suffix, padding,
/// and the repo-level format's repository and file markers. They follow the trained tokens, so
/// adding them moved no other token.
const FIM: [(&str, &str); 6] = [
    ("<|fim_prefix|>", "fim_pre"),
    ("<|fim_middle|>", "fim_mid"),
    ("<|fim_suffix|>", "fim_suf"),
    ("<|fim_pad|>", "fim_pad"),
    ("<|repo_name|>", "fim_rep"),
    ("<|file_sep|>", "fim_sep"),
];

/// How a tensor's values are drawn (from its own seeded stream, keyed by its name).
#[derive(Debug, Clone, Copy)]
enum Gen {
    /// Standard deviation `std` around `mean` (see [`WeightRng::fill`]).
    Normal { mean: f32, std: f32 },
    /// Uniform in `[lo, hi)`.
    Uniform { lo: f32, hi: f32 },
}

/// One tensor of the model, before any value is generated.
struct TensorDef {
    name: String,
    /// ggml `ne` order: `[row length, rows]` for a matrix.
    dims: Vec<u64>,
    gen: Gen,
}

/// The tensor list of a model, in file order (the order llama.cpp's converter writes).
struct Builder<'a> {
    spec: &'a TestModelSpec,
    tensors: Vec<TensorDef>,
}

impl Builder<'_> {
    fn push(&mut self, name: &str, dims: &[usize], gen: Gen) {
        self.tensors.push(TensorDef {
            name: name.into(),
            dims: dims.iter().map(|&d| d as u64).collect(),
            gen,
        });
    }
    /// A 2-D weight `[out, in]` (GGUF ne `[in, out]`) with std 1/√in (times `gain`).
    fn matrix(&mut self, name: &str, rows: usize, cols: usize, gain: f32) {
        let std = gain / (cols as f32).sqrt();
        self.push(name, &[cols, rows], Gen::Normal { mean: 0.0, std });
    }
    /// A norm weight (stored as 1 + w, like the converter does).
    fn norm(&mut self, name: &str, n: usize) {
        self.push(
            name,
            &[n],
            Gen::Normal {
                mean: 1.0,
                std: 0.1,
            },
        );
    }

    fn attention(&mut self, i: usize, gated: bool, qk_norm: bool) {
        let s = self.spec;
        let (h, qd, kvd) = (s.n_embd, s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
        self.matrix(
            &format!("blk.{i}.attn_q.weight"),
            if gated { 2 * qd } else { qd },
            h,
            1.0,
        );
        self.matrix(&format!("blk.{i}.attn_k.weight"), kvd, h, 1.0);
        self.matrix(&format!("blk.{i}.attn_v.weight"), kvd, h, 1.0);
        if qk_norm {
            self.norm(&format!("blk.{i}.attn_q_norm.weight"), s.head_dim);
            self.norm(&format!("blk.{i}.attn_k_norm.weight"), s.head_dim);
        }
        self.matrix(&format!("blk.{i}.attn_output.weight"), h, qd, 1.0)
    }

    fn gdn(&mut self, i: usize) {
        let s = self.spec;
        let h = s.n_embd;
        let (cd, inner, nv) = (s.conv_dim(), s.ssm_inner(), s.ssm_n_v_heads);
        self.matrix(&format!("blk.{i}.attn_qkv.weight"), cd, h, 1.0);
        self.matrix(&format!("blk.{i}.attn_gate.weight"), inner, h, 1.0);
        if s.arch == TestArch::Qwen3Next {
            // β and α in one matrix, grouped by key head (see specd-models' qwen3next).
            self.matrix(&format!("blk.{i}.ssm_ba.weight"), 2 * nv, h, 1.0);
        } else {
            self.matrix(&format!("blk.{i}.ssm_beta.weight"), nv, h, 1.0);
            self.matrix(&format!("blk.{i}.ssm_alpha.weight"), nv, h, 1.0);
        }
        let k = s.ssm_conv_kernel;
        self.push(
            &format!("blk.{i}.ssm_conv1d.weight"),
            &[k, cd],
            Gen::Normal {
                mean: 0.0,
                std: 0.5,
            },
        );
        self.push(
            &format!("blk.{i}.ssm_dt.bias"),
            &[nv],
            Gen::Normal {
                mean: 0.0,
                std: 0.5,
            },
        );
        // A = −exp(A_log) with a slow decay, so the recurrent state carries information.
        self.push(
            &format!("blk.{i}.ssm_a"),
            &[nv],
            Gen::Uniform {
                lo: -1.0,
                hi: -0.05,
            },
        );
        self.norm(&format!("blk.{i}.ssm_norm.weight"), s.ssm_d_state);
        self.matrix(&format!("blk.{i}.ssm_out.weight"), h, inner, 1.0)
    }

    /// `n` stacked `[out, in]` matrices (GGUF ne `[in, out, n]`), std 1/√in.
    fn stacked(&mut self, name: &str, n: usize, rows: usize, cols: usize) {
        let std = 1.0 / (cols as f32).sqrt();
        self.push(name, &[cols, rows, n], Gen::Normal { mean: 0.0, std });
    }

    /// The MoE FFN of qwen35moe and qwen3next: router, stacked experts, gated shared expert.
    fn moe(&mut self, i: usize) {
        let s = self.spec;
        let (h, ne, ff, sh) = (s.n_embd, s.n_expert, s.n_ff_exp, s.n_ff_shexp);
        self.matrix(&format!("blk.{i}.ffn_gate_inp.weight"), ne, h, 1.0);
        self.stacked(&format!("blk.{i}.ffn_gate_exps.weight"), ne, ff, h);
        self.stacked(&format!("blk.{i}.ffn_up_exps.weight"), ne, ff, h);
        self.stacked(&format!("blk.{i}.ffn_down_exps.weight"), ne, h, ff);
        self.push(
            &format!("blk.{i}.ffn_gate_inp_shexp.weight"),
            &[h],
            Gen::Normal {
                mean: 0.0,
                std: 1.0 / (h as f32).sqrt(),
            },
        );
        self.matrix(&format!("blk.{i}.ffn_gate_shexp.weight"), sh, h, 1.0);
        self.matrix(&format!("blk.{i}.ffn_up_shexp.weight"), sh, h, 1.0);
        self.matrix(&format!("blk.{i}.ffn_down_shexp.weight"), h, sh, 1.0)
    }

    fn ffn(&mut self, i: usize) {
        let s = self.spec;
        self.matrix(&format!("blk.{i}.ffn_gate.weight"), s.n_ff, s.n_embd, 1.0);
        self.matrix(&format!("blk.{i}.ffn_up.weight"), s.n_ff, s.n_embd, 1.0);
        self.matrix(&format!("blk.{i}.ffn_down.weight"), s.n_embd, s.n_ff, 1.0)
    }

    /// Every tensor of the model, in file order.
    fn build(mut self) -> Vec<TensorDef> {
        let spec = self.spec;
        let (h, v) = (spec.n_embd, spec.n_vocab);
        let emb_std = match spec.style {
            WeightStyle::Varied => 0.02,
            WeightStyle::Repetitive => 1.0,
        };
        self.push(
            "token_embd.weight",
            &[h, v],
            Gen::Normal {
                mean: 0.0,
                std: emb_std,
            },
        );
        self.norm("output_norm.weight", h);
        if spec.style == WeightStyle::Varied {
            self.matrix("output.weight", v, h, 1.0);
        }
        for i in 0..spec.n_layer {
            self.norm(&format!("blk.{i}.attn_norm.weight"), h);
            match spec.arch {
                TestArch::Qwen35 | TestArch::Qwen35Moe | TestArch::Qwen3Next => {
                    if spec.is_recurrent(i) {
                        self.gdn(i);
                    } else {
                        self.attention(i, true, true);
                    }
                    self.norm(&format!("blk.{i}.post_attention_norm.weight"), h);
                }
                TestArch::Llama => {
                    self.attention(i, false, false);
                    self.norm(&format!("blk.{i}.ffn_norm.weight"), h);
                }
            }
            if spec.arch.is_moe() {
                self.moe(i);
            } else {
                self.ffn(i);
            }
        }
        if spec.mtp {
            let i = spec.n_layer;
            self.matrix(&format!("blk.{i}.nextn.eh_proj.weight"), h, 2 * h, 1.0);
            self.norm(&format!("blk.{i}.nextn.enorm.weight"), h);
            self.norm(&format!("blk.{i}.nextn.hnorm.weight"), h);
            self.norm(&format!("blk.{i}.nextn.shared_head_norm.weight"), h);
            self.norm(&format!("blk.{i}.attn_norm.weight"), h);
            self.attention(i, true, true);
            self.norm(&format!("blk.{i}.post_attention_norm.weight"), h);
            // The MTP block's FFN is the trunk's kind.
            if spec.arch.is_moe() {
                self.moe(i);
            } else {
                self.ffn(i);
            }
        }
        self.tensors
    }
}

/// Values generated (and quantised) at a time: bounds the memory of writing a model whose
/// largest tensor (a 9B model's 248320 × 4096 embedding: 4 GB as f32) would not fit comfortably.
const CHUNK_VALUES: usize = 1 << 22;

/// Generates tensor `t` row chunk by row chunk, quantising each chunk to `ttype` as it goes.
/// Blocks never straddle rows, so the bytes equal those of quantising the whole tensor, and the
/// seeded stream continues across chunks, so the values equal those of one long draw.
fn stream_tensor(
    seed: u64,
    t: &TensorDef,
    ttype: TensorType,
    chunk_values: usize,
    sink: &mut TensorSink<'_>,
) -> Result<(), GgufError> {
    let row = t.dims[0] as usize;
    let n: usize = t.dims.iter().map(|&d| d as usize).product();
    let chunk = (chunk_values / row).max(1) * row;
    let mut rng = WeightRng::new(seed, &t.name);
    let mut done = 0;
    while done < n {
        let k = chunk.min(n - done);
        let x = match t.gen {
            Gen::Normal { mean, std } => rng.fill(k, mean, std),
            Gen::Uniform { lo, hi } => rng.uniform(k, lo, hi),
        };
        sink.write(&quantize_rows(ttype, &x, row)?)?;
        done += k;
    }
    Ok(())
}

/// Quantises whole rows, split over the available cores (the K-quant and IQ4 searches dominate
/// the time of writing a large model).
fn quantize_rows(ttype: TensorType, x: &[f32], row: usize) -> Result<Vec<u8>, GgufError> {
    let rows = x.len() / row;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(rows);
    if threads <= 1 || x.len() < (1 << 16) {
        return quant::quantize(ttype, x);
    }
    let per = rows.div_ceil(threads) * row;
    let parts: Vec<Result<Vec<u8>, GgufError>> = std::thread::scope(|s| {
        let handles: Vec<_> = x
            .chunks(per)
            .map(|c| s.spawn(move || quant::quantize(ttype, c)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(GgufError::Invalid("a quantisation thread panicked".into()))
                })
            })
            .collect()
    });
    let mut out = Vec::with_capacity(ttype.row_bytes(x.len()));
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out)
}

/// The quantisation of `spec`: its mix if it has one, else its single weight type.
pub fn quant_of(spec: &TestModelSpec) -> Quant {
    match spec.mix {
        Some(m) => Quant::Mix(m),
        None => Quant::Uniform(spec.wtype),
    }
}

/// The stored type of every tensor of `spec`, by name, in file order (without generating any
/// weights).
pub fn tensor_types(spec: &TestModelSpec) -> Result<Vec<(String, TensorType)>, TestModelError> {
    validate(spec)?;
    let defs = Builder {
        spec,
        tensors: Vec::new(),
    }
    .build();
    let types = plan_types(spec, &defs)?;
    Ok(defs.into_iter().map(|d| d.name).zip(types).collect())
}

fn plan_types(spec: &TestModelSpec, defs: &[TensorDef]) -> Result<Vec<TensorType>, TestModelError> {
    let list: Vec<(&str, &[u64])> = defs
        .iter()
        .map(|d| (d.name.as_str(), d.dims.as_slice()))
        .collect();
    let info = ModelInfo {
        n_gqa: spec.n_head / spec.n_head_kv.max(1),
        n_blocks: spec.n_layer + usize::from(spec.mtp),
        n_expert: if spec.arch.is_moe() { spec.n_expert } else { 0 },
    };
    mix::plan(quant_of(spec), &list, info).map_err(TestModelError::Invalid)
}

/// Generates the model described by `spec` and writes it to `path`.
pub fn write_model(spec: &TestModelSpec, path: &Path) -> Result<(), TestModelError> {
    validate(spec)?;
    let arch = spec.arch.name();
    let pre = match spec.arch {
        TestArch::Qwen35 | TestArch::Qwen35Moe => "qwen35",
        // Qwen3-Next's tokenizer predates Qwen3.5's pre-tokenizer change.
        TestArch::Qwen3Next => "qwen2",
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
    let n_fim = if spec.fim { FIM.len() } else { 0 };
    if vocab.tokens.len() + n_fim > spec.n_vocab {
        return Err(TestModelError::Invalid(format!(
            "trained vocabulary ({}) and {} FIM tokens exceed n_vocab {}",
            vocab.tokens.len(),
            n_fim,
            spec.n_vocab
        )));
    }
    for (text, _) in FIM.iter().filter(|_| spec.fim) {
        vocab.tokens.push(text.to_string());
        vocab.token_types.push(TokenType::Control.to_i32());
    }
    let id_of = |t: &str| vocab.tokens.iter().position(|x| x == t).map(|i| i as u32);
    let (eot, bos, im_end) = (id_of(SPECIALS[0]), id_of(SPECIALS[1]), id_of(SPECIALS[2]));
    let fim_ids: Vec<(&str, Option<u32>)> = FIM.iter().map(|(t, k)| (*k, id_of(t))).collect();
    pad_vocab(&mut vocab, spec.n_vocab)?;

    let mut w = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    let n_blocks = spec.n_layer + usize::from(spec.mtp);
    w.add_string("general.architecture", arch);
    w.add_string("general.name", &format!("specd synthetic {}", spec.name));
    w.add_u32("general.file_type", quant_of(spec).file_type());
    if !matches!(
        quant_of(spec),
        Quant::Uniform(TensorType::F32 | TensorType::F16 | TensorType::BF16)
    ) {
        // As llama-quantize writes (GGML_QNT_VERSION): the block formats' current revision.
        w.add_u32("general.quantization_version", 2);
    }
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
    if spec.arch.is_moe() {
        w.add_u32(&k("expert_count"), spec.n_expert as u32);
        w.add_u32(&k("expert_used_count"), spec.n_expert_used as u32);
        w.add_u32(&k("expert_feed_forward_length"), spec.n_ff_exp as u32);
        w.add_u32(
            &k("expert_shared_feed_forward_length"),
            spec.n_ff_shexp as u32,
        );
    }
    if matches!(spec.arch, TestArch::Qwen35 | TestArch::Qwen35Moe) {
        // IMROPE's sections (qwen3next rotates NEOX).
        w.add_array_i32(&k("rope.dimension_sections"), &spec.rope_sections);
    }
    if spec.arch.is_hybrid() {
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
        TestArch::Qwen35 | TestArch::Qwen35Moe | TestArch::Qwen3Next => {
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
    for (key, id) in fim_ids {
        if let Some(id) = id {
            w.add_u32(&format!("tokenizer.ggml.{key}_token_id"), id);
        }
    }
    w.add_string("tokenizer.chat_template", CHATML_TEMPLATE);

    let defs = Builder {
        spec,
        tensors: Vec::new(),
    }
    .build();
    let types = plan_types(spec, &defs)?;
    for (d, t) in defs.iter().zip(&types) {
        w.declare_tensor(&d.name, &d.dims, *t)?;
    }
    let mut next = defs.iter().zip(&types);
    w.write_streaming(path, |name, sink| {
        // Declared tensors are filled in declaration order.
        let (d, t) = next
            .next()
            .filter(|(d, _)| d.name == name)
            .ok_or_else(|| GgufError::Invalid(format!("unexpected tensor {name}")))?;
        stream_tensor(spec.seed, d, *t, CHUNK_VALUES, sink)
    })?;
    Ok(())
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
    if s.mix.is_none() && !s.wtype.can_quantize() {
        return bad(format!(
            "weight type {} is not offered for test models",
            s.wtype
        ));
    }
    if s.arch.is_hybrid() && !s.ssm_n_v_heads.is_multiple_of(s.ssm_n_group) {
        return bad("ssm value heads must be a multiple of key heads".into());
    }
    // Row lengths that fit no block of the chosen types are reported by the type plan.
    if !s.arch.is_hybrid() && s.mtp {
        return bad(
            "MTP blocks exist only for the Qwen3.5 family (qwen35, qwen35moe, qwen3next)".into(),
        );
    }
    if s.arch.is_moe()
        && (s.n_expert == 0
            || s.n_expert_used == 0
            || s.n_expert_used > s.n_expert
            || s.n_ff_exp == 0
            || s.n_ff_shexp == 0)
    {
        return bad(format!(
            "experts: {} used of {}, widths {} / {}",
            s.n_expert_used, s.n_expert, s.n_ff_exp, s.n_ff_shexp
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_generation_writes_the_same_bytes() {
        // 50 rows of 256 in chunks of 7 rows (and one row) give the bytes of a single chunk.
        let def = TensorDef {
            name: "blk.0.ffn_up.weight".into(),
            dims: vec![256, 50],
            gen: Gen::Normal {
                mean: 0.0,
                std: 0.1,
            },
        };
        let dir = std::env::temp_dir().join(format!("specd-chunk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = Vec::new();
        for (k, chunk) in [1usize << 20, 7 * 256, 1].into_iter().enumerate() {
            for t in [TensorType::Q4_K, TensorType::IQ4_XS, TensorType::F32] {
                let p = dir.join(format!("{k}-{t}.gguf"));
                let mut w = GgufWriter::new();
                w.declare_tensor(&def.name, &def.dims, t).unwrap();
                w.write_streaming(&p, |_, sink| stream_tensor(42, &def, t, chunk, sink))
                    .unwrap();
                files.push((t, std::fs::read(&p).unwrap()));
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
        for (t, bytes) in &files[3..] {
            let first = files.iter().find(|(x, _)| x == t).unwrap();
            assert!(first.1 == *bytes, "{t}: chunking changed the bytes");
        }
    }
}
