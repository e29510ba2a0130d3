//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) and OpenAI's
//! Responses API (`/v1/responses`, `/v1/responses/input_tokens`) over real HTTP against the
//! real binary, and through the official `anthropic` and `openai` Python clients.
//!
//! Both dialects are rewritten into the chat request of `/v1/chat/completions`, so with greedy
//! sampling their text must be the chat path's text for the same conversation, and their token
//! counts the chat path's `input_tokens`. Shapes and event sequences were checked against
//! llama-server and the clients' types (see `crates/specd-server/src/generate/anthropic.rs` and
//! `responses.rs`).

use serde_json::{json, Value};

mod common;
use common::http::*;
use common::Server;

const SYSTEM: &str = "You write Python.";
const USER: &str = "Write a loop";

/// The chat request that a Messages / Responses request with `SYSTEM` and `USER` becomes.
fn chat_body(max: u64) -> Value {
    json!({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
           "max_tokens": max, "temperature": 0})
}

fn chat_text(s: &Server, body: &Value) -> String {
    let v = s.ok("/v1/chat/completions", body);
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn chat_count(s: &Server, body: &Value) -> u64 {
    s.ok("/v1/chat/completions/input_tokens", body)["input_tokens"]
        .as_u64()
        .expect("input_tokens")
}

/// Named server-sent events: `(event name, data)`; every event must have both.
fn named_events(r: &Resp) -> Vec<(String, Value)> {
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("event: ") {
            name = Some(n.to_string());
        } else if let Some(d) = line.strip_prefix("data: ") {
            let data: Value = serde_json::from_str(d).expect("event data is JSON");
            let n = name.take().unwrap_or_else(|| panic!("no event name: {d}"));
            assert_eq!(data["type"], n.as_str(), "event name and type differ");
            out.push((n, data));
        }
    }
    out
}

fn messages_body(max: u64) -> Value {
    json!({"model": "m", "max_tokens": max, "temperature": 0, "system": SYSTEM,
           "messages": [{"role": "user", "content": USER}]})
}

fn anthropic_error(r: &Resp, status: u16, ty: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], ty, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[test]
fn messages_answer_is_the_chat_answer() {
    let s = Server::start(&[]);
    let v = s.ok("/v1/messages", &messages_body(12));
    let want = chat_text(&s, &chat_body(12));
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(
        v["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
        "{v}"
    );
    assert_eq!(v["model"], "m");
    assert_eq!(v["content"], json!([{"type": "text", "text": want}]));
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["stop_sequence"], Value::Null);
    let u = &v["usage"];
    let n = chat_count(&s, &chat_body(12));
    assert_eq!(u["output_tokens"], 12);
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        n
    );
    // No llama-server extras on the Anthropic shape.
    assert!(v.get("timings").is_none());
    // A system prompt given as text blocks is the same prompt.
    let mut b = messages_body(12);
    b["system"] =
        json!([{"type": "text", "text": "You write "}, {"type": "text", "text": "Python."}]);
    assert_eq!(
        s.ok("/v1/messages", &b)["content"][0]["text"],
        want.as_str()
    );
    // Multi-part user content is the same prompt as the parts' chat message.
    let mut b = messages_body(12);
    b["messages"] = json!([{"role": "user", "content": [
        {"type": "text", "text": "Write "}, {"type": "text", "text": "a loop"}]}]);
    let mut c = chat_body(12);
    c["messages"][1]["content"] =
        json!([{"type": "text", "text": "Write "}, {"type": "text", "text": "a loop"}]);
    assert_eq!(
        s.ok("/v1/messages", &b)["content"][0]["text"],
        chat_text(&s, &c).as_str()
    );
}

#[test]
fn messages_stop_sequences_and_stop_reason() {
    let s = Server::start(&[]);
    let full = chat_text(&s, &chat_body(24));
    // A stop sequence from the middle of the greedy answer cuts it there.
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let before = &full[..full.find(&stop).unwrap()];
    let mut b = messages_body(24);
    b["stop_sequences"] = json!([stop]);
    let v = s.ok("/v1/messages", &b);
    assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
    assert_eq!(v["stop_sequence"], stop.as_str());
    let text = v["content"]
        .get(0)
        .map_or("", |b| b["text"].as_str().unwrap());
    assert_eq!(text, before);
}

#[test]
fn messages_stream_event_sequence() {
    let s = Server::start(&[]);
    let want = chat_text(&s, &chat_body(12));
    let mut b = messages_body(12);
    b["stream"] = json!(true);
    let r = s.post("/v1/messages", &b);
    assert!(r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let evs = named_events(&r);
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    let n = names.len();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert!(
        names[3..n - 3].iter().all(|&e| e == "content_block_delta"),
        "{names:?}"
    );
    assert_eq!(
        names[n - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let start = &evs[0].1["message"];
    assert_eq!(start["type"], "message");
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    let n_prompt = chat_count(&s, &chat_body(12));
    let u = &start["usage"];
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        n_prompt
    );
    assert_eq!(u["output_tokens"], 0);
    assert_eq!(
        evs[2].1,
        json!({"type": "content_block_start", "index": 0,
                           "content_block": {"type": "text", "text": ""}})
    );
    let mut text = String::new();
    for (_, d) in &evs[3..n - 3] {
        assert_eq!(d["index"], 0);
        assert_eq!(d["delta"]["type"], "text_delta");
        text.push_str(d["delta"]["text"].as_str().unwrap());
    }
    assert_eq!(text, want);
    assert_eq!(
        evs[n - 3].1,
        json!({"type": "content_block_stop", "index": 0})
    );
    let md = &evs[n - 2].1;
    assert_eq!(
        md["delta"],
        json!({"stop_reason": "max_tokens", "stop_sequence": null})
    );
    assert_eq!(md["usage"]["output_tokens"], 12);
    assert!(evs[n - 1].1.get("timings").is_none());
}

/// The Messages conversation of a tool round trip: a tool offered, an earlier tool_use (with
/// thinking and text) and its tool_result.
fn tool_messages() -> (Value, Value) {
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]});
    let anthropic = json!({
    "model": "m", "max_tokens": 8, "temperature": 0,
    "tools": [{"name": "get_weather", "description": "Weather of a city", "input_schema": schema}],
    "tool_choice": {"type": "auto"},
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call the tool.", "signature": ""},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Here:"},
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": ", 25 C"}]}]}
    ]});
    let chat = json!({
    "max_tokens": 8, "temperature": 0,
    "tools": [{"type": "function", "function": {"name": "get_weather",
               "description": "Weather of a city", "parameters": schema}}],
    "tool_choice": "auto",
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}],
         "reasoning_content": "I should call the tool.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "user", "content": [{"type": "text", "text": "Here:"}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 25 C"}
    ]});
    (anthropic, chat)
}

#[test]
fn messages_tools_history_is_the_chat_conversation() {
    let s = Server::start(&[]);
    let (a, c) = tool_messages();
    let n = s.ok("/v1/messages/count_tokens", &a);
    assert_eq!(n, json!({"input_tokens": chat_count(&s, &c)}));
    let v = s.ok("/v1/messages", &a);
    assert_eq!(v["content"][0]["text"], chat_text(&s, &c).as_str());
    // count_tokens needs no max_tokens, and counts the system prompt.
    let mut b = messages_body(1);
    b.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(
        s.ok("/v1/messages/count_tokens", &b),
        json!({"input_tokens": chat_count(&s, &chat_body(1))})
    );
    // A named tool choice and `any` are accepted (they become OpenAI's named / required).
    for tc in [
        json!({"type": "tool", "name": "get_weather"}),
        json!({"type": "any"}),
    ] {
        let mut b = a.clone();
        b["tool_choice"] = tc;
        assert_eq!(s.post("/v1/messages/count_tokens", &b).status, 200);
    }
    // Extended thinking and metadata are accepted.
    let mut b = messages_body(4);
    b["thinking"] = json!({"type": "enabled", "budget_tokens": 64});
    b["metadata"] = json!({"user_id": "u1"});
    assert_eq!(s.ok("/v1/messages", &b)["type"], "message");
}

#[test]
fn messages_errors_in_anthropic_shape() {
    let s = Server::start(&[]);
    let post = |b: Value| s.post("/v1/messages", &b);
    anthropic_error(
        &post(json!({"model": "m", "max_tokens": 4})),
        400,
        "invalid_request_error",
    );
    anthropic_error(
        &post(json!({"max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]})),
        400,
        "invalid_request_error",
    );
    anthropic_error(
        &post(
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
                     "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
        ),
        400,
        "invalid_request_error",
    );
    // Images: specd serves text models (llama-server's status and message for a model without
    // a projector).
    let r = post(
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]}),
    );
    anthropic_error(&r, 500, "api_error");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("image input is not supported"));
    // Malformed JSON, and count_tokens' errors, in the same shape.
    let r = request(
        &s.addr,
        "POST",
        "/v1/messages",
        &[("Content-Type", "application/json")],
        Some(b"{bad"),
    );
    anthropic_error(&r, 400, "invalid_request_error");
    anthropic_error(
        &s.post("/v1/messages/count_tokens", &json!({"model": "m"})),
        400,
        "invalid_request_error",
    );
    // The server keeps serving.
    assert_eq!(s.post("/v1/messages", &messages_body(2)).status, 200);
}

fn responses_body(max: u64) -> Value {
    json!({"model": "m", "instructions": SYSTEM, "input": [{"role": "user", "content": USER}],
           "max_output_tokens": max, "temperature": 0})
}

#[test]
fn responses_answer_is_the_chat_answer() {
    let s = Server::start(&[]);
    let want = chat_text(&s, &chat_body(12));
    let v = s.ok("/v1/responses", &responses_body(12));
    assert!(
        v["id"].as_str().is_some_and(|i| i.starts_with("resp_")),
        "{v}"
    );
    assert_eq!(v["object"], "response");
    // Cut by max_output_tokens, as OpenAI reports it.
    assert_eq!(v["status"], "incomplete");
    assert_eq!(
        v["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(v["model"], "m");
    assert_eq!(v["instructions"], SYSTEM);
    assert_eq!(v["max_output_tokens"], 12);
    let out = v["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{v}");
    assert_eq!(out[0]["type"], "message");
    assert_eq!(out[0]["role"], "assistant");
    assert_eq!(out[0]["status"], "completed");
    assert!(out[0]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(
        out[0]["content"],
        json!([{"type": "output_text", "text": want, "annotations": [], "logprobs": []}])
    );
    let n = chat_count(&s, &chat_body(12));
    assert_eq!(v["usage"]["input_tokens"], n);
    assert_eq!(v["usage"]["output_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"], n + 12);
    assert!(v["usage"]["input_tokens_details"]["cached_tokens"].is_u64());
    // `input` as a string is one user message; input_tokens counts it as chat does.
    let b = json!({"input": USER, "instructions": SYSTEM});
    assert_eq!(
        s.ok("/v1/responses/input_tokens", &b),
        json!({"object": "response.input_tokens", "input_tokens": n})
    );
    assert_eq!(s.ok("/responses/input_tokens", &b)["input_tokens"], n);
    // `developer` is the system role.
    let b = json!({"input": [{"role": "developer", "content": SYSTEM},
                             {"role": "user", "content": [{"type": "input_text", "text": USER}]}]});
    assert_eq!(s.ok("/v1/responses/input_tokens", &b)["input_tokens"], n);
}

#[test]
fn responses_function_call_items_are_the_chat_conversation() {
    let s = Server::start(&[]);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let r = json!({
    "max_output_tokens": 8, "temperature": 0,
    "tools": [{"type": "function", "name": "get_weather", "parameters": schema}],
    "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}
    ]});
    let c = json!({
    "max_tokens": 8, "temperature": 0,
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Looking."}],
         "reasoning_content": "Call it.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
    ]});
    assert_eq!(
        s.ok("/v1/responses/input_tokens", &r)["input_tokens"],
        chat_count(&s, &c)
    );
    let v = s.ok("/v1/responses", &r);
    assert_eq!(
        v["output"][0]["content"][0]["text"],
        chat_text(&s, &c).as_str()
    );
}

#[test]
fn responses_stream_event_sequence() {
    let s = Server::start(&[]);
    let want = chat_text(&s, &chat_body(12));
    let mut b = responses_body(12);
    b["stream"] = json!(true);
    let evs = named_events(&s.post("/v1/responses", &b));
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    let n = names.len();
    assert_eq!(
        names[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert!(names[4..n - 4]
        .iter()
        .all(|&e| e == "response.output_text.delta"));
    assert_eq!(
        names[n - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete"
        ]
    );
    for (i, (_, d)) in evs.iter().enumerate() {
        assert_eq!(d["sequence_number"], i, "{d}");
    }
    let id = evs[0].1["response"]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_"));
    assert_eq!(evs[0].1["response"]["status"], "in_progress");
    assert_eq!(evs[1].1["response"]["id"], id.as_str());
    let item = &evs[2].1["item"];
    let msg = item["id"].as_str().unwrap();
    assert!(msg.starts_with("msg_"));
    assert_eq!(item["status"], "in_progress");
    assert_eq!(evs[2].1["output_index"], 0);
    let mut text = String::new();
    for (_, d) in &evs[3..n - 3] {
        assert_eq!(d["item_id"], msg);
        assert_eq!(d["output_index"], 0);
        assert_eq!(d["content_index"], 0);
        if let Some(t) = d["delta"].as_str() {
            text.push_str(t);
        }
    }
    assert_eq!(text, want);
    assert_eq!(evs[n - 4].1["text"], want.as_str());
    assert_eq!(evs[n - 3].1["part"]["text"], want.as_str());
    assert_eq!(evs[n - 2].1["item"]["status"], "completed");
    let done = &evs[n - 1].1;
    assert_eq!(done["response"]["id"], id.as_str());
    assert_eq!(done["response"]["status"], "incomplete");
    assert_eq!(done["response"]["output"][0], evs[n - 2].1["item"]);
    assert_eq!(done["response"]["usage"]["output_tokens"], 12);
    assert!(done["timings"]["predicted_per_second"].is_number());
}

#[test]
fn responses_stream_progress_and_timings() {
    let s = Server::start(&[]);
    let b = json!({"input": "This is a test ".repeat(10), "max_output_tokens": 4, "stream": true,
                   "timings_per_token": true, "return_progress": true});
    let evs = named_events(&s.post("/responses", &b));
    assert_eq!(evs[0].0, "response.created");
    let progress: Vec<_> = evs
        .iter()
        .filter(|(_, d)| d.get("prompt_progress").is_some())
        .collect();
    assert!(!progress.is_empty());
    assert!(progress.iter().all(|(n, _)| n == "response.in_progress"));
    assert!(evs
        .iter()
        .any(|(n, d)| n == "response.output_text.delta" && d.get("timings").is_some()));
}

#[test]
fn responses_errors() {
    let s = Server::start(&[]);
    assert_error(
        &s.post("/v1/responses", &json!({"model": "m"})),
        400,
        "invalid_request_error",
    );
    assert_error(
        &s.post(
            "/v1/responses",
            &json!({"input": "x", "previous_response_id": "resp_1"}),
        ),
        400,
        "invalid_request_error",
    );
    assert_error(
        &s.post(
            "/v1/responses",
            &json!({"input": "x", "tools": [{"type": "web_search"}],
                "tool_choice": {"type": "web_search"}}),
        ),
        400,
        "invalid_request_error",
    );
    assert_error(
        &s.post(
            "/v1/responses",
            &json!({"input": [{"type": "item_reference", "id": "x"}]}),
        ),
        400,
        "invalid_request_error",
    );
    assert_eq!(
        s.post(
            "/v1/responses",
            &json!({"input": "x", "max_output_tokens": 2})
        )
        .status,
        200
    );
}

/// Speculation stays exact through both dialects: the n-gram drafter (which drafts on the
/// repetitive test model) gives the plain server's greedy text.
#[test]
fn speculative_text_equals_plain_text() {
    let plain = Server::start(&[]);
    let spec = Server::start(&["--spec-type", "ngram-mod"]);
    let m = messages_body(48);
    let r = responses_body(48);
    let text = |s: &Server| {
        (
            s.ok("/v1/messages", &m)["content"][0]["text"].clone(),
            s.ok("/v1/responses", &r)["output"][0]["content"][0]["text"].clone(),
        )
    };
    assert_eq!(text(&spec), text(&plain));
    let v = spec.ok("/v1/chat/completions", &chat_body(48));
    assert!(
        v["speculative"]["accepted_tokens"].as_u64().unwrap_or(0) > 0,
        "no draft was accepted: {}",
        v["speculative"]
    );
}

/// The official `anthropic` client: messages, streaming (helper and raw events), tools, token
/// counting, typed errors; its text is the chat path's.
#[test]
fn anthropic_client() {
    let s = Server::start(&["--temp", "0"]);
    let out = common::python::run_client_script("anthropic_messages.py", &s.addr, &[]);
    let r: Value = serde_json::from_str(out.lines().last().unwrap()).expect("report");
    let want = chat_text(&s, &chat_body(12));
    assert_eq!(r["text"], want.as_str());
    assert_eq!(r["stream_text"], want.as_str());
    assert_eq!(r["stop_reason"], "max_tokens");
    assert_eq!(r["stream_stop_reason"], "max_tokens");
    assert_eq!(r["usage"]["output_tokens"], 12);
    assert_eq!(r["stream_usage"]["output_tokens"], 12);
    let events: Vec<&str> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    // The client reads `ping` and does not hand it on.
    assert_eq!(
        events[..3],
        [
            "message_start",
            "content_block_start",
            "content_block_delta"
        ]
    );
    assert_eq!(
        events[events.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert_eq!(r["count"], chat_count(&s, &chat_body(12)));
    // The script's tool conversation, as chat messages.
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]});
    let c = json!({
    "tools": [{"type": "function", "function": {"name": "get_weather",
               "description": "Weather of a city", "parameters": schema}}],
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}],
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 25 C"}
    ]});
    assert_eq!(r["tool_count"], chat_count(&s, &c));
    assert_eq!(r["error_type"], "invalid_request_error");
}

/// The official `openai` client's Responses API: a response, a stream (typed events, sequence
/// numbers, the accumulating helper), function-call input items, input token counting.
#[test]
fn openai_responses_client() {
    let s = Server::start(&[]);
    let out = common::python::run_client_script("openai_responses.py", &s.addr, &[]);
    let r: Value = serde_json::from_str(out.lines().last().unwrap()).expect("report");
    let want = chat_text(&s, &chat_body(12));
    assert_eq!(r["text"], want.as_str());
    assert_eq!(r["stream_text"], want.as_str());
    assert_eq!(r["helper_text"], want.as_str());
    assert_eq!(r["usage"]["output_tokens"], 12);
    let events: Vec<&str> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(events[0], "response.created");
    assert_eq!(events[events.len() - 1], "response.incomplete");
    assert_eq!(r["count"], chat_count(&s, &chat_body(12)));
    assert!(r["tool_count"].as_u64().unwrap() > 0);
    assert_eq!(r["error_type"], "invalid_request_error");
}
