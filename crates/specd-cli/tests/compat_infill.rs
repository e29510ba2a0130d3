//! Code infill (issue 18, item 4): llama-server's `POST /infill` and OpenAI's `suffix` on
//! `/v1/completions`, over real HTTP against the real binary, on the tiny test model (which has
//! Qwen2.5/3-Coder's FIM tokens). The prompt layouts below are llama-server's on the same file
//! (`llama-server -m tiny.gguf -c 4096`, recorded from its `/infill` answers' `prompt` and
//! `tokens_evaluated`).

use serde_json::{json, Value};
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::OnceLock;

mod common;
use common::http::{assert_error, open_stream, tokens};
use common::Server;

const PREFIX: &str = "def fibonacci(n):\n    if n < 2:\n        return n\n";
const SUFFIX: &str = "\n\nprint(fibonacci(10))\n";
const EXTRA: &str = "def lucas(n):\n    if n < 2:\n        return 2 - n\n";

/// The tiny model without FIM tokens.
fn model_without_fim() -> &'static PathBuf {
    static M: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
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

/// Tokens of plain text (special tokens not parsed), as the layout tokenizes each part.
fn tok(s: &Server, text: &str) -> Vec<u64> {
    let v = s.ok(
        "/tokenize",
        &json!({"content": text, "parse_special": false}),
    );
    tokens(&v)
}

/// The id of a special token.
fn special(s: &Server, text: &str) -> u64 {
    let t = tokens(&s.ok("/tokenize", &json!({"content": text})));
    assert_eq!(t.len(), 1, "{text}: {t:?}");
    t[0]
}

fn timing(v: &Value, k: &str) -> u64 {
    v["timings"][k].as_u64().unwrap_or(0)
}

/// The repo-level layout, with the extra file, compared with llama-server's prompt text on the
/// same file and with the tokens built by hand from its parts: a `/completion` on those tokens
/// generates the same text.
#[test]
fn layout_is_llama_servers() {
    let s = Server::start(&["-c", "4096"]);
    let body = json!({
        "input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    ",
        "input_extra": [{"filename": "lucas.py", "text": EXTRA}],
        "n_predict": 8, "temperature": 0, "return_tokens": true,
    });
    let v = s.ok("/infill", &body);
    let expected = format!(
        "<|repo_name|>myproject\n<|file_sep|>lucas.py\n{EXTRA}<|file_sep|>filename\n<|fim_prefix|>{PREFIX}    <|fim_suffix|>{SUFFIX}<|fim_middle|>"
    );
    assert_eq!(v["prompt"], expected.as_str(), "{v}");

    let mut ids = vec![special(&s, "<|repo_name|>")];
    ids.extend(tok(&s, "myproject\n"));
    ids.push(special(&s, "<|file_sep|>"));
    ids.extend(tok(&s, "lucas.py\n"));
    ids.extend(tok(&s, EXTRA));
    ids.push(special(&s, "<|file_sep|>"));
    ids.extend(tok(&s, "filename\n"));
    ids.push(special(&s, "<|fim_prefix|>"));
    ids.extend(tok(&s, PREFIX));
    ids.extend(tok(&s, "    "));
    ids.push(special(&s, "<|fim_suffix|>"));
    ids.extend(tok(&s, SUFFIX));
    ids.push(special(&s, "<|fim_middle|>"));
    assert_eq!(v["tokens_evaluated"], ids.len(), "{v}");
    let c = s.ok(
        "/completion",
        &json!({"prompt": ids, "n_predict": 8, "temperature": 0, "return_tokens": true,
                "speculative": {"enabled": false}}),
    );
    assert_eq!(tokens(&c), tokens(&v));
    assert_eq!(c["content"], v["content"]);

    // Without extra files: the repository marker and the current file's marker remain.
    let v = s.ok(
        "/infill",
        &json!({"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 1}),
    );
    assert_eq!(
        v["prompt"],
        format!("<|repo_name|>myproject\n<|file_sep|>filename\n<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>")
    );
    // A filename defaults to "tmp"; special-token text in code stays text.
    let v = s.ok(
        "/infill",
        &json!({"input_prefix": "a = '<|im_end|>'\n", "input_suffix": "", "n_predict": 1,
                "input_extra": [{"text": "x = 1\n"}]}),
    );
    assert_eq!(
        v["prompt"],
        "<|repo_name|>myproject\n<|file_sep|>tmp\nx = 1\n<|file_sep|>filename\n<|fim_prefix|>a = '<|im_end|>'\n<|fim_suffix|><|fim_middle|>"
    );
    let im_end = special(&s, "<|im_end|>");
    assert!(!tok(&s, "a = '<|im_end|>'\n").contains(&im_end));
}

/// llama-server's budgets: the prefix keeps its last 1536 tokens (3/4 of its 2048 batch), the
/// suffix its first 512 − 2 − prompt tokens, and the extra files only what the context leaves
/// after a batch and 2 × n_predict (none at 1024 tokens of context).
#[test]
fn budgets_are_llama_servers() {
    let s = Server::start(&["-c", "4096"]);
    let line = "x = x + 1\n";
    let long_prefix = line.repeat(1000);
    let long_suffix = line.repeat(400);
    let per_line = tok(&s, line).len();
    assert_eq!(tok(&s, &long_prefix).len(), per_line * 1000);
    let v = s.ok(
        "/infill",
        &json!({"input_prefix": long_prefix, "input_suffix": long_suffix, "prompt": "y",
                "n_predict": 1}),
    );
    let head = tok(&s, "myproject\n").len() + tok(&s, "filename\n").len() + 2;
    let n_prompt = tok(&s, "y").len();
    // Markers: prefix, suffix, middle. (llama-server: 2060 tokens on the tiny model.)
    let expected = head + 3 + 1536 + n_prompt + (512 - 2 - n_prompt);
    assert_eq!(v["tokens_evaluated"], expected, "{v}");
    assert_eq!(v["tokens_evaluated"], 2060);

    // llama-server's -b and -n set the budgets (its test preset: -c 2048 -b 1024 -n 64): the
    // prefix keeps 768 tokens, the suffix 254, the extra file 2048 − 1024 − 128 = 896.
    // (llama-server: 1921 tokens, the same prompt.)
    let s = Server::start(&["-c", "2048", "-b", "1024", "-n", "64", "-np", "1"]);
    let v = s.ok(
        "/infill",
        &json!({"input_prefix": long_prefix, "input_suffix": long_suffix, "prompt": "y",
                "input_extra": [{"filename": "a.py", "text": "z = 2\n".repeat(1000)}],
                "n_predict": 1}),
    );
    let expected = 896 + 3 + 768 + n_prompt + (256 - 2 - n_prompt);
    assert_eq!(v["tokens_evaluated"], expected, "{v}");
    assert_eq!(v["tokens_evaluated"], 1921);

    let s = Server::start(&["-c", "1024"]);
    let v = s.ok(
        "/infill",
        &json!({"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 1,
                "input_extra": [{"filename": "lucas.py", "text": EXTRA}]}),
    );
    assert_eq!(
        v["prompt"],
        format!("<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>")
    );
}

/// Errors as llama-server's: a model without FIM tokens is 501 `not_supported_error`, bad
/// fields are 400 naming what is wrong, and the server keeps serving.
#[test]
fn errors() {
    let s = Server::start_with(model_without_fim(), &[], &[]);
    let r = s.post(
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    let e = assert_error(&r, 501, "not_supported_error");
    assert_eq!(
        e["error"]["message"],
        "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing. "
    );
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "a", "suffix": "b", "max_tokens": 2}),
    );
    assert_error(&r, 501, "not_supported_error");
    // An empty suffix is a plain completion.
    s.ok(
        "/v1/completions",
        &json!({"prompt": "a", "suffix": "", "max_tokens": 2}),
    );
    let p = s.get("/props").json();
    assert_eq!(p["specd"]["infill"]["supported"], false);

    let s = Server::start(&[]);
    for (body, needle) in [
        (json!({"input_suffix": "b"}), "\"input_prefix\" is required"),
        (json!({"input_prefix": "a"}), "\"input_suffix\" is required"),
        (
            json!({"input_prefix": "a", "input_suffix": "b", "prompt": 3}),
            "\"prompt\" must be a string",
        ),
        (
            json!({"input_prefix": "a", "input_suffix": "b", "input_extra": {}}),
            "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
        ),
        (
            json!({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]}),
            "extra_context chunk must contain a \"text\" field with a string value",
        ),
        (
            json!({"input_prefix": "a", "input_suffix": "b",
                   "input_extra": [{"text": "x", "filename": 1}]}),
            "extra_context chunk's \"filename\" field must be a string",
        ),
        (
            json!({"input_prefix": 1, "input_suffix": "b"}),
            "\"input_prefix\" must be a string",
        ),
    ] {
        let r = s.post("/infill", &body);
        let e = assert_error(&r, 400, "invalid_request_error");
        let m = e["error"]["message"].as_str().unwrap_or("");
        assert!(m.starts_with(needle), "{body}: {m}");
    }
    s.ok(
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b", "n_predict": 1}),
    );
}

/// Infill speculates by default with its own n-gram drafter (not the server's default choice,
/// `ngram-mod`), says so in its settings and `/props`, and its tokens are exactly the plain ones
/// (greedy).
#[test]
fn speculative_by_default_and_exact() {
    let s = Server::start(&["-c", "4096"]);
    let p = s.get("/props").json();
    assert_eq!(p["specd"]["infill"]["supported"], true);
    assert_eq!(p["specd"]["infill"]["spec_types"], json!(["ngram-map-k"]));
    assert_eq!(p["default_generation_settings"]["speculative"], true);
    assert_eq!(p["specd"]["spec_types"], json!(["ngram-mod"]));
    let body = json!({
        "input_prefix": PREFIX, "input_suffix": SUFFIX,
        "input_extra": [{"filename": "lucas.py", "text": EXTRA}],
        "n_predict": 48, "temperature": 0, "return_tokens": true, "ignore_eos": true,
    });
    let v = s.ok("/infill", &body);
    assert_eq!(
        v["generation_settings"]["speculative.types"],
        json!(["ngram-map-k"]),
        "{v}"
    );
    assert!(timing(&v, "draft_n") > 0, "{v}");
    assert!(timing(&v, "draft_n_accepted") > 0, "{v}");
    let mut plain = body.clone();
    plain["speculative"] = json!({"enabled": false});
    let p = s.ok("/infill", &plain);
    assert_eq!(p["generation_settings"]["speculative.types"], json!([]));
    assert!(p["timings"].get("draft_n").is_none(), "{p}");
    assert_eq!(tokens(&v), tokens(&p));
    assert_eq!(v["content"], p["content"]);
    // Another drafter, named by the request, is used instead.
    let mut other = body.clone();
    other["speculative.type"] = json!("ngram-simple");
    let o = s.ok("/infill", &other);
    assert_eq!(
        o["generation_settings"]["speculative.types"],
        json!(["ngram-simple"])
    );
    assert_eq!(tokens(&o), tokens(&p));

    // A server's own default drafters are kept.
    let s = Server::start(&["-c", "4096", "--spec-type", "ngram-simple"]);
    let v = s.ok("/infill", &body);
    assert_eq!(
        v["generation_settings"]["speculative.types"],
        json!(["ngram-simple"])
    );
    assert_eq!(tokens(&v), tokens(&p));
}

/// A streamed infill: `/completion`'s partial results, then its final object; the text is the
/// non-streamed one.
#[test]
fn streaming() {
    let s = Server::start(&["-c", "4096"]);
    let body = json!({"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12,
                      "temperature": 0, "ignore_eos": true});
    let full = s.ok("/infill", &body);
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let r = open_stream(&s.addr, "/infill", &sb.to_string());
    let mut text = String::new();
    let mut last = Value::Null;
    for line in r.lines().map_while(Result::ok) {
        let Some(d) = line.strip_prefix("data: ") else {
            continue;
        };
        let v: Value = serde_json::from_str(d).expect("chunk is JSON");
        if v["stop"] == true {
            last = v;
            break;
        }
        assert!(
            v.get("index").is_some() && v.get("tokens_predicted").is_some(),
            "{v}"
        );
        text.push_str(v["content"].as_str().unwrap_or(""));
    }
    assert_eq!(text, full["content"].as_str().unwrap_or(""));
    assert_eq!(last["content"], "");
    assert_eq!(last["tokens_predicted"], 12);
    assert_eq!(last["prompt"], full["prompt"]);
}

/// `suffix` on `/v1/completions`: the prompt is the prefix of the same FIM prompt `/infill`
/// builds (no extra files), speculative by default, same text as `/infill`.
#[test]
fn oai_suffix_is_infill() {
    let s = Server::start(&["-c", "4096"]);
    let i = s.ok(
        "/infill",
        &json!({"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 16,
                "temperature": 0, "ignore_eos": true}),
    );
    let v = s.ok(
        "/v1/completions",
        &json!({"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 16, "temperature": 0,
                "ignore_eos": true, "verbose": true}),
    );
    assert_eq!(v["choices"][0]["text"], i["content"], "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], i["tokens_evaluated"]);
    assert_eq!(v["__verbose"]["prompt"], i["prompt"]);
    assert_eq!(
        v["__verbose"]["generation_settings"]["speculative.types"],
        json!(["ngram-map-k"])
    );
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": PREFIX, "suffix": 3, "max_tokens": 2}),
    );
    assert_error(&r, 400, "invalid_request_error");
}
