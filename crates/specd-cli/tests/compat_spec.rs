//! Speculation as llama-server's clients see it (issue 17, item 8; llama.cpp's
//! `unit/test_speculative.py`): a configured draft model drafts on the very first request, and
//! synthetic acceptance (`--spec-synth-rates`) drafts at fixed lengths so that a seeded request
//! repeats its `draft_n` / `draft_n_accepted`. Real binary, real HTTP, the tiny test model as the
//! target and a tiny model with other weights (same tokenizer) as the draft.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::OnceLock;

mod common;
use common::Server;

const PROMPT: &str = "def fibonacci(n):\n    if n < 2:\n        return n\n";

/// A draft model for the tiny target: the same shape and tokenizer, other ("varied") weights,
/// so its drafts are rarely accepted — the case where the controller would rather not draft.
fn draft_model() -> &'static PathBuf {
    static M: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &M.get_or_init(|| common::make_model("draft.gguf", &["--preset", "qwen35-tiny", "--seed", "7"]))
        .1
}

/// `specd serve` with the draft model and llama.cpp's test_speculative.py settings
/// (`--spec-type draft-simple --spec-draft-n-min 4 --spec-draft-n-max 8`) plus `extra`.
fn server_with_draft(extra: &[&str]) -> Server {
    let draft = draft_model().to_str().expect("utf-8 path").to_string();
    let mut flags = vec![
        "-md",
        &draft,
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-min",
        "4",
        "--spec-draft-n-max",
        "8",
    ];
    flags.extend_from_slice(extra);
    Server::start(&flags)
}

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens: {v}"))
        .iter()
        .map(|t| t.as_u64().expect("token id"))
        .collect()
}

fn timing(v: &Value, name: &str) -> u64 {
    v["timings"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no timings.{name}: {v}"))
}

/// `body` with `speculative.enabled: false`: the same request decoded plainly.
fn plain(body: &Value) -> Value {
    let mut b = body.clone();
    b["speculative"] = json!({"enabled": false});
    b
}

/// test_with_and_without_draft: the first request to a server with `-md` drafts (`draft_n` ≥
/// n-min, the controller's first decision) and its tokens are exactly the plain ones. Six tokens
/// are too few for the controller to have probed a drafter it priced out.
#[test]
fn a_draft_model_drafts_on_the_first_request() {
    let s = server_with_draft(&[]);
    let body = json!({"prompt": PROMPT, "temperature": 0.2, "top_k": 5, "seed": 4242,
        "n_predict": 6, "return_tokens": true});
    let v = s.ok("/completion", &body);
    assert!(timing(&v, "draft_n") >= 4, "{v}");
    assert!(timing(&v, "draft_n_accepted") <= timing(&v, "draft_n"));
    let p = s.ok("/completion", &plain(&body));
    // No draft verified: no draft counters, as llama-server.
    assert!(p["timings"].get("draft_n").is_none(), "{p}");
    assert_eq!(tokens(&v), tokens(&p));
    // Every request starts with a draft, not only the server's first.
    let again = s.ok("/completion", &body);
    assert!(timing(&again, "draft_n") >= 4, "{again}");
    assert_eq!(tokens(&again), tokens(&p));

    // Without n-min the first draft is at least one token.
    let s = Server::start(&[
        "-md",
        draft_model().to_str().unwrap(),
        "--spec-type",
        "draft-simple",
    ]);
    let v = s.ok("/completion", &body);
    assert!(timing(&v, "draft_n") >= 1, "{v}");
}

/// test_with_and_without_draft, last part: synthetic acceptance 0 drafts (n-max every round)
/// and accepts nothing, and the output is the plain output.
#[test]
fn synthetic_rate_zero_drafts_and_accepts_nothing() {
    let s = server_with_draft(&["--spec-synth-rates", "0,0,0,0,0,0,0,0"]);
    let body = json!({"prompt": PROMPT, "temperature": 0.2, "top_k": 5, "seed": 4242,
        "n_predict": 16, "return_tokens": true});
    let v = s.ok("/completion", &body);
    assert!(timing(&v, "draft_n") > 0, "{v}");
    assert_eq!(timing(&v, "draft_n_accepted"), 0);
    assert_eq!(tokens(&v), tokens(&s.ok("/completion", &plain(&body))));
    // Fixed lengths: each round drafts n-max tokens, or as many as are left to generate after
    // the round's own token when fewer; drafts shorter than n-min are dropped. At rate 0 a
    // round yields one token, so the count follows from n_predict alone.
    let expected: u64 = (1..=16u64)
        .map(|left| (left - 1).min(8))
        .filter(|&n| n >= 4)
        .sum();
    assert_eq!(timing(&v, "draft_n"), expected, "{v}");
}

/// test_synth_is_deterministic: two identical seeded requests draft and accept the same counts.
#[test]
fn synthetic_acceptance_repeats() {
    let rates: Vec<String> = (1..=8).map(|i| 0.75f64.powi(i).to_string()).collect();
    let s = server_with_draft(&["--spec-synth-rates", &rates.join(",")]);
    let body = json!({"prompt": PROMPT, "temperature": 0.2, "top_k": 5, "seed": 4242,
        "n_predict": 32});
    let a = s.ok("/completion", &body);
    let b = s.ok("/completion", &body);
    for v in [&a, &b] {
        assert!(timing(v, "draft_n") > 0, "{v}");
    }
    assert_eq!(timing(&a, "draft_n"), timing(&b, "draft_n"));
    assert_eq!(
        timing(&a, "draft_n_accepted"),
        timing(&b, "draft_n_accepted")
    );
    assert!(
        timing(&a, "draft_n_accepted") < timing(&a, "draft_n"),
        "{a}"
    );
}

/// test_synth_ignores_target_tokens: at rate 1 every drafted token is accepted; a grammar and
/// `ignore_eos` requests work under it.
#[test]
fn synthetic_rate_one_accepts_every_draft() {
    let s = server_with_draft(&["--spec-synth-rates", "1,1,1,1,1,1,1,1"]);
    let v = s.ok(
        "/completion",
        &json!({"prompt": PROMPT, "temperature": 0.0, "seed": 4242, "n_predict": 32}),
    );
    assert!(timing(&v, "draft_n") > 0, "{v}");
    assert_eq!(timing(&v, "draft_n_accepted"), timing(&v, "draft_n"));

    let g = s.ok(
        "/completion",
        &json!({"prompt": PROMPT, "temperature": 0.0, "seed": 4242, "n_predict": 6,
            "grammar": "root ::= \"a\"{5,5}"}),
    );
    assert_eq!(g["content"], "aaaaa", "{g}");
    assert_eq!(timing(&g, "draft_n_accepted"), timing(&g, "draft_n"), "{g}");

    let v = s.ok(
        "/completion",
        &json!({"prompt": "Respond with only: OK", "temperature": 0.0, "seed": 4242,
            "n_predict": 64, "ignore_eos": true}),
    );
    assert_eq!(v["tokens_predicted"], 64, "{v}");
    assert_eq!(v["stop_type"], "limit");
    assert_eq!(timing(&v, "draft_n_accepted"), timing(&v, "draft_n"));
}

/// `--spec-adaptive` keeps the never-slower controller under synthetic acceptance: at rate 0 it
/// drafts once (its first decision) and stops, where fixed lengths draft every round.
#[test]
fn spec_adaptive_keeps_the_controller_with_synthetic_acceptance() {
    let body = json!({"prompt": PROMPT, "temperature": 0.0, "n_predict": 32, "ignore_eos": true});
    let rates = ["--spec-synth-rates", "0,0,0,0,0,0,0,0"];
    let fixed = Server::start(&rates).ok("/completion", &body);
    let adaptive = Server::start(&[rates[0], rates[1], "--spec-adaptive"]).ok("/completion", &body);
    for v in [&fixed, &adaptive] {
        assert!(timing(v, "draft_n") > 0, "{v}");
        assert_eq!(timing(v, "draft_n_accepted"), 0, "{v}");
    }
    assert!(
        4 * timing(&adaptive, "draft_n") < timing(&fixed, "draft_n"),
        "adaptive {adaptive}\nfixed {fixed}"
    );
}
