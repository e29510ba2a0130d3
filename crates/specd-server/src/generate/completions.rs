//! OpenAI's completions API: `POST /v1/completions`.

use super::llama::{full_fn, llama_full, llama_partial, FullFn};
use super::prompt::*;
use super::report::*;
use super::stream::{data, into_response, sse, StreamShape};
use super::*;
use crate::error::JsonBody;
use crate::scope::Caller;
use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use specd_spec::engine::TokenProbs;
use specd_spec::{LiveTimings, PromptProgress};

/// OpenAI completions' `logprobs` object (not the chat one): per token its text, its
/// log-probability, a mapping of the top `n` texts to theirs (the token's own included, as
/// vLLM writes it) and its character offset in the choice's text, starting at `offset`.
/// A `None` probability (the first prompt token of an echo: nothing predicts it) is `null` in
/// both `token_logprobs` and `top_logprobs`.
pub(crate) fn completion_logprobs(
    st: &AppState,
    tokens: &[(u32, Option<&TokenProbs>)],
    n: usize,
    mut offset: usize,
) -> Value {
    // JSON has no -inf: the lowest float, as llama-server writes it.
    let finite = |lp: f32| {
        if lp == f32::NEG_INFINITY {
            f32::MIN
        } else {
            lp
        }
    };
    let mut texts = Vec::with_capacity(tokens.len());
    let mut logprobs = Vec::with_capacity(tokens.len());
    let mut tops = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    for &(id, p) in tokens {
        let (text, _) = token_str(st, id);
        offsets.push(offset);
        offset += text.chars().count();
        match p {
            None => {
                logprobs.push(Value::Null);
                tops.push(Value::Null);
            }
            Some(p) => {
                logprobs.push(json!(finite(p.logprob)));
                let mut top = serde_json::Map::new();
                for &(t, lp) in p.top.iter().take(n) {
                    top.insert(token_str(st, t).0, json!(finite(lp)));
                }
                top.entry(text.clone())
                    .or_insert_with(|| json!(finite(p.logprob)));
                tops.push(Value::Object(top));
            }
        }
        texts.push(Value::String(text));
    }
    json!({"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops,
           "text_offset": offsets})
}

/// The `logprobs` a completion choice reports: of the echoed prompt (with `echo`; its first
/// token has none) and of the generated tokens; `None` when the request asked for none.
fn choice_logprobs(
    st: &AppState,
    asked: Option<usize>,
    echo: Option<(&[u32], &[TokenProbs])>,
    generated: &[TokenProbs],
) -> Option<Value> {
    let n = asked?;
    let mut tokens: Vec<(u32, Option<&TokenProbs>)> = Vec::new();
    if let Some((prompt, probs)) = echo {
        tokens.extend(prompt.iter().enumerate().map(|(i, &t)| {
            let p = i.checked_sub(1).and_then(|j| probs.get(j));
            (t, p)
        }));
    }
    tokens.extend(generated.iter().map(|p| (p.token, Some(p))));
    Some(completion_logprobs(st, &tokens, n, 0))
}

/// A `/v1/completions` stream: OpenAI `text_completion` chunks, the last with usage.
struct CompletionShape {
    index: usize,
    slot: usize,
    id: String,
    created: u64,
    model: String,
    /// `logprobs` asked (the top count), if any.
    logprobs: Option<usize>,
    /// Characters streamed so far (`text_offset`).
    n_chars: usize,
    n_prompt: usize,
    n_decoded: usize,
    /// With `verbose`: the final object for `__verbose`.
    verbose: Option<FullFn>,
}

impl CompletionShape {
    fn head(&self, text: &str, logprobs: Option<Value>, finish: Option<&str>) -> Value {
        json!({
            "id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model,
            "choices": [{"text": text, "index": self.index, "logprobs": logprobs,
                         "finish_reason": finish}],
        })
    }
}

impl StreamShape for CompletionShape {
    fn set_slot(&mut self, slot: usize) {
        self.slot = slot;
    }

    fn chunk(
        &mut self,
        st: &AppState,
        tokens: Vec<u32>,
        text: String,
        probs: &[TokenProbs],
        live: Option<&LiveTimings>,
    ) -> Vec<SseEvent> {
        self.n_decoded += tokens.len();
        let logprobs = self.logprobs.filter(|_| !probs.is_empty()).map(|n| {
            let toks: Vec<_> = probs.iter().map(|p| (p.token, Some(p))).collect();
            completion_logprobs(st, &toks, n, self.n_chars)
        });
        self.n_chars += text.chars().count();
        let mut v = self.head(&text, logprobs, None);
        if self.verbose.is_some() {
            v["__verbose"] = llama_partial(
                self.index,
                self.slot,
                &text,
                &tokens,
                self.n_decoded,
                self.n_prompt,
            );
        }
        if let Some(t) = live {
            v["timings"] = timings_json(t);
        }
        vec![data(v)]
    }

    fn progress(&self, p: &PromptProgress, with_timings: bool) -> Vec<SseEvent> {
        let mut v = self.head("", None, None);
        with_progress(&mut v, p, with_timings);
        vec![data(v)]
    }

    fn done(&mut self, st: &AppState, out: &SeqOutput, per_token: bool) -> Vec<SseEvent> {
        // llama-server streams the end-of-generation token as a chunk of its own.
        let live = per_token.then(|| out.timings());
        let mut v = match out.eog {
            Some(t) => self.chunk(st, vec![t], String::new(), &[], live.as_ref()),
            None => Vec::new(),
        };
        let mut c = self.head("", None, Some(finish_reason(out.reason)));
        c["usage"] = usage(out);
        add_timings(&mut c, out);
        if let Some(f) = &self.verbose {
            c["__verbose"] = f(out);
            c["__verbose"]["id_slot"] = json!(self.slot);
        }
        v.push(data(c));
        v
    }
}

/// OpenAI completions' `logprobs` (an integer: the top count, 0 allowed; llama.cpp's
/// `n_probs` means the same) and `echo`: with both, the prompt is scored — every prompt token's
/// teacher-forced log-probability comes back with the echoed text (what evaluation harnesses
/// ask for, usually with `max_tokens: 0`).
fn scoring_params(f: &Fields, g: &mut GenParams) -> Result<(), ApiError> {
    let asked = match f.get("logprobs") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(1),
        Some(v) => match v.as_u64() {
            Some(n) if n <= 20 => Some(n as usize),
            _ => {
                return Err(
                    ApiError::invalid("'logprobs' must be an integer from 0 to 20")
                        .with("param", "logprobs"),
                )
            }
        },
    };
    g.completion_logprobs = asked.or((g.n_probs > 0).then_some(g.n_probs));
    if let Some(n) = g.completion_logprobs {
        // The engine records probabilities of generated tokens only when asked for a top list.
        g.n_probs = n.max(1);
        if f.bool("echo")?.unwrap_or(false) {
            g.prompt_logprobs = Some(n);
        }
    }
    Ok(())
}

/// `POST /v1/completions`: OpenAI's completions API.
pub async fn oai_completion(
    State(st): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(body): JsonBody,
) -> Response {
    into_response(oai_completion_inner(st, caller, body).await)
}

async fn oai_completion_inner(
    st: Arc<AppState>,
    caller: Caller,
    body: Value,
) -> Result<Response, ApiError> {
    let (body, (g, prompts)) = on_worker(&st, body, move |st, f| {
        let mut g = gen_params(st, f, Api::OaiCompletion, caller)?;
        scoring_params(f, &mut g)?;
        let prompts = match super::infill::suffix_prompts(st, f, &mut g)? {
            Some(p) => p,
            None => parse_prompts(st, f)?,
        };
        Ok((g, prompts))
    })
    .await?;
    let f = Fields::of(&body);
    let x = Extras::of(&st, &f, &g)?;
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
                let shape: Box<dyn StreamShape> = Box::new(CompletionShape {
                    index,
                    slot: r.slot,
                    id: id.clone(),
                    created,
                    model: model.clone(),
                    logprobs: g.completion_logprobs,
                    n_chars: 0,
                    n_prompt: r.prompt.len(),
                    n_decoded: 0,
                    verbose,
                });
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
        // `max_tokens: 0` scores the prompt only: the one token the engine decodes is not
        // reported.
        let generated = if g.n_predict == Some(0) {
            &[][..]
        } else {
            &out.probs[..]
        };
        let echoed = echo.then_some((&r.prompt[..], &out.prompt_probs[..]));
        choices.push(json!({
            "text": format!("{prefix}{}", out.text),
            "index": i,
            "logprobs": choice_logprobs(&st, g.completion_logprobs, echoed, generated),
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
