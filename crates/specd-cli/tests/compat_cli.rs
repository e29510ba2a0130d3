//! llama-server's command line on `specd serve`, end to end: several `--host` addresses,
//! `LLAMA_ARG_*` environment variables (the command line wins), built-in chat template names,
//! the flags llama.cpp's own server tests start servers with (accepted, ignored with a warning,
//! or refused saying why), and `--sleep-idle-seconds`.

use serde_json::{json, Value};
use std::io::{BufReader, Read};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::http::*;
use common::{model, Server, BIN};

/// `specd serve ARGS` that must fail at start-up: its stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["serve", "-m"])
        .arg(model())
        .args(["--port", "0", "-t", "1"])
        .args(args)
        .output()
        .expect("running specd serve");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} started:\n{err}");
    err
}

fn props(s: &Server) -> Value {
    let r = s.get("/props");
    assert_eq!(r.status, 200);
    r.json()
}

/// Waits for `line` in the server's log (a server prints its addresses one after the other;
/// [`Server::start`] returns at the first).
fn wait_log(s: &Server, line: &str) {
    let t0 = Instant::now();
    while !s.log().contains(line) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no '{line}' in:\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A port free on 127.0.0.1 and on ::1 (None: no IPv6 loopback here).
fn free_port_v4_v6() -> Option<u16> {
    for _ in 0..20 {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
        let port = v4.local_addr().ok()?.port();
        match std::net::TcpListener::bind(("::1", port)) {
            Ok(_) => return Some(port),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(_) => return None,
        }
    }
    None
}

#[test]
fn several_hosts_serve_the_same_api() {
    let Some(port) = free_port_v4_v6() else {
        eprintln!("no IPv6 loopback: skipped");
        return;
    };
    let port_s = port.to_string();
    let s = Server::start(&[
        "--host",
        "127.0.0.1,::1",
        "--port",
        &port_s,
        "--api-key",
        "k",
        "-c",
        "128",
    ]);
    // Both addresses are printed, as llama-server does.
    wait_log(&s, &format!("listening on http://127.0.0.1:{port}"));
    wait_log(&s, &format!("listening on http://[::1]:{port}"));
    for addr in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        let r = request(&addr, "GET", "/health", &[], None);
        assert_eq!(r.status, 200, "{addr}");
        let r = request(&addr, "POST", "/v1/completions", &[], Some(b"{}"));
        assert_eq!(r.status, 401, "{addr}");
        let body = json!({"prompt": "Once upon a time", "max_tokens": 4}).to_string();
        let r = request(
            &addr,
            "POST",
            "/v1/completions",
            &[("Authorization", "Bearer k")],
            Some(body.as_bytes()),
        );
        assert_eq!(r.status, 200, "{addr}: {}", r.text());
        assert_eq!(r.json()["object"], "text_completion");
    }

    // As in llama-server: one port for every address, so --port 0 needs a single TCP address.
    let err = refused(&["--host", "127.0.0.1,::1"]);
    assert!(
        err.contains("--port 0 is not supported with multiple TCP addresses"),
        "{err}"
    );
    let err = refused(&["--host", " , "]);
    assert!(
        err.contains("--host requires at least one address"),
        "{err}"
    );
}

#[cfg(unix)]
#[test]
fn a_host_ending_in_sock_is_a_unix_socket() {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("specd.sock");
    let host = format!("127.0.0.1,{}", sock.display());
    let s = Server::start(&["--host", &host, "-c", "128"]);
    wait_log(&s, &format!("listening on unix://{}", sock.display()));
    let mut c = UnixStream::connect(&sock).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(c);
    let (status, _) = read_head(&mut r);
    let mut body = String::new();
    r.read_to_string(&mut body).unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("\"ok\""), "{body}");
    // The TCP address serves too.
    assert_eq!(s.get("/health").status, 200);
}

#[test]
fn environment_variables_set_what_the_command_line_does_not() {
    let env = [
        ("LLAMA_ARG_ALIAS", "from-env"),
        ("LLAMA_ARG_ENDPOINT_METRICS", "1"),
        ("LLAMA_ARG_NO_ENDPOINT_SLOTS", "1"),
        ("LLAMA_ARG_N_PARALLEL", "3"),
        // Unbindable here: the command line's --host must win (llama.cpp's test does this too).
        ("LLAMA_ARG_HOST", "192.0.2.1"),
        ("LLAMA_ARG_N_GPU_LAYERS", "99"),
    ];
    let s = Server::start_env(&["--host", "127.0.0.1", "-c", "192"], &env);
    assert_eq!(s.get("/v1/models").json()["data"][0]["id"], "from-env");
    assert_eq!(s.get("/metrics").status, 200);
    assert_eq!(s.get("/slots").status, 501);
    assert_eq!(props(&s)["total_slots"], 3);
    let log = s.log();
    assert!(
        log.contains("LLAMA_ARG_HOST is set, but the command line's --host wins"),
        "{log}"
    );
    assert!(
        log.contains("LLAMA_ARG_N_GPU_LAYERS=99 ignored: specd computes on the CPU"),
        "{log}"
    );
    drop(s);

    // The command line wins, in any of llama-server's spellings.
    let s = Server::start_env(
        &[
            "-a",
            "from-cli",
            "--slots",
            "-np",
            "2",
            "-c",
            "128",
            "--host=127.0.0.1",
        ],
        &env,
    );
    assert_eq!(s.get("/v1/models").json()["data"][0]["id"], "from-cli");
    assert_eq!(s.get("/slots").status, 200);
    assert_eq!(props(&s)["total_slots"], 2);
    drop(s);

    let with_env = |k: &str, v: &str| {
        let out = Command::new(BIN)
            .args(["serve", "-m"])
            .arg(model())
            .args(["--port", "0", "-c", "128"])
            .env(k, v)
            .output()
            .expect("running specd serve");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Without --host on the command line, the environment's is used.
    let err = with_env("LLAMA_ARG_HOST", "192.0.2.1");
    assert!(err.contains("binding 192.0.2.1 port 0"), "{err}");
    // A refused feature is refused from the environment too, naming the variable.
    let err = with_env("LLAMA_ARG_MMPROJ", "mmproj.gguf");
    assert!(
        err.contains("'--mmproj' (from LLAMA_ARG_MMPROJ) is not supported by specd: specd serves text models only"),
        "{err}"
    );
    let err = with_env("LLAMA_ARG_ENDPOINT_SLOTS", "maybe");
    assert!(
        err.contains("LLAMA_ARG_ENDPOINT_SLOTS=maybe: not a boolean"),
        "{err}"
    );
}

#[test]
fn named_chat_templates_render_as_llama_server() {
    // llama.cpp's test_apply_chat_template.
    let s = Server::start(&["--chat-template", "command-r", "-c", "128"]);
    let r = s.ok(
        "/apply-template",
        &json!({"messages": [
            {"role": "system", "content": "You are a test."},
            {"role": "user", "content": "Hi there"},
        ]}),
    );
    assert_eq!(
        r["prompt"],
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    );
    drop(s);

    // From the environment, with content that llama3 trims (llama-server's own output).
    let s = Server::start_env(&["-c", "128"], &[("LLAMA_ARG_CHAT_TEMPLATE", "llama3")]);
    let r = s.ok(
        "/apply-template",
        &json!({"messages": [
            {"role": "system", "content": "  Be kind.\n"},
            {"role": "user", "content": " \tpadded question \n"},
        ]}),
    );
    assert_eq!(
        r["prompt"],
        "<|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\npadded question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    drop(s);

    let err = refused(&["--chat-template", "llama9"]);
    assert!(
        err.contains(
            "--chat-template 'llama9' is neither Jinja source nor a built-in template name"
        ) && err.contains("chatml, command-r,")
            && err.contains("llama3, llama4,"),
        "{err}"
    );
}

#[test]
fn flags_of_llama_servers_tests_start_the_server() {
    // What llama.cpp's server tests pass (utils.py), besides the flags specd takes.
    let s = Server::start(&[
        "-c",
        "128",
        "--temp",
        "0.8",
        "--seed",
        "42",
        "--no-jinja",
        "--no-slots",
        "--cont-batching",
        "--n-gpu-layers",
        "99",
        "-fa",
        "on",
        "--swa-full",
        "--offline",
        "--no-ui",
        "--backend_sampling",
        "--no-mmproj",
        "--media-path",
        ".",
        "--cache-ram",
        "100",
        "--no-cache-idle-slots",
        "--ui-mcp-proxy",
        "--tools-runtime",
        "docker:x",
        "--models-max",
        "2",
        "--no-models-autoload",
        "--reasoning-format",
        "none",
        "--reasoning",
        "off",
        "--spec-draft-ngl",
        "99",
    ]);
    assert_eq!(s.get("/health").status, 200);
    let log = s.log();
    for line in [
        "'--n-gpu-layers 99' ignored: specd computes on the CPU",
        "'--backend-sampling' ignored: specd computes on the CPU",
        "'--no-mmproj' ignored: specd serves text models only (no multimodal projector)",
        "'--media-path .' ignored: only used with a multimodal projector",
        "'--ui-mcp-proxy' ignored: specd has no web UI, nor the /cors-proxy it uses for MCP",
        "'--no-models-autoload' ignored: only used in router mode",
        "'-fa on' ignored: specd computes on the CPU",
    ] {
        assert!(log.contains(line), "no '{line}' in:\n{log}");
    }
    drop(s);

    // Refused where specd cannot honour them, saying why.
    for (args, why) in [
        (
            &["--mmproj-url", "http://x"][..],
            "'--mmproj-url' is not supported by specd: specd serves text models only",
        ),
        (
            &["--slot-save-path", "/nonexistent/dir"][..],
            "--slot-save-path /nonexistent/dir: not a directory",
        ),
        (
            &["--models-dir", "."][..],
            "'--models-dir' is not supported by specd: router mode",
        ),
        (
            &["--hf-repo", "ggml-org/models"][..],
            "'--hf-repo' is not supported by specd: specd does not download models",
        ),
        (
            &["--lora", "a.gguf"][..],
            "'--lora' is not supported by specd: LoRA adapters",
        ),
        (
            &["--sleep-idle-seconds", "0"][..],
            "--sleep-idle-seconds 0: cannot be 0 or less than -1",
        ),
    ] {
        let err = refused(args);
        assert!(err.contains(why), "{args:?}: {err}");
    }
    // Unknown flags are clap's error naming them.
    let err = refused(&["--grp-attn-n", "2"]);
    assert!(err.contains("--grp-attn-n"), "{err}");
}

#[test]
fn tools_are_accepted_and_make_cors_default_to_localhost() {
    let preflight = |s: &Server, origin: &str| {
        request(
            &s.addr,
            "OPTIONS",
            "/completions",
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Headers", "Authorization"),
            ],
            None,
        )
    };
    let s = Server::start(&["--tools", "all", "-c", "128"]);
    assert!(
        s.log()
            .contains("'--tools all' accepted, but specd has no built-in agent tools"),
        "{}",
        s.log()
    );
    let r = preflight(&s, "http://localhost:8080");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("http://localhost:8080")
    );
    let r = preflight(&s, "http://evil.com");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Access-Control-Allow-Origin"), None);
    drop(s);

    // An explicit --cors-origins stays as given.
    let s = Server::start(&["--tools", "all", "--cors-origins", "*", "-c", "128"]);
    let r = preflight(&s, "http://evil.com");
    assert_eq!(
        r.header("Access-Control-Allow-Origin"),
        Some("http://evil.com")
    );
}

fn wait_sleeping(s: &Server, want: bool) {
    let t0 = Instant::now();
    while props(s)["is_sleeping"] != want {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "is_sleeping never became {want}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_idle_server_sleeps_and_a_request_wakes_it() {
    let s = Server::start(&["--sleep-idle-seconds", "1", "-c", "128", "--metrics"]);
    assert_eq!(props(&s)["is_sleeping"], false);
    wait_sleeping(&s, true);
    // These answer without waking it (llama-server: /health, /props, /models, /metrics).
    assert_eq!(s.get("/health").status, 200);
    assert_eq!(s.get("/v1/models").status, 200);
    assert_eq!(s.get("/metrics").status, 200);
    assert_eq!(props(&s)["is_sleeping"], true);
    // A generation wakes it.
    let r = s.ok("/completion", &json!({"prompt": "Hello", "n_predict": 2}));
    assert_eq!(r["tokens_predicted"], 2);
    assert_eq!(props(&s)["is_sleeping"], false);
    // So does any other endpoint that needs the model.
    wait_sleeping(&s, true);
    s.ok("/tokenize", &json!({"content": "Hello"}));
    assert_eq!(props(&s)["is_sleeping"], false);
}
