//! `specd make-test-model`.

use anyhow::{bail, Context, Result};
use clap::Args;
use specd_gguf::TensorType;
use specd_testmodel::{write_model, Preset, TestModelSpec, WeightStyle};
use std::path::PathBuf;

#[derive(Args)]
pub struct MakeModelArgs {
    /// Shape: qwen35-tiny, qwen35-small, qwen35-0.8b, llama-tiny, llama-small.
    #[arg(long, default_value = "qwen35-tiny")]
    preset: String,
    /// Weight type of the matrices: f32, f16, q8_0 (default: the preset's).
    #[arg(long = "type")]
    wtype: Option<String>,
    /// Weights: "varied" (small embeddings, untied head: varied output) or "repetitive" (tied
    /// unit embeddings: looping output).
    #[arg(long, default_value = "varied")]
    style: String,
    /// Append an MTP (NextN) block (qwen35 only).
    #[arg(long)]
    mtp: bool,
    /// Random seed of the weights.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Output file.
    #[arg(short, long)]
    output: PathBuf,
}

/// Parses a weight type name.
pub fn parse_type(s: &str) -> Result<TensorType> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "f32" => TensorType::F32,
        "f16" => TensorType::F16,
        "bf16" => TensorType::BF16,
        "q8_0" => TensorType::Q8_0,
        "q4_0" => TensorType::Q4_0,
        other => bail!("unknown weight type '{other}' (f32, f16, bf16, q8_0, q4_0)"),
    })
}

pub fn run(a: MakeModelArgs) -> Result<()> {
    let Some(preset) = Preset::parse(&a.preset) else {
        bail!(
            "unknown preset '{}' (one of {})",
            a.preset,
            Preset::NAMES.join(", ")
        );
    };
    let mut spec = TestModelSpec::preset(preset);
    if let Some(t) = &a.wtype {
        spec.wtype = parse_type(t)?;
    }
    spec.style = match a.style.as_str() {
        "varied" => WeightStyle::Varied,
        "repetitive" => WeightStyle::Repetitive,
        s => bail!("unknown style '{s}' (varied, repetitive)"),
    };
    spec.mtp = a.mtp;
    spec.seed = a.seed;
    let t0 = std::time::Instant::now();
    write_model(&spec, &a.output).with_context(|| format!("writing {}", a.output.display()))?;
    eprintln!(
        "wrote {} ({}, {:.1}s)",
        a.output.display(),
        spec.name,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
