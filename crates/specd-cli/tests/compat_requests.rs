//! llama-server compatibility of requests and responses (issue 17, items 3–5): every prompt form
//! of `/completion`, chat prefill and `continue_final_message`, the chat requests llama-server
//! refuses and the ones it takes, `/chat/completions/input_tokens`, token counts,
//! `timings_per_token`, `return_progress` and `__verbose`. Shapes, statuses and messages were
//! read off a running llama-server on the same kind of model (qwen35, ChatML template).

use serde_json::{json, Value};

mod common;
use common::http::*;
use common::Server;

const TEXT: &str = "I believe the meaning of life is";

/// Streamed JSON payloads (the closing `[DONE]` left out).
fn chunks(r: &Resp) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.text());
    r.events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap_or_else(|_| panic!("not JSON: {e}")))
        .collect()
}

fn error_message(r: &Resp) -> String {
    let v = assert_error(r, 400, "invalid_request_error");
    v["error"]["message"].as_str().unwrap().to_string()
}

#[test]
fn every_prompt_form_of_completion() {
    let s = Server::start(&["-c", "512", "-np", "2", "--temp", "0"]);
    let toks = tokens(&s.ok("/tokenize", &json!({"content": TEXT, "add_special": true})));
    let ask = |prompt: Value| json!({"prompt": prompt, "n_predict": 6, "ignore_eos": true});

    // One prompt: text, token ids, the JSON object form: one object, the same continuation.
    let one = s.ok("/completion", &ask(json!(TEXT)));
    let content = one["content"].as_str().unwrap().to_string();
    assert!(!content.is_empty());
    for p in [json!(toks), json!({"prompt_string": TEXT}), json!([TEXT])] {
        let v = s.ok("/completion", &ask(p.clone()));
        assert!(v.is_object(), "{p}: {v}");
        assert_eq!(v["content"], content, "{p}");
        assert_eq!(v["tokens_evaluated"], toks.len(), "{p}");
    }

    // A list of prompts: one result each, in order, `index` telling them apart.
    for list in [
        json!([toks, toks]),
        json!([toks, TEXT]),
        json!([toks, {"prompt_string": TEXT}]),
        json!([TEXT, [TEXT]]),
    ] {
        let v = s.ok("/completion", &ask(list.clone()));
        let a = v.as_array().unwrap_or_else(|| panic!("{list}: {v}"));
        assert_eq!(a.len(), 2, "{list}");
        for (i, r) in a.iter().enumerate() {
            assert_eq!(r["index"], i, "{list}");
            assert_eq!(r["content"], content, "{list}");
        }
    }

    // Token ids mixed with text in one prompt: BOS-free text pieces, ids kept as given.
    let mixed = s.ok("/completion", &ask(json!([1, 2, 3, TEXT, 4])));
    assert_eq!(mixed["tokens_evaluated"], 4 + toks.len());
    let mixed2 = s.ok("/completion", &ask(json!({"prompt_string": [5, TEXT]})));
    assert_eq!(mixed2["tokens_evaluated"], 1 + toks.len());

    // An empty prompt is answered at once, nothing generated (llama-server).
    for p in [json!(""), json!([[]])] {
        let v = s.ok("/completion", &ask(p.clone()));
        assert_eq!(v["content"], "", "{p}");
        assert_eq!(v["tokens_predicted"], 0, "{p}");
        assert_eq!(v["tokens_evaluated"], 0, "{p}");
        assert_eq!(v["stop_type"], "none", "{p}");
        assert_eq!(v["stop"], true, "{p}");
    }
    let v = s.ok("/v1/completions", &json!({"prompt": "", "max_tokens": 3}));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 0);

    // What llama-server refuses, with its messages.
    let elements = "\"prompt\" elements must be a string, a list of tokens, a JSON object containing a prompt string, or a list of mixed strings & tokens.";
    for (p, msg) in [
        (json!({"foo": "x"}), elements),
        (json!([1.5]), elements),
        (json!(["a", true]), elements),
        (json!(5), elements),
        (json!([]), "\"prompt\" must not be empty"),
        (json!([999_999]), "Prompt contains invalid tokens"),
        (json!([-1]), "Prompt contains invalid tokens"),
        (
            json!({"prompt_string": TEXT, "multimodal_data": ["AAAA"]}),
            "Multimodal data provided, but model does not support multimodal requests.",
        ),
    ] {
        let m = error_message(&s.post("/completion", &ask(p.clone())));
        assert!(m.starts_with(msg), "{p}: {m}");
    }
    let m = error_message(&s.post("/completion", &json!({"n_predict": 2})));
    assert!(m.contains("prompt"), "{m}");

    // The OpenAI completions endpoint reads prompts the same way: one choice per prompt.
    let v = s.ok(
        "/v1/completions",
        &json!({"prompt": [toks, {"prompt_string": TEXT}], "max_tokens": 6, "ignore_eos": true}),
    );
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], content);
    }
    // llama-server reports the first prompt's usage, not the sum.
    assert_eq!(v["usage"]["prompt_tokens"], toks.len());

    // Streamed, several prompts interleave; each has its own final object.
    let r = s.post(
        "/completion",
        &json!({"prompt": [TEXT, toks], "n_predict": 6, "ignore_eos": true, "stream": true}),
    );
    let cs = chunks(&r);
    for i in 0..2 {
        let mine: Vec<&Value> = cs.iter().filter(|c| c["index"] == i).collect();
        let text: String = mine
            .iter()
            .filter(|c| c["stop"] == false)
            .map(|c| c["content"].as_str().unwrap())
            .collect();
        assert_eq!(text, content, "prompt {i}");
        let last = mine.last().unwrap();
        assert_eq!(last["stop"], true);
        assert_eq!(last["tokens_predicted"], 6);
    }
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": [TEXT, TEXT], "max_tokens": 3, "ignore_eos": true, "stream": true}),
    );
    assert_eq!(r.events().last().unwrap(), "[DONE]");
    let finals: Vec<Value> = chunks(&r)
        .into_iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .map(|c| c["choices"][0]["index"].clone())
        .collect();
    assert_eq!(finals.len(), 2);
}

/// Token counts as llama-server counts them: the end-of-generation token is sampled, so it
/// counts as predicted (and is in `tokens` and streams as a chunk of its own).
#[test]
fn end_of_generation_token_counts() {
    let s = Server::start(&["-c", "512", "-np", "1", "--temp", "0"]);
    let eog = tokens(&s.ok("/tokenize", &json!({"content": "<|im_end|>"})))[0];
    let yes = json!({"prompt": "hi", "n_predict": 20, "grammar": "root ::= \"yes\"",
                     "return_tokens": true});
    let v = s.ok("/completion", &yes);
    assert_eq!(v["content"], "yes");
    assert_eq!(v["stop_type"], "eos");
    let t = tokens(&v);
    assert_eq!(*t.last().unwrap(), eog, "{v}");
    let n = t.len();
    assert_eq!(v["tokens_predicted"], n);
    assert_eq!(v["timings"]["predicted_n"], n);
    // The slot holds the prompt and every sampled token but the last.
    assert_eq!(
        v["tokens_cached"],
        v["tokens_evaluated"].as_u64().unwrap() as usize + n - 1
    );

    let mut st = yes.clone();
    st["stream"] = json!(true);
    st["timings_per_token"] = json!(true);
    let cs = chunks(&s.post("/completion", &st));
    let partial: Vec<&Value> = cs.iter().filter(|c| c["stop"] == false).collect();
    let last = partial.last().unwrap();
    assert_eq!(last["content"], "");
    assert_eq!(last["tokens"], json!([eog]));
    assert_eq!(last["tokens_predicted"], n);
    assert_eq!(last["timings"]["predicted_n"], n);
    assert_eq!(cs.last().unwrap()["tokens_predicted"], n);

    let v = s.ok(
        "/v1/completions",
        &json!({"prompt": "hi", "max_tokens": 20, "grammar": "root ::= \"yes\""}),
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert_eq!(v["usage"]["total_tokens"], 1 + n);
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20,
                "grammar": "root ::= \"yes\""}),
    );
    assert_eq!(v["choices"][0]["message"]["content"], "yes");
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert_eq!(v["timings"]["predicted_n"], n);
}

fn template(s: &Server, body: Value) -> Resp {
    s.post("/apply-template", &body)
}

fn prompt_of(s: &Server, body: Value) -> String {
    let r = template(s, body.clone());
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()["prompt"].as_str().unwrap().to_string()
}

#[test]
fn chat_prefill_and_continue_final_message() {
    let s = Server::start(&["-c", "512", "-np", "1", "--temp", "0"]);
    let user = json!({"role": "user", "content": "What is the best book"});
    let head = "<|im_start|>user\nWhat is the best book<|im_end|>\n<|im_start|>assistant\n";

    // A final assistant message is continued, not closed (llama-server's default).
    let prefill = json!([user, {"role": "assistant", "content": "Whill"}]);
    assert_eq!(
        prompt_of(&s, json!({"messages": prefill})),
        format!("{head}Whill")
    );
    // Its text parts are joined by a blank line; a user message's by a newline.
    let parts = json!([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]);
    assert_eq!(
        prompt_of(
            &s,
            json!({"messages": [user, {"role": "assistant", "content": parts}]})
        ),
        format!("{head}Wh\n\nill")
    );
    assert_eq!(
        prompt_of(
            &s,
            json!({"messages": [{"role": "user", "content": parts}]})
        ),
        "<|im_start|>user\nWh\nill<|im_end|>\n<|im_start|>assistant\n"
    );
    // vLLM's explicit form gives the same prompt; with a generation prompt it is refused.
    assert_eq!(
        prompt_of(
            &s,
            json!({"messages": prefill, "continue_final_message": true,
                   "add_generation_prompt": false})
        ),
        format!("{head}Whill")
    );
    for body in [
        json!({"messages": prefill, "continue_final_message": true}),
        json!({"messages": prefill, "continue_final_message": true, "add_generation_prompt": true}),
    ] {
        let r = template(&s, body.clone());
        assert_eq!(
            error_message(&r),
            "Cannot set both add_generation_prompt and continue_final_message to true."
        );
        let mut chat = body;
        chat["max_tokens"] = json!(2);
        let r = s.post("/v1/chat/completions", &chat);
        assert_eq!(r.status, 400, "{}", r.text());
    }
    // No generation prompt at all.
    assert_eq!(
        prompt_of(
            &s,
            json!({"messages": [user], "add_generation_prompt": false})
        ),
        "<|im_start|>user\nWhat is the best book<|im_end|>\n"
    );
    // Two assistant messages at the end: refused, unless the continuation is explicit.
    let two = json!([user, {"role": "assistant", "content": "A"},
                     {"role": "assistant", "content": "B"}]);
    assert_eq!(
        error_message(&template(&s, json!({"messages": two}))),
        "Cannot have 2 or more assistant messages at the end of the list."
    );
    assert!(prompt_of(
        &s,
        json!({"messages": two, "continue_final_message": true, "add_generation_prompt": false})
    )
    .ends_with("A<|im_end|>\n<|im_start|>assistant\nB"));
    let calls = json!([user, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]);
    assert_eq!(
        error_message(&template(&s, json!({"messages": calls}))),
        "Cannot continue an assistant message that contains tool calls."
    );

    // The generation continues the prefill: `__verbose` shows the prompt it was given.
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": prefill, "max_tokens": 2, "verbose": true}),
    );
    assert_eq!(v["__verbose"]["prompt"], format!("{head}Whill"));

    // --no-prefill-assistant: a final assistant message is closed and answered.
    let s = Server::start(&["-c", "512", "-np", "1", "--no-prefill-assistant"]);
    assert_eq!(
        prompt_of(&s, json!({"messages": prefill})),
        format!("{head}Whill<|im_end|>\n<|im_start|>assistant\n")
    );
    assert_eq!(
        prompt_of(
            &s,
            json!({"messages": prefill, "continue_final_message": true,
                   "add_generation_prompt": false})
        ),
        format!("{head}Whill")
    );
}

/// A template that writes reasoning in assistant turns: the continued turn is laid out as the
/// template lays out reasoning and content (as llama-server lays it out for such templates).
#[test]
fn continuation_with_a_reasoning_template() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("think.jinja");
    std::fs::write(
        &path,
        "{%- for m in messages %}{%- if m.role == 'assistant' %}\
         {{- '<|im_start|>assistant\\n<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}\
         {%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}\
         {%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}",
    )
    .unwrap();
    let s = Server::start(&["-c", "512", "--chat-template-file", path.to_str().unwrap()]);
    let user = json!({"role": "user", "content": "What"});
    let head = "<|im_start|>user\nWhat<|im_end|>\n<|im_start|>assistant\n";
    let cases = [
        (
            json!({"role": "assistant", "content": "Whill"}),
            json!(null),
            "<think>\n\n</think>\n\nWhill",
        ),
        (
            json!({"role": "assistant", "content": "Whill", "reasoning_content": "hmm"}),
            json!(null),
            "<think>\nhmm\n</think>\n\nWhill",
        ),
        // Only reasoning: the reasoning is continued, left open.
        (
            json!({"role": "assistant", "content": "", "reasoning_content": "hmm"}),
            json!(null),
            "<think>\nhmm",
        ),
        (
            json!({"role": "assistant", "content": "Whill", "reasoning_content": "hmm"}),
            json!("reasoning_content"),
            "<think>\nhmm",
        ),
    ];
    for (last, part, want) in cases {
        let mut body = json!({"messages": [user, last]});
        if !part.is_null() {
            body["continue_final_message"] = part;
            body["add_generation_prompt"] = json!(false);
        }
        assert_eq!(
            prompt_of(&s, body.clone()),
            format!("{head}{want}"),
            "{body}"
        );
    }
}

#[test]
fn chat_requests_refused_and_accepted() {
    let s = Server::start(&["-c", "512", "-np", "1", "--temp", "0"]);
    // unit/test_chat_completion.py::test_invalid_chat_completion_req, with llama-server's
    // messages.
    let non_assistant = "All non-assistant messages must contain 'content'";
    for (messages, msg) in [
        (json!(null), "Expected 'messages' to be an array"),
        (json!("string"), "Expected 'messages' to be an array"),
        (json!([123]), non_assistant),
        (json!([{}]), non_assistant),
        (json!([{"role": 123}]), non_assistant),
        (
            json!([{"role": "system", "content": 123}]),
            "Expected 'content' to be a string or an array",
        ),
        (
            json!([{"role": "system", "content": "test"}, {}]),
            non_assistant,
        ),
        (
            json!([{"role": "user", "content": "test"}, {"role": "assistant", "content": "test"},
                   {"role": "assistant", "content": "test"}]),
            "Cannot have 2 or more assistant messages at the end of the list.",
        ),
        (
            json!([{"role": "assistant"}]),
            "Assistant message must contain either 'content' or 'tool_calls'!",
        ),
        (
            json!([{"role": "user", "content": [{"type": "foo"}]}]),
            "unsupported content[].type",
        ),
        (
            json!([{"role": "user", "content": {"a": 1}}]),
            "Expected 'content' to be a string or an array",
        ),
    ] {
        let r = s.post("/v1/chat/completions", &json!({"messages": messages}));
        assert_eq!(error_message(&r), msg, "{messages}");
    }
    let r = s.post("/v1/chat/completions", &json!({"max_tokens": 2}));
    assert!(error_message(&r).contains("messages"));
    // No message at all: llama-server renders the bare generation prompt and answers; specd
    // refuses it, as OpenAI does (tests/security.rs covers every endpoint).
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [], "max_tokens": 1}),
    );
    assert_eq!(
        error_message(&r),
        "'messages' must contain at least one message"
    );
    // Accepted by llama-server too: null content, any role name.
    for messages in [
        json!([{"role": "user", "content": null}]),
        json!([{"role": "narrator", "content": "x"}]),
        json!([{"role": "user", "content": "x", "name": "bob"}]),
    ] {
        let v = s.ok(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 1}),
        );
        assert_eq!(v["object"], "chat.completion", "{messages}");
    }

    // Token count of a chat request, without generating.
    let messages = json!([{"role": "system", "content": "Book"},
                          {"role": "user", "content": "What is the best book"}]);
    let prompt = prompt_of(&s, json!({"messages": messages}));
    let n = tokens(&s.ok(
        "/tokenize",
        &json!({"content": prompt, "add_special": true}),
    ))
    .len();
    for path in [
        "/chat/completions/input_tokens",
        "/v1/chat/completions/input_tokens",
    ] {
        let v = s.ok(path, &json!({"messages": messages}));
        assert_eq!(
            v,
            json!({"input_tokens": n, "object": "response.input_tokens"})
        );
    }
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1}),
    );
    assert_eq!(v["usage"]["prompt_tokens"], n);
    let r = s.post(
        "/v1/chat/completions/input_tokens",
        &json!({"messages": "x"}),
    );
    assert_eq!(error_message(&r), "Expected 'messages' to be an array");
}

#[test]
fn timings_per_token_and_verbose() {
    let s = Server::start(&["-c", "512", "-np", "1", "--temp", "0"]);
    let messages = json!([{"role": "system", "content": "Book"},
                          {"role": "user", "content": "What is the best book"}]);
    // unit/test_chat_completion.py::test_chat_completion_with_timings_per_token
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 6, "ignore_eos": true, "stream": true,
                "stream_options": {"include_usage": true}, "timings_per_token": true}),
    );
    let cs = chunks(&r);
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(cs[0]["choices"][0]["delta"]["content"].is_null());
    assert!(cs[0].get("timings").is_none(), "{}", cs[0]);
    let mut seen = 0;
    for c in &cs[1..] {
        if let Some(ch) = c["choices"].as_array().and_then(|a| a.first()) {
            assert!(ch["delta"].get("role").is_none(), "{c}");
            if ch["delta"]["content"].is_string() {
                let n = c["timings"]["predicted_n"].as_u64().unwrap();
                assert!(n > seen, "{c}");
                seen = n;
                assert!(c["timings"]["prompt_per_second"].is_number());
            }
        } else {
            assert_eq!(c["usage"]["completion_tokens"], 6);
            assert_eq!(c["timings"]["predicted_n"], 6);
        }
    }
    assert_eq!(seen, 6);
    // `timings` holds numbers only (unit/test_metrics.py::test_metrics_timings_are_finite);
    // specd's speculation statistics are next to it.
    let v = s.ok("/completion", &json!({"prompt": TEXT, "n_predict": 4}));
    let t = v["timings"].as_object().unwrap();
    assert!(
        t.values().all(|x| x.as_f64().is_some_and(|x| x >= 0.0)),
        "{t:?}"
    );
    assert!(v["speculative"]["acceptance_rate"].is_number(), "{v}");
    // Without timings_per_token only the last chunk has timings.
    let cs = chunks(&s.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 3, "stream": true}),
    ));
    let with: Vec<usize> = (0..cs.len())
        .filter(|&i| cs[i].get("timings").is_some())
        .collect();
    assert_eq!(with, vec![cs.len() - 1]);
    // /completion streams carry them too.
    let cs = chunks(&s.post(
        "/completion",
        &json!({"prompt": TEXT, "n_predict": 3, "ignore_eos": true, "stream": true,
                "timings_per_token": true}),
    ));
    assert!(cs
        .iter()
        .all(|c| c["timings"]["predicted_n"] == c["tokens_predicted"]));

    // unit/test_chat_completion.py::test_verbose_debug: `__verbose` is the llama-server form.
    for verbose in [true, false] {
        let v = s.ok(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 2, "verbose": verbose}),
        );
        if verbose {
            let vb = &v["__verbose"];
            assert!(vb["prompt"].as_str().unwrap().contains("Book"), "{vb}");
            assert_eq!(vb["content"], v["choices"][0]["message"]["content"]);
            assert_eq!(vb["tokens_predicted"], v["usage"]["completion_tokens"]);
            assert_eq!(vb["stop"], true);
        } else {
            assert!(v.get("__verbose").is_none(), "{v}");
        }
    }
    let v = s.ok(
        "/v1/completions",
        &json!({"prompt": TEXT, "max_tokens": 2, "verbose": true}),
    );
    assert_eq!(v["__verbose"]["content"], v["choices"][0]["text"]);
    let cs = chunks(&s.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 2, "stream": true, "verbose": true}),
    ));
    let fin = cs
        .iter()
        .find(|c| !c["choices"][0]["finish_reason"].is_null())
        .unwrap();
    assert!(fin["__verbose"]["prompt"]
        .as_str()
        .unwrap()
        .contains("Book"));

    // --verbose makes it the default; a request can still say no.
    let s = Server::start(&["-c", "512", "-np", "1", "--verbose"]);
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1}),
    );
    assert!(v["__verbose"]["prompt"].is_string(), "{v}");
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 1, "verbose": false}),
    );
    assert!(v.get("__verbose").is_none());
}

/// `prompt_progress` chunks while the prompt is processed, one per batch of `-b` rows.
#[test]
fn return_progress_streams_prompt_progress() {
    const BATCH: usize = 16;
    let s = Server::start(&["-c", "512", "-np", "1", "-b", "16", "--temp", "0"]);
    let content = "This is a test".repeat(12);
    let body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 3,
                      "stream": true, "return_progress": true});
    let progress = |cs: &[Value]| -> Vec<Value> {
        cs.iter()
            .filter_map(|c| c.get("prompt_progress").cloned())
            .collect()
    };

    // unit/test_chat_completion.py::test_return_progress, for a prompt without and with a
    // cached prefix.
    for (turn, cached) in [(0, false), (1, true)] {
        let cs = chunks(&s.post("/v1/chat/completions", &body));
        let p = progress(&cs);
        let total = p[0]["total"].as_u64().unwrap() as usize;
        let cache = p[0]["cache"].as_u64().unwrap() as usize;
        assert!(total > 4 * BATCH, "{total}");
        assert_eq!(p[0]["processed"], p[0]["cache"]);
        assert_eq!(p[0]["time_ms"], 0);
        assert_eq!(cache > 0, cached, "turn {turn}: {p:?}");
        for w in p.windows(2) {
            assert_eq!(w[1]["total"], total);
            assert_eq!(w[1]["cache"], cache);
            assert!(
                w[1]["processed"].as_u64() > w[0]["processed"].as_u64(),
                "{p:?}"
            );
            assert!(w[1]["time_ms"].as_u64() >= w[0]["time_ms"].as_u64());
        }
        assert_eq!(p.last().unwrap()["processed"], total);
        // The prompt but its last token is processed in batches; the last batch is reported
        // with the last token.
        let batches = (total - 1 - cache).div_ceil(BATCH);
        assert_eq!(p.len(), 1 + batches.max(1), "turn {turn}: {p:?}");
        // Progress chunks are role chunks and come before any text.
        let first_text = cs
            .iter()
            .position(|c| c["choices"][0]["delta"]["content"].is_string())
            .unwrap();
        let last_progress = cs
            .iter()
            .rposition(|c| c.get("prompt_progress").is_some())
            .unwrap();
        assert!(last_progress < first_text);
        for c in cs.iter().filter(|c| c.get("prompt_progress").is_some()) {
            assert_eq!(
                c["choices"][0]["delta"],
                json!({"role": "assistant", "content": null})
            );
        }
    }

    // /completion and /v1/completions: their partial-result shapes with `prompt_progress`.
    let cs = chunks(&s.post(
        "/completion",
        &json!({"prompt": content, "n_predict": 2, "stream": true, "return_progress": true,
                "cache_prompt": false}),
    ));
    let p: Vec<&Value> = cs
        .iter()
        .filter(|c| c.get("prompt_progress").is_some())
        .collect();
    assert!(p.len() >= 2);
    for c in &p {
        assert_eq!(c["content"], "");
        assert_eq!(c["stop"], false);
        assert_eq!(c["tokens_predicted"], 0);
        assert_eq!(c["tokens_evaluated"], c["prompt_progress"]["total"]);
    }
    // With timings_per_token the progress chunks carry the prompt's timings so far
    // (unit/test_metrics.py::test_metrics_timings_on_prompt_progress).
    let cs = chunks(&s.post(
        "/completion",
        &json!({"prompt": content, "n_predict": 2, "stream": true, "return_progress": true,
                "timings_per_token": true, "cache_prompt": false}),
    ));
    let t: Vec<&Value> = cs
        .iter()
        .filter(|c| c.get("prompt_progress").is_some())
        .map(|c| &c["timings"])
        .collect();
    assert!(t.len() > 2);
    assert_eq!(t[0]["prompt_n"], 0);
    assert_eq!(t[0]["prompt_ms"], 0.0);
    assert_eq!(t[0]["predicted_n"], 0);
    for w in t.windows(2) {
        assert!(w[1]["prompt_ms"].as_f64() >= w[0]["prompt_ms"].as_f64());
        assert!(w[1]["prompt_n"].as_u64() > w[0]["prompt_n"].as_u64());
    }
    let p = &cs
        .iter()
        .rfind(|c| c.get("prompt_progress").is_some())
        .unwrap()["prompt_progress"];
    assert_eq!(t.last().unwrap()["prompt_n"], p["total"]);
    let cs = chunks(&s.post(
        "/v1/completions",
        &json!({"prompt": content, "max_tokens": 2, "stream": true, "return_progress": true}),
    ));
    let c = cs
        .iter()
        .find(|c| c.get("prompt_progress").is_some())
        .unwrap();
    assert_eq!(c["object"], "text_completion");
    assert_eq!(c["choices"][0]["text"], "");
    // Not asked for, or not streamed: none.
    let cs = chunks(&s.post(
        "/completion",
        &json!({"prompt": content, "n_predict": 2, "stream": true}),
    ));
    assert!(progress(&cs).is_empty());
    let v = s.ok(
        "/completion",
        &json!({"prompt": content, "n_predict": 2, "return_progress": true}),
    );
    assert!(v.get("prompt_progress").is_none());
}
