//! `specd` command line: `serve`, `generate`, `bench`, `make-test-model`.

mod bench;
mod demo;
mod generate;
mod make_model;
mod serve;

use clap::{Parser, Subcommand};

/// specd — exact speculative decoding for hybrid recurrent LLMs on GGUF files.
#[derive(Parser)]
#[command(name = "specd", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI / llama-server compatible HTTP API (takes llama-server's flags).
    Serve(Box<serve::ServeArgs>),
    /// Generate a continuation of a prompt.
    Generate(generate::GenerateArgs),
    /// Measure speed (llama-bench style) and speculative decoding over the workloads.
    Bench(bench::BenchArgs),
    /// Write a synthetic GGUF model (real layout, random weights, trained BPE tokenizer).
    MakeTestModel(make_model::MakeModelArgs),
}

fn main() {
    // llama-server command lines (`-np 4 -ngl 99 …`) are rewritten for clap first.
    let args = match serve::preprocess(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let cli = Cli::parse_from(args);
    // `serve --verbose` logs specd's debug messages too, as llama-server's `-v` does.
    let verbose = matches!(&cli.cmd, Command::Serve(a) if a.verbose);
    let default_filter = if verbose {
        "warn,specd=debug,specd_server=debug"
    } else {
        "warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SPECD_LOG")
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let r = match cli.cmd {
        Command::Serve(a) => serve::run(*a),
        Command::Generate(a) => generate::run(a),
        Command::MakeTestModel(a) => make_model::run(a),
        Command::Bench(a) => bench::run(a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
