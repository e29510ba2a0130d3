//! What a hostile web page or a sloppy client meets, over real HTTP against the real binary
//! (issue 47): CORS allows only loopback origins unless told otherwise, a loopback listener
//! answers only requests for a loopback `Host` (DNS rebinding), API keys are read strictly,
//! every error has a JSON body — the HTTP layer's own included — empty `messages` are refused,
//! `/v1/messages` honours `grammar` / `json_schema`, and requests are validated before the
//! model's abilities are.

use serde_json::{json, Value};
use std::io::{BufReader, Read, Write};
use std::sync::OnceLock;

mod common;
use common::http::*;
use common::Server;

/// Loopback origins a page on this machine has (any port, http or https).
const LOCAL_ORIGINS: [&str; 7] = [
    "http://localhost",
    "http://localhost:5173",
    "https://localhost:8443",
    "http://127.0.0.1",
    "http://127.0.0.1:3000",
    "http://[::1]",
    "http://[::1]:3000",
];

/// Origins of other sites (and the opaque `null` of sandboxed frames and files).
const FOREIGN_ORIGINS: [&str; 6] = [
    "http://evil.test",
    "https://web.mydomain.fr",
    "http://localhost.evil.test",
    "http://notlocalhost",
    "null",
    "web.mydomain.fr",
];

fn preflight(s: &Server, origin: &str) -> Resp {
    request(
        &s.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", origin),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "Authorization, Content-Type",
            ),
        ],
        None,
    )
}

fn get_with(s: &Server, path: &str, headers: &[(&str, &str)]) -> Resp {
    request(&s.addr, "GET", path, headers, None)
}

fn acao(r: &Resp) -> Option<&str> {
    r.header("Access-Control-Allow-Origin")
}

fn acac(r: &Resp) -> Option<&str> {
    r.header("Access-Control-Allow-Credentials")
}

/// Sends `head` (request line and headers, without the blank line) and `body` as they are on a
/// new connection to `addr`, and reads the whole answer (the request says `Connection: close`).
fn raw(addr: &str, head: &str, body: &[u8]) -> Resp {
    let mut s = connect(addr);
    let mut bytes = head.as_bytes().to_vec();
    bytes.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    bytes.extend_from_slice(body);
    s.write_all(&bytes).unwrap();
    read_answer(BufReader::new(s))
}

fn read_answer(mut r: impl std::io::BufRead) -> Resp {
    let (status, headers) = read_head(&mut r);
    let mut body = Vec::new();
    r.read_to_end(&mut body).unwrap();
    Resp {
        status,
        headers,
        body,
    }
}

/// A GET of `/health` naming `host` (None: no Host header, over HTTP/1.0).
fn health_for(s: &Server, host: Option<&str>) -> Resp {
    match host {
        Some(h) => raw(&s.addr, &format!("GET /health HTTP/1.1\r\nHost: {h}"), b""),
        None => raw(&s.addr, "GET /health HTTP/1.0", b""),
    }
}

fn port(s: &Server) -> &str {
    s.addr.rsplit_once(':').unwrap().1
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// With no `--cors-origins`, pages served from this machine may call the server (their origin is
/// echoed, credentials allowed); any other origin gets neither header — on preflights, answers
/// and errors alike — so its page cannot read what the server answers.
#[test]
fn cors_default_allows_only_loopback_origins() {
    let s = Server::start(&["-c", "256", "-np", "1", "--api-key", "k1"]);
    for origin in LOCAL_ORIGINS {
        let r = preflight(&s, origin);
        assert_eq!(r.status, 200, "{origin}");
        assert_eq!(acao(&r), Some(origin));
        assert_eq!(acac(&r), Some("true"), "{origin}");
        assert_eq!(
            r.header("Access-Control-Allow-Methods"),
            Some("GET, POST, DELETE, OPTIONS")
        );
        let r = get_with(&s, "/health", &[("Origin", origin)]);
        assert_eq!(acao(&r), Some(origin));
        let r = get_with(
            &s,
            "/props",
            &[("Origin", origin), ("Authorization", "Bearer k1")],
        );
        assert_eq!((r.status, acao(&r)), (200, Some(origin)));
    }
    for origin in FOREIGN_ORIGINS {
        let r = preflight(&s, origin);
        assert_eq!(r.status, 200, "{origin}");
        assert_eq!(acao(&r), None, "{origin}");
        assert_eq!(acac(&r), None, "{origin}");
        let r = get_with(&s, "/health", &[("Origin", origin)]);
        assert_eq!(
            (r.status, acao(&r), acac(&r)),
            (200, None, None),
            "{origin}"
        );
        // A 401 tells a foreign page nothing either.
        let r = get_with(&s, "/props", &[("Origin", origin)]);
        assert_error(&r, 401, "authentication_error");
        assert_eq!(acao(&r), None, "{origin}");
    }
    // No Origin (not a browser's cross-origin request): no CORS header.
    let r = s.get("/health");
    assert_eq!((acao(&r), acac(&r)), (None, None));
    // Without an API key the rule is the same: it is what protects such a server.
    let s = Server::start(&["-c", "256", "-np", "1"]);
    let chat = json!({"messages": user("hi"), "max_tokens": 1}).to_string();
    let r = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[("Origin", "http://evil.test")],
        Some(chat.as_bytes()),
    );
    assert_eq!((r.status, acao(&r)), (200, None));
    let r = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[("Origin", "http://localhost:8080")],
        Some(chat.as_bytes()),
    );
    assert_eq!((r.status, acao(&r)), (200, Some("http://localhost:8080")));
    assert!(!s.log().contains("CORS allows all origins"), "{}", s.log());
}

/// `--cors-origins '*'` is llama-server's default back: any origin echoed with credentials, on
/// preflights and on every answer, errors included (and a warning when no key protects it).
#[test]
fn cors_star_and_lists_restore_what_is_asked() {
    let s = Server::start(&["-c", "256", "-np", "1", "--cors-origins", "*"]);
    for origin in ["http://evil.test", "web.mydomain.fr", "http://localhost"] {
        let r = preflight(&s, origin);
        assert_eq!(
            (r.status, acao(&r), acac(&r)),
            (200, Some(origin), Some("true"))
        );
        let r = get_with(&s, "/no/such/path", &[("Origin", origin)]);
        assert_error(&r, 404, "not_found_error");
        assert_eq!(acao(&r), Some(origin));
    }
    // No Origin: the empty echo llama-server sends.
    assert_eq!(acao(&s.get("/health")), Some(""));
    assert!(
        s.log_shows("no API key is set and CORS allows all origins"),
        "{}",
        s.log()
    );
    drop(s);
    let s = Server::start(&["-c", "256", "--cors-origins", "*", "--api-key", "k"]);
    let r = get_with(&s, "/props", &[("Origin", "http://evil.test")]);
    assert_error(&r, 401, "authentication_error");
    assert_eq!(acao(&r), Some("http://evil.test"));
    assert!(!s.log().contains("CORS allows all origins"));
    drop(s);
    // A list: each listed origin (a foreign one too), nothing for the rest — loopback included.
    let s = Server::start(&[
        "-c",
        "256",
        "--cors-origins",
        "https://app.test,http://localhost:3000",
    ]);
    for (origin, allowed) in [
        ("https://app.test", true),
        ("http://localhost:3000", true),
        ("http://localhost:3001", false),
        ("http://evil.test", false),
    ] {
        let r = preflight(&s, origin);
        let want = allowed.then_some(origin);
        assert_eq!(acao(&r), want, "{origin}");
        assert_eq!(acac(&r), allowed.then_some("true"), "{origin}");
        assert_eq!(acao(&get_with(&s, "/health", &[("Origin", origin)])), want);
    }
}

/// A server on 127.0.0.1 answers requests for loopback names only: a page whose own name was
/// made to resolve to 127.0.0.1 (DNS rebinding) gets a 403 with a JSON error.
#[test]
fn loopback_listener_refuses_foreign_host_names() {
    let s = Server::start(&["-c", "256", "-np", "1"]);
    let p = port(&s);
    for host in [
        format!("127.0.0.1:{p}"),
        format!("localhost:{p}"),
        format!("LocalHost:{p}"),
        "localhost".to_string(),
        format!("[::1]:{p}"),
        format!("127.0.0.2:{p}"),
    ] {
        let r = health_for(&s, Some(&host));
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
    for host in [
        format!("evil.test:{p}"),
        "evil.test".to_string(),
        format!("localhost.evil.test:{p}"),
        format!("192.168.1.20:{p}"),
        format!("[::2]:{p}"),
    ] {
        let r = health_for(&s, Some(&host));
        let v = assert_error(&r, 403, "permission_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("--allowed-hosts"), "{msg}");
    }
    // Every route, a preflight and the Anthropic API (in its own error shape) alike.
    let evil = format!("evil.test:{p}");
    let body = json!({"messages": user("hi"), "max_tokens": 1}).to_string();
    let r = raw(
        &s.addr,
        &format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {evil}\r\nContent-Type: application/json\r\nContent-Length: {}",
            body.len()
        ),
        body.as_bytes(),
    );
    assert_error(&r, 403, "permission_error");
    let r = raw(
        &s.addr,
        &format!(
            "OPTIONS /completion HTTP/1.1\r\nHost: {evil}\r\nOrigin: http://{evil}\r\nAccess-Control-Request-Method: POST"
        ),
        b"",
    );
    assert_eq!((r.status, acao(&r)), (403, None));
    let r = raw(
        &s.addr,
        &format!(
            "POST /v1/messages HTTP/1.1\r\nHost: {evil}\r\nContent-Type: application/json\r\nContent-Length: {}",
            body.len()
        ),
        body.as_bytes(),
    );
    assert_eq!(r.status, 403);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "permission_error");
    // An absolute target names the host in place of Host.
    let r = raw(
        &s.addr,
        &format!("GET http://{evil}/health HTTP/1.1\r\nHost: 127.0.0.1:{p}"),
        b"",
    );
    assert_error(&r, 403, "permission_error");
    // Two Host headers are a malformed request.
    let r = raw(
        &s.addr,
        &format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nHost: {evil}"),
        b"",
    );
    assert_error(&r, 400, "invalid_request_error");
    // No Host at all (HTTP/1.0): not a browser, answered.
    assert_eq!(health_for(&s, None).status, 200);
    // The test client's own requests (Host: 127.0.0.1:PORT) keep working.
    assert_eq!(s.get("/health").status, 200);
}

/// `--allowed-hosts` adds names (a leading dot: the domain and its subdomains); `*` turns the
/// check off; a server bound to all interfaces is not checked; a bad entry stops the start.
#[test]
fn allowed_hosts_and_opt_outs() {
    let s = Server::start(&["-c", "256", "--allowed-hosts", "llm.lan, .corp.test"]);
    for (host, status) in [
        ("llm.lan:8080", 200),
        ("LLM.LAN", 200),
        ("corp.test", 200),
        ("gpu1.corp.test:443", 200),
        ("localhost", 200),
        ("evilcorp.test", 403),
        ("x.llm.lan", 403),
    ] {
        assert_eq!(health_for(&s, Some(host)).status, status, "{host}");
    }
    drop(s);
    let s = Server::start(&["-c", "256", "--allowed-hosts", "*"]);
    assert_eq!(health_for(&s, Some("evil.test")).status, 200);
    drop(s);
    let s = Server::start(&["-c", "256", "--host", "0.0.0.0"]);
    assert_eq!(health_for(&s, Some("evil.test")).status, 200);
    drop(s);
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "-m", common::model().to_str().unwrap()])
        .args(["--port", "0", "--allowed-hosts", "http://llm.lan:8080"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--allowed-hosts"), "{err}");
}

/// A UNIX socket cannot be reached from a browser: its requests are not checked.
#[cfg(unix)]
#[test]
fn unix_socket_is_not_host_checked() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("specd.sock");
    let hosts = format!("127.0.0.1,{}", sock.display());
    let s = Server::start(&["-c", "256", "--host", &hosts]);
    assert!(s.log_shows("listening on unix://"), "{}", s.log());
    let mut c = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let r = read_answer(BufReader::new(c));
    assert_eq!(r.status, 200, "{}", r.text());
    // The TCP listener of the same server is checked.
    assert_eq!(health_for(&s, Some("evil.test")).status, 403);
}

/// `Authorization` must be `Bearer KEY` (the scheme in any case, the key exactly);
/// `x-api-key` opens the Anthropic routes only.
#[test]
fn api_keys_are_read_strictly() {
    let s = Server::start(&["-c", "256", "-np", "1", "--api-key", "k1,key-two"]);
    let models = |auth: &[(&str, &str)]| get_with(&s, "/v1/models", auth);
    for ok in ["Bearer k1", "bearer k1", "BEARER key-two", "Bearer  k1"] {
        assert_eq!(models(&[("Authorization", ok)]).status, 200, "{ok}");
    }
    // Whitespace around the value is HTTP's to strip (RFC 9110, 5.5): a trailing space never
    // reaches the key.
    assert_eq!(models(&[("Authorization", "Bearer k1 ")]).status, 200);
    for (bad, hint) in [
        ("k1", true),
        ("Basic k1", true),
        ("Bearer", true),
        ("Bearerk1", true),
        ("Bearer k1 x", false),
        ("Bearer k1,key-two", false),
        ("Bearer K1", false),
        ("Bearer\tk1", true),
    ] {
        let r = models(&[("Authorization", bad)]);
        let v = assert_error(&r, 401, "authentication_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.starts_with("Invalid API Key"), "{bad}: {msg}");
        assert_eq!(msg.contains("'Bearer KEY'"), hint, "{bad}: {msg}");
    }
    // x-api-key: not on the OpenAI and llama.cpp routes...
    for path in ["/v1/models", "/props"] {
        let r = get_with(&s, path, &[("X-Api-Key", "k1")]);
        let v = assert_error(&r, 401, "authentication_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-api-key"));
    }
    let tok = br#"{"content": "a"}"#;
    let r = request(
        &s.addr,
        "POST",
        "/tokenize",
        &[("X-Api-Key", "k1")],
        Some(tok),
    );
    assert_error(&r, 401, "authentication_error");
    // ...but on Anthropic's, where its SDKs send it; a wrong key there is Anthropic's error.
    let count = json!({"messages": user("hi")}).to_string();
    let post_count = |h: &[(&str, &str)]| {
        request(
            &s.addr,
            "POST",
            "/v1/messages/count_tokens",
            h,
            Some(count.as_bytes()),
        )
    };
    assert_eq!(post_count(&[("X-Api-Key", "key-two")]).status, 200);
    assert_eq!(post_count(&[("Authorization", "Bearer k1")]).status, 200);
    let r = post_count(&[("X-Api-Key", "key-two ")]);
    assert_eq!(r.status, 200, "HTTP strips the trailing space");
    let r = post_count(&[("X-Api-Key", "nope")]);
    assert_eq!(r.status, 401);
    assert_eq!(
        r.json(),
        json!({"type": "error", "error": {"type": "authentication_error", "message": "Invalid API Key"}})
    );
    let msg = json!({"messages": user("hi"), "max_tokens": 1}).to_string();
    let r = request(
        &s.addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "k1")],
        Some(msg.as_bytes()),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["type"], "message");
}

/// Every error answer is JSON: hyper's own refusals of a request it cannot parse, axum's
/// rejections, unknown routes and methods, bodies over the limit.
#[test]
fn http_layer_errors_have_json_bodies() {
    let s = Server::start(&["-c", "256", "-np", "1"]);
    let host = format!("Host: {}", s.addr);
    // A NUL (or another control byte) in a header value, a header line without a colon, a
    // request line that is not HTTP: hyper refuses them before the router sees a request.
    for head in [
        format!("GET /health HTTP/1.1\r\n{host}\r\nX-Test: a\0b"),
        format!("GET /health HTTP/1.1\r\n{host}\r\nX-Test: a\x01b"),
        format!("GET /health HTTP/1.1\r\n{host}\r\nno colon here"),
        format!("GET /a b c HTTP/1.1\r\n{host}"),
        format!("GET /health HTTP/9.9\r\n{host}"),
    ] {
        let r = raw(&s.addr, &head, b"");
        let v = assert_error(&r, 400, "invalid_request_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("malformed HTTP request"));
        assert!(r
            .header("Content-Type")
            .is_some_and(|t| t.starts_with("application/json")));
        assert_eq!(
            r.header("Content-Length")
                .map(|n| n.parse::<usize>().unwrap()),
            Some(r.body.len())
        );
    }
    // Over hyper's 100 header fields: 431.
    let mut head = format!("GET /health HTTP/1.1\r\n{host}");
    for i in 0..120 {
        head.push_str(&format!("\r\nX-Many-{i}: v"));
    }
    let r = raw(&s.addr, &head, b"");
    assert_error(&r, 431, "invalid_request_error");
    // The server keeps serving, on kept-alive connections too: an answer after an error head is
    // written as it is.
    let mut c = connect(&s.addr);
    let ok = format!("GET /health HTTP/1.1\r\n{host}\r\n\r\n");
    let bad = format!("GET /health HTTP/1.1\r\n{host}\r\nX: \0\r\n\r\n");
    c.write_all(format!("{ok}{bad}").as_bytes()).unwrap();
    let mut r = BufReader::new(c);
    let (status, headers) = read_head(&mut r);
    assert_eq!(status, 200);
    let n: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    let mut first = vec![0; n];
    r.read_exact(&mut first).unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&first).unwrap()["status"],
        "ok"
    );
    let second = read_answer(r);
    assert_error(&second, 400, "invalid_request_error");

    // Axum's and the router's: bad JSON, a body that is no object, an unknown route, a known
    // route with another method, a path parameter that is not text.
    let r = request(&s.addr, "POST", "/completion", &[], Some(b"{not json"));
    assert_error(&r, 400, "invalid_request_error");
    let r = request(&s.addr, "POST", "/completion", &[], Some(b"[1]"));
    assert_error(&r, 400, "invalid_request_error");
    assert_error(&s.get("/no/such/path"), 404, "not_found_error");
    assert_error(&s.get("/v1/chat/completions"), 404, "not_found_error");
    let r = request(&s.addr, "POST", "/slots/%FF?action=save", &[], Some(b"{}"));
    assert_error(&r, 400, "invalid_request_error");
    // On Anthropic's routes, Anthropic's shape.
    let r = s.get("/v1/messages");
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "not_found_error");
    assert_eq!(r.json()["type"], "error");
    let r = request(&s.addr, "POST", "/v1/messages", &[], Some(b"{not json"));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    // A body over the limit, announced: refused before it is read.
    let big = raw(
        &s.addr,
        &format!(
            "POST /v1/messages HTTP/1.1\r\n{host}\r\nContent-Type: application/json\r\nContent-Length: 999999999999"
        ),
        b"",
    );
    assert_eq!(big.status, 413);
    assert_eq!(big.json()["error"]["type"], "request_too_large");
    assert_eq!(s.get("/health").status, 200);
}

/// Empty `messages` is a 400 on every endpoint that takes them (llama-server renders an empty
/// conversation and answers).
#[test]
fn empty_messages_are_refused() {
    let s = Server::start(&["-c", "256", "-np", "1"]);
    for path in [
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/chat/completions/input_tokens",
        "/apply-template",
    ] {
        let r = s.post(path, &json!({"messages": [], "max_tokens": 1}));
        let v = assert_error(&r, 400, "invalid_request_error");
        assert_eq!(
            v["error"]["message"], "'messages' must contain at least one message",
            "{path}"
        );
        assert_eq!(v["error"]["param"], "messages");
    }
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        let r = s.post(
            path,
            &json!({"messages": [], "system": "You are terse.", "max_tokens": 1}),
        );
        assert_eq!(r.status, 400, "{path}");
        assert_eq!(
            r.json(),
            json!({"type": "error", "error": {"type": "invalid_request_error",
                   "message": "messages: at least one message is required"}})
        );
    }
    // One message is enough.
    s.ok("/apply-template", &json!({"messages": user("hi")}));
}

/// `/v1/messages` takes llama.cpp's `grammar` and `json_schema` as `/v1/chat/completions` does:
/// the answer follows them, and a bad one is a 400.
#[test]
fn messages_honour_grammar_and_json_schema() {
    let s = Server::start(&["-c", "512", "-np", "1", "--temp", "0"]);
    let text = |v: &Value| v["content"][0]["text"].as_str().unwrap_or("").to_string();
    let v = s.ok(
        "/v1/messages",
        &json!({"messages": user("hi"), "max_tokens": 20, "grammar": "root ::= \"yes\""}),
    );
    assert_eq!(text(&v), "yes", "{v}");
    assert_eq!(v["stop_reason"], "end_turn");
    let v = s.ok(
        "/v1/messages",
        &json!({"messages": user("hi"), "max_tokens": 20,
                "json_schema": {"type": "boolean"}}),
    );
    let out: Value = serde_json::from_str(text(&v).trim()).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(out.is_boolean(), "{v}");
    // Streamed too.
    let r = s.post(
        "/v1/messages",
        &json!({"messages": user("hi"), "max_tokens": 20, "stream": true,
                "grammar": "root ::= \"yes\""}),
    );
    assert_eq!(r.status, 200);
    let streamed: String = r
        .events()
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|e| e["delta"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, "yes");
    for bad in [
        json!({"grammar": "root ::= ((("}),
        json!({"grammar": 5}),
        json!({"json_schema": "not a schema"}),
    ] {
        let mut body = json!({"messages": user("hi"), "max_tokens": 4});
        for (k, v) in bad.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = s.post("/v1/messages", &body);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    assert_eq!(s.get("/health").status, 200);
}

/// The tiny model without FIM tokens.
fn model_without_fim() -> &'static std::path::PathBuf {
    static M: OnceLock<(tempfile::TempDir, std::path::PathBuf)> = OnceLock::new();
    &M.get_or_init(|| {
        common::make_model(
            "nofim.gguf",
            &[
                "--preset",
                "qwen35-tiny",
                "--style",
                "repetitive",
                "--no-fim",
            ],
        )
    })
    .1
}

/// A bad request is told what is wrong with it (400) before a model without FIM tokens says it
/// cannot infill (501): the answer to a request does not depend on the model it was sent to.
#[test]
fn requests_are_validated_before_the_models_abilities() {
    let s = Server::start_with(model_without_fim(), &["-c", "256"], &[]);
    for (path, body, needle) in [
        (
            "/infill",
            json!({"input_suffix": "b"}),
            "\"input_prefix\" is required",
        ),
        (
            "/infill",
            json!({"input_prefix": "a"}),
            "\"input_suffix\" is required",
        ),
        (
            "/infill",
            json!({"input_prefix": 5, "input_suffix": "b"}),
            "\"input_prefix\" must be",
        ),
        (
            "/infill",
            json!({"input_prefix": "a", "input_suffix": "b", "input_extra": 1}),
            "\"input_extra\" must be",
        ),
        (
            "/infill",
            json!({"input_prefix": "a", "input_suffix": "b", "temperature": "hot"}),
            "temperature",
        ),
        (
            "/v1/completions",
            json!({"suffix": "b", "max_tokens": 2}),
            "\"prompt\" is required",
        ),
        (
            "/v1/completions",
            json!({"prompt": {"x": 1}, "suffix": "b"}),
            "\"prompt\" must be",
        ),
    ] {
        let r = s.post(path, &body);
        let v = assert_error(&r, 400, "invalid_request_error");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{path} {body}: {msg}");
    }
    // A valid request: the model's 501.
    let r = s.post(
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_error(&r, 501, "not_supported_error");
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "a", "suffix": "b", "max_tokens": 2}),
    );
    assert_error(&r, 501, "not_supported_error");
}
