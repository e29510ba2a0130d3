//! The generating endpoints: llama.cpp `/completion`, OpenAI `/v1/completions` and
//! `/v1/chat/completions`, streamed (SSE) or not. One file per API dialect; this module holds
//! what they share: a request's generation parameters, handing generations to the engine and
//! waiting for them.

use crate::error::ApiError;
use crate::params::{parse_gen, parse_logit_bias, parse_n_cmpl, Api, Fields, GenParams};
use crate::scheduler::{Event, Job};
use crate::scope::Caller;
use crate::AppState;
use serde_json::{json, Value};
use specd_sampling::{GrammarSpec, SamplerParams, RANDOM_SEED};
use specd_spec::{DrafterKind, SeqOutput, SequenceRequest, SpecParams};
use std::sync::Arc;
use tokio::sync::mpsc;

mod anthropic;
mod chat;
mod completions;
mod infill;
mod llama;
mod output;
mod prompt;
mod report;
mod responses;
mod stream;

pub use anthropic::{count_tokens as messages_count_tokens, messages};
pub use chat::{chat, chat_input_tokens};
pub use completions::oai_completion;
pub use infill::{infill, infill_drafters, infill_supported};
pub use llama::completion;
pub use prompt::render_chat;
pub(crate) use report::unix_now;
pub use responses::{responses, responses_input_tokens};

/// The generation settings of a request as llama-server reports them (`generation_settings`,
/// `/props`, `/slots`).
#[allow(clippy::too_many_arguments)]
pub fn generation_settings(
    st: &AppState,
    s: &SamplerParams,
    n_predict: Option<usize>,
    stop: &[String],
    ignore_eos: bool,
    n_probs: usize,
    spec: &SpecParams,
    stream: bool,
) -> Value {
    json!({
        "n_ctx": st.cfg.n_ctx_slot,
        "n_predict": n_predict.map_or(-1, |n| n as i64),
        "model": st.cfg.model_id,
        "seed": s.seed,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "typical_p": s.typical_p,
        "repeat_last_n": s.repeat_last_n,
        "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "stop": stop,
        "max_tokens": n_predict.map_or(-1, |n| n as i64),
        "ignore_eos": ignore_eos,
        "stream": stream,
        "n_probs": n_probs,
        "samplers": ["penalties", "top_k", "typ_p", "top_p", "min_p", "temperature"],
        "speculative.n_max": spec.n_max,
        "speculative.n_min": spec.n_min,
        "speculative.p_min": spec.p_min,
        "speculative.types": spec.drafters.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "speculative.adaptive": spec.adaptive,
        "speculative.verify": spec.verify.name(),
    })
}

pub(crate) fn settings_of(st: &AppState, g: &GenParams) -> Value {
    let mut v = generation_settings(
        st,
        &g.sampler,
        g.n_predict,
        &g.stop,
        g.ignore_eos,
        g.n_probs,
        &g.spec,
        g.stream,
    );
    if let (Some(gr), Some(o)) = (&g.grammar, v.as_object_mut()) {
        let (k, val) = match gr {
            GrammarSpec::Gbnf(s) | GrammarSpec::Lark(s) | GrammarSpec::Regex(s) => {
                ("grammar", json!(s))
            }
            GrammarSpec::JsonSchema(s) => ("json_schema", s.clone()),
            GrammarSpec::JsonObject => ("json_schema", json!({"type": "object"})),
        };
        o.insert(k.into(), val);
    }
    v["post_sampling_probs"] = json!(g.post_sampling_probs);
    v
}

/// A request's generation parameters, with the fields that need the server: `logit_bias`
/// (texts are tokenized) and `n_cmpl` / `n` (at most one completion per slot).
pub(crate) fn gen_params(
    st: &AppState,
    f: &Fields,
    api: Api,
    caller: Caller,
) -> Result<GenParams, ApiError> {
    let mut g = parse_gen(f, &st.cfg.defaults, api)?;
    g.cache_scope = caller.scope(g.cache_salt.as_deref());
    let tok = st.model.tokenizer();
    // A request's `logit_bias` replaces the command line's.
    g.logit_bias = if f.get("logit_bias").is_some() {
        parse_logit_bias(f, st.model.info().n_vocab, |text| {
            tok.encode(text, false, false).map_err(|e| {
                ApiError::invalid(format!("logit_bias: {e}")).with("param", "logit_bias")
            })
        })?
    } else {
        st.cfg.defaults.logit_bias.clone()
    };
    g.n_cmpl = parse_n_cmpl(f, st.cfg.n_parallel)?;
    Ok(g)
}

/// The generations a request asks for: `n_cmpl` per prompt, prompt after prompt (llama-server's
/// order, which numbers the results). A prompt's extra completions sample with seed + 1, + 2, …
/// (a random seed stays random: each draws its own) and take any free slot, as llama-server's.
pub(crate) fn tasks(prompts: Vec<Vec<u32>>, g: &GenParams) -> Vec<(Vec<u32>, GenParams)> {
    let mut out = Vec::with_capacity(prompts.len() * g.n_cmpl);
    for p in prompts {
        for j in 0..g.n_cmpl {
            let mut gj = g.clone();
            if j > 0 {
                if gj.sampler.seed != RANDOM_SEED {
                    gj.sampler.seed = gj.sampler.seed.wrapping_add(j as u32);
                }
                gj.id_slot = None;
            }
            out.push((p.clone(), gj));
        }
    }
    out
}

/// Checks a prompt and builds the engine request. An empty prompt is answered at once with
/// nothing generated, as llama-server does.
pub(crate) fn prepare(
    st: &AppState,
    prompt: Vec<u32>,
    g: &GenParams,
) -> Result<SequenceRequest, ApiError> {
    let n_ctx = st.cfg.n_ctx_slot;
    if prompt.len() >= n_ctx {
        return Err(ApiError::exceed_context(prompt.len(), n_ctx));
    }
    // n_predict 0 evaluates the prompt only (llama-server): generate one token, report none.
    let n_predict = match g.n_predict {
        Some(0) => 1,
        Some(n) => n,
        None => n_ctx, // the context bounds it
    };
    let mut r = SequenceRequest::greedy(prompt, n_predict);
    r.sampler = g.sampler;
    r.ignore_eos = g.ignore_eos;
    r.stop = g.stop.clone();
    r.spec = g.spec.clone();
    r.n_probs = g.n_probs;
    r.post_sampling_probs = g.post_sampling_probs;
    r.logit_bias = g.logit_bias.clone();
    r.grammar = g.grammar.clone();
    r.reasoning_budget = g.reasoning_budget.clone();
    r.cache_prompt = g.cache_prompt;
    r.cache_scope = g.cache_scope;
    r.time_limit = g.time_limit;
    r.checkpoints = g.checkpoints.clone();
    r.prompt_logprobs = g.prompt_logprobs;
    if r.spec.drafters.contains(&DrafterKind::DraftSimple) {
        r.draft_model = st.cfg.draft_model.clone();
        if r.draft_model.is_none() {
            return Err(ApiError::invalid(
                "speculative type draft-simple needs a draft model (start the server with -md)",
            ));
        }
    }
    // A request error, not the server's: checked here so it is a 400 with a clear message.
    if r.spec.drafters.contains(&DrafterKind::DraftMtp) && !st.model.info().has_mtp {
        return Err(ApiError::invalid(
            "speculative type draft-mtp needs a model with an MTP (NextN) head; this model has none",
        ));
    }
    Ok(r)
}

/// What a request asks to see besides the generation (llama-server's response options).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Extras {
    /// `verbose` (default on with `--verbose`): `__verbose`, the llama-server form of the result.
    verbose: bool,
    /// `timings_per_token`: timings in every streamed chunk.
    timings_per_token: bool,
    /// `return_progress` (streams only): `prompt_progress` chunks while the prompt is processed.
    progress: bool,
}

impl Extras {
    fn of(st: &AppState, f: &Fields, g: &GenParams) -> Result<Self, ApiError> {
        Ok(Extras {
            verbose: f.bool("verbose")?.unwrap_or(st.cfg.verbose),
            timings_per_token: f.bool("timings_per_token")?.unwrap_or(false),
            progress: g.stream && f.bool("return_progress")?.unwrap_or(false),
        })
    }
}

/// A request handed to the engine.
pub(crate) struct Running {
    rx: mpsc::UnboundedReceiver<Event>,
    /// Its slot (known once it started).
    slot: usize,
    prompt: Vec<u32>,
    /// `n_predict: 0`: the one token generated is not reported.
    zero: bool,
    /// Streamed with `timings_per_token`.
    timings: bool,
    /// Turns true when the shutdown grace period is over: the request ends with an error.
    cancel: tokio::sync::watch::Receiver<bool>,
}

impl Running {
    /// The next engine event, or the shutdown's error once the grace period is over (dropping
    /// the request then frees its slot, as a client that went away does).
    pub(crate) async fn next(&mut self) -> Result<Option<Event>, ApiError> {
        tokio::select! {
            biased;
            ev = self.rx.recv() => Ok(ev),
            _ = self.cancel.wait_for(|c| *c) => Err(shutdown_error()),
        }
    }
}

/// The error a request still running at the end of the shutdown grace period ends with.
pub(crate) fn shutdown_error() -> ApiError {
    ApiError::new(
        crate::error::ErrorKind::Unavailable,
        "the server is shutting down: the request was cancelled at the end of the grace period",
    )
}

/// Hands a generation to the engine without waiting for it to start.
pub(crate) async fn submit(
    st: &Arc<AppState>,
    prompt: Vec<u32>,
    g: &GenParams,
    x: Extras,
) -> Result<Running, ApiError> {
    let mut req = prepare(st, prompt.clone(), g)?;
    if req.spec.drafters.contains(&DrafterKind::Synthetic) && !req.prompt.is_empty() {
        let (st2, r) = (st.clone(), req.clone());
        let reference = tokio::task::spawn_blocking(move || {
            st2.references
                .get_or_run(st2.model.clone(), &r, st2.cfg.n_ctx_slot, st2.cfg.kv_types)
        })
        .await
        .map_err(|e| ApiError::server(format!("synthetic reference run: {e}")))??;
        req.reference = Some(reference);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    st.sched.submit(Job {
        req,
        id_slot: g.id_slot,
        events: tx,
        settings: settings_of(st, g),
        progress: x.progress,
        timings: x.timings_per_token && g.stream,
    })?;
    Ok(Running {
        rx,
        slot: 0,
        prompt,
        zero: g.n_predict == Some(0),
        timings: x.timings_per_token && g.stream,
        cancel: st.cancel_all.subscribe(),
    })
}

/// Submits a generation and waits until it has a slot (or fails: bad grammar, …), so errors
/// get their own status even for streamed requests.
pub(crate) async fn start(
    st: &Arc<AppState>,
    prompt: Vec<u32>,
    g: &GenParams,
    x: Extras,
) -> Result<Running, ApiError> {
    let mut r = submit(st, prompt, g, x).await?;
    loop {
        match r.next().await? {
            Some(Event::Started { slot, .. }) => {
                r.slot = slot;
                return Ok(r);
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(_) => continue,
            None => return Err(ApiError::server("the engine dropped the request")),
        }
    }
}

/// Runs a request's preparation (parameters, chat template, tokenizing) on a request worker,
/// off the async threads (see [`crate::limits`]); gives the body back with the result.
pub(crate) async fn on_worker<T: Send + 'static>(
    st: &Arc<AppState>,
    body: Value,
    f: impl FnOnce(&AppState, &Fields) -> Result<T, ApiError> + Send + 'static,
) -> Result<(Value, T), ApiError> {
    let st2 = st.clone();
    st.limits
        .cpu(move || {
            let r = f(&st2, &Fields::of(&body))?;
            Ok((body, r))
        })
        .await
}

/// Clears what `n_predict: 0` generated only to evaluate the prompt.
pub(crate) fn hide_zero(out: &mut SeqOutput) {
    out.tokens.clear();
    out.text.clear();
    out.probs.clear();
    out.eog = None;
}

/// Waits for the end of a generation.
pub(crate) async fn finish(mut r: Running) -> Result<(SeqOutput, Running), ApiError> {
    loop {
        match r.next().await? {
            Some(Event::Done(out)) => {
                let mut out = *out;
                if r.zero {
                    hide_zero(&mut out);
                }
                return Ok((out, r));
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(Event::Started { slot, .. }) => r.slot = slot,
            Some(_) => continue,
            None => return Err(ApiError::server("the engine dropped the request")),
        }
    }
}

/// Submits every generation of a streamed request: the first one is waited for, so that a
/// request that cannot start gets an error status instead of a stream (llama-server waits for
/// its first result); the others take their slots as they free up.
pub(crate) async fn start_streams(
    st: &Arc<AppState>,
    tasks: &[(Vec<u32>, GenParams)],
    x: Extras,
) -> Result<Vec<Running>, ApiError> {
    let mut runs = Vec::with_capacity(tasks.len());
    for (i, (p, g)) in tasks.iter().enumerate() {
        runs.push(if i == 0 {
            start(st, p.clone(), g, x).await?
        } else {
            submit(st, p.clone(), g, x).await?
        });
    }
    Ok(runs)
}

/// Runs every generation at once (they share the engine's batches) and waits for all.
pub(crate) async fn run_all(
    st: &Arc<AppState>,
    tasks: &[(Vec<u32>, GenParams)],
    x: Extras,
) -> Result<Vec<(SeqOutput, Running)>, ApiError> {
    let runs = futures_util::future::join_all(tasks.iter().map(|(p, g)| async move {
        let r = start(st, p.clone(), g, x).await?;
        finish(r).await
    }))
    .await;
    runs.into_iter().collect()
}
