//! Training a byte-level BPE vocabulary (for the synthetic test models).

use crate::{pretokenizer, TokenType, TokenizerError};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, ModelWrapper, TokenizerImpl};

/// A trained vocabulary in GGUF form.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedVocab {
    /// Token texts by id (byte-level strings; specials as written).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type` values.
    pub token_types: Vec<i32>,
    /// `"left right"` merges, highest priority first.
    pub merges: Vec<String>,
}

/// Trains a BPE of at most `vocab_size` tokens on `corpus` with the pre-tokenizer `pre`. The
/// `specials` become control tokens. The result is deterministic for the same inputs.
pub fn train_bpe(
    corpus: &str,
    vocab_size: usize,
    pre: &str,
    specials: &[&str],
) -> Result<TrainedVocab, TokenizerError> {
    if vocab_size < 256 + specials.len() {
        return Err(TokenizerError::Invalid(format!(
            "vocabulary size {vocab_size} cannot hold the 256 byte symbols and {} specials",
            specials.len()
        )));
    }
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(
            specials
                .iter()
                .map(|s| AddedToken::from(s.to_string(), true))
                .collect(),
        )
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut trainer: tokenizers::models::TrainerWrapper = trainer.into();
    let mut tk: TokenizerImpl<
        ModelWrapper,
        tokenizers::NormalizerWrapper,
        tokenizers::PreTokenizerWrapper,
        tokenizers::PostProcessorWrapper,
        tokenizers::DecoderWrapper,
    > = TokenizerImpl::new(ModelWrapper::BPE(BPE::default()));
    tk.with_pre_tokenizer(Some(pretokenizer::build(pre)?));
    tk.train(&mut trainer, std::iter::once(corpus))?;

    // The trained model's vocab and merges are read back through its serialised form, the one
    // stable public view of both.
    let json =
        serde_json::to_value(tk.get_model()).map_err(|e| TokenizerError::Backend(e.to_string()))?;
    let vocab = json
        .get("vocab")
        .and_then(|v| v.as_object())
        .ok_or_else(|| TokenizerError::Backend("trained model has no vocab".into()))?;
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| TokenizerError::Backend("non-integer id in trained vocab".into()))?
            as usize;
        let slot = tokens.get_mut(id).ok_or_else(|| {
            TokenizerError::Backend(format!("trained vocab id {id} out of range"))
        })?;
        *slot = t.clone();
    }
    let merges = json
        .get("merges")
        .and_then(|m| m.as_array())
        .ok_or_else(|| TokenizerError::Backend("trained model has no merges".into()))?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Array(p) if p.len() == 2 => Ok(format!(
                "{} {}",
                p[0].as_str().unwrap_or(""),
                p[1].as_str().unwrap_or("")
            )),
            other => Err(TokenizerError::Backend(format!("unexpected merge {other}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let token_types = tokens
        .iter()
        .map(|t| {
            if specials.contains(&t.as_str()) {
                TokenType::Control
            } else {
                TokenType::Normal
            }
            .to_i32()
        })
        .collect();
    Ok(TrainedVocab {
        tokens,
        token_types,
        merges,
    })
}

/// Pads the vocabulary to `n` tokens with unused `[PAD<id>]` entries, as llama.cpp's converter
/// does when a model's embedding has more rows than its tokenizer has tokens.
pub fn pad_vocab(v: &mut TrainedVocab, n: usize) -> Result<(), TokenizerError> {
    if v.tokens.len() > n {
        return Err(TokenizerError::Invalid(format!(
            "vocabulary of {} tokens does not fit in {n}",
            v.tokens.len()
        )));
    }
    for i in v.tokens.len()..n {
        v.tokens.push(format!("[PAD{i}]"));
        v.token_types.push(TokenType::Unused.to_i32());
    }
    Ok(())
}
