//! llama-server's own completion API: `POST /completion`.

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
use specd_spec::engine::logit_bias_with_eog;
use specd_spec::engine::TokenProbs;
use specd_spec::{FinishReason, LiveTimings, PromptProgress};

/// llama-server's final `/completion` object. Token counts are llama-server's: the
/// end-of-generation token counts as predicted (and is in `tokens`); `tokens_cached` is what
/// the slot holds afterwards (prompt and generated tokens, the last sampled one not yet fed).
pub(crate) fn llama_full(
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
pub(crate) fn full_fn(
    st: &Arc<AppState>,
    g: &GenParams,
    index: usize,
    r: &Running,
    streamed: bool,
) -> FullFn {
    let (st, g, slot, prompt) = (st.clone(), g.clone(), r.slot, r.prompt.clone());
    Box::new(move |out: &SeqOutput| llama_full(&st, &g, index, slot, &prompt, out, streamed))
}

/// The final llama-server object of a generation (`/completion`, and `__verbose`).
pub(crate) type FullFn = Box<dyn Fn(&SeqOutput) -> Value + Send>;

/// A streamed llama-server partial result (also the `__verbose` of OpenAI completion chunks).
pub(crate) fn llama_partial(
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

/// A `/completion` stream: llama-server's partial results, then its final object. `index`, the
/// generation's place among the request's (prompts × `n_cmpl`), tells generations apart.
struct LlamaShape {
    index: usize,
    slot: usize,
    probs: ProbsAsked,
    n_prompt: usize,
    n_decoded: usize,
    full: FullFn,
}

impl StreamShape for LlamaShape {
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
        let mut v = llama_partial(
            self.index,
            self.slot,
            &text,
            &tokens,
            self.n_decoded,
            self.n_prompt,
        );
        if self.probs.n_probs > 0 && !probs.is_empty() {
            v["completion_probabilities"] = json!(probs_json(st, probs, self.probs.post_sampling));
        }
        if let Some(t) = live {
            v["timings"] = timings_json(t);
        }
        vec![data(v)]
    }

    fn progress(&self, p: &PromptProgress, with_timings: bool) -> Vec<SseEvent> {
        let mut v = llama_partial(
            self.index,
            self.slot,
            "",
            &[],
            self.n_decoded,
            self.n_prompt,
        );
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
        let mut f = (self.full)(out);
        f["id_slot"] = json!(self.slot);
        v.push(data(f));
        v
    }
}

/// `POST /completion`: llama-server's completion API.
pub async fn completion(
    State(st): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(body): JsonBody,
) -> Response {
    into_response(completion_inner(st, caller, body).await)
}

async fn completion_inner(
    st: Arc<AppState>,
    caller: Caller,
    body: Value,
) -> Result<Response, ApiError> {
    let (_, (tasks, x)) = on_worker(&st, body, move |st, f| {
        let g = gen_params(st, f, Api::Llama, caller)?;
        let x = Extras::of(st, f, &g)?;
        Ok((tasks(parse_prompts(st, f)?, &g), x))
    })
    .await?;
    respond(st, tasks, x).await
}

/// Runs a request's generations and answers in llama-server's form (`/completion`, `/infill`):
/// one object, an array for several, or their stream.
pub(crate) async fn respond(
    st: Arc<AppState>,
    tasks: Vec<(Vec<u32>, GenParams)>,
    x: Extras,
) -> Result<Response, ApiError> {
    let streamed = tasks.first().is_some_and(|(_, g)| g.stream);
    if streamed {
        let runs = start_streams(&st, &tasks, x).await?;
        let runs = runs
            .into_iter()
            .zip(&tasks)
            .enumerate()
            .map(|(index, (r, (_, g)))| {
                // A later generation's slot is known when it starts (the shape is told then).
                let shape: Box<dyn StreamShape> = Box::new(LlamaShape {
                    index,
                    slot: r.slot,
                    probs: ProbsAsked::of(g),
                    n_prompt: r.prompt.len(),
                    n_decoded: 0,
                    full: full_fn(&st, g, index, &r, true),
                });
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
