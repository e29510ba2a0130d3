//! `specd bench`: speed of the engine (llama-bench style pp/tg) and of speculative decoding
//! (plain vs each drafter vs each rollback mode over ../shared/workloads, and a synthetic
//! acceptance sweep). Prints ratios; `--json` for machines. `--server URL` load-tests a running
//! server instead (`server_load`).

mod server_load;

use crate::generate::{cpu_backend, ModelArgs, SamplingArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use specd_backend::{Backend, Batch, Context as BackendContext, MemoryConfig, Output};
use specd_spec::{
    DrafterKind, Engine, RollbackKind, SequenceRequest, SpecParams, SpecStats, VerifyKind,
};
use specd_tokenizer::{ChatMessage, ChatTemplate};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// What to measure: "speed" (prompt processing and generation, like llama-bench),
    /// "spec" (drafters × rollback modes over the workloads), "synth" (synthetic acceptance
    /// sweep), or "all".
    #[arg(long, default_value = "all")]
    pub mode: String,
    /// Prompt length for the pp test.
    #[arg(long = "n-prompt", default_value_t = 128)]
    pub n_prompt: usize,
    /// Tokens generated per test (with --server: `max_tokens` of each request).
    #[arg(
        short = 'n',
        long = "n-gen",
        alias = "n-predict",
        default_value_t = 128
    )]
    pub n_gen: usize,
    /// Repetitions of the speed tests (the median is reported).
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    pub reps: usize,
    /// Tokens already in memory when the verification widths are timed: attention reads all of
    /// them for every query row, so long contexts make wide batches dearer.
    #[arg(long = "width-depth", default_value_t = 32)]
    pub width_depth: usize,
    /// Round-robin rounds of the width test; each width's fastest round is reported (more rounds:
    /// steadier figures on a noisy host, and a longer run to profile).
    #[arg(long = "width-rounds", default_value_t = 8)]
    pub width_rounds: usize,
    /// Verification widths to time, in rows (comma list; one row is always timed too: it is what
    /// the others are divided by).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub widths: Vec<usize>,
    /// Workload folder (single-turn.jsonl, multi-turn-sorting.json).
    #[arg(long, default_value = "../shared/workloads")]
    pub workloads: PathBuf,
    /// Drafters to compare in "spec" mode (comma list).
    #[arg(
        long = "spec-type",
        default_value = "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache"
    )]
    pub spec_type: String,
    /// Draft model for draft-simple.
    #[arg(long = "model-draft", alias = "md")]
    pub model_draft: Option<PathBuf>,
    /// Rollback modes to compare.
    #[arg(long = "spec-rollback", default_value = "replay,snapshot,checkpoint")]
    pub rollback: String,
    #[arg(long = "spec-draft-n-max", default_value_t = 8)]
    pub n_max: usize,
    /// Draft verification for the model drafters: exact (tokens identical to plain decoding) or
    /// probabilistic (rejection sampling; same distribution, not the same tokens).
    #[arg(long = "spec-verify", default_value = "exact")]
    pub verify: String,
    /// Synthetic sweep: per-token (conditional) acceptance rates; position i is accepted with
    /// probability rate^(i+1).
    #[arg(long = "synth-rates", default_value = "0,0.25,0.5,0.75,0.9,1")]
    pub synth_rates: String,
    /// Synthetic sweep draft lengths.
    #[arg(long = "synth-lens", default_value = "4,8,16")]
    pub synth_lens: String,
    /// Always draft n-max (disable the never-slower controller).
    #[arg(long = "spec-fixed")]
    pub fixed: bool,
    /// At most this many single-turn prompts.
    #[arg(long = "max-prompts", default_value_t = 12)]
    pub max_prompts: usize,
    /// Rounds in "spec" / "synth" mode: each round runs plain and every configuration once per
    /// workload; each cell reports its fastest round's tok/s and, as its speedup, the median over
    /// rounds of its tok/s over that round's plain tok/s (one run's timing is mostly the host's
    /// noise on small models and shared machines).
    #[arg(long = "spec-reps", default_value_t = 1)]
    pub spec_reps: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// JSON output: `--json` prints it instead of the tables; `--json PATH` writes it to PATH
    /// and still prints the tables.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Load-test a running OpenAI / llama.cpp-compatible server (`specd serve`, llama-server)
    /// over the workloads instead of running a model here; `--mode` and the model flags are
    /// then ignored.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// With --server: clients (requests in flight) at once; also the number of copies of the
    /// multi-turn conversation run together.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// With --server: sent as `Authorization: Bearer KEY`.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// With --server: stream the responses (SSE), to measure time to first token.
    #[arg(long)]
    pub stream: bool,
    /// With --server: send `ignore_eos` so every request generates exactly -n tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// With --server: seconds before an unanswered request counts as failed.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// With --server: soak test for this many seconds instead of one pass over the workloads:
    /// --concurrency clients send back to back, cycling over the --soak-mix cases; prints
    /// errors, latency percentiles and the server's memory over time. Loopback servers only.
    #[arg(long, value_name = "SECS")]
    pub soak: Option<u64>,
    /// Soak: the most requests sent in all (the run stops at whichever bound comes first).
    #[arg(long = "soak-requests", default_value_t = 100_000)]
    pub soak_requests: usize,
    /// Soak: what the clients send, comma list: `workloads` (each single-turn prompt and the
    /// multi-turn conversation), `max-body` (--max-body-bytes bodies to /v1/chat/completions,
    /// /completion and /tokenize in turn).
    #[arg(long = "soak-mix", default_value = "workloads")]
    pub soak_mix: String,
    /// Soak: size of the maximum-size body (default: 64 KiB under specd's 16 MiB body limit).
    #[arg(long = "max-body-bytes", default_value_t = server_load::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Soak: process id of the server whose memory is sampled (default: the process listening
    /// on the --server port, found through /proc).
    #[arg(long = "server-pid")]
    pub server_pid: Option<u32>,
    /// Soak: seconds between samples of the server's memory.
    #[arg(long = "rss-every", default_value_t = 10)]
    pub rss_every: u64,
}

/// Writes the JSON report where `--json` says: `-` (the flag without a path) is stdout, and
/// the return value is then true (print nothing else).
fn emit_json(json: Option<&Path>, report: &impl Serialize) -> Result<bool> {
    let Some(path) = json else {
        return Ok(false);
    };
    let text = serde_json::to_string_pretty(report)?;
    if path == Path::new("-") {
        println!("{text}");
        return Ok(true);
    }
    specd_server::atomic_file::write(path, (text + "\n").as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(false)
}

#[derive(Serialize, Default)]
struct Report {
    model: String,
    threads: usize,
    /// The kernels' instruction-set level (`SPECD_ISA` names: avx2, avx512, amx, …).
    kernels: String,
    /// Verification of model drafters ("exact" or "probabilistic").
    verify: String,
    speed: Option<SpeedResult>,
    spec: Vec<SpecRow>,
    synth: Vec<SpecRow>,
}

#[derive(Serialize)]
struct SpeedResult {
    pp_tokens: usize,
    pp_tok_s: f64,
    tg_tokens: usize,
    tg_tok_s: f64,
    /// Tokens in memory before each timed verification batch.
    width_depth: usize,
    /// Round-robin rounds of the width test.
    width_rounds: usize,
    /// Milliseconds of one decode call by verification width (1, 2, 4, 8, 16 rows), fastest of
    /// `--width-rounds` round-robin rounds.
    verify_ms_by_width: Vec<(usize, f64)>,
}

#[derive(Serialize, Clone)]
struct SpecRow {
    workload: String,
    drafter: String,
    rollback: String,
    n_max: usize,
    rate: Option<f32>,
    tokens: usize,
    secs: f64,
    tok_s: f64,
    speedup: f64,
    acceptance_length: f64,
    acceptance_rate: f64,
    accepted_per_position: Vec<f64>,
    stats: SpecStats,
    /// The draft-length controller's width prices at the end of the run: `[width, steps,
    /// measured]` (steps of one one-row decode; unmeasured widths are estimated).
    controller_widths: Vec<(usize, f64, bool)>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn bar(n: usize, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(n as u64);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

/// llama-bench style: pp = one batch of n_prompt tokens; tg = n_gen single-token decodes.
fn speed(model: &dyn Backend, a: &BenchArgs) -> Result<SpeedResult> {
    let mut widths_list = a.widths.clone();
    widths_list.push(1);
    widths_list.sort_unstable();
    widths_list.dedup();
    let widest = widths_list.last().copied().unwrap_or(1);
    if widths_list.first() == Some(&0) {
        bail!("--widths must be at least 1 row each");
    }
    let depth = a.width_depth;
    if depth == 0 {
        bail!("--width-depth must be at least 1");
    }
    if a.n_prompt == 0 || a.n_gen == 0 {
        bail!("--n-prompt and --n-gen must be at least 1");
    }
    if a.width_rounds == 0 {
        bail!("--width-rounds must be at least 1");
    }
    let n_vocab = model.info().n_vocab as u32;
    let cfg = MemoryConfig {
        // The width test rolls every batch back, so it needs depth + the widest batch, and a
        // rollback record that covers the widest batch.
        n_ctx: a.n_prompt.max(depth + widest) + a.n_gen + 64,
        rollback_window: widest.max(MemoryConfig::default().rollback_window),
        max_seqs: 1,
        kv_type_k: a.model.cache_type_k,
        kv_type_v: a.model.cache_type_v,
        ..Default::default()
    };
    let toks: Vec<u32> = (0..a.n_prompt.max(depth + widest) as u32)
        .map(|i| (i * 7919 + 13) % n_vocab)
        .collect();
    let pb = bar(a.reps * 2 + a.width_rounds, "speed");
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    // Steps decode into one output, as the engine's rounds do: its logits buffer (megabytes for
    // a verification batch) is allocated once, not zeroed again every step.
    let mut out = model.new_context(cfg.clone())?.new_output();
    for _ in 0..a.reps {
        let mut ctx = model.new_context(cfg.clone())?;
        let t0 = Instant::now();
        ctx.decode_new(&Batch::from_tokens(&toks[..a.n_prompt], 0, 0, false))?;
        pp.push(a.n_prompt as f64 / t0.elapsed().as_secs_f64());
        pb.inc(1);
        let mut ctx = model.new_context(cfg.clone())?;
        decode(
            ctx.as_mut(),
            &Batch::from_tokens(&toks[..1], 0, 0, true),
            out.as_mut(),
        )?;
        let t0 = Instant::now();
        for i in 1..=a.n_gen {
            let t = (i as u32 * 104_729) % n_vocab;
            let b = Batch::from_tokens(&[t], i as u32, 0, true);
            decode(ctx.as_mut(), &b, out.as_mut())?;
        }
        tg.push(a.n_gen as f64 / t0.elapsed().as_secs_f64());
        pb.inc(1);
    }
    // Widths are measured round-robin and the fastest of the rounds is kept: on a shared host
    // the noise comes in bursts, and measuring one width after another let a burst land on one
    // width only and distort the ratios. Each batch is rolled back (untimed), so every round
    // runs at the same depth.
    let mut mems = Vec::new();
    for _ in &widths_list {
        let mut ctx = model.new_context(cfg.clone())?;
        for (i, c) in toks[..depth].chunks(512).enumerate() {
            ctx.decode_new(&Batch::from_tokens(c, (i * 512) as u32, 0, false))?;
        }
        mems.push(ctx);
    }
    let mut best = vec![f64::INFINITY; widths_list.len()];
    for _ in 0..a.width_rounds {
        for ((&w, mem), best) in widths_list.iter().zip(&mut mems).zip(&mut best) {
            let rows = Batch::from_tokens(&toks[depth..depth + w], depth as u32, 0, true);
            let t0 = Instant::now();
            decode(mem.as_mut(), &rows, out.as_mut())?;
            *best = best.min(t0.elapsed().as_secs_f64() * 1e3);
            mem.rollback(0, w)?;
        }
        pb.inc(1);
    }
    let widths = widths_list.into_iter().zip(best).collect();
    pb.finish_and_clear();
    Ok(SpeedResult {
        pp_tokens: a.n_prompt,
        pp_tok_s: median(pp),
        tg_tokens: a.n_gen,
        tg_tok_s: median(tg),
        width_depth: depth,
        width_rounds: a.width_rounds,
        verify_ms_by_width: widths,
    })
}

/// Decodes all of `batch` into `out`.
fn decode(ctx: &mut dyn BackendContext, batch: &Batch, out: &mut dyn Output) -> Result<()> {
    ctx.decode(batch, out, &mut |_| ControlFlow::Continue(()))?;
    Ok(())
}

/// The benchmark prompts: single-turn messages, and the multi-turn conversation as one chain.
struct Workload {
    id: String,
    /// Turns of user messages (single-turn workloads have one).
    turns: Vec<String>,
}

fn load_workloads(dir: &std::path::Path, max: usize) -> Result<Vec<Workload>> {
    let mut out = Vec::new();
    let st = std::fs::read_to_string(dir.join("single-turn.jsonl"))
        .with_context(|| format!("reading {}", dir.join("single-turn.jsonl").display()))?;
    for line in st.lines().filter(|l| !l.trim().is_empty()).take(max) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let id = v["id"].as_str().unwrap_or("?").to_string();
        let msg = v["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        out.push(Workload {
            id,
            turns: vec![msg],
        });
    }
    if let Ok(mt) = std::fs::read_to_string(dir.join("multi-turn-sorting.json")) {
        let v: serde_json::Value = serde_json::from_str(&mt)?;
        let turns = v["turns"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Workload {
            id: v["id"].as_str().unwrap_or("multi_turn").into(),
            turns,
        });
    }
    Ok(out)
}

struct RunResult {
    tokens: usize,
    secs: f64,
    stats: SpecStats,
    /// [`specd_spec::controller::CostModel::width_table`] after the last turn.
    widths: Vec<(usize, f64, bool)>,
}

impl RunResult {
    fn tok_s(&self) -> f64 {
        self.tokens as f64 / self.secs.max(1e-9)
    }
}

/// Runs a workload (all turns; each turn carries the whole history) with `spec`.
/// The fastest of `reps` (at least one) runs.
/// Keeps the faster of `slot` and `r`.
fn keep_fastest(slot: &mut Option<RunResult>, r: RunResult) {
    if slot.as_ref().is_none_or(|b| r.tok_s() > b.tok_s()) {
        *slot = Some(r);
    }
}

fn run_workload(
    model: &Arc<dyn Backend>,
    w: &Workload,
    a: &BenchArgs,
    spec: &SpecParams,
    rollback: RollbackKind,
    draft: Option<Arc<dyn Backend>>,
    references: &mut Vec<Vec<u32>>,
) -> Result<RunResult> {
    let tmpl = model
        .tokenizer()
        .chat_template()
        .map(ChatTemplate::new)
        .transpose()?;
    let mut msgs: Vec<ChatMessage> = Vec::new();
    let mut res = RunResult {
        tokens: 0,
        secs: 0.0,
        stats: SpecStats::default(),
        widths: Vec::new(),
    };
    let cfg = MemoryConfig {
        n_ctx: 8192,
        max_seqs: 1,
        kv_type_k: a.model.cache_type_k,
        kv_type_v: a.model.cache_type_v,
        ..Default::default()
    };
    for (ti, turn) in w.turns.iter().enumerate() {
        msgs.push(ChatMessage::new("user", turn));
        let prompt_text = match &tmpl {
            Some(t) => t.render(&msgs, true, &Default::default())?,
            None => msgs
                .iter()
                .map(|m| m.content_text())
                .collect::<Vec<_>>()
                .join("\n"),
        };
        let prompt = model.tokenizer().encode(&prompt_text, true, true)?;
        let mut req = SequenceRequest::greedy(prompt.clone(), a.n_gen);
        req.sampler = a.sampling.params();
        req.logit_bias = a.sampling.logit_bias.clone();
        req.ignore_eos = true;
        req.spec = spec.clone();
        req.draft_model = draft.clone();
        if spec.drafters.contains(&DrafterKind::Synthetic) {
            req.reference = references.get(ti).cloned().map(Arc::new);
        }
        let mut engine = Engine::new(model.clone(), cfg.clone(), rollback)?;
        let t0 = Instant::now();
        let out = engine.generate(0, req)?;
        res.secs += t0.elapsed().as_secs_f64() - out.prompt_secs;
        res.tokens += out.tokens.len();
        res.stats.merge(&out.stats);
        if spec.enabled() {
            res.widths = engine.cost_model().width_table(spec.n_max + 1);
        }
        if !spec.enabled() && references.len() == ti {
            let mut r = prompt.clone();
            r.extend_from_slice(&out.tokens);
            references.push(r);
        }
        msgs.push(ChatMessage::new("assistant", &out.text));
    }
    Ok(res)
}

fn row(
    w: &str,
    drafter: &str,
    rb: RollbackKind,
    n_max: usize,
    rate: Option<f32>,
    r: &RunResult,
    plain_tok_s: f64,
) -> SpecRow {
    let tok_s = r.tok_s();
    let st = &r.stats;
    SpecRow {
        workload: w.into(),
        drafter: drafter.into(),
        rollback: rb.name().into(),
        n_max,
        rate,
        tokens: r.tokens,
        secs: r.secs,
        tok_s,
        speedup: tok_s / plain_tok_s.max(1e-9),
        acceptance_length: st.acceptance_length(),
        acceptance_rate: st.acceptance_rate(),
        accepted_per_position: st
            .accepted_per_position
            .iter()
            .zip(&st.drafted_per_position)
            .map(|(&acc, &d)| if d == 0 { 0.0 } else { acc as f64 / d as f64 })
            .collect(),
        stats: st.clone(),
        controller_widths: r.widths.clone(),
    }
}

/// Seed used when `--seed` is not given: every configuration (and every server) then samples
/// the same text, which the synthetic drafter's reference run and any comparison need.
pub const DEFAULT_SEED: u32 = 42;

pub fn run(mut a: BenchArgs) -> Result<()> {
    if a.sampling.seed == u32::MAX {
        a.sampling.seed = DEFAULT_SEED;
    }
    if let Some(url) = &a.server {
        return server_load::run(url, &a);
    }
    let verify = VerifyKind::parse(&a.verify)
        .with_context(|| format!("unknown verification '{}' (exact, probabilistic)", a.verify))?;
    let cpu = a.model.load()?;
    let model = cpu_backend(&cpu);
    let mut rep = Report {
        model: a
            .model
            .model
            .as_ref()
            .map_or("demo".into(), |p| p.display().to_string()),
        threads: cpu.n_threads(),
        kernels: specd_ops::isa().name().into(),
        verify: a.verify.clone(),
        ..Default::default()
    };
    let modes: Vec<&str> = if a.mode == "all" {
        vec!["speed", "spec", "synth"]
    } else {
        a.mode.split(',').collect()
    };
    let draft = match &a.model_draft {
        Some(p) => Some(a.model.load_draft(p, &cpu)?),
        None => None,
    };
    let rollbacks: Vec<RollbackKind> = a
        .rollback
        .split(',')
        .map(|r| RollbackKind::parse(r.trim()).with_context(|| format!("unknown rollback '{r}'")))
        .collect::<Result<_>>()?;
    for m in &modes {
        match *m {
            "speed" => rep.speed = Some(speed(model.as_ref(), &a)?),
            "spec" | "synth" => {}
            other => bail!("unknown bench mode '{other}' (speed, spec, synth, all)"),
        }
    }
    let need_workloads = modes.iter().any(|m| *m == "spec" || *m == "synth");
    if need_workloads {
        let workloads = load_workloads(&a.workloads, a.max_prompts)?;
        let drafters = DrafterKind::parse_list(&a.spec_type).map_err(anyhow::Error::msg)?;
        let base = SpecParams {
            n_max: a.n_max,
            adaptive: !a.fixed,
            verify,
            ..SpecParams::default()
        };
        let mut configs: Vec<(String, SpecParams, RollbackKind, Option<f32>)> = Vec::new();
        if modes.contains(&"spec") {
            for d in &drafters {
                for rb in &rollbacks {
                    configs.push((
                        d.name().into(),
                        SpecParams {
                            drafters: vec![*d],
                            ..base.clone()
                        },
                        *rb,
                        None,
                    ));
                }
            }
        }
        if modes.contains(&"synth") {
            let rates: Vec<f32> = a
                .synth_rates
                .split(',')
                .map(|x| x.trim().parse())
                .collect::<Result<_, _>>()?;
            let lens: Vec<usize> = a
                .synth_lens
                .split(',')
                .map(|x| x.trim().parse())
                .collect::<Result<_, _>>()?;
            for &len in &lens {
                for &rate in &rates {
                    for rb in &rollbacks {
                        let p = SpecParams {
                            drafters: vec![DrafterKind::Synthetic],
                            n_max: len,
                            synth_rates: specd_spec::drafter::synthetic::rates_for_per_token(
                                rate, len,
                            ),
                            ..base.clone()
                        };
                        configs.push((format!("synthetic@{len}"), p, *rb, Some(rate)));
                    }
                }
            }
        }
        // Synthetic runs use only the first workload (the sweep is about the machinery).
        let synth_w = &workloads[..1.min(workloads.len())];
        let reps = a.spec_reps.max(1);
        let pb = bar(
            reps * (workloads.len() * (1 + configs.iter().filter(|c| c.3.is_none()).count())
                + synth_w.len() * configs.iter().filter(|c| c.3.is_some()).count()),
            "spec",
        );
        for w in &workloads {
            let mut refs = Vec::new();
            let is_synth_w = synth_w.iter().any(|x| x.id == w.id);
            let cells: Vec<_> = configs
                .iter()
                .filter(|c| c.3.is_none() || is_synth_w)
                .collect();
            // Round-robin: plain and every configuration once per round; each cell keeps its
            // fastest round (tok/s) and its speedup is the median over rounds of its tok/s over
            // the same round's plain tok/s. On a shared host load comes in bursts; running one
            // cell's repetitions back to back let a burst land on a single cell, and comparing
            // best with best let one lucky plain round decide every cell's speedup.
            let mut plain: Option<RunResult> = None;
            let mut best: Vec<Option<RunResult>> = cells.iter().map(|_| None).collect();
            let mut ratios: Vec<Vec<f64>> = cells.iter().map(|_| Vec::new()).collect();
            let plain_params = SpecParams::default();
            for rep in 0..reps {
                // Plain first in even rounds, last in odd ones (the first round always starts
                // with plain: the synthetic drafter needs its reference), so that neither a
                // drift within a round nor the position in it favours one side.
                let plain_first = rep % 2 == 0 || refs.is_empty();
                let mut round = Vec::with_capacity(cells.len());
                let mut round_plain = 0.0;
                let n = cells.len() + 1;
                for i in 0..n {
                    let is_plain = if plain_first { i == 0 } else { i == n - 1 };
                    if is_plain {
                        let r = run_workload(
                            &model,
                            w,
                            &a,
                            &plain_params,
                            RollbackKind::Replay,
                            None,
                            &mut refs,
                        )?;
                        round_plain = r.tok_s();
                        keep_fastest(&mut plain, r);
                    } else {
                        let (_, p, rb, _) = cells[if plain_first { i - 1 } else { i }];
                        round.push(run_workload(
                            &model,
                            w,
                            &a,
                            p,
                            *rb,
                            draft.clone(),
                            &mut refs,
                        )?);
                    }
                    pb.inc(1);
                }
                for ((r, slot), ratio) in round.into_iter().zip(&mut best).zip(&mut ratios) {
                    ratio.push(r.tok_s() / round_plain.max(1e-9));
                    keep_fastest(slot, r);
                }
            }
            let Some(plain) = plain else { continue };
            let plain_tok_s = plain.tok_s();
            let plain_row = row(
                &w.id,
                "plain",
                RollbackKind::Replay,
                0,
                None,
                &plain,
                plain_tok_s,
            );
            if modes.contains(&"spec") {
                rep.spec.push(plain_row.clone());
            }
            if modes.contains(&"synth") && is_synth_w {
                rep.synth.push(plain_row);
            }
            for (((name, p, rb, rate), r), ratio) in cells.iter().zip(best).zip(ratios) {
                let Some(r) = r else { continue };
                let mut rr = row(&w.id, name, *rb, p.n_max, *rate, &r, plain_tok_s);
                if !ratio.is_empty() {
                    rr.speedup = median(ratio);
                }
                if rate.is_some() {
                    rep.synth.push(rr);
                } else {
                    rep.spec.push(rr);
                }
            }
        }
        pb.finish_and_clear();
    }
    if emit_json(a.json.as_deref(), &rep)? {
        return Ok(());
    }
    println!(
        "model: {}  threads: {}  kernels: {}  verify: {}",
        rep.model, rep.threads, rep.kernels, rep.verify
    );
    if let Some(s) = &rep.speed {
        println!("\n| test | tok/s |\n|---|---|");
        println!("| pp{} | {:.1} |", s.pp_tokens, s.pp_tok_s);
        println!("| tg{} | {:.1} |", s.tg_tokens, s.tg_tok_s);
        println!(
            "\nverification batch cost (ms) by width, {} tokens in memory:",
            s.width_depth
        );
        let base = s.verify_ms_by_width.first().map_or(1.0, |x| x.1);
        for (w, ms) in &s.verify_ms_by_width {
            println!("  {w:>2} rows: {ms:8.2} ms  ({:.2}x one row)", ms / base);
        }
    }
    for (title, rows) in [
        ("speculative decoding over workloads", &rep.spec),
        ("synthetic acceptance sweep", &rep.synth),
    ] {
        if rows.is_empty() {
            continue;
        }
        println!("\n{title}:\n| workload | drafter | rollback | rate | tok/s | speedup | acc. len | acc. rate | accepted per position |");
        println!("|---|---|---|---|---|---|---|---|---|");
        for r in rows.iter() {
            let app: Vec<String> = r
                .accepted_per_position
                .iter()
                .take(8)
                .map(|x| format!("{x:.2}"))
                .collect();
            println!(
                "| {} | {} | {} | {} | {:.1} | {:.2}x | {:.2} | {:.2} | {} |",
                r.workload,
                r.drafter,
                if r.drafter == "plain" {
                    "-"
                } else {
                    &r.rollback
                },
                r.rate.map_or("-".into(), |x| format!("{x}")),
                r.tok_s,
                r.speedup,
                r.acceptance_length,
                r.acceptance_rate,
                app.join(" ")
            );
        }
    }
    // What the controller priced the widths at by the end of each synthetic run: at high rates
    // it drafts and measures the widths it verifies; at rate 0 it soon stops drafting, and the
    // widths keep their prior prices.
    let priced: Vec<&SpecRow> = rep
        .synth
        .iter()
        .filter(|r| !r.controller_widths.is_empty())
        .collect();
    if !priced.is_empty() {
        println!("\ncontroller width prices (steps of a one-row decode; * measured):");
        for r in priced {
            let ws: Vec<String> = r
                .controller_widths
                .iter()
                .map(|(w, u, m)| format!("{w}:{u:.2}{}", if *m { "*" } else { "" }))
                .collect();
            let rate = r.rate.map_or("-".into(), |x| format!("{x}"));
            println!(
                "  {} {} rate {rate}: {}",
                r.drafter,
                r.rollback,
                ws.join(" ")
            );
        }
    }
    Ok(())
}
