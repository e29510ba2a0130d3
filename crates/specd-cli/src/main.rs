//! `specd` command line: `generate`, `make-test-model` (and later `serve`, `bench`).

mod bench;
mod demo;
mod generate;
mod make_model;

use clap::{Parser, Subcommand};

/// specd — exact speculative decoding for hybrid recurrent LLMs on GGUF files.
#[derive(Parser)]
#[command(name = "specd", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a prompt.
    Generate(generate::GenerateArgs),
    /// Measure speed (llama-bench style) and speculative decoding over the workloads.
    Bench(bench::BenchArgs),
    /// Write a synthetic GGUF model (real layout, random weights, trained BPE tokenizer).
    MakeTestModel(make_model::MakeModelArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SPECD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Command::Generate(a) => generate::run(a),
        Command::MakeTestModel(a) => make_model::run(a),
        Command::Bench(a) => bench::run(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
