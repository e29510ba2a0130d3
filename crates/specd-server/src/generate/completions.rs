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

/// A `/v1/completions` stream: OpenAI `text_completion` chunks, the last with usage.
struct CompletionShape {
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
        let mut v = self.head(&text, oai_logprobs(st, probs, &self.probs), None);
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
                    probs: ProbsAsked::of(g),
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
