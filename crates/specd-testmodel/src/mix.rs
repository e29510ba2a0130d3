//! Per-tensor quantisation types: llama.cpp's `llama-quantize` mixes (the files people download)
//! and single types.
//!
//! The rules below are a re-statement of what `llama_tensor_get_type` in llama.cpp's
//! `src/llama-quant.cpp` decides for the file types offered here, quantising from F16/F32 without
//! an importance matrix, for dense (non-MoE) `qwen35` and `llama` models:
//!
//! * Only tensors with ≥ 2 dimensions whose name ends in `weight` are quantised, except norms
//!   (`*_norm.weight`) and the Gated DeltaNet's `ssm_conv1d`; everything else (1-D tensors,
//!   `ssm_a`, `ssm_dt.bias`, norms, conv) stays as it is (F32 here).
//! * `output.weight` — and `token_embd.weight` when there is no `output.weight` (tied
//!   embeddings) — becomes Q6_K, or Q8_0 when its row length is not a multiple of the mix's base
//!   block, and stays Q8_0 in a Q8_0 file. An untied `token_embd.weight` keeps the base type.
//! * "attn_v-like" tensors (`attn_v`, `attn_qkv` — in qwen35 that is the Gated DeltaNet's fused
//!   q/k/v projection — and `attn_kv_b`), counted in file order: Q4_K_M and Q5_K_M promote them to
//!   Q6_K where [`use_more_bits`] holds; IQ4_XS / IQ4_NL promote them to Q5_K when the model has
//!   ≥ 4 query heads per KV head.
//! * `ffn_down`, counted in file order over `block_count` layers: Q4_K_M and Q5_K_M promote to
//!   Q6_K where [`use_more_bits`] holds; IQ4_XS / IQ4_NL promote the first eighth of the layers
//!   to Q5_K.
//! * Everything else (attn_q/k/output, the DeltaNet's attn_gate, ssm_alpha, ssm_beta, ssm_out,
//!   ffn_gate/up, the MTP block's eh_proj) keeps the base type.
//! * Mixture-of-experts models (`expert_count` > 1; 3-D expert tensors are quantised like
//!   matrices, the router `ffn_gate_inp` is never quantised): the ffn_down rule's layer is the
//!   `blk.N` of the tensor's name instead of the running count, so a layer's routed
//!   (`ffn_down_exps`) and shared (`ffn_down_shexp`) down projections are promoted together.
//!   With exactly 8 experts, attn_v-like tensors and `attn_k` become Q8_0 in every mix here,
//!   and `attn_output` Q5_K in Q4_K_M and IQ4_XS.
//! * Finally the row-length fallback: a type whose block does not divide the row length (`ne[0]`)
//!   is replaced — Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, IQ4_XS → IQ4_NL, Q2_K / Q3_K → Q4_0 —
//!   and by F16 if even that block does not fit. (llama.cpp's current source sends Q2_K / Q3_K to
//!   Q4_0; older releases used IQ4_NL.) The fallback applies to single types too, as it does for
//!   `llama-quantize --pure`.
//!
//! "File order" is llama.cpp's loader order: tensors sorted by layer number, then by name.
//! `scripts/check_quant_mix.py` compares these choices with `llama-quantize` itself.
//!
//! [`Mix::Q4KXl`] is specd's own dynamic mix in the spirit of unsloth's "UD-Q4_K_XL" files (there
//! is no llama.cpp rule for it): mostly Q4_K, with
//! * `output.weight` (and tied embeddings) Q6_K, as in Q4_K_M;
//! * `ssm_alpha` / `ssm_beta` (tiny projections gating the DeltaNet recurrence) Q8_0;
//! * attn_v-like tensors Q6_K where [`use_more_bits`] holds, Q5_K elsewhere;
//! * the full-attention layers' attn_q / attn_k / attn_output and the DeltaNet's ssm_out Q5_K;
//! * `ffn_down` Q6_K where [`use_more_bits`] holds (as Q4_K_M);
//! * in the other layers `ffn_up` IQ4_XS and `ffn_gate` IQ4_NL, so one file exercises both
//!   non-linear formats;
//! * the same row-length fallback; `general.file_type` says Q4_K_M, as such files do.

use specd_gguf::TensorType;

/// The llama-quantize file types (mixes) a test model can be written in.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    Q4_K_M,
    Q5_K_M,
    Q6_K,
    IQ4_XS,
    /// specd's unsloth-"UD-Q4_K_XL"-like dynamic mix (see the module documentation).
    Q4KXl,
}

impl Mix {
    /// All mixes, in the order of [`Mix::NAMES`].
    pub const ALL: [Mix; 5] = [Mix::Q4_K_M, Mix::Q5_K_M, Mix::Q6_K, Mix::IQ4_XS, Mix::Q4KXl];
    /// Their names (lower case, as `--type` takes them).
    pub const NAMES: [&'static str; 5] = ["q4_k_m", "q5_k_m", "q6_k", "iq4_xs", "q4_k_xl"];

    /// Parses a mix name (case-insensitive; `ud-q4_k_xl` is accepted for `q4_k_xl`).
    pub fn parse(s: &str) -> Option<Mix> {
        let s = s.to_ascii_lowercase();
        let s = s.strip_prefix("ud-").unwrap_or(&s);
        Mix::NAMES.iter().position(|n| *n == s).map(|i| Mix::ALL[i])
    }
    /// The name.
    pub fn name(self) -> &'static str {
        Mix::NAMES[Mix::ALL.iter().position(|m| *m == self).unwrap_or(0)]
    }
    /// The type most tensors get.
    pub fn base(self) -> TensorType {
        match self {
            Mix::Q4_K_M | Mix::Q4KXl => TensorType::Q4_K,
            Mix::Q5_K_M => TensorType::Q5_K,
            Mix::Q6_K => TensorType::Q6_K,
            Mix::IQ4_XS => TensorType::IQ4_XS,
        }
    }
    /// `general.file_type` (llama.cpp's `LLAMA_FTYPE_MOSTLY_*`).
    pub fn file_type(self) -> u32 {
        match self {
            Mix::Q4_K_M | Mix::Q4KXl => 15,
            Mix::Q5_K_M => 17,
            Mix::Q6_K => 18,
            Mix::IQ4_XS => 30,
        }
    }
}

/// How a model's weights are quantised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    /// One type for every quantisable tensor (like `llama-quantize --pure`), with the row-length
    /// fallback.
    Uniform(TensorType),
    /// A llama-quantize mix.
    Mix(Mix),
}

impl Quant {
    /// `general.file_type`. Single K-quant types report the "S" (small, least promoted) file
    /// type of their family.
    pub fn file_type(self) -> u32 {
        match self {
            Quant::Mix(m) => m.file_type(),
            Quant::Uniform(t) => match t {
                TensorType::F32 => 0,
                TensorType::F16 => 1,
                TensorType::Q4_0 => 2,
                TensorType::Q4_1 => 3,
                TensorType::Q8_0 => 7,
                TensorType::Q5_0 => 8,
                TensorType::Q5_1 => 9,
                TensorType::Q2_K => 10,
                TensorType::Q3_K => 11,
                TensorType::Q4_K => 14,
                TensorType::Q5_K => 16,
                TensorType::Q6_K => 18,
                TensorType::IQ4_NL => 25,
                TensorType::IQ4_XS => 30,
                TensorType::BF16 => 32,
                _ => 0,
            },
        }
    }
}

/// What the rules need to know about the model besides its tensor list.
#[derive(Debug, Clone, Copy)]
pub struct ModelInfo {
    /// Query heads per KV head.
    pub n_gqa: usize,
    /// `block_count` (trunk layers plus MTP blocks): the layer count of the ffn_down rules.
    pub n_blocks: usize,
    /// `expert_count` (0 for dense models).
    pub n_expert: usize,
}

/// llama.cpp's "use more bits" layer pattern: the first and last eighth of the layers and every
/// third layer in between.
pub fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Would llama-quantize quantise this tensor (rather than copy it)?
pub fn is_quantisable(name: &str, dims: &[u64]) -> bool {
    dims.len() >= 2
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && !name.contains("ssm_conv1d")
        && !name.contains("ffn_gate_inp.weight")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    Output,
    AttnVLike,
    AttnQ,
    AttnK,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if name == "token_embd.weight" {
        return TokenEmbd;
    }
    let has = |s: &str| name.contains(s);
    if has("attn_qkv.weight") || has("attn_kv_b.weight") || has("attn_v.weight") {
        AttnVLike
    } else if has("attn_k.weight") {
        AttnK
    } else if has("attn_q.weight") {
        AttnQ
    } else if has("attn_output.weight") {
        AttnOutput
    } else if has("ffn_up") {
        FfnUp
    } else if has("ffn_gate") {
        FfnGate
    } else if has("ffn_down") {
        FfnDown
    } else {
        Other
    }
}

/// Layer of `blk.N.*`, or −1 (llama.cpp's loader sorts on this, then on the name).
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// The row-length fallback: `t` if its block divides `ne0`, else llama.cpp's substitute.
pub fn fallback(t: TensorType, ne0: u64) -> Result<TensorType, String> {
    if ne0.is_multiple_of(t.block_size() as u64) {
        return Ok(t);
    }
    let sub = match t {
        TensorType::IQ4_XS => TensorType::IQ4_NL,
        TensorType::Q2_K | TensorType::Q3_K => TensorType::Q4_0,
        TensorType::Q4_K => TensorType::Q5_0,
        TensorType::Q5_K => TensorType::Q5_1,
        TensorType::Q6_K => TensorType::Q8_0,
        _ => {
            return Err(format!(
                "rows of {ne0} values do not fit {t} blocks of {} and {t} has no fallback type",
                t.block_size()
            ))
        }
    };
    Ok(if ne0.is_multiple_of(sub.block_size() as u64) {
        sub
    } else {
        TensorType::F16
    })
}

/// The stored type of every tensor (`(name, ggml ne)` in file order; the answer is in the same
/// order). Tensors that are not quantised get F32 (what the generator produces).
pub fn plan(
    quant: Quant,
    tensors: &[(&str, &[u64])],
    info: ModelInfo,
) -> Result<Vec<TensorType>, String> {
    let mut out = vec![TensorType::F32; tensors.len()];
    let base = match quant {
        Quant::Uniform(t) => t,
        Quant::Mix(m) => m.base(),
    };
    // llama.cpp visits tensors sorted by (layer, name); its counters follow that order.
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (na, nb) = (tensors[a].0, tensors[b].0);
        (layer_of(na), na).cmp(&(layer_of(nb), nb))
    });
    let tied = !tensors.iter().any(|(n, _)| *n == "output.weight");
    let n_wv = tensors
        .iter()
        .filter(|(n, _)| category(n) == Category::AttnVLike)
        .count();
    let (mut i_wv, mut i_down) = (0usize, 0usize);
    let moe = info.n_expert > 1;
    for i in order {
        let (name, dims) = tensors[i];
        if !is_quantisable(name, dims) {
            continue;
        }
        let ne0 = dims[0];
        let quantised = !matches!(base, TensorType::F32 | TensorType::F16 | TensorType::BF16);
        let t = match quant {
            _ if !quantised => base,
            Quant::Uniform(t) => t,
            Quant::Mix(m) => {
                let cat = category(name);
                // In MoE models llama.cpp takes the ffn_down layer from the name (expert
                // tensors of other models are not always stored in layer order).
                let down_layer = if moe && cat == Category::FfnDown {
                    usize::try_from(layer_of(name))
                        .map_err(|_| format!("{name}: no layer number in the name"))?
                } else {
                    i_down
                };
                let at = Position {
                    tied,
                    n_gqa: info.n_gqa,
                    n_expert: info.n_expert,
                    wv: (i_wv, n_wv),
                    down: (down_layer, info.n_blocks),
                };
                let t = rule(m, name, cat, ne0, at);
                // The counters advance only where llama.cpp's branches advance them.
                let head = cat == Category::Output || (tied && cat == Category::TokenEmbd);
                if !head && cat == Category::AttnVLike {
                    i_wv += 1;
                }
                if !head && cat == Category::FfnDown {
                    i_down += 1;
                }
                t
            }
        };
        out[i] = if quantised {
            fallback(t, ne0).map_err(|e| format!("{name}: {e}"))?
        } else {
            t
        };
    }
    Ok(out)
}

/// Where a tensor sits, for the rules.
struct Position {
    /// No `output.weight`: the embedding doubles as the LM head.
    tied: bool,
    n_gqa: usize,
    n_expert: usize,
    /// (index among attn_v-like tensors, their count).
    wv: (usize, usize),
    /// (index among ffn_down tensors, layer count).
    down: (usize, usize),
}

/// The type before the row-length fallback.
fn rule(m: Mix, name: &str, cat: Category, ne0: u64, at: Position) -> TensorType {
    use Category::*;
    let Position {
        tied,
        n_gqa,
        n_expert,
        wv: (i_wv, n_wv),
        down: (i_down, n_down),
    } = at;
    use TensorType as T;
    let base = m.base();
    if cat == Output || (tied && cat == TokenEmbd) {
        return if !ne0.is_multiple_of(base.block_size() as u64) || base == T::Q8_0 {
            T::Q8_0
        } else {
            T::Q6_K
        };
    }
    if m == Mix::Q4KXl {
        if name.ends_with("ssm_alpha.weight") || name.ends_with("ssm_beta.weight") {
            return T::Q8_0;
        }
        if name.ends_with("ssm_out.weight") {
            return T::Q5_K;
        }
        return match cat {
            AttnVLike if use_more_bits(i_wv, n_wv) => T::Q6_K,
            AttnVLike | AttnQ | AttnK | AttnOutput => T::Q5_K,
            FfnDown if use_more_bits(i_down, n_down) => T::Q6_K,
            FfnUp | FfnGate if !use_more_bits(i_down, n_down) => {
                if cat == FfnUp {
                    T::IQ4_XS
                } else {
                    T::IQ4_NL
                }
            }
            _ => base,
        };
    }
    match (m, cat) {
        // llama.cpp's special case for 8-expert models (Mixtral-like): cheap extra bits on the
        // small attention projections.
        (_, AttnVLike | AttnK) if n_expert == 8 => T::Q8_0,
        (Mix::Q4_K_M | Mix::IQ4_XS, AttnOutput) if n_expert == 8 => T::Q5_K,
        (Mix::IQ4_XS, AttnVLike) if n_gqa >= 4 => T::Q5_K,
        (Mix::Q4_K_M | Mix::Q5_K_M, AttnVLike) if use_more_bits(i_wv, n_wv) => T::Q6_K,
        (Mix::Q4_K_M | Mix::Q5_K_M, FfnDown) if use_more_bits(i_down, n_down) => T::Q6_K,
        (Mix::IQ4_XS, FfnDown) if i_down < n_down / 8 => T::Q5_K,
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TensorType as T;

    /// A qwen35-like tensor list: `n` blocks, attention every 4th, row length `h`, FFN `ff`.
    fn qwen35(n: usize, h: u64, ff: u64, tied: bool) -> Vec<(String, Vec<u64>)> {
        let mut v = vec![("token_embd.weight".to_string(), vec![h, 1000])];
        v.push(("output_norm.weight".into(), vec![h]));
        if !tied {
            v.push(("output.weight".into(), vec![h, 1000]));
        }
        for i in 0..n {
            let m = |s: &str, d: Vec<u64>| (format!("blk.{i}.{s}"), d);
            v.push(m("attn_norm.weight", vec![h]));
            if (i + 1) % 4 == 0 {
                v.push(m("attn_q.weight", vec![h, 2 * h]));
                v.push(m("attn_k.weight", vec![h, h / 2]));
                v.push(m("attn_v.weight", vec![h, h / 2]));
                v.push(m("attn_q_norm.weight", vec![64]));
                v.push(m("attn_output.weight", vec![h, h]));
            } else {
                v.push(m("attn_qkv.weight", vec![h, 3 * h]));
                v.push(m("attn_gate.weight", vec![h, h]));
                v.push(m("ssm_beta.weight", vec![h, 8]));
                v.push(m("ssm_alpha.weight", vec![h, 8]));
                v.push(m("ssm_conv1d.weight", vec![4, 3 * h]));
                v.push(m("ssm_a", vec![8]));
                v.push(m("ssm_dt.bias", vec![8]));
                v.push(m("ssm_out.weight", vec![h, h]));
            }
            v.push(m("ffn_gate.weight", vec![h, ff]));
            v.push(m("ffn_up.weight", vec![h, ff]));
            v.push(m("ffn_down.weight", vec![ff, h]));
        }
        v
    }

    fn run(q: Quant, list: &[(String, Vec<u64>)], n_gqa: usize) -> Vec<(String, TensorType)> {
        let l: Vec<(&str, &[u64])> = list
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let n_blocks = list.iter().map(|(n, _)| layer_of(n) + 1).max().unwrap_or(0) as usize;
        let types = plan(
            q,
            &l,
            ModelInfo {
                n_gqa,
                n_blocks,
                n_expert: 0,
            },
        )
        .unwrap();
        list.iter().map(|(n, _)| n.clone()).zip(types).collect()
    }

    fn ty(p: &[(String, TensorType)], name: &str) -> TensorType {
        p.iter().find(|(n, _)| n == name).unwrap().1
    }

    #[test]
    fn use_more_bits_pattern() {
        let on = |n| (0..n).filter(|&i| use_more_bits(i, n)).collect::<Vec<_>>();
        assert_eq!(on(8), vec![0, 3, 6, 7]);
        assert_eq!(
            on(32),
            vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
    }

    #[test]
    fn fallback_types() {
        assert_eq!(fallback(T::Q4_K, 512), Ok(T::Q4_K));
        assert_eq!(fallback(T::Q4_K, 64), Ok(T::Q5_0));
        assert_eq!(fallback(T::Q5_K, 64), Ok(T::Q5_1));
        assert_eq!(fallback(T::Q6_K, 64), Ok(T::Q8_0));
        assert_eq!(fallback(T::IQ4_XS, 96), Ok(T::IQ4_NL));
        assert_eq!(fallback(T::Q2_K, 96), Ok(T::Q4_0));
        assert_eq!(fallback(T::Q3_K, 96), Ok(T::Q4_0));
        assert_eq!(fallback(T::Q4_K, 48), Ok(T::F16));
        assert!(fallback(T::Q8_0, 48).is_err());
    }

    #[test]
    fn q4_k_m_promotes_in_layer_order() {
        // 16 blocks: the counters must follow numeric layer order (blk.10 after blk.9), as
        // llama.cpp's loader sorts, not the lexicographic order of the names.
        let p = run(Quant::Mix(Mix::Q4_K_M), &qwen35(16, 256, 512, false), 2);
        for i in 0..16 {
            let v = if (i + 1) % 4 == 0 {
                "attn_v"
            } else {
                "attn_qkv"
            };
            let want = if use_more_bits(i, 16) {
                T::Q6_K
            } else {
                T::Q4_K
            };
            assert_eq!(ty(&p, &format!("blk.{i}.{v}.weight")), want, "{i}");
            assert_eq!(ty(&p, &format!("blk.{i}.ffn_down.weight")), want, "{i}");
            assert_eq!(ty(&p, &format!("blk.{i}.ffn_up.weight")), T::Q4_K);
        }
        assert_eq!(ty(&p, "output.weight"), T::Q6_K);
        assert_eq!(ty(&p, "token_embd.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.3.attn_q.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.0.ssm_beta.weight"), T::Q4_K);
        for f32_name in [
            "output_norm.weight",
            "blk.0.ssm_conv1d.weight",
            "blk.0.ssm_a",
            "blk.0.ssm_dt.bias",
            "blk.3.attn_q_norm.weight",
        ] {
            assert_eq!(ty(&p, f32_name), T::F32, "{f32_name}");
        }
    }

    #[test]
    fn tied_embeddings_get_the_output_type() {
        let p = run(Quant::Mix(Mix::Q5_K_M), &qwen35(4, 256, 512, true), 2);
        assert_eq!(ty(&p, "token_embd.weight"), T::Q6_K);
        // Rows that do not fit the base block: Q8_0.
        let p = run(Quant::Mix(Mix::Q5_K_M), &qwen35(4, 64, 128, true), 2);
        assert_eq!(ty(&p, "token_embd.weight"), T::Q8_0);
        let p = run(Quant::Mix(Mix::Q5_K_M), &qwen35(4, 64, 128, false), 2);
        assert_eq!(ty(&p, "output.weight"), T::Q8_0);
        assert_eq!(ty(&p, "token_embd.weight"), T::Q5_1);
    }

    #[test]
    fn iq4_xs_rules() {
        let list = qwen35(16, 256, 512, false);
        let p = run(Quant::Mix(Mix::IQ4_XS), &list, 2);
        assert_eq!(ty(&p, "blk.0.attn_qkv.weight"), T::IQ4_XS);
        assert_eq!(ty(&p, "blk.0.ffn_down.weight"), T::Q5_K);
        assert_eq!(ty(&p, "blk.1.ffn_down.weight"), T::Q5_K);
        assert_eq!(ty(&p, "blk.2.ffn_down.weight"), T::IQ4_XS);
        assert_eq!(ty(&p, "output.weight"), T::Q6_K);
        assert_eq!(ty(&p, "token_embd.weight"), T::IQ4_XS);
        // ≥ 4 query heads per KV head: attn_v-like tensors get Q5_K.
        let p = run(Quant::Mix(Mix::IQ4_XS), &list, 4);
        assert_eq!(ty(&p, "blk.0.attn_qkv.weight"), T::Q5_K);
        assert_eq!(ty(&p, "blk.3.attn_v.weight"), T::Q5_K);
        // Rows of 64: IQ4_XS falls back to IQ4_NL, Q5_K to Q5_1.
        let p = run(Quant::Mix(Mix::IQ4_XS), &qwen35(8, 64, 128, false), 4);
        assert_eq!(ty(&p, "blk.1.attn_gate.weight"), T::IQ4_NL);
        assert_eq!(ty(&p, "blk.1.attn_qkv.weight"), T::Q5_1);
    }

    #[test]
    fn q6_k_mix_is_all_q6_k() {
        let list = qwen35(8, 256, 512, false);
        assert_eq!(
            run(Quant::Mix(Mix::Q6_K), &list, 2),
            run(Quant::Uniform(T::Q6_K), &list, 2)
        );
    }

    #[test]
    fn uniform_types_skip_the_rules() {
        let p = run(Quant::Uniform(T::Q4_0), &qwen35(8, 64, 128, false), 2);
        assert!(p.iter().all(|(n, t)| *t
            == if n.contains("norm")
                || n.contains("ssm_conv")
                || n.ends_with("ssm_a")
                || n.ends_with("bias")
            {
                T::F32
            } else {
                T::Q4_0
            }));
        let p = run(Quant::Uniform(T::F16), &qwen35(8, 64, 128, false), 2);
        assert_eq!(ty(&p, "output.weight"), T::F16);
        assert_eq!(ty(&p, "blk.0.ssm_a"), T::F32);
        let l = qwen35(4, 48, 96, false);
        let names: Vec<(&str, &[u64])> =
            l.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        let e = plan(
            Quant::Uniform(T::Q8_0),
            &names,
            ModelInfo {
                n_gqa: 2,
                n_blocks: 4,
                n_expert: 0,
            },
        )
        .unwrap_err();
        assert!(e.contains("rows of 48"), "{e}");
    }

    #[test]
    fn q4_k_xl_uses_every_promised_type() {
        let list = qwen35(16, 256, 768, false);
        let p = run(Quant::Mix(Mix::Q4KXl), &list, 4);
        for t in [T::Q4_K, T::Q5_K, T::Q6_K, T::Q8_0, T::IQ4_XS, T::IQ4_NL] {
            assert!(p.iter().any(|(_, x)| *x == t), "{t} missing");
        }
        assert_eq!(ty(&p, "blk.0.ssm_alpha.weight"), T::Q8_0);
        // use_more_bits(i, 16) holds for 0, 1, 4, 7, 10, 13, 14, 15.
        assert_eq!(ty(&p, "blk.5.attn_qkv.weight"), T::Q5_K);
        assert_eq!(ty(&p, "blk.4.attn_qkv.weight"), T::Q6_K);
        assert_eq!(ty(&p, "blk.5.ffn_up.weight"), T::IQ4_XS);
        assert_eq!(ty(&p, "blk.5.ffn_gate.weight"), T::IQ4_NL);
        assert_eq!(ty(&p, "blk.5.ffn_down.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.4.ffn_down.weight"), T::Q6_K);
        assert_eq!(ty(&p, "blk.3.attn_q.weight"), T::Q5_K);
        assert_eq!(ty(&p, "blk.0.ssm_out.weight"), T::Q5_K);
        assert_eq!(ty(&p, "blk.0.attn_gate.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.0.ffn_up.weight"), T::Q4_K);
        // Most of the weights are in 4-bit types.
        let count = |f: &dyn Fn(TensorType) -> bool| -> u64 {
            list.iter()
                .zip(&p)
                .filter(|(_, (_, t))| f(*t))
                .map(|((_, d), _)| d.iter().product::<u64>())
                .sum()
        };
        let q4 = count(&|t| matches!(t, T::Q4_K | T::IQ4_XS | T::IQ4_NL));
        assert!(q4 * 2 > count(&|t| t != T::F32), "{q4}");
    }

    /// `qwen35(n, ...)` with llama.cpp's qwen35moe FFN: router, stacked experts, shared expert.
    fn qwen35moe(n: usize, h: u64, ff: u64) -> Vec<(String, Vec<u64>)> {
        let mut v = Vec::new();
        for (name, dims) in qwen35(n, h, ff, false) {
            let Some(rest) = name.strip_suffix(".weight").and_then(|r| {
                ["ffn_gate", "ffn_up", "ffn_down"]
                    .iter()
                    .find(|f| r.ends_with(*f))
                    .map(|f| (r.trim_end_matches(f).to_string(), *f))
            }) else {
                v.push((name, dims));
                continue;
            };
            let (prefix, f) = rest;
            if f == "ffn_gate" {
                v.push((format!("{prefix}ffn_gate_inp.weight"), vec![h, 16]));
                v.push((format!("{prefix}ffn_gate_inp_shexp.weight"), vec![h]));
            }
            let exp = if f == "ffn_down" {
                vec![ff, h, 16]
            } else {
                vec![h, ff, 16]
            };
            v.push((format!("{prefix}{f}_exps.weight"), exp));
            v.push((format!("{prefix}{f}_shexp.weight"), dims));
        }
        v
    }

    fn run_moe(q: Quant, list: &[(String, Vec<u64>)], n_expert: usize) -> Vec<TensorType> {
        let l: Vec<(&str, &[u64])> = list
            .iter()
            .map(|(n, d)| (n.as_str(), d.as_slice()))
            .collect();
        let n_blocks = list.iter().map(|(n, _)| layer_of(n) + 1).max().unwrap_or(0) as usize;
        let info = ModelInfo {
            n_gqa: 2,
            n_blocks,
            n_expert,
        };
        plan(q, &l, info).unwrap()
    }

    #[test]
    fn moe_ffn_down_follows_the_layer_in_the_name() {
        let list = qwen35moe(16, 256, 512);
        let types = run_moe(Quant::Mix(Mix::Q4_K_M), &list, 16);
        let p: Vec<(String, TensorType)> = list.iter().map(|(n, _)| n.clone()).zip(types).collect();
        for i in 0..16 {
            let want = if use_more_bits(i, 16) {
                T::Q6_K
            } else {
                T::Q4_K
            };
            // Two ffn_down tensors per layer: a running count would drift by a factor of two.
            assert_eq!(
                ty(&p, &format!("blk.{i}.ffn_down_exps.weight")),
                want,
                "{i}"
            );
            assert_eq!(
                ty(&p, &format!("blk.{i}.ffn_down_shexp.weight")),
                want,
                "{i}"
            );
            assert_eq!(ty(&p, &format!("blk.{i}.ffn_up_exps.weight")), T::Q4_K);
            assert_eq!(ty(&p, &format!("blk.{i}.ffn_gate_shexp.weight")), T::Q4_K);
            assert_eq!(ty(&p, &format!("blk.{i}.ffn_gate_inp.weight")), T::F32);
            assert_eq!(
                ty(&p, &format!("blk.{i}.ffn_gate_inp_shexp.weight")),
                T::F32
            );
        }
        // Not 8 experts: attention keeps the dense rules.
        assert_eq!(ty(&p, "blk.3.attn_k.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.3.attn_output.weight"), T::Q4_K);
        assert_eq!(ty(&p, "blk.0.attn_qkv.weight"), T::Q6_K);
    }

    #[test]
    fn eight_experts_promote_attention() {
        let list = qwen35moe(8, 256, 512);
        let names: Vec<&str> = list.iter().map(|(n, _)| n.as_str()).collect();
        let at = |types: &[TensorType], name: &str| {
            types[names.iter().position(|n| *n == name).unwrap()]
        };
        for m in [Mix::Q4_K_M, Mix::Q5_K_M, Mix::Q6_K, Mix::IQ4_XS] {
            let t = run_moe(Quant::Mix(m), &list, 8);
            assert_eq!(at(&t, "blk.3.attn_v.weight"), T::Q8_0, "{m:?}");
            assert_eq!(at(&t, "blk.1.attn_qkv.weight"), T::Q8_0, "{m:?}");
            assert_eq!(at(&t, "blk.3.attn_k.weight"), T::Q8_0, "{m:?}");
            let out = if matches!(m, Mix::Q4_K_M | Mix::IQ4_XS) {
                T::Q5_K
            } else {
                m.base()
            };
            assert_eq!(at(&t, "blk.3.attn_output.weight"), out, "{m:?}");
            assert_eq!(at(&t, "blk.3.attn_q.weight"), m.base(), "{m:?}");
        }
    }

    #[test]
    fn names_parse() {
        for (n, m) in Mix::NAMES.iter().zip(Mix::ALL) {
            assert_eq!(Mix::parse(n), Some(m));
            assert_eq!(m.name(), *n);
        }
        assert_eq!(Mix::parse("UD-Q4_K_XL"), Some(Mix::Q4KXl));
        assert_eq!(Mix::parse("q4_k"), None);
    }
}
