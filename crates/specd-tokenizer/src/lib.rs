//! Byte-level BPE tokenizer and chat templates, built from a GGUF file's `tokenizer.*` metadata.
//!
//! * [`Tokenizer`]: encode / decode with llama.cpp's semantics (BOS/EOS insertion, control and
//!   user-defined tokens matched in text only when asked, end-of-generation set). The BPE itself
//!   and the pre-tokenizer regexes run in the `tokenizers` crate.
//! * [`pretokenizer`]: the split regexes that `tokenizer.ggml.pre` names.
//! * [`train_bpe`] / [`pad_vocab`]: train a real BPE vocabulary (used by the synthetic test models).
//! * [`ChatTemplate`]: `tokenizer.chat_template` rendered with minijinja to the prompt llama-server
//!   renders (the conversation prepared as it prepares it, values written as its Jinja engine
//!   writes them, [`TemplateCaps`] found by probing the template).
//! * [`templates`]: llama.cpp's built-in chat templates by name (`llama3`, `command-r`, …).

pub mod bytes;
mod chat;
mod chunk;
pub mod pretokenizer;
mod template_caps;
mod template_env;
mod template_inputs;
mod template_text;
pub mod templates;
mod tokenizer;
mod train;

pub use chat::{ChatInputs, ChatMessage, ChatTemplate, Continuation, CHATML_TEMPLATE};
pub use chrono::NaiveDateTime;
pub use template_caps::TemplateCaps;
pub use tokenizer::{FimTokens, TokenType, Tokenizer, TokenizerSpec};
pub use train::{pad_vocab, train_bpe, TrainedVocab};

/// Errors of the tokenizer and the chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer model '{0}' is not supported (only byte-level BPE, 'gpt2')")]
    UnsupportedModel(String),
    #[error(
        "pre-tokenizer '{0}' is not supported (known: default, gpt2, llama-bpe, qwen2, qwen35)"
    )]
    UnsupportedPre(String),
    #[error("invalid tokenizer: {0}")]
    Invalid(String),
    #[error("token id {0} is outside the vocabulary")]
    BadId(u32),
    #[error("tokenizer: {0}")]
    Backend(String),
    #[error("chat template: {0}")]
    Template(String),
}

impl From<tokenizers::Error> for TokenizerError {
    fn from(e: tokenizers::Error) -> Self {
        TokenizerError::Backend(e.to_string())
    }
}

impl From<minijinja::Error> for TokenizerError {
    fn from(e: minijinja::Error) -> Self {
        // `{:#}` includes the template line that failed.
        TokenizerError::Template(format!("{e:#}"))
    }
}
