//! Resumable streams over real HTTP, as llama.cpp's `unit/test_stream.py` drives them (its test
//! runs on llama-server's router; these run the same exchanges on one server): a streamed
//! request with `X-Conversation-Id` replays from any offset, survives its client, and is stopped
//! by `DELETE /v1/stream`.

use serde_json::{json, Value};
use std::io::Write;
use std::time::{Duration, Instant};

mod common;
use common::http::*;
use common::Server;

/// An id with slashes and colons, as the web UI makes them (`<conversation>::<org/model>`).
const ID: &str = "conv-stream-test::ggml-org/tinygemma3-GGUF:Q8_0";
const QS: &str = "conv_id=conv-stream-test%3A%3Aggml-org%2Ftinygemma3-GGUF%3AQ8_0";

fn chat(max_tokens: u64, extra: Value) -> Value {
    let mut b = json!({
        "stream": true,
        "max_tokens": max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": "hello"}],
    });
    if let (Some(b), Some(x)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(x.clone());
    }
    b
}

fn post_stream(s: &Server, body: &Value) -> Resp {
    request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[("X-Conversation-Id", ID)],
        Some(body.to_string().as_bytes()),
    )
}

/// Starts a detached chat stream with `body` and reads its head and first chunk; the reader is
/// positioned at the next chunk.
fn open_detached(s: &Server, body: &Value) -> std::io::BufReader<std::net::TcpStream> {
    let mut conn = connect(&s.addr);
    write_request(
        &mut conn,
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[("X-Conversation-Id", ID)],
        Some(body.to_string().as_bytes()),
    );
    conn.flush().unwrap();
    let mut r = std::io::BufReader::new(conn);
    assert_eq!(read_head(&mut r).0, 200);
    assert!(read_chunk(&mut r).is_some());
    r
}

/// The text of a chat stream's `data:` events.
fn content(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

fn slot_busy(s: &Server) -> bool {
    let slots = s.get("/slots").json();
    slots
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x["is_processing"] == json!(true)))
}

fn wait_until(what: &str, s: &Server, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "{what}\n{}", s.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_finished_stream_replays_from_any_offset_until_it_is_stopped() {
    let s = Server::start(&["-np", "1"]);
    let live = post_stream(&s, &chat(16, json!({})));
    assert_eq!(live.status, 200, "{}", live.text());
    assert!(!content(&live.body).is_empty());
    assert!(live.text().ends_with("data: [DONE]\n\n"), "{}", live.text());

    // From the start: the same bytes the client got.
    let replay = s.get(&format!("/v1/stream?{QS}&from=0"));
    assert_eq!(replay.status, 200);
    assert_eq!(
        replay.header("content-type"),
        Some("text/event-stream"),
        "{:?}",
        replay.headers
    );
    assert_eq!(replay.text(), live.text());
    // From an offset: the rest.
    let from = live.body.len() / 2;
    let tail = s.get(&format!("/v1/stream?{QS}&from={from}"));
    assert_eq!(tail.body, live.body[from..]);

    // The lookup answers for the id asked (and its `::model` variants), not for others.
    let found = s.ok(
        "/v1/streams/lookup",
        &json!({"conversation_ids": ["conv-stream-test", "other"]}),
    );
    assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");
    assert_eq!(found[0]["conversation_id"], ID);
    assert_eq!(found[0]["is_done"], true);
    assert_eq!(found[0]["total_bytes"], live.body.len());
    assert!(found[0]["completed_at"].as_u64().is_some_and(|t| t > 0));
    assert_eq!(s.ok("/v1/streams/lookup", &json!({})), json!([]));

    // Malformed reads.
    assert_error(
        &s.get(&format!("/v1/stream?{QS}&from=x")),
        400,
        "invalid_request_error",
    );

    // Stopped: gone, and a second stop is still a 204.
    let del = request(&s.addr, "DELETE", &format!("/v1/stream?{QS}"), &[], None);
    assert_eq!(del.status, 204);
    assert_error(
        &s.get(&format!("/v1/stream?{QS}&from=0")),
        404,
        "not_found_error",
    );
    let del = request(&s.addr, "DELETE", &format!("/v1/stream?{QS}"), &[], None);
    assert_eq!(del.status, 204);

    assert_error(&s.get("/v1/stream?from=0"), 400, "invalid_request_error");
}

#[test]
fn a_stream_survives_its_client_and_replays_whole() {
    let s = Server::start(&["-np", "1"]);
    let body = chat(1500, json!({"ignore_eos": true}));
    // The same request undetached, for the text it must produce.
    let plain = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        Some(body.to_string().as_bytes()),
    );
    let expected = content(&plain.body);
    assert!(!expected.is_empty());

    // The detached one: its client reads the head and one chunk, then leaves.
    let r = open_detached(&s, &body);
    // Still generating when its client leaves.
    let found = s.ok("/v1/streams/lookup", &json!({"conversation_ids": [ID]}));
    assert_eq!(found[0]["is_done"], false, "{found}");
    drop(r);

    // The generation runs to its end regardless, and the replay holds all of it.
    let replay = s.get(&format!("/v1/stream?{QS}&from=0"));
    assert_eq!(replay.status, 200);
    assert!(
        replay.text().ends_with("data: [DONE]\n\n"),
        "{}",
        replay.text()
    );
    assert_eq!(content(&replay.body), expected);
    wait_until("the slot stays busy", &s, || !slot_busy(&s));
}

#[test]
fn a_stop_cancels_the_generation_and_a_new_request_replaces_the_old() {
    let s = Server::start(&["-np", "1"]);
    // Long enough never to end by itself within the test.
    let long = chat(100_000, json!({"ignore_eos": true}));
    let mut r = open_detached(&s, &long);
    let found = s.ok(
        "/v1/streams/lookup",
        &json!({"conversation_ids": ["conv-stream-test"]}),
    );
    assert_eq!(found[0]["is_done"], false, "{found}");

    // A reader that joins live, from the current end.
    let live_from = found[0]["total_bytes"].as_u64().unwrap();
    let addr = s.addr.clone();
    let reader = std::thread::spawn(move || {
        request(
            &addr,
            "GET",
            &format!("/v1/stream?{QS}&from={live_from}"),
            &[],
            None,
        )
    });
    std::thread::sleep(Duration::from_millis(200));

    let del = request(&s.addr, "DELETE", &format!("/v1/stream?{QS}"), &[], None);
    assert_eq!(del.status, 204);
    // The requesting client's stream ends, unfinished; so does the live reader's.
    while read_chunk(&mut r).is_some() {}
    let joined = reader.join().unwrap();
    assert_eq!(joined.status, 200);
    assert!(!joined.text().contains("[DONE]"), "{}", joined.text());
    wait_until("the stopped generation keeps its slot", &s, || {
        !slot_busy(&s)
    });
    assert_error(
        &s.get(&format!("/v1/stream?{QS}&from=0")),
        404,
        "not_found_error",
    );

    // A request under an id that is running stops the running one.
    let mut first = open_detached(&s, &long);
    let second = post_stream(&s, &chat(8, json!({})));
    assert_eq!(second.status, 200, "{}", second.text());
    while read_chunk(&mut first).is_some() {}
    let replay = s.get(&format!("/v1/stream?{QS}&from=0"));
    assert_eq!(replay.body, second.body);
}

#[test]
fn requests_without_the_header_or_that_fail_leave_no_session() {
    let s = Server::start(&["-np", "1"]);
    // Not streamed: answered as usual, nothing kept.
    let r = request(
        &s.addr,
        "POST",
        "/v1/chat/completions",
        &[("X-Conversation-Id", ID)],
        Some(
            json!({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
                .to_string()
                .as_bytes(),
        ),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_error(
        &s.get(&format!("/v1/stream?{QS}&from=0")),
        404,
        "not_found_error",
    );
    // A refused request: its error as usual, nothing kept.
    let r = post_stream(&s, &json!({"stream": true, "messages": "nope"}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_error(
        &s.get(&format!("/v1/stream?{QS}&from=0")),
        404,
        "not_found_error",
    );
    // The header on a request that does not generate touches no session.
    let _ = post_stream(&s, &chat(4, json!({})));
    let t = request(
        &s.addr,
        "POST",
        "/tokenize",
        &[("X-Conversation-Id", ID)],
        Some(json!({"content": "hi"}).to_string().as_bytes()),
    );
    assert_eq!(t.status, 200);
    assert_eq!(s.get(&format!("/v1/stream?{QS}&from=0")).status, 200);
}
