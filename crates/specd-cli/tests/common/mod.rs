//! Helpers shared by the integration tests: the tiny test model and a running `specd serve`.

// Each test binary uses its own subset of these.
#![allow(dead_code)]

pub mod http;
pub mod python;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_specd");

/// A generated model (`specd make-test-model ARGS -o DIR/NAME`); the directory lives as long
/// as the returned handle.
pub fn make_model(name: &str, args: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join(name);
    let out = Command::new(BIN)
        .arg("make-test-model")
        .args(args)
        .arg("-o")
        .arg(&p)
        .output()
        .expect("running make-test-model");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, p)
}

/// The tiny hybrid model, generated once per test binary. "repetitive" weights loop, so the
/// n-gram drafters find drafts and speculation really runs.
pub fn model() -> &'static PathBuf {
    static M: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &M.get_or_init(|| {
        make_model(
            "tiny.gguf",
            &["--preset", "qwen35-tiny", "--style", "repetitive"],
        )
    })
    .1
}

/// A running `specd serve`; killed on drop.
pub struct Server {
    pub child: Child,
    /// `host:port` it listens on.
    pub addr: String,
    /// Its stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `specd serve` on the tiny model, on a free port, with `extra` flags.
    pub fn start(extra: &[&str]) -> Server {
        Self::start_env(extra, &[])
    }

    /// [`Server::start`] with environment variables set (`LLAMA_ARG_*`).
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        Self::start_with(model(), extra, env)
    }

    /// [`Server::start_env`] on another model file.
    pub fn start_with(model: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut args = vec!["-m", model.to_str().expect("utf-8 model path")];
        args.extend_from_slice(extra);
        Self::spawn(&args, env)
    }

    /// `specd serve` with no `-m`: the built-in demo model.
    pub fn start_demo(extra: &[&str], env: &[(&str, &str)]) -> Server {
        Self::spawn(extra, env)
    }

    fn spawn(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(BIN)
            .arg("serve")
            .args(["--port", "0", "-t", "1"])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting specd serve");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(a) = line.split("listening on http://").nth(1) {
                    let _ = tx.send(a.trim().to_string());
                }
                let mut l = log2.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("server did not start:\n{}", log.lock().unwrap());
            }
        };
        Server { child, addr, log }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Whether the log shows `needle` within a few seconds: a line the server wrote before
    /// answering may still be on its way through the thread that reads its stderr.
    pub fn log_shows(&self, needle: &str) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if self.log().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
