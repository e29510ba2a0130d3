//! Pre-tokenizer split rules by `tokenizer.ggml.pre` name, the same regexes llama.cpp uses.

use crate::TokenizerError;

/// GPT-2's split (llama.cpp `gpt2` and the second rule of `default`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's split (`llama-bpe`): case-insensitive contractions, digits in groups of three.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: like Llama 3 but single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's split: Qwen2's with combining marks kept inside words.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The regexes applied in order (each splits the pieces the previous one produced; matches and
/// the text between them are both kept), for a `tokenizer.ggml.pre` value.
pub fn split_rules(pre: &str) -> Result<Vec<&'static str>, TokenizerError> {
    Ok(match pre {
        "default" => vec![r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
        "gpt2" | "gpt-2" => vec![GPT2],
        "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "dbrx" => vec![LLAMA3],
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" => vec![QWEN2],
        "qwen35" => vec![QWEN35],
        other => return Err(TokenizerError::UnsupportedPre(other.to_string())),
    })
}

/// The `tokenizers` pre-tokenizer: the split rules, then the byte-level mapping.
pub fn build(pre: &str) -> Result<tokenizers::PreTokenizerWrapper, TokenizerError> {
    use tokenizers::pre_tokenizers::{byte_level::ByteLevel, sequence::Sequence, split::Split};
    use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for re in split_rules(pre)? {
        let split = Split::new(
            tokenizers::pre_tokenizers::split::SplitPattern::Regex(re.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, false, false).into());
    Ok(Sequence::new(steps).into())
}
