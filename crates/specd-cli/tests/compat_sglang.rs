//! What SGLang's model gateway (`sglang-router` / `smg`) reads from its workers, over real
//! HTTP: `/server_info`, `/model_info` (worker discovery), `/get_load`, `/flush_cache`,
//! `/health_generate`, and a `/metrics` page its exposition parser accepts.

use serde_json::{json, Value};
use std::io::BufRead;
use std::time::{Duration, Instant};

mod common;
use common::http::*;
use common::Server;

const PROMPT: &str = "def fibonacci(n):\n    if n < 2:\n        return n\n";

fn get_ok(s: &Server, path: &str) -> Value {
    let r = s.get(path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    r.json()
}

fn complete(s: &Server, prompt: &str) -> Value {
    s.ok(
        "/completion",
        &json!({"prompt": prompt, "n_predict": 4, "temperature": 0, "cache_prompt": true}),
    )
}

/// Polls `/get_load` until `done` holds (at most 20 s); the last answer.
fn load_until(s: &Server, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = get_ok(s, "/get_load");
        if done(&v[0]) || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn server_info_and_model_info() {
    let s = Server::start(&["-c", "768", "-np", "3", "-a", "coder"]);
    let path = common::model().to_str().unwrap();
    let info = get_ok(&s, "/server_info");
    assert_eq!(info["model_path"], path);
    assert_eq!(info["tokenizer_path"], path);
    assert_eq!(info["served_model_name"], "coder");
    assert_eq!(info["dp_size"], 1);
    assert_eq!(info["context_length"], 256);
    assert_eq!(info["max_running_requests"], 3);
    assert_eq!(info["max_total_tokens"], 768);
    assert_eq!(info["max_total_num_tokens"], 768);
    assert!(info["version"].as_str().is_some_and(|v| !v.is_empty()));
    // The gateway reads `model_id` or its alias `model`: neither may appear, or serde sees a
    // duplicate field.
    assert!(info.get("model_id").is_none() && info.get("model").is_none());
    assert_eq!(get_ok(&s, "/get_server_info"), info);

    let m = get_ok(&s, "/model_info");
    assert_eq!(
        m,
        json!({
            "model_path": path,
            "tokenizer_path": path,
            "is_generation": true,
            "model_type": "qwen35",
            "architectures": ["qwen35"],
            "has_image_understanding": false,
            "has_audio_understanding": false,
        })
    );
    assert_eq!(get_ok(&s, "/get_model_info"), m);

    // Without an alias the served name is the model's path, as in `/v1/models`.
    let s = Server::start(&["-c", "256", "-np", "1"]);
    let info = get_ok(&s, "/server_info");
    assert_eq!(info["served_model_name"], path);
    assert_eq!(info["max_total_tokens"], 256);
    let models = get_ok(&s, "/v1/models");
    assert_eq!(models["data"][0]["id"], info["served_model_name"]);
}

#[test]
fn get_load_counts_running_and_waiting_requests() {
    // Long contexts: the generations that hold slots run for seconds.
    let s = Server::start(&["-c", "16384", "-np", "1"]);
    let idle = json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]);
    assert_eq!(get_ok(&s, "/get_load"), idle);

    // A long generation holds the only slot; a second request waits for it.
    let long = json!({"prompt": PROMPT, "n_predict": -1, "ignore_eos": true, "stream": true,
                      "temperature": 0});
    let mut stream = open_stream(&s.addr, "/completion", &long.to_string());
    let mut first = String::new();
    stream.read_line(&mut first).unwrap();
    let n_running_prompt = tokens(&s.ok("/tokenize", &json!({"content": PROMPT}))).len() as u64;
    let waiting_prompt = "print('hello, world')\n";
    let n_waiting_prompt =
        tokens(&s.ok("/tokenize", &json!({"content": waiting_prompt}))).len() as u64;
    let addr = s.addr.clone();
    let waiter = std::thread::spawn(move || {
        let body = json!({"prompt": waiting_prompt, "n_predict": 2, "temperature": 0});
        request(
            &addr,
            "POST",
            "/completion",
            &[],
            Some(body.to_string().as_bytes()),
        )
    });
    let busy = load_until(&s, |l| l["num_waiting_reqs"] == 1);
    assert_eq!(busy[0]["dp_rank"], 0, "{busy}");
    assert_eq!(busy[0]["num_reqs"], 2, "{busy}");
    assert_eq!(busy[0]["num_waiting_reqs"], 1, "{busy}");
    // The running slot's positions (prompt and what it generated so far) and the waiting prompt.
    let n = busy[0]["num_tokens"].as_u64().unwrap();
    assert!(n >= n_running_prompt + n_waiting_prompt, "{busy}");
    assert_eq!(busy.as_array().unwrap().len(), 1);

    drop(stream); // cancels the long generation; the waiting request runs
    let r = waiter.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    // Memory kept for prompt reuse is not load.
    assert_eq!(load_until(&s, |l| l["num_reqs"] == 0), idle);
    let slots = get_ok(&s, "/slots");
    assert!(slots[0]["n_prompt_tokens"].as_u64().unwrap() > 0, "{slots}");
}

#[test]
fn flush_cache_drops_kept_prompts_unless_busy() {
    let s = Server::start(&["-c", "16384", "-np", "2"]);
    complete(&s, PROMPT);
    let again = complete(&s, PROMPT);
    let reused = again["timings"]["cache_n"].as_u64().unwrap();
    assert!(reused > 0, "{again}");

    let r = s.post("/flush_cache", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["success"], true);
    assert_eq!(v["n_slots"], 1, "{v}");
    assert!(v["n_tokens"].as_u64().unwrap() >= reused, "{v}");
    let after = complete(&s, PROMPT);
    assert_eq!(after["timings"]["cache_n"], 0, "{after}");
    // Output does not depend on the cache.
    assert_eq!(after["content"], again["content"]);

    // GET works too (SGLang serves both); nothing left after the second flush.
    assert_eq!(get_ok(&s, "/flush_cache")["n_slots"], 1);
    let v = get_ok(&s, "/flush_cache");
    assert_eq!(v, json!({"success": true, "n_slots": 0, "n_tokens": 0}));

    // While a request runs: refused, and nothing is dropped.
    complete(&s, PROMPT);
    let long = json!({"prompt": "x = 1\n", "n_predict": -1, "ignore_eos": true, "stream": true,
                      "temperature": 0});
    let mut stream = open_stream(&s.addr, "/completion", &long.to_string());
    let mut first = String::new();
    stream.read_line(&mut first).unwrap();
    load_until(&s, |l| l["num_reqs"] == 1);
    let r = s.post("/flush_cache", &json!({}));
    let e = assert_error(&r, 400, "invalid_request_error");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("running or waiting"),
        "{e}"
    );
    drop(stream);
    load_until(&s, |l| l["num_reqs"] == 0);
    let kept = complete(&s, PROMPT);
    assert!(kept["timings"]["cache_n"].as_u64().unwrap() > 0, "{kept}");
}

#[test]
fn health_generate_runs_the_model() {
    let s = Server::start(&["-c", "16384", "-np", "2", "--metrics"]);
    let r = s.get("/health_generate");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"status": "ok"}));
    // It generated: one prompt token, one predicted.
    let m = s.metrics();
    assert_eq!(metric(&m, "llamacpp:tokens_predicted_total"), 1.0);

    // A conversation kept in one slot survives: the check takes the slot that keeps nothing.
    complete(&s, PROMPT);
    assert_eq!(s.get("/health_generate").status, 200);
    let again = complete(&s, PROMPT);
    assert!(again["timings"]["cache_n"].as_u64().unwrap() > 0, "{again}");

    // While a request runs, its next step is the check's token.
    let long = json!({"prompt": "x = 1\n", "n_predict": -1, "ignore_eos": true, "stream": true,
                      "temperature": 0});
    let mut stream = open_stream(&s.addr, "/completion", &long.to_string());
    let mut first = String::new();
    stream.read_line(&mut first).unwrap();
    let r = s.get("/health_generate");
    assert_eq!(r.status, 200, "{}", r.text());
    drop(stream);
}

#[test]
fn api_key_guards_the_gateway_endpoints() {
    let s = Server::start(&["-c", "256", "-np", "1", "--api-key", "k1"]);
    let paths = [
        ("GET", "/server_info"),
        ("GET", "/get_server_info"),
        ("GET", "/model_info"),
        ("GET", "/get_model_info"),
        ("GET", "/get_load"),
        ("GET", "/health_generate"),
        ("POST", "/flush_cache"),
    ];
    for (method, path) in paths {
        let r = request(&s.addr, method, path, &[], Some(b"{}"));
        assert_error(&r, 401, "authentication_error");
        let r = request(
            &s.addr,
            method,
            path,
            &[("Authorization", "Bearer k1")],
            Some(b"{}"),
        );
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn info_and_load_do_not_wake_a_sleeping_server() {
    let s = Server::start(&["-c", "256", "-np", "1", "--sleep-idle-seconds", "1"]);
    complete(&s, PROMPT);
    let deadline = Instant::now() + Duration::from_secs(20);
    while get_ok(&s, "/props")["is_sleeping"] != true {
        assert!(Instant::now() < deadline, "never slept");
        std::thread::sleep(Duration::from_millis(50));
    }
    for path in ["/server_info", "/model_info", "/get_load", "/flush_cache"] {
        get_ok(&s, path);
    }
    assert_eq!(get_ok(&s, "/props")["is_sleeping"], true);
    // A generating health check wakes it.
    assert_eq!(s.get("/health_generate").status, 200);
    assert_eq!(get_ok(&s, "/props")["is_sleeping"], false);
}

/// llama-server's metric names, as a running llama-server lists them (all kept).
const LLAMA_SERVER_METRICS: [&str; 15] = [
    "llamacpp:prompt_tokens_total",
    "llamacpp:prompt_tokens_cached_total",
    "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_total",
    "llamacpp:tokens_predicted_seconds_total",
    "llamacpp:n_decode_total",
    "llamacpp:n_tokens_max",
    "llamacpp:spec_decode_num_draft_tokens_total",
    "llamacpp:spec_decode_num_accepted_tokens_total",
    "llamacpp:spec_decode_num_drafts_total",
    "llamacpp:prompt_tokens_seconds",
    "llamacpp:predicted_tokens_seconds",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:n_busy_slots_per_decode",
];

/// Without `--metrics-strict` the page declares llama-server's types, `llamacpp:n_tokens_max`
/// a counter included (llama.cpp's own server tests check them); the strict page is what the
/// gateway's parser accepts, and it refuses the default one.
#[test]
fn metrics_types_are_llama_servers_unless_strict() {
    use openmetrics_parser::PrometheusType;
    let s = Server::start(&["-c", "1024", "-np", "1", "--metrics"]);
    s.ok("/completion", &json!({"prompt": "a b c", "n_predict": 2}));
    let page = s.metrics();
    for line in [
        "# TYPE llamacpp:n_tokens_max counter\n",
        "# TYPE llamacpp:requests_processing gauge\n",
    ] {
        assert!(page.contains(line), "{line}{page}");
    }
    assert!(openmetrics_parser::prometheus::parse_prometheus(&page.replace(':', "_")).is_err());
    drop(s);
    let s = Server::start(&["-c", "1024", "-np", "1", "--metrics", "--metrics-strict"]);
    let page = s.metrics();
    let parsed = openmetrics_parser::prometheus::parse_prometheus(&page.replace(':', "_"))
        .unwrap_or_else(|e| panic!("{e:?}\n{page}"));
    assert_eq!(
        parsed.families["llamacpp_n_tokens_max"].family_type,
        PrometheusType::Gauge
    );
}

#[test]
fn metrics_exposition_is_valid() {
    use openmetrics_parser::PrometheusType;
    let s = Server::start(&[
        "-c",
        "1024",
        "-np",
        "2",
        "--metrics",
        "--metrics-strict",
        "--spec-type",
        "ngram-simple",
    ]);
    // Speculation fills the per-position families.
    let text = "a b c d a b c d a b c d a b c d a b c d";
    s.ok(
        "/completion",
        &json!({"prompt": text, "n_predict": 32, "temperature": 0}),
    );
    let page = s.metrics();
    for name in LLAMA_SERVER_METRICS {
        assert!(
            page.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{page}"
        );
    }
    // As SGLang's model gateway reads it (workers started with `--metrics-strict`): colons
    // become underscores, then its parser (the same crate and version as sglang-router 0.3.2),
    // which refuses a counter without `_total`.
    let parsed = openmetrics_parser::prometheus::parse_prometheus(&page.replace(':', "_"))
        .unwrap_or_else(|e| panic!("{e:?}\n{page}"));
    let mut n_counters = 0;
    for (name, family) in &parsed.families {
        if family.family_type == PrometheusType::Counter {
            assert!(name.ends_with("_total"), "counter {name}");
            n_counters += 1;
        }
    }
    assert!(n_counters >= 10);
    assert_eq!(
        parsed.families["llamacpp_n_tokens_max"].family_type,
        PrometheusType::Gauge
    );
    // The same check on the page itself: every `# TYPE x counter` names `x_total`.
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            if kind == "counter" {
                assert!(name.ends_with("_total"), "{line}");
            }
        }
    }
}
