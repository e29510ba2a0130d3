//! Tool calls and reasoning on `/v1/chat/completions`, over HTTP against the real binary: the
//! tiny random model is forced into a well-formed call by `tool_choice: required` or a named
//! function (the tool-call grammar), streamed and not; its thinking lands in
//! `reasoning_content`; speculative and plain decoding give the same answer under both; the
//! official `openai` client reads the calls.

mod common;

use common::http::{assert_error, open_stream, read_chunk};
use common::Server;
use serde_json::{json, Value};

/// A ChatML template teaching Qwen3.5's XML tool calls, whose generation prompt opens the
/// thinking block unless `enable_thinking` is false (as Qwen3.5's own template does).
const XML_TEMPLATE: &str = "{%- if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}\nCall as <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

/// A ChatML template teaching Hermes JSON tool calls (Qwen2.5's form), no thinking.
const HERMES_TEMPLATE: &str = "{%- if tools %}<|im_start|>system\nCall as <tool_call>\n{\"name\": NAME, \"arguments\": ARGS}\n</tool_call><|im_end|>\n{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Tools whose every argument has few values, so that a random model under the grammar ends
/// its call within a few tokens.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather",
         "parameters": {"type": "object", "properties": {
             "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
             "days": {"type": "integer", "minimum": 1, "maximum": 9}},
             "required": ["unit", "days"]}}},
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    ])
}

fn request(extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": "What is the weather?"}],
        "tools": tools(),
        "max_tokens": 200,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": false},
        // One call, then the grammar allows only the end of the turn.
        "parallel_tool_calls": false,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

/// Checks a call as OpenAI shapes it and returns its arguments.
fn check_call(c: &Value, names: &[&str]) -> Value {
    assert_eq!(c["type"], "function", "{c}");
    let id = c["id"].as_str().unwrap_or_else(|| panic!("no id: {c}"));
    assert_eq!(id.len(), 32, "{c}");
    let name = c["function"]["name"].as_str().expect("name");
    assert!(names.contains(&name), "{c}");
    let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().expect("arguments"))
        .unwrap_or_else(|e| panic!("arguments not JSON ({e}): {c}"));
    if name == "get_weather" {
        assert!(
            ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")),
            "{c}"
        );
        let d = args["days"]
            .as_i64()
            .unwrap_or_else(|| panic!("days not an integer: {c}"));
        assert!((1..=9).contains(&d), "{c}");
    } else {
        assert_eq!(args, json!({}), "{c}");
    }
    args
}

/// The `data:` payloads of a streamed request, up to `[DONE]`.
fn stream(s: &Server, body: &Value) -> Vec<Value> {
    let mut r = open_stream(&s.addr, "/v1/chat/completions", &body.to_string());
    let mut text = String::new();
    while let Some(c) = read_chunk(&mut r) {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    let mut out = Vec::new();
    for l in text.lines() {
        if let Some(d) = l.strip_prefix("data: ") {
            if d == "[DONE]" {
                break;
            }
            out.push(serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")));
        }
    }
    out
}

/// A streamed message put together the way agent frameworks do it: content and reasoning
/// concatenated, calls by `index` (id, type and name from the first delta, arguments appended).
fn accumulate(chunks: &[Value]) -> (Value, String) {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = String::new();
    for c in chunks {
        let Some(ch) = c["choices"].get(0) else {
            continue;
        };
        let d = &ch["delta"];
        if let Some(t) = d["content"].as_str() {
            content.push_str(t);
        }
        if let Some(t) = d["reasoning_content"].as_str() {
            reasoning.push_str(t);
        }
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().expect("index") as usize;
            if i == calls.len() {
                // A new call: its first delta names it.
                assert!(tc["id"].is_string() && tc["type"] == "function", "{tc}");
                assert!(tc["function"]["name"].is_string(), "{tc}");
                calls.push(json!({"id": tc["id"], "type": "function",
                    "function": {"name": tc["function"]["name"], "arguments": ""}}));
            } else {
                // Later deltas carry arguments only.
                assert!(i + 1 == calls.len() && tc.get("id").is_none(), "{tc}");
                assert!(tc["function"].get("name").is_none(), "{tc}");
            }
            if let Some(a) = tc["function"]["arguments"].as_str() {
                let so_far = calls[i]["function"]["arguments"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                calls[i]["function"]["arguments"] = json!(so_far + a);
            }
        }
        if let Some(f) = ch["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (
        json!({"content": content, "reasoning_content": reasoning, "tool_calls": calls}),
        finish,
    )
}

#[test]
fn required_forces_a_well_formed_xml_call() {
    let s = Server::start(&["--chat-template", XML_TEMPLATE]);
    let v = s.ok(
        "/v1/chat/completions",
        &request(json!({"tool_choice": "required"})),
    );
    let ch = &v["choices"][0];
    assert_eq!(ch["finish_reason"], "tool_calls", "{v}");
    let m = &ch["message"];
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["content"], "", "{v}");
    let calls = m["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{v}");
    check_call(&calls[0], &["get_weather", "ping"]);

    // Streamed: the same call, as OpenAI deltas.
    let chunks = stream(
        &s,
        &request(json!({"tool_choice": "required", "stream": true})),
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (msg, finish) = accumulate(&chunks);
    assert_eq!(finish, "tool_calls", "{chunks:?}");
    let calls = msg["tool_calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 1, "{msg}");
    check_call(&calls[0], &["get_weather", "ping"]);
    assert_eq!(msg["content"], "", "{msg}");
}

#[test]
fn a_named_function_is_called_in_hermes_json() {
    let s = Server::start(&["--chat-template", HERMES_TEMPLATE]);
    let choice = json!({"type": "function", "function": {"name": "get_weather"}});
    for streamed in [false, true] {
        let body = request(json!({"tool_choice": choice, "stream": streamed}));
        let (msg, finish) = if streamed {
            accumulate(&stream(&s, &body))
        } else {
            let v = s.ok("/v1/chat/completions", &body);
            let ch = v["choices"][0].clone();
            (
                ch["message"].clone(),
                ch["finish_reason"].as_str().unwrap_or("").to_string(),
            )
        };
        assert_eq!(finish, "tool_calls", "{msg}");
        let calls = msg["tool_calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 1, "{msg}");
        check_call(&calls[0], &["get_weather"]);
    }
}

#[test]
fn speculation_stays_exact_under_the_tool_grammar_and_reasoning() {
    let s = Server::start(&[
        "--chat-template",
        XML_TEMPLATE,
        "--spec-type",
        "ngram-simple",
    ]);
    // The grammar's forced tokens (markup, the function name) are drafted for free.
    let forced = request(json!({"tool_choice": "required"}));
    // Thinking on (the prompt opens `<think>`): the answer is reasoning.
    let thinking = json!({"messages": [{"role": "user", "content": "def main():"}],
        "max_tokens": 48, "temperature": 0});
    for body in [forced, thinking] {
        let spec = s.ok("/v1/chat/completions", &body);
        let mut p = body.clone();
        p["speculative"] = json!({"enabled": false});
        let plain = s.ok("/v1/chat/completions", &p);
        let strip_ids = |v: &Value| {
            let mut m = v["choices"][0]["message"].clone();
            for c in m["tool_calls"].as_array_mut().into_iter().flatten() {
                c["id"] = Value::Null;
            }
            m
        };
        assert_eq!(strip_ids(&spec), strip_ids(&plain), "{spec}\n{plain}");
        assert_eq!(
            spec["usage"]["completion_tokens"],
            plain["usage"]["completion_tokens"]
        );
        assert!(
            spec["timings"]["draft_n"].as_u64().unwrap_or(0) > 0,
            "speculation drafted nothing: {spec}"
        );
        assert_eq!(
            plain["timings"]["draft_n"].as_u64().unwrap_or(0),
            0,
            "{plain}"
        );
    }
}

#[test]
fn reasoning_goes_to_reasoning_content() {
    let s = Server::start(&["--chat-template", XML_TEMPLATE]);
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24,
        "temperature": 0});
    let v = s.ok("/v1/chat/completions", &body);
    let m = &v["choices"][0]["message"];
    let r = m["reasoning_content"]
        .as_str()
        .unwrap_or_else(|| panic!("no reasoning: {v}"));
    // The random model does not close its thinking within 24 tokens: all is reasoning.
    let raw = {
        let mut b = body.clone();
        b["reasoning_format"] = json!("none");
        s.ok("/v1/chat/completions", &b)
    };
    let raw_text = raw["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(
        raw["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{raw}"
    );
    // Left in the content, the thoughts start with the tag the prompt opened (llama-server);
    // the reasoning drops the blanks that open it.
    assert_eq!(m["content"], "", "{v}");
    let thoughts = raw_text
        .strip_prefix("<think>\n")
        .unwrap_or_else(|| panic!("{raw}"));
    assert_eq!(thoughts.trim_start(), r);
    // Streamed: `reasoning_content` deltas adding up to the same.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (msg, _) = accumulate(&stream(&s, &sb));
    assert_eq!(msg["reasoning_content"], m["reasoning_content"], "{msg}");
    assert_eq!(msg["content"], m["content"]);
    // Thinking off: no reasoning.
    let mut off = body.clone();
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let v = s.ok("/v1/chat/completions", &off);
    assert!(
        v["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{v}"
    );
}

#[test]
fn reasoning_budget_forces_the_end_of_thinking() {
    // The random model never closes its thinking on its own: without a budget all 40 tokens
    // are reasoning; with one, `</think>` (after the budget message) is forced and the answer
    // follows. Speculation (n-gram drafts, and the forced tokens drafted for free) gives the
    // same tokens as plain decoding.
    let s = Server::start(&[
        "--chat-template",
        XML_TEMPLATE,
        "--spec-type",
        "ngram-simple",
    ]);
    let body = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "def main():"}],
            "max_tokens": 40, "temperature": 0});
        for (k, v) in extra.as_object().expect("object") {
            b[k] = v.clone();
        }
        b
    };
    let message = |v: &Value| v["choices"][0]["message"].clone();
    let unlimited = message(&s.ok("/v1/chat/completions", &body(json!({}))));
    assert_eq!(unlimited["content"], "", "{unlimited}");
    let v = s.ok(
        "/v1/chat/completions",
        &body(json!({"reasoning_budget_tokens": 6, "reasoning_budget_message": " Enough."})),
    );
    let m = message(&v);
    let r = m["reasoning_content"].as_str().unwrap_or_default();
    assert!(r.ends_with("Enough."), "{v}");
    assert!(
        unlimited["reasoning_content"]
            .as_str()
            .is_some_and(|u| u.len() > r.len()),
        "{unlimited}\n{m}"
    );
    assert!(!m["content"].as_str().unwrap_or_default().is_empty(), "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 40, "{v}");
    // Budget 0 closes the block at once; plain decoding gives the same tokens as speculative.
    let zero = body(json!({"reasoning_budget_tokens": 0}));
    let spec = s.ok("/v1/chat/completions", &zero);
    let mut p = zero.clone();
    p["speculative"] = json!({"enabled": false});
    let plain = s.ok("/v1/chat/completions", &p);
    assert_eq!(message(&spec), message(&plain), "{spec}\n{plain}");
    assert!(message(&spec).get("reasoning_content").is_none(), "{spec}");
    assert!(
        spec["timings"]["draft_n"].as_u64().unwrap_or(0) > 0,
        "speculation drafted nothing: {spec}"
    );
    let six = body(json!({"reasoning_budget_tokens": 6}));
    let spec = s.ok("/v1/chat/completions", &six);
    let mut p = six.clone();
    p["speculative"] = json!({"enabled": false});
    let plain = s.ok("/v1/chat/completions", &p);
    assert_eq!(message(&spec), message(&plain), "{spec}\n{plain}");
    // The server's budget and message; a request's budget wins (Anthropic's
    // `thinking.budget_tokens` included); a budget below -1 is refused.
    let d = Server::start(&[
        "--chat-template",
        XML_TEMPLATE,
        "--reasoning-budget",
        "0",
        "--reasoning-budget-message",
        " Enough.",
    ]);
    let v = d.ok("/v1/chat/completions", &body(json!({})));
    assert_eq!(message(&v)["reasoning_content"], "Enough.", "{v}");
    let a = d.ok(
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": "def main():"}], "max_tokens": 40,
            "temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 6}}),
    );
    // Its answer is the chat answer under the same budget, not the server's.
    let c6 = message(&d.ok(
        "/v1/chat/completions",
        &body(json!({"reasoning_budget_tokens": 6})),
    ));
    assert_eq!(
        a["content"][0]["thinking"], c6["reasoning_content"],
        "{a}\n{c6}"
    );
    assert_eq!(a["content"][1]["text"], c6["content"], "{a}\n{c6}");
    assert_ne!(c6["content"], message(&v)["content"], "{c6}\n{v}");
    let r = d.post(
        "/v1/chat/completions",
        &body(json!({"reasoning_budget_tokens": -2})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn reasoning_flags() {
    // --reasoning off: templates get enable_thinking false.
    let s = Server::start(&["--chat-template", XML_TEMPLATE, "-rea", "off"]);
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    );
    assert!(
        v["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{v}"
    );
    let p = s.ok(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert!(
        p["prompt"].as_str().unwrap_or("").ends_with("</think>\n\n"),
        "{p}"
    );
    // --reasoning-format none: thoughts stay in the content.
    let s = Server::start(&[
        "--chat-template",
        XML_TEMPLATE,
        "--reasoning-format",
        "none",
    ]);
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
    );
    assert!(
        v["choices"][0]["message"]
            .get("reasoning_content")
            .is_none(),
        "{v}"
    );
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "reasoning_format": "bogus"}),
    );
    assert_error(&r, 400, "invalid_request_error");
}

#[test]
fn bad_tool_requests_are_400() {
    let s = Server::start(&["--chat-template", XML_TEMPLATE]);
    for extra in [
        json!({"tool_choice": "sometimes"}),
        json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        json!({"tool_choice": 3}),
        json!({"tools": [{"type": "function", "function": {}}]}),
        json!({"tools": {"a": 1}}),
        json!({"grammar": "root ::= \"x\""}),
    ] {
        let r = s.post("/v1/chat/completions", &request(extra.clone()));
        assert_error(&r, 400, "invalid_request_error");
    }
    let mut b = request(json!({"tool_choice": "required"}));
    b["tools"] = json!([]);
    assert_error(
        &s.post("/v1/chat/completions", &b),
        400,
        "invalid_request_error",
    );
    // The server still serves.
    s.ok(
        "/v1/chat/completions",
        &request(json!({"tool_choice": "none", "max_tokens": 4})),
    );
}

#[test]
fn openai_client_reads_tool_calls() {
    let s = Server::start(&["--chat-template", XML_TEMPLATE]);
    let out = common::python::run_client_script("openai_tools.py", &s.addr, &[]);
    assert!(out.contains("ok"), "{out}");
}
