//! `specd bench --server URL --soak SECS`: a soak test. `--concurrency` clients send requests
//! back to back for SECS seconds (at most `--soak-requests` in all), cycling over the cases of
//! `--soak-mix`: the workloads (each single-turn prompt, and the multi-turn conversation played
//! turn by turn) and/or the maximum-size body (`--max-body-bytes` of JSON to
//! `/v1/chat/completions`, `/completion` and `/tokenize` in turn). Meanwhile the server's
//! resident memory is sampled from `/proc/PID/status` every `--rss-every` seconds and
//! `/health` is timed once a second. Prints errors by kind, latency percentiles per case and
//! the memory over time.
//!
//! Loopback only: a soak test is meant to push a server hard, and its memory can only be read
//! on this machine anyway.

use super::client::{snippet, Endpoint, RequestOptions};
use super::procfs::{pid_listening_on, rss, Rss};
use super::report::{opt, percentile};
use super::{chat_with_timeout, load_multi_turn, load_single_turn};
use crate::bench::BenchArgs;
use anyhow::{bail, Context, Result};
use hyper::body::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default `--max-body-bytes`: just under `specd serve`'s default 16 MiB body limit, so the
/// body is read and has to be handled rather than refused by its announced length.
pub const DEFAULT_MAX_BODY_BYTES: usize = (16 << 20) - (64 << 10);

/// How often `/health` is timed during the run.
const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// What the clients send, in turn.
enum Case {
    /// One single-turn prompt of the workloads (its index).
    Single(usize),
    /// The multi-turn conversation, every turn with its whole history.
    Conversation,
    /// A maximum-size body to one endpoint.
    MaxBody(&'static str),
}

impl Case {
    fn label(&self) -> String {
        match self {
            Case::Single(_) => "single-turn".into(),
            Case::Conversation => "multi-turn".into(),
            Case::MaxBody(path) => format!("max-body {path}"),
        }
    }
}

/// One request's result.
struct Record {
    case: String,
    latency_s: f64,
    /// Completion tokens (answered chat requests).
    tokens: u64,
    /// The assistant's text (answered chat requests): the conversation's next history.
    reply: Option<String>,
    result: Answer,
}

enum Answer {
    Ok,
    /// A 4xx to a maximum-size body: the server refused it cleanly, which is an answer.
    Refused(u16),
    Failed(String),
}

/// Everything the soak test measured (`--json`).
#[derive(Serialize)]
struct SoakReport {
    server: String,
    /// The process whose memory was sampled, and how it was found.
    server_pid: u32,
    pid_from: &'static str,
    concurrency: usize,
    soak_s: u64,
    wall_s: f64,
    n_predict: usize,
    max_body_bytes: Option<usize>,
    requests: usize,
    failed: usize,
    completion_tokens: u64,
    throughput_tok_s: f64,
    cases: Vec<CaseReport>,
    /// Failure messages (up to 200 characters) with their counts.
    errors: BTreeMap<String, usize>,
    health: HealthReport,
    rss: Vec<RssSample>,
    rss_start_mib: f64,
    rss_end_mib: f64,
    rss_peak_mib: f64,
}

#[derive(Serialize)]
struct CaseReport {
    case: String,
    requests: usize,
    ok: usize,
    /// Status code → count of 4xx answers to maximum-size bodies.
    refused: BTreeMap<u16, usize>,
    failed: usize,
    p50_latency_s: Option<f64>,
    p90_latency_s: Option<f64>,
    p99_latency_s: Option<f64>,
    max_latency_s: Option<f64>,
}

#[derive(Serialize, Default)]
struct HealthReport {
    probes: usize,
    /// Probes with no 200 answer within the request timeout.
    failed: usize,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
}

#[derive(Serialize, Clone, Copy)]
struct RssSample {
    t_s: f64,
    requests_done: usize,
    rss_mib: f64,
    peak_mib: f64,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs the soak test described by `a` (`--soak` set).
pub(super) fn run(url: &str, a: &BenchArgs, secs: u64) -> Result<()> {
    if a.concurrency == 0 || secs == 0 || a.soak_requests == 0 {
        bail!("--soak, --soak-requests and --concurrency must be at least 1");
    }
    let ep = Endpoint::parse(url, a.api_key.clone())?;
    check_loopback(ep.addr())?;
    let mut workloads = false;
    let mut max_body = false;
    for m in a
        .soak_mix
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
    {
        match m {
            "workloads" => workloads = true,
            "max-body" => max_body = true,
            other => bail!("--soak-mix: unknown case '{other}' (workloads, max-body)"),
        }
    }
    let mut cases = Vec::new();
    let (prompts, conversation) = if workloads {
        let p = load_single_turn(&a.workloads, a.max_prompts)?;
        let c = load_multi_turn(&a.workloads)?;
        cases.extend((0..p.len()).map(Case::Single));
        if c.is_some() {
            cases.push(Case::Conversation);
        }
        (p, c)
    } else {
        (Vec::new(), None)
    };
    let bodies = if max_body {
        cases.extend(
            ["/v1/chat/completions", "/completion", "/tokenize"]
                .into_iter()
                .map(Case::MaxBody),
        );
        Some(MaxBodies::new(a.max_body_bytes, a.n_gen)?)
    } else {
        None
    };
    if cases.is_empty() {
        bail!("--soak-mix names no case with anything to send");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let ctx = Ctx {
        ep,
        opts: RequestOptions {
            max_tokens: a.n_gen,
            temperature: a.sampling.temp,
            seed: a.sampling.seed,
            stream: a.stream,
            ignore_eos: a.ignore_eos,
            timeout: Duration::from_secs(a.timeout.max(1)),
        },
        prompts,
        turns: conversation.map(|c| c.turns).unwrap_or_default(),
        bodies,
        cases,
    };
    let report = rt.block_on(soak(
        Arc::new(ctx),
        a.server_pid,
        a.concurrency,
        secs,
        a.soak_requests,
        Duration::from_secs(a.rss_every.max(1)),
    ))?;
    let to_stdout = super::super::emit_json(a.json.as_deref(), &report)?;
    if !to_stdout {
        print_soak(&report);
    }
    if report.requests > 0 && report.failed == report.requests {
        bail!("all {} requests failed", report.requests);
    }
    Ok(())
}

/// The maximum-size bodies, built once (each exactly the asked size).
struct MaxBodies {
    bytes: usize,
    chat: Bytes,
    completion: Bytes,
    tokenize: Bytes,
}

impl MaxBodies {
    fn new(bytes: usize, n_predict: usize) -> Result<MaxBodies> {
        let chat = sized(
            bytes,
            |c| json!({"messages": [{"role": "user", "content": c}], "max_tokens": n_predict}),
        )?;
        let completion = sized(bytes, |c| json!({"prompt": c, "n_predict": n_predict}))?;
        let tokenize = sized(bytes, |c| json!({"content": c}))?;
        Ok(MaxBodies {
            bytes,
            chat,
            completion,
            tokenize,
        })
    }

    fn get(&self, path: &str) -> Bytes {
        match path {
            "/completion" => self.completion.clone(),
            "/tokenize" => self.tokenize.clone(),
            _ => self.chat.clone(),
        }
    }
}

/// The JSON of `shape(text)` at exactly `bytes` bytes: code-like text (no character JSON would
/// escape, so one text byte is one body byte) fills what the rest of the body leaves.
fn sized(bytes: usize, shape: impl Fn(&str) -> Value) -> Result<Bytes> {
    const LINE: &str = "total = total + values[i] * 2;  ";
    let frame = shape("").to_string().len();
    if bytes <= frame {
        bail!("--max-body-bytes {bytes}: a body needs more than {frame} bytes");
    }
    let fill = bytes - frame;
    let text: String = LINE.chars().cycle().take(fill).collect();
    let body = shape(&text).to_string();
    debug_assert_eq!(body.len(), bytes);
    Ok(Bytes::from(body))
}

struct Ctx {
    ep: Endpoint,
    opts: RequestOptions,
    prompts: Vec<super::Prompt>,
    turns: Vec<String>,
    bodies: Option<MaxBodies>,
    cases: Vec<Case>,
}

/// The loopback check: every address the host resolves to must be a loopback one.
fn check_loopback(addr: &str) -> Result<()> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .with_context(|| format!("resolving {addr}"))?
        .collect();
    if addrs.is_empty() || !addrs.iter().all(|a| a.ip().is_loopback()) {
        bail!("--soak runs against a server on this machine only (loopback), not {addr}");
    }
    Ok(())
}

async fn soak(
    ctx: Arc<Ctx>,
    server_pid: Option<u32>,
    concurrency: usize,
    secs: u64,
    max_requests: usize,
    rss_every: Duration,
) -> Result<SoakReport> {
    let (pid, pid_from) = match server_pid {
        Some(p) => (p, "--server-pid"),
        None => {
            let port = ctx
                .ep
                .addr()
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .context("the server address has no port")?;
            (pid_listening_on(port)?, "listening port")
        }
    };
    let first = rss(pid).with_context(|| format!("server process {pid}"))?;
    ctx.ep.probe().await?;

    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(secs);
    let sent = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let next_case = Arc::new(AtomicUsize::new(0));
    let records = Arc::new(Mutex::new(Vec::<Record>::new()));

    let samples = vec![RssSample {
        t_s: 0.0,
        requests_done: 0,
        rss_mib: mib(first.now_kib),
        peak_mib: mib(first.peak_kib),
    }];
    eprintln!(
        "soak: {concurrency} client(s) for {secs} s against {} (pid {pid}, RSS {:.1} MiB)",
        ctx.ep.url,
        mib(first.now_kib)
    );

    // The samplers write into shared lists, so stopping them (abort) loses nothing.
    let samples = Arc::new(Mutex::new(samples));
    let health_ms = Arc::new(Mutex::new(Vec::<f64>::new()));
    let health_failed = Arc::new(AtomicUsize::new(0));
    let monitor = {
        let (done, samples) = (done.clone(), samples.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(rss_every);
            tick.tick().await; // the first tick is now: that sample is taken above
            loop {
                tick.tick().await;
                let Ok(Rss { now_kib, peak_kib }) = rss(pid) else {
                    eprintln!("soak: the server process {pid} is gone");
                    break;
                };
                let s = RssSample {
                    t_s: t0.elapsed().as_secs_f64(),
                    requests_done: done.load(Ordering::Relaxed),
                    rss_mib: mib(now_kib),
                    peak_mib: mib(peak_kib),
                };
                eprintln!(
                    "soak: {:>6.0} s  {:>7} requests  RSS {:>8.1} MiB  peak {:>8.1} MiB",
                    s.t_s, s.requests_done, s.rss_mib, s.peak_mib
                );
                if let Ok(mut v) = samples.lock() {
                    v.push(s);
                }
            }
        })
    };
    let health = {
        let (ctx, health_ms, health_failed) =
            (ctx.clone(), health_ms.clone(), health_failed.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HEALTH_EVERY);
            loop {
                tick.tick().await;
                match tokio::time::timeout(ctx.opts.timeout, ctx.ep.get_timed("/health")).await {
                    Ok(Ok((s, d))) if s.is_success() => {
                        if let Ok(mut v) = health_ms.lock() {
                            v.push(d.as_secs_f64() * 1e3);
                        }
                    }
                    _ => {
                        health_failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };

    let mut clients = Vec::new();
    for _ in 0..concurrency {
        let (ctx, sent, done, next_case, records) = (
            ctx.clone(),
            sent.clone(),
            done.clone(),
            next_case.clone(),
            records.clone(),
        );
        clients.push(tokio::spawn(async move {
            // A request is sent only while time and the request budget last.
            let may_send =
                || Instant::now() < deadline && sent.fetch_add(1, Ordering::Relaxed) < max_requests;
            while may_send() {
                let i = next_case.fetch_add(1, Ordering::Relaxed) % ctx.cases.len();
                let case = &ctx.cases[i];
                let record = |r: Record| {
                    done.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut v) = records.lock() {
                        v.push(r);
                    }
                };
                match case {
                    Case::Single(p) => {
                        record(chat_record(&ctx, case.label(), &ctx.prompts[*p].messages).await)
                    }
                    Case::Conversation => {
                        let mut history: Vec<Value> = Vec::new();
                        for (t, turn) in ctx.turns.iter().enumerate() {
                            // The first turn was counted by the loop's check.
                            if t > 0 && !may_send() {
                                break;
                            }
                            history.push(json!({"role": "user", "content": turn}));
                            let mut r = chat_record(&ctx, case.label(), &history).await;
                            let failed = matches!(r.result, Answer::Failed(_));
                            if let Some(reply) = r.reply.take() {
                                history.push(json!({"role": "assistant", "content": reply}));
                            }
                            record(r);
                            if failed {
                                break;
                            }
                        }
                    }
                    Case::MaxBody(path) => record(max_body_record(&ctx, path).await),
                }
            }
        }));
    }
    for c in clients {
        c.await.context("a soak client failed")?;
    }
    let wall_s = t0.elapsed().as_secs_f64();
    health.abort();
    monitor.abort();
    let poisoned = || anyhow::anyhow!("a sampler panicked");
    let health_ms = std::mem::take(&mut *health_ms.lock().map_err(|_| poisoned())?);
    let health_failed = health_failed.load(Ordering::Relaxed);
    let mut samples = std::mem::take(&mut *samples.lock().map_err(|_| poisoned())?);
    if let Ok(last) = rss(pid) {
        samples.push(RssSample {
            t_s: wall_s,
            requests_done: done.load(Ordering::Relaxed),
            rss_mib: mib(last.now_kib),
            peak_mib: mib(last.peak_kib),
        });
    }
    let records = std::mem::take(&mut *records.lock().map_err(|_| poisoned())?);
    Ok(summarise(
        &ctx,
        records,
        samples,
        (health_ms, health_failed),
        (pid, pid_from),
        concurrency,
        secs,
        wall_s,
    ))
}

async fn chat_record(ctx: &Ctx, case: String, messages: &[Value]) -> Record {
    let t0 = Instant::now();
    match chat_with_timeout(&ctx.ep, messages, &ctx.opts).await {
        Ok(s) => Record {
            case,
            latency_s: s.latency_s,
            tokens: s.completion_tokens(),
            reply: Some(s.content),
            result: Answer::Ok,
        },
        Err(e) => Record {
            case,
            latency_s: t0.elapsed().as_secs_f64(),
            tokens: 0,
            reply: None,
            result: Answer::Failed(e),
        },
    }
}

async fn max_body_record(ctx: &Ctx, path: &'static str) -> Record {
    let case = Case::MaxBody(path).label();
    let Some(bodies) = &ctx.bodies else {
        return Record {
            case,
            latency_s: 0.0,
            tokens: 0,
            reply: None,
            result: Answer::Failed("no maximum-size body built".into()),
        };
    };
    let t0 = Instant::now();
    let r = tokio::time::timeout(ctx.opts.timeout, ctx.ep.post_raw(path, bodies.get(path))).await;
    let latency_s = t0.elapsed().as_secs_f64();
    let result = match r {
        Err(_) => Answer::Failed(format!("no answer within {} s", ctx.opts.timeout.as_secs())),
        Ok(Err(e)) => Answer::Failed(format!("{e:#}")),
        Ok(Ok((s, _))) if s.is_success() => Answer::Ok,
        // A 4xx is a clean refusal only with the JSON error body every error must carry.
        Ok(Ok((s, body))) if s.is_client_error() => match serde_json::from_slice::<Value>(&body) {
            Ok(v) if v.get("error").is_some() => Answer::Refused(s.as_u16()),
            _ => Answer::Failed(format!(
                "HTTP {s} without a JSON error body: {}",
                snippet(&body)
            )),
        },
        Ok(Ok((s, body))) => Answer::Failed(format!("HTTP {s}: {}", snippet(&body))),
    };
    Record {
        case,
        latency_s,
        tokens: 0,
        reply: None,
        result,
    }
}

#[allow(clippy::too_many_arguments)]
fn summarise(
    ctx: &Ctx,
    records: Vec<Record>,
    rss: Vec<RssSample>,
    (mut health_ms, health_failed): (Vec<f64>, usize),
    (server_pid, pid_from): (u32, &'static str),
    concurrency: usize,
    soak_s: u64,
    wall_s: f64,
) -> SoakReport {
    let mut labels: Vec<String> = ctx.cases.iter().map(Case::label).collect();
    labels.dedup();
    let cases = labels
        .iter()
        .map(|label| {
            let rs: Vec<&Record> = records.iter().filter(|r| &r.case == label).collect();
            let mut lat: Vec<f64> = rs
                .iter()
                .filter(|r| !matches!(r.result, Answer::Failed(_)))
                .map(|r| r.latency_s)
                .collect();
            lat.sort_by(f64::total_cmp);
            let mut refused = BTreeMap::new();
            for r in &rs {
                if let Answer::Refused(s) = r.result {
                    *refused.entry(s).or_insert(0) += 1;
                }
            }
            CaseReport {
                case: label.clone(),
                requests: rs.len(),
                ok: rs.iter().filter(|r| matches!(r.result, Answer::Ok)).count(),
                failed: rs
                    .iter()
                    .filter(|r| matches!(r.result, Answer::Failed(_)))
                    .count(),
                refused,
                p50_latency_s: percentile(&lat, 0.5),
                p90_latency_s: percentile(&lat, 0.9),
                p99_latency_s: percentile(&lat, 0.99),
                max_latency_s: lat.last().copied(),
            }
        })
        .collect();
    let mut errors = BTreeMap::new();
    for r in &records {
        if let Answer::Failed(e) = &r.result {
            let e: String = e.chars().take(200).collect();
            *errors.entry(e).or_insert(0) += 1;
        }
    }
    health_ms.sort_by(f64::total_cmp);
    let completion_tokens = records.iter().map(|r| r.tokens).sum();
    let peak = rss.iter().map(|s| s.peak_mib).fold(0.0, f64::max);
    SoakReport {
        server: ctx.ep.url.clone(),
        server_pid,
        pid_from,
        concurrency,
        soak_s,
        wall_s,
        n_predict: ctx.opts.max_tokens,
        max_body_bytes: ctx.bodies.as_ref().map(|b| b.bytes),
        requests: records.len(),
        failed: errors.values().sum(),
        completion_tokens,
        throughput_tok_s: if wall_s > 0.0 {
            completion_tokens as f64 / wall_s
        } else {
            0.0
        },
        cases,
        errors,
        health: HealthReport {
            probes: health_ms.len() + health_failed,
            failed: health_failed,
            p50_ms: percentile(&health_ms, 0.5),
            p99_ms: percentile(&health_ms, 0.99),
            max_ms: health_ms.last().copied(),
        },
        rss_start_mib: rss.first().map_or(0.0, |s| s.rss_mib),
        rss_end_mib: rss.last().map_or(0.0, |s| s.rss_mib),
        rss_peak_mib: peak,
        rss,
    }
}

fn print_soak(r: &SoakReport) {
    println!(
        "soak: server {} (pid {} from {}), {} client(s), {} s asked, {:.1} s run, n-predict {}{}",
        r.server,
        r.server_pid,
        r.pid_from,
        r.concurrency,
        r.soak_s,
        r.wall_s,
        r.n_predict,
        r.max_body_bytes
            .map_or(String::new(), |b| format!(", max body {b} bytes")),
    );
    println!(
        "{} requests, {} failed, {} completion tokens ({:.1} tok/s over all clients)",
        r.requests, r.failed, r.completion_tokens, r.throughput_tok_s
    );
    println!("\n| case | requests | ok | refused (4xx) | failed | p50 s | p90 s | p99 s | max s |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for c in &r.cases {
        let refused = if c.refused.is_empty() {
            "0".to_string()
        } else {
            c.refused
                .iter()
                .map(|(s, n)| format!("{n}× {s}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "| {} | {} | {} | {refused} | {} | {} | {} | {} | {} |",
            c.case,
            c.requests,
            c.ok,
            c.failed,
            opt(c.p50_latency_s, 3),
            opt(c.p90_latency_s, 3),
            opt(c.p99_latency_s, 3),
            opt(c.max_latency_s, 3),
        );
    }
    let h = &r.health;
    println!(
        "\n/health during the run: {} probes, {} failed, p50 {} ms, p99 {} ms, max {} ms",
        h.probes,
        h.failed,
        opt(h.p50_ms, 1),
        opt(h.p99_ms, 1),
        opt(h.max_ms, 1)
    );
    println!(
        "\nserver RSS: start {:.1} MiB, end {:.1} MiB, peak (VmHWM) {:.1} MiB",
        r.rss_start_mib, r.rss_end_mib, r.rss_peak_mib
    );
    println!("| t s | requests done | RSS MiB | peak MiB |");
    println!("|---|---|---|---|");
    for s in &r.rss {
        println!(
            "| {:.0} | {} | {:.1} | {:.1} |",
            s.t_s, s.requests_done, s.rss_mib, s.peak_mib
        );
    }
    if !r.errors.is_empty() {
        println!("\nerrors:");
        for (e, n) in &r.errors {
            println!("  {n}× {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_bodies_have_the_exact_size() {
        let b = MaxBodies::new(10_000, 16).unwrap();
        for path in ["/v1/chat/completions", "/completion", "/tokenize"] {
            let body = b.get(path);
            assert_eq!(body.len(), 10_000, "{path}");
            assert!(serde_json::from_slice::<Value>(&body).is_ok());
        }
        assert!(MaxBodies::new(10, 16).is_err());
    }
}
