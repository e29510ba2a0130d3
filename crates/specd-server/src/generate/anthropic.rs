//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A Messages request is rewritten into the chat request of `/v1/chat/completions` (messages,
//! tools, tool choice, sampling fields) and runs through the same prompt, generation and output
//! stages; only the answer is shaped the Anthropic way: content blocks (`thinking`, `text`,
//! `tool_use`), `stop_reason`, Anthropic usage, the named streaming events and Anthropic's error
//! body `{"type": "error", "error": {"type": ..., "message": ...}}`.

use super::output::chat_request;
use super::prompt::chat_prompt;
use super::report::*;
use super::stream::{sse, StreamShape};
use super::*;
use crate::error::JsonBody;
use crate::scope::Caller;
use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use specd_output::{AssistantMessage, ChatOutput, Delta};
use specd_spec::engine::TokenProbs;
use specd_spec::{FinishReason, LiveTimings};

/// The `max_tokens` of a request without one (Anthropic requires the field; llama-server
/// accepts its absence with this budget, and so does specd).
const DEFAULT_MAX_TOKENS: u64 = 4096;

/// An error answered in Anthropic's shape.
struct AnthropicError(ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

fn error_body(e: &ApiError) -> Value {
    e.anthropic_body()
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.into_anthropic_response()
    }
}

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::invalid(msg)
}

/// Images cannot be honoured: specd serves text models. llama-server answers a model without a
/// multimodal projector with this status and message, which clients and its tests look for.
fn no_images() -> ApiError {
    ApiError::server("image input is not supported: specd serves text models only")
}

/// Claude Code starts its system prompt with `x-anthropic-billing-header: …; cch=XXXXX;` where
/// the five `cch` characters change on every request: left as they are, no prompt would share
/// a cached prefix past them. They carry nothing for the model, so they are made constant.
fn steady_billing_header(s: &str) -> String {
    const HEADER: &str = "x-anthropic-billing-header:";
    if !s.starts_with(HEADER) {
        return s.to_string();
    }
    let Some(at) = s[HEADER.len()..].find("cch=").map(|i| i + HEADER.len() + 4) else {
        return s.to_string();
    };
    match s.get(at..at + 6) {
        Some(v) if v.is_ascii() && v.ends_with(';') => format!("{}fffff{}", &s[..at], &s[at + 5..]),
        _ => s.to_string(),
    }
}

/// The text of `system`: a string, or text blocks (concatenated, as llama-server does, so both
/// servers see the same prompt).
fn system_text(v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(steady_billing_header(s)),
        Value::Array(blocks) => {
            let mut out = String::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let t = b
                            .get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| invalid("system: a text block needs a string 'text'"))?;
                        out.push_str(&steady_billing_header(t));
                    }
                    _ => return Err(invalid("system: only text blocks are accepted")),
                }
            }
            Ok(out)
        }
        _ => Err(invalid(
            "'system' must be a string or an array of text blocks",
        )),
    }
}

/// The content of a `tool_result`: its text (text blocks concatenated).
fn tool_result_text(v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut out = String::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        out.push_str(b.get("text").and_then(Value::as_str).unwrap_or_default())
                    }
                    Some("image") => return Err(no_images()),
                    other => {
                        return Err(invalid(format!(
                            "tool_result content of type {} is not supported",
                            other.unwrap_or("(none)")
                        )))
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(invalid(
            "tool_result 'content' must be a string or an array of blocks",
        )),
    }
}

/// One Anthropic message as chat messages: the message itself (text parts, `reasoning_content`
/// from thinking blocks, `tool_calls` from tool_use blocks), then a `tool` message per
/// tool_result block.
fn convert_message(m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        // Claude Code sends system messages inside `messages` (mid-conversation instructions):
        // a system message in its place, which the chat renderer brings to where the template
        // takes it (docs/chat-messages.md).
        Some("system") => {
            let text = m
                .get("content")
                .ok_or_else(|| invalid("messages: a system message needs 'content'"))?;
            out.push(json!({"role": "system", "content": system_text(text)?}));
            return Ok(());
        }
        Some(r) => {
            return Err(invalid(format!(
                "messages: role '{r}' is not one of 'user', 'assistant', 'system'"
            )))
        }
        None => return Err(invalid("messages: each message needs a 'role'")),
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(invalid(
                "messages: 'content' must be a string or an array of content blocks",
            ))
        }
    };
    let mut parts = Vec::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for b in blocks {
        let ty = b.get("type").and_then(Value::as_str).unwrap_or("");
        match ty {
            "text" => {
                let t = b
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("a text block needs a string 'text'"))?;
                parts.push(json!({"type": "text", "text": t}));
            }
            "thinking" => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            // Encrypted reasoning of another model: nothing a local model can read.
            "redacted_thinking" => {}
            "image" | "document" => return Err(no_images()),
            "tool_use" => {
                let id = b.get("id").and_then(Value::as_str).unwrap_or("");
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("a tool_use block needs a 'name'"))?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()}}));
            }
            "tool_result" => {
                let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                let content = tool_result_text(b.get("content"))?;
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            other => {
                return Err(invalid(format!(
                    "content blocks of type '{other}' are not supported"
                )))
            }
        }
    }
    if !parts.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
        let mut msg = json!({"role": role});
        msg["content"] = if parts.is_empty() {
            json!("")
        } else {
            Value::Array(parts)
        };
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if !reasoning.is_empty() {
            msg["reasoning_content"] = json!(reasoning);
        }
        out.push(msg);
    }
    out.extend(results);
    Ok(())
}

/// Anthropic `tools` as OpenAI function tools. Anthropic's server tools (`web_search_…`,
/// `bash_…`) run on Anthropic's side and cannot be honoured here.
fn convert_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(invalid("'tools' must be an array"));
    };
    tools
        .iter()
        .map(|t| {
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(other) => {
                    return Err(invalid(format!(
                        "tool type '{other}' is not supported: only client tools (with an input_schema) are"
                    )))
                }
            }
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tools: each tool needs a 'name'"))?;
            // OpenAI's member order: templates print the tools as they come.
            let mut f = Map::new();
            f.insert("name".into(), json!(name));
            if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
                f.insert("description".into(), d.clone());
            }
            let schema = t.get("input_schema").cloned();
            f.insert("parameters".into(), schema.unwrap_or_else(|| json!({})));
            Ok(json!({"type": "function", "function": f}))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// Anthropic `tool_choice` as the OpenAI one, and its `disable_parallel_tool_use`.
fn convert_tool_choice(tc: &Value, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let choice = match tc.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = tc
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice of type 'tool' needs a 'name'"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(invalid(
                "'tool_choice.type' must be one of 'auto', 'any', 'tool', 'none'",
            ))
        }
    };
    chat.insert("tool_choice".into(), choice);
    if tc.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
        chat.insert("parallel_tool_calls".into(), json!(false));
    }
    Ok(())
}

/// A Messages request as the chat request `/v1/chat/completions` takes.
pub(crate) fn to_chat(body: &Value) -> Result<Value, ApiError> {
    let Some(b) = body.as_object() else {
        return Err(invalid("the request body must be a JSON object"));
    };
    let mut messages = Vec::new();
    if let Some(s) = b.get("system").filter(|v| !v.is_null()) {
        messages.push(json!({"role": "system", "content": system_text(s)?}));
    }
    match b.get("messages") {
        // Anthropic refuses an empty list (with this message); llama-server accepts it.
        Some(Value::Array(ms)) if ms.is_empty() => {
            return Err(invalid("messages: at least one message is required"))
        }
        Some(Value::Array(ms)) => {
            for m in ms {
                convert_message(m, &mut messages)?;
            }
        }
        Some(_) => return Err(invalid("'messages' must be an array")),
        None => return Err(invalid("'messages' is required")),
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(t) = b.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), convert_tools(t)?);
    }
    if let Some(tc) = b.get("tool_choice").filter(|v| !v.is_null()) {
        convert_tool_choice(tc, &mut chat)?;
    }
    if let Some(s) = b.get("stop_sequences") {
        chat.insert("stop".into(), s.clone());
    }
    let max = b
        .get("max_tokens")
        .cloned()
        .unwrap_or(json!(DEFAULT_MAX_TOKENS));
    chat.insert("max_tokens".into(), max);
    // Sampling and llama.cpp's extensions that mean the same on both APIs: `grammar` and
    // `json_schema` too, checked and honoured as on `/v1/chat/completions` (llama-server passes
    // them on as well) rather than dropped, which would answer unconstrained text.
    for key in [
        "model",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "chat_template_kwargs",
        "grammar",
        "json_schema",
    ] {
        if let Some(v) = b.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    // Structured output: a JSON schema the answer must follow.
    if let Some(f) = b
        .get("output_config")
        .and_then(|o| o.get("format"))
        .filter(|f| !f.is_null())
    {
        match (f.get("type").and_then(Value::as_str), f.get("schema")) {
            (Some("json_schema"), Some(schema)) => {
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"schema": schema}}),
                );
            }
            _ => {
                return Err(invalid(
                    "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                ))
            }
        }
    }
    // Extended thinking: on or off in the template (unless the request set it itself), and the
    // budget under the name of the chat API's field. Absent means off, as in Anthropic's API
    // (llama-server leaves the template's default, on for Qwen3.5). A forced tool call
    // (`any` / `tool`) starts without thinking, as Anthropic's API requires, so the call comes
    // at once instead of after a thinking block that may not end in time.
    let on =
        match b.get("thinking").filter(|v| !v.is_null()) {
            None => false,
            Some(t) => match t.get("type").and_then(Value::as_str) {
                // `adaptive` and `between_tools` leave when to think to the model: thinking is on.
                Some("enabled" | "adaptive" | "between_tools") => true,
                Some("disabled") => false,
                _ => return Err(invalid(
                    "'thinking.type' must be 'enabled', 'adaptive', 'between_tools' or 'disabled'",
                )),
            },
        };
    let forced = matches!(
        b.get("tool_choice")
            .and_then(|tc| tc.get("type"))
            .and_then(Value::as_str),
        Some("any" | "tool")
    );
    let on = on && !forced;
    let kw = chat
        .entry("chat_template_kwargs")
        .or_insert_with(|| json!({}));
    if let Some(kw) = kw.as_object_mut() {
        kw.entry("enable_thinking").or_insert(json!(on));
    }
    if let (true, Some(n)) = (on, b.get("thinking").and_then(|t| t.get("budget_tokens"))) {
        chat.insert("thinking_budget_tokens".into(), n.clone());
    }
    Ok(Value::Object(chat))
}

/// Anthropic's `stop_reason` and `stop_sequence` of a generation: a stop string of the request
/// is `stop_sequence`, the end of the turn `end_turn` (`tool_use` when it called tools).
fn stop_reason(out: &SeqOutput, stops: &[String], m: &AssistantMessage) -> (&'static str, Value) {
    match out.reason {
        FinishReason::Stop => match &out.stop_word {
            Some(w) if stops.contains(w) => ("stop_sequence", json!(w)),
            _ => ("end_turn", Value::Null),
        },
        FinishReason::Eos if !m.tool_calls.is_empty() => ("tool_use", Value::Null),
        FinishReason::Eos => ("end_turn", Value::Null),
        FinishReason::Limit | FinishReason::Context | FinishReason::Error => {
            ("max_tokens", Value::Null)
        }
    }
}

/// A tool call's arguments as the `input` object (arguments that are not a JSON object, which
/// a well-formed call never has, become an empty input).
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// The content blocks of a whole message: thinking, text, then one tool_use per call.
fn content_blocks(m: &AssistantMessage) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !m.reasoning.is_empty() {
        // A local model's thinking carries no signature; the field is required.
        blocks.push(json!({"type": "thinking", "thinking": m.reasoning, "signature": ""}));
    }
    if !m.content.is_empty() {
        blocks.push(json!({"type": "text", "text": m.content}));
    }
    for c in &m.tool_calls {
        blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name,
                           "input": tool_input(&c.arguments)}));
    }
    blocks
}

/// Anthropic `usage`: input tokens processed, those read from the prompt cache, output tokens.
fn usage_of(n_prompt: usize, n_cached: usize, n_out: usize) -> Value {
    json!({
        "input_tokens": n_prompt - n_cached.min(n_prompt),
        "cache_read_input_tokens": n_cached,
        "output_tokens": n_out,
    })
}

fn message_id() -> String {
    response_id("msg").replacen('-', "_", 1)
}

/// What a block being streamed holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    /// The tool call of this index in the message.
    Tool(usize),
}

/// A `/v1/messages` stream: `message_start`, `ping`, then one content block after the other
/// (`content_block_start`, its deltas, `content_block_stop`; indices count the blocks),
/// `message_delta` with the stop reason and usage, `message_stop`.
struct MessagesShape {
    id: String,
    model: String,
    /// Prompt tokens (message_start reports them before the engine's count is known).
    n_prompt: usize,
    stops: Vec<String>,
    started: bool,
    /// The block open now and its index.
    open: Option<(Block, usize)>,
    n_blocks: usize,
    output: ChatOutput,
}

/// Server-sent events named after their data's `type`, as Anthropic names them.
fn sse_events(vals: Vec<Value>) -> Vec<SseEvent> {
    vals.into_iter()
        .map(|v| {
            let name = v.get("type").and_then(Value::as_str).unwrap_or("message");
            SseEvent::default().event(name).data(v.to_string())
        })
        .collect()
}

impl MessagesShape {
    fn start(&mut self, n_cached: usize, out: &mut Vec<Value>) {
        if self.started {
            return;
        }
        self.started = true;
        out.push(json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": null, "stop_sequence": null,
            "usage": usage_of(self.n_prompt, n_cached, 0),
        }}));
        out.push(json!({"type": "ping"}));
    }

    fn close(&mut self, out: &mut Vec<Value>) {
        if let Some((b, index)) = self.open.take() {
            if b == Block::Thinking {
                // Clients expect a signature before a thinking block ends; a local model has none.
                out.push(json!({"type": "content_block_delta", "index": index,
                           "delta": {"type": "signature_delta", "signature": ""}}));
            }
            out.push(json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// The index of block `b`, opening it (and closing the one before) unless it is open.
    fn open(&mut self, b: Block, content_block: Value, out: &mut Vec<Value>) -> usize {
        if let Some((open, index)) = self.open {
            if open == b {
                return index;
            }
        }
        self.close(out);
        let index = self.n_blocks;
        self.n_blocks += 1;
        self.open = Some((b, index));
        out.push(
            json!({"type": "content_block_start", "index": index, "content_block": content_block}),
        );
        index
    }

    fn delta(&mut self, d: Delta, out: &mut Vec<Value>) {
        let (index, delta) = match d {
            Delta::Reasoning(t) if !t.is_empty() => {
                let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                let i = self.open(Block::Thinking, block, out);
                (i, json!({"type": "thinking_delta", "thinking": t}))
            }
            Delta::Content(t) if !t.is_empty() => {
                let i = self.open(Block::Text, json!({"type": "text", "text": ""}), out);
                (i, json!({"type": "text_delta", "text": t}))
            }
            Delta::ToolCallStart { index, id, name } => {
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                self.open(Block::Tool(index), block, out);
                return;
            }
            Delta::ToolCallArguments { index, arguments } if !arguments.is_empty() => {
                match self.open {
                    Some((Block::Tool(i), bi)) if i == index => (
                        bi,
                        json!({"type": "input_json_delta", "partial_json": arguments}),
                    ),
                    // The output stage streams a call's arguments right after its start.
                    _ => return,
                }
            }
            _ => return,
        };
        out.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }
}

impl StreamShape for MessagesShape {
    fn chunk(
        &mut self,
        _st: &AppState,
        _tokens: Vec<u32>,
        text: String,
        _probs: &[TokenProbs],
        live: Option<&LiveTimings>,
    ) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.start(live.map_or(0, |t| t.n_cached), &mut out);
        for d in self.output.push(&text) {
            self.delta(d, &mut out);
        }
        sse_events(out)
    }

    fn done(&mut self, _st: &AppState, out: &SeqOutput, _per_token: bool) -> Vec<SseEvent> {
        let mut evs = Vec::new();
        self.start(out.n_cached, &mut evs);
        for d in self.output.finish() {
            self.delta(d, &mut evs);
        }
        self.close(&mut evs);
        let (reason, seq) = stop_reason(out, &self.stops, self.output.message());
        let usage = usage_of(out.n_prompt, out.n_cached, out.n_decoded());
        evs.push(json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": seq},
                   "usage": usage}));
        evs.push(json!({"type": "message_stop"}));
        sse_events(evs)
    }

    fn error(&self, e: &ApiError) -> SseEvent {
        SseEvent::default()
            .event("error")
            .data(error_body(e).to_string())
    }
}

/// `POST /v1/messages`: Anthropic's Messages API.
pub async fn messages(
    State(st): State<Arc<AppState>>,
    caller: Caller,
    body: Result<JsonBody, ApiError>,
) -> Response {
    match body {
        Ok(JsonBody(b)) => {
            into_response_a(messages_inner(st, caller, b).await.map_err(AnthropicError))
        }
        Err(e) => AnthropicError(e).into_response(),
    }
}

fn into_response_a(r: Result<Response, AnthropicError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn messages_inner(
    st: Arc<AppState>,
    caller: Caller,
    body: Value,
) -> Result<Response, ApiError> {
    let chat = to_chat(&body)?;
    let (chat, (prompt, mut g, out_cfg)) =
        on_worker(&st, chat, move |st, f| chat_request(st, f, caller)).await?;
    let f = Fields::of(&chat);
    g.n_cmpl = 1;
    let model = f.str("model")?.unwrap_or(&st.cfg.model_id).to_string();
    let stops = f.strings("stop")?.unwrap_or_default();
    let id = message_id();
    // Anthropic responses carry none of llama-server's extras; streams take the timings of
    // each chunk to report the cached prompt tokens in `message_start`.
    let x = Extras {
        verbose: false,
        timings_per_token: g.stream,
        progress: false,
    };
    let tasks = tasks(vec![prompt], &g);
    if g.stream {
        let runs = start_streams(&st, &tasks, x).await?;
        let runs = runs
            .into_iter()
            .map(|r| {
                let shape: Box<dyn StreamShape> = Box::new(MessagesShape {
                    id: id.clone(),
                    model: model.clone(),
                    n_prompt: r.prompt.len(),
                    stops: stops.clone(),
                    started: false,
                    open: None,
                    n_blocks: 0,
                    output: ChatOutput::new(out_cfg.clone()),
                });
                (r, shape)
            })
            .collect();
        return Ok(sse(st, runs, false));
    }
    let results = run_all(&st, &tasks, x).await?;
    let Some((out, _)) = results.first() else {
        return Err(ApiError::server("the engine returned no result"));
    };
    let m = &ChatOutput::parse(out_cfg, &out.text);
    let (reason, seq) = stop_reason(out, &stops, m);
    Ok(Json(json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "content": content_blocks(m),
        "model": model,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage_of(out.n_prompt, out.n_cached, out.n_decoded()),
    }))
    .into_response())
}

/// `POST /v1/messages/count_tokens`: the input tokens a Messages request would have.
pub async fn count_tokens(
    State(st): State<Arc<AppState>>,
    body: Result<JsonBody, ApiError>,
) -> Response {
    let r = async {
        let chat = to_chat(&body?.0)?;
        let (_, prompt) = on_worker(&st, chat, chat_prompt).await?;
        Ok::<_, ApiError>(Json(json!({"input_tokens": prompt.len()})).into_response())
    };
    into_response_a(r.await.map_err(AnthropicError))
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_output::OutputConfig;
    use specd_output::ToolCall;

    fn shape() -> MessagesShape {
        MessagesShape {
            id: "msg_1".into(),
            model: "m".into(),
            n_prompt: 5,
            stops: Vec::new(),
            started: false,
            open: None,
            n_blocks: 0,
            output: ChatOutput::new(OutputConfig::default()),
        }
    }

    /// Thinking, text and two tool calls stream as four blocks, one after the other, each
    /// closed before the next opens, with the indices the client's accumulator looks up.
    #[test]
    fn blocks_stream_in_order() {
        let mut s = shape();
        let mut out = Vec::new();
        let call = |index: usize, id: &str| Delta::ToolCallStart {
            index,
            id: id.into(),
            name: "f".into(),
        };
        let args = |index: usize, a: &str| Delta::ToolCallArguments {
            index,
            arguments: a.into(),
        };
        for d in [
            Delta::Reasoning("a".into()),
            Delta::Reasoning("b".into()),
            Delta::Content(String::new()),
            Delta::Content("c".into()),
            call(0, "call_1"),
            args(0, "{\"x\""),
            args(0, ":1}"),
            call(1, "call_2"),
            args(1, "{}"),
        ] {
            s.delta(d, &mut out);
        }
        s.close(&mut out);
        let brief: Vec<(String, Value)> = out
            .iter()
            .map(|e| (e["type"].as_str().unwrap().to_string(), e["index"].clone()))
            .collect();
        let want: Vec<(&str, u64)> = vec![
            ("content_block_start", 0),
            ("content_block_delta", 0),
            ("content_block_delta", 0),
            ("content_block_delta", 0),
            ("content_block_stop", 0),
            ("content_block_start", 1),
            ("content_block_delta", 1),
            ("content_block_stop", 1),
            ("content_block_start", 2),
            ("content_block_delta", 2),
            ("content_block_delta", 2),
            ("content_block_stop", 2),
            ("content_block_start", 3),
            ("content_block_delta", 3),
            ("content_block_stop", 3),
        ];
        let want: Vec<(String, Value)> = want
            .into_iter()
            .map(|(t, i)| (t.to_string(), json!(i)))
            .collect();
        assert_eq!(brief, want);
        assert_eq!(
            out[0]["content_block"],
            json!({"type": "thinking", "thinking": "", "signature": ""})
        );
        assert_eq!(
            out[1]["delta"],
            json!({"type": "thinking_delta", "thinking": "a"})
        );
        assert_eq!(
            out[3]["delta"],
            json!({"type": "signature_delta", "signature": ""})
        );
        assert_eq!(out[6]["delta"], json!({"type": "text_delta", "text": "c"}));
        assert_eq!(
            out[8]["content_block"],
            json!({"type": "tool_use", "id": "call_1", "name": "f", "input": {}})
        );
        assert_eq!(
            out[10]["delta"],
            json!({"type": "input_json_delta", "partial_json": ":1}"})
        );
    }

    #[test]
    fn whole_message_blocks() {
        let m = AssistantMessage {
            content: "c".into(),
            reasoning: "r".into(),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{\"x\":1}".into(),
            }],
        };
        assert_eq!(
            json!(content_blocks(&m)),
            json!([
                {"type": "thinking", "thinking": "r", "signature": ""},
                {"type": "text", "text": "c"},
                {"type": "tool_use", "id": "call_1", "name": "f", "input": {"x": 1}}
            ])
        );
    }

    #[test]
    fn request_conversion() {
        let chat = to_chat(&json!({
            "system": "s", "max_tokens": 7, "stop_sequences": ["END"], "top_k": 3,
            "thinking": {"type": "disabled"},
            "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true},
            "messages": [{"role": "user", "content": "hi"}]
        }))
        .unwrap();
        assert_eq!(
            chat,
            json!({
                "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "parallel_tool_calls": false,
                "stop": ["END"], "max_tokens": 7, "top_k": 3,
                "chat_template_kwargs": {"enable_thinking": false}
            })
        );
        let hi = json!([{"role": "user", "content": "hi"}]);
        let chat = to_chat(&json!({"messages": hi, "thinking": {"type": "adaptive"},
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}))
        .unwrap();
        assert_eq!(
            chat["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
        assert_eq!(
            chat["response_format"],
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}})
        );
        // The absent budget is llama-server's; absent thinking is off (Anthropic's default).
        let chat = to_chat(&json!({"messages": hi})).unwrap();
        assert_eq!(chat["max_tokens"], 4096);
        assert_eq!(
            chat["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        // A forced call starts without thinking; the request's own kwargs still win.
        for tc in [json!({"type": "any"}), json!({"type": "tool", "name": "f"})] {
            let chat = to_chat(&json!({"messages": hi, "tool_choice": tc,
                "thinking": {"type": "enabled", "budget_tokens": 2000}}))
            .unwrap();
            assert_eq!(
                chat["chat_template_kwargs"],
                json!({"enable_thinking": false})
            );
            assert!(chat.get("thinking_budget_tokens").is_none());
        }
        let chat = to_chat(&json!({"messages": hi,
            "chat_template_kwargs": {"enable_thinking": true}}))
        .unwrap();
        assert_eq!(
            chat["chat_template_kwargs"],
            json!({"enable_thinking": true})
        );
        // System messages inside `messages` (Claude Code's) stay in their place.
        let chat = to_chat(
            &json!({"system": [{"type": "text", "text": "s"}], "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "later"}]},
            {"role": "user", "content": "again"}]}),
        )
        .unwrap();
        assert_eq!(
            chat["messages"],
            json!([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                {"role": "system", "content": "later"}, {"role": "user", "content": "again"}])
        );
        // llama.cpp's grammar fields go to the chat request, which checks them.
        let chat = to_chat(&json!({"messages": hi, "grammar": "root ::= \"a\"",
            "json_schema": {"type": "object"}}))
        .unwrap();
        assert_eq!(chat["grammar"], "root ::= \"a\"");
        assert_eq!(chat["json_schema"], json!({"type": "object"}));
        // No message at all: Anthropic's refusal (a system prompt alone is not a conversation).
        let e = to_chat(&json!({"messages": [], "system": "s"})).unwrap_err();
        assert_eq!(e.message, "messages: at least one message is required");
    }

    #[test]
    fn billing_header_is_made_steady() {
        let h = "x-anthropic-billing-header: cc_version=2.1; cch=a5145;You are";
        assert_eq!(
            steady_billing_header(h),
            "x-anthropic-billing-header: cc_version=2.1; cch=fffff;You are"
        );
        assert_eq!(steady_billing_header("You are"), "You are");
    }
}
