//! The tokenizer a model file describes.

use crate::{bytes, chunk, pretokenizer, ChatTemplate, TokenizerError};
use std::collections::HashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::{ModelWrapper, PreTokenizerWrapper, TokenizerImpl};

type Backend = TokenizerImpl<
    ModelWrapper,
    tokenizers::NormalizerWrapper,
    PreTokenizerWrapper,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    /// From the GGUF integer; anything unknown counts as normal, as in llama.cpp.
    pub fn from_i32(v: i32) -> Self {
        match v {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }
    /// The GGUF integer.
    pub fn to_i32(self) -> i32 {
        match self {
            TokenType::Normal => 1,
            TokenType::Unknown => 2,
            TokenType::Control => 3,
            TokenType::UserDefined => 4,
            TokenType::Unused => 5,
            TokenType::Byte => 6,
        }
    }
}

/// Everything a GGUF file says about its tokenizer.
#[derive(Debug, Clone, Default)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model` (only `gpt2`, byte-level BPE, is supported).
    pub model: String,
    /// `tokenizer.ggml.pre`.
    pub pre: String,
    pub tokens: Vec<String>,
    /// Per token (empty: all normal).
    pub token_types: Vec<i32>,
    /// `"left right"` pairs, highest priority first.
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
    /// `tokenizer.ggml.fim_*_token_id` (missing ones are found by their text, as llama.cpp does).
    pub fim: FimTokens,
}

/// The fill-in-the-middle tokens of a code model: `[pre]prefix[suf]suffix[mid]middle`, and the
/// repo-level format's repository (`rep`) and file (`sep`) markers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FimTokens {
    pub pre: Option<u32>,
    pub suf: Option<u32>,
    pub mid: Option<u32>,
    pub pad: Option<u32>,
    pub rep: Option<u32>,
    pub sep: Option<u32>,
}

impl FimTokens {
    /// The GGUF key suffixes (`tokenizer.ggml.<name>_token_id`), in field order.
    pub const KEYS: [&'static str; 6] = [
        "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
    ];

    fn slots(&mut self) -> [&mut Option<u32>; 6] {
        [
            &mut self.pre,
            &mut self.suf,
            &mut self.mid,
            &mut self.pad,
            &mut self.rep,
            &mut self.sep,
        ]
    }

    /// The ids in [`Self::KEYS`] order.
    pub fn ids(&self) -> [Option<u32>; 6] {
        [self.pre, self.suf, self.mid, self.pad, self.rep, self.sep]
    }
}

/// Token texts that mark FIM roles in vocabularies whose files do not name them (llama.cpp
/// recognises the same texts), in [`FimTokens::KEYS`] order.
const FIM_TEXTS: [&[&str]; 6] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// Texts that mark the end of a turn in common vocabularies; llama.cpp treats control tokens with
/// these texts as end-of-generation even when the metadata names only one EOS.
const EOG_TEXTS: [&str; 8] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "<|end_of_text|>",
];

/// A byte-level BPE tokenizer with llama.cpp's special-token handling.
#[derive(Clone)]
pub struct Tokenizer {
    backend: Backend,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Raw bytes of each token's piece (control / unused tokens: empty).
    pieces: Vec<Vec<u8>>,
    /// Tokens matched as a unit in text, longest first: (text, id, needs parse_special).
    specials: Vec<(String, u32, bool)>,
    ids: HashMap<String, u32>,
    eog: Vec<u32>,
    spec: TokenizerSpec,
    /// Texts are encoded in pieces of about this many bytes (`chunk.rs`).
    piece_bytes: usize,
}

/// Piece size for long texts: large enough that the per-piece overhead vanishes, small enough
/// that the encoder's bookkeeping (a few hundred bytes per input byte) stays in the tens of MB.
const PIECE_BYTES: usize = 64 * 1024;

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_vocab", &self.tokens.len())
            .field("pre", &self.spec.pre)
            .finish()
    }
}

enum Frag<'a> {
    Text(&'a str),
    Token(u32),
}

impl Tokenizer {
    /// Builds the tokenizer, checking the metadata for consistency.
    pub fn from_spec(mut spec: TokenizerSpec) -> Result<Self, TokenizerError> {
        if spec.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(spec.model.clone()));
        }
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::Invalid(
                "tokenizer.ggml.tokens is empty".into(),
            ));
        }
        if !spec.token_types.is_empty() && spec.token_types.len() != n {
            return Err(TokenizerError::Invalid(format!(
                "tokenizer.ggml.token_type has {} entries for {n} tokens",
                spec.token_types.len()
            )));
        }
        for (key, id) in [
            ("bos", spec.bos_id),
            ("eos", spec.eos_id),
            ("eot", spec.eot_id),
            ("eom", spec.eom_id),
            ("padding", spec.pad_id),
            ("fim_pre", spec.fim.pre),
            ("fim_suf", spec.fim.suf),
            ("fim_mid", spec.fim.mid),
            ("fim_pad", spec.fim.pad),
            ("fim_rep", spec.fim.rep),
            ("fim_sep", spec.fim.sep),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(TokenizerError::Invalid(format!(
                        "tokenizer.ggml.{key}_token_id {id} is outside the vocabulary of {n}"
                    )));
                }
            }
        }
        let mut types: Vec<TokenType> = if spec.token_types.is_empty() {
            vec![TokenType::Normal; n]
        } else {
            spec.token_types
                .iter()
                .map(|&t| TokenType::from_i32(t))
                .collect()
        };
        // FIM roles the metadata leaves out, found by text; such a token is a control token
        // whatever its stored type (llama.cpp overrides it the same way).
        for (slot, texts) in spec.fim.slots().into_iter().zip(FIM_TEXTS) {
            if slot.is_none() {
                *slot = spec
                    .tokens
                    .iter()
                    .position(|t| texts.contains(&t.as_str()))
                    .map(|i| i as u32);
                if let Some(i) = *slot {
                    types[i as usize] = TokenType::Control;
                }
            }
        }
        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(n);
        for (i, t) in spec.tokens.iter().enumerate() {
            vocab.insert(t.clone(), i as u32);
        }
        let mut merges = Vec::with_capacity(spec.merges.len());
        for m in &spec.merges {
            let (a, b) = m.split_once(' ').ok_or_else(|| {
                TokenizerError::Invalid(format!(
                    "merge '{m}' is not two tokens separated by a space"
                ))
            })?;
            merges.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(
                vocab
                    .iter()
                    .map(|(k, v)| (k.clone(), *v))
                    .collect::<tokenizers::models::bpe::Vocab>(),
                merges,
            )
            .build()
            .map_err(|e| TokenizerError::Invalid(format!("BPE merges: {e}")))?;
        let mut backend: Backend = TokenizerImpl::new(ModelWrapper::BPE(bpe));
        backend.with_pre_tokenizer(Some(pretokenizer::build(&spec.pre)?));

        let pieces = spec
            .tokens
            .iter()
            .zip(&types)
            .map(|(t, ty)| match ty {
                TokenType::Normal => bytes::decode(t).unwrap_or_else(|| t.as_bytes().to_vec()),
                TokenType::UserDefined => t.as_bytes().to_vec(),
                TokenType::Byte => parse_byte_token(t).map(|b| vec![b]).unwrap_or_default(),
                TokenType::Control | TokenType::Unknown | TokenType::Unused => Vec::new(),
            })
            .collect();
        let mut specials: Vec<(String, u32, bool)> = types
            .iter()
            .enumerate()
            .filter(|(i, _)| !spec.tokens[*i].is_empty())
            .filter_map(|(i, ty)| match ty {
                TokenType::Control | TokenType::Unknown => {
                    Some((spec.tokens[i].clone(), i as u32, true))
                }
                TokenType::UserDefined => Some((spec.tokens[i].clone(), i as u32, false)),
                _ => None,
            })
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));

        // FIM padding and the repo-level markers end a generation too (llama.cpp): a model that
        // writes them has finished the middle.
        let mut eog: Vec<u32> = [
            spec.eos_id,
            spec.eot_id,
            spec.eom_id,
            spec.fim.pad,
            spec.fim.rep,
            spec.fim.sep,
        ]
        .into_iter()
        .flatten()
        .collect();
        for (i, t) in spec.tokens.iter().enumerate() {
            if matches!(types[i], TokenType::Control | TokenType::UserDefined)
                && EOG_TEXTS.contains(&t.as_str())
            {
                eog.push(i as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();
        Ok(Tokenizer {
            backend,
            tokens: spec.tokens.clone(),
            types,
            pieces,
            specials,
            ids: vocab,
            eog,
            spec,
            piece_bytes: PIECE_BYTES,
        })
    }

    /// Sets the piece size long texts are encoded in (the ids never depend on it; tests use
    /// small pieces to cut often).
    pub fn set_piece_bytes(&mut self, bytes: usize) {
        self.piece_bytes = bytes.max(1);
    }

    /// Number of tokens.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// The `tokenizer.ggml.pre` name.
    pub fn pre(&self) -> &str {
        &self.spec.pre
    }

    /// The Jinja chat template stored in the file, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.spec.chat_template.as_deref()
    }

    /// The file's chat template, compiled, with this vocabulary's BOS/EOS texts.
    pub fn compiled_chat_template(&self) -> Result<Option<ChatTemplate>, TokenizerError> {
        self.chat_template()
            .map(|t| ChatTemplate::with_special_tokens(t, self.bos_text(), self.eos_text()))
            .transpose()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.spec.bos_id
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.spec.eos_id
    }
    /// The fill-in-the-middle tokens (none for a model without them).
    pub fn fim(&self) -> FimTokens {
        self.spec.fim
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.spec.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.spec.add_eos
    }
    fn bos_text(&self) -> &str {
        self.spec
            .bos_id
            .map(|i| self.tokens[i as usize].as_str())
            .unwrap_or("")
    }
    fn eos_text(&self) -> &str {
        self.spec
            .eos_id
            .map(|i| self.tokens[i as usize].as_str())
            .unwrap_or("")
    }

    /// Is `id` an end-of-generation token (EOS, EOT, EOM, or a control token such as `<|im_end|>`)?
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation tokens.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Is `id` a control token (rendered as nothing in generated text)?
    pub fn is_control(&self, id: u32) -> bool {
        matches!(self.types.get(id as usize), Some(TokenType::Control))
    }

    /// The vocabulary entry of `id` as stored in the file.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary entry.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The token that stands for the single byte `b` (every byte-level vocabulary has one).
    pub fn byte_token(&self, b: u8) -> Option<u32> {
        self.token_id(&bytes::encode(&[b]))
    }

    /// Encodes text. `add_special`: prepend BOS / append EOS as the file asks. `parse_special`:
    /// match control tokens written in the text (`<|im_start|>`) as single tokens; user-defined
    /// tokens are always matched, as llama.cpp does.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut out = Vec::new();
        if add_special && self.spec.add_bos {
            if let Some(b) = self.spec.bos_id {
                out.push(b);
            }
        }
        let mut frags = vec![Frag::Text(text)];
        for (st, id, needs_parse) in &self.specials {
            if *needs_parse && !parse_special {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                match f {
                    Frag::Text(mut s) => {
                        while let Some(at) = s.find(st.as_str()) {
                            if at > 0 {
                                next.push(Frag::Text(&s[..at]));
                            }
                            next.push(Frag::Token(*id));
                            s = &s[at + st.len()..];
                        }
                        if !s.is_empty() {
                            next.push(Frag::Text(s));
                        }
                    }
                    tok => next.push(tok),
                }
            }
            frags = next;
        }
        // Only the ids are read: `encode_fast` skips the offset conversion `encode` does for
        // every token (same ids, several times faster on long texts). Long texts go
        // in pieces cut where the pre-tokenizer splits anyway (same ids, memory bounded by the
        // piece: `chunk.rs`).
        for f in frags {
            match f {
                Frag::Token(id) => out.push(id),
                Frag::Text(s) => {
                    for piece in chunk::pieces(s, self.piece_bytes) {
                        out.extend_from_slice(self.backend.encode_fast(piece, false)?.get_ids())
                    }
                }
            }
        }
        if add_special && self.spec.add_eos {
            if let Some(e) = self.spec.eos_id {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Raw bytes of one generated token (control tokens give nothing, like llama.cpp's
    /// `token_to_piece(.., special = false)`). Out-of-range ids give nothing.
    pub fn token_to_bytes(&self, id: u32) -> &[u8] {
        self.pieces
            .get(id as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Raw bytes of one token; with `special`, control tokens render as their text.
    pub fn piece(&self, id: u32, special: bool) -> Result<Vec<u8>, TokenizerError> {
        let i = id as usize;
        let ty = *self.types.get(i).ok_or(TokenizerError::BadId(id))?;
        Ok(
            if special && matches!(ty, TokenType::Control | TokenType::Unknown) {
                self.tokens[i].as_bytes().to_vec()
            } else {
                self.pieces[i].clone()
            },
        )
    }

    /// Decodes ids to text (invalid UTF-8 replaced); with `special`, control tokens are rendered.
    pub fn decode(&self, ids: &[u32], special: bool) -> Result<String, TokenizerError> {
        let mut b = Vec::new();
        for &id in ids {
            b.extend_from_slice(&self.piece(id, special)?);
        }
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
}

/// `<0x0A>` → 0x0A.
fn parse_byte_token(t: &str) -> Option<u8> {
    let h = t.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(h, 16).ok()
}
