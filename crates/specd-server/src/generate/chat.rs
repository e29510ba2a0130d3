//! OpenAI's chat completions API: `POST /v1/chat/completions` (and its `input_tokens`).

use super::llama::{full_fn, llama_full, FullFn};
use super::output::chat_request;
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
use specd_output::{AssistantMessage, ChatOutput, Delta};
use specd_spec::engine::TokenProbs;
use specd_spec::{LiveTimings, PromptProgress};

/// A `/v1/chat/completions` stream: OpenAI `chat.completion.chunk`s — a role chunk, content
/// deltas, the finish chunk, then usage when asked for.
struct ChatShape {
    index: usize,
    id: String,
    created: u64,
    model: String,
    probs: ProbsAsked,
    include_usage: bool,
    started: bool,
    verbose: Option<FullFn>,
    /// The output stage: the generated text as content, reasoning and tool calls.
    output: ChatOutput,
}

/// A streamed piece of the message as an OpenAI `delta`.
fn delta_json(d: &Delta) -> Value {
    match d {
        Delta::Content(t) => json!({"content": t}),
        Delta::Reasoning(t) => json!({"reasoning_content": t}),
        Delta::ToolCallStart { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function", "function": {"name": name},
        }]}),
        Delta::ToolCallArguments { index, arguments } => json!({"tool_calls": [{
            "index": index, "function": {"arguments": arguments},
        }]}),
    }
}

/// The deltas of one step as OpenAI `delta`s: a call's start carries the arguments that
/// follow it at once (llama-server sends a new call with what it has of its arguments).
fn deltas_json(ds: &[Delta]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut open: Option<usize> = None;
    for d in ds {
        if let (Delta::ToolCallArguments { index, arguments }, Some(i), Some(last)) =
            (d, open, out.last_mut())
        {
            if *index == i {
                let f = &mut last["tool_calls"][0]["function"];
                let so_far = f["arguments"].as_str().unwrap_or("").to_string();
                f["arguments"] = json!(so_far + arguments);
                continue;
            }
        }
        open = match d {
            Delta::ToolCallStart { index, .. } => Some(*index),
            _ => None,
        };
        out.push(delta_json(d));
    }
    out
}

/// A whole assistant message as an OpenAI chat `message`.
fn message_json(m: &AssistantMessage) -> Value {
    let mut v = json!({"role": "assistant", "content": m.content});
    if !m.reasoning.is_empty() {
        v["reasoning_content"] = json!(m.reasoning);
    }
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| {
                json!({"type": "function", "id": c.id,
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
    }
    v
}

/// `tool_calls` when the model ended its turn with calls, as llama-server says.
fn chat_finish_reason(out: &SeqOutput, m: &AssistantMessage) -> &'static str {
    match finish_reason(out.reason) {
        "stop" if !m.tool_calls.is_empty() => "tool_calls",
        r => r,
    }
}

impl ChatShape {
    fn delta_chunk(&self, delta: Value, logprobs: Option<Value>) -> Value {
        let mut choice = json!({"index": self.index, "delta": delta, "finish_reason": null});
        // llama-server names `logprobs` only in chunks that carry some.
        if let Some(lp) = logprobs {
            choice["logprobs"] = lp;
        }
        self.chunk_of(json!([choice]))
    }

    fn chunk_of(&self, choices: Value) -> Value {
        json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model, "system_fingerprint": fingerprint(), "choices": choices,
        })
    }

    /// The chunk that opens a stream (llama-server also sends it for each progress report).
    fn role_chunk(&self) -> Value {
        self.chunk_of(json!([{"index": self.index,
            "delta": {"role": "assistant", "content": null}, "finish_reason": null}]))
    }
}

impl StreamShape for ChatShape {
    fn chunk(
        &mut self,
        st: &AppState,
        _tokens: Vec<u32>,
        text: String,
        probs: &[TokenProbs],
        live: Option<&LiveTimings>,
    ) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out.push(self.role_chunk());
        }
        let mut logprobs = oai_logprobs(st, probs, &self.probs);
        for d in deltas_json(&self.output.push(&text)) {
            out.push(self.delta_chunk(d, logprobs.take()));
        }
        // Probabilities of tokens whose text is held back still go out at once.
        if let Some(lp) = logprobs {
            out.push(self.delta_chunk(json!({"content": ""}), Some(lp)));
        }
        // Timings ride on the last chunk of the token (llama-server).
        if let (Some(t), Some(last)) = (live, out.last_mut()) {
            last["timings"] = timings_json(t);
        }
        out.into_iter().map(data).collect()
    }

    fn progress(&self, p: &PromptProgress, with_timings: bool) -> Vec<SseEvent> {
        let mut v = self.role_chunk();
        with_progress(&mut v, p, with_timings);
        vec![data(v)]
    }

    fn done(&mut self, _st: &AppState, out: &SeqOutput, _per_token: bool) -> Vec<SseEvent> {
        let mut cs = Vec::new();
        // A stream that produced no text still opens with the role chunk.
        if !self.started {
            self.started = true;
            cs.push(self.role_chunk());
        }
        for d in deltas_json(&self.output.finish()) {
            cs.push(self.delta_chunk(d, None));
        }
        let reason = chat_finish_reason(out, self.output.message());
        let mut fin = self.chunk_of(json!([{"index": self.index, "delta": {},
                    "finish_reason": reason}]));
        if let Some(f) = &self.verbose {
            fin["__verbose"] = f(out);
        }
        cs.push(fin);
        if self.include_usage {
            let mut u = self.chunk_of(json!([]));
            u["usage"] = usage(out);
            cs.push(u);
        }
        // The timings go on the last chunk: the usage chunk when there is one.
        if let Some(last) = cs.last_mut() {
            add_timings(last, out);
        }
        cs.into_iter().map(data).collect()
    }
}

/// `POST /v1/chat/completions`: OpenAI's chat API.
pub async fn chat(
    State(st): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(body): JsonBody,
) -> Response {
    into_response(chat_inner(st, caller, body).await)
}

async fn chat_inner(st: Arc<AppState>, caller: Caller, body: Value) -> Result<Response, ApiError> {
    let (body, (prompt, g, out_cfg)) =
        on_worker(&st, body, move |st, f| chat_request(st, f, caller)).await?;
    let f = Fields::of(&body);
    let x = Extras::of(&st, &f, &g)?;
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
                let shape: Box<dyn StreamShape> = Box::new(ChatShape {
                    index,
                    id: id.clone(),
                    created,
                    model: model.clone(),
                    probs: ProbsAsked::of(g),
                    include_usage,
                    started: false,
                    verbose,
                    output: ChatOutput::new(out_cfg.clone()),
                });
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
            let m = ChatOutput::parse(out_cfg.clone(), &out.text);
            let mut choice = json!({
                "index": index,
                "message": message_json(&m),
                "finish_reason": chat_finish_reason(out, &m),
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
    let (_, prompt) = on_worker(&st, body, chat_prompt).await?;
    Ok(Json(
        json!({"input_tokens": prompt.len(), "object": "response.input_tokens"}),
    ))
}
