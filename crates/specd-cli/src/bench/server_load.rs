//! `specd bench --server URL`: a load test of a running OpenAI / llama.cpp-compatible server
//! (`specd serve` or llama.cpp's `llama-server`).
//!
//! Every request is a plain `POST /v1/chat/completions` (messages, `max_tokens`, `temperature`,
//! `seed`, `stream`), so both servers get byte-identical requests. Figures come from the
//! client's clock (latency, time to first token, wall time) and from the response's `usage`
//! and llama.cpp `timings` objects when present (`prompt_n`, `predicted_ms`, `draft_n`, …).
//!
//! Two phases: the single-turn prompts spread over `--concurrency` clients, then the
//! multi-turn conversation played turn by turn (each request carries the whole history,
//! assistant replies included), `--concurrency` copies at once. A failed request is counted
//! and reported; only an unreachable server, bad flags or bad workload files stop the run.

mod client;
mod procfs;
mod report;
mod soak;

pub use soak::DEFAULT_MAX_BODY_BYTES;

use super::BenchArgs;
use anyhow::{bail, Context, Result};
use client::{short_f64, Endpoint, Outcome, RequestOptions};
use report::{print_report, LoadReport, MultiTurnReport, PhaseReport, TurnReport};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs the load test described by the `--server` flags of `a`.
pub fn run(url: &str, a: &BenchArgs) -> Result<()> {
    if let Some(secs) = a.soak {
        return soak::run(url, a, secs);
    }
    if a.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let endpoint = Endpoint::parse(url, a.api_key.clone())?;
    let prompts = load_single_turn(&a.workloads, a.max_prompts)?;
    let conversation = load_multi_turn(&a.workloads)?;
    if prompts.is_empty() && conversation.is_none() {
        bail!("no prompts to send (--max-prompts 0 and no multi-turn workload)");
    }
    let opts = RequestOptions {
        max_tokens: a.n_gen,
        temperature: a.sampling.temp,
        // `bench::run` has replaced "random" by a fixed seed, so the requests (and so the
        // outputs) stay the same from run to run and from server to server.
        seed: a.sampling.seed,
        stream: a.stream,
        ignore_eos: a.ignore_eos,
        timeout: Duration::from_secs(a.timeout.max(1)),
    };
    // One thread is plenty for a few dozen sockets, and leaves the cores to the server when it
    // runs on the same machine.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = rt.block_on(load_test(
        endpoint,
        opts,
        a.concurrency,
        prompts,
        conversation,
    ))?;
    let to_stdout = super::emit_json(a.json.as_deref(), &report)?;
    if !to_stdout {
        print_report(&report);
    }
    if !report.errors.is_empty() {
        eprintln!("{} request(s) failed:", report.errors.len());
        for e in report.errors.iter().take(5) {
            eprintln!("  {e}");
        }
    }
    let sent = report.single_turn.as_ref().map_or(0, |p| p.requests)
        + report.multi_turn.as_ref().map_or(0, |m| m.summary.requests);
    if sent > 0 && report.errors.len() == sent {
        bail!(
            "all {sent} requests failed; first error: {}",
            report.errors[0]
        );
    }
    Ok(())
}

/// One single-turn prompt: the `messages` array is sent as given.
struct Prompt {
    messages: Vec<Value>,
}

/// The multi-turn workload: user turns of one conversation.
struct Conversation {
    id: String,
    turns: Vec<String>,
}

fn load_single_turn(dir: &Path, max: usize) -> Result<Vec<Prompt>> {
    let path = dir.join("single-turn.jsonl");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if out.len() >= max {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let where_ = || format!("{}:{}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).with_context(where_)?;
        let messages = match v.get("messages").and_then(Value::as_array) {
            Some(m) if !m.is_empty() => m.clone(),
            _ => bail!("{}: no `messages` array", where_()),
        };
        out.push(Prompt { messages });
    }
    Ok(out)
}

/// The conversation in `multi-turn-sorting.json`, if the file exists.
fn load_multi_turn(dir: &Path) -> Result<Option<Conversation>> {
    let path = dir.join("multi-turn-sorting.json");
    if !path.exists() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let turns = v
        .get("turns")
        .and_then(Value::as_array)
        .and_then(|t| {
            t.iter()
                .map(|x| x.as_str().map(String::from))
                .collect::<Option<Vec<_>>>()
        })
        .with_context(|| format!("{}: `turns` must be an array of strings", path.display()))?;
    Ok((!turns.is_empty()).then(|| Conversation {
        id: v["id"].as_str().unwrap_or("multi_turn").to_string(),
        turns,
    }))
}

async fn chat_with_timeout(ep: &Endpoint, messages: &[Value], o: &RequestOptions) -> Outcome {
    match tokio::time::timeout(o.timeout, ep.chat(messages, o)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err(format!("no answer within {} s", o.timeout.as_secs())),
    }
}

async fn load_test(
    ep: Endpoint,
    opts: RequestOptions,
    concurrency: usize,
    prompts: Vec<Prompt>,
    conversation: Option<Conversation>,
) -> Result<LoadReport> {
    let model = ep.probe().await?;
    let ep = Arc::new(ep);
    let opts = Arc::new(opts);
    let mut errors = Vec::new();

    let single_turn = if prompts.is_empty() {
        None
    } else {
        let (outcomes, wall_s) = single_turn_phase(&ep, &opts, concurrency, prompts).await?;
        errors.extend(outcomes.iter().filter_map(|o| o.as_ref().err().cloned()));
        Some(PhaseReport::of(outcomes.iter(), wall_s))
    };

    let multi_turn = match conversation {
        None => None,
        Some(conv) => {
            let n_turns = conv.turns.len();
            let (copies, wall_s) = multi_turn_phase(&ep, &opts, concurrency, &conv).await?;
            for o in copies.iter().flatten() {
                if let Err(e) = o {
                    errors.push(e.clone());
                }
            }
            let turns = (0..n_turns)
                .map(|t| TurnReport::of(t + 1, copies.iter().filter_map(|c| c.get(t))))
                .collect();
            Some(MultiTurnReport {
                id: conv.id,
                conversations: copies.len(),
                turns_per_conversation: n_turns,
                completed_conversations: copies
                    .iter()
                    .filter(|c| c.len() == n_turns && c.iter().all(|o| o.is_ok()))
                    .count(),
                summary: PhaseReport::of(copies.iter().flatten(), wall_s),
                turns,
            })
        }
    };

    Ok(LoadReport {
        server: ep.url.clone(),
        model,
        concurrency,
        n_predict: opts.max_tokens,
        temperature: short_f64(opts.temperature),
        seed: opts.seed,
        stream: opts.stream,
        ignore_eos: opts.ignore_eos,
        single_turn,
        multi_turn,
        errors,
    })
}

/// All prompts over `concurrency` clients, each taking the next unsent prompt when its
/// previous request is answered. Returns the outcomes in prompt order and the wall time.
async fn single_turn_phase(
    ep: &Arc<Endpoint>,
    opts: &Arc<RequestOptions>,
    concurrency: usize,
    prompts: Vec<Prompt>,
) -> Result<(Vec<Outcome>, f64)> {
    let n = prompts.len();
    let prompts = Arc::new(prompts);
    let next = Arc::new(AtomicUsize::new(0));
    let pb = super::bar(n, "single-turn");
    let t0 = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..concurrency.min(n) {
        let (ep, opts, prompts, next, pb) = (
            ep.clone(),
            opts.clone(),
            prompts.clone(),
            next.clone(),
            pb.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = prompts.get(i) else { break };
                done.push((i, chat_with_timeout(&ep, &p.messages, &opts).await));
                pb.inc(1);
            }
            done
        }));
    }
    let mut all = Vec::with_capacity(n);
    for c in clients {
        all.extend(c.await.context("a client task failed")?);
    }
    let wall_s = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    all.sort_by_key(|(i, _)| *i);
    Ok((all.into_iter().map(|(_, o)| o).collect(), wall_s))
}

/// `concurrency` copies of the conversation at once, each turn sent with the whole history.
/// Each copy opens with a system line naming it, so copies are distinct conversations (as
/// distinct users' are): none can reuse another's cached history. A copy stops at its first failed turn (the history would be wrong after it). Returns each
/// copy's outcomes by turn and the wall time.
async fn multi_turn_phase(
    ep: &Arc<Endpoint>,
    opts: &Arc<RequestOptions>,
    concurrency: usize,
    conv: &Conversation,
) -> Result<(Vec<Vec<Outcome>>, f64)> {
    let turns = Arc::new(conv.turns.clone());
    let pb = super::bar(concurrency * turns.len(), "multi-turn");
    let t0 = Instant::now();
    let mut copies = Vec::new();
    for k in 0..concurrency {
        let (ep, opts, turns, pb) = (ep.clone(), opts.clone(), turns.clone(), pb.clone());
        copies.push(tokio::spawn(async move {
            let mut history: Vec<Value> =
                vec![json!({"role": "system", "content": format!("Session {}.", k + 1)})];
            let mut outcomes = Vec::new();
            for turn in turns.iter() {
                history.push(json!({"role": "user", "content": turn}));
                let o = chat_with_timeout(&ep, &history, &opts).await;
                pb.inc(1);
                let failed = match &o {
                    Ok(s) => {
                        history.push(json!({"role": "assistant", "content": s.content}));
                        false
                    }
                    Err(_) => true,
                };
                outcomes.push(o);
                if failed {
                    break;
                }
            }
            outcomes
        }));
    }
    let mut out = Vec::with_capacity(concurrency);
    for c in copies {
        out.push(c.await.context("a conversation task failed")?);
    }
    let wall_s = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok((out, wall_s))
}
