//! llama-server's HTTP details, over real HTTP against the real binary: `/metrics` (names, help
//! and type lines, counters that add up to the responses, scrape-window gauges, the
//! `Process-Start-Time-Unix` header), `timings` (the first token's cost in the prompt's time),
//! `/slots`, `/v1/models` and `/models`, CORS, title-case header names and JSON error bodies.
//! Each expectation was checked against llama-server (same flags, same requests) on a local
//! model; the test client sees header names exactly as written on the wire.

use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::time::{SystemTime, UNIX_EPOCH};

mod common;
use common::http::*;
use common::Server;

/// The raw value of the header written exactly as `name` (case-sensitive, as some clients look
/// headers up).
fn exact<'a>(r: &'a Resp, name: &str) -> Option<&'a str> {
    r.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn preflight(s: &Server, path: &str, origin: &str, extra: &[(&str, &str)]) -> Resp {
    let mut h = vec![
        ("Origin", origin),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "Authorization"),
    ];
    h.extend_from_slice(extra);
    request(&s.addr, "OPTIONS", path, &h, None)
}

fn get_with(s: &Server, path: &str, headers: &[(&str, &str)]) -> Resp {
    request(&s.addr, "GET", path, headers, None)
}

/// `# HELP` text and `# TYPE` of a metric, and its unlabelled value.
fn described(text: &str, name: &str) -> (String, String, f64) {
    let help = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("# HELP {name} ")))
        .unwrap_or_else(|| panic!("no HELP for {name}:\n{text}"));
    let kind = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("# TYPE {name} ")))
        .unwrap_or_else(|| panic!("no TYPE for {name}:\n{text}"));
    (help.into(), kind.into(), metric(text, name))
}

/// llama-server's counters, `n_tokens_max` (no `_total`) included.
const COUNTERS: [(&str, &str); 10] = [
    (
        "n_tokens_max",
        "Largest observed sequence length (prompt + generation)",
    ),
    (
        "prompt_tokens_total",
        "Number of prompt tokens processed, excluding cached tokens",
    ),
    (
        "prompt_tokens_cached_total",
        "Number of prompt tokens reused from the cache",
    ),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    (
        "tokens_predicted_total",
        "Number of generation tokens processed",
    ),
    (
        "tokens_predicted_seconds_total",
        "Total time spent generating tokens",
    ),
    (
        "n_decode_total",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    ),
    (
        "spec_decode_num_draft_tokens_total",
        "Speculative: Total draft tokens generated",
    ),
    (
        "spec_decode_num_accepted_tokens_total",
        "Speculative: Total draft tokens accepted by the target model",
    ),
    (
        "spec_decode_num_drafts_total",
        "Speculative: Total speculative decoding verification steps",
    ),
];

/// llama-server's gauges (`--metrics-strict` makes `n_tokens_max` one too: `compat_sglang.rs`).
const GAUGES: [(&str, &str); 5] = [
    (
        "prompt_tokens_seconds",
        "Average prompt throughput in tokens/s",
    ),
    (
        "predicted_tokens_seconds",
        "Average generation throughput in tokens/s",
    ),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    (
        "n_busy_slots_per_decode",
        "Average number of busy slots per llama_decode() call",
    ),
];

#[test]
fn metrics_like_llama_server() {
    // Speculation off, as llama-server without a draft: its series are checked elsewhere.
    let s = Server::start(&["-c", "512", "-np", "1", "--metrics", "--spec-type", "none"]);
    let r = s.get("/metrics");
    assert_eq!(r.status, 200);
    assert_eq!(exact(&r, "Content-Type"), Some("text/plain; version=0.0.4"));
    // When the server started, in Unix seconds, on every scrape.
    let start: u64 = exact(&r, "Process-Start-Time-Unix")
        .expect("Process-Start-Time-Unix")
        .parse()
        .unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(start <= now && now - start < 600, "{start} vs {now}");
    let text = r.text();
    for (name, help) in COUNTERS {
        let (h, kind, v) = described(&text, &format!("llamacpp:{name}"));
        assert_eq!((h.as_str(), kind.as_str(), v), (help, "counter", 0.0));
    }
    for (name, help) in GAUGES {
        let (h, kind, v) = described(&text, &format!("llamacpp:{name}"));
        assert_eq!((h.as_str(), kind.as_str(), v), (help, "gauge", 0.0));
    }
    // specd's own metrics stay.
    assert_eq!(metric(&text, "specd:requests_finished_total"), 0.0);

    // Counters add up to what the responses reported; the second identical prompt is reused.
    let (mut prompt_n, mut cache_n, mut predicted_n) = (0, 0, 0);
    for n_predict in [1, 4, 16, 16] {
        let v = s.ok(
            "/completion",
            &json!({"prompt": "the quick brown fox jumps over the lazy dog",
                    "n_predict": n_predict, "ignore_eos": true, "temperature": 0}),
        );
        let t = &v["timings"];
        prompt_n += t["prompt_n"].as_u64().unwrap();
        cache_n += t["cache_n"].as_u64().unwrap();
        predicted_n += t["predicted_n"].as_u64().unwrap();
    }
    assert!(cache_n > 0, "the repeated prompt is reused");
    let r = s.get("/metrics");
    assert!(exact(&r, "Process-Start-Time-Unix").is_some());
    let m = r.text();
    assert_eq!(metric(&m, "llamacpp:prompt_tokens_total"), prompt_n as f64);
    assert_eq!(
        metric(&m, "llamacpp:prompt_tokens_cached_total"),
        cache_n as f64
    );
    assert_eq!(
        metric(&m, "llamacpp:tokens_predicted_total"),
        predicted_n as f64
    );
    assert!(metric(&m, "llamacpp:n_decode_total") > 0.0);
    assert!(metric(&m, "llamacpp:prompt_seconds_total") > 0.0);
    assert!(metric(&m, "llamacpp:tokens_predicted_seconds_total") > 0.0);
    assert_eq!(metric(&m, "llamacpp:requests_processing"), 0.0);
    assert_eq!(metric(&m, "llamacpp:n_busy_slots_per_decode"), 1.0);
    for l in m.lines().filter(|l| !l.starts_with('#')) {
        let v: f64 = l.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(v.is_finite() && v >= 0.0, "{l}");
    }
    // Without speculation no per-position series (llama-server leaves it out when empty).
    assert!(!m.contains("llamacpp:spec_decode_num_accepted_tokens_per_pos_total"));
    // The throughput gauges average over the time since the previous scrape.
    assert!(metric(&m, "llamacpp:predicted_tokens_seconds") > 0.0);
    assert!(metric(&m, "llamacpp:prompt_tokens_seconds") > 0.0);
    let again = s.metrics();
    assert_eq!(metric(&again, "llamacpp:predicted_tokens_seconds"), 0.0);
    assert_eq!(metric(&again, "llamacpp:prompt_tokens_seconds"), 0.0);
    assert_eq!(
        metric(&again, "llamacpp:tokens_predicted_total"),
        predicted_n as f64,
        "counters are not reset by a scrape"
    );

    // Other responses do not carry the header.
    let r = s.get("/health");
    assert_eq!(exact(&r, "Process-Start-Time-Unix"), None);
}

#[test]
fn metrics_disabled_is_501_json() {
    let s = Server::start(&["-c", "256", "-np", "1"]);
    let r = s.get("/metrics");
    let v = assert_error(&r, 501, "not_supported_error");
    assert_eq!(
        v["error"]["message"],
        "This server does not support metrics endpoint. Start it with `--metrics`"
    );
}

#[test]
fn timings_like_llama_server() {
    let s = Server::start(&["-c", "512", "-np", "1", "--spec-type", "none"]);
    // One token: it comes from the prompt's last row, so no generation step, no rate.
    let v = s.ok(
        "/completion",
        &json!({"prompt": "I believe", "n_predict": 1, "ignore_eos": true}),
    );
    let t = &v["timings"];
    assert_eq!(t["predicted_n"], 1);
    assert_eq!(t["predicted_per_second"], 0.0);
    assert_eq!(t["predicted_per_token_ms"], 0.0);
    // Sixteen tokens: the rate is over fifteen steps.
    let v = s.ok(
        "/completion",
        &json!({"prompt": "I believe", "n_predict": 16, "ignore_eos": true}),
    );
    let t = v["timings"].as_object().unwrap();
    let keys: Vec<&str> = t.keys().map(String::as_str).collect();
    let mut want = [
        "cache_n",
        "prompt_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ];
    want.sort();
    let mut got = keys.clone();
    got.sort();
    assert_eq!(got, want, "no draft counts without a draft");
    for (k, x) in t {
        let x = x.as_f64().unwrap_or_else(|| panic!("{k} is not a number"));
        assert!(x.is_finite() && x >= 0.0, "{k} = {x}");
    }
    assert_eq!(t["predicted_n"], 16);
    let ms = t["predicted_ms"].as_f64().unwrap();
    let rate = t["predicted_per_second"].as_f64().unwrap();
    assert!((rate - 1e3 / ms * 15.0).abs() < 1e-6, "{rate} vs {ms} ms");
    let per_token = t["predicted_per_token_ms"].as_f64().unwrap();
    assert!((per_token - ms / 15.0).abs() < 1e-9);
    assert!(t["prompt_ms"].as_f64().unwrap() > 0.0);
    assert!(t["prompt_per_token_ms"].as_f64().unwrap() > 0.0);
    // specd's speculation statistics sit next to `timings`.
    assert!(v["speculative"]["rounds"].as_u64().unwrap() > 0, "{v}");

    // The OpenAI endpoints carry the same object.
    let c = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    );
    assert!(c["timings"]["predicted_ms"].is_number());
    assert!(c["timings"]
        .as_object()
        .unwrap()
        .values()
        .all(Value::is_number));
}

#[test]
fn draft_counts_appear_once_drafts_were_verified() {
    let s = Server::start(&["-c", "512", "-np", "1", "--spec-type", "ngram-simple"]);
    let v = s.ok(
        "/completion",
        &json!({"prompt": "aaaa bbbb aaaa bbbb aaaa bbbb", "n_predict": 40,
                "temperature": 0, "ignore_eos": true}),
    );
    let t = &v["timings"];
    assert!(t["draft_n"].as_u64().unwrap() > 0, "{t}");
    assert!(t["draft_n_accepted"].as_u64().unwrap() <= t["draft_n"].as_u64().unwrap());
    assert!(t.as_object().unwrap().values().all(Value::is_number));
}

#[test]
fn slots_like_llama_server() {
    let s = Server::start(&["-c", "512", "-np", "2", "--slots", "--spec-type", "none"]);
    // Never used: id, n_ctx, speculative, is_processing — and no params.
    let slots = s.get("/slots").json();
    let slots = slots.as_array().unwrap();
    assert_eq!(slots.len(), 2);
    for (i, slot) in slots.iter().enumerate() {
        assert_eq!(
            slot,
            &json!({"id": i, "n_ctx": 256, "speculative": false, "is_processing": false})
        );
    }

    // After a completion the slot shows its last task, its counters reset.
    let v = s.ok(
        "/completion",
        &json!({"prompt": "I believe", "n_predict": 8, "ignore_eos": true,
                "stop": ["never-seen"], "temperature": 0}),
    );
    let used = v["id_slot"].as_u64().unwrap() as usize;
    let slots = s.get("/slots").json();
    let slot = &slots[used];
    let keys: Vec<&String> = slot.as_object().unwrap().keys().collect();
    for k in [
        "id",
        "n_ctx",
        "speculative",
        "is_processing",
        "id_task",
        "n_prompt_tokens",
        "n_prompt_tokens_processed",
        "n_prompt_tokens_cache",
        "params",
        "next_token",
    ] {
        assert!(keys.iter().any(|x| *x == k), "{k} missing: {slot}");
    }
    assert_eq!(slot["is_processing"], false);
    assert!(slot["id_task"].is_u64());
    // Prompt and generated tokens stay in memory (the last one was never decoded).
    let n_prompt = v["tokens_evaluated"].as_u64().unwrap();
    assert_eq!(slot["n_prompt_tokens"], n_prompt + 8 - 1, "{slot}");
    assert_eq!(slot["n_prompt_tokens_processed"], 0);
    assert_eq!(slot["n_prompt_tokens_cache"], 0);
    assert_eq!(
        slot["next_token"],
        json!([{"has_next_token": false, "has_new_line": false, "n_remain": -1, "n_decoded": 0}])
    );
    // The request's text is not shown (llama-server's metrics-only params).
    let params = slot["params"].as_object().unwrap();
    assert_eq!(params["n_predict"], 8);
    assert!(!params.contains_key("stop"), "{slot}");
    assert!(!params.contains_key("grammar"));
    // The other slot is still untouched.
    assert_eq!(slots[1 - used].as_object().unwrap().len(), 4);

    // While a request runs: its budget and progress (a budget far from reached while we look).
    let s = Server::start(&["-c", "8192", "-np", "1"]);
    let body = json!({"prompt": "I believe", "n_predict": 4000, "ignore_eos": true,
                      "stream": true, "temperature": 0})
    .to_string();
    let mut r = open_stream(&s.addr, "/completion", &body);
    read_chunk(&mut r).expect("a first chunk");
    let slots = s.get("/slots").json();
    let running = slots
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["is_processing"] == true)
        .unwrap_or_else(|| panic!("no slot is processing: {slots}"));
    let nt = &running["next_token"][0];
    assert_eq!(nt["has_next_token"], true);
    let decoded = nt["n_decoded"].as_i64().unwrap();
    assert!(decoded > 0);
    assert_eq!(nt["n_remain"].as_i64().unwrap(), 4000 - decoded);
    assert!(running["n_prompt_tokens_processed"].as_u64().unwrap() > 0);
    assert_eq!(running["params"]["stream"], true);
    drop(r);

    // --no-slots: 501 with llama-server's message.
    let s = Server::start(&["-c", "256", "-np", "1", "--no-slots"]);
    let v = assert_error(&s.get("/slots"), 501, "not_supported_error");
    assert_eq!(
        v["error"]["message"],
        "This server does not support slots endpoint. Start it with `--slots`"
    );
}

#[test]
fn models_with_aliases_and_tags() {
    let s = Server::start(&[
        "-c",
        "512",
        "-np",
        "2",
        "--alias",
        "tinyllama-2, fim,code,fim",
        "--tags",
        "small,chat,fim",
    ]);
    for path in ["/v1/models", "/models"] {
        let m = s.get(path).json();
        assert_eq!(m["object"], "list");
        let data = m["data"].as_array().unwrap();
        assert_eq!(data.len(), 1);
        let d = &data[0];
        // The id is the first alias in sorted order; both lists sorted, each name once.
        assert_eq!(d["id"], "code");
        assert_eq!(d["aliases"], json!(["code", "fim", "tinyllama-2"]));
        assert_eq!(d["tags"], json!(["chat", "fim", "small"]));
        assert_eq!(d["object"], "model");
        assert_eq!(d["owned_by"], "llamacpp");
        assert!(d["created"].is_u64());
        assert_eq!(
            d["architecture"],
            json!({"input_modalities": ["text"], "output_modalities": ["text"]})
        );
        let meta = &d["meta"];
        assert_eq!(meta["vocab_type"], 2);
        assert_eq!(meta["n_vocab"], 1030);
        assert_eq!(meta["n_ctx"], 256);
        assert!(meta["n_ctx_train"].is_u64());
        assert!(meta["n_embd"].is_u64());
        assert!(meta["n_params"].as_u64().unwrap() > 0);
        assert!(meta["size"].as_u64().unwrap() > 0);
        assert_eq!(meta["ftype"], "all F32");
        // Ollama's listing of the same model.
        let o = &m["models"][0];
        assert_eq!(o["name"], "code");
        assert_eq!(o["model"], "code");
        assert_eq!(o["capabilities"], json!(["completion"]));
        assert_eq!(o["details"]["format"], "gguf");
    }
    // Responses name the model by its id.
    let v = s.ok("/completion", &json!({"prompt": "x", "n_predict": 1}));
    assert_eq!(v["model"], "code");

    // Without --alias: the model path, no aliases, no tags.
    let s = Server::start(&["-c", "256", "-np", "1"]);
    let d = &s.get("/v1/models").json()["data"][0];
    assert!(d["id"].as_str().unwrap().ends_with("tiny.gguf"));
    assert_eq!(d["aliases"], json!([]));
    assert_eq!(d["tags"], json!([]));
}

/// llama-server's default, `*` with credentials: in specd it has to be asked for (specd's default
/// is loopback origins only; `tests/security.rs` checks it).
#[test]
fn cors_star_echoes_any_origin() {
    let s = Server::start(&[
        "-c",
        "256",
        "-np",
        "1",
        "--api-key",
        "k1",
        "--cors-origins",
        "*",
    ]);
    // A preflight on any path, without the API key.
    for path in ["/completions", "/v1/chat/completions", "/no/such/path"] {
        let r = preflight(&s, path, "web.mydomain.fr", &[]);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(
            exact(&r, "Access-Control-Allow-Origin"),
            Some("web.mydomain.fr")
        );
        assert_eq!(exact(&r, "Access-Control-Allow-Credentials"), Some("true"));
        assert_eq!(
            exact(&r, "Access-Control-Allow-Methods"),
            Some("GET, POST, DELETE, OPTIONS")
        );
        assert_eq!(exact(&r, "Access-Control-Allow-Headers"), Some("*"));
        assert_eq!(exact(&r, "Content-Type"), Some("text/html"));
        assert!(r.body.is_empty());
    }
    // Every other answer names the origin too, errors included; no credentials header there.
    let r = get_with(&s, "/health", &[("Origin", "http://localhost")]);
    assert_eq!(
        exact(&r, "Access-Control-Allow-Origin"),
        Some("http://localhost")
    );
    assert_eq!(exact(&r, "Access-Control-Allow-Credentials"), None);
    let r = get_with(&s, "/props", &[("Origin", "http://x.test")]);
    assert_error(&r, 401, "authentication_error");
    assert_eq!(
        exact(&r, "Access-Control-Allow-Origin"),
        Some("http://x.test")
    );
    // Only the health check is public; the model list needs the key too.
    for path in ["/health", "/v1/health"] {
        assert_eq!(s.get(path).status, 200, "{path}");
    }
    for path in ["/v1/models", "/models"] {
        assert_error(&s.get(path), 401, "authentication_error");
        let r = get_with(&s, path, &[("Authorization", "Bearer k1")]);
        assert_eq!(r.status, 200, "{path}");
    }
    // No Origin: the echo is empty, as llama-server sends it.
    let r = s.get("/health");
    assert_eq!(exact(&r, "Access-Control-Allow-Origin"), Some(""));
}

#[test]
fn cors_localhost_reflects_only_local_origins() {
    let s = Server::start(&["-c", "256", "-np", "1", "--cors-origins", "localhost"]);
    for origin in [
        "http://localhost",
        "http://localhost:8080",
        "http://127.0.0.1",
        "http://127.0.0.1:3000",
        "http://[::1]",
        "http://[::1]:3000",
        "https://localhost:8443",
    ] {
        let r = preflight(&s, "/completions", origin, &[]);
        assert_eq!(r.status, 200);
        assert_eq!(exact(&r, "Access-Control-Allow-Origin"), Some(origin));
        let r = get_with(&s, "/health", &[("Origin", origin)]);
        assert_eq!(exact(&r, "Access-Control-Allow-Origin"), Some(origin));
    }
    for origin in [
        "http://web.mydomain.fr",
        "http://evil.com",
        "http://notlocalhost",
        "http://localhost.evil.com",
        "localhost",
    ] {
        let r = preflight(&s, "/completions", origin, &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("access-control-allow-origin"), None, "{origin}");
        // No credentials grant to an origin that is refused (llama-server sends one).
        assert_eq!(r.header("access-control-allow-credentials"), None);
        let r = get_with(&s, "/health", &[("Origin", origin)]);
        assert_eq!(r.header("access-control-allow-origin"), None, "{origin}");
    }
    let r = s.get("/health");
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[test]
fn cors_explicit_origins_methods_headers_credentials() {
    // One origin: sent as given, whatever the request's origin.
    let s = Server::start(&[
        "-c",
        "256",
        "-np",
        "1",
        "--cors-origins",
        "https://app.test",
        "--cors-methods",
        "GET, POST",
        "--cors-headers",
        "Authorization, Content-Type",
        "--no-cors-credentials",
    ]);
    let r = preflight(&s, "/completions", "https://other.test", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(
        exact(&r, "Access-Control-Allow-Origin"),
        Some("https://app.test")
    );
    assert_eq!(exact(&r, "Access-Control-Allow-Credentials"), Some("false"));
    assert_eq!(exact(&r, "Access-Control-Allow-Methods"), Some("GET, POST"));
    assert_eq!(
        exact(&r, "Access-Control-Allow-Headers"),
        Some("Authorization, Content-Type")
    );
    let r = s.get("/health");
    assert_eq!(
        exact(&r, "Access-Control-Allow-Origin"),
        Some("https://app.test")
    );

    // `*` without credentials: the literal `*`.
    let s = Server::start(&[
        "-c",
        "256",
        "-np",
        "1",
        "--cors-origins",
        "*",
        "--no-cors-credentials",
    ]);
    let r = get_with(&s, "/health", &[("Origin", "http://x.test")]);
    assert_eq!(exact(&r, "Access-Control-Allow-Origin"), Some("*"));

    // Several origins: each is allowed, by echoing it; others get no header.
    let s = Server::start(&[
        "-c",
        "256",
        "-np",
        "1",
        "--cors-origins",
        "https://a.test,https://b.test",
    ]);
    let r = get_with(&s, "/health", &[("Origin", "https://b.test")]);
    assert_eq!(
        exact(&r, "Access-Control-Allow-Origin"),
        Some("https://b.test")
    );
    let r = get_with(&s, "/health", &[("Origin", "https://c.test")]);
    assert_eq!(r.header("access-control-allow-origin"), None);
}

/// `Content-Type`, `Access-Control-Allow-Origin`, `Process-Start-Time-Unix`: each word
/// capitalised, the rest lower case.
fn title_case(name: &str) -> bool {
    name.split('-').all(|w| {
        let mut c = w.chars();
        c.next().is_some_and(|f| f.is_ascii_uppercase()) && c.all(|x| !x.is_ascii_uppercase())
    })
}

#[test]
fn header_names_are_title_case() {
    let s = Server::start(&["-c", "512", "-np", "1", "--metrics"]);
    let origin = [("Origin", "http://localhost")];
    let mut seen = vec![
        get_with(&s, "/health", &origin),
        get_with(&s, "/metrics", &origin),
        get_with(&s, "/no/such/path", &origin),
        preflight(&s, "/completion", "http://localhost", &[]),
        request(
            &s.addr,
            "POST",
            "/completion",
            &origin,
            Some(br#"{"prompt": "x", "n_predict": 2}"#),
        ),
        request(
            &s.addr,
            "POST",
            "/completion",
            &origin,
            Some(br#"{"prompt": "x", "n_predict": 2, "stream": true}"#),
        ),
    ];
    seen.push(request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &origin,
        Some(
            br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": true}"#,
        ),
    ));
    for r in &seen {
        assert!(!r.headers.is_empty());
        for (k, _) in &r.headers {
            assert!(title_case(k), "header {k:?} is not title-case");
        }
        assert!(exact(r, "Content-Type").is_some(), "{:?}", r.headers);
    }
    assert!(exact(&seen[1], "Process-Start-Time-Unix").is_some());
    assert!(
        exact(&seen[5], "Transfer-Encoding").is_some()
            || exact(&seen[5], "Content-Length").is_some()
    );
}

#[test]
fn every_error_is_json() {
    let s = Server::start(&["-c", "256", "-np", "1"]);
    // Unknown paths and known paths with another method: llama-server's 404.
    for (method, path) in [
        ("GET", "/no/such/path"),
        ("POST", "/no/such/path"),
        ("GET", "/completion"),
        ("DELETE", "/health"),
        ("PUT", "/v1/models"),
        ("PATCH", "/v1/chat/completions"),
    ] {
        let r = request(&s.addr, method, path, &[], None);
        let v = assert_error(&r, 404, "not_found_error");
        assert_eq!(v["error"]["message"], "File Not Found", "{method} {path}");
        assert!(
            exact(&r, "Content-Type").is_some_and(|c| c.starts_with("application/json")),
            "{method} {path}"
        );
    }
    // Malformed and empty bodies.
    let r = request(&s.addr, "POST", "/completion", &[], Some(b"{nope"));
    assert_error(&r, 400, "invalid_request_error");
    let r = request(&s.addr, "POST", "/completion", &[], Some(b""));
    assert_error(&r, 400, "invalid_request_error");
    // A body over the limit (16 MiB): announced, and sent in chunks without a length.
    let r = request(
        &s.addr,
        "POST",
        "/completion",
        &[("Content-Length", "999999999")],
        None,
    );
    assert_error(&r, 413, "invalid_request_error");
    // The unread body would be taken for the next request: the answer closes the connection.
    assert_eq!(r.header("Connection"), Some("close"), "{:?}", r.headers);
    // The body goes out from another thread while this one waits for the answer: the server
    // answers as soon as the limit is passed and closes without reading the rest.
    let conn = connect(&s.addr);
    let mut w = conn.try_clone().unwrap();
    let head = format!(
        "POST /completion HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.addr
    );
    let writer = std::thread::spawn(move || {
        let chunk = vec![b' '; 1 << 20];
        let mut send = || -> std::io::Result<()> {
            w.write_all(head.as_bytes())?;
            for _ in 0..17 {
                w.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())?;
                w.write_all(&chunk)?;
                w.write_all(b"\r\n")?;
            }
            w.write_all(b"0\r\n\r\n")
        };
        let _ = send(); // fails once the server has closed: expected
    });
    let mut r = BufReader::new(conn);
    let (status, headers) = read_head(&mut r);
    assert_eq!(status, 413);
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "Connection" && v == "close"),
        "{headers:?}"
    );
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "Content-Length")
        .map(|(_, v)| v.parse().unwrap())
        .expect("a sized error body");
    let mut body = vec![0; len];
    std::io::Read::read_exact(&mut r, &mut body).unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    writer.join().unwrap();
    assert_eq!(v["error"]["code"], 413);
    assert_eq!(v["error"]["type"], "invalid_request_error");
    // The server keeps serving.
    assert_eq!(s.get("/health").json(), json!({"status": "ok"}));
    // draft-mtp on a model without an MTP head is the request's error, not the server's.
    let r = s.post(
        "/completion",
        &json!({"prompt": "hi", "n_predict": 2, "speculative": {"type": "draft-mtp"}}),
    );
    assert_error(&r, 400, "invalid_request_error");
    assert!(r.text().contains("MTP"), "{}", r.text());
}
