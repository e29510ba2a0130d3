//! llama-server's sampling fields over real HTTP against the real binary: `logit_bias` in all its
//! forms (and `ignore_eos`'s biases), `n` / `n_cmpl` choices, and the shapes of `n_probs` /
//! `post_sampling_probs` / OpenAI `logprobs`. Field names, shapes and status codes were checked
//! against llama-server on the same kind of model.

use serde_json::{json, Value};
use std::collections::BTreeSet;

mod common;
use common::http::*;
use common::Server;

const PROMPT: &str = "def fibonacci(n):\n    if n < 2:\n        return n\n";

fn completion(s: &Server, extra: Value) -> Value {
    let mut body =
        json!({"prompt": PROMPT, "n_predict": 8, "temperature": 0, "return_tokens": true});
    merge(&mut body, extra);
    s.ok("/completion", &body)
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
}

fn ids(v: &Value) -> Vec<u64> {
    tokens(v)
}

fn bias_list(v: &Value) -> Vec<(u64, Value)> {
    v["generation_settings"]["logit_bias"]
        .as_array()
        .unwrap_or_else(|| panic!("no logit_bias in {v}"))
        .iter()
        .map(|e| {
            let keys: BTreeSet<&str> = e.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            assert_eq!(keys, BTreeSet::from(["bias", "token"]), "{e}");
            (e["token"].as_u64().unwrap(), e["bias"].clone())
        })
        .collect()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Tokens of `text` without BOS, as `logit_bias` tokenizes texts.
fn tokenize(s: &Server, text: &str) -> Vec<u64> {
    tokens(&s.ok("/tokenize", &json!({"content": text, "add_special": false})))
}

#[test]
fn logit_bias_in_every_form() {
    let s = Server::start(&["-c", "512", "-np", "2"]);
    let plain = completion(&s, json!({}));
    let first = ids(&plain)[0];
    assert_eq!(bias_list(&plain), []);
    assert_eq!(plain["generation_settings"]["post_sampling_probs"], false);

    // Banning the first greedy token, as an id pair, an OpenAI object, `false` or a huge
    // negative number: another token comes first, and generation_settings lists the bias.
    for (bias, shown) in [
        (json!([[first, false]]), Value::Null),
        (json!({ first.to_string(): false }), Value::Null),
        (json!([[first, -1000]]), json!(-1000.0)),
        (json!({ format!(" {first}"): -1000 }), json!(-1000.0)),
    ] {
        let v = completion(&s, json!({ "logit_bias": bias }));
        assert_ne!(ids(&v)[0], first, "{bias}");
        assert_eq!(bias_list(&v), [(first, shown)], "{bias}");
    }

    // A text gets the bias on each of its tokens (no BOS), as a pair or an object key.
    let text = " return n";
    let text_ids = tokenize(&s, text);
    assert!(!text_ids.is_empty());
    for bias in [json!([[text, -5.5]]), json!({ text: -5.5 })] {
        let v = completion(&s, json!({ "logit_bias": bias }));
        let want: Vec<(u64, Value)> = text_ids.iter().map(|&t| (t, json!(-5.5))).collect();
        assert_eq!(bias_list(&v), want, "{bias}");
    }

    // A strong positive bias makes a token the greedy choice every time.
    let v = completion(&s, json!({"logit_bias": [[7, 100]]}));
    assert_eq!(ids(&v), [7; 8]);

    // Entries llama-server skips: ids outside the vocabulary, negative keys, `true` or a text
    // as bias, malformed pairs; and a `logit_bias` that is neither list nor object.
    let v = completion(
        &s,
        json!({"logit_bias": [[5000, 1], [-1, 1], [3, true], [3, "x"], [3], 3, [1.5, 2], [9, 0.5]]}),
    );
    assert_eq!(bias_list(&v), [(9, json!(0.5))]);
    let v = completion(
        &s,
        json!({"logit_bias": {"5000": 1, "-1": 2, "4": null, "+9": 0.5}}),
    );
    assert_eq!(bias_list(&v), [(9, json!(0.5))]);
    for bias in [json!("abc"), json!(3), json!(null), json!([]), json!({})] {
        let v = completion(&s, json!({ "logit_bias": bias }));
        assert_eq!(bias_list(&v), [], "{bias}");
        assert_eq!(ids(&v), ids(&plain), "{bias}");
    }
}

#[test]
fn ignore_eos_bans_end_of_generation_tokens() {
    let s = Server::start(&["-c", "512", "-np", "1"]);
    let v = completion(&s, json!({"ignore_eos": true, "logit_bias": [[3, 1]]}));
    let list = bias_list(&v);
    // The request's biases first, then -inf (null in JSON) on every end-of-generation token.
    assert_eq!(list[0], (3, json!(1.0)));
    assert!(list.len() > 1, "{list:?}");
    assert!(list[1..].iter().all(|(_, b)| b.is_null()), "{list:?}");
    let eog: Vec<u64> = list[1..].iter().map(|(t, _)| *t).collect();
    // Pulling hard towards them ends a normal generation at once; with ignore_eos they never
    // come.
    let pull: Vec<Value> = eog.iter().map(|t| json!([t, 100])).collect();
    let v = completion(&s, json!({ "logit_bias": pull }));
    assert_eq!(v["stop_type"], "eos");
    // The end-of-generation token counts as predicted, as in llama-server.
    assert_eq!(v["tokens_predicted"], 1);
    let v = completion(&s, json!({"logit_bias": pull, "ignore_eos": true}));
    assert_eq!(v["stop_type"], "limit");
    assert!(ids(&v).iter().all(|t| !eog.contains(t)), "{v}");
    let v = completion(&s, json!({"ignore_eos": false}));
    assert_eq!(bias_list(&v), []);

    // `--ignore-eos` makes it every request's default.
    let s = Server::start(&["-c", "512", "-np", "1", "--ignore-eos"]);
    let v = completion(&s, json!({ "logit_bias": pull }));
    assert_eq!(v["generation_settings"]["ignore_eos"], true);
    assert_eq!(v["stop_type"], "limit");
    assert_eq!(bias_list(&v).len(), pull.len() + eog.len());
    let v = completion(&s, json!({"ignore_eos": false}));
    assert_eq!(bias_list(&v), []);
    assert_eq!(
        s.get("/props").json()["default_generation_settings"]["params"]["ignore_eos"],
        true
    );
}

#[test]
fn logit_bias_on_the_openai_endpoints_and_under_speculation() {
    let s = Server::start(&["-c", "512", "-np", "2", "--spec-type", "ngram-simple"]);
    let msgs = json!([{"role": "user", "content": "What is the best book"}]);
    let chat = |extra: Value| {
        let mut b = json!({"messages": msgs, "max_tokens": 12, "temperature": 0,
                           "logprobs": true, "top_logprobs": 1});
        merge(&mut b, extra);
        s.ok("/v1/chat/completions", &b)
    };
    let chosen = |v: &Value| -> Vec<u64> {
        v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_u64().unwrap())
            .collect()
    };
    let plain = chosen(&chat(json!({})));
    let banned: Vec<u64> = plain
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let bias: serde_json::Map<String, Value> = banned
        .iter()
        .map(|t| (t.to_string(), json!(-100)))
        .collect();
    let v = chosen(&chat(json!({ "logit_bias": bias })));
    assert!(v.iter().all(|t| !banned.contains(t)), "{v:?} / {banned:?}");

    let v = s.ok(
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1,
                "logit_bias": [[banned[0], false]]}),
    );
    // OpenAI's completions format names tokens by their text.
    let banned_text = s.ok("/detokenize", &json!({ "tokens": [banned[0]] }))["content"].clone();
    for t in v["choices"][0]["logprobs"]["tokens"].as_array().unwrap() {
        assert_ne!(t, &banned_text);
    }

    // The bias shapes the target's distribution at verification: speculative output is the
    // plain output, greedy and sampled, and drafts were really verified.
    for sampling in [
        json!({"temperature": 0}),
        json!({"temperature": 0.9, "seed": 7}),
    ] {
        let run = |spec: &str| {
            let mut b = json!({"prompt": PROMPT, "n_predict": 48, "return_tokens": true,
                               "logit_bias": {"7": 3, "11": false, " n": -2},
                               "speculative.type": spec, "cache_prompt": false});
            merge(&mut b, sampling.clone());
            s.ok("/completion", &b)
        };
        let (a, b) = (run("none"), run("ngram-simple"));
        assert_eq!(ids(&a), ids(&b), "{sampling}");
        assert!(!ids(&a).contains(&11));
        assert!(b["timings"]["draft_n"].as_u64().unwrap() > 0, "{b}");
    }
}

#[test]
fn probability_shapes() {
    let s = Server::start(&["-c", "512", "-np", "2"]);
    let entry_keys = set(&["id", "token", "bytes", "logprob", "top_logprobs"]);
    let top_keys = set(&["id", "token", "bytes", "logprob"]);
    let post_keys = set(&["id", "token", "bytes", "prob", "top_probs"]);
    let post_top_keys = set(&["id", "token", "bytes", "prob"]);

    // Raw log-probabilities: n_probs of them per token, the chosen token's among them (greedy).
    let v = completion(&s, json!({"n_probs": 3}));
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 8);
    for (p, t) in probs.iter().zip(ids(&v)) {
        assert_eq!(keys(p), entry_keys);
        assert_eq!(p["id"], t);
        let top = p["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert!(top.iter().all(|x| keys(x) == top_keys));
        assert_eq!(top[0]["id"], t);
        assert_eq!(top[0]["logprob"], p["logprob"]);
        let lp: Vec<f64> = top.iter().map(|x| x["logprob"].as_f64().unwrap()).collect();
        assert!(
            lp.windows(2).all(|w| w[0] >= w[1]) && lp[0] <= 0.0,
            "{lp:?}"
        );
        let b: Vec<u8> = serde_json::from_value(p["bytes"].clone()).unwrap();
        assert_eq!(p["token"], String::from_utf8_lossy(&b).as_ref());
    }
    // n_probs <= 0 reports none; generation_settings shows the request's choice.
    let v = completion(&s, json!({"n_probs": 0, "post_sampling_probs": true}));
    assert!(v.get("completion_probabilities").is_none(), "{v}");
    assert_eq!(v["generation_settings"]["post_sampling_probs"], true);

    // Post-sampling: probabilities of the sampler's final distribution. Greedy leaves one
    // token with probability 1.
    let v = completion(&s, json!({"n_probs": 3, "post_sampling_probs": true}));
    for (p, t) in v["completion_probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .zip(ids(&v))
    {
        assert_eq!(keys(p), post_keys);
        assert_eq!(p["prob"], 1.0);
        assert_eq!(
            p["top_probs"],
            json!([{"id": t, "token": p["token"], "bytes": p["bytes"], "prob": 1.0}])
        );
    }
    // Sampling with top-k 4: at most the 4 survivors (none with zero probability), summing to
    // 1 when fewer than n_probs are left, in descending order; the chosen one among them.
    for n in [2, 10] {
        let v = completion(
            &s,
            json!({"n_probs": n, "post_sampling_probs": true, "temperature": 1.0, "top_k": 4,
                   "top_p": 1.0, "min_p": 0.0, "seed": 3}),
        );
        for p in v["completion_probabilities"].as_array().unwrap() {
            let top = p["top_probs"].as_array().unwrap();
            assert!(!top.is_empty() && top.len() <= n.min(4), "{p}");
            assert!(top.iter().all(|x| keys(x) == post_top_keys));
            let pr: Vec<f64> = top.iter().map(|x| x["prob"].as_f64().unwrap()).collect();
            assert!(pr.iter().all(|&x| x > 0.0 && x <= 1.0), "{pr:?}");
            assert!(pr.windows(2).all(|w| w[0] >= w[1]), "{pr:?}");
            if top.len() < n {
                assert!((pr.iter().sum::<f64>() - 1.0).abs() < 1e-5, "{pr:?}");
            }
            if let Some(c) = top.iter().find(|x| x["id"] == p["id"]) {
                assert_eq!(c["prob"], p["prob"]);
            } else {
                assert_eq!(top.len(), n, "the chosen token is among all survivors: {p}");
            }
        }
    }

    // Streaming: each chunk carries the probabilities of its own tokens.
    let r = s.post(
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 2, "stream": true}),
    );
    let mut n = 0;
    for e in r.events() {
        let c: Value = serde_json::from_str(&e).unwrap();
        if c["stop"] == false {
            let probs = c["completion_probabilities"].as_array().unwrap();
            assert_eq!(probs.len(), c["tokens"].as_array().unwrap().len());
            assert!(probs.iter().all(|p| keys(p) == entry_keys));
            n += probs.len();
        } else {
            assert!(c.get("completion_probabilities").is_none());
        }
    }
    assert_eq!(n, 6);

    // OpenAI chat: `logprobs: true` alone means 20 top entries; the entries are llama-server's
    // (with `id`); `top_logprobs: 0` reports none (no `logprobs` member at all); post-sampling
    // works there too.
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: Value| {
        let mut b = json!({"messages": msgs, "max_tokens": 3, "temperature": 0});
        merge(&mut b, extra);
        s.ok("/v1/chat/completions", &b)
    };
    let v = chat(json!({"logprobs": true}));
    let c = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(c.as_array().unwrap().len(), 3);
    assert_eq!(keys(&c[0]), entry_keys);
    assert_eq!(c[0]["top_logprobs"].as_array().unwrap().len(), 20);
    let v = chat(json!({"logprobs": true, "top_logprobs": 0}));
    assert_eq!(
        keys(&v["choices"][0]),
        set(&["finish_reason", "index", "message"])
    );
    let v = chat(json!({"logprobs": true, "top_logprobs": 2, "post_sampling_probs": true}));
    assert_eq!(keys(&v["choices"][0]["logprobs"]["content"][0]), post_keys);
    let v = chat(json!({"n_probs": 2}));
    assert_eq!(
        v["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": msgs, "top_logprobs": 2}),
    );
    let e = assert_error(&r, 400, "invalid_request_error");
    assert_eq!(
        e["error"]["message"],
        "top_logprobs requires logprobs to be set to true"
    );

    // OpenAI completions: OpenAI's (and vLLM's) arrays, not the chat shape llama-server uses:
    // per token its text, log-probability, the top ones by text (the token's own included)
    // and its character offset.
    let v = s.ok(
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "logprobs": 2}),
    );
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(
        keys(lp),
        set(&["tokens", "token_logprobs", "top_logprobs", "text_offset"])
    );
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 2);
    let top = lp["top_logprobs"][0].as_object().unwrap();
    assert!((2..=3).contains(&top.len()), "{top:?}");
    let first = lp["tokens"][0].as_str().unwrap();
    assert_eq!(top[first], lp["token_logprobs"][0]);
    assert_eq!(lp["text_offset"][0], 0);
    let v = s.ok(
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
}

#[test]
fn several_choices() {
    let s = Server::start(&["-c", "512", "-np", "2"]);
    let msgs = json!([{"role": "system", "content": "Book"},
                      {"role": "user", "content": "What is the best book"}]);
    let chat = |extra: Value| {
        let mut b = json!({"messages": msgs, "max_tokens": 6, "temperature": 1.0, "seed": 5});
        merge(&mut b, extra);
        s.post("/v1/chat/completions", &b)
    };
    // n choices, indexed, each sampled as a request of its own with seed + index; usage and
    // timings are the first choice's (llama-server's answer). Forcing a slot works, twice.
    for _ in 0..2 {
        let r = chat(json!({"n": 2, "id_slot": 0}));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2);
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i);
            assert_eq!(c["message"]["role"], "assistant");
            assert_eq!(c["finish_reason"], "length");
            let alone = chat(json!({"seed": 5 + i})).json();
            assert_eq!(c["message"], alone["choices"][0]["message"], "choice {i}");
        }
        assert_eq!(v["usage"]["completion_tokens"], 6);
        assert_eq!(v["timings"]["predicted_n"], 6);
    }
    // At most one choice per slot, at least one.
    for (n, got) in [(json!(3), 3), (json!(0), 0)] {
        let e = assert_error(&chat(json!({ "n": n })), 400, "invalid_request_error");
        assert_eq!(
            e["error"]["message"],
            format!("Field 'n': Value must be between 1 <= value <= 2, but got {got}")
        );
    }

    // /completion: `n_cmpl` (or `n`) per prompt, prompt after prompt, seeds + 1 per extra.
    let v = s.ok(
        "/completion",
        &json!({"prompt": [PROMPT, "class Foo:"], "n_predict": 3, "n_cmpl": 2, "seed": 5}),
    );
    let got: Vec<(u64, String, u64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["index"].as_u64().unwrap(),
                x["prompt"].as_str().unwrap().to_string(),
                x["generation_settings"]["seed"].as_u64().unwrap(),
            )
        })
        .collect();
    let p = |t: &str| t.to_string();
    assert_eq!(
        got,
        [
            (0, p(PROMPT), 5),
            (1, p(PROMPT), 6),
            (2, p("class Foo:"), 5),
            (3, p("class Foo:"), 6)
        ]
    );
    let v = s.ok(
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 3, "n": 2, "seed": 5}),
    );
    let idx: Vec<u64> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, [0, 1]);
    assert_eq!(v["usage"]["completion_tokens"], 3);

    // Streaming: each choice's chunks name its index; each opens with its role chunk and ends
    // with its finish chunk (and its usage chunk); one [DONE] ends the stream.
    let r = chat(json!({"n": 2, "stream": true, "stream_options": {"include_usage": true}}));
    assert_eq!(r.status, 200);
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut text = [String::new(), String::new()];
    for (i, text) in text.iter_mut().enumerate() {
        let mine: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"].get(0).is_some_and(|ch| ch["index"] == i))
            .collect();
        assert_eq!(
            mine[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": null})
        );
        let ends: Vec<&&Value> = mine
            .iter()
            .filter(|c| !c["choices"][0]["finish_reason"].is_null())
            .collect();
        assert_eq!(ends.len(), 1);
        assert_eq!(ends[0]["choices"][0]["finish_reason"], "length");
        for c in &mine {
            if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
                text.push_str(t);
            }
        }
    }
    assert_eq!(
        chunks.iter().filter(|c| c.get("usage").is_some()).count(),
        2
    );
    let whole = chat(json!({"n": 2})).json();
    for (i, t) in text.iter().enumerate() {
        assert_eq!(whole["choices"][i]["message"]["content"], t.as_str());
    }

    // /completion streams too, without [DONE].
    let r = s.post(
        "/completion",
        &json!({"prompt": PROMPT, "n_predict": 3, "n": 2, "seed": 5, "stream": true}),
    );
    let finals: Vec<Value> = r
        .events()
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter(|c| c["stop"] == true)
        .collect();
    let mut idx: Vec<u64> = finals
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    idx.sort_unstable();
    assert_eq!(idx, [0, 1]);
}

#[test]
fn logit_bias_on_the_command_line() {
    // llama-server's `-l TOKEN_ID(+/-)BIAS`: the default of requests that give no logit_bias.
    let s = Server::start(&[
        "-c",
        "256",
        "-np",
        "1",
        "-l",
        "7+100",
        "--logit-bias",
        "9-inf",
    ]);
    let v = completion(&s, json!({}));
    assert_eq!(ids(&v), [7; 8]);
    assert_eq!(bias_list(&v), [(7, json!(100.0)), (9, Value::Null)]);
    let v = completion(&s, json!({"logit_bias": null}));
    assert_eq!(ids(&v), [7; 8]);
    // A request's own logit_bias replaces it, an empty one too.
    let v = completion(&s, json!({"logit_bias": []}));
    assert_eq!(bias_list(&v), []);
    assert_ne!(ids(&v), [7; 8]);
    for bad in ["7", "7x1", "x+1", "7+nan", "-7+1"] {
        let out = std::process::Command::new(common::BIN)
            .args(["serve", "-m"])
            .arg(common::model())
            .args(["--port", "0", "-l", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("TOKEN_ID"),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
