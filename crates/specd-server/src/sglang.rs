//! The endpoints of SGLang's runtime that SGLang's model gateway (`sglang-router`, `smg`) reads
//! from its workers, so that specd workers sit behind it like SGLang ones:
//!
//! * `GET /server_info`, `/model_info` (and the older `/get_server_info`, `/get_model_info`):
//!   worker discovery — the gateway labels each worker with the model's path, served name,
//!   type and architectures, and lists the served name in its `/v1/models`.
//! * `GET /get_load`: the load per data-parallel rank (`power_of_two`, the gateway's
//!   `/get_loads`).
//! * `GET|POST /flush_cache`: drop every slot's kept prompt memory.
//! * `GET /health_generate`: a health check that runs the model.
//!
//! Every value comes from the server's configuration, the model file or the scheduler's state.

use crate::error::{ApiError, ErrorKind};
use crate::generate::generation_settings;
use crate::scheduler::{Event, Flushed, Job};
use crate::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use specd_sampling::SamplerParams;
use specd_spec::SequenceRequest;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How long `/health_generate` waits for the engine (SGLang's default health-check timeout).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(20);

/// Positions the server can hold at once: every slot full.
fn max_total_tokens(st: &AppState) -> usize {
    st.cfg.n_ctx_slot.saturating_mul(st.cfg.n_parallel)
}

/// `GET /server_info`: the server's settings under SGLang's names. The gateway reads
/// `model_path`, `served_model_name` (the model's name in its `/v1/models`), `dp_size`,
/// `max_total_tokens` and `max_running_requests`; `max_total_num_tokens` and `context_length`
/// are the names SGLang's own server gives the same quantities.
pub async fn server_info(State(st): State<Arc<AppState>>) -> Json<Value> {
    let total = max_total_tokens(&st);
    Json(json!({
        "model_path": st.cfg.model_path,
        "tokenizer_path": st.cfg.model_path,
        "served_model_name": st.cfg.model_id,
        "dp_size": 1,
        "context_length": st.cfg.n_ctx_slot,
        "max_running_requests": st.cfg.n_parallel,
        "max_total_tokens": total,
        "max_total_num_tokens": total,
        "is_embedding": false,
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

/// `GET /model_info`: the model as SGLang describes it. The tokenizer is inside the GGUF file,
/// so `tokenizer_path` is the model's path; `model_type` and `architectures` are the file's
/// `general.architecture`.
pub async fn model_info(State(st): State<Arc<AppState>>) -> Json<Value> {
    let arch = st.model.info().arch.as_str();
    Json(json!({
        "model_path": st.cfg.model_path,
        "tokenizer_path": st.cfg.model_path,
        "is_generation": true,
        "model_type": arch,
        "architectures": [arch],
        "has_image_understanding": false,
        "has_audio_understanding": false,
    }))
}

/// `GET /get_load`: one entry (specd has one data-parallel rank). As in SGLang, `num_reqs`
/// counts running and waiting requests, and `num_tokens` the tokens they hold: the running
/// slots' positions and the waiting prompts. Memory kept by idle slots for prompt reuse is
/// not load (a new request may take it over).
pub async fn get_load(State(st): State<Arc<AppState>>) -> Json<Value> {
    let snap = st.sched.snapshot();
    let running: Vec<_> = snap.slots.iter().filter(|s| s.processing).collect();
    let held: usize = running.iter().map(|s| s.n_tokens).sum();
    Json(json!([{
        "dp_rank": 0,
        "num_reqs": running.len() + snap.deferred,
        "num_waiting_reqs": snap.deferred,
        "num_tokens": held + snap.deferred_tokens,
    }]))
}

/// `GET|POST /flush_cache`: drops every slot's kept memory. As in SGLang, refused (400) while
/// requests run or wait. A sleeping server holds no memory: nothing to drop.
pub async fn flush_cache(State(st): State<Arc<AppState>>) -> Response {
    if st.sched.snapshot().sleeping {
        return Json(json!({"success": true, "n_slots": 0, "n_tokens": 0})).into_response();
    }
    match st.sched.flush().await {
        Ok(Flushed::Done { slots, tokens }) => {
            Json(json!({"success": true, "n_slots": slots, "n_tokens": tokens})).into_response()
        }
        Ok(Flushed::Busy(n)) => ApiError::invalid(format!(
            "cache not flushed: {n} request(s) running or waiting; retry when the server is idle"
        ))
        .into_response(),
        Err(e) => e.into_response(),
    }
}

fn unhealthy(msg: impl Into<String>) -> Response {
    ApiError::new(ErrorKind::Unavailable, msg).into_response()
}

/// `GET /health_generate`: 200 once the engine has produced a token. While requests run, their
/// next step is that token (as in SGLang, the check adds no work to a busy server); when idle,
/// a one-token greedy generation runs in a slot that keeps no memory if there is one (else the
/// least recently used slot's kept memory is dropped). 503 if no token comes within 20 s.
pub async fn health_generate(State(st): State<Arc<AppState>>) -> Response {
    let deadline = Instant::now() + HEALTH_TIMEOUT;
    let snap = st.sched.snapshot();
    if snap.slots.iter().any(|s| s.processing) {
        let steps = snap.totals.steps;
        while Instant::now() < deadline {
            let now = st.sched.snapshot();
            if now.totals.steps > steps {
                return Json(json!({"status": "ok"})).into_response();
            }
            if !now.slots.iter().any(|s| s.processing) {
                break; // went idle between two looks: generate below
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if Instant::now() >= deadline {
            return unhealthy("health check: no engine step within the timeout");
        }
    }
    let tok = st.model.tokenizer();
    let prompt = vec![tok.bos_id().unwrap_or(0)];
    let d = &st.cfg.defaults;
    let greedy = SamplerParams::greedy();
    let settings = generation_settings(&st, &greedy, Some(1), &[], false, 0, &d.spec, false);
    let empty_slot = st
        .sched
        .snapshot()
        .slots
        .iter()
        .find(|s| !s.processing && s.n_tokens == 0)
        .map(|s| s.id);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut req = SequenceRequest::greedy(prompt, 1);
    req.cache_prompt = false;
    let job = Job {
        req,
        id_slot: empty_slot,
        events: tx,
        settings,
        progress: false,
        timings: false,
    };
    if let Err(e) = st.sched.submit(job) {
        return e.into_response();
    }
    let wait = async {
        loop {
            match rx.recv().await {
                Some(Event::Done(_)) => return Ok(()),
                Some(Event::Failed(e)) => return Err(e.message),
                Some(_) => {}
                None => return Err("the engine dropped the request".to_string()),
            }
        }
    };
    match tokio::time::timeout_at(deadline.into(), wait).await {
        Ok(Ok(())) => Json(json!({"status": "ok"})).into_response(),
        Ok(Err(e)) => unhealthy(format!("health check generation failed: {e}")),
        Err(_) => unhealthy("health check: no token within the timeout"),
    }
}
