//! Google Cloud Vertex AI custom-container mode (`AIP_MODE=PREDICTION`), as llama-server
//! serves it: the predict route dispatches each instance to the endpoint its `@requestFormat`
//! names, over real HTTP.

use serde_json::json;

mod common;
use common::http::*;
use common::Server;

#[test]
fn predict_route_dispatches_instances() {
    let env = [
        ("AIP_MODE", "PREDICTION"),
        ("AIP_HTTP_PORT", "0"),
        ("AIP_HEALTH_ROUTE", "healthz"),
    ];
    let s = Server::start_env(&["-np", "2"], &env);
    assert_eq!(s.get("/healthz").json()["status"], "ok");

    let v = s.ok(
        "/predict",
        &json!({"instances": [
            {"@requestFormat": "chatCompletions", "max_tokens": 4, "stream": true,
             "messages": [{"role": "user", "content": "hi"}]},
            {"@requestFormat": "/completion", "prompt": "def f(", "n_predict": 3},
            {"@requestFormat": "tokenize", "content": "hello"},
            {"@requestFormat": "nothing", "prompt": "x"},
            {"max_tokens": 2},
            7,
        ]}),
    );
    let p = v["predictions"].as_array().unwrap();
    assert_eq!(p.len(), 6);
    assert_eq!(
        p[0]["object"], "chat.completion",
        "stream is forced off: {}",
        p[0]
    );
    assert_eq!(p[0]["choices"][0]["message"]["role"], "assistant");
    assert_eq!(p[1]["tokens_predicted"], 3);
    assert!(p[2]["tokens"].as_array().is_some_and(|t| !t.is_empty()));
    for (i, msg) in [
        (3, "no handler registered for @requestFormat: nothing"),
        (4, "string @requestFormat"),
        (5, "must be a JSON object"),
    ] {
        assert_eq!(p[i]["error"]["type"], "invalid_request_error", "{}", p[i]);
        assert!(
            p[i]["error"]["message"].as_str().unwrap().contains(msg),
            "{}",
            p[i]
        );
    }
    // An instance failing in its endpoint answers that endpoint's error object.
    let v = s.ok(
        "/predict",
        &json!({"instances": [{"@requestFormat": "completion", "prompt": "x", "n_predict": "z"}]}),
    );
    assert_eq!(v["predictions"][0]["error"]["code"], 400);

    assert_error(
        &s.post("/predict", &json!({"x": 1})),
        400,
        "invalid_request_error",
    );
    let many: Vec<_> = (0..129)
        .map(|_| json!({"@requestFormat": "tokenize"}))
        .collect();
    assert_error(
        &s.post("/predict", &json!({"instances": many})),
        400,
        "invalid_request_error",
    );
}

#[test]
fn off_without_aip_mode() {
    let s = Server::start(&[]);
    assert_eq!(s.post("/predict", &json!({"instances": []})).status, 404);
}
