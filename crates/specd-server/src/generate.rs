//! The generating endpoints: llama.cpp `/completion`, OpenAI `/v1/completions` and
//! `/v1/chat/completions`, streaming (SSE) or not.

use crate::error::{ApiError, JsonBody};
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
use specd_spec::{DrafterKind, FinishReason, SeqOutput, SequenceRequest, SpecParams};
use specd_tokenizer::ChatMessage;
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

/// Applies the chat template to a request's `messages` (with `tools` and
/// `chat_template_kwargs` visible to the template).
pub fn render_chat(st: &AppState, f: &Fields) -> Result<String, ApiError> {
    let msgs = f
        .get("messages")
        .ok_or_else(|| ApiError::invalid("'messages' is required").with("param", "messages"))?;
    let msgs: Vec<ChatMessage> = serde_json::from_value(msgs.clone()).map_err(|e| {
        ApiError::invalid(format!("'messages' must be an array of messages: {e}"))
            .with("param", "messages")
    })?;
    if msgs.is_empty() {
        return Err(ApiError::invalid("'messages' must not be empty").with("param", "messages"));
    }
    let mut extra = f
        .object("chat_template_kwargs")?
        .map(|o| o.0.clone())
        .unwrap_or_default();
    if let Some(t) = f.get("tools") {
        extra.insert("tools".into(), t.clone());
    }
    st.template
        .render(&msgs, true, &extra)
        .map_err(|e| ApiError::invalid(format!("applying the chat template: {e}")))
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

/// `prompt` of `/completion` and `/v1/completions`: a string, token ids, a mix of both, or a
/// list of such prompts.
fn parse_prompts(st: &AppState, f: &Fields) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "'prompt' must be a string, an array of token ids and strings, or an array of prompts",
        )
        .with("param", "prompt")
    };
    let one = |v: &Value| -> Result<Vec<u32>, ApiError> {
        match v {
            Value::String(s) => tokenize_prompt(st, s, true),
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, it) in items.iter().enumerate() {
                    match it {
                        Value::String(s) => out.extend(tokenize_prompt(st, s, i == 0)?),
                        Value::Number(n) => out.push(
                            n.as_u64()
                                .and_then(|x| u32::try_from(x).ok())
                                .ok_or_else(bad)?,
                        ),
                        _ => return Err(bad()),
                    }
                }
                Ok(out)
            }
            _ => Err(bad()),
        }
    };
    match f.get("prompt") {
        None => Err(ApiError::invalid("'prompt' is required").with("param", "prompt")),
        Some(v @ Value::String(_)) => Ok(vec![one(v)?]),
        Some(Value::Array(a)) if a.iter().any(Value::is_number) || a.len() <= 1 => {
            // One prompt (token ids, maybe mixed with text) — or a list holding one prompt.
            match a.first() {
                Some(first @ Value::Array(_)) if a.len() == 1 => Ok(vec![one(first)?]),
                _ => Ok(vec![one(&Value::Array(a.clone()))?]),
            }
        }
        Some(Value::Array(a)) => a.iter().map(one).collect(),
        Some(_) => Err(bad()),
    }
}

/// Checks a prompt and builds the engine request.
fn prepare(st: &AppState, prompt: Vec<u32>, g: &GenParams) -> Result<SequenceRequest, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty").with("param", "prompt"));
    }
    let n_vocab = st.model.config().n_vocab;
    if let Some(&t) = prompt.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::invalid(format!(
            "prompt token {t} is out of the vocabulary ({n_vocab} tokens)"
        ))
        .with("param", "prompt"));
    }
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

/// A request that has a slot.
struct Running {
    rx: mpsc::UnboundedReceiver<Event>,
    slot: usize,
    prompt: Vec<u32>,
    /// `n_predict: 0`: the one token generated is not reported.
    zero: bool,
}

/// Submits a generation and waits until it has a slot (or fails: bad grammar, …), so errors
/// get their own status even for streamed requests.
async fn start(st: &Arc<AppState>, prompt: Vec<u32>, g: &GenParams) -> Result<Running, ApiError> {
    let mut req = prepare(st, prompt.clone(), g)?;
    if req.spec.drafters.contains(&DrafterKind::Synthetic) {
        let (st2, r) = (st.clone(), req.clone());
        let reference = tokio::task::spawn_blocking(move || {
            st2.references
                .get_or_run(st2.model.clone(), &r, st2.cfg.n_ctx_slot, st2.cfg.kv_types)
        })
        .await
        .map_err(|e| ApiError::server(format!("synthetic reference run: {e}")))??;
        req.reference = Some(reference);
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    st.sched.submit(Job {
        req,
        id_slot: g.id_slot,
        cache_prompt: g.cache_prompt,
        events: tx,
        settings: settings_of(st, g),
    })?;
    loop {
        match rx.recv().await {
            Some(Event::Started { slot, .. }) => {
                return Ok(Running {
                    rx,
                    slot,
                    prompt,
                    zero: g.n_predict == Some(0),
                })
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(_) => continue,
            None => return Err(ApiError::server("the engine dropped the request")),
        }
    }
}

/// Waits for the end of a generation.
async fn finish(mut r: Running) -> Result<(SeqOutput, Running), ApiError> {
    loop {
        match r.rx.recv().await {
            Some(Event::Done(out)) => {
                let mut out = *out;
                if r.zero {
                    out.tokens.clear();
                    out.text.clear();
                    out.probs.clear();
                }
                return Ok((out, r));
            }
            Some(Event::Failed(e)) => return Err(e),
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

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// llama-server's `timings`, plus specd's speculation statistics under `speculative`.
fn timings(out: &SeqOutput) -> Value {
    let prompt_n = out.n_prompt - out.n_cached;
    let prompt_ms = out.prompt_secs * 1e3;
    let predicted_n = out.tokens.len();
    let predicted_ms = out.gen_secs * 1e3;
    let mut spec = serde_json::to_value(&out.stats).unwrap_or_else(|_| json!({}));
    if let Some(o) = spec.as_object_mut() {
        o.insert(
            "acceptance_length".into(),
            json!(out.stats.acceptance_length()),
        );
        o.insert("acceptance_rate".into(), json!(out.stats.acceptance_rate()));
    }
    json!({
        "cache_n": out.n_cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": ratio(prompt_ms, prompt_n as f64),
        "prompt_per_second": ratio(prompt_n as f64 * 1e3, prompt_ms),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": ratio(predicted_ms, predicted_n as f64),
        "predicted_per_second": ratio(predicted_n as f64 * 1e3, predicted_ms),
        "draft_n": out.stats.draft_tokens,
        "draft_n_accepted": out.stats.accepted_tokens,
        "speculative": spec,
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

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Eos | FinishReason::Stop | FinishReason::Error => "stop",
        FinishReason::Limit | FinishReason::Context => "length",
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

fn usage(out: &SeqOutput) -> Value {
    json!({
        "prompt_tokens": out.n_prompt,
        "completion_tokens": out.tokens.len(),
        "total_tokens": out.n_prompt + out.tokens.len(),
        "prompt_tokens_details": {"cached_tokens": out.n_cached},
    })
}

/// What a streamed response looks like, per API. `index`: the generation's place among the
/// request's (prompts × `n_cmpl`), which every chunk names.
enum Shape {
    Llama {
        index: usize,
        slot: usize,
        probs: ProbsAsked,
        n_prompt: usize,
        n_decoded: usize,
        full: Box<dyn Fn(&SeqOutput) -> Value + Send>,
    },
    OaiCompletion {
        index: usize,
        id: String,
        created: u64,
        model: String,
        probs: ProbsAsked,
    },
    OaiChat {
        index: usize,
        id: String,
        created: u64,
        model: String,
        probs: ProbsAsked,
        include_usage: bool,
        started: bool,
    },
}

impl Shape {
    /// Payloads for new tokens.
    fn chunk(
        &mut self,
        st: &AppState,
        tokens: Vec<u32>,
        text: String,
        probs: &[TokenProbs],
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
                let mut v = json!({
                    "index": index, "content": text, "tokens": tokens, "stop": false,
                    "id_slot": slot, "tokens_predicted": n_decoded, "tokens_evaluated": n_prompt,
                });
                if asked.n_probs > 0 && !probs.is_empty() {
                    v["completion_probabilities"] =
                        json!(probs_json(st, probs, asked.post_sampling));
                }
                vec![v.to_string()]
            }
            Shape::OaiCompletion {
                index,
                id,
                created,
                model,
                probs: asked,
            } => {
                let lp = oai_logprobs(st, probs, asked);
                vec![json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"text": text, "index": index, "logprobs": lp, "finish_reason": null}],
                })
                .to_string()]
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
                    .to_string()
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
                out
            }
        }
    }

    /// Payloads for the end of the generation (the stream's `[DONE]` comes after all of them).
    fn done(&mut self, out: &SeqOutput) -> Vec<String> {
        match self {
            Shape::Llama { full, .. } => vec![full(out).to_string()],
            Shape::OaiCompletion {
                index,
                id,
                created,
                model,
                ..
            } => vec![json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"text": "", "index": index, "logprobs": null,
                             "finish_reason": finish_reason(out.reason)}],
                "usage": usage(out), "timings": timings(out),
            })
            .to_string()],
            Shape::OaiChat {
                index,
                id,
                created,
                model,
                include_usage,
                started,
                ..
            } => {
                let mut v = vec![];
                let chunk = |choices: Value, extra: &[(&str, Value)]| {
                    let mut c = json!({
                        "id": id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "system_fingerprint": fingerprint(), "choices": choices,
                    });
                    for (k, x) in extra {
                        c[*k] = x.clone();
                    }
                    c.to_string()
                };
                // A stream that produced no text still opens with the role chunk.
                if !*started {
                    *started = true;
                    v.push(chunk(
                        json!([{"index": index, "delta": {"role": "assistant", "content": null},
                                "finish_reason": null}]),
                        &[],
                    ));
                }
                let end = json!([{"index": index, "delta": {},
                                  "finish_reason": finish_reason(out.reason)}]);
                // `timings` ride on the last chunk, as in llama-server.
                let t = ("timings", timings(out));
                if *include_usage {
                    v.push(chunk(end, &[]));
                    v.push(chunk(json!([]), &[("usage", usage(out)), t]));
                } else {
                    v.push(chunk(end, &[t]));
                }
                v
            }
        }
    }
}

fn fingerprint() -> String {
    format!("specd-{}", env!("CARGO_PKG_VERSION"))
}

/// One generation's payloads as a stream: `(payloads, failed)` per event, ending after its last.
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
                }) => {
                    if s.r.zero {
                        continue;
                    }
                    let p = s.shape.chunk(&s.st, tokens, text, &probs);
                    if !p.is_empty() {
                        return Some(((p, false), Some(s)));
                    }
                }
                Some(Event::Done(out)) => {
                    let mut out = *out;
                    if s.r.zero {
                        out.tokens.clear();
                        out.text.clear();
                        out.probs.clear();
                    }
                    let p = s.shape.done(&out);
                    return Some(((p, false), None));
                }
                Some(Event::Failed(e)) => {
                    return Some(((vec![json!({"error": e.object()}).to_string()], true), None))
                }
                Some(Event::Started { .. }) => continue,
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
    })
    .flat_map(|payloads| {
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

/// llama-server's final `/completion` object.
fn llama_full(
    st: &AppState,
    g: &GenParams,
    slot: usize,
    prompt: &[u32],
    out: &SeqOutput,
    streamed: bool,
) -> Value {
    let mut settings = settings_of(st, g);
    // The biases the sampler used: the request's, then ignore_eos's bans (llama-server shows
    // them here only, not in /slots).
    let eog = st.model.tokenizer().eog_ids();
    settings["logit_bias"] = logit_bias_with_eog(&g.logit_bias, g.ignore_eos, eog)
        .into_iter()
        .map(|(t, b)| json!({"bias": b, "token": t}))
        .collect();
    let mut v = json!({
        "index": 0,
        "content": if streamed { "" } else { out.text.as_str() },
        "tokens": if g.return_tokens && !streamed { out.tokens.clone() } else { Vec::new() },
        "id_slot": slot,
        "stop": true,
        "model": st.cfg.model_id,
        "tokens_predicted": out.tokens.len(),
        "tokens_evaluated": out.n_prompt,
        "tokens_cached": out.n_cached,
        "generation_settings": settings,
        "prompt": st.model.tokenizer().decode(prompt, true).unwrap_or_default(),
        "has_new_line": out.text.contains('\n'),
        "truncated": out.reason == FinishReason::Context,
        "stop_type": stop_type(out.reason),
        "stopping_word": out.stop_word.clone().unwrap_or_default(),
        "timings": timings(out),
    });
    if g.n_probs > 0 && !streamed && !out.probs.is_empty() {
        v["completion_probabilities"] = json!(probs_json(st, &out.probs, g.post_sampling_probs));
    }
    v
}

/// `POST /completion`: llama-server's completion API.
pub async fn completion(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody) -> Response {
    into_response(completion_inner(st, body).await)
}

async fn completion_inner(st: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let f = Fields::of(&body);
    let g = gen_params(&st, &f, Api::Llama)?;
    let tasks = tasks(parse_prompts(&st, &f)?, &g);
    if g.stream {
        let runs = start_all(&st, &tasks).await?;
        let parts = runs
            .into_iter()
            .zip(tasks)
            .enumerate()
            .map(|(index, (r, (prompt, g)))| {
                let (st2, slot) = (st.clone(), r.slot);
                let shape = Shape::Llama {
                    index,
                    slot,
                    probs: ProbsAsked::of(&g),
                    n_prompt: prompt.len(),
                    n_decoded: 0,
                    full: Box::new(move |out: &SeqOutput| {
                        let mut v = llama_full(&st2, &g, slot, &prompt, out, true);
                        v["index"] = json!(index);
                        v
                    }),
                };
                (r, shape)
            })
            .collect();
        return Ok(sse(st, parts, false));
    }
    let results = run_all(&st, &tasks).await?;
    let mut v: Vec<Value> = results
        .iter()
        .zip(&tasks)
        .enumerate()
        .map(|(i, ((out, r), (_, g)))| {
            let mut x = llama_full(&st, g, r.slot, &r.prompt, out, false);
            x["index"] = json!(i);
            x
        })
        .collect();
    Ok(if v.len() == 1 {
        Json(v.remove(0)).into_response()
    } else {
        Json(Value::Array(v)).into_response()
    })
}

/// Starts every task (each gets its slot; they share the engine's batches). One failing fails
/// the request, and the others, dropped, are cancelled.
async fn start_all(
    st: &Arc<AppState>,
    tasks: &[(Vec<u32>, GenParams)],
) -> Result<Vec<Running>, ApiError> {
    futures_util::future::join_all(tasks.iter().map(|(p, g)| start(st, p.clone(), g)))
        .await
        .into_iter()
        .collect()
}

/// Runs every task at once (they share the engine's batches) and waits for all.
async fn run_all(
    st: &Arc<AppState>,
    tasks: &[(Vec<u32>, GenParams)],
) -> Result<Vec<(SeqOutput, Running)>, ApiError> {
    let runs = futures_util::future::join_all(tasks.iter().map(|(p, g)| async move {
        let r = start(st, p.clone(), g).await?;
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
        let runs = start_all(&st, &tasks).await?;
        let parts = runs
            .into_iter()
            .zip(&tasks)
            .enumerate()
            .map(|(index, (r, (_, g)))| {
                let shape = Shape::OaiCompletion {
                    index,
                    id: id.clone(),
                    created,
                    model: model.clone(),
                    probs: ProbsAsked::of(g),
                };
                (r, shape)
            })
            .collect();
        return Ok(sse(st, parts, true));
    }
    let results = run_all(&st, &tasks).await?;
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
    // llama-server answers several generations with the first one's usage and timings.
    let first = results.first().map(|(o, _)| o);
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "choices": choices,
        "usage": first.map(usage),
        "timings": first.map(timings),
    }))
    .into_response())
}

/// `POST /v1/chat/completions`: OpenAI's chat API.
pub async fn chat(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody) -> Response {
    into_response(chat_inner(st, body).await)
}

async fn chat_inner(st: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let f = Fields::of(&body);
    let g = gen_params(&st, &f, Api::OaiChat)?;
    let text = render_chat(&st, &f)?;
    let prompt = tokenize_prompt(&st, &text, true)?;
    let model = f.str("model")?.unwrap_or(&st.cfg.model_id).to_string();
    let include_usage = match f.object("stream_options")? {
        Some(o) => o.bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    let id = response_id("chatcmpl");
    let created = unix_now();
    let tasks = tasks(vec![prompt], &g);
    if g.stream {
        let runs = start_all(&st, &tasks).await?;
        let parts = runs
            .into_iter()
            .zip(&tasks)
            .enumerate()
            .map(|(index, (r, (_, g)))| {
                let shape = Shape::OaiChat {
                    index,
                    id: id.clone(),
                    created,
                    model: model.clone(),
                    probs: ProbsAsked::of(g),
                    include_usage,
                    started: false,
                };
                (r, shape)
            })
            .collect();
        return Ok(sse(st, parts, true));
    }
    let results = run_all(&st, &tasks).await?;
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
    // llama-server answers several choices with the first one's usage and timings.
    let first = results.first().map(|(o, _)| o);
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "choices": choices,
        "usage": first.map(usage),
        "timings": first.map(timings),
    }))
    .into_response())
}
