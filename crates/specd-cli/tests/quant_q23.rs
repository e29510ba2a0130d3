//! Q2_K and Q3_K models run on their native kernels: `specd make-test-model --type q2_k|q3_k`
//! files load without conversion (weight memory within 5 % of the file's tensor bytes, no
//! conversion warning) and speculative decoding gives the plain greedy tokens.

use serde_json::{json, Value};

mod common;
use common::Server;

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens: {v}"))
        .iter()
        .map(|t| t.as_u64().expect("token id"))
        .collect()
}

fn check(wtype: &str) {
    // qwen35-small is 256 wide: its matrices are whole super-blocks (with an MTP head, so the
    // `draft-mtp` drafter verifies batches of several rows on these kernels).
    let (_dir, model) = common::make_model(
        &format!("small-{wtype}.gguf"),
        &[
            "--preset",
            "qwen35-small",
            "--type",
            wtype,
            "--mtp",
            "--style",
            "repetitive",
        ],
    );
    let s = Server::start_with(&model, &["--spec-type", "draft-mtp"], &[]);
    let p = s.get("/props").json();
    let held = p["specd"]["weight_bytes"].as_u64().unwrap();
    let file = p["specd"]["file_weight_bytes"].as_u64().unwrap();
    assert!(
        file > 0 && held * 100 <= file * 105,
        "{wtype}: {held} bytes held for {file} in the file"
    );
    let log = s.log();
    assert!(log.contains("weights: "), "{log}");
    assert!(
        !log.contains("no native kernel"),
        "{wtype} converted:\n{log}"
    );

    let body = json!({"prompt": "def fibonacci(n):\n", "temperature": 0.0, "n_predict": 24,
        "return_tokens": true});
    let spec = s.ok("/completion", &body);
    let mut b = body.clone();
    b["speculative"] = json!({"enabled": false});
    let plain = s.ok("/completion", &b);
    assert!(
        spec["timings"]["draft_n"].as_u64().unwrap_or(0) > 0,
        "{spec}"
    );
    assert_eq!(tokens(&spec), tokens(&plain), "{wtype}");
}

#[test]
fn q2_k_model_loads_natively_and_speculates_exactly() {
    check("q2_k");
}

#[test]
fn q3_k_model_loads_natively_and_speculates_exactly() {
    check("q3_k");
}
