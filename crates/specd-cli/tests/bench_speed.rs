//! `specd bench --mode speed`: the real binary on the tiny model. Checks what the report says
//! and that it is complete — never how fast anything was.

use serde_json::Value;
use std::process::Command;

mod common;
use common::BIN;

/// Runs the speed test with a short prompt (`--n-prompt` 32 unless `extra` sets it).
fn speed(extra: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["bench", "--mode", "speed", "-m"])
        .arg(common::model())
        .args(["-t", "1", "-n", "4", "-r", "1", "--json", "-"])
        .args(extra);
    if !extra.contains(&"--n-prompt") {
        cmd.args(["--n-prompt", "32"]);
    }
    cmd.output().expect("running specd bench")
}

/// The JSON report of a speed test that must succeed.
fn report(extra: &[&str]) -> Value {
    let out = speed(extra);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

/// The verification widths are timed at the depth asked for (every batch rolled back, so all
/// rounds see that depth), over the rounds asked for, and the report says both.
#[test]
fn width_test_runs_at_the_requested_depth() {
    let rep = report(&["--width-depth", "300", "--width-rounds", "2"]);
    let s = &rep["speed"];
    assert_eq!(s["width_depth"], 300);
    assert_eq!(s["width_rounds"], 2);
    let widths: Vec<(u64, f64)> = s["verify_ms_by_width"]
        .as_array()
        .expect("widths")
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    assert_eq!(
        widths.iter().map(|w| w.0).collect::<Vec<_>>(),
        [1, 2, 4, 8, 16]
    );
    assert!(
        widths.iter().all(|w| w.1.is_finite() && w.1 > 0.0),
        "{widths:?}"
    );
}

/// `--widths` times the widths asked for, one row always among them (the others are divided by
/// it), in order, without duplicates — a batch wider than the default rollback window included.
#[test]
fn widths_are_the_ones_asked_for() {
    let rep = report(&["--widths", "32,3,3"]);
    let widths: Vec<u64> = rep["speed"]["verify_ms_by_width"]
        .as_array()
        .expect("widths")
        .iter()
        .map(|p| p[0].as_u64().unwrap())
        .collect();
    assert_eq!(widths, [1, 3, 32]);
}

#[test]
fn empty_tests_are_errors() {
    for (flag, value) in [
        ("--width-depth", "0"),
        ("--n-prompt", "0"),
        ("--widths", "0"),
        ("--width-rounds", "0"),
    ] {
        let out = speed(&[flag, value]);
        assert!(!out.status.success(), "{flag} {value} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(flag) && err.contains("must be at least 1"),
            "{err}"
        );
    }
}
