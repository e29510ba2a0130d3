//! The command line of `specd serve` as clap parses it (after [`super::llama_flags`] has mapped
//! llama-server's spellings onto it).

use crate::generate::{ModelArgs, SamplingArgs, SpecArgs};
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
// As in llama-server, a flag given twice takes its last value.
#[command(args_override_self = true)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Addresses to listen on, comma-separated (IPv4, IPv6, names, or UNIX socket paths ending
    /// in .sock).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, with one TCP address; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Let other processes bind the same port (SO_REUSEPORT).
    #[arg(long = "reuse-port")]
    pub reuse_port: bool,
    /// Parallel slots (-np). Default (or -1): 4 slots sharing the context (--kv-unified).
    #[arg(long = "parallel", allow_hyphen_values = true)]
    pub parallel: Option<i64>,
    /// Context limit of each slot, the slots sharing the context (--kv-unified).
    #[arg(long = "kv-unified-per-slot")]
    pub kv_unified_per_slot: Option<usize>,
    /// Tokens to generate per request unless it says (-1: until end of generation or the
    /// context is full).
    #[arg(
        short = 'n',
        long = "n-predict",
        alias = "predict",
        default_value_t = -1,
        allow_hyphen_values = true
    )]
    pub n_predict: i64,
    /// llama-server's logical batch (`-b`, which sets it): the budget of an /infill prompt's
    /// prefix (3/4 of it) and suffix (1/4), as llama-server lays them out.
    #[arg(long = "infill-batch", default_value_t = 2048)]
    pub infill_batch: usize,
    /// Locally typical sampling (1.0 = off).
    #[arg(long = "typical", alias = "typical-p", default_value_t = 1.0)]
    pub typical: f32,
    /// Do not stop at end-of-generation tokens (default of every request).
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Recurrent-state checkpoints kept per slot for prompt reuse.
    #[arg(
        long = "ctx-checkpoints",
        alias = "swa-checkpoints",
        default_value_t = 8
    )]
    pub ctx_checkpoints: usize,
    /// MiB of the prompt cache in RAM: the memory (KV and recurrent state) of conversations
    /// whose slot another request took, restored when they continue (-1: no limit, 0: off).
    #[arg(long = "cache-ram", default_value_t = 8192, allow_hyphen_values = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub cache_ram: i64,
    /// With a unified memory (--kv-unified): when a request starts, move the other idle slots'
    /// memory into the prompt cache in RAM (default, as llama-server; needs --cache-ram).
    #[arg(long = "cache-idle-slots", overrides_with = "no_cache_idle_slots")]
    pub cache_idle_slots: bool,
    #[arg(long = "no-cache-idle-slots")]
    pub no_cache_idle_slots: bool,
    /// Read / write timeout in seconds (llama-server's `-to`): a request's head and body must
    /// arrive within it (else 408), and a client must take each part of an answer within it
    /// (else the connection is closed and its slot freed).
    #[arg(long = "timeout", default_value_t = 3600)]
    pub timeout: u64,
    /// Request workers: CPU work of requests before the engine (JSON bodies, chat templates,
    /// tokenizing) runs on at most this many threads, never on the threads that answer
    /// `/health`; up to 16 requests per worker wait, more are refused with 503 (-1: one per
    /// CPU core).
    #[arg(long = "threads-http", default_value_t = -1, allow_hyphen_values = true)]
    pub threads_http: i64,
    /// Most bytes of request bodies in flight at once (arriving, waiting or being processed); a
    /// body that does not fit is refused with 503 before it is read. Default: 4 × the body limit.
    #[arg(long = "max-pending-bytes")]
    pub max_pending_bytes: Option<usize>,
    /// Seconds running requests may go on after SIGTERM / SIGINT (no new connections are taken
    /// meanwhile); then they are cancelled, each ending with an error, and the server exits 0.
    /// A second signal cancels them at once.
    #[arg(long = "shutdown-grace", default_value_t = 20.0)]
    pub shutdown_grace: f64,
    /// API keys, comma-separated (clients send `Authorization: Bearer KEY`).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// File with API keys, one per line (`#` starts a comment).
    #[arg(long = "api-key-file")]
    pub api_key_file: Option<PathBuf>,
    /// Serve Prometheus metrics at /metrics.
    #[arg(long)]
    pub metrics: bool,
    /// /metrics with every counter's name ending in `_total` (llama-server's
    /// `llamacpp:n_tokens_max` counter becomes a gauge): OpenMetrics parsers such as SGLang's
    /// model gateway refuse the page otherwise.
    #[arg(long = "metrics-strict")]
    pub metrics_strict: bool,
    /// Serve /slots (default).
    #[arg(long = "slots", overrides_with = "no_slots")]
    pub slots: bool,
    /// Do not serve /slots.
    #[arg(long = "no-slots")]
    pub no_slots: bool,
    /// Model names in the API, comma-separated (the first in sorted order is the id; default:
    /// the model path).
    #[arg(short = 'a', long = "alias")]
    pub alias: Option<String>,
    /// Model tags, comma-separated (shown by /v1/models).
    #[arg(long)]
    pub tags: Option<String>,
    /// Chat template: Jinja source, or the name of one of llama.cpp's built-in templates
    /// (`chatml`, `llama3`, `command-r`, …; an unknown name lists them).
    #[arg(long = "chat-template")]
    pub chat_template: Option<String>,
    /// File holding a Jinja chat template.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
    /// JSON object of variables every chat template render sees, e.g.
    /// '{"enable_thinking": false}' (a request's `chat_template_kwargs` override them).
    #[arg(long = "chat-template-kwargs")]
    pub chat_template_kwargs: Option<String>,
    /// Thinking in chat templates: `on` / `off` render them with `enable_thinking` true / false;
    /// `auto` leaves it to the template (on where it has reasoning markers).
    #[arg(long = "reasoning", num_args = 0..=1, default_missing_value = "on")]
    pub reasoning: Option<String>,
    /// Templates keep the reasoning of earlier assistant turns (`preserve_reasoning`; default).
    #[arg(long = "reasoning-preserve", overrides_with = "no_reasoning_preserve")]
    pub reasoning_preserve: bool,
    #[arg(long = "no-reasoning-preserve")]
    pub no_reasoning_preserve: bool,
    /// Reasoning effort level templates see (`reasoning_effort`: `low`, `medium`, `high`, …);
    /// `default` leaves it to the template.
    #[arg(long = "reasoning-effort")]
    pub reasoning_effort: Option<String>,
    /// Render chat templates with Jinja (always on in specd).
    #[arg(long = "jinja", overrides_with = "no_jinja")]
    pub jinja: bool,
    #[arg(long = "no-jinja")]
    pub no_jinja: bool,
    /// Where chat answers' reasoning goes: `none` (left in the content), `deepseek`
    /// (`reasoning_content`), `deepseek-legacy` (as deepseek, as llama-server answers), `auto`
    /// (= deepseek).
    #[arg(long = "reasoning-format", default_value = "auto", value_parser = ["none", "deepseek", "deepseek-legacy", "auto"])]
    pub reasoning_format: String,
    /// Tokens a thinking block may run before its end tag is forced: -1 no limit, 0 close at
    /// once (requests: `reasoning_budget_tokens` / `thinking_budget_tokens`).
    #[arg(long = "reasoning-budget", default_value_t = -1, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub reasoning_budget: i64,
    /// Text forced before the end-of-thinking tag when the budget runs out (requests:
    /// `reasoning_budget_message`).
    #[arg(long = "reasoning-budget-message", default_value = "")]
    pub reasoning_budget_message: String,
    /// CORS origins, comma-separated: `localhost` (default: pages served from this machine —
    /// `localhost`, `127.0.0.1`, `[::1]`, any port), `*` (any page may call the server and read
    /// its answers: llama-server's default; use with --api-key), or a list of origins.
    #[arg(long = "cors-origins")]
    pub cors_origins: Option<String>,
    /// Host names a server listening on a loopback address answers besides `localhost`,
    /// `127.0.0.1` and `[::1]`, comma-separated (`.example.test`: the domain and its
    /// subdomains); requests naming another `Host` get 403 (protection against DNS rebinding).
    /// `*`: any host, no check. Servers bound to other addresses are not checked.
    #[arg(long = "allowed-hosts")]
    pub allowed_hosts: Option<String>,
    /// Methods a CORS preflight allows.
    #[arg(long = "cors-methods", default_value = "GET, POST, DELETE, OPTIONS")]
    pub cors_methods: String,
    /// Headers a CORS preflight allows.
    #[arg(long = "cors-headers", default_value = "*")]
    pub cors_headers: String,
    /// Allow credentials in CORS requests (default).
    #[arg(long = "cors-credentials", overrides_with = "no_cors_credentials")]
    pub cors_credentials: bool,
    #[arg(long = "no-cors-credentials")]
    pub no_cors_credentials: bool,
    /// Directory for slot save / restore files (`POST /slots/ID?action=save|restore|erase`).
    #[arg(long = "slot-save-path")]
    pub slot_save_path: Option<PathBuf>,
    /// Every slot may use the whole context (otherwise each gets ctx-size / parallel).
    #[arg(long = "kv-unified", overrides_with = "no_kv_unified")]
    pub kv_unified: bool,
    #[arg(long = "no-kv-unified")]
    pub no_kv_unified: bool,
    /// Log every request, and the server's debug messages (SPECD_LOG, if set, decides).
    #[arg(short = 'v', long = "verbose", alias = "log-verbose")]
    pub verbose: bool,
    /// Continue a final assistant message instead of answering it (default).
    #[arg(long = "prefill-assistant", overrides_with = "no_prefill_assistant")]
    pub prefill_assistant: bool,
    #[arg(long = "no-prefill-assistant")]
    pub no_prefill_assistant: bool,
    /// Shift the context when it fills (not possible with recurrent state: refused).
    #[arg(long = "context-shift", overrides_with = "no_context_shift")]
    pub context_shift: bool,
    #[arg(long = "no-context-shift")]
    pub no_context_shift: bool,
    /// Reuse a slot's memory for the common prompt prefix (default; per request `cache_prompt`).
    #[arg(long = "cache-prompt", overrides_with = "no_cache_prompt")]
    pub cache_prompt: bool,
    #[arg(long = "no-cache-prompt")]
    pub no_cache_prompt: bool,
    /// Default grammar (GBNF) of requests that give none.
    #[arg(long = "grammar")]
    pub grammar: Option<String>,
    #[arg(long = "grammar-file")]
    pub grammar_file: Option<PathBuf>,
    /// Default JSON schema of requests that give none.
    #[arg(long = "json-schema")]
    pub json_schema: Option<String>,
    #[arg(long = "json-schema-file")]
    pub json_schema_file: Option<PathBuf>,
    /// Release the engine's memory after this many idle seconds (-1: never); the next request
    /// that needs the model wakes it.
    #[arg(long = "sleep-idle-seconds", default_value_t = -1, allow_hyphen_values = true)]
    pub sleep_idle_seconds: i64,
    /// llama-server's built-in agent tools: accepted, not available in specd (a warning says
    /// so); they make CORS default to localhost, as in llama-server.
    #[arg(long = "tools", hide = true)]
    pub tools: Option<String>,
    /// llama-server's MCP servers: accepted like --tools.
    #[arg(long = "mcp-servers-config", hide = true)]
    pub mcp_servers_config: Option<String>,
    #[arg(long = "mcp-servers-json", hide = true)]
    pub mcp_servers_json: Option<String>,
    /// llama-server's agent mode (all tools and the web UI's MCP proxy): accepted like --tools.
    #[arg(long = "agent", hide = true, overrides_with = "no_agent")]
    pub agent: bool,
    #[arg(long = "no-agent", hide = true)]
    pub no_agent: bool,
}
