//! Limits that protect `specd serve` from its clients, over real HTTP against the real binary:
//! large bodies do not stall `/health`, prompts longer than the context are refused before they
//! are tokenized, the budget of bodies in flight, the read timeout, status codes and JSON
//! bodies of every error, API keys, and a clean shutdown on SIGTERM.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::http::*;
use common::Server;

/// Body limit of the servers of these tests (`SPECD_MAX_BODY_BYTES`): large enough that
/// tokenizing a body takes a while, small enough that the tests stay quick.
const BODY_LIMIT: usize = 1 << 20;

fn start_limited(extra: &[&str]) -> Server {
    let limit = BODY_LIMIT.to_string();
    Server::start_env(extra, &[("SPECD_MAX_BODY_BYTES", limit.as_str())])
}

/// Held by the tests that keep both cores busy tokenizing, so that they do not run at the same
/// time: one of them times `/health`.
fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Text of `n` bytes that tokenizes into many tokens (words, digits and punctuation).
fn text(n: usize) -> String {
    let unit = "def f(x): return x * 42 + y_1 # note\n";
    unit.repeat(n / unit.len() + 1)[..n].to_string()
}

/// `/health` answers within 100 ms while several near-limit bodies are being parsed and
/// tokenized, all of them on every endpoint that tokenizes (before: tokenizing ran on the async
/// threads and `/health` waited for seconds).
#[test]
fn health_answers_while_large_bodies_are_processed() {
    let _alone = heavy();
    let s = start_limited(&["-c", "256", "-np", "1", "--threads-http", "2"]);
    let body = |path: &str| -> Vec<u8> {
        let t = text(BODY_LIMIT * 15 / 16);
        match path {
            "/tokenize" => json!({"content": t}),
            "/apply-template" => json!({"messages": [{"role": "user", "content": t}]}),
            _ => json!({"prompt": t, "n_predict": 1}),
        }
        .to_string()
        .into_bytes()
    };
    let paths = ["/tokenize", "/tokenize", "/apply-template", "/completion"];
    let workers: Vec<_> = paths
        .iter()
        .map(|&p| {
            let (addr, b) = (s.addr.clone(), body(p));
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let r = request(&addr, "POST", p, &[], Some(&b));
                (p, r, t0.elapsed())
            })
        })
        .collect();
    // Probe while the bodies are processed.
    let t_start = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut probes = 0;
    while !workers.iter().all(|w| w.is_finished()) && t_start.elapsed() < Duration::from_secs(60) {
        let t0 = Instant::now();
        let r = s.get("/health");
        slowest = slowest.max(t0.elapsed());
        assert_eq!(r.status, 200, "{}", r.text());
        probes += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut busiest = Duration::ZERO;
    for w in workers {
        let (p, r, took) = w.join().unwrap();
        busiest = busiest.max(took);
        match p {
            // A prompt longer than the context: refused before tokenizing.
            "/completion" => {
                let v = assert_error(&r, 400, "exceed_context_size_error");
                assert_eq!(v["error"]["n_ctx"], 256, "{v}");
                assert!(v["error"]["n_prompt_tokens"].as_u64().unwrap() >= 256);
            }
            _ => assert_eq!(r.status, 200, "{p}: {}", r.text()),
        }
    }
    assert!(
        probes >= 3,
        "the bodies were done in {busiest:?}: too quick to probe"
    );
    assert!(
        slowest < Duration::from_millis(100),
        "/health took {slowest:?} while bodies were processed (slowest body {busiest:?})"
    );
}

/// A prompt whose text cannot fit the context, whatever it tokenizes to, is refused at once
/// with llama-server's `exceed_context_size_error`, on every generating endpoint.
#[test]
fn prompt_longer_than_the_context_is_refused_before_tokenizing() {
    let s = start_limited(&["-c", "128", "-np", "1"]);
    let t = text(256 * 1024);
    for (path, body) in [
        ("/completion", json!({"prompt": t, "n_predict": 1})),
        ("/completion", json!({"prompt": [1, 2, t], "n_predict": 1})),
        ("/v1/completions", json!({"prompt": t, "max_tokens": 1})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": t}], "max_tokens": 1}),
        ),
    ] {
        let r = s.post(path, &body);
        let v = assert_error(&r, 400, "exceed_context_size_error");
        assert_eq!(v["error"]["n_ctx"], 128, "{path}: {v}");
    }
    // Anthropic's Messages API: its own error shape.
    let r = s.post(
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": t}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    // Counting tokens is not generating: the same text is counted.
    let r = s.ok(
        "/v1/chat/completions/input_tokens",
        &json!({"messages": [{"role": "user", "content": t}]}),
    );
    assert!(r["input_tokens"].as_u64().unwrap() > 128);
    // A prompt that fits still generates.
    let r = s.ok(
        "/completion",
        &json!({"prompt": "def f(x):", "n_predict": 2}),
    );
    assert_eq!(r["tokens_predicted"], 2);
}

/// Bodies in flight are bounded (`--max-pending-bytes`): while two uploads hold the budget, a
/// request with a body is refused with 503 and a JSON body before it is read, the connection
/// closed; requests without a body are served; once an upload ends, bodies are taken again.
#[test]
fn bodies_in_flight_are_bounded() {
    let limit = (2 * BODY_LIMIT).to_string();
    let s = start_limited(&["-c", "256", "-np", "1", "--max-pending-bytes", &limit]);
    // Two uploads announce a body of the limit each and send only its start: each holds its
    // share of the budget while it arrives.
    let upload = |n: usize| {
        let mut c = connect(&s.addr);
        let head = format!(
            "POST /tokenize HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {n}\r\n\r\n{{\"content\": \"",
            s.addr
        );
        c.write_all(head.as_bytes()).unwrap();
        c
    };
    // The server has usually read both heads once a request behind them is answered. Each
    // connection is served by its own task, though: on a busy machine the body request may come
    // first (and, holding its bytes meanwhile, get an upload refused). Then start again.
    let t0 = Instant::now();
    let (first, _second, r) = loop {
        let (first, second) = (upload(BODY_LIMIT), upload(BODY_LIMIT));
        assert_eq!(s.get("/health").status, 200);
        let r = s.post("/tokenize", &json!({"content": "hello"}));
        if r.status != 200 {
            break (first, second, r);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "bodies were still taken with two uploads holding the budget"
        );
        drop((first, second));
        std::thread::sleep(Duration::from_millis(50));
    };
    let v = assert_error(&r, 503, "unavailable_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-pending-bytes"),
        "{v}"
    );
    assert_eq!(r.header("Connection"), Some("close"));
    // Requests without a body are served meanwhile.
    assert_eq!(s.get("/props").status, 200);
    // An upload that goes away gives its share back.
    drop(first);
    let t0 = Instant::now();
    loop {
        let r = s.post("/tokenize", &json!({"content": "hello"}));
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the budget was not given back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--timeout` (llama-server's read / write timeout): a body that stops arriving is answered
/// 408 with a JSON body and the connection closed; the server keeps serving.
#[test]
fn body_that_stops_arriving_times_out() {
    let s = start_limited(&["-c", "256", "-np", "1", "--timeout", "1"]);
    let mut conn = connect(&s.addr);
    let head = format!(
        "POST /completion HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"prompt\": ",
        s.addr
    );
    conn.write_all(head.as_bytes()).unwrap();
    let t0 = Instant::now();
    let mut r = BufReader::new(conn);
    let (status, headers) = read_head(&mut r);
    assert_eq!(status, 408);
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    assert!(headers
        .iter()
        .any(|(k, v)| k == "Connection" && v == "close"));
    let mut body = String::new();
    r.read_to_string(&mut body).unwrap();
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], 408, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--timeout"));
    assert_eq!(s.get("/health").status, 200);
    // A request that arrives in time is served as before.
    let r = s.ok("/completion", &json!({"prompt": "x", "n_predict": 1}));
    assert_eq!(r["tokens_predicted"], 1);
}

/// Every endpoint, asked with a wrong method, a malformed body, a body that is not an object
/// and fields of the wrong type, answers a 4xx with a JSON body carrying `error.message`.
#[test]
fn every_endpoint_answers_errors_in_json() {
    let s = Server::start(&["-c", "256", "-np", "1", "--slots"]);
    let get_paths = [
        "/health",
        "/v1/health",
        "/models",
        "/v1/models",
        "/props",
        "/slots",
        "/metrics",
    ];
    let post_paths = [
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/completion",
        "/completions",
        "/infill",
        "/v1/completions",
        "/chat/completions",
        "/v1/chat/completions",
        "/chat/completions/input_tokens",
        "/v1/chat/completions/input_tokens",
        "/v1/responses",
        "/responses",
        "/v1/responses/input_tokens",
        "/responses/input_tokens",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/slots/0?action=nope",
    ];
    // Answers that are errors must be JSON error bodies; `must_fail`: it has to be one.
    let check_with = |method: &str, path: &str, body: Option<&[u8]>, must_fail: bool| {
        let r = request(&s.addr, method, path, &[], body);
        if !must_fail && r.status < 400 {
            return r.status;
        }
        assert!(
            (400..600).contains(&r.status),
            "{method} {path}: {} {}",
            r.status,
            r.text()
        );
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_else(|e| {
            panic!("{method} {path}: {} not JSON ({e}): {}", r.status, r.text())
        });
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{method} {path}: {v}"
        );
        assert!(
            r.header("Content-Type")
                .is_some_and(|c| c.starts_with("application/json")),
            "{method} {path}: {:?}",
            r.headers
        );
        r.status
    };
    let check =
        |method: &str, path: &str, body: Option<&[u8]>| check_with(method, path, body, true);
    for p in get_paths {
        for m in ["POST", "PUT", "DELETE", "PATCH"] {
            check(m, p, Some(b"{}"));
        }
    }
    for p in post_paths {
        for m in ["GET", "PUT", "DELETE", "PATCH"] {
            check(m, p, None);
        }
        for body in [&b"{nope"[..], b"", b"[1, 2]", b"\"text\""] {
            let status = check("POST", p, Some(body));
            assert!(
                status != 500,
                "POST {p} {}: {status}",
                String::from_utf8_lossy(body)
            );
        }
        // Fields of the wrong type: each endpoint refuses the fields it reads.
        for body in [
            &b"{\"prompt\": 5, \"messages\": 5, \"content\": 5, \"tokens\": 5, \"input\": 5, \"input_prefix\": 5}"[..],
            b"{\"prompt\": \"x\", \"messages\": [], \"n_predict\": \"many\", \"max_tokens\": \"many\", \"temperature\": [], \"stream\": 3}",
        ] {
            let status = check_with("POST", p, Some(body), false);
            assert!(status != 500, "POST {p} {}: {status}", String::from_utf8_lossy(body));
        }
    }
    for p in ["/no/such/path", "/v2/chat/completions"] {
        assert_eq!(check("GET", p, None), 404);
        assert_eq!(check("POST", p, Some(b"{}")), 404);
    }
    assert_eq!(s.get("/health").status, 200);
}

/// A grammar over llguidance's limits and a self-referencing or oversized JSON schema are the
/// request's error: 400 with a message, not 500.
#[test]
fn grammars_over_the_limits_are_400() {
    let s = Server::start(&["-c", "256", "-np", "1"]);
    // A grammar of a million alternatives: over the parser's size limit.
    let mut g = String::from("root ::= ");
    for i in 0..70_000 {
        if i > 0 {
            g.push_str(" | ");
        }
        g.push_str(&format!("\"w{i}\""));
    }
    let schemas = [
        // Refers to itself without end: no finite value matches.
        json!({"$ref": "#"}),
        json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        // Nested repetitions: over the lexer's limits once generation starts (was a 500).
        json!({"type": "string", "pattern": "^(([a-z]{1,50}){1,50}){1,50}$"}),
    ];
    let mut bodies = vec![json!({"prompt": "x", "n_predict": 4, "grammar": g})];
    for sc in &schemas {
        bodies.push(json!({"prompt": "x", "n_predict": 64, "temperature": 0, "json_schema": sc}));
    }
    for stream in [false, true] {
        for b in &bodies {
            let mut b = b.clone();
            b["stream"] = json!(stream);
            let r = s.post("/completion", &b);
            // A limit reached after the stream began ends it with the error as its last event.
            let v = if r.status == 200 && stream {
                let evs = r.events();
                serde_json::from_str(evs.last().expect("events")).unwrap()
            } else {
                assert_error(&r, 400, "invalid_request_error")
            };
            assert_eq!(v["error"]["code"], 400, "{v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
            let m = v["error"]["message"].as_str().unwrap().to_string();
            // One clean line: no parser state, no backtrace.
            assert!(!m.contains('\n') && m.len() < 300, "{m}");
        }
    }
    // Through OpenAI's response_format too.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "x", "schema": schemas[0]}}}),
    );
    assert_error(&r, 400, "invalid_request_error");
    assert_eq!(s.get("/health").status, 200);
}

/// API keys: every configured key opens the API, a guess of the same length does not (keys are
/// compared in constant time; this checks the comparison still decides correctly).
#[test]
fn api_keys_compare_exactly() {
    let s = Server::start(&["-c", "256", "-np", "1", "--api-key", "key-one,key-two"]);
    let with = |k: &str| {
        let h = format!("Bearer {k}");
        request(&s.addr, "GET", "/v1/models", &[("Authorization", &h)], None)
    };
    assert_eq!(with("key-one").status, 200);
    assert_eq!(with("key-two").status, 200);
    for bad in ["key-onf", "key-tw", "key-two2", "KEY-ONE"] {
        let r = with(bad);
        let v = assert_error(&r, 401, "authentication_error");
        assert_eq!(v["error"]["message"], "Invalid API Key");
    }
    // `Bearer ` and no key (HTTP strips the space): a malformed header, said so.
    let v = assert_error(&with(""), 401, "authentication_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("'Bearer KEY'"));
    // X-Api-Key is Anthropic's header: its routes take it (tests/security.rs), others do not.
    let r = request(
        &s.addr,
        "GET",
        "/v1/models",
        &[("X-Api-Key", "key-two")],
        None,
    );
    assert_error(&r, 401, "authentication_error");
    let r = request(
        &s.addr,
        "POST",
        "/v1/messages/count_tokens",
        &[("X-Api-Key", "key-two")],
        Some(br#"{"messages": [{"role": "user", "content": "hi"}]}"#),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

fn signal(s: &Server, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &s.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
}

/// Waits for the server to exit; its status code.
fn exit_code(s: &mut Server, within: Duration) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            return st.code().unwrap_or(-1);
        }
        assert!(
            t0.elapsed() < within,
            "still running after {within:?}:\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads a chunked SSE stream to its end: its `data:` payloads.
fn read_events(r: &mut BufReader<TcpStream>) -> Vec<String> {
    let mut text = String::new();
    while let Some(c) = read_chunk(r) {
        text.push_str(&String::from_utf8_lossy(&c));
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect()
}

/// SIGTERM: no new connections; a request that ends within the grace period ends normally;
/// one that would run on is cancelled when it is over, its stream ending with an error event
/// (a non-streamed one with an error body); the process exits 0 and the port closes.
#[test]
fn sigterm_drains_then_cancels() {
    let mut s = Server::start(&["-c", "32768", "-np", "3", "--shutdown-grace", "2"]);
    // Runs until the context is full: far longer than the grace period.
    let long = json!({"prompt": "def f(x):", "n_predict": -1, "ignore_eos": true,
                      "stream": true, "temperature": 0});
    let mut stream = open_stream(&s.addr, "/completion", &long.to_string());
    let first = read_chunk(&mut stream).expect("a first chunk");
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    // A non-streamed long request, and a short one that ends within the grace period.
    let addr = s.addr.clone();
    let long_plain = std::thread::spawn(move || {
        let b = json!({"prompt": "def g(y):", "n_predict": -1, "ignore_eos": true});
        request(
            &addr,
            "POST",
            "/completion",
            &[],
            Some(b.to_string().as_bytes()),
        )
    });
    let short = json!({"prompt": "def h(z):", "n_predict": 48, "ignore_eos": true,
                       "stream": true, "temperature": 0});
    let mut short_stream = open_stream(&s.addr, "/completion", &short.to_string());
    assert!(read_chunk(&mut short_stream).is_some());
    std::thread::sleep(Duration::from_millis(200));
    let t_signal = Instant::now();
    signal(&s, "-TERM");
    assert!(s.log_shows("shutting down"), "{}", s.log());

    // No new connections.
    let t0 = Instant::now();
    while TcpStream::connect(&s.addr).is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the port still accepts"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The short request ends normally.
    let evs = read_events(&mut short_stream);
    let last: Value = serde_json::from_str(evs.last().expect("events")).unwrap();
    assert_eq!(last["stop"], true, "{last}");
    assert_eq!(last["tokens_predicted"], 48, "{last}");

    // The long stream ends with an error event after the grace period.
    let evs = read_events(&mut stream);
    assert!(t_signal.elapsed() >= Duration::from_millis(1900));
    let last: Value = serde_json::from_str(evs.last().expect("events")).unwrap();
    assert_eq!(last["error"]["code"], 503, "{last}");
    assert_eq!(last["error"]["type"], "unavailable_error", "{last}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"),
        "{last}"
    );
    // Every event before it is a partial result.
    for e in &evs[..evs.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert_eq!(v["stop"], false, "{v}");
    }
    let r = long_plain.join().unwrap();
    assert_error(&r, 503, "unavailable_error");

    assert_eq!(exit_code(&mut s, Duration::from_secs(10)), 0, "{}", s.log());
    assert!(TcpStream::connect(&s.addr).is_err());
}

/// SIGINT with nothing running exits at once with status 0; a second signal during the grace
/// period cancels what runs at once.
#[test]
fn sigint_exits_cleanly() {
    let mut s = Server::start(&["-c", "256", "-np", "1"]);
    assert_eq!(s.get("/health").status, 200);
    signal(&s, "-INT");
    assert_eq!(exit_code(&mut s, Duration::from_secs(5)), 0, "{}", s.log());

    let mut s = Server::start(&["-c", "32768", "-np", "1", "--shutdown-grace", "600"]);
    let long = json!({"prompt": "def f(x):", "n_predict": -1, "ignore_eos": true, "stream": true});
    let mut stream = open_stream(&s.addr, "/completion", &long.to_string());
    assert!(read_chunk(&mut stream).is_some());
    signal(&s, "-TERM");
    assert!(s.log_shows("shutting down"));
    signal(&s, "-TERM");
    let evs = read_events(&mut stream);
    let last: Value = serde_json::from_str(evs.last().expect("events")).unwrap();
    assert_eq!(last["error"]["code"], 503, "{last}");
    assert_eq!(exit_code(&mut s, Duration::from_secs(10)), 0, "{}", s.log());
    let _ = BufRead::fill_buf(&mut stream);
}

/// llama-server's `t_max_predict_ms`: once generation has run that long, it ends at the next
/// token with a newline (`stop_type` "limit", as `n_predict` would); without it the same request
/// runs to `n_predict`. The grammar makes every third-ish token a line end.
#[test]
fn time_limit_ends_generation_at_a_line_end() {
    let s = Server::start(&["-c", "1024", "-np", "1"]);
    let body = |limit: u64| {
        json!({"prompt": "x", "n_predict": 300, "temperature": 0, "ignore_eos": true,
               "grammar": "root ::= (\"ab\" \"\\n\")+", "t_max_predict_ms": limit})
    };
    let full = s.ok("/completion", &body(0));
    assert_eq!(full["tokens_predicted"], 300, "{full}");
    for path in ["/completion", "/v1/completions"] {
        let mut b = body(1);
        if path == "/v1/completions" {
            b["max_tokens"] = json!(300);
        }
        let v = s.ok(path, &b);
        let (content, n) = if path == "/completion" {
            assert_eq!(v["stop_type"], "limit", "{v}");
            (
                v["content"].as_str().unwrap().to_string(),
                v["tokens_predicted"].as_u64().unwrap(),
            )
        } else {
            assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
            (
                v["choices"][0]["text"].as_str().unwrap().to_string(),
                v["usage"]["completion_tokens"].as_u64().unwrap(),
            )
        };
        assert!(n < 300, "{path}: stopped after {n} tokens");
        assert!(content.ends_with('\n'), "{path}: {content:?}");
        assert!(full["content"].as_str().unwrap().starts_with(&content));
    }
}

/// Peak resident memory of a process (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// Tokenizing a large body takes memory near its size, not many times it (before: the
/// tokenizer's bookkeeping of ~160 bytes per input byte — one 15.6 MB `/tokenize` held 2.5 GB;
/// now long texts are encoded in pieces and the response is written straight from the ids).
/// The ids are those of the same text tokenized in small parts joined at line ends.
#[test]
fn tokenizing_a_large_body_takes_memory_near_its_size() {
    let _alone = heavy();
    let s = Server::start(&["-c", "256", "-np", "1"]);
    let n = 3_000_000;
    let content = text(n);
    let before = peak_rss(s.child.id());
    let r = s.post("/tokenize", &json!({ "content": content }));
    assert_eq!(r.status, 200);
    let grown = peak_rss(s.child.id()).saturating_sub(before);
    let ids = r.json()["tokens"].as_array().expect("tokens").len();
    assert!(ids > n / 10, "{ids} tokens");
    assert!(
        grown < 30 * n as u64,
        "peak RSS grew by {} MB for a {} MB body",
        grown >> 20,
        n >> 20
    );
    // Every line of `text` is the same, so the whole text's ids are the first line's repeated
    // (the body's last line is cut short: compared up to it).
    let line = "def f(x): return x * 42 + y_1 # note\n";
    let one = s.ok("/tokenize", &json!({ "content": line }))["tokens"]
        .as_array()
        .expect("tokens")
        .clone();
    let all = r.json()["tokens"].as_array().expect("tokens").clone();
    let whole_lines = n / line.len();
    for (i, chunk) in all[..one.len() * whole_lines].chunks(one.len()).enumerate() {
        assert_eq!(chunk, one.as_slice(), "line {i}");
    }
}
