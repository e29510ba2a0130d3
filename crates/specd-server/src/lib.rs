//! specd's HTTP server: the OpenAI API (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`) and llama-server's own endpoints (`/completion`, `/tokenize`, `/detokenize`,
//! `/apply-template`, `/props`, `/slots`, `/metrics`, `/health`), with the same field names,
//! defaults and error shapes, so existing clients and scripts work unchanged.
//!
//! * [`scheduler`]: one engine thread owns the [`specd_spec::Engine`]; all busy slots advance
//!   together in one step (continuous batching), requests queue FIFO when every slot is busy,
//!   a slot whose client disconnects is cancelled at once, and a slot keeps its memory between
//!   requests so a follow-up prompt only processes what is new (prompt reuse).
//! * [`params`]: request fields → generation parameters (strictly typed: a wrong type is a 400).
//! * [`error`]: `{"error": {"code", "message", "type"}}` bodies for every failure, malformed JSON
//!   and the HTTP layer's own refusals included (Anthropic's shape on its routes).
//! * [`cors`] and [`host`]: by default only pages served from this machine may call the server
//!   from a browser (loopback origins), and a loopback listener answers only requests for a
//!   loopback name (DNS-rebinding protection).
//!
//! The server holds no speculative logic: it hands requests to the engine and formats what
//! comes back.

mod api;
pub mod atomic_file;
mod conn;
pub mod cors;
pub mod error;
mod generate;
pub mod host;
pub mod limits;
pub mod metrics;
pub mod params;
mod resume;
pub mod scheduler;
mod scope;
mod sglang;
mod slots;
pub mod vertex;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use error::{ApiError, ErrorKind};
use params::Defaults;
use scheduler::Scheduler;
use specd_backend::Backend;
use specd_backend::{KvType, MemoryConfig};
use specd_spec::RollbackKind;
use specd_tokenizer::ChatTemplate;
use std::sync::Arc;

/// Everything the server is configured with (the `specd serve` command line).
#[derive(Clone)]
pub struct ServerConfig {
    /// Listen address and port (0: any free port; the bound address is printed).
    pub host: String,
    pub port: u16,
    /// Parallel slots (sequences generating at once).
    pub n_parallel: usize,
    /// Context of each slot, in tokens.
    pub n_ctx_slot: usize,
    /// Accepted API keys (empty: no authentication).
    pub api_keys: Vec<String>,
    /// Serve `/metrics`.
    pub metrics: bool,
    /// `--metrics-strict`: every counter's name ends in `_total` (llama-server's
    /// `llamacpp:n_tokens_max` counter becomes a gauge), as OpenMetrics parsers demand.
    pub metrics_strict: bool,
    /// Serve `/slots`.
    pub slots: bool,
    /// The model id shown by `/v1/models` and in responses (the first `--alias` in sorted
    /// order, else the model path).
    pub model_id: String,
    /// `--alias`: every name of the model, sorted, without duplicates.
    pub aliases: Vec<String>,
    /// Path of the model file.
    pub model_path: String,
    /// `--tags`.
    pub tags: Vec<String>,
    /// Request defaults from the command line.
    pub defaults: Defaults,
    /// Jinja source of the chat template in use.
    pub chat_template: String,
    /// `--chat-template-kwargs`: variables every render of the chat template sees.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// CORS (`--cors-origins`, `--cors-methods`, `--cors-headers`, `--cors-credentials`).
    pub cors: cors::Cors,
    /// `--allowed-hosts`: the `Host` names a loopback listener answers besides the loopback ones.
    pub allowed_hosts: host::AllowedHosts,
    /// Most bytes of a request body.
    pub body_limit: usize,
    /// `--threads-http`: request workers (CPU work of requests before the engine: parsing,
    /// chat templates, tokenizing).
    pub threads_http: usize,
    /// `--max-pending-bytes`: most bytes of request bodies in flight at once.
    pub max_pending_bytes: usize,
    /// `--timeout`: how long reading a request, or writing a part of an answer, may take.
    pub timeout: std::time::Duration,
    /// `--shutdown-grace`: how long running requests may go on after SIGTERM / SIGINT before
    /// they are cancelled.
    pub shutdown_grace: std::time::Duration,
    /// Recurrent-state rollback of the engine.
    pub rollback: RollbackKind,
    /// Prompt-end checkpoints kept per slot for prompt reuse (`--ctx-checkpoints`).
    pub ctx_checkpoints: usize,
    /// `--cache-ram`: bytes of the prompt cache in RAM (0: off).
    pub cache_ram: usize,
    /// `--kv-unified`: each slot may use the whole context (memory is allocated on demand).
    pub kv_unified: bool,
    /// `--cache-idle-slots` (llama-server's default; needs `cache_ram` and `kv_unified`): see
    /// [`scheduler::PromptCache::free_idle_slots`].
    pub cache_idle_slots: bool,
    /// Draft model for `draft-simple`.
    pub draft_model: Option<Arc<dyn Backend>>,
    /// Log each request; responses carry `__verbose` unless a request says `"verbose": false`.
    pub verbose: bool,
    /// A final assistant message is continued, not answered (`--no-prefill-assistant`: off).
    pub prefill_assistant: bool,
    /// Where chat answers' reasoning goes (`--reasoning-format`; requests may say
    /// `reasoning_format`).
    pub reasoning_format: specd_output::ReasoningFormat,
    /// `--reasoning-budget`: tokens a thinking block may run before its end is forced (-1:
    /// no limit); requests may say `reasoning_budget_tokens` / `thinking_budget_tokens`.
    pub reasoning_budget: i64,
    /// `--reasoning-budget-message`: text forced before the end tag when the budget runs out.
    pub reasoning_budget_message: String,
    /// Element types of the KV cache (K, V).
    pub kv_types: (KvType, KvType),
    /// `--slot-save-path`: the directory of slot save / restore files (none: disabled).
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Google Cloud Vertex AI mode (`AIP_MODE=PREDICTION`): its predict and health routes.
    pub vertex: Option<vertex::Vertex>,
    /// `--sleep-idle-seconds`: release the engine after this long without work.
    pub sleep_idle: Option<std::time::Duration>,
    /// llama-server's logical batch (`-b`): what an /infill prompt keeps of its prefix and suffix.
    pub infill_batch: usize,
}

impl ServerConfig {
    /// Whether `--cache-idle-slots` frees idle slots (into the RAM cache): with a RAM cache and
    /// a unified memory (see [`scheduler::PromptCache::free_idle_slots`]).
    pub fn free_idle_slots(&self) -> bool {
        self.cache_idle_slots && self.cache_ram > 0 && self.kv_unified
    }
}

/// Shared state of the HTTP handlers.
pub struct AppState {
    pub cfg: ServerConfig,
    pub model: Arc<dyn Backend>,
    pub template: ChatTemplate,
    pub sched: Scheduler,
    /// Unix time the server started (`created` of `/v1/models`).
    pub started: u64,
    /// The synthetic drafter's last reference run.
    pub references: scheduler::ReferenceCache,
    /// `/metrics`' counters at the previous scrape.
    pub scrapes: metrics::Scrapes,
    /// Request workers, the budget of bodies in flight, the prompt length bound.
    pub limits: limits::Limits,
    /// Set when the shutdown grace period is over: running requests end with an error.
    pub cancel_all: tokio::sync::watch::Sender<bool>,
    /// Streams detached from their connection by `X-Conversation-Id` (`resume`).
    pub streams: resume::Streams,
}

impl AppState {
    /// Starts the engine thread and compiles the chat template.
    pub fn new(cfg: ServerConfig, model: Arc<dyn Backend>) -> Result<Arc<Self>, String> {
        let tok = model.tokenizer();
        let bos = tok
            .bos_id()
            .and_then(|i| tok.token_text(i))
            .unwrap_or("")
            .to_string();
        let eos = tok
            .eos_id()
            .and_then(|i| tok.token_text(i))
            .unwrap_or("")
            .to_string();
        cfg.cors.validate()?;
        if let Some(v) = &cfg.vertex {
            let taken = |r: &str| {
                post_routes()
                    .iter()
                    .chain(&get_routes())
                    .any(|(p, _)| *p == r)
            };
            if taken(&v.predict_route) {
                return Err(format!(
                    "AIP_PREDICT_ROUTE={} conflicts with an existing route",
                    v.predict_route
                ));
            }
        }
        let mut template = ChatTemplate::with_special_tokens(&cfg.chat_template, &bos, &eos)
            .map_err(|e| format!("chat template: {e}"))?;
        template.set_default_kwargs(&cfg.chat_template_kwargs);
        template.set_added_special_tokens(tok.add_bos(), tok.add_eos());
        let mem_cfg = MemoryConfig {
            n_ctx: cfg.n_ctx_slot,
            max_seqs: cfg.n_parallel,
            // Drafts up to the default n_max roll back without checkpoints.
            rollback_window: (cfg.defaults.spec.n_max + 1).max(17),
            kv_type_k: cfg.kv_types.0,
            kv_type_v: cfg.kv_types.1,
            ..MemoryConfig::default()
        };
        let sched = Scheduler::start(
            model.clone(),
            mem_cfg,
            cfg.rollback,
            scheduler::PromptCache {
                checkpoints: cfg.ctx_checkpoints,
                ram_bytes: cfg.cache_ram,
                free_idle_slots: cfg.free_idle_slots(),
            },
            cfg.sleep_idle,
        )
        .map_err(|e| format!("starting the engine thread: {e}"))?;
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Arc::new(AppState {
            template,
            sched,
            started,
            references: Default::default(),
            scrapes: Default::default(),
            limits: limits::Limits::new(
                cfg.threads_http,
                cfg.max_pending_bytes,
                limits::longest_token(model.tokenizer()),
            ),
            cancel_all: tokio::sync::watch::Sender::new(false),
            streams: resume::Streams::default(),
            cfg,
            model,
        }))
    }
}

/// Endpoints that need no API key (as in llama-server: the model list needs one).
const PUBLIC_PATHS: [&str; 3] = ["/", "/health", "/v1/health"];

/// The key a request presents: `Authorization: Bearer KEY` anywhere, and Anthropic's
/// `x-api-key: KEY` on Anthropic's routes (its SDKs send that header; elsewhere it is not part
/// of the API, and a key in an unexpected header is more likely a mistake than a client).
/// `Err` says what is wrong with a header that is there.
fn presented_keys<'a>(
    headers: &'a header::HeaderMap,
    path: &str,
) -> Result<Vec<&'a [u8]>, &'static str> {
    let mut keys = Vec::new();
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        // RFC 7235: `credentials = auth-scheme 1*SP token68`, the scheme case-insensitive. The
        // key is what follows the spaces, exactly: hyper already stripped the whitespace around
        // the value, so whatever is left (`Bearer k x`, a tab) is part of what the client sent.
        let v = v.as_bytes();
        let Some(sp) = v.iter().position(|&b| b == b' ') else {
            return Err("the Authorization header must be 'Bearer KEY'");
        };
        let (scheme, rest) = v.split_at(sp);
        let key = &rest[rest.iter().take_while(|&&b| b == b' ').count()..];
        if !scheme.eq_ignore_ascii_case(b"bearer") || key.is_empty() {
            return Err("the Authorization header must be 'Bearer KEY'");
        }
        keys.push(key);
    }
    if let Some(v) = headers.get("x-api-key") {
        if !error::is_anthropic_path(path) {
            if keys.is_empty() {
                return Err("x-api-key is accepted on the Anthropic routes (/v1/messages) only; send 'Authorization: Bearer KEY'");
            }
        } else {
            keys.push(v.as_bytes());
        }
    }
    Ok(keys)
}

async fn auth(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    if st.cfg.api_keys.is_empty()
        || req.method() == Method::OPTIONS
        || PUBLIC_PATHS.contains(&req.uri().path())
    {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    let keys = presented_keys(req.headers(), &path);
    // Every key is compared, each in constant time: the answer's timing says nothing about
    // which key, or how much of one, a guess matched. The key's index is the caller's prompt
    // cache partition (`scope`).
    let matched = keys.as_ref().ok().and_then(|keys| {
        keys.iter().find_map(|k| {
            st.cfg
                .api_keys
                .iter()
                .enumerate()
                .fold(None, |found, (i, a)| {
                    let eq = constant_time_eq::constant_time_eq(a.as_bytes(), k);
                    found.or(eq.then_some(i))
                })
        })
    });
    match (matched, keys) {
        (Some(i), _) => {
            req.extensions_mut().insert(scope::Caller { key: Some(i) });
            next.run(req).await
        }
        (None, keys) => {
            tracing::warn!(path = %path, "unauthorized: invalid API key");
            // llama-server's message; a malformed header says what the server expects.
            let message = match keys {
                Err(why) => format!("Invalid API Key: {why}"),
                Ok(_) => "Invalid API Key".to_string(),
            };
            ApiError::new(ErrorKind::Authentication, message).response_for(&path)
        }
    }
}

/// The DNS-rebinding check ([`host`]): on a loopback TCP listener, a request must name a
/// loopback host or one of `--allowed-hosts`.
async fn check_host(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let loopback = req
        .extensions()
        .get::<conn::Listening>()
        .is_some_and(|l| l.loopback_tcp);
    if loopback {
        if let Err(e) = host::check(&st.cfg.allowed_hosts, &req) {
            tracing::warn!(path = %req.uri().path(), "refused: {}", e.message);
            return e.response_for(req.uri().path());
        }
    }
    next.run(req).await
}

/// Refuses a body announced larger than the limit before reading any of it (the body-limit
/// layer alone would first wait for the bytes to arrive), and one the budget of bodies in
/// flight has no room for; the reservation is held until the answer is ready.
async fn limit_body(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > st.cfg.body_limit as u64) {
        return ApiError::new(
            ErrorKind::TooLarge,
            format!(
                "request body is larger than the limit of {} bytes",
                st.cfg.body_limit
            ),
        )
        .response_for(req.uri().path());
    }
    // Bodies without a length may grow to the limit: they reserve all of it.
    let reserved = match announced {
        Some(0) => None,
        Some(n) => Some(n as usize),
        None if req.headers().contains_key(header::TRANSFER_ENCODING) => Some(st.cfg.body_limit),
        None => None,
    };
    let _budget = match reserved.map(|n| st.limits.reserve(n)).transpose() {
        Ok(p) => p,
        Err(e) => {
            // Refused before the body is read: the connection cannot carry another request.
            let mut r = e.response_for(req.uri().path());
            r.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
            return r;
        }
    };
    next.run(req).await
}

async fn log_requests(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if !st.cfg.verbose {
        return next.run(req).await;
    }
    let (m, p) = (req.method().clone(), req.uri().path().to_string());
    let t0 = std::time::Instant::now();
    let res = next.run(req).await;
    eprintln!(
        "request: {m} {p} -> {} ({:.1} ms)",
        res.status().as_u16(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    res
}

/// Endpoints a sleeping server answers without waking (as in llama-server; and SGLang's
/// info, load and flush endpoints, which need no engine).
const SLEEP_PATHS: [&str; 13] = [
    "/",
    "/health",
    "/v1/health",
    "/models",
    "/v1/models",
    "/props",
    "/metrics",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/get_load",
    "/flush_cache",
];

/// Any other endpoint wakes a sleeping server (`--sleep-idle-seconds`) before it answers.
async fn wake(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if !SLEEP_PATHS.contains(&req.uri().path()) {
        st.sched.wake().await;
    }
    next.run(req).await
}

/// The GET endpoints.
fn get_routes() -> Vec<(&'static str, MethodRouter<Arc<AppState>>)> {
    vec![
        // Clients probe the root before anything else (Claude Code sends `HEAD /`); llama-server
        // serves its web UI there, which specd has not: it answers as `/health` does.
        ("/", get(api::health)),
        ("/health", get(api::health)),
        ("/v1/health", get(api::health)),
        ("/models", get(api::models)),
        ("/v1/models", get(api::models)),
        ("/props", get(api::props)),
        ("/tokenizer_info", get(api::tokenizer_info)),
        ("/slots", get(api::slots)),
        ("/metrics", get(metrics::metrics)),
        // What SGLang's model gateway reads from a worker (see `sglang.rs`).
        ("/server_info", get(sglang::server_info)),
        ("/get_server_info", get(sglang::server_info)),
        ("/model_info", get(sglang::model_info)),
        ("/get_model_info", get(sglang::model_info)),
        ("/get_load", get(sglang::get_load)),
        ("/health_generate", get(sglang::health_generate)),
        // SGLang serves it on GET and POST; the gateway POSTs.
        (
            "/flush_cache",
            get(sglang::flush_cache).post(sglang::flush_cache),
        ),
    ]
}

/// The POST endpoints, one table: the router serves them and Vertex AI's `@requestFormat`
/// names them.
fn post_routes() -> Vec<(&'static str, MethodRouter<Arc<AppState>>)> {
    vec![
        ("/tokenize", post(api::tokenize)),
        ("/detokenize", post(api::detokenize)),
        ("/apply-template", post(api::apply_template)),
        ("/completion", post(generate::completion)),
        ("/completions", post(generate::completion)),
        ("/infill", post(generate::infill)),
        ("/v1/completions", post(generate::oai_completion)),
        ("/chat/completions", post(generate::chat)),
        ("/v1/chat/completions", post(generate::chat)),
        (
            "/chat/completions/input_tokens",
            post(generate::chat_input_tokens),
        ),
        (
            "/v1/chat/completions/input_tokens",
            post(generate::chat_input_tokens),
        ),
        ("/v1/responses", post(generate::responses)),
        ("/responses", post(generate::responses)),
        (
            "/v1/responses/input_tokens",
            post(generate::responses_input_tokens),
        ),
        (
            "/responses/input_tokens",
            post(generate::responses_input_tokens),
        ),
        ("/v1/messages", post(generate::messages)),
        (
            "/v1/messages/count_tokens",
            post(generate::messages_count_tokens),
        ),
        ("/slots/{id_slot}", post(slots::action)),
        ("/v1/streams/lookup", post(resume::lookup)),
    ]
}

/// Paths of the POST endpoints.
pub(crate) fn post_paths() -> Vec<&'static str> {
    post_routes().into_iter().map(|(p, _)| p).collect()
}

/// The endpoints without middleware (Vertex AI's predict route dispatches its instances here).
pub(crate) fn api_routes(st: Arc<AppState>) -> Router {
    let mut r = Router::new();
    for (path, handler) in get_routes().into_iter().chain(post_routes()) {
        r = r.route(path, handler);
    }
    if let Some(v) = &st.cfg.vertex {
        if let Some(h) = &v.health_route {
            r = r.route(h, get(api::health));
        }
        r = r.route(&v.predict_route, post(vertex::predict));
    }
    r = r.route("/v1/stream", get(resume::read).delete(resume::stop));
    r.route_layer(axum::middleware::from_fn_with_state(
        st.clone(),
        resume::detach,
    ))
    .route_layer(axum::middleware::from_fn_with_state(st.clone(), wake))
    .fallback(api::not_found)
    // A known path with another method: llama-server's 404, not axum's empty 405.
    .method_not_allowed_fallback(api::not_found)
    .with_state(st)
}

/// The HTTP routes with their middleware (authentication, logging, body limits, CORS).
pub fn router(st: Arc<AppState>) -> Router {
    let routes = api_routes(st.clone())
        .layer(axum::middleware::from_fn_with_state(st.clone(), auth))
        .layer(axum::middleware::from_fn_with_state(
            st.clone(),
            log_requests,
        ))
        .layer(DefaultBodyLimit::max(st.cfg.body_limit))
        .layer(axum::middleware::from_fn_with_state(st.clone(), limit_body));
    // CORS wraps the routing: a preflight is answered on any path, before routing and auth.
    // Outside it, every error answer gets a JSON body; outermost, the Host check refuses a
    // rebinding page before anything else runs (its answer is JSON already).
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn_with_state(
            st.clone(),
            cors::layer,
        ))
        .layer(axum::middleware::from_fn(error::json_errors))
        .layer(axum::middleware::from_fn_with_state(st, check_host))
}

pub use conn::Listener;

/// Serves the same routes on every listener until Ctrl-C / SIGTERM.
pub async fn serve(st: Arc<AppState>, listeners: Vec<Listener>) -> std::io::Result<()> {
    let mut signals = ShutdownSignals::install();
    let app = router(st.clone());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    for l in listeners {
        let mut stopped = stopped.clone();
        let signal = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        servers.spawn(conn::serve(l, app.clone(), signal, st.cfg.timeout));
    }
    // The first signal stops accepting connections; running requests may finish within the
    // grace period (a second signal ends it at once), then they are cancelled, each ending with
    // an error its client can read.
    tokio::spawn(async move {
        signals.recv().await;
        let _ = stop.send(true);
        let grace = st.cfg.shutdown_grace;
        eprintln!(
            "specd: shutting down: no new connections; running requests have {} s to finish (--shutdown-grace)",
            grace.as_secs_f64()
        );
        tokio::select! {
            _ = tokio::time::sleep(grace) => {},
            _ = signals.recv() => {},
        }
        if st.sched.snapshot().slots.iter().any(|s| s.processing) {
            eprintln!("specd: grace period over: cancelling the running requests");
        }
        st.cancel_all.send_replace(true);
    });
    while let Some(r) = servers.join_next().await {
        r.map_err(std::io::Error::other)??;
    }
    Ok(())
}

/// SIGINT and SIGTERM, listened for from the moment this is made: made before any listener
/// serves, so a signal that arrives once the server answers is never missed (a handler
/// registered lazily, on a task's first poll, left a window in which SIGINT killed the process).
struct ShutdownSignals {
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let int = signal(SignalKind::interrupt());
            let term = signal(SignalKind::terminate());
            if let Err(e) = int.as_ref().and(term.as_ref()) {
                eprintln!("specd: warning: cannot listen for shutdown signals: {e}");
            }
            Self {
                int: int.ok(),
                term: term.ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits for the next SIGINT or SIGTERM.
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = next(&mut self.int) => {},
                _ = next(&mut self.term) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        eprintln!("specd: shutting down");
    }
}
