//! The built-in demo model: generated on first use into a cache directory, so `specd generate`
//! and `specd serve` work with no model file at hand.

use anyhow::{Context, Result};
use specd_testmodel::{write_model, Preset, TestModelSpec};
use std::path::PathBuf;

/// Path of the demo model, generating it if needed.
pub fn demo_model_path() -> Result<PathBuf> {
    let dir = std::env::var_os("SPECD_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("specd")))
        .or_else(|| std::env::var_os("HOME").map(|d| PathBuf::from(d).join(".cache/specd")))
        .unwrap_or_else(|| std::env::temp_dir().join("specd"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("demo-qwen35-small-v1.gguf");
    if !path.exists() {
        eprintln!(
            "generating the demo model into {} (first use)...",
            path.display()
        );
        let spec = TestModelSpec::preset(Preset::Qwen35Small);
        write_model(&spec, &path).context("generating the demo model")?;
    }
    Ok(path)
}
