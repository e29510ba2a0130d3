//! Request fields → generation parameters. Field names and defaults follow llama-server's
//! `/completion` and the OpenAI API; a field of the wrong type is a 400 naming the field (not
//! silently replaced by its default, as llama-server does).

use crate::error::ApiError;
use serde_json::{Map, Value};
use specd_sampling::{GrammarSpec, SamplerParams, RANDOM_SEED};
use specd_spec::{DrafterKind, SpecParams, VerifyKind};

/// Typed access to the members of a JSON request object.
pub struct Fields<'a>(pub &'a Map<String, Value>);

fn type_error(key: &str, what: &str) -> ApiError {
    ApiError::invalid(format!("'{key}' must be {what}")).with("param", key)
}

impl<'a> Fields<'a> {
    /// The fields of a request body (an object: [`crate::error::JsonBody`] checks it).
    pub fn of(v: &'a Value) -> Self {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        Fields(v.as_object().unwrap_or_else(|| EMPTY.get_or_init(Map::new)))
    }
    /// A member; `null` counts as absent (clients send `"stop": null`).
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }
    /// A number.
    pub fn f64(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| type_error(key, "a number")),
        }
    }
    /// A number, as f32.
    pub fn f32(&self, key: &str) -> Result<Option<f32>, ApiError> {
        Ok(self.f64(key)?.map(|v| v as f32))
    }
    /// An integer (a float with no fraction is accepted: some clients send `64.0`).
    pub fn i64(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                if let Some(i) = v.as_i64() {
                    return Ok(Some(i));
                }
                match v.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
                    _ => Err(type_error(key, "an integer")),
                }
            }
        }
    }
    /// A non-negative integer.
    pub fn usize(&self, key: &str) -> Result<Option<usize>, ApiError> {
        match self.i64(key)? {
            None => Ok(None),
            Some(i) if i >= 0 => Ok(Some(i as usize)),
            Some(_) => Err(type_error(key, "a non-negative integer")),
        }
    }
    /// A boolean.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| type_error(key, "a boolean")),
        }
    }
    /// A string.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| type_error(key, "a string")),
        }
    }
    /// An object.
    pub fn object(&self, key: &str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(Fields(o))),
            Some(_) => Err(type_error(key, "an object")),
        }
    }
    /// A string or an array of strings (`stop`).
    pub fn strings(&self, key: &str) -> Result<Option<Vec<String>>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(vec![s.clone()])),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| type_error(key, "a string or an array of strings")),
            Some(_) => Err(type_error(key, "a string or an array of strings")),
        }
    }
}

/// Server-wide defaults of a generation (from the command line).
#[derive(Debug, Clone)]
pub struct Defaults {
    /// Tokens to generate; `None`: until end of generation or the context is full.
    pub n_predict: Option<usize>,
    pub sampler: SamplerParams,
    pub spec: SpecParams,
    /// Whether `--spec-type` named `spec`'s drafters (false: specd's default choice).
    pub spec_named: bool,
    /// `cache_prompt` default.
    pub cache_prompt: bool,
    /// Grammar of requests that give none (`--grammar`, `--json-schema`).
    pub grammar: Option<GrammarSpec>,
    /// `ignore_eos` default (`--ignore-eos`).
    pub ignore_eos: bool,
    /// Logit biases of requests that give no `logit_bias` (`--logit-bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

/// What a request asks of a generation, besides its prompt.
#[derive(Debug, Clone)]
pub struct GenParams {
    pub sampler: SamplerParams,
    /// `None`: until end of generation or the context is full.
    pub n_predict: Option<usize>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Top probabilities to report per token (0 = none): llama.cpp `n_probs`, OpenAI `logprobs`.
    pub n_probs: usize,
    /// Report probabilities after the sampler chain (`prob`, `top_probs`) instead of the raw
    /// model's log-probabilities (`logprob`, `top_logprobs`).
    pub post_sampling_probs: bool,
    /// `(token, bias)` pairs of `logit_bias` (see [`parse_logit_bias`]; filled by the caller,
    /// which knows the vocabulary).
    pub logit_bias: Vec<(u32, f32)>,
    /// Completions per prompt (`n_cmpl`, alias `n`; see [`parse_n_cmpl`]; 1 unless the caller
    /// reads it).
    pub n_cmpl: usize,
    pub spec: SpecParams,
    pub stream: bool,
    pub cache_prompt: bool,
    /// `cache_salt` (vLLM's field): narrows the prompt-cache partition the request may reuse.
    pub cache_salt: Option<String>,
    /// The prompt-cache partition of the request (API key and salt; set by the caller, which
    /// knows the key: see `crate::scope`).
    pub cache_scope: u64,
    pub return_tokens: bool,
    /// A specific slot (`id_slot`), or any.
    pub id_slot: Option<usize>,
    pub grammar: Option<GrammarSpec>,
    /// The thinking budget of a chat request (set by the chat path, which knows the template).
    pub reasoning_budget: Option<specd_sampling::ReasoningBudget>,
    /// `t_max_predict_ms` (0 or absent: none).
    pub time_limit: Option<std::time::Duration>,
    /// Prompt positions worth a recurrent-state checkpoint (set by the chat path, which knows
    /// where the messages end).
    pub checkpoints: Vec<usize>,
    /// OpenAI completions' `logprobs` (its format: `tokens`, `token_logprobs`, …), the top count.
    pub completion_logprobs: Option<usize>,
    /// Score the prompt with the top count (completions' `echo` with `logprobs`).
    pub prompt_logprobs: Option<usize>,
}

/// Which API the request came through (their field names differ a little).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// llama.cpp `/completion`.
    Llama,
    /// OpenAI `/v1/completions`.
    OaiCompletion,
    /// OpenAI `/v1/chat/completions`.
    OaiChat,
}

/// Reads the generation parameters of a request body.
pub fn parse_gen(f: &Fields, d: &Defaults, api: Api) -> Result<GenParams, ApiError> {
    let mut s = d.sampler;
    if let Some(v) = f.f32("temperature")? {
        s.temperature = v;
    }
    if let Some(v) = f.i64("top_k")? {
        s.top_k = i32::try_from(v).map_err(|_| type_error("top_k", "a 32-bit integer"))?;
    }
    if let Some(v) = f.f32("top_p")? {
        s.top_p = v;
    }
    if let Some(v) = f.f32("min_p")? {
        s.min_p = v;
    }
    if let Some(v) = f.f32("typical_p")? {
        s.typical_p = v;
    }
    if let Some(v) = f.f32("repeat_penalty")? {
        s.repeat_penalty = v;
    }
    if let Some(v) = f.i64("repeat_last_n")? {
        s.repeat_last_n =
            i32::try_from(v).map_err(|_| type_error("repeat_last_n", "a 32-bit integer"))?;
    }
    if let Some(v) = f.f32("presence_penalty")? {
        s.presence_penalty = v;
    }
    if let Some(v) = f.f32("frequency_penalty")? {
        s.frequency_penalty = v;
    }
    if let Some(v) = f.i64("seed")? {
        s.seed = match v {
            -1 => RANDOM_SEED,
            0..=0xFFFF_FFFF => v as u32,
            _ => {
                return Err(type_error(
                    "seed",
                    "-1 (random) or an integer in [0, 4294967295]",
                ))
            }
        };
    }
    s.validate().map_err(|e| ApiError::invalid(e.to_string()))?;

    // Token budget: llama.cpp's n_predict (-1 = unlimited), OpenAI's max_tokens and
    // max_completion_tokens; the first one given wins.
    let mut n_predict = d.n_predict;
    for key in ["n_predict", "max_completion_tokens", "max_tokens"] {
        if let Some(v) = f.i64(key)? {
            n_predict = match v {
                -1 => None,
                v if v >= 0 => Some(v as usize),
                _ => return Err(type_error(key, "-1 (unlimited) or a non-negative integer")),
            };
            break;
        }
    }

    let stop = f.strings("stop")?.unwrap_or_default();
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(d.ignore_eos);

    // Probabilities, as llama-server reads them: `n_probs`, else its alias `logprobs` (OpenAI
    // completions' integer); OpenAI chat's `logprobs: true` asks for `top_logprobs` (20 when
    // absent). Numbers are truncated, booleans count 0 / 1, and 0 or less reports none.
    let count = |key: &str| -> Result<Option<i64>, ApiError> {
        match f.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(i64::from(*b))),
            Some(v) => v
                .as_f64()
                .map(|x| Some(x.clamp(i64::MIN as f64, i64::MAX as f64) as i64))
                .ok_or_else(|| type_error(key, "a number")),
        }
    };
    let mut n_probs = match count("n_probs")? {
        Some(n) => Some(n),
        None => count("logprobs")?,
    };
    if api == Api::OaiChat {
        if f.get("logprobs") == Some(&Value::Bool(true)) {
            n_probs = Some(count("top_logprobs")?.unwrap_or(20));
        } else if f.get("top_logprobs").is_some() {
            return Err(
                ApiError::invalid("top_logprobs requires logprobs to be set to true")
                    .with("param", "top_logprobs"),
            );
        }
    }
    let n_probs = usize::try_from(n_probs.unwrap_or(0)).unwrap_or(0);

    reject_unsupported(f)?;
    let spec = parse_spec(f, &d.spec)?;
    let grammar = parse_grammar(f)?.or_else(|| d.grammar.clone());
    let id_slot = match f.i64("id_slot")? {
        None | Some(-1) => None,
        Some(i) if i >= 0 => Some(i as usize),
        Some(_) => return Err(type_error("id_slot", "-1 (any) or a slot index")),
    };
    Ok(GenParams {
        sampler: s,
        n_predict,
        stop,
        ignore_eos,
        n_probs,
        post_sampling_probs: f.bool("post_sampling_probs")?.unwrap_or(false),
        logit_bias: Vec::new(),
        n_cmpl: 1,
        spec,
        stream: f.bool("stream")?.unwrap_or(false),
        cache_prompt: f.bool("cache_prompt")?.unwrap_or(d.cache_prompt),
        cache_salt: parse_cache_salt(f)?,
        cache_scope: 0,
        return_tokens: f.bool("return_tokens")?.unwrap_or(false),
        id_slot,
        grammar,
        reasoning_budget: None,
        time_limit: match f.i64("t_max_predict_ms")? {
            Some(ms) if ms > 0 => Some(std::time::Duration::from_millis(ms as u64)),
            _ => None,
        },
        checkpoints: Vec::new(),
        completion_logprobs: None,
        prompt_logprobs: None,
    })
}

/// `cache_salt`: a non-empty string when present (as vLLM checks it).
fn parse_cache_salt(f: &Fields) -> Result<Option<String>, ApiError> {
    match f.get("cache_salt") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(type_error("cache_salt", "a non-empty string")),
    }
}

/// llama-server sampling options specd does not implement: accepted at their "off" value,
/// a 400 naming them otherwise (silently ignoring them would change what the client asked for).
fn reject_unsupported(f: &Fields) -> Result<(), ApiError> {
    for key in [
        "mirostat",
        "dry_multiplier",
        "xtc_probability",
        "dynatemp_range",
    ] {
        if f.f64(key)?.is_some_and(|v| v != 0.0) {
            return Err(ApiError::new(
                crate::error::ErrorKind::InvalidRequest,
                format!("'{key}' is not supported by specd"),
            )
            .with("param", key));
        }
    }
    if f.f64("top_n_sigma")?.is_some_and(|v| v > 0.0) {
        return Err(ApiError::invalid("'top_n_sigma' is not supported by specd")
            .with("param", "top_n_sigma"));
    }
    Ok(())
}

/// `logit_bias` as llama-server reads it: an object of token → bias (OpenAI) or a list of
/// `[token, bias]` pairs. A token is an id (a key that is a whole decimal number, as C's
/// `strtol` reads it: leading blanks and a sign allowed; ids outside `[0, n_vocab)` are
/// dropped) or a text whose every token gets the bias (`tokenize`: no BOS, special tokens as
/// plain text). A bias is a number or `false` ("never": -inf). Entries of any other form are
/// skipped, and a `logit_bias` that is neither object nor list means none, as in llama-server.
pub fn parse_logit_bias(
    f: &Fields,
    n_vocab: usize,
    tokenize: impl Fn(&str) -> Result<Vec<u32>, ApiError>,
) -> Result<Vec<(u32, f32)>, ApiError> {
    let bias_of = |v: &Value| match v {
        Value::Bool(false) => Some(f32::NEG_INFINITY),
        v => v.as_f64().map(|b| b as f32),
    };
    let id = |i: i64| u32::try_from(i).ok().filter(|&t| (t as usize) < n_vocab);
    let mut out = Vec::new();
    match f.get("logit_bias") {
        Some(Value::Array(entries)) => {
            for e in entries {
                let Some([token, bias]) = e.as_array().map(Vec::as_slice) else {
                    continue;
                };
                let Some(b) = bias_of(bias) else { continue };
                match token {
                    Value::Number(n) if n.is_i64() || n.is_u64() => {
                        if let Some(t) = n.as_i64().and_then(id) {
                            out.push((t, b));
                        }
                    }
                    Value::String(text) => out.extend(tokenize(text)?.into_iter().map(|t| (t, b))),
                    _ => {}
                }
            }
        }
        Some(Value::Object(entries)) => {
            for (key, bias) in entries {
                let Some(b) = bias_of(bias) else { continue };
                match strtol_whole(key) {
                    Some(i) => out.extend(id(i).map(|t| (t, b))),
                    None => out.extend(tokenize(key)?.into_iter().map(|t| (t, b))),
                }
            }
        }
        _ => {}
    }
    Ok(out)
}

/// The number C's `strtol(key, &end, 10)` reads when it consumes the whole key (llama-server's
/// test for "this key is a token id"): leading blanks, an optional sign, decimal digits. The
/// empty key reads as 0 (nothing to consume); values past `i64` saturate.
fn strtol_whole(key: &str) -> Option<i64> {
    if key.is_empty() {
        return Some(0);
    }
    let rest = key.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (neg, digits) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let v = digits.bytes().fold(0i64, |acc, c| {
        acc.saturating_mul(10).saturating_add(i64::from(c - b'0'))
    });
    Some(if neg { -v } else { v })
}

/// `n_cmpl` (alias `n`, OpenAI's choices): completions per prompt, from 1 to the number of
/// slots, as llama-server allows (each runs in its own slot). Numbers are truncated.
pub fn parse_n_cmpl(f: &Fields, n_slots: usize) -> Result<usize, ApiError> {
    let Some((key, v)) = ["n_cmpl", "n"]
        .into_iter()
        .find_map(|k| f.get(k).map(|v| (k, v)))
    else {
        return Ok(1);
    };
    let n = match v {
        Value::Bool(b) => i64::from(*b),
        v => v
            .as_f64()
            .map(|x| x.clamp(i64::MIN as f64, i64::MAX as f64) as i64)
            .ok_or_else(|| type_error(key, "a number"))?,
    };
    match usize::try_from(n) {
        Ok(n) if (1..=n_slots).contains(&n) => Ok(n),
        _ => Err(ApiError::invalid(format!(
            "Field '{key}': Value must be between 1 <= value <= {n_slots}, but got {n}"
        ))
        .with("param", key)),
    }
}

/// Per-request speculation: llama.cpp's flat `"speculative.n_max"` keys, or a nested
/// `"speculative": {"n_max", "n_min", "p_min", "type", "enabled", "verify"}` object.
fn parse_spec(f: &Fields, base: &SpecParams) -> Result<SpecParams, ApiError> {
    let mut p = base.clone();
    let nested = f.object("speculative")?;
    let get = |short: &str| -> Option<(String, &Value)> {
        let flat = format!("speculative.{short}");
        if let Some(v) = f.get(&flat) {
            return Some((flat, v));
        }
        nested
            .as_ref()
            .and_then(|n| n.get(short))
            .map(|v| (flat, v))
    };
    let as_usize = |(k, v): (String, &Value)| -> Result<usize, ApiError> {
        v.as_u64()
            .map(|x| x as usize)
            .ok_or_else(|| type_error(&k, "a non-negative integer"))
    };
    if let Some(kv) = get("n_max") {
        p.n_max = as_usize(kv)?;
    }
    if let Some(kv) = get("n_min") {
        p.n_min = as_usize(kv)?;
    }
    if let Some((k, v)) = get("p_min") {
        p.p_min = v.as_f64().ok_or_else(|| type_error(&k, "a number"))? as f32;
    }
    if let Some((k, v)) = get("type") {
        let list = match v {
            Value::String(s) => s.clone(),
            Value::Array(a) => a
                .iter()
                .map(|x| x.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| type_error(&k, "a string or an array of strings"))?
                .join(","),
            _ => return Err(type_error(&k, "a string or an array of strings")),
        };
        p.drafters = if list.trim() == "none" {
            Vec::new()
        } else {
            DrafterKind::parse_list(&list).map_err(|e| ApiError::invalid(e).with("param", k))?
        };
    }
    if let Some((k, v)) = get("verify") {
        let name = v
            .as_str()
            .ok_or_else(|| type_error(&k, "\"exact\" or \"probabilistic\""))?;
        p.verify = VerifyKind::parse(name).ok_or_else(|| {
            ApiError::invalid(format!(
                "{k}: unknown verification '{name}' (exact, probabilistic)"
            ))
            .with("param", k.as_str())
        })?;
    }
    if let Some((k, v)) = get("enabled") {
        if !v.as_bool().ok_or_else(|| type_error(&k, "a boolean"))? {
            p.drafters.clear();
        }
    }
    p.validate()
        .map_err(|e| ApiError::invalid(format!("speculative: {e}")))?;
    Ok(p)
}

/// `grammar` (GBNF), `json_schema`, or OpenAI `response_format`.
fn parse_grammar(f: &Fields) -> Result<Option<GrammarSpec>, ApiError> {
    if let Some(g) = f.str("grammar")? {
        if !g.trim().is_empty() {
            return Ok(Some(GrammarSpec::Gbnf(g.to_string())));
        }
    }
    if let Some(s) = f.get("json_schema") {
        if !s.is_object() && !s.is_boolean() {
            return Err(type_error("json_schema", "a JSON schema (an object)"));
        }
        return Ok(Some(GrammarSpec::JsonSchema(s.clone())));
    }
    let Some(rf) = f.object("response_format")? else {
        return Ok(None);
    };
    match rf.str("type")? {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(match rf.get("schema") {
            Some(s) => GrammarSpec::JsonSchema(s.clone()),
            None => GrammarSpec::JsonObject,
        })),
        Some("json_schema") => {
            // OpenAI: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}};
            // llama.cpp also takes {"type": "json_schema", "schema": {...}}.
            let schema = rf
                .object("json_schema")?
                .and_then(|j| j.get("schema"))
                .or_else(|| rf.get("schema"))
                .ok_or_else(|| {
                    ApiError::invalid(
                        "response_format of type json_schema needs 'json_schema.schema'",
                    )
                    .with("param", "response_format")
                })?;
            if !schema.is_object() && !schema.is_boolean() {
                return Err(type_error(
                    "response_format.json_schema.schema",
                    "an object",
                ));
            }
            Ok(Some(GrammarSpec::JsonSchema(schema.clone())))
        }
        Some(other) => Err(ApiError::invalid(format!(
            "response_format type '{other}' is not supported (text, json_object, json_schema)"
        ))
        .with("param", "response_format")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults() -> Defaults {
        Defaults {
            n_predict: None,
            sampler: SamplerParams::default(),
            spec: SpecParams {
                drafters: vec![DrafterKind::NgramSimple],
                ..SpecParams::default()
            },
            spec_named: true,
            cache_prompt: true,
            grammar: None,
            ignore_eos: false,
            logit_bias: Vec::new(),
        }
    }

    #[test]
    fn reads_llama_fields() {
        let body = json!({"temperature": 0, "top_k": 5, "n_predict": 7, "seed": 42,
            "stop": "\n", "speculative.n_max": 4, "n_probs": 3});
        let g = parse_gen(&Fields::of(&body), &defaults(), Api::Llama).unwrap();
        assert_eq!(g.sampler.temperature, 0.0);
        assert_eq!(g.sampler.top_k, 5);
        assert_eq!(g.sampler.seed, 42);
        assert_eq!(g.n_predict, Some(7));
        assert_eq!(g.stop, vec!["\n".to_string()]);
        assert_eq!(g.spec.n_max, 4);
        assert_eq!(g.n_probs, 3);
        assert!(g.cache_prompt);
    }

    #[test]
    fn switches_speculation_off() {
        for body in [
            json!({"speculative": {"enabled": false}}),
            json!({"speculative.type": "none"}),
            json!({"speculative": {"type": []}}),
        ] {
            let g = parse_gen(&Fields::of(&body), &defaults(), Api::Llama).unwrap();
            assert!(!g.spec.enabled(), "{body}");
        }
        let body = json!({"speculative.type": ["ngram-mod", "ngram-simple"]});
        let g = parse_gen(&Fields::of(&body), &defaults(), Api::Llama).unwrap();
        assert_eq!(
            g.spec.drafters,
            vec![DrafterKind::NgramMod, DrafterKind::NgramSimple]
        );
    }

    #[test]
    fn reads_verification_kind() {
        let g = parse_gen(&Fields::of(&json!({})), &defaults(), Api::Llama).unwrap();
        assert_eq!(g.spec.verify, VerifyKind::Exact);
        for body in [
            json!({"speculative.verify": "probabilistic"}),
            json!({"speculative": {"verify": "probabilistic"}}),
        ] {
            let g = parse_gen(&Fields::of(&body), &defaults(), Api::Llama).unwrap();
            assert_eq!(g.spec.verify, VerifyKind::Probabilistic, "{body}");
        }
        for body in [
            json!({"speculative.verify": "maybe"}),
            json!({"speculative.verify": 1}),
        ] {
            let e = parse_gen(&Fields::of(&body), &defaults(), Api::Llama).unwrap_err();
            assert!(
                e.message.contains("speculative.verify"),
                "{body}: {}",
                e.message
            );
        }
    }

    #[test]
    fn rejects_wrong_types_naming_the_field() {
        for (body, field) in [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"n_predict": 1.5}), "n_predict"),
            (json!({"stop": [1, 2]}), "stop"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"speculative.n_max": -1}), "speculative.n_max"),
            (json!({"seed": -5}), "seed"),
            (json!({"top_p": 2.0}), "top_p"),
        ] {
            let e = parse_gen(&Fields::of(&body), &defaults(), Api::Llama).unwrap_err();
            assert!(e.message.contains(field), "{body}: {}", e.message);
        }
    }

    #[test]
    fn openai_fields() {
        let body = json!({"max_tokens": 9, "logprobs": true, "top_logprobs": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}});
        let g = parse_gen(&Fields::of(&body), &defaults(), Api::OaiChat).unwrap();
        assert_eq!(g.n_predict, Some(9));
        assert_eq!(g.n_probs, 2);
        assert_eq!(
            g.grammar,
            Some(GrammarSpec::JsonSchema(json!({"type": "object"})))
        );
        let body = json!({"response_format": {"type": "json_object"}});
        let g = parse_gen(&Fields::of(&body), &defaults(), Api::OaiChat).unwrap();
        assert_eq!(g.grammar, Some(GrammarSpec::JsonObject));
    }

    #[test]
    fn probability_counts_as_llama_server_reads_them() {
        for (api, body, n) in [
            (Api::OaiChat, json!({"logprobs": true}), 20),
            (
                Api::OaiChat,
                json!({"logprobs": true, "top_logprobs": 0}),
                0,
            ),
            (
                Api::OaiChat,
                json!({"logprobs": true, "top_logprobs": 150}),
                150,
            ),
            (Api::OaiChat, json!({"logprobs": false, "n_probs": 2}), 2),
            (Api::OaiChat, json!({"logprobs": 2}), 2),
            (Api::OaiCompletion, json!({"logprobs": 3}), 3),
            (Api::Llama, json!({"n_probs": 2.7}), 2),
            (Api::Llama, json!({"n_probs": -1}), 0),
            (Api::Llama, json!({"logprobs": true}), 1),
        ] {
            let g = parse_gen(&Fields::of(&body), &defaults(), api).unwrap();
            assert_eq!(g.n_probs, n, "{body}");
        }
        let body = json!({"top_logprobs": 2});
        let e = parse_gen(&Fields::of(&body), &defaults(), Api::OaiChat).unwrap_err();
        assert!(e.message.contains("requires logprobs"), "{}", e.message);
    }

    #[test]
    fn logit_bias_forms() {
        // A stand-in tokenizer: one token per byte.
        let tok = |s: &str| Ok(s.bytes().map(u32::from).collect::<Vec<u32>>());
        let parse = |body: Value| parse_logit_bias(&Fields::of(&body), 300, tok).unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(
            parse(
                json!({"logit_bias": [[5, -1.5], [" a", 2], [7, false], [299, 1], [300, 1],
                [-1, 1], [1.5, 1], [[1], 1], [8, true], [9, "x"], [10], 11]})
            ),
            [(5, -1.5), (32, 2.0), (97, 2.0), (7, inf), (299, 1.0)]
        );
        assert_eq!(
            parse(
                json!({"logit_bias": {"5": -1, " 7": 1, "+8": 1, "-1": 3, "": 1, "ab": false,
                "1e2": 2, "9": null, "300": 1}})
            ),
            // In the request's order, as llama-server lists them.
            [
                (5, -1.0),
                (7, 1.0),
                (8, 1.0),
                (0, 1.0),
                (97, inf),
                (98, inf),
                (49, 2.0),
                (101, 2.0),
                (50, 2.0)
            ]
        );
        assert!(parse(json!({"logit_bias": "abc"})).is_empty());
        assert!(parse(json!({"logit_bias": null})).is_empty());
        assert!(parse(json!({})).is_empty());
    }

    #[test]
    fn choices_are_bounded_by_the_slots() {
        let n = |body: Value| parse_n_cmpl(&Fields::of(&body), 2);
        assert_eq!(n(json!({})).unwrap(), 1);
        assert_eq!(n(json!({"n": 2})).unwrap(), 2);
        assert_eq!(n(json!({"n": 1.5})).unwrap(), 1);
        assert_eq!(n(json!({"n_cmpl": 2, "n": 5})).unwrap(), 2);
        let e = n(json!({"n": 3})).unwrap_err();
        assert_eq!(
            e.message,
            "Field 'n': Value must be between 1 <= value <= 2, but got 3"
        );
        assert!(n(json!({"n_cmpl": 0})).is_err());
        assert!(n(json!({"n": "2"})).is_err());
    }
}
