//! qwen35moe and qwen3next files served over HTTP (issue 16): each loads, reports its
//! architecture, and speculative decoding returns exactly the plain tokens — alone and with two
//! slots decoding at once, where the rows of each batch route to different experts. Real binary, real HTTP, the
//! tiny MoE presets with repetitive weights (so the n-gram drafter finds drafts). A MoE file with
//! an MTP block drafts with `draft-mtp` (the block's FFN is the MoE FFN) and stays exact too.

use serde_json::{json, Value};

mod common;
use common::http::tokens;
use common::Server;

const PROMPTS: [&str; 2] = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "import os\nimport sys\n\nclass Parser:\n",
];

fn body(prompt: &str) -> Value {
    json!({"prompt": prompt, "temperature": 0.0, "n_predict": 48, "ignore_eos": true,
        "cache_prompt": false, "return_tokens": true})
}

/// `body` decoded plainly (`speculative.enabled: false`).
fn plain(body: &Value) -> Value {
    let mut b = body.clone();
    b["speculative"] = json!({"enabled": false});
    b
}

#[test]
fn a_moe_model_is_served_and_speculation_stays_exact() {
    served_exactly("qwen35moe-tiny", "qwen35moe");
}

#[test]
fn a_qwen3next_model_is_served_and_speculation_stays_exact() {
    served_exactly("qwen3next-tiny", "qwen3next");
}

fn served_exactly(preset: &str, arch: &str) {
    let (_dir, model) =
        common::make_model("moe.gguf", &["--preset", preset, "--style", "repetitive"]);
    let s = Server::start_with(
        &model,
        &[
            "--spec-type",
            "ngram-mod",
            "--spec-draft-n-max",
            "8",
            "-np",
            "2",
        ],
        &[],
    );
    let models = s.get("/v1/models").json();
    assert_eq!(models["data"][0]["meta"]["arch"], arch, "{models}");
    let props = s.get("/props").json();
    assert_eq!(props["specd"]["arch"], arch, "{props}");

    let mut plain_tokens = Vec::new();
    for p in PROMPTS {
        let b = body(p);
        let want = tokens(&s.ok("/completion", &plain(&b)));
        assert_eq!(want.len(), 48);
        let got = s.ok("/completion", &b);
        assert_eq!(tokens(&got), want, "{got}");
        assert!(got["timings"]["draft_n"].as_u64().unwrap_or(0) > 0, "{got}");
        plain_tokens.push(want);
    }
    // Both slots at once: each batch holds rows of two sequences.
    let both: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || s.ok("/completion", &body(p)))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("request")).collect()
    });
    for (v, want) in both.iter().zip(&plain_tokens) {
        assert_eq!(&tokens(v), want, "{v}");
    }
}

#[test]
fn the_moe_mtp_block_drafts_and_speculation_stays_exact() {
    mtp_drafts_exactly("qwen35moe-tiny");
}

#[test]
fn the_qwen3next_mtp_block_drafts_and_speculation_stays_exact() {
    mtp_drafts_exactly("qwen3next-tiny");
}

fn mtp_drafts_exactly(preset: &str) {
    let (_dir, model) = common::make_model("moe-mtp.gguf", &["--preset", preset, "--mtp"]);
    let s = Server::start_with(&model, &["-np", "2"], &[]);
    // Random weights make the head unconfident: draft anyway (p_min 0), so drafts are rejected
    // and rolled back as well as accepted.
    let mtp = |b: &Value| {
        let mut b = b.clone();
        b["speculative"] = json!({"type": "draft-mtp", "p_min": 0.0, "n_max": 4});
        b
    };
    let mut plain_tokens = Vec::new();
    for p in PROMPTS {
        let b = body(p);
        let want = tokens(&s.ok("/completion", &plain(&b)));
        assert_eq!(want.len(), 48);
        let got = s.ok("/completion", &mtp(&b));
        assert_eq!(tokens(&got), want, "{got}");
        assert!(got["timings"]["draft_n"].as_u64().unwrap_or(0) > 0, "{got}");
        plain_tokens.push(want);
    }
    let both: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let (s, b) = (&s, mtp(&body(p)));
                sc.spawn(move || s.ok("/completion", &b))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("request")).collect()
    });
    for (v, want) in both.iter().zip(&plain_tokens) {
        assert_eq!(&tokens(v), want, "{v}");
    }
}
