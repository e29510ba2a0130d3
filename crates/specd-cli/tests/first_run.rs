//! The first run (issue 19, item 6): `specd serve` with no model serves the built-in trained
//! code model, with speculation on by default (`ngram-mod`, plus `draft-mtp` on a model with an
//! MTP head) and exact; `--spec-type none` turns it off. Real binary, real HTTP.

use serde_json::{json, Value};
use std::process::Command;

mod common;
use common::{Server, BIN};

const PROMPT: &str = "def fibonacci(n):";

fn timing(v: &Value, k: &str) -> Option<u64> {
    v["timings"][k].as_u64()
}

/// A greedy completion of PROMPT with its token ids.
fn body(extra: Value) -> Value {
    let mut b = json!({"prompt": PROMPT, "n_predict": 64, "temperature": 0,
                       "return_tokens": true, "cache_prompt": false});
    if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    b
}

#[test]
fn demo_model_speculates_by_default_and_exactly() {
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap();
    let s = Server::start_demo(&[], &[("SPECD_CACHE_DIR", dir)]);
    assert!(
        s.log_shows("speculation: ngram-mod"),
        "speculation on by default: {}",
        s.log()
    );
    // The demo model was written to the cache, under its content tag.
    let files: Vec<String> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("demo-qwen35-code-q8_0-") && f.ends_with(".gguf")),
        "{files:?}"
    );
    let models = s.get("/v1/models").json();
    assert!(
        models["data"][0]["id"]
            .as_str()
            .unwrap()
            .contains("demo-qwen35-code-q8_0"),
        "{models}"
    );

    let spec = s.ok("/completion", &body(json!({})));
    let text = spec["content"].as_str().unwrap();
    // The trained model writes Python: the continuation of a def has indented lines.
    assert!(text.contains("\n    "), "code-like text: {text:?}");
    let drafted = timing(&spec, "draft_n").expect("a draft was verified");
    let accepted = timing(&spec, "draft_n_accepted").expect("draft_n_accepted");
    assert!(drafted > 0 && accepted > 0, "{}", spec["timings"]);
    assert!(accepted <= drafted);

    // Exact: the same tokens without speculation.
    let plain = s.ok("/completion", &body(json!({"speculative.type": "none"})));
    assert_eq!(plain["tokens"], spec["tokens"]);
    assert_eq!(plain["content"], spec["content"]);
    assert!(timing(&plain, "draft_n").is_none(), "{}", plain["timings"]);

    // The chat endpoint of the README's first curl drafts too.
    let chat = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Write fibonacci in Python"}],
                "max_tokens": 64, "temperature": 0}),
    );
    assert!(
        chat["choices"][0]["message"]["content"].is_string(),
        "{chat}"
    );
    assert!(timing(&chat, "draft_n").unwrap_or(0) > 0, "{chat}");
}

#[test]
fn spec_type_none_turns_speculation_off() {
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_str().unwrap();
    for off in [&["--spec-type", "none"][..], &["--spec-type=none"][..]] {
        let s = Server::start_demo(off, &[("SPECD_CACHE_DIR", dir)]);
        let v = s.ok("/completion", &body(json!({})));
        assert!(timing(&v, "draft_n").is_none(), "{off:?}: {}", v["timings"]);
        assert!(!s.log().contains("speculation:"), "{}", s.log());
        // A request may still ask for speculation itself.
        let asked = s.ok(
            "/completion",
            &body(json!({"speculative.type": "ngram-mod"})),
        );
        assert!(
            timing(&asked, "draft_n").unwrap_or(0) > 0,
            "{}",
            asked["timings"]
        );
        assert_eq!(asked["tokens"], v["tokens"]);
    }
    // Through llama-server's environment variable as well.
    let s = Server::start_demo(
        &[],
        &[("SPECD_CACHE_DIR", dir), ("LLAMA_ARG_SPEC_TYPE", "none")],
    );
    let v = s.ok("/completion", &body(json!({})));
    assert!(timing(&v, "draft_n").is_none(), "{}", v["timings"]);
}

#[test]
fn mtp_head_adds_draft_mtp_to_the_default() {
    let (_d, mtp) = common::make_model("mtp.gguf", &["--preset", "qwen35-tiny", "--mtp"]);
    let s = Server::start_with(&mtp, &[], &[]);
    assert!(
        s.log_shows("speculation: ngram-mod,draft-mtp"),
        "{}",
        s.log()
    );
    let b = json!({"prompt": [1, 2, 3, 4], "n_predict": 24, "temperature": 0,
                   "ignore_eos": true, "return_tokens": true, "cache_prompt": false});
    let spec = s.ok("/completion", &b);
    assert!(
        timing(&spec, "draft_n").unwrap_or(0) > 0,
        "{}",
        spec["timings"]
    );
    let mut p = b.clone();
    p["speculative"] = json!({"enabled": false});
    assert_eq!(s.ok("/completion", &p)["tokens"], spec["tokens"]);

    // Without the head, the default is ngram-mod alone (no 400 for draft-mtp).
    let s = Server::start(&[]);
    assert!(s.log_shows("speculation: ngram-mod"), "{}", s.log());
    assert!(!s.log().contains("draft-mtp"), "{}", s.log());
    assert_eq!(s.post("/completion", &b).status, 200);
}

#[test]
fn generate_speculates_by_default_with_the_same_tokens() {
    let cache = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| -> Value {
        let out = Command::new(BIN)
            .args([
                "generate", "-p", PROMPT, "-n", "48", "--temp", "0", "-t", "1", "--json",
            ])
            .args(extra)
            .env("SPECD_CACHE_DIR", cache.path())
            .output()
            .expect("running specd generate");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON output")
    };
    let spec = run(&[]);
    let plain = run(&["--spec-type", "none"]);
    assert_eq!(spec["tokens"], plain["tokens"]);
    assert_eq!(spec["speculative"]["types"], json!(["ngram-mod"]), "{spec}");
    assert_eq!(plain["speculative"]["types"], json!([]), "{plain}");
}
