//! Builds the tokenizer from a GGUF file's `tokenizer.*` metadata.

use crate::ModelError;
use specd_gguf::GgufFile;
use specd_tokenizer::{FimTokens, Tokenizer, TokenizerSpec};

/// Reads `tokenizer.ggml.*` and `tokenizer.chat_template`.
pub fn tokenizer_from_gguf(g: &GgufFile) -> Result<Tokenizer, ModelError> {
    let opt_id = |k: &str| -> Result<Option<u32>, ModelError> { Ok(g.get_opt_u32(k)?) };
    let fim_id = |name: &str| opt_id(&format!("tokenizer.ggml.{name}_token_id"));
    // The deprecated keys llama.cpp still reads for the first three roles.
    let fim_or = |name: &str, old: &str| -> Result<Option<u32>, ModelError> {
        Ok(fim_id(name)?.or(opt_id(&format!("tokenizer.ggml.{old}_token_id"))?))
    };
    let fim = FimTokens {
        pre: fim_or("fim_pre", "prefix")?,
        suf: fim_or("fim_suf", "suffix")?,
        mid: fim_or("fim_mid", "middle")?,
        pad: fim_id("fim_pad")?,
        rep: fim_id("fim_rep")?,
        sep: fim_id("fim_sep")?,
    };
    let spec = TokenizerSpec {
        model: g.get_str("tokenizer.ggml.model")?.to_string(),
        pre: g
            .get_opt_str("tokenizer.ggml.pre")?
            .unwrap_or("default")
            .to_string(),
        tokens: g.get_array_str("tokenizer.ggml.tokens")?,
        token_types: match g.get("tokenizer.ggml.token_type") {
            Some(_) => g.get_array_i32("tokenizer.ggml.token_type")?,
            None => Vec::new(),
        },
        merges: match g.get("tokenizer.ggml.merges") {
            Some(_) => g.get_array_str("tokenizer.ggml.merges")?,
            None => Vec::new(),
        },
        bos_id: opt_id("tokenizer.ggml.bos_token_id")?,
        eos_id: opt_id("tokenizer.ggml.eos_token_id")?,
        eot_id: opt_id("tokenizer.ggml.eot_token_id")?,
        eom_id: opt_id("tokenizer.ggml.eom_token_id")?,
        pad_id: opt_id("tokenizer.ggml.padding_token_id")?,
        add_bos: g
            .get_opt_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(false),
        add_eos: g
            .get_opt_bool("tokenizer.ggml.add_eos_token")?
            .unwrap_or(false),
        chat_template: g
            .get_opt_str("tokenizer.chat_template")?
            .map(str::to_string),
        fim,
    };
    Ok(Tokenizer::from_spec(spec)?)
}
