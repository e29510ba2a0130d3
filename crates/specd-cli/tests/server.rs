//! `specd serve` end to end: the real binary on a tiny generated qwen35 model, on a free
//! loopback port, spoken to over real HTTP (a small HTTP/1.1 client below, so tests can also
//! misbehave: send oversized bodies, drop a stream half-way).

use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::http::*;
use common::{Server, BIN};

const PROMPT: &str = "def fibonacci(n):\n    if n < 2:\n        return n\n";

#[test]
fn info_endpoints() {
    let s = Server::start(&[
        "-c",
        "256",
        "-np",
        "2",
        "--metrics",
        "--alias",
        "tiny",
        "--tags",
        "a,b",
    ]);
    assert_eq!(s.get("/health").json(), json!({"status": "ok"}));
    let m = s.get("/v1/models").json();
    assert_eq!(m["object"], "list");
    assert_eq!(m["data"][0]["id"], "tiny");
    assert_eq!(m["data"][0]["tags"], json!(["a", "b"]));
    assert_eq!(m["data"][0]["meta"]["n_vocab"], 1030);

    let p = s.get("/props").json();
    assert_eq!(p["total_slots"], 2);
    let held = p["specd"]["weight_bytes"].as_u64().unwrap();
    let file = p["specd"]["file_weight_bytes"].as_u64().unwrap();
    assert!(
        file > 0 && held.abs_diff(file) * 20 <= file,
        "{held} vs {file}"
    );
    assert_eq!(m["data"][0]["meta"]["size"], file);
    // The backend that runs the model and what it holds there.
    assert_eq!(p["specd"]["device"]["backend"], "cpu");
    assert_eq!(p["specd"]["device"]["weight_bytes"], held);
    assert!(p["specd"]["device"]["name"]
        .as_str()
        .unwrap()
        .starts_with("CPU"));
    assert_eq!(p["default_generation_settings"]["n_ctx"], 128);
    assert!(p["chat_template"].as_str().unwrap().contains("im_start"));

    let slots = s.get("/slots").json();
    assert_eq!(slots.as_array().unwrap().len(), 2);
    assert_eq!(slots[0]["is_processing"], false);

    // tokenize / detokenize round trip, pieces, special tokens.
    let t = s.ok("/tokenize", &json!({"content": "hello world"}));
    let ids = tokens(&t);
    assert!(!ids.is_empty());
    let d = s.ok("/detokenize", &json!({"tokens": ids}));
    assert_eq!(d["content"], "hello world");
    let t = s.ok(
        "/tokenize",
        &json!({"content": "hello world", "with_pieces": true}),
    );
    let pieces: String = t["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["piece"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(pieces, "hello world");
    let t = s.ok("/tokenize", &json!({"content": "<|im_start|>user"}));
    let special = s.ok("/tokenize", &json!({"content": "<|im_start|>"}));
    assert_eq!(tokens(&special).len(), 1, "control tokens are parsed");
    assert_eq!(tokens(&t)[0], tokens(&special)[0]);

    let a = s.ok(
        "/apply-template",
        &json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(
        a["prompt"],
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );

    let r = s.get("/no/such/endpoint");
    assert_error(&r, 404, "not_found_error");
    // CORS: a loopback origin is reflected, another is not (specd's default; llama-server
    // reflects any origin, which `--cors-origins '*'` restores).
    let origin = |o: &str| {
        let r = request(&s.addr, "GET", "/health", &[("Origin", o)], None);
        r.header("access-control-allow-origin").map(str::to_string)
    };
    assert_eq!(
        origin("http://localhost:8080").as_deref(),
        Some("http://localhost:8080")
    );
    assert_eq!(origin("http://example.test"), None);
}

#[test]
fn completion_streaming_and_not() {
    // Plain decoding: the timings without draft counts (speculation is on by default).
    let s = Server::start(&["-c", "512", "-np", "2", "--metrics", "--spec-type", "none"]);
    let base = json!({"prompt": PROMPT, "n_predict": 12, "temperature": 0, "return_tokens": true, "ignore_eos": true});
    let v = s.ok("/completion", &base);
    let toks = tokens(&v);
    assert_eq!(toks.len(), 12);
    assert_eq!(v["stop"], true);
    assert_eq!(v["stop_type"], "limit");
    assert_eq!(v["stopping_word"], "");
    assert_eq!(v["tokens_predicted"], 12);
    let n_prompt = tokens(&s.ok(
        "/tokenize",
        &json!({"content": PROMPT, "add_special": true}),
    ))
    .len();
    assert_eq!(v["tokens_evaluated"], n_prompt);
    assert_eq!(v["truncated"], false);
    assert!(v["model"].as_str().unwrap().ends_with("tiny.gguf"));
    assert!(v["id_slot"].as_u64().unwrap() < 2);
    let t = &v["timings"];
    for k in [
        "prompt_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ] {
        assert!(t[k].is_number(), "timings.{k} missing: {t}");
    }
    assert_eq!(t["predicted_n"], 12);
    // No draft verified: no draft counts (as llama-server); specd's statistics sit next to it.
    assert!(t.get("draft_n").is_none(), "{t}");
    assert!(v["speculative"]["acceptance_length"].is_number());
    let text = v["content"].as_str().unwrap().to_string();
    // The text is the detokenized tokens.
    let d = s.ok("/detokenize", &json!({"tokens": toks}));
    assert_eq!(d["content"], text);

    // Streamed: same tokens and text, a final object with stop and timings.
    let mut sb = base.clone();
    sb["stream"] = json!(true);
    sb["cache_prompt"] = json!(false);
    let r = s.post("/completion", &sb);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let evs: Vec<Value> = r
        .events()
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let last = evs.last().unwrap();
    assert_eq!(last["stop"], true);
    assert_eq!(last["stop_type"], "limit");
    assert_eq!(last["timings"]["predicted_n"], 12);
    let streamed: String = evs.iter().map(|e| e["content"].as_str().unwrap()).collect();
    assert_eq!(streamed, text);
    let stoks: Vec<u64> = evs[..evs.len() - 1].iter().flat_map(tokens).collect();
    assert_eq!(stoks, toks);
    assert!(evs[..evs.len() - 1].iter().all(|e| e["stop"] == false));

    // A stop word (a character that first appears after the start): the text ends before it,
    // stop_type "word".
    let sb =
        json!({"prompt": "def fib(n):", "n_predict": 24, "temperature": 0, "ignore_eos": true});
    let full = s.ok("/completion", &sb)["content"]
        .as_str()
        .unwrap()
        .to_string();
    let (at, ch) = full
        .char_indices()
        .find(|&(i, c)| i > 0 && c != '\u{fffd}' && !c.is_whitespace() && !full[..i].contains(c))
        .unwrap_or_else(|| panic!("no usable stop word in {full:?}"));
    let mut b = sb.clone();
    b["stop"] = json!(["never-generated", ch.to_string()]);
    let w = s.ok("/completion", &b);
    assert_eq!(w["stop_type"], "word", "{w}");
    assert_eq!(w["stopping_word"], ch.to_string());
    assert_eq!(w["content"].as_str().unwrap(), &full[..at]);

    // Token-id prompt, n_probs.
    let ids = tokens(&s.ok(
        "/tokenize",
        &json!({"content": PROMPT, "add_special": true}),
    ));
    let v2 = s.ok(
        "/completion",
        &json!({"prompt": ids, "n_predict": 4, "temperature": 0, "return_tokens": true, "n_probs": 3, "ignore_eos": true}),
    );
    assert_eq!(tokens(&v2), toks[..4].to_vec());
    let probs = v2["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 4);
    for (p, t) in probs.iter().zip(&toks) {
        assert_eq!(p["id"], *t);
        assert_eq!(p["top_logprobs"].as_array().unwrap().len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(p["top_logprobs"][0]["id"], *t);
        assert!(p["logprob"].as_f64().unwrap() <= 0.0);
    }

    // A chosen slot; a slot that does not exist; n_predict 0 only evaluates the prompt.
    let v3 = s.ok(
        "/completion",
        &json!({"prompt": "x", "n_predict": 2, "id_slot": 1}),
    );
    assert_eq!(v3["id_slot"], 1);
    let r = s.post(
        "/completion",
        &json!({"prompt": "x", "n_predict": 2, "id_slot": 7}),
    );
    assert_error(&r, 400, "invalid_request_error");
    let v4 = s.ok(
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 0, "return_tokens": true}),
    );
    assert_eq!(v4["tokens_predicted"], 0);
    assert_eq!(v4["content"], "");

    // Several prompts at once: an array of results, each the same as alone.
    let many = s.ok(
        "/completion",
        &json!({"prompt": [PROMPT, "class Stack:"], "n_predict": 12, "temperature": 0, "return_tokens": true, "ignore_eos": true}),
    );
    let many = many.as_array().unwrap();
    assert_eq!(many.len(), 2);
    assert_eq!(tokens(&many[0]), toks);

    // OpenAI completions, streaming and not.
    let oc = s.ok(
        "/v1/completions",
        &json!({"model": "x", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(oc["object"], "text_completion");
    assert_eq!(oc["model"], "x");
    assert_eq!(oc["choices"][0]["text"], text);
    assert_eq!(oc["choices"][0]["finish_reason"], "length");
    assert_eq!(oc["usage"]["completion_tokens"], 12);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stream": true}),
    );
    let evs = r.events();
    assert_eq!(evs.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = evs[..evs.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[test]
fn chat_completions() {
    let s = Server::start(&["-c", "512", "-np", "2"]);
    let msgs = json!([{"role": "user", "content": "Write a function."}]);
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 10, "temperature": 0, "seed": 1}),
    );
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let c = &v["choices"][0];
    assert_eq!(c["message"]["role"], "assistant");
    let content = c["message"]["content"].as_str().unwrap().to_string();
    assert!(["stop", "length"].contains(&c["finish_reason"].as_str().unwrap()));
    let prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap();
    let rendered = s.ok("/apply-template", &json!({"messages": msgs}));
    let n = tokens(&s.ok(
        "/tokenize",
        &json!({"content": rendered["prompt"], "add_special": true}),
    ))
    .len();
    assert_eq!(prompt_tokens as usize, n);
    assert!(v["timings"]["predicted_n"].as_u64().unwrap() <= 10);

    // Streamed: role chunk first, content chunks, finish chunk, usage, [DONE].
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 10, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200);
    let evs = r.events();
    assert_eq!(evs.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = evs[..evs.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, content);
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], c["finish_reason"]);
    // llama-server puts `timings` on the last chunk: the usage chunk when there is one.
    assert!(chunks.last().unwrap()["timings"]["predicted_n"].is_number());
    assert_eq!(
        chunks.last().unwrap()["usage"]["prompt_tokens"],
        prompt_tokens
    );

    // logprobs / top_logprobs.
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 3, "temperature": 0, "logprobs": true, "top_logprobs": 2}),
    );
    let lp = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        lp.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for e in lp {
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
        assert_eq!(e["top_logprobs"][0]["token"], e["token"]);
    }

    // response_format json_schema: the output follows the schema (grammar-constrained).
    let schema =
        json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
    let v = s.ok(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 40, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}),
    );
    let out = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        let parsed: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert!(parsed["ok"].is_boolean(), "{out}");
    } else {
        assert!(out.starts_with("{\"ok\":"), "{out}");
    }
}

/// Speculation on (the server default here) and off give the same tokens, greedy and seeded.
#[test]
fn speculation_on_off_identical() {
    let s = Server::start(&[
        "-c",
        "512",
        "-np",
        "2",
        "--spec-type",
        "ngram-simple,ngram-map-k",
        "--spec-draft-n-max",
        "8",
        "--metrics",
    ]);
    let mut accepted = 0;
    for (temp, seed) in [(0.0, 0), (0.9, 7), (1.2, 12345)] {
        for prompt in [PROMPT, "aaaa bbbb aaaa bbbb aaaa"] {
            let body = |spec: Value| {
                let mut b = json!({"prompt": prompt, "n_predict": 40, "temperature": temp, "seed": seed,
                    "top_k": 0, "top_p": 1.0, "min_p": 0.0, "return_tokens": true, "ignore_eos": true,
                    "cache_prompt": false});
                if let Some(o) = spec.as_object() {
                    for (k, v) in o {
                        b[k] = v.clone();
                    }
                }
                b
            };
            let on = s.ok("/completion", &body(json!({})));
            let off = s.ok(
                "/completion",
                &body(json!({"speculative": {"enabled": false}})),
            );
            let off2 = s.ok("/completion", &body(json!({"speculative.type": "none"})));
            assert_eq!(tokens(&on), tokens(&off), "temp {temp} prompt {prompt:?}");
            assert_eq!(tokens(&off), tokens(&off2));
            assert!(off["timings"].get("draft_n").is_none(), "no draft verified");
            // Per-request n_max changes nothing but the speed.
            let n2 = s.ok(
                "/completion",
                &body(json!({"speculative.n_max": 2, "speculative.n_min": 1})),
            );
            assert_eq!(tokens(&n2), tokens(&on));
            accepted += on["timings"]["draft_n_accepted"].as_u64().unwrap_or(0);
        }
    }
    assert!(
        accepted > 0,
        "speculation never accepted a draft: the test would prove nothing"
    );
    let m = s.metrics();
    assert!(metric(&m, "llamacpp:spec_decode_num_accepted_tokens_total") >= accepted as f64);
    // Weight memory against the file's tensor bytes (an F32 model: held as mapped, the same).
    let (held, file) = (
        metric(&m, "specd:weight_bytes"),
        metric(&m, "specd:weight_file_bytes"),
    );
    assert!(
        file > 0.0 && (held - file).abs() <= 0.05 * file,
        "{held} vs {file}"
    );
}

/// Four clients at once get exactly what each gets alone, and really share steps.
#[test]
fn parallel_clients_match_sequential() {
    let s = Arc::new(Server::start(&[
        "-c",
        "1024",
        "-np",
        "4",
        "--metrics",
        "--spec-type",
        "ngram-simple",
    ]));
    let prompts = [
        PROMPT,
        "class Stack:\n    def push(self, x):",
        "aaaa bbbb aaaa",
        "The quick brown fox",
    ];
    let body = |p: &str, i: usize| {
        json!({"prompt": p, "n_predict": 300, "temperature": if i.is_multiple_of(2) { 0.0 } else { 0.8 },
               "seed": 100 + i, "return_tokens": true, "ignore_eos": true, "cache_prompt": false})
    };
    let steps = || metric(&s.metrics(), "llamacpp:n_decode_total");
    let s0 = steps();
    let alone: Vec<Vec<u64>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| tokens(&s.ok("/completion", &body(p, i))))
        .collect();
    let before = steps();
    let sequential = before - s0;
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let s = s.clone();
            let b = body(p, i);
            std::thread::spawn(move || tokens(&s.ok("/completion", &b)))
        })
        .collect();
    let together: Vec<Vec<u64>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(together, alone);
    let m = s.metrics();
    assert_eq!(metric(&m, "llamacpp:requests_processing"), 0.0);
    // Sharing steps: far fewer than the same requests one after the other.
    let together_steps = metric(&m, "llamacpp:n_decode_total") - before;
    assert!(
        together_steps < sequential * 0.6,
        "{together_steps} steps together vs {sequential} alone: requests did not share batches"
    );
    assert!(metric(&m, "llamacpp:n_busy_slots_per_decode") > 1.0);
}

/// A follow-up request reuses the slot's memory: only the new tokens are processed, and the
/// output is the same as without reuse.
#[test]
fn prompt_reuse_across_turns() {
    let s = Server::start(&["-c", "1024", "-np", "1", "--metrics"]);
    let p1 = tokens(&s.ok(
        "/tokenize",
        &json!({"content": PROMPT, "add_special": true}),
    ));
    let req = |p: &Vec<u64>, cache: bool| {
        json!({"prompt": p, "n_predict": 8, "temperature": 0, "return_tokens": true,
               "ignore_eos": true, "cache_prompt": cache})
    };
    let t1 = s.ok("/completion", &req(&p1, true));
    assert_eq!(t1["timings"]["prompt_n"], p1.len());
    let g1 = tokens(&t1);
    // Turn 2: the conversation so far plus new text.
    let new = tokens(&s.ok(
        "/tokenize",
        &json!({"content": "\ndef main():\n    print(fibonacci(10))\n"}),
    ));
    let mut p2 = p1.clone();
    p2.extend(&g1);
    p2.extend(&new);
    let t2 = s.ok("/completion", &req(&p2, true));
    // Memory holds the prompt and all generated tokens but the last (sampled, never fed).
    let cached = p1.len() + g1.len() - 1;
    assert_eq!(t2["timings"]["cache_n"], cached, "{}", t2["timings"]);
    // What the slot holds afterwards (llama-server): the prompt and the generated tokens but
    // the last.
    assert_eq!(t2["tokens_cached"], p2.len() + 8 - 1);
    assert_eq!(
        t2["timings"]["prompt_n"],
        p2.len() - cached,
        "only the new tokens are processed"
    );
    assert_eq!(t2["tokens_evaluated"], p2.len());

    // Turn 3 diverges right after turn 1's prompt: recurrent state cannot be cut back, so the
    // checkpoint taken at the end of turn 1's prompt is restored.
    let mut p3 = p1.clone();
    p3.extend(&new);
    let t3 = s.ok("/completion", &req(&p3, true));
    assert_eq!(t3["timings"]["cache_n"], p1.len() - 1, "{}", t3["timings"]);

    // Reuse changes nothing but the work done.
    let fresh2 = s.ok("/completion", &req(&p2, false));
    assert_eq!(fresh2["timings"]["prompt_n"], p2.len());
    assert_eq!(tokens(&t2), tokens(&fresh2));
    assert_eq!(tokens(&t3), tokens(&s.ok("/completion", &req(&p3, false))));
    let m = s.metrics();
    assert!(metric(&m, "specd:prompt_tokens_cached_total") >= (cached + p1.len() - 1) as f64);
    assert!(metric(&m, "specd:memory_checkpoints") >= 1.0);

    // Chat: the second turn of a conversation reuses the first.
    let mut msgs = vec![json!({"role": "user", "content": "Write fibonacci in Python."})];
    let c1 = s.ok(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 6, "temperature": 0}),
    );
    let n1 = c1["usage"]["prompt_tokens"].as_u64().unwrap();
    msgs.push(c1["choices"][0]["message"].clone());
    msgs.push(json!({"role": "user", "content": "Now in Rust."}));
    let c2 = s.ok(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 6, "temperature": 0}),
    );
    let cached = c2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= n1 - 1,
        "turn 2 reused {cached} of turn 1's {n1} prompt tokens"
    );
    assert_eq!(
        c2["timings"]["prompt_n"].as_u64().unwrap(),
        c2["usage"]["prompt_tokens"].as_u64().unwrap() - cached
    );
}

/// A client that disconnects mid-stream frees its slot at once.
#[test]
fn disconnect_frees_slot() {
    let s = Server::start(&["-c", "8192", "-np", "1", "--metrics", "--kv-unified"]);
    let body = json!({"prompt": PROMPT, "n_predict": 8000, "temperature": 0, "ignore_eos": true, "stream": true})
        .to_string();
    let mut r = open_stream(&s.addr, "/completion", &body);
    let mut got = 0;
    while got < 3 {
        let c = read_chunk(&mut r).expect("stream ended early");
        got += String::from_utf8_lossy(&c).matches("data: ").count();
    }
    let slots = s.get("/slots").json();
    assert_eq!(slots[0]["is_processing"], true, "{slots}");
    drop(r); // the client goes away
    let t0 = Instant::now();
    loop {
        let slots = s.get("/slots").json();
        if slots[0]["is_processing"] == false {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "slot still busy: {slots}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = s.metrics();
    assert_eq!(metric(&m, "specd:requests_cancelled_total"), 1.0);
    assert_eq!(
        metric(&m, "specd:requests_finished_total"),
        0.0,
        "it was cancelled, not finished"
    );
    // Its memory is freed and the slot serves the next request.
    assert_eq!(metric(&m, "specd:memory_sequences"), 0.0);
    let v = s.ok("/completion", &json!({"prompt": "x", "n_predict": 2}));
    assert_eq!(v["stop"], true);
}

#[test]
fn bad_inputs_get_openai_errors() {
    let s = Server::start(&["-c", "64", "-np", "1", "--metrics"]);
    // Malformed JSON, wrong body, wrong types.
    let r = request(
        &s.addr,
        "POST",
        "/completion",
        &[],
        Some(b"{\"prompt\": \"x\""),
    );
    assert_error(&r, 400, "invalid_request_error");
    let r = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        Some(b"[1, 2]"),
    );
    assert_error(&r, 400, "invalid_request_error");
    let r = request(&s.addr, "POST", "/completion", &[], Some(b""));
    assert_error(&r, 400, "invalid_request_error");
    for (path, body, field) in [
        (
            "/completion",
            json!({"prompt": "x", "temperature": "hot"}),
            "temperature",
        ),
        (
            "/completion",
            json!({"prompt": "x", "n_predict": "ten"}),
            "n_predict",
        ),
        ("/completion", json!({"prompt": {"a": 1}}), "prompt"),
        ("/completion", json!({"prompt": "x", "stop": 5}), "stop"),
        (
            "/completion",
            json!({"prompt": "x", "speculative.n_max": "many"}),
            "speculative.n_max",
        ),
        ("/completion", json!({"prompt": [1, 99999]}), "prompt"),
        ("/completion", json!({"n_predict": 3}), "prompt"),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            "messages",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}),
            "max_tokens",
        ),
        ("/tokenize", json!({"content": 5}), "content"),
        ("/detokenize", json!({"tokens": ["a"]}), "tokens"),
    ] {
        let r = s.post(path, &body);
        let v = assert_error(&r, 400, "invalid_request_error");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{body}: {v}"
        );
    }
    // Unsupported sampling options and bad grammars are refused, not ignored.
    let r = s.post("/completion", &json!({"prompt": "x", "mirostat": 2}));
    assert_error(&r, 400, "invalid_request_error");
    let r = s.post(
        "/completion",
        &json!({"prompt": "x", "grammar": "root ::= (((", "n_predict": 2}),
    );
    assert_error(&r, 400, "invalid_request_error");
    // A prompt longer than the context.
    let long = "word ".repeat(200);
    let r = s.post("/completion", &json!({"prompt": long}));
    let v = assert_error(&r, 400, "exceed_context_size_error");
    assert_eq!(v["error"]["n_ctx"], 64);
    assert!(v["error"]["n_prompt_tokens"].as_u64().unwrap() >= 64);
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": long}]}),
    );
    assert_error(&r, 400, "exceed_context_size_error");
    // An oversized body is refused before it is read.
    let mut c = connect(&s.addr);
    c.write_all(
        format!(
            "POST /completion HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{{\"prompt\": \"",
            s.addr,
            100 << 20
        )
        .as_bytes(),
    )
    .unwrap();
    let mut r = BufReader::new(c);
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 413);
    // Unknown endpoint; /metrics 501 on a server started without --metrics is checked below.
    assert_error(&s.get("/v2/nothing"), 404, "not_found_error");
    // The server is fine afterwards, and a generation works.
    assert_eq!(s.get("/health").json()["status"], "ok");
    let v = s.ok(
        "/completion",
        &json!({"prompt": "x", "n_predict": 3, "ignore_eos": true}),
    );
    assert_eq!(v["tokens_predicted"], 3);
    // A generation that runs into the context end stops there, truncated.
    let v = s.ok(
        "/completion",
        &json!({"prompt": "x y z", "n_predict": 500, "ignore_eos": true}),
    );
    assert_eq!(v["truncated"], true);
    assert_eq!(v["stop_type"], "limit");
    let m = s.metrics();
    assert!(metric(&m, "specd:requests_failed_total") >= 1.0);
    assert_eq!(metric(&m, "specd:engine_restarts_total"), 0.0);
}

#[test]
fn api_key_and_disabled_endpoints() {
    let s = Server::start(&["-c", "256", "--api-key", "k1,k2", "--no-slots"]);
    // Public endpoints; the model list needs a key, as in llama-server.
    assert_eq!(s.get("/health").status, 200);
    assert_error(&s.get("/v1/models"), 401, "authentication_error");
    // Missing or wrong key.
    let body = json!({"prompt": "x", "n_predict": 1}).to_string();
    let r = request(&s.addr, "POST", "/completion", &[], Some(body.as_bytes()));
    assert_error(&r, 401, "authentication_error");
    let r = request(
        &s.addr,
        "POST",
        "/completion",
        &[("Authorization", "Bearer nope")],
        Some(body.as_bytes()),
    );
    assert_error(&r, 401, "authentication_error");
    assert_error(&s.get("/props"), 401, "authentication_error");
    // Right keys, as Bearer (any route) or X-Api-Key (Anthropic's routes only).
    let r = request(
        &s.addr,
        "POST",
        "/completion",
        &[("Authorization", "Bearer k2")],
        Some(body.as_bytes()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(
        &s.addr,
        "POST",
        "/tokenize",
        &[("X-Api-Key", "k1")],
        Some(b"{\"content\": \"a\"}"),
    );
    assert_error(&r, 401, "authentication_error");
    let r = request(
        &s.addr,
        "POST",
        "/v1/messages/count_tokens",
        &[("X-Api-Key", "k1")],
        Some(br#"{"messages": [{"role": "user", "content": "a"}]}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // --no-slots, no --metrics: 501 not_supported_error.
    let r = request(
        &s.addr,
        "GET",
        "/slots",
        &[("Authorization", "Bearer k1")],
        None,
    );
    assert_error(&r, 501, "not_supported_error");
    let r = request(
        &s.addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer k1")],
        None,
    );
    assert_error(&r, 501, "not_supported_error");
}

#[test]
fn metrics_content() {
    let s = Server::start(&[
        "-c",
        "512",
        "-np",
        "2",
        "--metrics",
        "--spec-type",
        "ngram-simple",
    ]);
    let m0 = s.metrics();
    assert_eq!(metric(&m0, "llamacpp:tokens_predicted_total"), 0.0);
    let mut predicted = 0;
    let mut prompt = 0;
    let mut drafted = 0;
    for p in [PROMPT, "aaaa bbbb aaaa bbbb"] {
        let v = s.ok("/completion", &json!({"prompt": p, "n_predict": 30, "temperature": 0, "ignore_eos": true, "cache_prompt": false}));
        predicted += v["timings"]["predicted_n"].as_u64().unwrap();
        prompt += v["timings"]["prompt_n"].as_u64().unwrap();
        drafted += v["timings"]["draft_n"].as_u64().unwrap_or(0);
    }
    let m = s.metrics();
    assert_eq!(
        metric(&m, "llamacpp:tokens_predicted_total"),
        predicted as f64
    );
    assert_eq!(metric(&m, "llamacpp:prompt_tokens_total"), prompt as f64);
    assert!(metric(&m, "llamacpp:prompt_seconds_total") > 0.0);
    assert!(metric(&m, "llamacpp:tokens_predicted_seconds_total") > 0.0);
    assert_eq!(metric(&m, "llamacpp:requests_processing"), 0.0);
    assert_eq!(metric(&m, "llamacpp:requests_deferred"), 0.0);
    assert_eq!(metric(&m, "specd:requests_finished_total"), 2.0);
    for name in [
        "spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_draft_tokens_total",
    ] {
        assert_eq!(metric(&m, name), drafted as f64);
    }
    assert!(drafted > 0);
    let drafts = metric(&m, "spec_decode_num_drafts_total");
    let accepted = metric(&m, "spec_decode_num_accepted_tokens_total");
    assert!(drafts > 0.0 && accepted <= drafted as f64);
    // Per-position counters add up to the accepted total.
    let per_pos: f64 = m
        .lines()
        .filter(|l| l.starts_with("spec_decode_num_accepted_tokens_per_pos_total{position=\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(per_pos, accepted);
    assert!(m.contains("spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"}"));
    // Memory gauges: finished slots keep their memory for prompt reuse.
    assert!(metric(&m, "specd:memory_kv_bytes") > 0.0);
    assert!(metric(&m, "specd:memory_recurrent_bytes") > 0.0);
    assert!(metric(&m, "specd:memory_checkpoint_bytes") > 0.0);
    metric(&m, "specd:memory_rollback_bytes");
    assert!(m.contains("# TYPE llamacpp:prompt_tokens_total counter"));
}

#[test]
fn command_line_like_llama_server() {
    // llama-server's GPU and mmap flags are accepted with a warning each.
    let s = Server::start(&[
        "-c",
        "256",
        "-np",
        "2",
        "-ngl",
        "99",
        "-fa",
        "on",
        "--mlock",
        "--no-mmap",
        "-ctk",
        "q8_0",
        "-ctv",
        "q8_0",
        "--cont-batching",
        "--no-warmup",
        "-ub",
        "64",
        "-b",
        "256",
        "--seed",
        "-1",
        "--temp",
        "0.5",
        "-n",
        "7",
        "--jinja",
        "--ctx-checkpoints",
        "4",
        "--kv-unified",
        "--cors-origins",
        "localhost",
        "--verbose",
        "--spec-type",
        "ngram-mod",
        "--spec-draft-n-max",
        "4",
        "--spec-draft-n-min",
        "1",
        "--spec-draft-p-min",
        "0.5",
    ]);
    let log = s.log();
    for f in [
        "-ngl 99",
        "-fa on",
        "--mlock",
        "--no-mmap",
        "--cont-batching",
        "--no-warmup",
    ] {
        assert!(log.contains(&format!("'{f}' ignored: ")), "{f}:\n{log}");
    }
    // A quantised cache type is not there: the smaller of specd's two, said so.
    assert!(
        log.contains("'--cache-type-k q8_0': specd's KV cache is f32 or f16; using f16"),
        "{log}"
    );
    let p = s.get("/props").json();
    let d = &p["default_generation_settings"];
    assert_eq!(
        d["n_ctx"], 256,
        "--kv-unified: every slot has the whole context"
    );
    assert_eq!(d["params"]["n_predict"], 7);
    assert_eq!(d["params"]["speculative.n_max"], 4);
    assert_eq!(d["params"]["speculative.types"], json!(["ngram-mod"]));
    assert!((d["params"]["temperature"].as_f64().unwrap() - 0.5).abs() < 1e-6);
    let v = s.ok("/completion", &json!({"prompt": "x", "ignore_eos": true}));
    assert_eq!(v["tokens_predicted"], 7, "-n is the default n_predict");
    // CORS restricted to localhost.
    let r = request(
        &s.addr,
        "GET",
        "/health",
        &[("Origin", "http://localhost:3000")],
        None,
    );
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );
    let r = request(
        &s.addr,
        "GET",
        "/health",
        &[("Origin", "http://evil.test")],
        None,
    );
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert!(
        s.log_shows("request: POST /completion -> 200"),
        "--verbose logs requests"
    );

    // A flag llama-server does not know either: clap's error naming it.
    let out = Command::new(BIN)
        .args(["serve", "--no-such-flag"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    // A llama-server feature specd lacks: refused, naming it.
    let out = Command::new(BIN)
        .args(["serve", "--lora", "x.gguf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--lora") && err.contains("not supported"),
        "{err}"
    );
}
