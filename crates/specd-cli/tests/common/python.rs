//! The official API clients the users run (`openai`, `anthropic` for Python), for tests that
//! drive specd with them: a virtual environment under the target directory, made once with
//! the pinned versions from PyPI and reused by every test binary after.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The client packages, pinned so a new release cannot change what the tests check.
const PACKAGES: &[&str] = &["openai==3.57.0", "anthropic==2.13.0"];

/// The venv's Python (`SPECD_CLIENT_PYTHON` names one made elsewhere instead).
pub fn client_python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Some(p) = std::env::var_os("SPECD_CLIENT_PYTHON") {
            return PathBuf::from(p);
        }
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let venv = root.join(format!("py-clients-{}", PACKAGES.join("-")));
        let py = venv.join("bin").join("python");
        if py.exists() {
            return py;
        }
        // Made beside its final place and renamed into it, so test binaries that start at
        // once never see half a venv.
        let tmp = tempfile::tempdir_in(root).expect("tempdir for the venv");
        let building = tmp.path().join("venv");
        let run = |cmd: &mut Command| {
            let out = cmd.output().expect("running python3");
            assert!(
                out.status.success(),
                "{:?}: {}{}",
                cmd,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(Command::new("python3").args(["-m", "venv"]).arg(&building));
        run(Command::new(building.join("bin").join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PACKAGES));
        // Another binary may have won the race; either venv is as good.
        let _ = std::fs::rename(&building, &venv);
        assert!(py.exists(), "no python in {}", venv.display());
        py
    })
}

/// Runs `tests/clients/SCRIPT` with the clients' Python against the server at `addr`
/// (`SPECD_URL` = `http://ADDR`), passing `args`; panics with its output if it fails.
pub fn run_client_script(script: &str, addr: &str, args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("clients")
        .join(script);
    let out = Command::new(client_python())
        .arg(&path)
        .args(args)
        .env("SPECD_URL", format!("http://{addr}"))
        .output()
        .expect("running a client script");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{script} failed:\n{text}");
    text
}
