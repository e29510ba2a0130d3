//! Grammar-constrained sampling with llguidance: GBNF, Lark, JSON schema, regex.
//!
//! A [`GrammarVocab`] is built once per vocabulary (it indexes every token's bytes in a trie);
//! [`GrammarVocab::compile`] gives each sequence its own [`Grammar`], whose matcher masks the
//! logits before the sampler chain, advances with each kept token and rolls back by token count
//! when speculative tokens are rejected.

use crate::SamplingError;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// What a request constrains its output to.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// llama.cpp's GBNF (start rule `root`).
    Gbnf(String),
    /// llguidance's Lark dialect (start rule `start`).
    Lark(String),
    /// A JSON schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A regular expression the whole output must match.
    Regex(String),
}

/// A tokenizer as llguidance needs it: each token's bytes and a way to tokenize text.
type TokenizeFn = Box<dyn Fn(&[u8]) -> Vec<u32> + Send + Sync>;

struct Env {
    trie: TokTrie,
    tokenize: TokenizeFn,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        (self.tokenize)(s)
    }
}

/// One vocabulary's grammar machinery, shared by all sequences of a model.
pub struct GrammarVocab {
    factory: ParserFactory,
    n_vocab: usize,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocab")
            .field("n_vocab", &self.n_vocab)
            .finish()
    }
}

impl GrammarVocab {
    /// `pieces[i]`: the bytes token `i` stands for, or `None` for a special token (its text is
    /// in `special_text[i]`; grammars can name it as `<text>`). `eos`: the token that ends a
    /// grammar-complete output. `tokenize`: the model's tokenizer on raw bytes (used for
    /// grammar-forced text).
    pub fn new(
        pieces: Vec<Option<Vec<u8>>>,
        special_text: impl Fn(u32) -> String,
        eos: u32,
        tokenize: impl Fn(&[u8]) -> Vec<u32> + Send + Sync + 'static,
    ) -> Result<Self, SamplingError> {
        let n_vocab = pieces.len();
        if eos as usize >= n_vocab {
            return Err(SamplingError::Grammar(format!(
                "EOS token {eos} outside the vocabulary of {n_vocab}"
            )));
        }
        let words: Vec<Vec<u8>> = pieces
            .into_iter()
            .enumerate()
            .map(|(i, p)| match p {
                Some(b) if !b.is_empty() => b,
                // Specials (and empty pieces) are marked so they match only when a grammar names them.
                _ => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(special_text(i as u32).as_bytes());
                    w
                }
            })
            .collect();
        let trie = TokTrie::from(&TokRxInfo::new(n_vocab as u32, eos), &words);
        let env: TokEnv = Arc::new(Env {
            trie,
            tokenize: Box::new(tokenize),
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| SamplingError::Grammar(e.to_string()))?;
        // llguidance logs warnings to stderr by default; errors reach the caller instead.
        factory.quiet();
        Ok(GrammarVocab { factory, n_vocab })
    }

    /// Compiles a grammar for one sequence. Invalid grammars are an error naming the problem.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, SamplingError> {
        let top = match spec {
            GrammarSpec::Gbnf(g) => TopLevelGrammar::from_lark(
                crate::gbnf::gbnf_to_lark(g)
                    .map_err(|e| SamplingError::Grammar(format!("GBNF: {e}")))?,
            ),
            GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            GrammarSpec::JsonSchema(s) => {
                TopLevelGrammar::from_json_schema(compact_json(infer_types(s.clone())))
            }
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(compact_json(
                serde_json::json!({"type": "object"}),
            )),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
        };
        let parser = self.factory.create_parser(top);
        let mut matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(SamplingError::Grammar(clean_error(&e)));
        }
        // Compiling is lazy in places; the first mask surfaces the remaining errors now.
        matcher
            .compute_mask()
            .map_err(|e| SamplingError::Grammar(clean_error(&e.to_string())))?;
        Ok(Grammar {
            matcher,
            consumed: 0,
            after_stop: 0,
            n_vocab: self.n_vocab,
        })
    }
}

/// llguidance's error as a message for the client: its first line (the rest is the parser's
/// state and, for a failed internal check, a backtrace), said plainly for the errors a
/// grammar's size or shape causes.
fn clean_error(e: &str) -> String {
    let first = e.lines().next().unwrap_or("").trim();
    if first.contains("panic") || first.contains("assertion failed") {
        return format!("the grammar is over the grammar engine's size limits ({first})");
    }
    if first.starts_with("NoExtensionBias") {
        return "no text matches the grammar (e.g. a JSON schema that refers to itself without end)"
            .into();
    }
    if ["fuel", "limit", "too many"]
        .iter()
        .any(|w| first.contains(w))
    {
        return format!("the grammar is over the grammar engine's limits ({first})");
    }
    first.to_string()
}

/// Unless the schema sets llguidance options itself (`x-guidance`), JSON is generated without
/// free whitespace: a model may otherwise emit blanks forever between tokens (llama.cpp bounds
/// them for the same reason).
fn compact_json(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// Reads a schema as llama.cpp's schema converter does: a (sub)schema without `type` takes the
/// type its keywords imply (`properties` → object, `items` / `prefixItems` → array, `pattern` /
/// `minLength` / `maxLength` / `format` → string), and an array of `items` is a tuple of exactly
/// those items (draft 4). JSON Schema itself would accept any value there, so a client's
/// `{"items": [{"type": "integer"}]}` would not constrain the output to an array.
fn infer_types(mut schema: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let Some(o) = schema.as_object_mut() else {
        return schema;
    };
    // Subschemas first.
    for key in ["properties", "$defs", "definitions", "patternProperties"] {
        if let Some(Value::Object(m)) = o.get_mut(key) {
            for v in m.values_mut() {
                *v = infer_types(v.take());
            }
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(a)) = o.get_mut(key) {
            for v in a.iter_mut() {
                *v = infer_types(v.take());
            }
        }
    }
    for key in ["additionalProperties", "not", "contains"] {
        if let Some(v @ Value::Object(_)) = o.get_mut(key) {
            *v = infer_types(v.take());
        }
    }
    match o.get_mut("items") {
        Some(Value::Array(a)) => {
            let tuple: Vec<Value> = a.iter_mut().map(|v| infer_types(v.take())).collect();
            let n = tuple.len();
            o.insert("prefixItems".into(), Value::Array(tuple));
            o.insert("items".into(), Value::Bool(false));
            o.entry("minItems").or_insert_with(|| n.into());
        }
        Some(v @ Value::Object(_)) => *v = infer_types(v.take()),
        _ => {}
    }
    let typed = ["type", "$ref", "anyOf", "oneOf", "const", "enum"]
        .iter()
        .any(|k| o.contains_key(*k));
    if !typed {
        let has = |k: &str| o.contains_key(k);
        let props = has("properties")
            || o.get("additionalProperties")
                .is_some_and(|v| v != &Value::Bool(true));
        let ty = if props {
            Some("object")
        } else if has("allOf") {
            None
        } else if has("items") || has("prefixItems") {
            Some("array")
        } else if ["pattern", "minLength", "maxLength", "format"]
            .iter()
            .any(|k| has(k))
        {
            Some("string")
        } else {
            None
        };
        if let Some(t) = ty {
            o.insert("type".into(), t.into());
        }
    }
    schema
}

/// One sequence's grammar state.
pub struct Grammar {
    matcher: Matcher,
    /// Tokens the matcher consumed (what its rollback can undo).
    consumed: usize,
    /// Tokens accepted after the matcher stopped (EOS at the end of a complete output).
    after_stop: usize,
    n_vocab: usize,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("consumed", &self.consumed)
            .finish()
    }
}

impl Clone for Grammar {
    fn clone(&self) -> Self {
        Grammar {
            matcher: self.matcher.deep_clone(),
            consumed: self.consumed,
            after_stop: self.after_stop,
            n_vocab: self.n_vocab,
        }
    }
}

impl Grammar {
    /// Tokens allowed next (only EOS once the grammar is complete and cannot continue). A matcher
    /// in an error state allows only EOS, which ends the sequence.
    pub fn mask(&mut self) -> SimpleVob {
        match self.matcher.compute_mask_or_eos() {
            Ok(m) => m,
            Err(_) => self
                .matcher
                .tok_env()
                .map(|e| e.tok_trie().eos_token_set())
                .unwrap_or_else(|_| SimpleVob::alloc(self.n_vocab)),
        }
    }

    /// Advances over a kept token. Once the grammar is complete the matcher stops and takes no
    /// more tokens; the EOS that ends the output is then counted here instead.
    pub fn accept(&mut self, token: u32) -> Result<(), SamplingError> {
        // A grammar that went over the engine's limits while generating stops the matcher
        // with an error: say that, not what it did to the next token.
        if let Some(e) = self.matcher.get_error() {
            return Err(SamplingError::Grammar(clean_error(&e)));
        }
        if self.matcher.is_stopped() {
            if !self.mask().is_allowed(token) {
                return Err(SamplingError::Grammar(format!(
                    "token {token} after the end of the grammar"
                )));
            }
            self.after_stop += 1;
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| SamplingError::Grammar(clean_error(&e.to_string())))?;
        self.consumed += 1;
        Ok(())
    }

    /// Undoes the last `n` accepted tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), SamplingError> {
        let past = n.min(self.after_stop);
        self.after_stop -= past;
        let n = (n - past).min(self.consumed);
        if n > 0 {
            self.matcher
                .rollback(n)
                .map_err(|e| SamplingError::Grammar(e.to_string()))?;
            self.consumed -= n;
        }
        Ok(())
    }

    /// Tokens accepted so far.
    pub fn consumed(&self) -> usize {
        self.consumed + self.after_stop
    }

    /// Tokens the grammar forces next, whatever the model says (free drafts).
    pub fn forced_tokens(&mut self) -> Vec<u32> {
        self.matcher.compute_ff_tokens()
    }

    /// How many leading tokens of `draft` the grammar allows (without advancing).
    pub fn valid_prefix(&mut self, draft: &[u32]) -> usize {
        self.matcher.validate_tokens(draft).unwrap_or(0)
    }

    /// True once the grammar is complete and accepts nothing more.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}
