//! The generating endpoints: llama.cpp `/completion`, OpenAI `/v1/completions` and
//! `/v1/chat/completions`, streaming (SSE) or not.

use crate::error::{ApiError, JsonBody};
use crate::metrics::Timings;
use crate::params::{parse_gen, parse_logit_bias, parse_n_cmpl, Api, Fields, GenParams};
use crate::scheduler::{Event, Job};
use crate::AppState;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use specd_sampling::{GrammarSpec, SamplerParams, RANDOM_SEED};
use specd_spec::engine::{logit_bias_with_eog, TokenProbs};
use specd_spec::{
    DrafterKind, FinishReason, LiveTimings, PromptProgress, SeqOutput, SequenceRequest, SpecParams,
};
use specd_tokenizer::{ChatMessage, Continuation};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The generation settings of a request as llama-server reports them (`generation_settings`,
/// `/props`, `/slots`).
#[allow(clippy::too_many_arguments)]
pub fn generation_settings(
    st: &AppState,
    s: &SamplerParams,
    n_predict: Option<usize>,
    stop: &[String],
    ignore_eos: bool,
    n_probs: usize,
    spec: &SpecParams,
    stream: bool,
) -> Value {
    json!({
        "n_ctx": st.cfg.n_ctx_slot,
        "n_predict": n_predict.map_or(-1, |n| n as i64),
        "model": st.cfg.model_id,
        "seed": s.seed,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "typical_p": s.typical_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "stop": stop,
        "max_tokens": n_predict.map_or(-1, |n| n as i64),
        "ignore_eos": ignore_eos,
        "stream": stream,
        "n_probs": n_probs,
        "samplers": ["penalties", "top_k", "typ_p", "top_p", "min_p", "temperature"],
        "speculative.n_max": spec.n_max,
        "speculative.n_min": spec.n_min,
        "speculative.p_min": spec.p_min,
        "speculative.types": spec.drafters.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "speculative.adaptive": spec.adaptive,
        "speculative.verify": spec.verify.name(),
    })
}

fn settings_of(st: &AppState, g: &GenParams) -> Value {
    let mut v = generation_settings(
        st,
        &g.sampler,
        g.n_predict,
        &g.stop,
        g.ignore_eos,
        g.n_probs,
        &g.spec,
        g.stream,
    );
    if let (Some(gr), Some(o)) = (&g.grammar, v.as_object_mut()) {
        let (k, val) = match gr {
            GrammarSpec::Gbnf(s) | GrammarSpec::Lark(s) | GrammarSpec::Regex(s) => {
                ("grammar", json!(s))
            }
            GrammarSpec::JsonSchema(s) => ("json_schema", s.clone()),
            GrammarSpec::JsonObject => ("json_schema", json!({"type": "object"})),
        };
        o.insert(k.into(), val);
    }
    v["post_sampling_probs"] = json!(g.post_sampling_probs);
    v
}

/// A request's generation parameters, with the fields that need the server: `logit_bias`
/// (texts are tokenized) and `n_cmpl` / `n` (at most one completion per slot).
fn gen_params(st: &AppState, f: &Fields, api: Api) -> Result<GenParams, ApiError> {
    let mut g = parse_gen(f, &st.cfg.defaults, api)?;
    let tok = st.model.tokenizer();
    // A request's `logit_bias` replaces the command line's.
    g.logit_bias = if f.get("logit_bias").is_some() {
        parse_logit_bias(f, st.model.config().n_vocab, |text| {
            tok.encode(text, false, false).map_err(|e| {
                ApiError::invalid(format!("logit_bias: {e}")).with("param", "logit_bias")
            })
        })?
    } else {
        st.cfg.defaults.logit_bias.clone()
    };
    g.n_cmpl = parse_n_cmpl(f, st.cfg.n_parallel)?;
    Ok(g)
}

/// The generations a request asks for: `n_cmpl` per prompt, prompt after prompt (llama-server's
/// order, which numbers the results). A prompt's extra completions sample with seed + 1, + 2, …
/// (a random seed stays random: each draws its own) and take any free slot, as llama-server's.
fn tasks(prompts: Vec<Vec<u32>>, g: &GenParams) -> Vec<(Vec<u32>, GenParams)> {
    let mut out = Vec::with_capacity(prompts.len() * g.n_cmpl);
    for p in prompts {
        for j in 0..g.n_cmpl {
            let mut gj = g.clone();
            if j > 0 {
                if gj.sampler.seed != RANDOM_SEED {
                    gj.sampler.seed = gj.sampler.seed.wrapping_add(j as u32);
                }
                gj.id_slot = None;
            }
            out.push((p.clone(), gj));
        }
    }
    out
}

/// Whether a chat prompt ends with a generation prompt, and how its last message is continued
/// (`continue_final_message`, or `prefill`: a final assistant message), if it is.
fn continuation(
    f: &Fields,
    msgs: &[Value],
    prefill: bool,
) -> Result<(bool, Option<Continuation>), ApiError> {
    let mut add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
    let last_text = |m: &Value| match m.get("content") {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    };
    // true (the content, or the reasoning when the message has only reasoning), or the part.
    let mut auto = false;
    let mut part = match f.get("continue_final_message") {
        Some(Value::Bool(true)) => {
            auto = true;
            Some(Continuation::Content)
        }
        Some(Value::String(s)) if s == "content" => Some(Continuation::Content),
        Some(Value::String(s)) if s == "reasoning_content" => Some(Continuation::Reasoning),
        _ => None,
    };
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_string);
    let n = msgs.len();
    // Assistant prefill: a final assistant message is continued (llama-server's default).
    if prefill && part.is_none() && n > 0 && role(&msgs[n - 1]).as_deref() == Some("assistant") {
        if n >= 2 && role(&msgs[n - 2]).as_deref() == Some("assistant") {
            return Err(ApiError::invalid(
                "Cannot have 2 or more assistant messages at the end of the list.",
            ));
        }
        part = Some(Continuation::Content);
        auto = true;
        add_generation_prompt = false;
    }
    let Some(mut part) = part else {
        return Ok((add_generation_prompt, None));
    };
    if add_generation_prompt {
        return Err(ApiError::invalid(
            "Cannot set both add_generation_prompt and continue_final_message to true.",
        ));
    }
    if let Some(last) = msgs.last() {
        let tool_calls = last.get("tool_calls").and_then(Value::as_array);
        if role(last).as_deref() == Some("assistant") && tool_calls.is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid(
                "Cannot continue an assistant message that contains tool calls.",
            ));
        }
        let reasoning = last.get("reasoning_content").and_then(Value::as_str);
        if auto && last_text(last) && reasoning.is_some_and(|r| !r.is_empty()) {
            part = Continuation::Reasoning;
        }
    }
    Ok((false, Some(part)))
}

/// Checks `messages` as llama-server does (same messages); media parts are refused, specd
/// serving text models only.
fn check_messages(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let msgs = match f.0.get("messages") {
        None => return Err(ApiError::invalid("'messages' is required").with("param", "messages")),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(
                ApiError::invalid("Expected 'messages' to be an array").with("param", "messages")
            )
        }
    };
    for m in msgs {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content");
        if role != "assistant" && content.is_none() {
            return Err(ApiError::invalid(
                "All non-assistant messages must contain 'content'",
            ));
        }
        if role == "assistant" && content.is_none() {
            if m.get("tool_calls").is_none() {
                return Err(ApiError::invalid(
                    "Assistant message must contain either 'content' or 'tool_calls'!",
                ));
            }
            continue;
        }
        match content {
            None | Some(Value::String(_)) | Some(Value::Null) => {}
            Some(Value::Array(parts)) => {
                for p in parts {
                    match p.get("type").and_then(Value::as_str) {
                        Some("text") => {}
                        Some(t @ ("image_url" | "input_audio" | "input_video" | "video_url")) => {
                            return Err(ApiError::invalid(format!(
                                "content of type '{t}' is not supported: specd serves text models"
                            )))
                        }
                        _ => return Err(ApiError::invalid("unsupported content[].type")),
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "Expected 'content' to be a string or an array",
                ))
            }
        }
    }
    Ok(msgs.clone())
}

/// Applies the chat template to a request's `messages` (with `tools` and
/// `chat_template_kwargs` visible to the template): a generation prompt after them, or — with
/// `continue_final_message`, or a final assistant message (prefill) — the last one left open.
pub fn render_chat(st: &AppState, f: &Fields) -> Result<String, ApiError> {
    let raw = check_messages(f)?;
    let (add_generation_prompt, part) = continuation(f, &raw, st.cfg.prefill_assistant)?;
    let msgs: Vec<ChatMessage> = raw
        .into_iter()
        .map(|m| {
            serde_json::from_value(m.clone()).map_err(|e| {
                ApiError::invalid(format!("Failed to parse messages: {e}: {m}"))
                    .with("param", "messages")
            })
        })
        .collect::<Result<_, _>>()?;
    let mut extra = f
        .object("chat_template_kwargs")?
        .map(|o| o.0.clone())
        .unwrap_or_default();
    if let Some(t) = f.get("tools") {
        extra.insert("tools".into(), t.clone());
    }
    let out = match part {
        None => st.template.render(&msgs, add_generation_prompt, &extra),
        Some(p) => st.template.render_continuation(&msgs, p, &extra),
    };
    out.map_err(|e| ApiError::invalid(format!("applying the chat template: {e}")))
}

/// Text → tokens as llama-server does for prompts: BOS as the model asks, special tokens parsed.
fn tokenize_prompt(st: &AppState, text: &str, add_special: bool) -> Result<Vec<u32>, ApiError> {
    let tok = st.model.tokenizer();
    let mut ids = tok
        .encode(text, add_special, true)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    // A template that writes BOS itself plus the tokenizer's own: keep one.
    if let Some(b) = tok.bos_id() {
        if ids.len() >= 2 && ids[0] == b && ids[1] == b {
            ids.remove(0);
        }
    }
    Ok(ids)
}

fn is_int(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

fn bad_prompt() -> ApiError {
    ApiError::invalid(
        "\"prompt\" elements must be a string, a list of tokens, a JSON object containing a prompt string, or a list of mixed strings & tokens.",
    )
    .with("param", "prompt")
}

/// A token id of a prompt; ids outside the vocabulary are refused as llama-server does.
fn prompt_token(st: &AppState, v: &Value) -> Result<u32, ApiError> {
    let n_vocab = st.model.config().n_vocab;
    v.as_u64()
        .filter(|&t| t < n_vocab as u64)
        .map(|t| t as u32)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "Prompt contains invalid tokens: {v} in the prompt is not a token id (the vocabulary has {n_vocab})"
            ))
            .with("param", "prompt")
        })
}

/// A string, or token ids mixed with strings: BOS (when the model wants one) only before a
/// leading string.
fn tokenize_mixed(st: &AppState, v: &Value) -> Result<Vec<u32>, ApiError> {
    match v {
        Value::String(s) => tokenize_prompt(st, s, true),
        Value::Array(items) => {
            let mut out = Vec::new();
            for (i, it) in items.iter().enumerate() {
                match it {
                    Value::String(s) => out.extend(tokenize_prompt(st, s, i == 0)?),
                    n if is_int(n) => out.push(prompt_token(st, n)?),
                    _ => return Err(bad_prompt()),
                }
            }
            Ok(out)
        }
        _ => Err(bad_prompt()),
    }
}

/// One prompt: a string, token ids (maybe mixed with strings), or
/// `{"prompt_string": ..., "multimodal_data": [...]}` (text only: specd has no multimodal
/// models).
fn sub_prompt(st: &AppState, v: &Value) -> Result<Vec<u32>, ApiError> {
    match v {
        Value::String(_) | Value::Array(_) => tokenize_mixed(st, v),
        Value::Object(o) => {
            let Some(p) = o.get("prompt_string") else {
                return Err(bad_prompt());
            };
            if o.contains_key("multimodal_data") {
                return Err(ApiError::invalid(
                    "Multimodal data provided, but model does not support multimodal requests.",
                )
                .with("param", "prompt"));
            }
            tokenize_mixed(st, p)
        }
        _ => Err(bad_prompt()),
    }
}

/// `prompt` of `/completion` and `/v1/completions`, read as llama-server reads it: an array
/// holding any token id is one prompt; any other array is a list of prompts (one result each).
fn parse_prompts(st: &AppState, f: &Fields) -> Result<Vec<Vec<u32>>, ApiError> {
    let Some(p) = f.0.get("prompt") else {
        return Err(ApiError::invalid("\"prompt\" is required").with("param", "prompt"));
    };
    let prompts: Vec<&Value> = match p {
        Value::Array(a) if !a.iter().any(is_int) => a.iter().collect(),
        other => vec![other],
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("\"prompt\" must not be empty").with("param", "prompt"));
    }
    prompts.into_iter().map(|v| sub_prompt(st, v)).collect()
}

/// Checks a prompt and builds the engine request. An empty prompt is answered at once with
/// nothing generated, as llama-server does.
fn prepare(st: &AppState, prompt: Vec<u32>, g: &GenParams) -> Result<SequenceRequest, ApiError> {
    let n_ctx = st.cfg.n_ctx_slot;
    if prompt.len() >= n_ctx {
        return Err(ApiError::exceed_context(prompt.len(), n_ctx));
    }
    // n_predict 0 evaluates the prompt only (llama-server): generate one token, report none.
    let n_predict = match g.n_predict {
        Some(0) => 1,
        Some(n) => n,
        None => n_ctx, // the context bounds it
    };
    let mut r = SequenceRequest::greedy(prompt, n_predict);
    r.sampler = g.sampler;
    r.ignore_eos = g.ignore_eos;
    r.stop = g.stop.clone();
    r.spec = g.spec.clone();
    r.n_probs = g.n_probs;
    r.post_sampling_probs = g.post_sampling_probs;
    r.logit_bias = g.logit_bias.clone();
    r.grammar = g.grammar.clone();
    if r.spec.drafters.contains(&DrafterKind::DraftSimple) {
        r.draft_model = st.cfg.draft_model.clone();
        if r.draft_model.is_none() {
            return Err(ApiError::invalid(
                "speculative type draft-simple needs a draft model (start the server with -md)",
            ));
        }
    }
    Ok(r)
}

/// What a request asks to see besides the generation (llama-server's response options).
#[derive(Debug, Clone, Copy)]
struct Extras {
    /// `verbose` (default on with `--verbose`): `__verbose`, the llama-server form of the result.
    verbose: bool,
    /// `timings_per_token`: timings in every streamed chunk.
    timings_per_token: bool,
    /// `return_progress` (streams only): `prompt_progress` chunks while the prompt is processed.
    progress: bool,
}

impl Extras {
    fn of(st: &AppState, f: &Fields, g: &GenParams) -> Result<Self, ApiError> {
        Ok(Extras {
            verbose: f.bool("verbose")?.unwrap_or(st.cfg.verbose),
            timings_per_token: f.bool("timings_per_token")?.unwrap_or(false),
            progress: g.stream && f.bool("return_progress")?.unwrap_or(false),
        })
    }
}

/// A request handed to the engine.
struct Running {
    rx: mpsc::UnboundedReceiver<Event>,
    /// Its slot (known once it started).
    slot: usize,
    prompt: Vec<u32>,
    /// `n_predict: 0`: the one token generated is not reported.
    zero: bool,
    /// Streamed with `timings_per_token`.
    timings: bool,
}

/// Hands a generation to the engine without waiting for it to start.
async fn submit(
    st: &Arc<AppState>,
    prompt: Vec<u32>,
    g: &GenParams,
    x: Extras,
) -> Result<Running, ApiError> {
    let mut req = prepare(st, prompt.clone(), g)?;
    if req.spec.drafters.contains(&DrafterKind::Synthetic) && !req.prompt.is_empty() {
        let (st2, r) = (st.clone(), req.clone());
        let reference = tokio::task::spawn_blocking(move || {
            st2.references
                .get_or_run(st2.model.clone(), &r, st2.cfg.n_ctx_slot, st2.cfg.kv_types)
        })
        .await
        .map_err(|e| ApiError::server(format!("synthetic reference run: {e}")))??;
        req.reference = Some(reference);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    st.sched.submit(Job {
        req,
        id_slot: g.id_slot,
        cache_prompt: g.cache_prompt,
        events: tx,
        settings: settings_of(st, g),
        progress: x.progress,
        timings: x.timings_per_token && g.stream,
    })?;
    Ok(Running {
        rx,
        slot: 0,
        prompt,
        zero: g.n_predict == Some(0),
        timings: x.timings_per_token && g.stream,
    })
}

/// Submits a generation and waits until it has a slot (or fails: bad grammar, …), so errors
/// get their own status even for streamed requests.
async fn start(
    st: &Arc<AppState>,
    prompt: Vec<u32>,
    g: &GenParams,
    x: Extras,
) -> Result<Running, ApiError> {
    let mut r = submit(st, prompt, g, x).await?;
    loop {
        match r.rx.recv().await {
            Some(Event::Started { slot, .. }) => {
                r.slot = slot;
                return Ok(r);
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(_) => continue,
            None => return Err(ApiError::server("the engine dropped the request")),
        }
    }
}

/// Clears what `n_predict: 0` generated only to evaluate the prompt.
fn hide_zero(out: &mut SeqOutput) {
    out.tokens.clear();
    out.text.clear();
    out.probs.clear();
    out.eog = None;
}

/// Waits for the end of a generation.
async fn finish(mut r: Running) -> Result<(SeqOutput, Running), ApiError> {
    loop {
        match r.rx.recv().await {
            Some(Event::Done(out)) => {
                let mut out = *out;
                if r.zero {
                    hide_zero(&mut out);
                }
                return Ok((out, r));
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(Event::Started { slot, .. }) => r.slot = slot,
            Some(_) => continue,
            None => return Err(ApiError::server("the engine dropped the request")),
        }
    }
}

static ID_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique response id (`chatcmpl-…`, `cmpl-…`).
fn response_id(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = ID_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{nanos:x}{n:04x}")
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// llama-server's `timings` (see [`Timings`]) of a generation so far (`timings_per_token`).
fn timings_json(t: &LiveTimings) -> Value {
    Timings::live(t).json()
}

/// llama-server's `timings` of a whole generation: numbers only, as clients read them.
fn timings(out: &SeqOutput) -> Value {
    timings_json(&out.timings())
}

/// specd's speculation statistics of a generation (acceptance length and rate, rounds,
/// rollbacks by kind, …), given next to `timings`.
fn speculative(out: &SeqOutput) -> Value {
    let mut spec = serde_json::to_value(&out.stats).unwrap_or_else(|_| json!({}));
    if let Some(o) = spec.as_object_mut() {
        o.insert(
            "acceptance_length".into(),
            json!(out.stats.acceptance_length()),
        );
        o.insert("acceptance_rate".into(), json!(out.stats.acceptance_rate()));
    }
    spec
}

/// The final `timings` of a result, and the speculation statistics next to them.
fn add_timings(v: &mut Value, out: &SeqOutput) {
    v["timings"] = timings(out);
    v["speculative"] = speculative(out);
}

/// `timings` of a progress report (`timings_per_token`): the prompt so far, nothing predicted.
fn progress_timings(p: &PromptProgress) -> Value {
    Timings::progress(p).json()
}

/// llama-server's `prompt_progress`.
fn progress_json(p: &PromptProgress) -> Value {
    json!({
        "total": p.total,
        "cache": p.cache,
        "processed": p.processed,
        "time_ms": (p.secs * 1e3) as u64,
    })
}

fn stop_type(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Eos => "eos",
        FinishReason::Stop => "word",
        FinishReason::Limit | FinishReason::Context => "limit",
        FinishReason::Error => "none",
    }
}

/// OpenAI `finish_reason`: `stop` for an end-of-generation token or a stop string, `length`
/// otherwise (llama-server: an empty prompt's answer too).
fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Limit | FinishReason::Context | FinishReason::Error => "length",
    }
}

/// A token's text and bytes as llama-server writes them: a multi-byte UTF-8 sequence cut off at
/// the end of the text is dropped from it (the bytes keep it), other invalid bytes become U+FFFD.
fn token_str(st: &AppState, id: u32) -> (String, Vec<u8>) {
    let b = st.model.tokenizer().token_to_bytes(id).to_vec();
    let text = String::from_utf8_lossy(&b[..complete_utf8_len(&b)]).into_owned();
    (text, b)
}

/// Length of `b` without a multi-byte UTF-8 sequence cut off at its end (llama-server's
/// `validate_utf8`: the last four bytes are checked for a lead byte missing continuations).
fn complete_utf8_len(b: &[u8]) -> usize {
    for i in 1..=b.len().min(4) {
        let c = b[b.len() - i];
        let len = match c {
            _ if c & 0xE0 == 0xC0 => 2,
            _ if c & 0xF0 == 0xE0 => 3,
            _ if c & 0xF8 == 0xF0 => 4,
            _ => continue,
        };
        if i < len {
            return b.len() - i;
        }
    }
    b.len()
}

/// llama-server's probabilities of generated tokens (`completion_probabilities`, and the
/// `content` of OpenAI `logprobs`): per token its `id`, `token`, `bytes` and log-probability
/// (`logprob`, `top_logprobs`) under the raw model, or with `post_sampling_probs` its
/// probability (`prob`, `top_probs`) under the sampler's final distribution.
fn probs_json(st: &AppState, probs: &[TokenProbs], post_sampling: bool) -> Vec<Value> {
    let (key, top_key) = if post_sampling {
        ("prob", "top_probs")
    } else {
        ("logprob", "top_logprobs")
    };
    let entry = |id: u32, logprob: f32| {
        let (t, b) = token_str(st, id);
        let v: f32 = if post_sampling {
            f64::from(logprob).exp() as f32
        } else if logprob == f32::NEG_INFINITY {
            // JSON has no -inf: llama-server writes the lowest float.
            f32::MIN
        } else {
            logprob
        };
        let mut m = serde_json::Map::new();
        m.insert("id".into(), id.into());
        m.insert("token".into(), t.into());
        m.insert("bytes".into(), b.into());
        m.insert(key.into(), Value::from(v));
        m
    };
    probs
        .iter()
        .map(|p| {
            let mut e = entry(p.token, p.logprob);
            let top = p.top.iter().map(|&(id, lp)| Value::Object(entry(id, lp)));
            e.insert(top_key.into(), top.collect());
            Value::Object(e)
        })
        .collect()
}

/// The `logprobs` of an OpenAI choice: `{"content": [...]}` when probabilities were asked for
/// and there are some.
fn oai_logprobs(st: &AppState, probs: &[TokenProbs], g: &ProbsAsked) -> Option<Value> {
    (g.n_probs > 0 && !probs.is_empty())
        .then(|| json!({"content": probs_json(st, probs, g.post_sampling)}))
}

/// Which probabilities a response reports.
#[derive(Clone, Copy)]
struct ProbsAsked {
    n_probs: usize,
    post_sampling: bool,
}

impl ProbsAsked {
    fn of(g: &GenParams) -> Self {
        ProbsAsked {
            n_probs: g.n_probs,
            post_sampling: g.post_sampling_probs,
        }
    }
}

/// OpenAI `usage`, counted as llama-server counts: every prompt token (cached ones included),
/// every sampled token (an end-of-generation token included).
fn usage(out: &SeqOutput) -> Value {
    json!({
        "prompt_tokens": out.n_prompt,
        "completion_tokens": out.n_decoded(),
        "total_tokens": out.n_prompt + out.n_decoded(),
        "prompt_tokens_details": {"cached_tokens": out.n_cached},
    })
}

/// The final llama-server object of a generation (`/completion`, and `__verbose`).
type FullFn = Box<dyn Fn(&SeqOutput) -> Value + Send>;

/// What a streamed response looks like, per API. Each shape holds one generation; `index`, its
/// place among the request's (prompts × `n_cmpl`), tells the generations apart in every chunk.
enum Shape {
    Llama {
        index: usize,
        slot: usize,
        probs: ProbsAsked,
        n_prompt: usize,
        n_decoded: usize,
        full: FullFn,
    },
    OaiCompletion {
        index: usize,
        slot: usize,
        id: String,
        created: u64,
        model: String,
        probs: ProbsAsked,
        n_prompt: usize,
        n_decoded: usize,
        /// With `verbose`: the final object for `__verbose`.
        verbose: Option<FullFn>,
    },
    OaiChat {
        index: usize,
        id: String,
        created: u64,
        model: String,
        probs: ProbsAsked,
        include_usage: bool,
        started: bool,
        verbose: Option<FullFn>,
    },
}

/// A streamed llama-server partial result (also the `__verbose` of OpenAI completion chunks).
fn llama_partial(
    index: usize,
    slot: usize,
    text: &str,
    tokens: &[u32],
    n: usize,
    np: usize,
) -> Value {
    json!({
        "index": index, "content": text, "tokens": tokens, "stop": false,
        "id_slot": slot, "tokens_predicted": n, "tokens_evaluated": np,
    })
}

impl Shape {
    fn set_slot(&mut self, s: usize) {
        if let Shape::Llama { slot, .. } | Shape::OaiCompletion { slot, .. } = self {
            *slot = s;
        }
    }

    /// Payloads for new tokens.
    fn chunk(
        &mut self,
        st: &AppState,
        tokens: Vec<u32>,
        text: String,
        probs: &[TokenProbs],
        live: Option<&LiveTimings>,
    ) -> Vec<String> {
        match self {
            Shape::Llama {
                index,
                slot,
                probs: asked,
                n_prompt,
                n_decoded,
                ..
            } => {
                *n_decoded += tokens.len();
                let mut v = llama_partial(*index, *slot, &text, &tokens, *n_decoded, *n_prompt);
                if asked.n_probs > 0 && !probs.is_empty() {
                    v["completion_probabilities"] =
                        json!(probs_json(st, probs, asked.post_sampling));
                }
                if let Some(t) = live {
                    v["timings"] = timings_json(t);
                }
                vec![v.to_string()]
            }
            Shape::OaiCompletion {
                index,
                slot,
                id,
                created,
                model,
                probs: asked,
                n_prompt,
                n_decoded,
                verbose,
            } => {
                *n_decoded += tokens.len();
                let lp = oai_logprobs(st, probs, asked);
                let mut v = json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"text": text, "index": index, "logprobs": lp, "finish_reason": null}],
                });
                if verbose.is_some() {
                    v["__verbose"] =
                        llama_partial(*index, *slot, &text, &tokens, *n_decoded, *n_prompt);
                }
                if let Some(t) = live {
                    v["timings"] = timings_json(t);
                }
                vec![v.to_string()]
            }
            Shape::OaiChat {
                index,
                id,
                created,
                model,
                probs: asked,
                started,
                ..
            } => {
                let mut out = Vec::new();
                let head = |delta: Value, lp: Option<Value>| {
                    let mut choice = json!({"index": index, "delta": delta, "finish_reason": null});
                    // llama-server names `logprobs` only in chunks that carry some.
                    if let Some(lp) = lp {
                        choice["logprobs"] = lp;
                    }
                    json!({
                        "id": id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "system_fingerprint": fingerprint(), "choices": [choice],
                    })
                };
                if !*started {
                    *started = true;
                    out.push(head(json!({"role": "assistant", "content": null}), None));
                }
                if !text.is_empty() || !probs.is_empty() {
                    out.push(head(
                        json!({"content": text}),
                        oai_logprobs(st, probs, asked),
                    ));
                }
                // Timings ride on the last chunk of the token (llama-server).
                if let (Some(t), Some(last)) = (live, out.last_mut()) {
                    last["timings"] = timings_json(t);
                }
                out.into_iter().map(|v| v.to_string()).collect()
            }
        }
    }

    /// A `prompt_progress` chunk (with the prompt's timings so far for `timings_per_token`).
    fn progress(&self, p: &PromptProgress, with_timings: bool) -> Vec<String> {
        let mut v = match self {
            Shape::Llama {
                index,
                slot,
                n_prompt,
                n_decoded,
                ..
            } => llama_partial(*index, *slot, "", &[], *n_decoded, *n_prompt),
            Shape::OaiCompletion {
                index,
                id,
                created,
                model,
                ..
            } => json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"text": "", "index": index, "logprobs": null, "finish_reason": null}],
            }),
            // llama-server sends each progress report as a role chunk.
            Shape::OaiChat {
                index,
                id,
                created,
                model,
                ..
            } => json!({
                "id": id, "object": "chat.completion.chunk", "created": created,
                "model": model, "system_fingerprint": fingerprint(),
                "choices": [{"index": index, "delta": {"role": "assistant", "content": null},
                             "finish_reason": null}],
            }),
        };
        if with_timings {
            v["timings"] = progress_timings(p);
        }
        v["prompt_progress"] = progress_json(p);
        vec![v.to_string()]
    }

    /// Payloads for the end of the generation (the stream's `[DONE]` comes after all of the
    /// request's generations); `per_token`: the request asked for `timings_per_token`.
    fn done(&mut self, st: &AppState, out: &SeqOutput, per_token: bool) -> Vec<String> {
        // llama-server streams the end-of-generation token as a chunk of its own.
        let live = per_token.then(|| out.timings());
        let mut v = match out.eog {
            Some(t) if !matches!(self, Shape::OaiChat { .. }) => {
                self.chunk(st, vec![t], String::new(), &[], live.as_ref())
            }
            _ => Vec::new(),
        };
        match self {
            Shape::Llama { full, slot, .. } => {
                let mut f = full(out);
                f["id_slot"] = json!(slot);
                v.push(f.to_string());
            }
            Shape::OaiCompletion {
                index,
                slot,
                id,
                created,
                model,
                verbose,
                ..
            } => {
                let mut c = json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"text": "", "index": index, "logprobs": null,
                                 "finish_reason": finish_reason(out.reason)}],
                    "usage": usage(out),
                });
                add_timings(&mut c, out);
                if let Some(f) = verbose {
                    c["__verbose"] = f(out);
                    c["__verbose"]["id_slot"] = json!(slot);
                }
                v.push(c.to_string());
            }
            Shape::OaiChat {
                index,
                id,
                created,
                model,
                include_usage,
                started,
                verbose,
                ..
            } => {
                let chunk = |choices: Value| {
                    json!({
                        "id": id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "system_fingerprint": fingerprint(), "choices": choices,
                    })
                };
                let mut cs = Vec::new();
                // A stream that produced no text still opens with the role chunk.
                if !*started {
                    *started = true;
                    cs.push(chunk(
                        json!([{"index": index, "delta": {"role": "assistant", "content": null},
                                "finish_reason": null}]),
                    ));
                }
                let mut fin = chunk(json!([{"index": index, "delta": {},
                            "finish_reason": finish_reason(out.reason)}]));
                if let Some(f) = verbose {
                    fin["__verbose"] = f(out);
                }
                cs.push(fin);
                if *include_usage {
                    let mut u = chunk(json!([]));
                    u["usage"] = usage(out);
                    cs.push(u);
                }
                // The timings go on the last chunk: the usage chunk when there is one.
                if let Some(last) = cs.last_mut() {
                    add_timings(last, out);
                }
                v.extend(cs.into_iter().map(|c| c.to_string()));
            }
        }
        v
    }
}

fn fingerprint() -> String {
    format!("specd-{}", env!("CARGO_PKG_VERSION"))
}

/// One generation's SSE payloads as a stream: `(payloads, failed)` per event, ending after its
/// last. Dropping it (the client went away) drops the event receiver, which cancels the slot.
fn payloads(
    st: Arc<AppState>,
    r: Running,
    shape: Shape,
) -> impl Stream<Item = (Vec<String>, bool)> + Send {
    struct S {
        st: Arc<AppState>,
        r: Running,
        shape: Shape,
    }
    stream::unfold(Some(S { st, r, shape }), |state| async move {
        let mut s = state?;
        loop {
            match s.r.rx.recv().await {
                Some(Event::Chunk {
                    tokens,
                    text,
                    probs,
                    timings,
                }) => {
                    if s.r.zero {
                        continue;
                    }
                    let p = s
                        .shape
                        .chunk(&s.st, tokens, text, &probs, timings.as_deref());
                    if !p.is_empty() {
                        return Some(((p, false), Some(s)));
                    }
                }
                Some(Event::Progress(p)) => {
                    return Some(((s.shape.progress(&p, s.r.timings), false), Some(s)))
                }
                Some(Event::Done(out)) => {
                    let mut out = *out;
                    if s.r.zero {
                        hide_zero(&mut out);
                    }
                    let p = s.shape.done(&s.st, &out, s.r.timings);
                    return Some(((p, false), None));
                }
                Some(Event::Failed(e)) => {
                    return Some(((vec![json!({"error": e.object()}).to_string()], true), None))
                }
                Some(Event::Started { slot, .. }) => {
                    s.r.slot = slot;
                    s.shape.set_slot(slot);
                }
                None => {
                    let e = ApiError::server("the engine dropped the request");
                    return Some(((vec![json!({"error": e.object()}).to_string()], true), None));
                }
            }
        }
    })
}

/// Streams generations as server-sent events, their chunks interleaved as they come (each
/// names its `index`); OpenAI streams end with `[DONE]` once all have finished. The first error
/// ends the stream. Dropping the stream (the client went away) drops the event receivers,
/// which cancels the slots.
fn sse(st: Arc<AppState>, runs: Vec<(Running, Shape)>, done_marker: bool) -> Response {
    let merged = stream::select_all(
        runs.into_iter()
            .map(|(r, shape)| Box::pin(payloads(st.clone(), r, shape))),
    );
    let events = stream::unfold(Some(merged), move |state| async move {
        let mut merged = state?;
        match merged.next().await {
            Some((p, failed)) => Some((p, (!failed).then_some(merged))),
            None => done_marker.then(|| (vec!["[DONE]".to_string()], None)),
        }
    });
    let events = events.flat_map(|payloads| {
        stream::iter(
            payloads
                .into_iter()
                .map(|d| Ok::<_, Infallible>(SseEvent::default().data(d))),
        )
    });
    sse_response(events)
}

fn sse_response<S>(events: S) -> Response
where
    S: Stream<Item = Result<SseEvent, Infallible>> + Send + 'static,
{
    Sse::new(events).into_response()
}

fn into_response(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

/// llama-server's final `/completion` object. Token counts are llama-server's: the
/// end-of-generation token counts as predicted (and is in `tokens`); `tokens_cached` is what
/// the slot holds afterwards (prompt and generated tokens, the last sampled one not yet fed).
fn llama_full(
    st: &AppState,
    g: &GenParams,
    index: usize,
    slot: usize,
    prompt: &[u32],
    out: &SeqOutput,
    streamed: bool,
) -> Value {
    let mut tokens = Vec::new();
    if g.return_tokens && !streamed {
        tokens.extend_from_slice(&out.tokens);
        tokens.extend(out.eog);
    }
    let n_decoded = out.n_decoded();
    let mut settings = settings_of(st, g);
    // The biases the sampler used: the request's, then ignore_eos's bans (llama-server shows
    // them here only, not in /slots).
    let eog = st.model.tokenizer().eog_ids();
    settings["logit_bias"] = logit_bias_with_eog(&g.logit_bias, g.ignore_eos, eog)
        .into_iter()
        .map(|(t, b)| json!({"bias": b, "token": t}))
        .collect();
    let mut v = json!({
        "index": index,
        "content": if streamed { "" } else { out.text.as_str() },
        "tokens": tokens,
        "id_slot": slot,
        "stop": true,
        "model": st.cfg.model_id,
        "tokens_predicted": n_decoded,
        "tokens_evaluated": out.n_prompt,
        "tokens_cached": (out.n_prompt + n_decoded).saturating_sub(usize::from(n_decoded > 0)),
        "generation_settings": settings,
        "prompt": st.model.tokenizer().decode(prompt, true).unwrap_or_default(),
        "has_new_line": out.text.contains('\n'),
        "truncated": out.reason == FinishReason::Context,
        "stop_type": stop_type(out.reason),
        "stopping_word": out.stop_word.clone().unwrap_or_default(),
    });
    add_timings(&mut v, out);
    if g.n_probs > 0 && !streamed && !out.probs.is_empty() {
        v["completion_probabilities"] = json!(probs_json(st, &out.probs, g.post_sampling_probs));
    }
    v
}

/// The final llama-server object of one generation, for a stream's last chunk or `__verbose`.
fn full_fn(st: &Arc<AppState>, g: &GenParams, index: usize, r: &Running, streamed: bool) -> FullFn {
    let (st, g, slot, prompt) = (st.clone(), g.clone(), r.slot, r.prompt.clone());
    Box::new(move |out: &SeqOutput| llama_full(&st, &g, index, slot, &prompt, out, streamed))
}

/// Submits every generation of a streamed request: the first one is waited for, so that a
/// request that cannot start gets an error status instead of a stream (llama-server waits for
/// its first result); the others take their slots as they free up.
async fn start_streams(
    st: &Arc<AppState>,
    tasks: &[(Vec<u32>, GenParams)],
    x: Extras,
) -> Result<Vec<Running>, ApiError> {
    let mut runs = Vec::with_capacity(tasks.len());
    for (i, (p, g)) in tasks.iter().enumerate() {
        runs.push(if i == 0 {
            start(st, p.clone(), g, x).await?
        } else {
            submit(st, p.clone(), g, x).await?
        });
    }
    Ok(runs)
}

/// `POST /completion`: llama-server's completion API.
pub async fn completion(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody) -> Response {
    into_response(completion_inner(st, body).await)
}

async fn completion_inner(st: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let f = Fields::of(&body);
    let g = gen_params(&st, &f, Api::Llama)?;
    let x = Extras::of(&st, &f, &g)?;
    let tasks = tasks(parse_prompts(&st, &f)?, &g);
    if g.stream {
        let runs = start_streams(&st, &tasks, x).await?;
        let runs = runs
            .into_iter()
            .zip(&tasks)
            .enumerate()
            .map(|(index, (r, (_, g)))| {
                // A later generation's slot is known when it starts (the shape is told then).
                let shape = Shape::Llama {
                    index,
                    slot: r.slot,
                    probs: ProbsAsked::of(g),
                    n_prompt: r.prompt.len(),
                    n_decoded: 0,
                    full: full_fn(&st, g, index, &r, true),
                };
                (r, shape)
            })
            .collect();
        return Ok(sse(st, runs, false));
    }
    let results = run_all(&st, &tasks, x).await?;
    let mut v: Vec<Value> = results
        .iter()
        .zip(&tasks)
        .enumerate()
        .map(|(i, ((out, r), (_, g)))| llama_full(&st, g, i, r.slot, &r.prompt, out, false))
        .collect();
    Ok(if v.len() == 1 {
        Json(v.remove(0)).into_response()
    } else {
        Json(Value::Array(v)).into_response()
    })
}

/// Runs every generation at once (they share the engine's batches) and waits for all.
async fn run_all(
    st: &Arc<AppState>,
    tasks: &[(Vec<u32>, GenParams)],
    x: Extras,
) -> Result<Vec<(SeqOutput, Running)>, ApiError> {
    let runs = futures_util::future::join_all(tasks.iter().map(|(p, g)| async move {
        let r = start(st, p.clone(), g, x).await?;
        finish(r).await
    }))
    .await;
    runs.into_iter().collect()
}

/// `POST /v1/completions`: OpenAI's completions API.
pub async fn oai_completion(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody) -> Response {
    into_response(oai_completion_inner(st, body).await)
}

async fn oai_completion_inner(st: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let f = Fields::of(&body);
    let g = gen_params(&st, &f, Api::OaiCompletion)?;
    let x = Extras::of(&st, &f, &g)?;
    let prompts = parse_prompts(&st, &f)?;
    let echo = f.bool("echo")?.unwrap_or(false);
    let model = f.str("model")?.unwrap_or(&st.cfg.model_id).to_string();
    let id = response_id("cmpl");
    let created = unix_now();
    let tasks = tasks(prompts, &g);
    if g.stream {
        if echo {
            return Err(
                ApiError::invalid("'echo' is not supported with streaming").with("param", "echo")
            );
        }
        let runs = start_streams(&st, &tasks, x).await?;
        let runs = runs
            .into_iter()
            .zip(&tasks)
            .enumerate()
            .map(|(index, (r, (_, g)))| {
                let verbose = x.verbose.then(|| full_fn(&st, g, index, &r, true));
                let shape = Shape::OaiCompletion {
                    index,
                    slot: r.slot,
                    id: id.clone(),
                    created,
                    model: model.clone(),
                    probs: ProbsAsked::of(g),
                    n_prompt: r.prompt.len(),
                    n_decoded: 0,
                    verbose,
                };
                (r, shape)
            })
            .collect();
        return Ok(sse(st, runs, true));
    }
    let results = run_all(&st, &tasks, x).await?;
    let tok = st.model.tokenizer();
    let mut choices = Vec::new();
    for (i, ((out, r), (_, g))) in results.iter().zip(&tasks).enumerate() {
        let prefix = if echo {
            tok.decode(&r.prompt, false).unwrap_or_default()
        } else {
            String::new()
        };
        choices.push(json!({
            "text": format!("{prefix}{}", out.text),
            "index": i,
            "logprobs": oai_logprobs(&st, &out.probs, &ProbsAsked::of(g)),
            "finish_reason": finish_reason(out.reason),
        }));
    }
    let mut v = json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "choices": choices,
    });
    // llama-server answers several generations with the first one's usage and timings.
    if let Some(((out, r), (_, g))) = results.iter().zip(&tasks).next() {
        v["usage"] = usage(out);
        add_timings(&mut v, out);
        if x.verbose {
            v["__verbose"] = llama_full(&st, g, 0, r.slot, &r.prompt, out, false);
        }
    }
    Ok(Json(v).into_response())
}

/// The prompt of a chat request: its messages through the chat template, tokenized.
fn chat_prompt(st: &AppState, f: &Fields) -> Result<Vec<u32>, ApiError> {
    let text = render_chat(st, f)?;
    tokenize_prompt(st, &text, true)
}

/// `POST /v1/chat/completions`: OpenAI's chat API.
pub async fn chat(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody) -> Response {
    into_response(chat_inner(st, body).await)
}

async fn chat_inner(st: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let f = Fields::of(&body);
    let g = gen_params(&st, &f, Api::OaiChat)?;
    let x = Extras::of(&st, &f, &g)?;
    let prompt = chat_prompt(&st, &f)?;
    let model = f.str("model")?.unwrap_or(&st.cfg.model_id).to_string();
    let include_usage = match f.object("stream_options")? {
        Some(o) => o.bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    let id = response_id("chatcmpl");
    let created = unix_now();
    let tasks = tasks(vec![prompt], &g);
    if g.stream {
        let runs = start_streams(&st, &tasks, x).await?;
        let runs = runs
            .into_iter()
            .zip(&tasks)
            .enumerate()
            .map(|(index, (r, (_, g)))| {
                let verbose = x.verbose.then(|| full_fn(&st, g, index, &r, true));
                let shape = Shape::OaiChat {
                    index,
                    id: id.clone(),
                    created,
                    model: model.clone(),
                    probs: ProbsAsked::of(g),
                    include_usage,
                    started: false,
                    verbose,
                };
                (r, shape)
            })
            .collect();
        return Ok(sse(st, runs, true));
    }
    let results = run_all(&st, &tasks, x).await?;
    let choices: Vec<Value> = results
        .iter()
        .zip(&tasks)
        .enumerate()
        .map(|(index, ((out, _), (_, g)))| {
            let mut choice = json!({
                "index": index,
                "message": {"role": "assistant", "content": out.text},
                "finish_reason": finish_reason(out.reason),
            });
            // llama-server names `logprobs` only when it has some.
            if let Some(lp) = oai_logprobs(&st, &out.probs, &ProbsAsked::of(g)) {
                choice["logprobs"] = lp;
            }
            choice
        })
        .collect();
    let mut v = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "choices": choices,
    });
    // llama-server answers several choices with the first one's usage and timings.
    if let Some(((out, r), (_, g))) = results.iter().zip(&tasks).next() {
        v["usage"] = usage(out);
        add_timings(&mut v, out);
        if x.verbose {
            v["__verbose"] = llama_full(&st, g, 0, r.slot, &r.prompt, out, false);
        }
    }
    Ok(Json(v).into_response())
}

/// `POST /v1/chat/completions/input_tokens`: the number of prompt tokens a chat request would
/// have, without generating.
pub async fn chat_input_tokens(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let prompt = chat_prompt(&st, &Fields::of(&body))?;
    Ok(Json(
        json!({"input_tokens": prompt.len(), "object": "response.input_tokens"}),
    ))
}
