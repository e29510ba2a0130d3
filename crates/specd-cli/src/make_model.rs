//! `specd make-test-model`.

use anyhow::{bail, Context, Result};
use clap::Args;
use specd_gguf::TensorType;
use specd_testmodel::{write_model, Mix, Preset, Quant, TestModelSpec, WeightStyle};
use std::path::PathBuf;

#[derive(Args)]
pub struct MakeModelArgs {
    /// Shape: qwen35-tiny, qwen35-small, qwen35-0.8b, qwen35-9b, qwen35moe-tiny,
    /// qwen35moe-small, qwen35moe-35b-a3b, qwen35moe-35b-a3b-4l, qwen3next-tiny, qwen3next-small,
    /// llama-tiny, llama-small.
    #[arg(long, default_value = "qwen35-tiny")]
    preset: String,
    /// Weights: a llama-quantize mix (q4_k_m, q5_k_m, q6_k, iq4_xs, q4_k_xl: per-tensor types
    /// as llama-quantize chooses them without an imatrix; q4_k_xl is an unsloth-UD-like dynamic
    /// mix) or one type for every matrix (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k,
    /// q4_k, q5_k, iq4_nl). Rows that do not fit a type's block get llama.cpp's fallback type.
    /// Default: the preset's.
    #[arg(long = "type")]
    wtype: Option<String>,
    /// With a mix name: one type (the mix's base type) for every matrix, like
    /// `llama-quantize --pure` (`--type iq4_xs --pure` is an all-IQ4_XS file).
    #[arg(long)]
    pure: bool,
    /// Weights: "varied" (small embeddings, untied head: varied output) or "repetitive" (tied
    /// unit embeddings: looping output).
    #[arg(long, default_value = "varied")]
    style: String,
    /// Append an MTP (NextN) block (the Qwen3.5 family: qwen35, qwen35moe, qwen3next presets).
    #[arg(long)]
    mtp: bool,
    /// Leave out the fill-in-the-middle tokens (a model that cannot infill).
    #[arg(long)]
    no_fim: bool,
    /// Random seed of the weights.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Output file.
    #[arg(short, long)]
    output: PathBuf,
}

/// Single weight types `--type` offers.
const SINGLE: [&str; 14] = [
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k",
    "q6_k", "iq4_nl",
];

/// Parses a `--type` value: a mix name first (`q6_k` and `iq4_xs` name both a mix and a type:
/// the Q6_K mix is all Q6_K anyway, and `--pure` turns the IQ4_XS mix into all IQ4_XS), then a
/// single type.
pub fn parse_quant(s: &str, pure: bool) -> Result<Quant> {
    if let Some(m) = Mix::parse(s) {
        return Ok(if pure {
            Quant::Uniform(m.base())
        } else {
            Quant::Mix(m)
        });
    }
    let lower = s.to_ascii_lowercase();
    if SINGLE.contains(&lower.as_str()) {
        return Ok(Quant::Uniform(TensorType::parse(&lower)?));
    }
    bail!(
        "unknown weight type '{s}' (mixes: {}; single types: {})",
        Mix::NAMES.join(", "),
        SINGLE.join(", ")
    )
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
        match parse_quant(t, a.pure)? {
            Quant::Uniform(t) => {
                spec.wtype = t;
                spec.mix = None;
            }
            Quant::Mix(m) => spec.mix = Some(m),
        }
    } else if a.pure {
        if let Some(m) = spec.mix.take() {
            spec.wtype = m.base();
        }
    }
    spec.style = match a.style.as_str() {
        "varied" => WeightStyle::Varied,
        "repetitive" => WeightStyle::Repetitive,
        s => bail!("unknown style '{s}' (varied, repetitive)"),
    };
    spec.mtp = a.mtp;
    spec.fim = !a.no_fim;
    spec.seed = a.seed;
    let t0 = std::time::Instant::now();
    write_model(&spec, &a.output).with_context(|| format!("writing {}", a.output.display()))?;
    let q = match spec.mix {
        Some(m) => m.name().to_string(),
        None => spec.wtype.name(),
    };
    eprintln!(
        "wrote {} ({}, {q}, {:.1}s)",
        a.output.display(),
        spec.name,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names() {
        assert_eq!(
            parse_quant("q4_k_m", false).unwrap(),
            Quant::Mix(Mix::Q4_K_M)
        );
        assert_eq!(
            parse_quant("Q4_K_XL", false).unwrap(),
            Quant::Mix(Mix::Q4KXl)
        );
        assert_eq!(
            parse_quant("iq4_xs", false).unwrap(),
            Quant::Mix(Mix::IQ4_XS)
        );
        assert_eq!(
            parse_quant("iq4_xs", true).unwrap(),
            Quant::Uniform(TensorType::IQ4_XS)
        );
        for (s, t) in [
            ("q8_0", TensorType::Q8_0),
            ("F16", TensorType::F16),
            ("q4_k", TensorType::Q4_K),
            ("iq4_nl", TensorType::IQ4_NL),
            ("q2_k", TensorType::Q2_K),
        ] {
            assert_eq!(parse_quant(s, false).unwrap(), Quant::Uniform(t));
        }
        for bad in ["q8_1", "iq2_xxs", "q4_k_l", ""] {
            let e = parse_quant(bad, false).unwrap_err().to_string();
            assert!(e.contains("q4_k_m") && e.contains("iq4_nl"), "{e}");
        }
    }
}
