//! `specd bench --server`: the real binary load-testing a real `specd serve` on the tiny model.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{Server, BIN};

/// A small workload folder in the format of `shared/workloads`: five single-turn prompts (so
/// `--max-prompts 3` has something to cut) and a three-turn conversation.
fn workloads(dir: &Path) {
    let single: String = [
        "Write a Python function that reverses a string.",
        "Explain what a binary heap is.",
        "Write a C function that sums an array of integers.",
        "List three sorting algorithms.",
        "Write hello world in Rust.",
    ]
    .iter()
    .enumerate()
    .map(|(i, p)| {
        let line = serde_json::json!({"id": format!("p{i}"),
                                      "messages": [{"role": "user", "content": p}]});
        format!("{line}\n")
    })
    .collect();
    std::fs::write(dir.join("single-turn.jsonl"), single).unwrap();
    let multi = serde_json::json!({
        "id": "multi_test",
        "about": "three user turns of one conversation",
        "turns": [
            "Write quicksort in C with comments.",
            "Now write merge sort in the same style.",
            "Add a main function that times both.",
        ],
    });
    std::fs::write(dir.join("multi-turn-sorting.json"), multi.to_string()).unwrap();
}

fn bench(addr: &str, dir: &Path, extra: &[&str]) -> (Output, Option<Value>) {
    let json = dir.join(format!("out-{}.json", extra.join("")));
    let _ = std::fs::remove_file(&json);
    let out = Command::new(BIN)
        .args(["bench", "--server", &format!("http://{addr}")])
        .args(["--concurrency", "2", "-n", "8", "--max-prompts", "3"])
        .args(["--temp", "0", "--ignore-eos", "--workloads"])
        .arg(dir)
        .arg("--json")
        .arg(&json)
        .args(extra)
        .output()
        .expect("running specd bench");
    let report = std::fs::read_to_string(&json)
        .ok()
        .map(|t| serde_json::from_str(&t).expect("--json output is JSON"));
    (out, report)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn load_test_against_specd_serve() {
    let dir = tempfile::tempdir().unwrap();
    workloads(dir.path());
    let s = Server::start(&[]);

    for stream in [false, true] {
        let extra: &[&str] = if stream { &["--stream"] } else { &[] };
        let (out, r) = bench(&s.addr, dir.path(), extra);
        assert!(
            out.status.success(),
            "stream={stream}: {}\n{}",
            text(&out.stderr),
            s.log()
        );
        let r = r.expect("report written");
        let stdout = text(&out.stdout);
        assert!(stdout.contains("| single-turn | 3 | 0 | 24 |"), "{stdout}");
        assert_eq!(r["errors"].as_array().map(Vec::len), Some(0), "{r}");

        let st = &r["single_turn"];
        assert_eq!(st["requests"], 3, "{r}");
        assert_eq!(st["failed"], 0);
        // --ignore-eos: every request generates exactly -n tokens.
        assert_eq!(st["completion_tokens"], 24);
        assert!(st["throughput_tok_s"].as_f64().unwrap() > 0.0);
        assert!(st["p90_latency_s"].as_f64().unwrap() >= st["p50_latency_s"].as_f64().unwrap());
        assert!(
            st["prompt_n"].as_u64().unwrap() > 0,
            "specd reports timings"
        );
        assert_eq!(st["mean_ttft_s"].is_f64(), stream, "{st}");

        let mt = &r["multi_turn"];
        assert_eq!(mt["conversations"], 2);
        assert_eq!(mt["completed_conversations"], 2);
        assert_eq!(mt["summary"]["requests"], 6);
        assert_eq!(mt["summary"]["failed"], 0);
        let turns = mt["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 3);
        for t in turns {
            assert_eq!(t["requests"], 2, "{t}");
            assert_eq!(t["mean_completion_tokens"], 8.0, "{t}");
        }
        // Turns 2+ carry the previous turns, which the server still has: it processes only
        // the new tokens, far fewer than the whole prompt.
        for t in &turns[1..] {
            let all = t["mean_prompt_tokens"].as_f64().unwrap();
            let processed = t["mean_prompt_n"].as_f64().unwrap();
            assert!(processed < all, "no prompt reuse: {t}");
        }
        let t1 = turns[0]["mean_prompt_tokens"].as_f64().unwrap();
        let t3 = turns[2]["mean_prompt_tokens"].as_f64().unwrap();
        assert!(t3 > t1, "the history grows: {mt}");
    }
}

#[test]
fn failures_are_counted_and_unreachable_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    workloads(dir.path());

    // Every request is refused (no API key): counted per request, reported, non-zero exit.
    let s = Server::start(&["--api-key", "secret"]);
    let (out, r) = bench(&s.addr, dir.path(), &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("all 5 requests failed") && err.contains("401"),
        "{err}"
    );
    let r = r.expect("the report is written even when requests fail");
    assert_eq!(r["single_turn"]["requests"], 3);
    assert_eq!(r["single_turn"]["failed"], 3);
    // A conversation stops at its first failed turn.
    assert_eq!(r["multi_turn"]["summary"]["failed"], 2);
    assert_eq!(r["multi_turn"]["completed_conversations"], 0);
    // With the key the same run succeeds.
    let (out, _) = bench(&s.addr, dir.path(), &["--api-key", "secret"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    drop(s);

    // Nothing listening: a clear error before any measurement.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (out, r) = bench(&format!("127.0.0.1:{port}"), dir.path(), &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("cannot reach the server"), "{err}");
    assert!(r.is_none());
}
