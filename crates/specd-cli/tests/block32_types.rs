//! Q4_1 / Q5_0 / Q5_1 models run natively (issue 15, item 1): a model made by
//! `specd make-test-model --type q4_1|q5_0|q5_1` is served with its weights held at the file's
//! size (no load-time conversion, no warning), and speculation stays exact on it. Real binary,
//! real HTTP.

use serde_json::{json, Value};

mod common;
use common::Server;

const PROMPT: &str = "def fibonacci(n):\n    if n < 2:\n        return n\n";

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens: {v}"))
        .iter()
        .map(|t| t.as_u64().expect("token id"))
        .collect()
}

#[test]
fn block32_models_load_natively_and_speculate_exactly() {
    for t in ["q4_1", "q5_0", "q5_1"] {
        let (_dir, path) = common::make_model(
            &format!("{t}.gguf"),
            &["--preset", "qwen35-tiny", "--type", t, "--mtp"],
        );
        let s = Server::start_with(
            &path,
            &["--spec-type", "draft-mtp", "--spec-synth-rates", "1,1,1,1"],
            &[],
        );
        // Held at exactly the file's tensor bytes: the 16-row repack has the same size.
        let p = s.get("/props").json();
        let held = p["specd"]["weight_bytes"].as_u64().unwrap();
        let file = p["specd"]["file_weight_bytes"].as_u64().unwrap();
        assert!(file > 0);
        // Norms and 1-D tensors are held as f32 like the file's f32 tensors; matrices as is.
        assert_eq!(held, file, "{t}: {held} bytes held for {file} in the file");
        assert!(
            s.log_shows("weights: ") && s.log_shows("(1.000x)"),
            "{t}: {}",
            s.log()
        );
        assert!(
            !s.log().contains("has no native kernel"),
            "{t}: converted at load:\n{}",
            s.log()
        );
        // Greedy, speculative (every draft accepted) and plain: the same tokens.
        let body = json!({"prompt": PROMPT, "temperature": 0.0, "n_predict": 24,
            "return_tokens": true, "ignore_eos": true});
        let v = s.ok("/completion", &body);
        assert!(
            v["timings"]["draft_n"].as_u64().unwrap_or(0) > 0,
            "{t}: no draft: {v}"
        );
        let mut plain = body.clone();
        plain["speculative"] = json!({"enabled": false});
        let p = s.ok("/completion", &plain);
        assert_eq!(tokens(&v), tokens(&p), "{t}");
        assert_eq!(tokens(&p).len(), 24);
    }
}
