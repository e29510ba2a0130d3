//! llama-server's command line and `LLAMA_ARG_*` environment on `specd serve`.
//!
//! [`OPTIONS`] lists llama-server's options (as in its `common/arg.cpp`) once each: every
//! spelling, how it takes a value, the environment variable that sets it, and what specd does
//! with it. [`preprocess`] rewrites a command line (plus the environment) with it before clap
//! sees the arguments: short and alternative spellings become the long flag specd's parser knows,
//! options that mean nothing for specd are dropped with a one-line warning, options specd cannot
//! honour are an error saying why. Flags the table does not list (specd's own, or typos) go to
//! clap unchanged.

use std::collections::HashSet;
use std::ffi::OsString;

/// How an option takes its value.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Val {
    /// A switch.
    None,
    /// One value.
    One,
    /// An optional value, taken if it is one of these (older llama-servers had `-fa` as a switch).
    Opt(&'static [&'static str]),
}

/// What specd does with a llama-server option.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Does {
    /// specd's parser takes it: every spelling becomes the first `--` name of `names`, and
    /// every negative spelling the first `--` name of `neg`.
    Take,
    /// specd's parser takes it under another name: (positive, negative).
    As(&'static str, &'static str),
    /// It changes nothing in specd: dropped with a warning giving the reason.
    Ignore(&'static str),
    /// specd cannot honour it: an error giving the reason.
    Refuse(&'static str),
}

/// One llama-server option.
struct Opt {
    /// Its spellings.
    names: &'static [&'static str],
    /// Spellings that turn it off (`--no-…`); `LLAMA_ARG_NO_…` sets those from the environment.
    neg: &'static [&'static str],
    val: Val,
    /// The environment variable llama-server reads it from (the command line wins).
    env: Option<&'static str>,
    does: Does,
}

const fn opt(names: &'static [&'static str], val: Val, does: Does) -> Opt {
    Opt {
        names,
        neg: &[],
        val,
        env: None,
        does,
    }
}

impl Opt {
    const fn env(mut self, env: &'static str) -> Opt {
        self.env = Some(env);
        self
    }
    const fn neg(mut self, neg: &'static [&'static str]) -> Opt {
        self.neg = neg;
        self
    }
    /// Whether it takes the argument `next` as its value (when not given inline).
    fn takes(&self, next: Option<&str>) -> bool {
        match self.val {
            Switch => false,
            One => true,
            Val::Opt(ok) => next.is_some_and(|v| ok.contains(&v.to_ascii_lowercase().as_str())),
        }
    }
    /// The flag it is shown as (its first long spelling).
    fn long(&self) -> &'static str {
        long_of(self.names)
    }
}

fn long_of(names: &'static [&'static str]) -> &'static str {
    names
        .iter()
        .find(|n| n.starts_with("--"))
        .or(names.first())
        .copied()
        .unwrap_or("")
}

use Does::*;
use Val::{None as Switch, One};

const ON_OFF: &[&str] = &[
    "on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled",
];

// Reasons shown with ignored flags.
const CPU: &str = "specd computes on the CPU";
const NO_EFFECT: &str = "no effect on specd's engine";
const THREADS: &str = "specd's compute threads are set by -t";
const LOGS: &str = "specd logs to stderr (SPECD_LOG sets the level)";
const NO_UI: &str = "specd serves the API only, no web UI";
const NO_TOOLS: &str = "specd has no built-in agent tools";
const MEDIA: &str = "only used with a multimodal projector, which specd does not load";
const ROUTER: &str = "only used in router mode (--models-dir), which specd does not have";
const NGRAM: &str = "specd's n-gram drafters size themselves";
const REASONING: &str = "specd does not implement this reasoning control";

// Reasons shown with refused flags.
const DOWNLOAD: &str = "specd does not download models: give a local GGUF file with -m";
const LORA: &str = "LoRA adapters and control vectors are not implemented";
const MULTIMODAL: &str = "specd serves text models only (no multimodal projector)";
const EMBED: &str = "embeddings and reranking are not implemented";
const ROPE: &str = "RoPE/YaRN context extension is not implemented";
const SAMPLER: &str = "this sampler is not implemented in specd";
const CHAIN: &str = "specd's sampler chain has a fixed order";

/// llama-server's options (those of `llama-server --help`), each once.
static OPTIONS: &[Opt] = &[
    // General.
    opt(&["-h", "--help"], Switch, Take),
    opt(&["--usage"], Switch, As("--help", "")),
    opt(&["--version"], Switch, Take),
    opt(
        &["--completion-bash"],
        Switch,
        Refuse("not available: see specd serve --help"),
    ),
    opt(
        &["-cl", "--cache-list"],
        Switch,
        Refuse("specd keeps no download cache"),
    ),
    opt(&["--list-devices"], Switch, Refuse(CPU)),
    // Threads and CPU placement.
    opt(&["-t", "--threads"], One, Take).env("LLAMA_ARG_THREADS"),
    opt(&["-tb", "--threads-batch"], One, Ignore(THREADS)),
    opt(&["-C", "--cpu-mask"], One, Ignore(THREADS)),
    opt(&["-Cr", "--cpu-range"], One, Ignore(THREADS)),
    opt(&["--cpu-strict"], One, Ignore(THREADS)),
    opt(&["--prio"], One, Ignore(THREADS)),
    opt(&["--poll"], One, Ignore(THREADS)),
    opt(&["-Cb", "--cpu-mask-batch"], One, Ignore(THREADS)),
    opt(&["-Crb", "--cpu-range-batch"], One, Ignore(THREADS)),
    opt(&["--cpu-strict-batch"], One, Ignore(THREADS)),
    opt(&["--prio-batch"], One, Ignore(THREADS)),
    opt(&["--poll-batch"], One, Ignore(THREADS)),
    opt(&["--numa"], One, Ignore(THREADS)).env("LLAMA_ARG_NUMA"),
    // Context, batches, cache.
    opt(&["-c", "--ctx-size"], One, Take).env("LLAMA_ARG_CTX_SIZE"),
    opt(&["--kv-unified-per-slot"], One, Take).env("LLAMA_ARG_KV_UNIFIED_PER_SLOT"),
    opt(
        &["-n", "--predict", "--n-predict"],
        One,
        As("--n-predict", ""),
    )
    .env("LLAMA_ARG_N_PREDICT"),
    opt(&["-b", "--batch-size"], One, Take).env("LLAMA_ARG_BATCH"),
    opt(&["-ub", "--ubatch-size"], One, Take).env("LLAMA_ARG_UBATCH"),
    opt(&["--keep"], One, Ignore("specd does not shift the context")),
    opt(&["--swa-full"], Switch, Ignore(NO_EFFECT)).env("LLAMA_ARG_SWA_FULL"),
    opt(
        &["-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"],
        One,
        Take,
    )
    .env("LLAMA_ARG_CTX_CHECKPOINTS"),
    opt(&["-cms", "--checkpoint-min-step"], One, Ignore(NO_EFFECT))
        .env("LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"),
    opt(&["-cram", "--cache-ram"], One, Take).env("LLAMA_ARG_CACHE_RAM"),
    opt(&["-kvu", "--kv-unified"], Switch, Take)
        .neg(&["-no-kvu", "--no-kv-unified"])
        .env("LLAMA_ARG_KV_UNIFIED"),
    opt(&["--cache-idle-slots"], Switch, Take)
        .neg(&["--no-cache-idle-slots"])
        .env("LLAMA_ARG_CACHE_IDLE_SLOTS"),
    opt(&["--context-shift"], Switch, Take)
        .neg(&["--no-context-shift"])
        .env("LLAMA_ARG_CONTEXT_SHIFT"),
    opt(&["-fa", "--flash-attn"], Val::Opt(ON_OFF), Ignore(CPU)).env("LLAMA_ARG_FLASH_ATTN"),
    opt(&["--perf"], Switch, Ignore(NO_EFFECT))
        .neg(&["--no-perf"])
        .env("LLAMA_ARG_PERF"),
    opt(&["-e", "--escape"], Switch, Ignore(NO_EFFECT)).neg(&["--no-escape"]),
    opt(
        &["-r", "--reverse-prompt"],
        One,
        Ignore("give stop strings per request"),
    ),
    opt(&["-sp", "--special"], Switch, Ignore(NO_EFFECT)),
    opt(&["--warmup"], Switch, Ignore(NO_EFFECT)).neg(&["--no-warmup"]),
    opt(
        &["--spm-infill"],
        Switch,
        Ignore("specd lays out /infill prompts prefix first (PSM)"),
    ),
    // Sampling.
    opt(&["--samplers"], One, Refuse(CHAIN)),
    opt(&["-s", "--seed"], One, Take),
    opt(&["--sampler-seq", "--sampling-seq"], One, Refuse(CHAIN)),
    opt(&["--ignore-eos"], Switch, Take),
    opt(&["--temp", "--temperature"], One, Take).env("LLAMA_ARG_TEMPERATURE"),
    opt(&["--top-k"], One, Take).env("LLAMA_ARG_TOP_K"),
    opt(&["--top-p"], One, Take).env("LLAMA_ARG_TOP_P"),
    opt(&["--min-p"], One, Take).env("LLAMA_ARG_MIN_P"),
    opt(&["--top-nsigma", "--top-n-sigma"], One, Refuse(SAMPLER)),
    opt(&["--xtc-probability"], One, Refuse(SAMPLER)),
    opt(&["--xtc-threshold"], One, Refuse(SAMPLER)),
    opt(&["--typical", "--typical-p"], One, Take),
    opt(&["--repeat-last-n"], One, Take),
    opt(&["--repeat-penalty"], One, Take).env("LLAMA_ARG_REPEAT_PENALTY"),
    opt(&["--presence-penalty"], One, Take).env("LLAMA_ARG_PRESENCE_PENALTY"),
    opt(&["--frequency-penalty"], One, Take).env("LLAMA_ARG_FREQUENCY_PENALTY"),
    opt(&["--dry-multiplier"], One, Refuse(SAMPLER)),
    opt(&["--dry-base"], One, Refuse(SAMPLER)),
    opt(&["--dry-allowed-length"], One, Refuse(SAMPLER)),
    opt(&["--dry-penalty-last-n"], One, Refuse(SAMPLER)),
    opt(&["--dry-sequence-breaker"], One, Refuse(SAMPLER)),
    opt(&["--adaptive-target"], One, Refuse(SAMPLER)),
    opt(&["--adaptive-decay"], One, Refuse(SAMPLER)),
    opt(&["--dynatemp-range"], One, Refuse(SAMPLER)),
    opt(&["--dynatemp-exp"], One, Refuse(SAMPLER)),
    opt(&["--mirostat"], One, Refuse(SAMPLER)),
    opt(&["--mirostat-lr"], One, Refuse(SAMPLER)),
    opt(&["--mirostat-ent"], One, Refuse(SAMPLER)),
    opt(&["-l", "--logit-bias"], One, Take),
    opt(&["--grammar"], One, Take),
    opt(&["--grammar-file"], One, Take),
    opt(&["-j", "--json-schema"], One, Take),
    opt(&["-jf", "--json-schema-file"], One, Take),
    opt(&["-bs", "--backend-sampling"], Switch, Ignore(CPU)).env("LLAMA_ARG_BACKEND_SAMPLING"),
    // Model structure.
    opt(&["--pooling"], One, Refuse(EMBED)).env("LLAMA_ARG_POOLING"),
    opt(&["--rope-scaling"], One, Refuse(ROPE)).env("LLAMA_ARG_ROPE_SCALING_TYPE"),
    opt(&["--rope-scale"], One, Refuse(ROPE)).env("LLAMA_ARG_ROPE_SCALE"),
    opt(&["--rope-freq-base"], One, Refuse(ROPE)).env("LLAMA_ARG_ROPE_FREQ_BASE"),
    opt(&["--rope-freq-scale"], One, Refuse(ROPE)).env("LLAMA_ARG_ROPE_FREQ_SCALE"),
    opt(&["--yarn-orig-ctx"], One, Refuse(ROPE)).env("LLAMA_ARG_YARN_ORIG_CTX"),
    opt(&["--yarn-ext-factor"], One, Refuse(ROPE)).env("LLAMA_ARG_YARN_EXT_FACTOR"),
    opt(&["--yarn-attn-factor"], One, Refuse(ROPE)).env("LLAMA_ARG_YARN_ATTN_FACTOR"),
    opt(&["--yarn-beta-slow"], One, Refuse(ROPE)).env("LLAMA_ARG_YARN_BETA_SLOW"),
    opt(&["--yarn-beta-fast"], One, Refuse(ROPE)).env("LLAMA_ARG_YARN_BETA_FAST"),
    // Memory placement.
    opt(&["-kvo", "--kv-offload"], Switch, Ignore(CPU))
        .neg(&["-nkvo", "--no-kv-offload"])
        .env("LLAMA_ARG_KV_OFFLOAD"),
    opt(&["--repack"], Switch, Ignore(NO_EFFECT))
        .neg(&["-nr", "--no-repack"])
        .env("LLAMA_ARG_REPACK"),
    opt(&["--no-host"], Switch, Ignore(CPU)).env("LLAMA_ARG_NO_HOST"),
    opt(&["-ctk", "--cache-type-k"], One, Take).env("LLAMA_ARG_CACHE_TYPE_K"),
    opt(&["-ctv", "--cache-type-v"], One, Take).env("LLAMA_ARG_CACHE_TYPE_V"),
    opt(&["-dt", "--defrag-thold"], One, Ignore(NO_EFFECT)).env("LLAMA_ARG_DEFRAG_THOLD"),
    opt(&["-np", "--parallel"], One, Take).env("LLAMA_ARG_N_PARALLEL"),
    opt(
        &["-cb", "--cont-batching"],
        Switch,
        Ignore("specd always batches continuously"),
    )
    .neg(&["-nocb", "--no-cont-batching"])
    .env("LLAMA_ARG_CONT_BATCHING"),
    // Multimodal.
    opt(&["-mm", "--mmproj"], One, Refuse(MULTIMODAL)).env("LLAMA_ARG_MMPROJ"),
    opt(&["-mmu", "--mmproj-url"], One, Refuse(MULTIMODAL)).env("LLAMA_ARG_MMPROJ_URL"),
    // Without -hf (refused) llama-server has no projector to fetch either.
    opt(&["--mmproj-auto"], Switch, Ignore(MULTIMODAL))
        .neg(&["--no-mmproj", "--no-mmproj-auto"])
        .env("LLAMA_ARG_MMPROJ_AUTO"),
    opt(&["--mmproj-offload"], Switch, Ignore(MEDIA))
        .neg(&["--no-mmproj-offload"])
        .env("LLAMA_ARG_MMPROJ_OFFLOAD"),
    opt(&["-mmdev", "--mmproj-device"], One, Ignore(MEDIA)),
    opt(&["--image-min-tokens"], One, Ignore(MEDIA)).env("LLAMA_ARG_IMAGE_MIN_TOKENS"),
    opt(&["--image-max-tokens"], One, Ignore(MEDIA)).env("LLAMA_ARG_IMAGE_MAX_TOKENS"),
    opt(&["--mtmd-batch-max-tokens"], One, Ignore(MEDIA)).env("LLAMA_ARG_MTMD_BATCH_MAX_TOKENS"),
    opt(&["--video-fps"], One, Ignore(MEDIA)).env("LLAMA_ARG_VIDEO_FPS"),
    opt(&["--video-timestamp-interval"], One, Ignore(MEDIA))
        .env("LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL"),
    opt(&["--video-ffmpeg-dir"], One, Ignore(MEDIA)).env("LLAMA_ARG_VIDEO_FFMPEG_DIR"),
    opt(&["--media-path"], One, Ignore(MEDIA)),
    // Devices and weight placement.
    opt(&["--rpc"], One, Ignore(CPU)).env("LLAMA_ARG_RPC"),
    opt(&["-lm", "--load-mode"], One, Ignore(NO_EFFECT)).env("LLAMA_ARG_LOAD_MODE"),
    opt(&["-lzm", "--lazy-mode"], One, Ignore(NO_EFFECT)).env("LLAMA_ARG_LAZY_MODE"),
    opt(&["-dev", "--device"], One, Ignore(CPU)).env("LLAMA_ARG_DEVICE"),
    opt(&["-ot", "--override-tensor"], One, Ignore(CPU)).env("LLAMA_ARG_OVERRIDE_TENSOR"),
    opt(&["-cmoe", "--cpu-moe"], Switch, Ignore(CPU)).env("LLAMA_ARG_CPU_MOE"),
    opt(&["-ncmoe", "--n-cpu-moe"], One, Ignore(CPU)).env("LLAMA_ARG_N_CPU_MOE"),
    opt(&["-ncffn", "--n-cpu-ffn"], One, Ignore(CPU)).env("LLAMA_ARG_N_CPU_FFN"),
    opt(
        &["-ngl", "--gpu-layers", "--n-gpu-layers"],
        One,
        Ignore(CPU),
    )
    .env("LLAMA_ARG_N_GPU_LAYERS"),
    opt(&["-sm", "--split-mode"], One, Ignore(CPU)).env("LLAMA_ARG_SPLIT_MODE"),
    opt(&["-ts", "--tensor-split"], One, Ignore(CPU)).env("LLAMA_ARG_TENSOR_SPLIT"),
    opt(&["-mg", "--main-gpu"], One, Ignore(CPU)).env("LLAMA_ARG_MAIN_GPU"),
    opt(&["-fit", "--fit"], Val::Opt(ON_OFF), Ignore(CPU)).env("LLAMA_ARG_FIT"),
    opt(&["-fitt", "--fit-target"], One, Ignore(CPU)).env("LLAMA_ARG_FIT_TARGET"),
    opt(&["-fitc", "--fit-ctx"], One, Ignore(CPU)).env("LLAMA_ARG_FIT_CTX"),
    opt(&["--check-tensors"], Switch, Ignore(NO_EFFECT)),
    opt(
        &["--override-kv"],
        One,
        Refuse("model metadata overrides are not implemented"),
    ),
    opt(&["--op-offload"], Switch, Ignore(CPU)).neg(&["--no-op-offload"]),
    opt(&["--mlock"], Switch, Ignore(NO_EFFECT)),
    opt(&["--mmap"], Switch, Ignore(NO_EFFECT)).neg(&["--no-mmap"]),
    opt(&["--lora"], One, Refuse(LORA)),
    opt(&["--lora-scaled"], One, Refuse(LORA)),
    opt(&["--lora-init-without-apply"], Switch, Refuse(LORA)),
    opt(&["--control-vector"], One, Refuse(LORA)),
    opt(&["--control-vector-scaled"], One, Refuse(LORA)),
    // Takes two values; refused before they matter.
    opt(&["--control-vector-layer-range"], One, Refuse(LORA)),
    // The model.
    opt(&["-a", "--alias"], One, Take).env("LLAMA_ARG_ALIAS"),
    opt(&["--tags"], One, Take).env("LLAMA_ARG_TAGS"),
    opt(&["-m", "--model"], One, Take).env("LLAMA_ARG_MODEL"),
    opt(&["-mu", "--model-url"], One, Refuse(DOWNLOAD)).env("LLAMA_ARG_MODEL_URL"),
    opt(&["-dr", "--docker-repo"], One, Refuse(DOWNLOAD)).env("LLAMA_ARG_DOCKER_REPO"),
    opt(&["-hf", "-hfr", "--hf-repo"], One, Refuse(DOWNLOAD)).env("LLAMA_ARG_HF_REPO"),
    opt(&["-hff", "--hf-file"], One, Refuse(DOWNLOAD)).env("LLAMA_ARG_HF_FILE"),
    // HF_TOKEN is every Hugging Face tool's variable: not read here.
    opt(
        &["-hft", "--hf-token"],
        One,
        Ignore("specd does not download models"),
    ),
    opt(&["--embd-normalize"], One, Ignore(EMBED)),
    // The server.
    opt(&["--host"], One, Take).env("LLAMA_ARG_HOST"),
    opt(&["--port"], One, Take).env("LLAMA_ARG_PORT"),
    opt(&["--reuse-port"], Switch, Take).env("LLAMA_ARG_REUSE_PORT"),
    opt(&["--path"], One, Ignore(NO_UI)).env("LLAMA_ARG_STATIC_PATH"),
    opt(&["--cors-origins"], One, Take).env("LLAMA_ARG_CORS_ORIGINS"),
    opt(&["--cors-methods"], One, Take).env("LLAMA_ARG_CORS_METHODS"),
    opt(&["--cors-headers"], One, Take).env("LLAMA_ARG_CORS_HEADERS"),
    opt(&["--cors-credentials"], Switch, Take)
        .neg(&["--no-cors-credentials"])
        .env("LLAMA_ARG_CORS_CREDENTIALS"),
    opt(
        &["--api-prefix"],
        One,
        Refuse("API path prefixes are not implemented"),
    )
    .env("LLAMA_ARG_API_PREFIX"),
    opt(&["--ui-config", "--webui-config"], One, Ignore(NO_UI)).env("LLAMA_ARG_UI_CONFIG"),
    opt(
        &["--ui-config-file", "--webui-config-file"],
        One,
        Ignore(NO_UI),
    )
    .env("LLAMA_ARG_UI_CONFIG_FILE"),
    opt(
        &["--ui-mcp-proxy", "--webui-mcp-proxy"],
        Switch,
        Ignore("specd has no web UI, nor the /cors-proxy it uses for MCP"),
    )
    .neg(&["--no-ui-mcp-proxy", "--no-webui-mcp-proxy"])
    .env("LLAMA_ARG_UI_MCP_PROXY"),
    // Built-in agent tools: accepted with a warning at start-up (they make CORS default to
    // localhost, as in llama-server).
    opt(&["--tools"], One, Take).env("LLAMA_ARG_TOOLS"),
    opt(&["--tools-runtime"], One, Ignore(NO_TOOLS)).env("LLAMA_ARG_TOOLS_RUNTIME"),
    opt(&["--mcp-servers-config"], One, Take).env("LLAMA_ARG_MCP_SERVERS_CONFIG"),
    opt(&["--mcp-servers-json"], One, Take).env("LLAMA_ARG_MCP_SERVERS_JSON"),
    opt(&["-ag", "--agent"], Switch, Take)
        .neg(&["-no-ag", "--no-agent"])
        .env("LLAMA_ARG_AGENT"),
    opt(&["--ui", "--webui"], Switch, Ignore(NO_UI))
        .neg(&["--no-ui", "--no-webui"])
        .env("LLAMA_ARG_UI"),
    opt(&["--embedding", "--embeddings"], Switch, Refuse(EMBED)).env("LLAMA_ARG_EMBEDDINGS"),
    opt(&["--rerank", "--reranking"], Switch, Refuse(EMBED)).env("LLAMA_ARG_RERANKING"),
    opt(&["--api-key"], One, Take).env("LLAMA_API_KEY"),
    opt(&["--api-key-file"], One, Take).env("LLAMA_ARG_API_KEY_FILE"),
    opt(
        &["--ssl-key-file"],
        One,
        Refuse("specd serves plain HTTP (put a TLS proxy in front)"),
    )
    .env("LLAMA_ARG_SSL_KEY_FILE"),
    opt(
        &["--ssl-cert-file"],
        One,
        Refuse("specd serves plain HTTP (put a TLS proxy in front)"),
    )
    .env("LLAMA_ARG_SSL_CERT_FILE"),
    opt(&["--chat-template-kwargs"], One, Take).env("LLAMA_ARG_CHAT_TEMPLATE_KWARGS"),
    opt(&["-to", "--timeout"], One, Take).env("LLAMA_ARG_TIMEOUT"),
    opt(&["--sse-ping-interval"], One, Ignore(NO_EFFECT)).env("LLAMA_ARG_SSE_PING_INTERVAL"),
    opt(&["--threads-http"], One, Take).env("LLAMA_ARG_THREADS_HTTP"),
    opt(&["--cache-prompt"], Switch, Take)
        .neg(&["--no-cache-prompt"])
        .env("LLAMA_ARG_CACHE_PROMPT"),
    opt(&["--cache-reuse"], One, Ignore(NO_EFFECT)).env("LLAMA_ARG_CACHE_REUSE"),
    opt(&["--metrics"], Switch, Take).env("LLAMA_ARG_ENDPOINT_METRICS"),
    opt(
        &["--props"],
        Switch,
        Ignore("specd's /props cannot be changed by POST"),
    )
    .env("LLAMA_ARG_ENDPOINT_PROPS"),
    opt(&["--slots"], Switch, Take)
        .neg(&["--no-slots"])
        .env("LLAMA_ARG_ENDPOINT_SLOTS"),
    opt(&["--slot-save-path"], One, Take),
    opt(
        &["--models-dir"],
        One,
        Refuse("router mode (several models) is not implemented: run one specd per model"),
    )
    .env("LLAMA_ARG_MODELS_DIR"),
    opt(
        &["--models-preset"],
        One,
        Refuse("router mode (several models) is not implemented: run one specd per model"),
    )
    .env("LLAMA_ARG_MODELS_PRESET"),
    opt(&["--models-max"], One, Ignore(ROUTER)).env("LLAMA_ARG_MODELS_MAX"),
    opt(&["--models-autoload"], Switch, Ignore(ROUTER))
        .neg(&["--no-models-autoload"])
        .env("LLAMA_ARG_MODELS_AUTOLOAD"),
    opt(&["--jinja"], Switch, Take)
        .neg(&["--no-jinja"])
        .env("LLAMA_ARG_JINJA"),
    opt(&["--reasoning-format"], One, Take).env("LLAMA_ARG_THINK"),
    opt(&["-rea", "--reasoning"], Val::Opt(ON_OFF), Take).env("LLAMA_ARG_REASONING"),
    opt(&["--reasoning-effort"], One, Take).env("LLAMA_ARG_REASONING_EFFORT"),
    opt(&["--reasoning-budget"], One, Take).env("LLAMA_ARG_THINK_BUDGET"),
    opt(&["--reasoning-budget-message"], One, Take).env("LLAMA_ARG_THINK_BUDGET_MESSAGE"),
    opt(&["--reasoning-preserve"], Switch, Take)
        .neg(&["--no-reasoning-preserve"])
        .env("LLAMA_ARG_REASONING_PRESERVE"),
    opt(&["--chat-template"], One, Take).env("LLAMA_ARG_CHAT_TEMPLATE"),
    opt(&["--chat-template-file"], One, Take).env("LLAMA_ARG_CHAT_TEMPLATE_FILE"),
    opt(&["--skip-chat-parsing"], Switch, Ignore(REASONING))
        .neg(&["--no-skip-chat-parsing"])
        .env("LLAMA_ARG_SKIP_CHAT_PARSING"),
    opt(&["--prefill-assistant"], Switch, Take)
        .neg(&["--no-prefill-assistant"])
        .env("LLAMA_ARG_PREFILL_ASSISTANT"),
    opt(
        &["-sps", "--slot-prompt-similarity"],
        One,
        Ignore(NO_EFFECT),
    ),
    opt(&["--sleep-idle-seconds"], One, Take),
    // Logging.
    opt(&["--log-disable"], Switch, Ignore(LOGS)),
    opt(&["--log-file"], One, Ignore(LOGS)).env("LLAMA_ARG_LOG_FILE"),
    opt(&["--log-jsonl"], Switch, Ignore(LOGS))
        .neg(&["--no-log-jsonl"])
        .env("LLAMA_ARG_LOG_JSONL"),
    opt(&["--log-prompts-dir"], One, Ignore(LOGS)),
    opt(&["--log-colors"], Val::Opt(ON_OFF), Ignore(LOGS)).env("LLAMA_ARG_LOG_COLORS"),
    opt(&["-v", "--verbose", "--log-verbose"], Switch, Take),
    opt(&["--offline"], Switch, Ignore("specd never goes online")).env("LLAMA_ARG_OFFLINE"),
    opt(
        &["-lv", "--verbosity", "--log-verbosity"],
        One,
        Ignore(LOGS),
    )
    .env("LLAMA_ARG_LOG_VERBOSITY"),
    opt(&["--log-prefix"], Switch, Ignore(LOGS))
        .neg(&["--no-log-prefix"])
        .env("LLAMA_ARG_LOG_PREFIX"),
    opt(&["--log-timestamps"], Switch, Ignore(LOGS))
        .neg(&["--no-log-timestamps"])
        .env("LLAMA_ARG_LOG_TIMESTAMPS"),
    // Speculative decoding.
    opt(
        &["--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"],
        One,
        Refuse(DOWNLOAD),
    )
    .env("LLAMA_ARG_SPEC_DRAFT_HF_REPO"),
    opt(
        &["--spec-draft-threads", "-td", "--threads-draft"],
        One,
        Ignore("the draft model shares the target's threads"),
    ),
    opt(
        &[
            "--spec-draft-threads-batch",
            "-tbd",
            "--threads-batch-draft",
        ],
        One,
        Ignore("the draft model shares the target's threads"),
    ),
    opt(
        &["--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"],
        One,
        Ignore(THREADS),
    ),
    opt(
        &["--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"],
        One,
        Ignore(THREADS),
    ),
    opt(
        &["--spec-draft-cpu-strict", "--cpu-strict-draft"],
        One,
        Ignore(THREADS),
    ),
    opt(&["--spec-draft-prio", "--prio-draft"], One, Ignore(THREADS)),
    opt(&["--spec-draft-poll", "--poll-draft"], One, Ignore(THREADS)),
    opt(
        &[
            "--spec-draft-cpu-mask-batch",
            "-Cbd",
            "--cpu-mask-batch-draft",
        ],
        One,
        Ignore(THREADS),
    ),
    opt(
        &["--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"],
        One,
        Ignore(THREADS),
    ),
    opt(
        &["--spec-draft-prio-batch", "--prio-batch-draft"],
        One,
        Ignore(THREADS),
    ),
    opt(
        &["--spec-draft-poll-batch", "--poll-batch-draft"],
        One,
        Ignore(THREADS),
    ),
    opt(
        &["--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"],
        One,
        Ignore("the draft model's KV cache is f32"),
    )
    .env("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K"),
    opt(
        &["--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"],
        One,
        Ignore("the draft model's KV cache is f32"),
    )
    .env("LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V"),
    opt(
        &[
            "--spec-draft-override-tensor",
            "-otd",
            "--override-tensor-draft",
        ],
        One,
        Ignore(CPU),
    ),
    opt(
        &["--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"],
        Switch,
        Ignore(CPU),
    )
    .env("LLAMA_ARG_SPEC_DRAFT_CPU_MOE"),
    opt(
        &[
            "--spec-draft-n-cpu-moe",
            "--spec-draft-ncmoe",
            "-ncmoed",
            "--n-cpu-moe-draft",
        ],
        One,
        Ignore(CPU),
    )
    .env("LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE"),
    opt(&["--spec-draft-n-max"], One, Take).env("LLAMA_ARG_SPEC_DRAFT_N_MAX"),
    opt(&["--spec-draft-n-min"], One, Take).env("LLAMA_ARG_SPEC_DRAFT_N_MIN"),
    opt(&["--spec-synth-len"], One, Take).env("LLAMA_ARG_SPEC_SYNTH_LEN"),
    opt(&["--spec-synth-rates"], One, Take).env("LLAMA_ARG_SPEC_SYNTH_RATES"),
    opt(
        &["--spec-draft-p-split", "--draft-p-split"],
        One,
        Ignore(NO_EFFECT),
    )
    .env("LLAMA_ARG_SPEC_DRAFT_P_SPLIT"),
    opt(&["--spec-draft-p-min", "--draft-p-min"], One, Take).env("LLAMA_ARG_SPEC_DRAFT_P_MIN"),
    opt(&["--spec-draft-backend-sampling"], Switch, Ignore(CPU))
        .neg(&["--no-spec-draft-backend-sampling"])
        .env("LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING"),
    opt(
        &["--spec-draft-sampling"],
        One,
        Ignore("specd's draft model drafts greedily"),
    )
    .env("LLAMA_ARG_SPEC_DRAFT_SAMPLING"),
    opt(
        &["--spec-draft-device", "-devd", "--device-draft"],
        One,
        Ignore(CPU),
    ),
    opt(
        &[
            "--spec-draft-ngl",
            "-ngld",
            "--gpu-layers-draft",
            "--n-gpu-layers-draft",
        ],
        One,
        Ignore(CPU),
    )
    .env("LLAMA_ARG_N_GPU_LAYERS_DRAFT"),
    opt(
        &["--spec-draft-model", "-md", "--model-draft"],
        One,
        As("--model-draft", ""),
    )
    .env("LLAMA_ARG_SPEC_DRAFT_MODEL"),
    opt(&["--spec-type"], One, Take).env("LLAMA_ARG_SPEC_TYPE"),
    opt(&["--spec-ngram-mod-n-min"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-mod-n-max"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-mod-n-match"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-simple-size-n"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-simple-size-m"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-simple-min-hits"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-map-k-size-n"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-map-k-size-m"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-map-k-min-hits"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-map-k4v-size-n"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-map-k4v-size-m"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-map-k4v-min-hits"], One, Ignore(NGRAM)),
    // Removed from llama-server (an error there); specd keeps the old meanings.
    opt(
        &["--draft", "--draft-n", "--draft-max"],
        One,
        As("--spec-draft-n-max", ""),
    )
    .env("LLAMA_ARG_DRAFT_MAX"),
    opt(
        &["--draft-min", "--draft-n-min"],
        One,
        As("--spec-draft-n-min", ""),
    )
    .env("LLAMA_ARG_DRAFT_MIN"),
    opt(&["--spec-ngram-size-n"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-size-m"], One, Ignore(NGRAM)),
    opt(&["--spec-ngram-min-hits"], One, Ignore(NGRAM)),
    // n-gram lookup files of llama-lookup.
    opt(
        &["-lcs", "--lookup-cache-static"],
        One,
        Refuse("n-gram lookup cache files are not implemented"),
    ),
    opt(
        &["-lcd", "--lookup-cache-dynamic"],
        One,
        Refuse("n-gram lookup cache files are not implemented"),
    ),
    // Presets. llama-server's default speculation is its ngram-mod drafter, which specd has.
    opt(&["--spec-default"], Switch, As("--spec-type=ngram-mod", "")),
    opt(&["--embd-gemma-default"], Switch, Refuse(DOWNLOAD)),
    opt(&["--fim-qwen-1.5b-default"], Switch, Refuse(DOWNLOAD)),
    opt(&["--fim-qwen-3b-default"], Switch, Refuse(DOWNLOAD)),
    opt(&["--fim-qwen-7b-default"], Switch, Refuse(DOWNLOAD)),
    opt(&["--fim-qwen-7b-spec"], Switch, Refuse(DOWNLOAD)),
    opt(&["--fim-qwen-14b-spec"], Switch, Refuse(DOWNLOAD)),
    opt(&["--fim-qwen-30b-default"], Switch, Refuse(DOWNLOAD)),
    opt(&["--gpt-oss-20b-default"], Switch, Refuse(DOWNLOAD)),
    opt(&["--gpt-oss-120b-default"], Switch, Refuse(DOWNLOAD)),
    opt(&["--vision-gemma-4b-default"], Switch, Refuse(DOWNLOAD)),
    opt(&["--vision-gemma-12b-default"], Switch, Refuse(DOWNLOAD)),
];

/// The option spelled `name` (a positive or negative spelling), and whether it is negative.
fn find(name: &str) -> Option<(&'static Opt, bool)> {
    OPTIONS.iter().find_map(|o| {
        if o.names.contains(&name) {
            Some((o, false))
        } else if o.neg.contains(&name) {
            Some((o, true))
        } else {
            None
        }
    })
}

/// llama-server's truthy and falsey words for environment values.
fn truthy(v: &str) -> bool {
    matches!(v, "on" | "enabled" | "true" | "1")
}
fn falsey(v: &str) -> bool {
    matches!(v, "off" | "disabled" | "false" | "0")
}

/// Where an argument came from, for messages.
#[derive(Clone)]
enum Origin {
    Cli,
    Env(String),
}

/// A flag name as llama-server reads it: `--a_b` is `--a-b`.
fn normalize(name: &str) -> String {
    if name.starts_with("--") {
        name.replace('_', "-")
    } else {
        name.to_string()
    }
}

/// The arguments that `vars` (the environment) add for options the command line `cli` does not
/// set, as llama-server reads them (its `LLAMA_ARG_NO_…` form turns a switch off).
fn from_env(
    cli: &[OsString],
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(OsString, Origin)>, String> {
    let on_cli: HashSet<String> = cli
        .iter()
        .filter_map(|a| a.to_str())
        .filter(|a| a.starts_with('-'))
        .map(|a| normalize(a.split_once('=').map_or(a, |(n, _)| n)))
        .collect();
    let mut out = Vec::new();
    for o in OPTIONS {
        let Some(env) = o.env else { continue };
        let neg_env = (!o.neg.is_empty()).then(|| env.replacen("LLAMA_ARG_", "LLAMA_ARG_NO_", 1));
        let neg_set = neg_env.as_deref().and_then(vars);
        let value = vars(env);
        if neg_set.is_none() && value.is_none() {
            continue;
        }
        if let Some(flag) = o.names.iter().chain(o.neg).find(|n| on_cli.contains(**n)) {
            eprintln!("warning: {env} is set, but the command line's {flag} wins");
            continue;
        }
        let from = match (&neg_set, &neg_env) {
            (Some(_), Some(n)) => Origin::Env(n.clone()),
            _ => Origin::Env(env.to_string()),
        };
        let neg_flag = || long_of(o.neg);
        match (neg_set, value) {
            (Some(_), _) => out.push((neg_flag().into(), from)),
            (None, Some(v)) if o.val == Switch && o.neg.is_empty() => {
                if truthy(&v) {
                    out.push((o.long().into(), from));
                }
            }
            (None, Some(v)) if o.val == Switch => {
                let flag = if truthy(&v) {
                    o.long()
                } else if falsey(&v) {
                    neg_flag()
                } else {
                    return Err(format!(
                        "environment variable {env}={v}: not a boolean (on/off, true/false, 1/0, enabled/disabled)"
                    ));
                };
                out.push((flag.into(), from));
            }
            // Inline, so that no value is taken for a flag (`-1`, `-x`, an `on|off` word).
            (None, Some(v)) => out.push((format!("{}={v}", o.long()).into(), from)),
            (None, None) => {}
        }
    }
    Ok(out)
}

/// Rewrites a `specd serve …` command line written for llama-server into one clap parses, with
/// the process environment's `LLAMA_ARG_*` variables. See [`rewrite`].
pub fn preprocess(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    rewrite(args, &|k| std::env::var(k).ok())
}

/// [`preprocess`] with the environment given: renames (`-np` → `--parallel`), drops flags that
/// mean nothing here (with a one-line warning each), refuses llama-server features specd lacks,
/// adds the options set by `LLAMA_ARG_*` variables that the command line does not set, turns
/// `--seed -1` into the random-seed sentinel, and lets `-ub` win over `-b` (specd has one batch
/// size). Arguments before the `serve` subcommand are left alone.
fn rewrite(
    args: Vec<OsString>,
    vars: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<OsString>, String> {
    // Only the `serve` subcommand (the first argument) takes llama-server's command line.
    if args.get(1).is_none_or(|a| a != "serve") {
        return Ok(args);
    }
    let cli = &args[2..];
    let mut input = from_env(cli, vars)?;
    input.extend(cli.iter().map(|a| (a.clone(), Origin::Cli)));
    let mut out: Vec<OsString> = args[..2].to_vec();
    let mut rest = input.into_iter().peekable();
    let mut has_ub = false;
    let mut b_at: Option<usize> = None; // index of a -b flag in `out`
    while let Some((arg, origin)) = rest.next() {
        let Some(s) = arg.to_str().map(str::to_string) else {
            out.push(arg);
            continue;
        };
        if s == "--" {
            out.push(arg);
            out.extend(rest.by_ref().map(|(a, _)| a));
            break;
        }
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (normalize(n), Some(v.to_string())),
            _ if s.starts_with('-') => (normalize(&s), None),
            _ => (s.clone(), None),
        };
        let Some((o, negative)) = find(&name) else {
            // specd's own flags, values, and unknown flags (clap names them).
            out.push(match inline {
                Some(v) => format!("{name}={v}").into(),
                None => name.into(),
            });
            continue;
        };
        let shown = match &origin {
            Origin::Cli => format!("'{name}'"),
            Origin::Env(e) => format!("'{name}' (from {e})"),
        };
        let next = rest.peek().and_then(|(v, _)| v.to_str());
        let takes_value = inline.is_none() && !negative && o.takes(next);
        let canonical = match o.does {
            Refuse(why) => {
                return Err(format!(
                    "the llama-server flag {shown} is not supported by specd: {why}"
                ))
            }
            Ignore(why) => {
                let value = if takes_value {
                    rest.next().map(|(v, _)| v.to_string_lossy().into_owned())
                } else {
                    inline.clone()
                };
                let shown = match (&origin, value) {
                    (Origin::Cli, Some(v)) => format!("'{name} {v}'"),
                    (Origin::Cli, None) => format!("'{name}'"),
                    (Origin::Env(e), Some(v)) => format!("{e}={v}"),
                    (Origin::Env(e), None) => e.clone(),
                };
                eprintln!("warning: {shown} ignored: {why}");
                continue;
            }
            Take if negative => long_of(o.neg),
            Take => o.long(),
            As(_, neg) if negative => neg,
            As(pos, _) => pos,
        };
        let name = canonical.to_string();
        match name.as_str() {
            "--seed" => {
                let v = match inline {
                    Some(v) => Some(v),
                    None => rest.next().map(|(v, _)| v.to_string_lossy().into_owned()),
                };
                out.push(name.into());
                if let Some(v) = v {
                    // llama.cpp's -1 = random: specd's sentinel is u32::MAX.
                    out.push(if v.trim() == "-1" {
                        "4294967295".into()
                    } else {
                        v.into()
                    });
                }
                continue;
            }
            "--cache-type-k" | "--cache-type-v" => {
                let v = match inline {
                    Some(v) => Some(v),
                    None => rest.next().map(|(v, _)| v.to_string_lossy().into_owned()),
                };
                out.push(name.clone().into());
                if let Some(v) = v {
                    // llama-server's other cache types (q8_0, q4_0, bf16, …): specd stores f32
                    // or f16, so a command line asking for a smaller cache gets the smaller one.
                    let lower = v.to_ascii_lowercase();
                    if lower == "f32" || lower == "f16" {
                        out.push(v.into());
                    } else {
                        eprintln!(
                            "warning: '{name} {v}': specd's KV cache is f32 or f16; using f16"
                        );
                        out.push("f16".into());
                    }
                }
                continue;
            }
            "--ubatch-size" => has_ub = true,
            "--batch-size" => b_at = Some(out.len()),
            _ => {}
        }
        match inline {
            Some(v) => out.push(format!("{name}={v}").into()),
            None => out.push(name.into()),
        }
        if takes_value {
            // The value goes as it is, even when it starts with '-' (`--seed -1`, `-n -1`).
            if let Some((v, _)) = rest.next() {
                out.push(v);
            }
        }
    }
    if let Some(i) = b_at {
        // llama-server's logical batch also bounds the prefix and suffix an /infill prompt keeps.
        let inline = out[i].to_string_lossy().contains('=');
        let value = match inline {
            true => out[i]
                .to_string_lossy()
                .split_once('=')
                .map(|(_, v)| v.to_string()),
            false => out.get(i + 1).map(|v| v.to_string_lossy().into_owned()),
        };
        if has_ub {
            // -b is llama.cpp's logical batch; specd processes prompts in chunks of -ub.
            out.drain(i..(i + if inline { 1 } else { 2 }).min(out.len()));
            eprintln!("warning: '-b' ignored: specd processes prompts in chunks of --ubatch-size");
        }
        if let Some(v) = value {
            out.push("--infill-batch".into());
            out.push(v.into());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre_env(s: &str, env: &[(&str, &str)]) -> Result<Vec<String>, String> {
        let args: Vec<OsString> = s.split_whitespace().map(OsString::from).collect();
        let vars = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        rewrite(args, &vars).map(|v| {
            v.into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        })
    }

    fn pre(s: &str) -> Result<Vec<String>, String> {
        pre_env(s, &[])
    }

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn renames_two_letter_flags_and_drops_ignored_ones() {
        let v =
            pre("specd serve -np 2 -md d.gguf -ngl 99 -fa on -ctk f16 -ctv q8_0 -c 512 --port 0")
                .unwrap();
        assert_eq!(
            v,
            words("specd serve --parallel 2 --model-draft d.gguf --cache-type-k f16 --cache-type-v f16 --ctx-size 512 --port 0")
        );
        // -fa as a plain switch does not swallow the next flag.
        let v = pre("specd serve -fa -c 64").unwrap();
        assert_eq!(v, words("specd serve --ctx-size 64"));
        let v = pre("specd serve --n-gpu-layers=99 --flash-attn=auto -t 2").unwrap();
        assert_eq!(v, words("specd serve --threads 2"));
        // llama-server reads `--a_b` as `--a-b`.
        let v = pre("specd serve --backend_sampling --n_predict 5").unwrap();
        assert_eq!(v, words("specd serve --n-predict 5"));
    }

    #[test]
    fn values_pass_as_they_are() {
        // A value that looks like a flag is still the value.
        let v = pre("specd serve --alias -np -n -1").unwrap();
        assert_eq!(v, words("specd serve --alias -np --n-predict -1"));
        let v = pre("specd serve --no-kv-unified -no-kvu -kvu").unwrap();
        assert_eq!(
            v,
            words("specd serve --no-kv-unified --no-kv-unified --kv-unified")
        );
    }

    #[test]
    fn seed_minus_one_and_batch_sizes() {
        let v = pre("specd serve --seed -1 -s 5 --seed=-1").unwrap();
        assert_eq!(
            v,
            words("specd serve --seed 4294967295 --seed 5 --seed 4294967295")
        );
        let v = pre("specd serve -b 2048 -ub 256").unwrap();
        assert_eq!(
            v,
            words("specd serve --ubatch-size 256 --infill-batch 2048")
        );
        let v = pre("specd serve -b 128").unwrap();
        assert_eq!(v, words("specd serve --batch-size 128 --infill-batch 128"));
    }

    #[test]
    fn refuses_unsupported_and_leaves_other_commands_alone() {
        let e = pre("specd serve --lora x.gguf").unwrap_err();
        assert!(e.contains("'--lora'") && e.contains("LoRA"), "{e}");
        let e = pre("specd serve --mmproj x.gguf").unwrap_err();
        assert!(e.contains("multimodal"), "{e}");
        let v = pre("specd serve --mmproj-auto --no-mmproj --media-path .").unwrap();
        assert_eq!(v, words("specd serve"));
        let v = pre("specd generate -np 2").unwrap();
        assert_eq!(v, words("specd generate -np 2"));
    }

    #[test]
    fn environment_sets_what_the_command_line_does_not() {
        let env = [
            ("LLAMA_ARG_CTX_SIZE", "256"),
            ("LLAMA_ARG_HOST", "192.0.2.1"),
            ("LLAMA_ARG_N_GPU_LAYERS", "99"),
            ("LLAMA_ARG_ENDPOINT_METRICS", "1"),
            ("LLAMA_ARG_NO_CONT_BATCHING", "1"),
            ("LLAMA_API_KEY", "k"),
        ];
        let v = pre_env("specd serve --host 127.0.0.1", &env).unwrap();
        assert_eq!(
            v,
            words("specd serve --ctx-size=256 --api-key=k --metrics --host 127.0.0.1")
        );
        // Any spelling on the command line wins, and so does a negative one.
        let env = [
            ("LLAMA_ARG_KV_UNIFIED", "true"),
            ("LLAMA_ARG_N_PARALLEL", "3"),
        ];
        let v = pre_env("specd serve -no-kvu -np=2", &env).unwrap();
        assert_eq!(v, words("specd serve --no-kv-unified --parallel=2"));
        let v = pre_env("specd serve", &env).unwrap();
        assert_eq!(v, words("specd serve --kv-unified --parallel=3"));
        // Values are taken as they are, and llama-server's special ones still apply.
        let env = [
            ("LLAMA_ARG_N_PREDICT", "-1"),
            ("LLAMA_ARG_FLASH_ATTN", "whatever"),
            ("LLAMA_ARG_CACHE_TYPE_K", "q8_0"),
            ("LLAMA_ARG_UBATCH", "64"),
            ("LLAMA_ARG_BATCH", "256"),
        ];
        let v = pre_env("specd serve", &env).unwrap();
        assert_eq!(
            v,
            words(
                "specd serve --n-predict=-1 --ubatch-size=64 --cache-type-k f16 --infill-batch 256"
            )
        );
        // LLAMA_ARG_NO_X turns a switch off whatever its value; falsey values do too.
        let v = pre_env("specd serve", &[("LLAMA_ARG_NO_ENDPOINT_SLOTS", "")]).unwrap();
        assert_eq!(v, words("specd serve --no-slots"));
        let v = pre_env("specd serve", &[("LLAMA_ARG_ENDPOINT_SLOTS", "off")]).unwrap();
        assert_eq!(v, words("specd serve --no-slots"));
        let e = pre_env("specd serve", &[("LLAMA_ARG_ENDPOINT_SLOTS", "maybe")]).unwrap_err();
        assert!(e.contains("LLAMA_ARG_ENDPOINT_SLOTS"), "{e}");
        // A switch without a negative form is set only by a truthy value.
        let v = pre_env("specd serve", &[("LLAMA_ARG_ENDPOINT_METRICS", "0")]).unwrap();
        assert_eq!(v, words("specd serve"));
        // Refused features are refused from the environment too, naming the variable.
        let e = pre_env("specd serve", &[("LLAMA_ARG_MMPROJ", "p.gguf")]).unwrap_err();
        assert!(e.contains("LLAMA_ARG_MMPROJ"), "{e}");
    }

    #[test]
    fn specds_parser_knows_every_flag_taken() {
        use clap::CommandFactory;
        let cmd = crate::Cli::command();
        let serve = cmd
            .get_subcommands()
            .find(|c| c.get_name() == "serve")
            .expect("serve");
        let known = |flag: &str| {
            let flag = flag.split('=').next().unwrap_or(flag);
            let long = flag.trim_start_matches('-');
            serve.get_arguments().any(|a| {
                a.get_long() == Some(long) || a.get_all_aliases().is_some_and(|v| v.contains(&long))
            }) || matches!(flag, "--help" | "--version")
        };
        for o in OPTIONS {
            let (pos, neg) = match o.does {
                Take => (o.long(), long_of(o.neg)),
                As(p, n) => (p, n),
                _ => continue,
            };
            assert!(known(pos), "{pos}");
            assert!(neg.is_empty() || known(neg), "{neg}");
        }
    }

    #[test]
    fn every_spelling_is_listed_once() {
        let mut seen = HashSet::new();
        for o in OPTIONS {
            for n in o.names.iter().chain(o.neg) {
                assert!(seen.insert(*n), "{n} listed twice");
            }
            if let Some(e) = o.env {
                assert!(seen.insert(e), "{e} listed twice");
            }
        }
    }
}
