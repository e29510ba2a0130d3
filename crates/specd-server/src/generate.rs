//! The generating endpoints: llama.cpp `/completion`, OpenAI `/v1/completions` and
//! `/v1/chat/completions`, streaming (SSE) or not.

use crate::error::{ApiError, JsonBody};
use crate::metrics::Timings;
use crate::params::{parse_gen, Api, Fields, GenParams};
use crate::scheduler::{Event, Job};
use crate::AppState;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::{json, Value};
use specd_sampling::{GrammarSpec, SamplerParams};
use specd_spec::engine::TokenProbs;
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
    v
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
    r.n_probs = if g.logprobs || g.n_probs > 0 {
        g.n_probs.max(1)
    } else {
        0
    };
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

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// llama-server's `timings` (see [`Timings`]).
fn timings(out: &SeqOutput) -> Value {
    Timings::of(out).json()
}

/// specd's speculation statistics of a request (acceptance, rounds, rollbacks, per-position
/// acceptance), next to `timings` as `speculative`: `timings` holds only numbers, as clients
/// of llama-server expect.
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

fn token_str(st: &AppState, id: u32) -> (String, Vec<u8>) {
    let b = st.model.tokenizer().token_to_bytes(id).to_vec();
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// llama.cpp `completion_probabilities` entries.
fn llama_probs(st: &AppState, probs: &[TokenProbs], n_top: usize) -> Vec<Value> {
    probs
        .iter()
        .map(|p| {
            let (t, b) = token_str(st, p.token);
            let top: Vec<Value> = p
                .top
                .iter()
                .take(n_top)
                .map(|&(id, lp)| {
                    let (t, b) = token_str(st, id);
                    json!({"id": id, "token": t, "bytes": b, "logprob": lp})
                })
                .collect();
            json!({"id": p.token, "token": t, "bytes": b, "logprob": p.logprob, "top_logprobs": top})
        })
        .collect()
}

/// OpenAI chat `logprobs.content` entries.
fn chat_logprobs(st: &AppState, probs: &[TokenProbs], n_top: usize) -> Vec<Value> {
    probs
        .iter()
        .map(|p| {
            let (t, b) = token_str(st, p.token);
            let top: Vec<Value> = p
                .top
                .iter()
                .take(n_top)
                .map(|&(id, lp)| {
                    let (t, b) = token_str(st, id);
                    json!({"token": t, "logprob": lp, "bytes": b})
                })
                .collect();
            json!({"token": t, "logprob": p.logprob, "bytes": b, "top_logprobs": top})
        })
        .collect()
}

/// OpenAI legacy completions `logprobs` object.
fn completion_logprobs(st: &AppState, probs: &[TokenProbs], n_top: usize, offset0: usize) -> Value {
    let mut tokens = Vec::new();
    let mut lps = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    let mut off = offset0;
    for p in probs {
        let (t, _) = token_str(st, p.token);
        offsets.push(off);
        off += t.len();
        tokens.push(t);
        lps.push(p.logprob);
        let m: serde_json::Map<String, Value> = p
            .top
            .iter()
            .take(n_top)
            .map(|&(id, lp)| (token_str(st, id).0, json!(lp)))
            .collect();
        tops.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

fn usage(out: &SeqOutput) -> Value {
    json!({
        "prompt_tokens": out.n_prompt,
        "completion_tokens": out.tokens.len(),
        "total_tokens": out.n_prompt + out.tokens.len(),
        "prompt_tokens_details": {"cached_tokens": out.n_cached},
    })
}

/// What a streamed response looks like, per API.
enum Shape {
    Llama {
        slot: usize,
        n_probs: usize,
        n_prompt: usize,
        n_decoded: usize,
        full: Box<dyn Fn(&SeqOutput) -> Value + Send>,
    },
    OaiCompletion {
        id: String,
        created: u64,
        model: String,
        logprobs: Option<usize>,
        offset: usize,
    },
    OaiChat {
        id: String,
        created: u64,
        model: String,
        logprobs: Option<usize>,
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
                slot,
                n_probs,
                n_prompt,
                n_decoded,
                ..
            } => {
                *n_decoded += tokens.len();
                let mut v = json!({
                    "index": 0, "content": text, "tokens": tokens, "stop": false,
                    "id_slot": slot, "tokens_predicted": n_decoded, "tokens_evaluated": n_prompt,
                });
                if *n_probs > 0 {
                    v["completion_probabilities"] = json!(llama_probs(st, probs, *n_probs));
                }
                vec![v.to_string()]
            }
            Shape::OaiCompletion {
                id,
                created,
                model,
                logprobs,
                offset,
            } => {
                let lp = logprobs.map(|n| completion_logprobs(st, probs, n, *offset));
                *offset += text.len();
                vec![json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": null}],
                })
                .to_string()]
            }
            Shape::OaiChat {
                id,
                created,
                model,
                logprobs,
                started,
                ..
            } => {
                let mut out = Vec::new();
                let head = |delta: Value, lp: Value| {
                    json!({
                        "id": id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "system_fingerprint": fingerprint(),
                        "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": null}],
                    })
                    .to_string()
                };
                if !*started {
                    *started = true;
                    out.push(head(
                        json!({"role": "assistant", "content": null}),
                        Value::Null,
                    ));
                }
                if !text.is_empty() || !probs.is_empty() {
                    let lp = logprobs.map_or(
                        Value::Null,
                        |n| json!({"content": chat_logprobs(st, probs, n)}),
                    );
                    out.push(head(json!({"content": text}), lp));
                }
                out
            }
        }
    }

    /// Payloads for the end of the generation.
    fn done(&mut self, out: &SeqOutput) -> Vec<String> {
        match self {
            Shape::Llama { full, .. } => vec![full(out).to_string()],
            Shape::OaiCompletion {
                id, created, model, ..
            } => vec![
                json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"text": "", "index": 0, "logprobs": null,
                                 "finish_reason": finish_reason(out.reason)}],
                    "usage": usage(out), "timings": timings(out),
                    "speculative": speculative(out),
                })
                .to_string(),
                "[DONE]".into(),
            ],
            Shape::OaiChat {
                id,
                created,
                model,
                include_usage,
                started,
                ..
            } => {
                let mut v = vec![];
                let chunk = |choices: Value, extra: Option<(&str, Value)>| {
                    let mut c = json!({
                        "id": id, "object": "chat.completion.chunk", "created": created,
                        "model": model, "system_fingerprint": fingerprint(), "choices": choices,
                    });
                    if let Some((k, x)) = extra {
                        if k == "timings" {
                            c["speculative"] = speculative(out);
                        }
                        c[k] = x;
                    }
                    c.to_string()
                };
                // A stream that produced no text still opens with the role chunk.
                if !*started {
                    *started = true;
                    v.push(chunk(
                        json!([{"index": 0, "delta": {"role": "assistant", "content": null},
                                "logprobs": null, "finish_reason": null}]),
                        None,
                    ));
                }
                v.push(chunk(
                    json!([{"index": 0, "delta": {}, "logprobs": null,
                            "finish_reason": finish_reason(out.reason)}]),
                    Some(("timings", timings(out))),
                ));
                if *include_usage {
                    v.push(chunk(json!([]), Some(("usage", usage(out)))));
                }
                v.push("[DONE]".into());
                v
            }
        }
    }
}

fn fingerprint() -> String {
    format!("specd-{}", env!("CARGO_PKG_VERSION"))
}

/// Streams a generation as server-sent events; dropping the stream (the client went away)
/// drops the event receiver, which cancels the slot.
fn sse(st: Arc<AppState>, r: Running, shape: Shape) -> Response {
    struct S {
        st: Arc<AppState>,
        r: Running,
        shape: Shape,
    }
    let events = stream::unfold(Some(S { st, r, shape }), |state| async move {
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
                        return Some((p, Some(s)));
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
                    return Some((p, None));
                }
                Some(Event::Failed(e)) => {
                    return Some((vec![json!({"error": e.object()}).to_string()], None))
                }
                Some(Event::Started { .. }) => continue,
                None => {
                    let e = ApiError::server("the engine dropped the request");
                    return Some((vec![json!({"error": e.object()}).to_string()], None));
                }
            }
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
        "generation_settings": settings_of(st, g),
        "prompt": st.model.tokenizer().decode(prompt, true).unwrap_or_default(),
        "has_new_line": out.text.contains('\n'),
        "truncated": out.reason == FinishReason::Context,
        "stop_type": stop_type(out.reason),
        "stopping_word": out.stop_word.clone().unwrap_or_default(),
        "timings": timings(out),
        "speculative": speculative(out),
    });
    if g.n_probs > 0 && !streamed {
        v["completion_probabilities"] = json!(llama_probs(st, &out.probs, g.n_probs));
    }
    v
}

/// `POST /completion`: llama-server's completion API.
pub async fn completion(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody) -> Response {
    into_response(completion_inner(st, body).await)
}

async fn completion_inner(st: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let f = Fields::of(&body);
    let g = parse_gen(&f, &st.cfg.defaults, Api::Llama)?;
    let prompts = parse_prompts(&st, &f)?;
    if g.stream && prompts.len() > 1 {
        return Err(ApiError::invalid(
            "streaming is supported for a single prompt only",
        ));
    }
    if g.stream {
        let prompt = prompts.into_iter().next().unwrap_or_default();
        let r = start(&st, prompt, &g).await?;
        let (st2, g2, slot, prompt) = (st.clone(), g.clone(), r.slot, r.prompt.clone());
        let shape = Shape::Llama {
            slot,
            n_probs: g.n_probs,
            n_prompt: prompt.len(),
            n_decoded: 0,
            full: Box::new(move |out: &SeqOutput| llama_full(&st2, &g2, slot, &prompt, out, true)),
        };
        return Ok(sse(st, r, shape));
    }
    let results = run_all(&st, prompts, &g).await?;
    let mut v: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(i, (out, r))| {
            let mut x = llama_full(&st, &g, r.slot, &r.prompt, out, false);
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

/// Runs several prompts at once (they share the engine's batches) and waits for all.
async fn run_all(
    st: &Arc<AppState>,
    prompts: Vec<Vec<u32>>,
    g: &GenParams,
) -> Result<Vec<(SeqOutput, Running)>, ApiError> {
    let runs = futures_util::future::join_all(prompts.into_iter().map(|p| async move {
        let r = start(st, p, g).await?;
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
    let g = parse_gen(&f, &st.cfg.defaults, Api::OaiCompletion)?;
    let prompts = parse_prompts(&st, &f)?;
    let echo = f.bool("echo")?.unwrap_or(false);
    let model = f.str("model")?.unwrap_or(&st.cfg.model_id).to_string();
    let id = response_id("cmpl");
    let created = unix_now();
    let logprobs = g.logprobs.then_some(g.n_probs);
    if g.stream {
        if prompts.len() > 1 {
            return Err(ApiError::invalid(
                "streaming is supported for a single prompt only",
            ));
        }
        if echo {
            return Err(
                ApiError::invalid("'echo' is not supported with streaming").with("param", "echo")
            );
        }
        let prompt = prompts.into_iter().next().unwrap_or_default();
        let r = start(&st, prompt, &g).await?;
        let shape = Shape::OaiCompletion {
            id,
            created,
            model,
            logprobs,
            offset: 0,
        };
        return Ok(sse(st, r, shape));
    }
    let results = run_all(&st, prompts, &g).await?;
    let tok = st.model.tokenizer();
    let mut choices = Vec::new();
    let (mut n_prompt, mut n_gen, mut n_cached) = (0, 0, 0);
    for (i, (out, r)) in results.iter().enumerate() {
        let prefix = if echo {
            tok.decode(&r.prompt, false).unwrap_or_default()
        } else {
            String::new()
        };
        let lp = logprobs.map(|n| completion_logprobs(&st, &out.probs, n, prefix.len()));
        choices.push(json!({
            "text": format!("{prefix}{}", out.text),
            "index": i,
            "logprobs": lp,
            "finish_reason": finish_reason(out.reason),
        }));
        n_prompt += out.n_prompt;
        n_gen += out.tokens.len();
        n_cached += out.n_cached;
    }
    let timings_of_first = results.first().map(|(o, _)| timings(o));
    let speculative_of_first = results.first().map(|(o, _)| speculative(o));
    Ok(Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "choices": choices,
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_gen,
            "total_tokens": n_prompt + n_gen,
            "prompt_tokens_details": {"cached_tokens": n_cached},
        },
        "timings": timings_of_first,
        "speculative": speculative_of_first,
    }))
    .into_response())
}

/// `POST /v1/chat/completions`: OpenAI's chat API.
pub async fn chat(State(st): State<Arc<AppState>>, JsonBody(body): JsonBody) -> Response {
    into_response(chat_inner(st, body).await)
}

async fn chat_inner(st: Arc<AppState>, body: Value) -> Result<Response, ApiError> {
    let f = Fields::of(&body);
    let g = parse_gen(&f, &st.cfg.defaults, Api::OaiChat)?;
    let text = render_chat(&st, &f)?;
    let prompt = tokenize_prompt(&st, &text, true)?;
    let model = f.str("model")?.unwrap_or(&st.cfg.model_id).to_string();
    let include_usage = match f.object("stream_options")? {
        Some(o) => o.bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    let id = response_id("chatcmpl");
    let created = unix_now();
    let logprobs = g.logprobs.then_some(g.n_probs);
    let r = start(&st, prompt, &g).await?;
    if g.stream {
        let shape = Shape::OaiChat {
            id,
            created,
            model,
            logprobs,
            include_usage,
            started: false,
        };
        return Ok(sse(st, r, shape));
    }
    let (out, _) = finish(r).await?;
    let lp = logprobs.map_or(
        Value::Null,
        |n| json!({"content": chat_logprobs(&st, &out.probs, n)}),
    );
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": out.text},
            "logprobs": lp,
            "finish_reason": finish_reason(out.reason),
        }],
        "usage": usage(&out),
        "timings": timings(&out),
        "speculative": speculative(&out),
    }))
    .into_response())
}
