//! What responses report besides text, shared by every API dialect: ids, timings and
//! speculation statistics, finish reasons, token probabilities, usage.

use super::AppState;
use crate::metrics::Timings;
use crate::params::GenParams;
use serde_json::{json, Value};
use specd_spec::engine::TokenProbs;
use specd_spec::{FinishReason, LiveTimings, PromptProgress, SeqOutput};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) static ID_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique response id (`chatcmpl-…`, `cmpl-…`).
pub(crate) fn response_id(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = ID_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{nanos:x}{n:04x}")
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// llama-server's `timings` (see [`Timings`]) of a generation so far (`timings_per_token`).
pub(crate) fn timings_json(t: &LiveTimings) -> Value {
    Timings::live(t).json()
}

/// llama-server's `timings` of a whole generation: numbers only, as clients read them.
pub(crate) fn timings(out: &SeqOutput) -> Value {
    timings_json(&out.timings())
}

/// specd's speculation statistics of a generation (acceptance length and rate, rounds,
/// rollbacks by kind, …), given next to `timings`.
pub(crate) fn speculative(out: &SeqOutput) -> Value {
    let mut spec = serde_json::to_value(&out.stats).unwrap_or_else(|_| json!({}));
    if let Some(o) = spec.as_object_mut() {
        o.insert(
            "acceptance_length".into(),
            json!(out.stats.acceptance_length()),
        );
        o.insert("acceptance_rate".into(), json!(out.stats.acceptance_rate()));
    }
    spec
}

/// The final `timings` of a result, and the speculation statistics next to them.
pub(crate) fn add_timings(v: &mut Value, out: &SeqOutput) {
    v["timings"] = timings(out);
    v["speculative"] = speculative(out);
}

/// `timings` of a progress report (`timings_per_token`): the prompt so far, nothing predicted.
pub(crate) fn progress_timings(p: &PromptProgress) -> Value {
    Timings::progress(p).json()
}

/// llama-server's `prompt_progress`.
pub(crate) fn progress_json(p: &PromptProgress) -> Value {
    json!({
        "total": p.total,
        "cache": p.cache,
        "processed": p.processed,
        "time_ms": (p.secs * 1e3) as u64,
    })
}

pub(crate) fn stop_type(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Eos => "eos",
        FinishReason::Stop => "word",
        FinishReason::Limit | FinishReason::Context => "limit",
        FinishReason::Error => "none",
    }
}

/// OpenAI `finish_reason`: `stop` for an end-of-generation token or a stop string, `length`
/// otherwise (llama-server: an empty prompt's answer too).
pub(crate) fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Limit | FinishReason::Context | FinishReason::Error => "length",
    }
}

/// A token's text and bytes as llama-server writes them: a multi-byte UTF-8 sequence cut off at
/// the end of the text is dropped from it (the bytes keep it), other invalid bytes become U+FFFD.
pub(crate) fn token_str(st: &AppState, id: u32) -> (String, Vec<u8>) {
    let b = st.model.tokenizer().token_to_bytes(id).to_vec();
    let text = String::from_utf8_lossy(&b[..complete_utf8_len(&b)]).into_owned();
    (text, b)
}

/// Length of `b` without a multi-byte UTF-8 sequence cut off at its end (llama-server's
/// `validate_utf8`: the last four bytes are checked for a lead byte missing continuations).
pub(crate) fn complete_utf8_len(b: &[u8]) -> usize {
    for i in 1..=b.len().min(4) {
        let c = b[b.len() - i];
        let len = match c {
            _ if c & 0xE0 == 0xC0 => 2,
            _ if c & 0xF0 == 0xE0 => 3,
            _ if c & 0xF8 == 0xF0 => 4,
            _ => continue,
        };
        if i < len {
            return b.len() - i;
        }
    }
    b.len()
}

/// llama-server's probabilities of generated tokens (`completion_probabilities`, and the
/// `content` of OpenAI `logprobs`): per token its `id`, `token`, `bytes` and log-probability
/// (`logprob`, `top_logprobs`) under the raw model, or with `post_sampling_probs` its
/// probability (`prob`, `top_probs`) under the sampler's final distribution.
pub(crate) fn probs_json(st: &AppState, probs: &[TokenProbs], post_sampling: bool) -> Vec<Value> {
    let (key, top_key) = if post_sampling {
        ("prob", "top_probs")
    } else {
        ("logprob", "top_logprobs")
    };
    let entry = |id: u32, logprob: f32| {
        let (t, b) = token_str(st, id);
        let v: f32 = if post_sampling {
            f64::from(logprob).exp() as f32
        } else if logprob == f32::NEG_INFINITY {
            // JSON has no -inf: llama-server writes the lowest float.
            f32::MIN
        } else {
            logprob
        };
        let mut m = serde_json::Map::new();
        m.insert("id".into(), id.into());
        m.insert("token".into(), t.into());
        m.insert("bytes".into(), b.into());
        m.insert(key.into(), Value::from(v));
        m
    };
    probs
        .iter()
        .map(|p| {
            let mut e = entry(p.token, p.logprob);
            let top = p.top.iter().map(|&(id, lp)| Value::Object(entry(id, lp)));
            e.insert(top_key.into(), top.collect());
            Value::Object(e)
        })
        .collect()
}

/// The `logprobs` of an OpenAI choice: `{"content": [...]}` when probabilities were asked for
/// and there are some.
pub(crate) fn oai_logprobs(st: &AppState, probs: &[TokenProbs], g: &ProbsAsked) -> Option<Value> {
    (g.n_probs > 0 && !probs.is_empty())
        .then(|| json!({"content": probs_json(st, probs, g.post_sampling)}))
}

/// Which probabilities a response reports.
#[derive(Clone, Copy)]
pub(crate) struct ProbsAsked {
    pub(crate) n_probs: usize,
    pub(crate) post_sampling: bool,
}

impl ProbsAsked {
    pub(crate) fn of(g: &GenParams) -> Self {
        ProbsAsked {
            n_probs: g.n_probs,
            post_sampling: g.post_sampling_probs,
        }
    }
}

/// OpenAI `usage`, counted as llama-server counts: every prompt token (cached ones included),
/// every sampled token (an end-of-generation token included).
pub(crate) fn usage(out: &SeqOutput) -> Value {
    json!({
        "prompt_tokens": out.n_prompt,
        "completion_tokens": out.n_decoded(),
        "total_tokens": out.n_prompt + out.n_decoded(),
        "prompt_tokens_details": {"cached_tokens": out.n_cached},
    })
}

pub(crate) fn fingerprint() -> String {
    format!("specd-{}", env!("CARGO_PKG_VERSION"))
}

/// Adds a progress report to a chunk: `prompt_progress`, and with `timings_per_token` the
/// prompt's timings so far.
pub(crate) fn with_progress(v: &mut Value, p: &PromptProgress, with_timings: bool) {
    if with_timings {
        v["timings"] = progress_timings(p);
    }
    v["prompt_progress"] = progress_json(p);
}
