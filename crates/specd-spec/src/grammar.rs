//! The grammar index of a model's vocabulary, for grammar-constrained requests.

use crate::SpecError;
use specd_sampling::GrammarVocab;
use specd_tokenizer::Tokenizer;

/// Builds llguidance's view of `tok`: every token's bytes (control tokens as specials), EOS, and
/// the model's own tokenizer for grammar-forced text.
pub fn vocab_for(tok: &Tokenizer) -> Result<GrammarVocab, SpecError> {
    let n = tok.n_vocab();
    let pieces: Vec<Option<Vec<u8>>> = (0..n as u32)
        .map(|id| {
            let b = tok.token_to_bytes(id);
            (!tok.is_control(id) && !b.is_empty()).then(|| b.to_vec())
        })
        .collect();
    let eos = tok
        .eos_id()
        .or_else(|| tok.eog_ids().first().copied())
        .ok_or_else(|| SpecError::Invalid("grammar-constrained output needs an end-of-generation token, and the model has none".into()))?;
    let texts: Vec<String> = (0..n as u32)
        .map(|id| tok.token_text(id).unwrap_or("").to_string())
        .collect();
    // The closure must own a tokenizer; the pieces table is enough to re-tokenize forced text
    // greedily when the bytes are not valid UTF-8, and the real BPE handles the rest.
    let bpe = tok.clone();
    Ok(GrammarVocab::new(
        pieces,
        |id| texts[id as usize].clone(),
        eos,
        move |bytes: &[u8]| match std::str::from_utf8(bytes) {
            Ok(s) => bpe.encode(s, false, false).unwrap_or_default(),
            Err(_) => bytes.iter().filter_map(|&b| bpe.byte_token(b)).collect(),
        },
    )?)
}
