//! `specd bench --server URL --soak SECS`: the real binary soak-testing a real `specd serve` on
//! the tiny model — requests over the workloads and maximum-size bodies for a few seconds,
//! with latency percentiles, errors and the server's memory over time.

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{Server, BIN};

fn workloads(dir: &Path) {
    let single: String = [
        "Write a Python function that reverses a string.",
        "List three sorts.",
    ]
    .iter()
    .map(|p| {
        format!(
            "{}\n",
            serde_json::json!({"messages": [{"role": "user", "content": p}]})
        )
    })
    .collect();
    std::fs::write(dir.join("single-turn.jsonl"), single).unwrap();
    let multi = serde_json::json!({"id": "m", "turns": ["Write quicksort.", "Now merge sort."]});
    std::fs::write(dir.join("multi-turn-sorting.json"), multi.to_string()).unwrap();
}

fn soak(addr: &str, dir: &Path, extra: &[&str]) -> (Output, Value) {
    let json = dir.join("soak.json");
    let _ = std::fs::remove_file(&json);
    let out = Command::new(BIN)
        .args(["bench", "--server", &format!("http://{addr}")])
        .args([
            "--concurrency",
            "3",
            "-n",
            "4",
            "--temp",
            "0",
            "--ignore-eos",
        ])
        .args(["--rss-every", "1", "--workloads"])
        .arg(dir)
        .arg("--json")
        .arg(&json)
        .args(extra)
        .output()
        .expect("running specd bench --soak");
    let text = std::fs::read_to_string(&json).unwrap_or_else(|_| {
        panic!(
            "no report: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        out,
        serde_json::from_str(&text).expect("--json output is JSON"),
    )
}

fn case<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case"] == name)
        .unwrap_or_else(|| panic!("no case {name}: {r}"))
}

#[test]
fn soak_over_the_workloads_and_maximum_size_bodies() {
    let dir = tempfile::tempdir().unwrap();
    workloads(dir.path());
    let s = Server::start(&["-np", "2"]);
    let pid = s.child.id();
    let (out, r) = soak(
        &s.addr,
        dir.path(),
        &[
            "--soak",
            "3",
            "--soak-mix",
            "workloads,max-body",
            "--max-body-bytes",
            "300000",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The server's process was found through its listening port.
    assert_eq!(r["server_pid"], pid, "{r}");
    assert_eq!(r["pid_from"], "listening port");
    assert_eq!(r["failed"], 0, "{r}");
    assert!(r["requests"].as_u64().unwrap() >= 4, "{r}");
    assert!(r["wall_s"].as_f64().unwrap() >= 3.0);
    for name in ["single-turn", "multi-turn", "max-body /v1/chat/completions"] {
        let c = case(&r, name);
        assert!(c["requests"].as_u64().unwrap() >= 1, "{c}");
        let p50 = c["p50_latency_s"].as_f64().unwrap();
        let p99 = c["p99_latency_s"].as_f64().unwrap();
        assert!(p50 > 0.0 && p99 >= p50, "{c}");
    }
    // Every request is answered, well or with a clean 4xx (the big prompt exceeds the context).
    let st = case(&r, "single-turn");
    assert_eq!(st["ok"], st["requests"], "{st}");
    // Memory over time: a first sample, at least one per second of the run, a last one.
    let rss = r["rss"].as_array().unwrap();
    assert!(rss.len() >= 3, "{r}");
    assert!(
        rss.iter().all(|s| s["rss_mib"].as_f64().unwrap() > 1.0),
        "{r}"
    );
    assert!(r["rss_peak_mib"].as_f64().unwrap() >= r["rss_end_mib"].as_f64().unwrap());
    assert!(r["health"]["probes"].as_u64().unwrap() >= 2, "{r}");
    assert_eq!(r["health"]["failed"], 0, "{r}");
    for header in [
        "| case | requests | ok | refused (4xx) | failed | p50 s | p90 s | p99 s |",
        "| t s | requests done | RSS MiB |",
    ] {
        assert!(stdout.contains(header), "{stdout}");
    }

    // --server-pid names the process instead; --soak-requests bounds the count.
    let (out, r) = soak(
        &s.addr,
        dir.path(),
        &[
            "--soak",
            "30",
            "--soak-requests",
            "5",
            "--server-pid",
            &pid.to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(r["pid_from"], "--server-pid");
    assert!(r["requests"].as_u64().unwrap() <= 5, "{r}");
    assert!(r["wall_s"].as_f64().unwrap() < 30.0, "{r}");
}

#[test]
fn soak_refuses_other_hosts_and_bad_flags() {
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(["bench", "--server"])
            .args(args)
            .output()
            .expect("running specd bench")
    };
    // A non-loopback address is refused before anything is sent (TEST-NET-1, never routed).
    let out = run(&["http://192.0.2.1:8080", "--soak", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("loopback"), "{err}");
    let out = run(&[
        "http://127.0.0.1:9",
        "--soak",
        "1",
        "--soak-mix",
        "everything",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--soak-mix"), "{err}");
}
