//! `GET /metrics`: Prometheus text format. llama-server's `llamacpp:*` metrics, the speculative
//! decoding counters under both llama-server's and vLLM's names (`spec_decode_*`), and specd's
//! own (`specd:*`: rollbacks, prompt reuse, memory held by KV, recurrent state, rollback records
//! and checkpoints).

use crate::error::{ApiError, ErrorKind};
use crate::AppState;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use std::fmt::Write;
use std::sync::Arc;

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

/// `GET /metrics` (501 unless started with `--metrics`, like llama-server).
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
    let mut o = Out(String::new());
    let c = "counter";
    let g = "gauge";
    o.metric(
        "llamacpp:prompt_tokens_total",
        c,
        "Number of prompt tokens processed.",
        t.prompt_tokens as f64,
    );
    o.metric(
        "llamacpp:prompt_seconds_total",
        c,
        "Prompt process time",
        t.prompt_secs,
    );
    o.metric(
        "llamacpp:tokens_predicted_total",
        c,
        "Number of generation tokens processed.",
        t.predicted_tokens as f64,
    );
    o.metric(
        "llamacpp:tokens_predicted_seconds_total",
        c,
        "Predict process time",
        t.predicted_secs,
    );
    o.metric(
        "llamacpp:n_decode_total",
        c,
        "Total number of engine steps (batched decodes of all busy slots).",
        t.steps as f64,
    );
    o.metric(
        "llamacpp:n_tokens_max",
        c,
        "Largest observed n_tokens.",
        t.n_tokens_max as f64,
    );
    let avg = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    o.metric(
        "llamacpp:prompt_tokens_seconds",
        g,
        "Average prompt throughput in tokens/s.",
        avg(t.prompt_tokens as f64, t.prompt_secs),
    );
    o.metric(
        "llamacpp:predicted_tokens_seconds",
        g,
        "Average generation throughput in tokens/s.",
        avg(t.predicted_tokens as f64, t.predicted_secs),
    );
    o.metric(
        "llamacpp:n_busy_slots_per_decode",
        g,
        "Average number of busy slots per engine step.",
        avg(t.busy_slot_steps as f64, t.steps as f64),
    );
    o.metric(
        "llamacpp:requests_processing",
        g,
        "Number of requests processing.",
        processing as f64,
    );
    o.metric(
        "llamacpp:requests_deferred",
        g,
        "Number of requests deferred.",
        snap.deferred as f64,
    );
    let s = &t.spec;
    for prefix in ["llamacpp:", ""] {
        o.metric(
            &format!("{prefix}spec_decode_num_drafts_total"),
            c,
            "Speculative verification rounds with a non-empty draft.",
            s.drafts as f64,
        );
        o.metric(
            &format!("{prefix}spec_decode_num_draft_tokens_total"),
            c,
            "Draft tokens verified.",
            s.draft_tokens as f64,
        );
        o.metric(
            &format!("{prefix}spec_decode_num_accepted_tokens_total"),
            c,
            "Draft tokens accepted by the target model.",
            s.accepted_tokens as f64,
        );
        o.labelled(
            &format!("{prefix}spec_decode_num_accepted_tokens_per_pos_total"),
            c,
            "Accepted draft tokens per draft position.",
            "position",
            &s.accepted_per_position,
        );
    }
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
        "Rejected drafts rolled back by checkpoint restore and replay.",
        s.rollbacks_checkpoint as f64,
    );
    o.metric(
        "specd:replayed_tokens_total",
        c,
        "Tokens decoded again by checkpoint replays.",
        s.replayed_tokens as f64,
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
        st.model.weight_bytes() as f64,
    );
    o.metric(
        "specd:weight_file_bytes",
        g,
        "Bytes of the model's tensors in its file.",
        st.model.file_weight_bytes() as f64,
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
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        o.0,
    )
        .into_response()
}
