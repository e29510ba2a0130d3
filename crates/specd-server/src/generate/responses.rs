//! OpenAI's Responses API: `POST /v1/responses` (streamed or not) and
//! `POST /v1/responses/input_tokens`.
//!
//! A Responses request is rewritten into the chat request of `/v1/chat/completions`
//! (`instructions` and `input` items as messages, function tools, `max_output_tokens`, text
//! format) and runs through the same prompt, generation and output stages; the answer is shaped
//! as output items (`reasoning`, `message`, `function_call`) and, streamed, as the typed events
//! the official clients read, each with its `sequence_number`.

use super::output::chat_request;
use super::prompt::chat_prompt;
use super::report::*;
use super::stream::{into_response, sse, StreamShape};
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
use specd_spec::{FinishReason, LiveTimings, PromptProgress};
use std::cell::Cell;
use std::collections::HashMap;

fn invalid(msg: impl Into<String>) -> ApiError {
    ApiError::invalid(msg)
}

/// Images cannot be honoured: specd serves text models (llama-server's status and message for
/// a model without a multimodal projector).
fn no_images() -> ApiError {
    ApiError::server("image input is not supported: specd serves text models only")
}

/// The text parts of an input message's `content` (a string or content items) as chat parts.
fn content_parts(content: &Value) -> Result<Vec<Value>, ApiError> {
    let items = match content {
        Value::String(s) => return Ok(vec![json!({"type": "text", "text": s})]),
        Value::Array(a) => a,
        _ => {
            return Err(invalid(
                "a message's 'content' must be a string or an array",
            ))
        }
    };
    items
        .iter()
        .map(|it| match it.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text") => it
                .get("text")
                .and_then(Value::as_str)
                .map(|t| json!({"type": "text", "text": t}))
                .ok_or_else(|| invalid("a text content item needs a string 'text'")),
            Some("refusal") => it
                .get("refusal")
                .and_then(Value::as_str)
                .map(|t| json!({"type": "text", "text": t}))
                .ok_or_else(|| invalid("a refusal content item needs a string 'refusal'")),
            Some("input_image") => Err(no_images()),
            Some("input_file") => Err(invalid("input files are not supported")),
            _ => Err(invalid(
                "content items must be of type 'input_text', 'output_text', 'refusal', 'input_image' or 'input_file'",
            )),
        })
        .collect()
}

/// A message built by the conversion (`json!` of an object literal).
fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(o) => o,
        _ => Map::new(),
    }
}

/// The assistant message that items of the model's earlier turn join: the last message when
/// it is an assistant's, else a new one.
fn assistant(msgs: &mut Vec<Map<String, Value>>) -> &mut Map<String, Value> {
    let is_assistant = msgs
        .last()
        .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
    if !is_assistant {
        msgs.push(object(json!({"role": "assistant", "content": ""})));
    }
    let last = msgs.len() - 1;
    &mut msgs[last]
}

/// Adds text parts to an assistant message's content.
fn append_content(m: &mut Map<String, Value>, parts: Vec<Value>) {
    let mut all = match m.remove("content") {
        Some(Value::Array(a)) => a,
        Some(Value::String(s)) if !s.is_empty() => vec![json!({"type": "text", "text": s})],
        _ => Vec::new(),
    };
    all.extend(parts);
    m.insert("content".into(), Value::Array(all));
}

/// One input item as chat messages.
fn convert_item(item: &Value, msgs: &mut Vec<Map<String, Value>>) -> Result<(), ApiError> {
    let ty = item.get("type").and_then(Value::as_str);
    let role = item.get("role").and_then(Value::as_str);
    match (ty, role) {
        (None | Some("message"), Some(role @ ("user" | "system" | "developer"))) => {
            let content = item
                .get("content")
                .ok_or_else(|| invalid("an input message needs 'content'"))?;
            // The chat templates know `system`; `developer` is OpenAI's newer name for it.
            let role = if role == "developer" { "system" } else { role };
            msgs.push(object(json!({"role": role, "content": content_parts(content)?})));
        }
        (None | Some("message"), Some("assistant")) => {
            let parts = match item.get("content") {
                None | Some(Value::Null) => Vec::new(),
                Some(c) => content_parts(c)?,
            };
            append_content(assistant(msgs), parts);
        }
        (Some("function_call"), _) => {
            let field = |k: &str| {
                item.get(k)
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid(format!("a function_call item needs a string '{k}'")))
            };
            let call = json!({"id": field("call_id")?, "type": "function",
                "function": {"name": field("name")?, "arguments": field("arguments")?}});
            let m = assistant(msgs);
            match m.get_mut("tool_calls") {
                Some(Value::Array(calls)) => calls.push(call),
                _ => {
                    m.insert("tool_calls".into(), json!([call]));
                }
            }
        }
        (Some("function_call_output"), _) => {
            let id = item
                .get("call_id")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("a function_call_output item needs a string 'call_id'"))?;
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(c @ Value::Array(_)) => content_parts(c)?
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect(),
                _ => {
                    return Err(invalid(
                        "a function_call_output item needs 'output' (a string or content items)",
                    ))
                }
            };
            msgs.push(object(json!({"role": "tool", "tool_call_id": id, "content": output})));
        }
        (Some("reasoning"), _) => {
            // The reasoning text; a summary stands in for reasoning that was not returned.
            let texts = |k: &str| -> String {
                item.get(k)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.get("text").and_then(Value::as_str))
                    .collect()
            };
            let mut text = texts("content");
            if text.is_empty() {
                text = texts("summary");
            }
            // Only encrypted reasoning (Codex sends it back): nothing a local model can read.
            if text.is_empty() {
                return Ok(());
            }
            let m = assistant(msgs);
            let mut all = m
                .get("reasoning_content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            all.push_str(&text);
            m.insert("reasoning_content".into(), json!(all));
        }
        (Some(other), _) => {
            return Err(invalid(format!(
                "input items of type '{other}' are not supported"
            )))
        }
        (None, _) => {
            return Err(invalid(
                "an input item needs a 'type', or a 'role' of 'user', 'system', 'developer' or 'assistant'",
            ))
        }
    }
    Ok(())
}

/// One Responses function tool as a chat tool.
fn function_tool(t: &Value) -> Result<Value, ApiError> {
    let mut f = Map::new();
    for k in ["name", "description", "parameters", "strict"] {
        if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
            f.insert(k.into(), v.clone());
        }
    }
    // Responses function tools are strict unless they say otherwise (chat ones are not).
    f.entry("strict").or_insert(json!(true));
    if !f.contains_key("name") {
        return Err(invalid("tools: each function tool needs a 'name'"));
    }
    Ok(json!({"type": "function", "function": f}))
}

/// Responses tools as chat tools: function tools as they are, the function tools inside a
/// `namespace` tool (Codex CLI groups its sub-agent tools so) under their own names — a call
/// comes back with its `namespace` ([`tool_namespaces`]). Hosted tools (web search, file
/// search, …) run on OpenAI's side: they are accepted and not offered to the model, with a
/// warning, since clients send them by default (Codex sends `web_search`).
fn convert_tools(tools: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(invalid("'tools' must be an array"));
    };
    let mut out = Vec::new();
    for t in tools {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => out.push(function_tool(t)?),
            Some("namespace") => {
                let Some(Value::Array(inner)) = t.get("tools") else {
                    return Err(invalid("tools: a namespace tool needs a 'tools' array"));
                };
                for f in inner {
                    if f.get("type").and_then(Value::as_str) != Some("function") {
                        return Err(invalid(
                            "tools: a namespace tool may hold only function tools",
                        ));
                    }
                    out.push(function_tool(f)?);
                }
            }
            Some(hosted) => {
                tracing::warn!(
                    tool = hosted,
                    "Responses: hosted tool not offered to the model (specd cannot run it)"
                );
            }
            None => return Err(invalid("tools: each tool needs a 'type'")),
        }
    }
    Ok(Value::Array(out))
}

/// The namespace of each function a request's `namespace` tools hold: a call of one is
/// answered with `namespace` beside its `name`, as the client looks it up.
fn tool_namespaces(body: &Value) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let Some(Value::Array(tools)) = body.get("tools") else {
        return m;
    };
    for t in tools {
        if t.get("type").and_then(Value::as_str) != Some("namespace") {
            continue;
        }
        let (Some(ns), Some(Value::Array(inner))) =
            (t.get("name").and_then(Value::as_str), t.get("tools"))
        else {
            continue;
        };
        for f in inner {
            if let Some(name) = f.get("name").and_then(Value::as_str) {
                m.insert(name.to_string(), ns.to_string());
            }
        }
    }
    m
}

/// The members of a Responses request that are not chat fields; the others (sampling,
/// `stream`, llama.cpp's extensions) pass on as they are.
const RESPONSES_ONLY: &[&str] = &[
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "text",
    "reasoning",
    "store",
    "include",
    "metadata",
    "truncation",
    "user",
    "stream_options",
    "background",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "max_tool_calls",
    "previous_response_id",
    "conversation",
];

/// A Responses request as the chat request `/v1/chat/completions` takes.
pub(crate) fn to_chat(body: &Value) -> Result<Value, ApiError> {
    let Some(b) = body.as_object() else {
        return Err(invalid("the request body must be a JSON object"));
    };
    let present = |k: &str| b.get(k).filter(|v| !v.is_null());
    if present("previous_response_id").is_some() || present("conversation").is_some() {
        return Err(invalid(
            "previous_response_id and conversation are not supported: specd stores no responses; send the whole input",
        ));
    }
    let mut msgs: Vec<Map<String, Value>> = Vec::new();
    if let Some(i) = present("instructions") {
        let text = i
            .as_str()
            .ok_or_else(|| invalid("'instructions' must be a string"))?;
        msgs.push(object(json!({"role": "system", "content": text})));
    }
    match b.get("input") {
        Some(Value::String(s)) => msgs.push(object(json!({"role": "user", "content": s}))),
        Some(Value::Array(items)) => {
            for it in items {
                convert_item(it, &mut msgs)?;
            }
        }
        Some(_) => return Err(invalid("'input' must be a string or an array of items")),
        None => return Err(invalid("'input' is required").with("param", "input")),
    }
    let mut chat: Map<String, Value> = b
        .iter()
        .filter(|(k, _)| !RESPONSES_ONLY.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let msgs = msgs.into_iter().map(Value::Object).collect();
    chat.insert("messages".into(), Value::Array(msgs));
    if let Some(t) = present("tools") {
        chat.insert("tools".into(), convert_tools(t)?);
    }
    if let Some(tc) = present("tool_choice") {
        let choice = match tc {
            Value::String(_) => tc.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let name = o
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("a function tool_choice needs a 'name'"))?;
                json!({"type": "function", "function": {"name": name}})
            }
            _ => {
                return Err(invalid(
                    "'tool_choice' must be 'none', 'auto', 'required' or a function",
                ))
            }
        };
        chat.insert("tool_choice".into(), choice);
    }
    if let Some(n) = present("max_output_tokens") {
        chat.insert("max_tokens".into(), n.clone());
    }
    if let Some(format) = present("text").and_then(|t| t.get("format")) {
        match format.get("type").and_then(Value::as_str) {
            Some("text") | None => {}
            Some("json_object") => {
                chat.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let mut js = Map::new();
                for k in ["name", "schema", "strict"] {
                    if let Some(v) = format.get(k) {
                        js.insert(k.into(), v.clone());
                    }
                }
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": js}),
                );
            }
            Some(other) => {
                return Err(invalid(format!(
                    "text.format of type '{other}' is not supported"
                )))
            }
        }
    }
    if let Some(e) = present("reasoning").and_then(|r| r.get("effort")) {
        chat.insert("reasoning_effort".into(), e.clone());
    }
    Ok(Value::Object(chat))
}

/// An id with the prefix OpenAI gives its kind (`resp_`, `msg_`, `rs_`, `fc_`).
fn item_id(prefix: &str) -> String {
    response_id(prefix).replacen('-', "_", 1)
}

/// Responses `usage`. `reasoning_tokens`: the reasoning text's tokens (it is re-tokenized: the
/// output stage splits text, not tokens), at most the tokens generated.
fn usage_json(st: &AppState, out: &SeqOutput, reasoning: &str) -> Value {
    let reasoning_tokens = if reasoning.is_empty() {
        0
    } else {
        let tok = st.model.tokenizer();
        tok.encode(reasoning, false, false)
            .map_or(0, |t| t.len())
            .min(out.n_decoded())
    };
    json!({
        "input_tokens": out.n_prompt,
        "input_tokens_details": {"cached_tokens": out.n_cached},
        "output_tokens": out.n_decoded(),
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": out.n_prompt + out.n_decoded(),
    })
}

/// The response's `status`: `incomplete` when the output token limit (or the context) cut the
/// generation, as OpenAI reports it, else `completed`.
fn status_of(out: &SeqOutput) -> &'static str {
    match out.reason {
        FinishReason::Limit | FinishReason::Context => "incomplete",
        _ => "completed",
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"id": id, "type": "reasoning", "summary": [], "status": status,
           "content": [{"type": "reasoning_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"id": id, "type": "message", "role": "assistant", "status": status,
           "content": [output_text(text)]})
}

/// A function call item; a function of a `namespace` tool carries its `namespace`.
fn call_item(
    id: &str,
    (call_id, name, arguments): (&str, &str, &str),
    status: &str,
    namespaces: &HashMap<String, String>,
) -> Value {
    let mut item = json!({"id": id, "type": "function_call", "status": status,
        "call_id": call_id, "name": name, "arguments": arguments});
    if let Some(ns) = namespaces.get(name) {
        item["namespace"] = json!(ns);
    }
    item
}

/// The output items of a whole message: reasoning, the message, one item per function call.
fn output_items(m: &AssistantMessage, namespaces: &HashMap<String, String>) -> Vec<Value> {
    let mut items = Vec::new();
    if !m.reasoning.is_empty() {
        items.push(reasoning_item(&item_id("rs"), &m.reasoning, "completed"));
    }
    if !m.content.is_empty() || (m.reasoning.is_empty() && m.tool_calls.is_empty()) {
        items.push(message_item(&item_id("msg"), &m.content, "completed"));
    }
    for c in &m.tool_calls {
        items.push(call_item(
            &item_id("fc"),
            (&c.id, &c.name, &c.arguments),
            "completed",
            namespaces,
        ));
    }
    items
}

/// What a response object says of its request, besides id, status, output and usage.
fn echo(body: &Value, model: &str, created: u64) -> Map<String, Value> {
    let get = |k: &str| body.get(k).cloned().unwrap_or(Value::Null);
    let mut m = Map::new();
    m.insert("object".into(), json!("response"));
    m.insert("created_at".into(), json!(created));
    m.insert("model".into(), json!(model));
    m.insert("error".into(), Value::Null);
    m.insert("incomplete_details".into(), Value::Null);
    m.insert("instructions".into(), get("instructions"));
    m.insert("max_output_tokens".into(), get("max_output_tokens"));
    m.insert(
        "parallel_tool_calls".into(),
        body.get("parallel_tool_calls")
            .cloned()
            .unwrap_or(json!(true)),
    );
    m.insert("temperature".into(), get("temperature"));
    m.insert("top_p".into(), get("top_p"));
    m.insert(
        "tool_choice".into(),
        body.get("tool_choice").cloned().unwrap_or(json!("auto")),
    );
    m.insert(
        "tools".into(),
        body.get("tools").cloned().unwrap_or(json!([])),
    );
    m.insert(
        "metadata".into(),
        body.get("metadata").cloned().unwrap_or(json!({})),
    );
    m
}

fn response_json(
    id: &str,
    echo: &Map<String, Value>,
    status: &str,
    output: Vec<Value>,
    usage: Value,
) -> Value {
    let mut r = Map::new();
    r.insert("id".into(), json!(id));
    r.extend(echo.clone());
    r.insert("status".into(), json!(status));
    match status {
        "completed" => {
            r.insert("completed_at".into(), json!(unix_now()));
        }
        "incomplete" => {
            r.insert(
                "incomplete_details".into(),
                json!({"reason": "max_output_tokens"}),
            );
        }
        _ => {}
    }
    r.insert("output".into(), Value::Array(output));
    r.insert("usage".into(), usage);
    Value::Object(r)
}

/// The output item being streamed.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        index: usize,
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// A `/v1/responses` stream: `response.created`, `response.in_progress`, then the output items
/// one after the other (`response.output_item.added`, their parts and deltas,
/// `response.output_item.done`), and `response.completed` with the whole response.
struct ResponsesShape {
    id: String,
    echo: Map<String, Value>,
    /// Events sent so far: the next `sequence_number`. (`progress` takes `&self`.)
    seq: Cell<u64>,
    created: Cell<bool>,
    open: Option<Open>,
    /// The items done, in order.
    done: Vec<Value>,
    output: ChatOutput,
    /// The namespace of each namespaced function ([`tool_namespaces`]).
    namespaces: HashMap<String, String>,
}

impl ResponsesShape {
    /// An event: its `type` first, its members, its `sequence_number`.
    fn ev(&self, ty: &str, v: Value) -> Value {
        let mut e = Map::new();
        e.insert("type".into(), json!(ty));
        if let Value::Object(o) = v {
            e.extend(o);
        }
        e.insert("sequence_number".into(), json!(self.seq.get()));
        self.seq.set(self.seq.get() + 1);
        Value::Object(e)
    }

    fn in_progress(&self) -> Value {
        response_json(&self.id, &self.echo, "in_progress", Vec::new(), Value::Null)
    }

    /// `response.created` and `response.in_progress`, once.
    fn create(&self, out: &mut Vec<Value>) {
        if !self.created.replace(true) {
            out.push(self.ev("response.created", json!({"response": self.in_progress()})));
            out.push(self.ev(
                "response.in_progress",
                json!({"response": self.in_progress()}),
            ));
        }
    }

    fn output_index(&self) -> usize {
        self.done.len()
    }

    /// Ends the open item.
    fn close(&mut self, out: &mut Vec<Value>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let oi = self.output_index();
        let item = match open {
            Open::Reasoning { id, text } => {
                out.push(self.ev(
                    "response.reasoning_text.done",
                    json!({"item_id": id,
                    "output_index": oi, "content_index": 0, "text": text}),
                ));
                reasoning_item(&id, &text, "completed")
            }
            Open::Message { id, text } => {
                out.push(self.ev(
                    "response.output_text.done",
                    json!({"item_id": id,
                    "output_index": oi, "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push(self.ev(
                    "response.content_part.done",
                    json!({"item_id": id,
                    "output_index": oi, "content_index": 0, "part": output_text(&text)}),
                ));
                message_item(&id, &text, "completed")
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
                ..
            } => {
                out.push(self.ev(
                    "response.function_call_arguments.done",
                    json!({
                    "item_id": id, "output_index": oi, "arguments": arguments}),
                ));
                call_item(
                    &id,
                    (&call_id, &name, &arguments),
                    "completed",
                    &self.namespaces,
                )
            }
        };
        out.push(self.ev(
            "response.output_item.done",
            json!({"output_index": oi, "item": item}),
        ));
        self.done.push(item);
    }

    fn delta(&mut self, d: Delta, out: &mut Vec<Value>) {
        match d {
            Delta::Reasoning(t) if !t.is_empty() => {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.close(out);
                    let id = item_id("rs");
                    out.push(self.ev(
                        "response.output_item.added",
                        json!({
                        "output_index": self.output_index(),
                        "item": {"id": id, "type": "reasoning", "summary": [], "content": [],
                                 "status": "in_progress"}}),
                    ));
                    self.open = Some(Open::Reasoning {
                        id,
                        text: String::new(),
                    });
                }
                let oi = self.output_index();
                if let Some(Open::Reasoning { id, text }) = &mut self.open {
                    text.push_str(&t);
                    let id = id.clone();
                    out.push(self.ev(
                        "response.reasoning_text.delta",
                        json!({"item_id": id,
                        "output_index": oi, "content_index": 0, "delta": t}),
                    ));
                }
            }
            Delta::Content(t) if !t.is_empty() => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.close(out);
                    let id = item_id("msg");
                    let oi = self.output_index();
                    out.push(self.ev(
                        "response.output_item.added",
                        json!({"output_index": oi,
                        "item": {"id": id, "type": "message", "role": "assistant",
                                 "status": "in_progress", "content": []}}),
                    ));
                    out.push(self.ev(
                        "response.content_part.added",
                        json!({"item_id": id,
                        "output_index": oi, "content_index": 0, "part": output_text("")}),
                    ));
                    self.open = Some(Open::Message {
                        id,
                        text: String::new(),
                    });
                }
                let oi = self.output_index();
                if let Some(Open::Message { id, text }) = &mut self.open {
                    text.push_str(&t);
                    let id = id.clone();
                    out.push(self.ev(
                        "response.output_text.delta",
                        json!({"item_id": id,
                        "output_index": oi, "content_index": 0, "delta": t, "logprobs": []}),
                    ));
                }
            }
            Delta::ToolCallStart {
                index,
                id: call_id,
                name,
            } => {
                self.close(out);
                let id = item_id("fc");
                out.push(self.ev(
                    "response.output_item.added",
                    json!({
                    "output_index": self.output_index(),
                    "item": call_item(&id, (&call_id, &name, ""), "in_progress",
                        &self.namespaces)}),
                ));
                self.open = Some(Open::Call {
                    index,
                    id,
                    call_id,
                    name,
                    arguments: String::new(),
                });
            }
            Delta::ToolCallArguments { index, arguments } if !arguments.is_empty() => {
                let oi = self.output_index();
                // The output stage streams a call's arguments right after its start.
                if let Some(Open::Call {
                    index: i,
                    id,
                    arguments: all,
                    ..
                }) = &mut self.open
                {
                    if *i == index {
                        all.push_str(&arguments);
                        let id = id.clone();
                        out.push(self.ev(
                            "response.function_call_arguments.delta",
                            json!({"item_id": id, "output_index": oi, "delta": arguments}),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
}

fn sse_events(vals: Vec<Value>) -> Vec<SseEvent> {
    vals.into_iter()
        .map(|v| {
            let name = v
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("message")
                .to_string();
            SseEvent::default().event(name).data(v.to_string())
        })
        .collect()
}

impl StreamShape for ResponsesShape {
    fn chunk(
        &mut self,
        _st: &AppState,
        _tokens: Vec<u32>,
        text: String,
        _probs: &[TokenProbs],
        live: Option<&LiveTimings>,
    ) -> Vec<SseEvent> {
        let mut out = Vec::new();
        self.create(&mut out);
        for d in self.output.push(&text) {
            self.delta(d, &mut out);
        }
        // `timings_per_token`: the timings ride on the token's last event (llama-server).
        if let (Some(t), Some(last)) = (live, out.last_mut()) {
            last["timings"] = timings_json(t);
        }
        sse_events(out)
    }

    fn progress(&self, p: &PromptProgress, with_timings: bool) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.created.get() {
            out.push(self.ev(
                "response.in_progress",
                json!({"response": self.in_progress()}),
            ));
        } else {
            self.create(&mut out);
        }
        if let Some(last) = out.last_mut() {
            with_progress(last, p, with_timings);
        }
        sse_events(out)
    }

    fn done(&mut self, st: &AppState, out: &SeqOutput, _per_token: bool) -> Vec<SseEvent> {
        let mut evs = Vec::new();
        self.create(&mut evs);
        for d in self.output.finish() {
            self.delta(d, &mut evs);
        }
        self.close(&mut evs);
        let status = status_of(out);
        let usage = usage_json(st, out, &self.output.message().reasoning);
        let r = response_json(&self.id, &self.echo, status, self.done.clone(), usage);
        let mut fin = self.ev(&format!("response.{status}"), json!({"response": r}));
        add_timings(&mut fin, out);
        evs.push(fin);
        sse_events(evs)
    }

    fn error(&self, e: &ApiError) -> SseEvent {
        let v = self.ev(
            "error",
            json!({"code": e.object()["type"], "message": e.message, "param": null}),
        );
        SseEvent::default().event("error").data(v.to_string())
    }
}

/// `POST /v1/responses`: OpenAI's Responses API.
pub async fn responses(
    State(st): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(body): JsonBody,
) -> Response {
    into_response(responses_inner(st, caller, body).await)
}

async fn responses_inner(
    st: Arc<AppState>,
    caller: Caller,
    body: Value,
) -> Result<Response, ApiError> {
    let chat = to_chat(&body)?;
    let (chat, (prompt, mut g, out_cfg)) =
        on_worker(&st, chat, move |st, f| chat_request(st, f, caller)).await?;
    let f = Fields::of(&chat);
    g.n_cmpl = 1;
    let x = Extras::of(&st, &f, &g)?;
    let model = f.str("model")?.unwrap_or(&st.cfg.model_id).to_string();
    let id = item_id("resp");
    let echo = echo(&body, &model, unix_now());
    let namespaces = tool_namespaces(&body);
    let tasks = tasks(vec![prompt], &g);
    if g.stream {
        let runs = start_streams(&st, &tasks, x).await?;
        let runs = runs
            .into_iter()
            .map(|r| {
                let shape: Box<dyn StreamShape> = Box::new(ResponsesShape {
                    id: id.clone(),
                    echo: echo.clone(),
                    seq: Cell::new(0),
                    created: Cell::new(false),
                    open: None,
                    done: Vec::new(),
                    output: ChatOutput::new(out_cfg.clone()),
                    namespaces: namespaces.clone(),
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
    let message = ChatOutput::parse(out_cfg, &out.text);
    let usage = usage_json(&st, out, &message.reasoning);
    let items = output_items(&message, &namespaces);
    Ok(Json(response_json(&id, &echo, status_of(out), items, usage)).into_response())
}

/// `POST /v1/responses/input_tokens`: the number of input tokens a Responses request would
/// have, without generating.
pub async fn responses_input_tokens(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let chat = to_chat(&body)?;
    let (_, prompt) = on_worker(&st, chat, chat_prompt).await?;
    Ok(Json(
        json!({"object": "response.input_tokens", "input_tokens": prompt.len()}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_output::OutputConfig;
    use specd_output::ToolCall;

    /// Reasoning, text and a function call stream as three output items in order, each done
    /// before the next is added, numbered by `sequence_number` and `output_index`.
    #[test]
    fn items_stream_in_order() {
        let mut s = ResponsesShape {
            id: "resp_1".into(),
            echo: Map::new(),
            seq: Cell::new(0),
            created: Cell::new(false),
            open: None,
            done: Vec::new(),
            output: ChatOutput::new(OutputConfig::default()),
            namespaces: HashMap::new(),
        };
        let mut out = Vec::new();
        s.create(&mut out);
        for d in [
            Delta::Reasoning("r".into()),
            Delta::Content("a".into()),
            Delta::Content("b".into()),
            Delta::ToolCallStart {
                index: 0,
                id: "call_1".into(),
                name: "f".into(),
            },
            Delta::ToolCallArguments {
                index: 0,
                arguments: "{}".into(),
            },
        ] {
            s.delta(d, &mut out);
        }
        s.close(&mut out);
        let types: Vec<&str> = out.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        for (i, e) in out.iter().enumerate() {
            assert_eq!(e["sequence_number"], i);
        }
        let oi: Vec<u64> = out[2..]
            .iter()
            .map(|e| e["output_index"].as_u64().unwrap())
            .collect();
        assert_eq!(oi, [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(out[10]["text"], "ab");
        assert_eq!(out[15]["arguments"], "{}");
        let call = &out[16]["item"];
        assert_eq!(call["type"], "function_call");
        assert_eq!(call["call_id"], "call_1");
        assert_eq!(call["name"], "f");
        assert_eq!(call["arguments"], "{}");
        assert_eq!(call["status"], "completed");
        assert_eq!(s.done.len(), 3);
    }

    #[test]
    fn whole_message_items() {
        let m = AssistantMessage {
            content: String::new(),
            reasoning: "r".into(),
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            }],
        };
        let items = output_items(&m, &HashMap::new());
        let types: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["reasoning", "function_call"]);
        assert_eq!(items[0]["content"][0]["text"], "r");
        assert!(items[1]["id"].as_str().unwrap().starts_with("fc_"));
        // An empty answer is still one (empty) message.
        let items = output_items(&AssistantMessage::default(), &HashMap::new());
        assert_eq!(items[0]["type"], "message");
    }

    #[test]
    fn namespace_and_hosted_tools_as_codex_sends_them() {
        let f = |name: &str| {
            json!({"type": "function", "name": name, "strict": false,
            "parameters": {"type": "object", "properties": {}}})
        };
        let body = json!({"input": "hi", "tools": [
            f("exec_command"),
            {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
             "tools": [f("close_agent"), f("spawn_agent")]},
            {"type": "web_search", "external_web_access": false}]});
        let chat = to_chat(&body).unwrap();
        let names: Vec<_> = chat["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].clone())
            .collect();
        assert_eq!(
            names,
            [
                json!("exec_command"),
                json!("close_agent"),
                json!("spawn_agent")
            ]
        );
        let ns = tool_namespaces(&body);
        let call = call_item("fc_1", ("c", "close_agent", "{}"), "completed", &ns);
        assert_eq!(call["namespace"], "multi_agent_v1");
        let call = call_item("fc_2", ("c", "exec_command", "{}"), "completed", &ns);
        assert!(call.get("namespace").is_none());
        // A forced hosted tool cannot be honoured.
        let forced = json!({"input": "hi", "tools": [{"type": "web_search"}],
            "tool_choice": {"type": "web_search"}});
        assert!(to_chat(&forced).is_err());
    }

    #[test]
    fn encrypted_reasoning_adds_nothing() {
        let chat = to_chat(&json!({"input": [
            {"type": "reasoning", "summary": [], "encrypted_content": "xyz"},
            {"role": "user", "content": "hi"}]}))
        .unwrap();
        assert_eq!(
            chat["messages"],
            json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
        );
    }

    #[test]
    fn request_conversion() {
        let chat = to_chat(&json!({
            "instructions": "s", "max_output_tokens": 5, "temperature": 0, "store": false,
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                      {"type": "function_call_output", "call_id": "c", "output": "o"}]
        }))
        .unwrap();
        assert_eq!(
            chat,
            json!({
                "temperature": 0,
                "messages": [{"role": "system", "content": "s"},
                             {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                             {"role": "tool", "tool_call_id": "c", "content": "o"}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
                "max_tokens": 5,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": {"type": "object"}}}
            })
        );
    }
}
