//! The built-in demo model, so `specd generate` and `specd serve` work with no model file at
//! hand and no network: the small trained code model of `../shared/models` (qwen35, 8.35 M
//! parameters, a byte-level BPE tokenizer trained on Python sources) in Q8_0, made by
//! llama.cpp's `llama-quantize` (`scripts/make-demo-model.sh`). Its greedy output is
//! Python-like text that repeats itself, which is what n-gram drafting feeds on: the first run
//! shows speculation at work.
//!
//! The file is compiled into the binary (about 9 MB) and written to the cache directory on
//! first use, under a name that carries its content hash, so a new demo model never meets a
//! stale copy.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;

/// The demo model's bytes.
static DEMO_GGUF: &[u8] = include_bytes!("../demo/qwen35-code-q8_0.gguf");

/// FNV-1a of the bytes: names the cached copy (a checksum against staleness, not security).
fn content_tag(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn cache_dir() -> PathBuf {
    std::env::var_os("SPECD_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("specd")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/specd")))
        .unwrap_or_else(|| std::env::temp_dir().join("specd"))
}

/// Path of the demo model, writing it to the cache directory if it is not there yet.
pub fn demo_model_path() -> Result<PathBuf> {
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = format!("demo-qwen35-code-q8_0-{:016x}.gguf", content_tag(DEMO_GGUF));
    let path = dir.join(name);
    let complete = std::fs::metadata(&path).is_ok_and(|m| m.len() == DEMO_GGUF.len() as u64);
    if !complete {
        // Written aside and renamed, so a second process starting at the same time never
        // loads a half-written file.
        let tmp = dir.join(format!(".demo-{}.gguf.tmp", std::process::id()));
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(DEMO_GGUF)
            .and_then(|()| f.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("moving the demo model to {}", path.display()))?;
    }
    Ok(path)
}
