//! Prompt scoring over HTTP, as evaluation harnesses use it: `/v1/completions` with `echo` and
//! `logprobs` returns OpenAI's completions `logprobs` (tokens, token_logprobs, top_logprobs,
//! text_offset) for every prompt token (the first `null`) and the generated ones; the values are
//! the teacher-forced ones, the same the server reports for a generated token after the same
//! prefix; `max_tokens: 0` scores the prompt alone.

mod common;

use common::Server;
use serde_json::{json, Value};

fn tokenize(s: &Server, text: &str) -> Vec<u64> {
    let v = s.ok("/tokenize", &json!({"content": text}));
    v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("id"))
        .collect()
}

#[test]
fn the_log_likelihood_request_of_lm_evaluation_harness() {
    let s = Server::start(&[]);
    let a = tokenize(&s, "The quick brown fox jumps");
    let b = tokenize(&s, "over the lazy dog");
    // lm-evaluation-harness `local-completions`, loglikelihood requests: its payload exactly
    // (token-id prompts, batched), and the fields it reads back.
    let body = json!({"model": "specd", "prompt": [a, b], "temperature": 0, "max_tokens": 1,
        "logprobs": 1, "seed": 1234, "echo": true});
    let v = s.ok("/v1/completions", &body);
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2);
    for (c, p) in choices.iter().zip([&a, &b]) {
        let lp = &c["logprobs"];
        let token_logprobs = lp["token_logprobs"].as_array().expect("token_logprobs");
        let top = lp["top_logprobs"].as_array().expect("top_logprobs");
        // The prompt's tokens and the one generated.
        assert_eq!(token_logprobs.len(), p.len() + 1, "{lp}");
        assert_eq!(top.len(), p.len() + 1);
        assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(p.len() + 1));
        assert!(token_logprobs[0].is_null() && top[0].is_null());
        for (l, t) in token_logprobs[1..].iter().zip(&top[1..]) {
            let l = l.as_f64().expect("a log-probability");
            assert!(l <= 0.0);
            // The harness's greedy check: the token's value is among the top ones.
            let t = t.as_object().expect("top mapping");
            assert!(!t.is_empty() && t.len() <= 2);
        }
        let offsets: Vec<u64> = lp["text_offset"]
            .as_array()
            .expect("text_offset")
            .iter()
            .map(|o| o.as_u64().expect("offset"))
            .collect();
        assert_eq!(offsets[0], 0);
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
    }
}

#[test]
fn scores_are_the_teacher_forced_ones() {
    let s = Server::start(&[]);
    let prompt = tokenize(&s, "fn main() { let x = 1; }");
    // After each prefix, the greedy next token and its log-probability as a generation reports
    // it; the scored prompt prefix + that token must give the same value at that position.
    for k in [3, prompt.len() / 2, prompt.len()] {
        let head = &prompt[..k];
        let g = s.ok(
            "/v1/completions",
            &json!({"prompt": head, "max_tokens": 1, "temperature": 0, "logprobs": 0}),
        );
        let glp = &g["choices"][0]["logprobs"];
        let token = tokenize(&s, glp["tokens"][0].as_str().expect("token text"));
        let want = glp["token_logprobs"][0].as_f64().expect("value");
        let mut scored: Vec<Value> = head.iter().map(|&t| json!(t)).collect();
        if token.len() != 1 {
            continue; // a piece that does not tokenize back to itself
        }
        scored.push(json!(token[0]));
        let v = s.ok(
            "/v1/completions",
            &json!({"prompt": scored, "max_tokens": 0, "echo": true, "logprobs": 0}),
        );
        let lp = &v["choices"][0]["logprobs"];
        // max_tokens 0: the prompt alone.
        assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(k + 1));
        let got = lp["token_logprobs"][k].as_f64().expect("value");
        assert!((got - want).abs() < 1e-4, "position {k}: {got} vs {want}");
    }
}

#[test]
fn vllm_tokenizer_endpoints_as_harnesses_probe_them() {
    let s = Server::start(&[]);
    // lm-evaluation-harness probes these before tokenizing through the server.
    let info = s.get("/tokenizer_info").json();
    assert!(info["eos_token"].is_string(), "{info}");
    // The template in use, as /props reports it.
    let props = s.get("/props").json();
    assert!(info["chat_template"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));
    assert_eq!(info["chat_template"], props["chat_template"]);
    let v = s.ok(
        "/tokenize",
        &json!({"prompt": "hello world", "add_special_tokens": false, "return_token_strs": true}),
    );
    let ids = v["tokens"].as_array().expect("tokens").clone();
    assert_eq!(v["count"], json!(ids.len()));
    assert!(v["max_model_len"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(v["token_strs"].as_array().map(Vec::len), Some(ids.len()));
    // llama-server's fields answer as before.
    let l = s.ok("/tokenize", &json!({"content": "hello world"}));
    assert_eq!(l["tokens"], json!(ids));
    assert!(l.get("count").is_none());
    let d = s.ok("/detokenize", &json!({"tokens": ids}));
    assert_eq!(d["prompt"], "hello world");
    assert_eq!(d["content"], "hello world");
}
