//! `GET /metrics`: Prometheus text format. llama-server's `llamacpp:*` metrics (same names, help
//! lines, types and meanings), the speculative decoding counters also under vLLM's names
//! (`spec_decode_*`), and specd's own (`specd:*`: rollbacks, prompt reuse, memory held by KV,
//! recurrent state, rollback records and checkpoints).
//!
//! Also [`Timings`]: a request's `timings` object, counted the way llama-server counts them, so
//! that the counters here add up to what the responses reported.

use crate::error::{ApiError, ErrorKind};
use crate::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use specd_spec::{LiveTimings, PromptProgress, SeqOutput};
use std::fmt::Write;
use std::sync::{Arc, Mutex};

/// A finished request's timings as llama-server counts them. The prompt's time runs until the
/// first generated token: that token comes from the logits of the prompt's last row, so it
/// costs no decode step of its own. Generation time runs from the first token to the last and
/// its rates are over the steps after the first token (`predicted_n - 1`). Times are whole
/// microseconds, like llama-server's.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Timings {
    /// Prompt tokens reused from the slot's memory, and processed.
    pub cache_n: usize,
    pub prompt_n: usize,
    pub prompt_us: u64,
    pub predicted_n: usize,
    /// 0 when nothing was generated, else at least 1 (the first token can arrive within the
    /// same microsecond as the prompt's end).
    pub predicted_us: u64,
    pub draft_n: u64,
    pub draft_n_accepted: u64,
}

fn micros(secs: f64) -> u64 {
    (secs.max(0.0) * 1e6).round() as u64
}

impl Timings {
    /// The timings of a whole generation. A sampled end-of-generation token counts as
    /// predicted, as in llama-server.
    pub fn of(out: &SeqOutput) -> Self {
        Self::live(&out.timings())
    }

    /// The timings so far (`timings_per_token`), or of a whole generation.
    pub fn live(t: &LiveTimings) -> Self {
        let predicted_n = t.n_decoded;
        Timings {
            cache_n: t.n_cached,
            prompt_n: t.n_prompt.saturating_sub(t.n_cached),
            prompt_us: micros(t.prompt_secs + t.first_token_secs),
            predicted_n,
            predicted_us: if predicted_n == 0 {
                0
            } else {
                micros(t.decode_secs).max(1)
            },
            draft_n: t.stats.draft_tokens,
            draft_n_accepted: t.stats.accepted_tokens,
        }
    }

    /// The timings of a prompt-progress report: the prompt so far, nothing predicted.
    pub fn progress(p: &PromptProgress) -> Self {
        Timings {
            cache_n: p.cache,
            prompt_n: p.processed.saturating_sub(p.cache),
            prompt_us: micros(p.secs),
            ..Default::default()
        }
    }

    /// Decode steps of the generation: the first token is free.
    pub fn steps(&self) -> usize {
        self.predicted_n.saturating_sub(1)
    }

    /// The `timings` object. Every value is a finite number; the draft counts appear once a
    /// draft was verified (as in llama-server).
    pub fn json(&self) -> Value {
        let prompt_ms = self.prompt_us as f64 / 1e3;
        let predicted_ms = self.predicted_us as f64 / 1e3;
        let (pn, steps) = (self.prompt_n as f64, self.steps() as f64);
        let per_token = |ms: f64, n: f64| if n > 0.0 { ms / n } else { 0.0 };
        let per_second = |ms: f64, n: f64| if ms > 0.0 { 1e3 / ms * n } else { 0.0 };
        let mut v = json!({
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": per_token(prompt_ms, pn),
            "prompt_per_second": per_second(prompt_ms, pn),
            "predicted_n": self.predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": per_token(predicted_ms, steps),
            "predicted_per_second": per_second(predicted_ms, steps),
        });
        if self.draft_n > 0 {
            v["draft_n"] = json!(self.draft_n);
            v["draft_n_accepted"] = json!(self.draft_n_accepted);
        }
        v
    }
}

/// The throughput gauges are averages over the time between two scrapes (llama-server's
/// buckets): what the counters held at the last scrape.
#[derive(Debug, Default)]
pub struct Scrapes(Mutex<Window>);

#[derive(Debug, Default, Clone, Copy)]
struct Window {
    prompt_tokens: u64,
    prompt_us: u64,
    predicted_steps: u64,
    predicted_us: u64,
}

struct Out(String);

impl Out {
    fn metric(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        let _ = writeln!(
            self.0,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    fn labelled(&mut self, name: &str, kind: &str, help: &str, label: &str, values: &[u64]) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (i, v) in values.iter().enumerate() {
            let _ = writeln!(self.0, "{name}{{{label}=\"{i}\"}} {v}");
        }
    }
}

/// Tokens per second over `us` microseconds (0 for an empty window).
fn rate(n: u64, us: u64) -> f64 {
    if us > 0 {
        n as f64 / us as f64 * 1e6
    } else {
        0.0
    }
}

/// `GET /metrics` (501 unless started with `--metrics`, like llama-server). The response carries
/// `Process-Start-Time-Unix`: when the server started, in Unix seconds.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    if !st.cfg.metrics {
        return ApiError::new(
            ErrorKind::NotSupported,
            "This server does not support metrics endpoint. Start it with `--metrics`",
        )
        .into_response();
    }
    let snap = st.sched.snapshot();
    let t = &snap.totals;
    let processing = snap.slots.iter().filter(|s| s.processing).count();
    let now = Window {
        prompt_tokens: t.prompt_tokens,
        prompt_us: t.prompt_us,
        predicted_steps: t.predicted_steps,
        predicted_us: t.predicted_us,
    };
    let last = match st.scrapes.0.lock() {
        Ok(mut w) => std::mem::replace(&mut *w, now),
        Err(p) => std::mem::replace(&mut *p.into_inner(), now),
    };
    let mut o = Out(String::new());
    let c = "counter";
    let g = "gauge";
    // llama-server's metrics, in its order, with its help lines.
    let s = &t.spec;
    let metrics = [
        (
            "prompt_tokens_total",
            c,
            "Number of prompt tokens processed, excluding cached tokens",
            t.prompt_tokens as f64,
        ),
        (
            "prompt_tokens_cached_total",
            c,
            "Number of prompt tokens reused from the cache",
            t.cached_prompt_tokens as f64,
        ),
        (
            "prompt_seconds_total",
            c,
            "Total time spent processing prompts",
            t.prompt_us as f64 / 1e6,
        ),
        (
            "tokens_predicted_total",
            c,
            "Number of generation tokens processed",
            t.predicted_tokens as f64,
        ),
        (
            "tokens_predicted_seconds_total",
            c,
            "Total time spent generating tokens",
            t.predicted_us as f64 / 1e6,
        ),
        (
            "n_decode_total",
            c,
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            t.steps as f64,
        ),
        (
            "n_tokens_max",
            // llama-server declares it a counter. OpenMetrics wants a counter's name to end in
            // `_total`, and SGLang's model gateway drops a whole page that breaks that rule:
            // `--metrics-strict` declares this maximum a gauge instead.
            if st.cfg.metrics_strict { g } else { c },
            "Largest observed sequence length (prompt + generation)",
            t.n_tokens_max as f64,
        ),
        (
            "spec_decode_num_draft_tokens_total",
            c,
            "Speculative: Total draft tokens generated",
            s.draft_tokens as f64,
        ),
        (
            "spec_decode_num_accepted_tokens_total",
            c,
            "Speculative: Total draft tokens accepted by the target model",
            s.accepted_tokens as f64,
        ),
        (
            "spec_decode_num_drafts_total",
            c,
            "Speculative: Total speculative decoding verification steps",
            s.drafts as f64,
        ),
        (
            "prompt_tokens_seconds",
            g,
            "Average prompt throughput in tokens/s",
            rate(
                now.prompt_tokens.saturating_sub(last.prompt_tokens),
                now.prompt_us.saturating_sub(last.prompt_us),
            ),
        ),
        (
            "predicted_tokens_seconds",
            g,
            "Average generation throughput in tokens/s",
            rate(
                now.predicted_steps.saturating_sub(last.predicted_steps),
                now.predicted_us.saturating_sub(last.predicted_us),
            ),
        ),
        (
            "requests_processing",
            g,
            "Number of requests processing",
            processing as f64,
        ),
        (
            "requests_deferred",
            g,
            "Number of requests deferred",
            snap.deferred as f64,
        ),
        (
            "n_busy_slots_per_decode",
            g,
            "Average number of busy slots per llama_decode() call",
            t.busy_slot_steps as f64 / (t.steps as f64).max(1.0),
        ),
    ];
    for (name, kind, help, v) in metrics {
        o.metric(&format!("llamacpp:{name}"), kind, help, v);
    }
    if !s.accepted_per_position.is_empty() {
        o.labelled(
            "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
            c,
            "Accepted tokens per draft position",
            "position",
            &s.accepted_per_position,
        );
    }
    // The speculative counters under vLLM's names.
    o.metric(
        "spec_decode_num_drafts_total",
        c,
        "Speculative verification rounds with a non-empty draft.",
        s.drafts as f64,
    );
    o.metric(
        "spec_decode_num_draft_tokens_total",
        c,
        "Draft tokens verified.",
        s.draft_tokens as f64,
    );
    o.metric(
        "spec_decode_num_accepted_tokens_total",
        c,
        "Draft tokens accepted by the target model.",
        s.accepted_tokens as f64,
    );
    o.labelled(
        "spec_decode_num_accepted_tokens_per_pos_total",
        c,
        "Accepted draft tokens per draft position.",
        "position",
        &s.accepted_per_position,
    );
    o.labelled(
        "specd:spec_decode_num_draft_tokens_per_pos_total",
        c,
        "Drafted tokens per draft position.",
        "position",
        &s.drafted_per_position,
    );
    o.metric(
        "specd:spec_decode_rounds_total",
        c,
        "Generation rounds (plain steps included).",
        s.rounds as f64,
    );
    o.metric(
        "specd:spec_decode_empty_draft_rounds_total",
        c,
        "Rounds without a draft.",
        s.empty_draft_rounds as f64,
    );
    o.metric(
        "specd:spec_decode_controller_skips_total",
        c,
        "Rounds where the controller chose not to speculate.",
        s.controller_skips as f64,
    );
    o.metric(
        "specd:rollbacks_fast_total",
        c,
        "Rejected drafts rolled back without running the model.",
        s.rollbacks_fast as f64,
    );
    o.metric(
        "specd:rollbacks_checkpoint_total",
        c,
        "Rejected drafts rolled back by checkpoint restore and redecode.",
        s.rollbacks_checkpoint as f64,
    );
    o.metric(
        "specd:redecoded_tokens_total",
        c,
        "Tokens decoded again by checkpoint redecodes.",
        s.redecoded_tokens as f64,
    );
    o.metric(
        "specd:prompt_tokens_cached_total",
        c,
        "Prompt tokens reused from a slot's kept memory.",
        t.cached_prompt_tokens as f64,
    );
    o.metric(
        "specd:requests_finished_total",
        c,
        "Requests that finished.",
        t.requests_finished as f64,
    );
    o.metric(
        "specd:requests_failed_total",
        c,
        "Requests that failed.",
        t.requests_failed as f64,
    );
    o.metric(
        "specd:requests_cancelled_total",
        c,
        "Requests cancelled because the client disconnected.",
        t.requests_cancelled as f64,
    );
    o.metric(
        "specd:engine_restarts_total",
        c,
        "Engine panics recovered from.",
        t.engine_restarts as f64,
    );
    let r = &snap.ram_cache;
    o.metric(
        "specd:prompt_cache_ram_hits_total",
        c,
        "Requests whose prompt prefix was restored from the prompt cache in RAM.",
        r.hits as f64,
    );
    o.metric(
        "specd:prompt_cache_misses_total",
        c,
        "Requests (prompt reuse on) that found no reusable prefix in a slot or the RAM cache.",
        r.misses as f64,
    );
    o.metric(
        "specd:prompt_cache_ram_saves_total",
        c,
        "Slot memories saved into the prompt cache in RAM.",
        r.saves as f64,
    );
    o.metric(
        "specd:prompt_cache_ram_evictions_total",
        c,
        "Prompt cache entries dropped to stay within --cache-ram.",
        r.evictions as f64,
    );
    o.metric(
        "specd:prompt_cache_ram_entries",
        g,
        "Saved memories held in the prompt cache in RAM.",
        r.entries as f64,
    );
    o.metric(
        "specd:prompt_cache_ram_bytes",
        g,
        "Bytes held by the prompt cache in RAM.",
        r.bytes as f64,
    );
    o.metric(
        "specd:prompt_cache_ram_limit_bytes",
        g,
        "Byte limit of the prompt cache in RAM (--cache-ram; 0: off).",
        r.limit as f64,
    );
    let m = &snap.memory;
    o.metric(
        "specd:memory_sequences",
        g,
        "Sequences holding memory (running or kept for reuse).",
        m.sequences as f64,
    );
    o.metric(
        "specd:memory_kv_cells",
        g,
        "Positions held in the KV cache.",
        m.kv_cells as f64,
    );
    o.metric(
        "specd:weight_bytes",
        g,
        "Bytes of model weights held for the kernels (mapped, repacked or converted).",
        st.model.device().weight_bytes as f64,
    );
    o.metric(
        "specd:weight_file_bytes",
        g,
        "Bytes of the model's tensors in its file.",
        st.model.info().file_weight_bytes as f64,
    );
    o.metric(
        "specd:memory_kv_bytes",
        g,
        "Bytes of attention KV cache.",
        m.kv_bytes as f64,
    );
    o.metric(
        "specd:memory_recurrent_bytes",
        g,
        "Bytes of recurrent state.",
        m.recurrent_bytes as f64,
    );
    o.metric(
        "specd:memory_rollback_bytes",
        g,
        "Bytes of rollback records (cached recurrence inputs or per-token snapshots).",
        m.rollback_bytes as f64,
    );
    o.metric(
        "specd:memory_checkpoint_bytes",
        g,
        "Bytes of recurrent-state checkpoints.",
        m.checkpoint_bytes as f64,
    );
    o.metric(
        "specd:memory_checkpoints",
        g,
        "Recurrent-state checkpoints held.",
        m.checkpoints as f64,
    );
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4".to_string(),
            ),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                st.started.to_string(),
            ),
        ],
        o.0,
    )
        .into_response()
}
