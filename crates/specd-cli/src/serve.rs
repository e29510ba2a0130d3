//! `specd serve`: the HTTP server, started with llama-server's command line.
//!
//! llama-server's two-letter short flags (`-np`, `-md`, `-ub`, …) and the flags that mean
//! nothing on specd's CPU engine (`-ngl`, `-fa`, `--mlock`, …) are handled by [`preprocess`]
//! before clap sees the arguments: the first are renamed to their long forms, the second are
//! dropped with a one-line warning. llama-server flags specd cannot honour are an error saying
//! so; anything else unknown is clap's usual error naming the flag.

use crate::demo::demo_model_path;
use crate::generate::{ModelArgs, SamplingArgs, SpecArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use specd_models::{Model, ModelOptions};
use specd_sampling::GrammarSpec;
use specd_server::params::Defaults;
use specd_server::{AppState, ServerConfig};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Parallel slots (-np). Default (or -1): 4 slots sharing the context (--kv-unified).
    #[arg(long = "parallel", allow_hyphen_values = true)]
    pub parallel: Option<i64>,
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
    /// API keys, comma-separated (clients send `Authorization: Bearer KEY`).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// File with API keys, one per line (`#` starts a comment).
    #[arg(long = "api-key-file")]
    pub api_key_file: Option<PathBuf>,
    /// Serve Prometheus metrics at /metrics.
    #[arg(long)]
    pub metrics: bool,
    /// Serve /slots (default).
    #[arg(long = "slots", overrides_with = "no_slots")]
    pub slots: bool,
    /// Do not serve /slots.
    #[arg(long = "no-slots")]
    pub no_slots: bool,
    /// Model name in the API (default: the model path).
    #[arg(short = 'a', long = "alias")]
    pub alias: Option<String>,
    /// Model tags, comma-separated (shown by /v1/models).
    #[arg(long)]
    pub tags: Option<String>,
    /// Chat template: Jinja source, or the built-in name `chatml`.
    #[arg(long = "chat-template")]
    pub chat_template: Option<String>,
    /// File holding a Jinja chat template.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
    /// Render chat templates with Jinja (always on in specd).
    #[arg(long = "jinja", overrides_with = "no_jinja")]
    pub jinja: bool,
    #[arg(long = "no-jinja")]
    pub no_jinja: bool,
    /// CORS origins, comma-separated: `*` (default: any origin), `localhost`, or a list.
    #[arg(long = "cors-origins", default_value = "*")]
    pub cors_origins: String,
    /// Every slot may use the whole context (otherwise each gets ctx-size / parallel).
    #[arg(long = "kv-unified", overrides_with = "no_kv_unified")]
    pub kv_unified: bool,
    #[arg(long = "no-kv-unified")]
    pub no_kv_unified: bool,
    /// Log every request.
    #[arg(short = 'v', long = "verbose", alias = "log-verbose")]
    pub verbose: bool,
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
}

#[derive(Clone, Copy)]
enum Val {
    /// A switch.
    None,
    /// Takes one value.
    One,
    /// An optional value, taken if it is one of these.
    Opt(&'static [&'static str]),
}

/// llama-server's short and alternative spellings → the long flag specd's parser knows.
const RENAMES: &[(&str, &str)] = &[
    ("-np", "--parallel"),
    ("-md", "--model-draft"),
    ("--spec-draft-model", "--model-draft"),
    ("-ub", "--ubatch-size"),
    ("-ctxcp", "--ctx-checkpoints"),
    ("-kvu", "--kv-unified"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-no-kvu", "--no-kv-unified"),
    ("--temperature", "--temp"),
    ("--draft", "--spec-draft-n-max"),
    ("--draft-n", "--spec-draft-n-max"),
    ("--draft-n-min", "--spec-draft-n-min"),
    ("-j", "--json-schema"),
    ("-jf", "--json-schema-file"),
];

const ON_OFF: &[&str] = &[
    "on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled",
];

/// llama-server flags that change nothing on specd's CPU engine (or only llama.cpp internals).
const IGNORED: &[(&[&str], Val)] = &[
    (&["-ngl", "--gpu-layers", "--n-gpu-layers"], Val::One),
    (
        &[
            "-ngld",
            "--gpu-layers-draft",
            "--n-gpu-layers-draft",
            "--spec-draft-ngl",
        ],
        Val::One,
    ),
    (&["-fa", "--flash-attn"], Val::Opt(ON_OFF)),
    (&["-sm", "--split-mode"], Val::One),
    (&["-ts", "--tensor-split"], Val::One),
    (&["-mg", "--main-gpu"], Val::One),
    (&["-dev", "--device"], Val::One),
    (
        &["-devd", "--device-draft", "--spec-draft-device"],
        Val::One,
    ),
    (
        &["-kvo", "--kv-offload", "-nkvo", "--no-kv-offload"],
        Val::None,
    ),
    (&["--op-offload", "--no-op-offload", "--no-host"], Val::None),
    (&["-fit", "--fit"], Val::Opt(ON_OFF)),
    (&["-fitt", "--fit-target", "-fitc", "--fit-ctx"], Val::One),
    (
        &[
            "-ot",
            "--override-tensor",
            "-otd",
            "--override-tensor-draft",
        ],
        Val::One,
    ),
    (
        &["-cmoe", "--cpu-moe", "-cmoed", "--cpu-moe-draft"],
        Val::None,
    ),
    (
        &["-ncmoe", "--n-cpu-moe", "-ncmoed", "--n-cpu-moe-draft"],
        Val::One,
    ),
    (
        &[
            "--repack",
            "-nr",
            "--no-repack",
            "-bs",
            "--backend-sampling",
        ],
        Val::None,
    ),
    (
        &[
            "--mlock",
            "--no-mmap",
            "--mmap",
            "--check-tensors",
            "--swa-full",
        ],
        Val::None,
    ),
    (&["-lm", "--load-mode", "--numa", "--rpc"], Val::One),
    (
        &[
            "-ctkd",
            "--cache-type-k-draft",
            "-ctvd",
            "--cache-type-v-draft",
        ],
        Val::One,
    ),
    (&["--spec-draft-type-k", "--spec-draft-type-v"], Val::One),
    (&["-dt", "--defrag-thold"], Val::One),
    (
        &[
            "-tb",
            "--threads-batch",
            "-td",
            "--threads-draft",
            "--spec-draft-threads",
        ],
        Val::One,
    ),
    (
        &[
            "-tbd",
            "--threads-batch-draft",
            "--spec-draft-threads-batch",
        ],
        Val::One,
    ),
    (
        &[
            "-C",
            "--cpu-mask",
            "-Cr",
            "--cpu-range",
            "--cpu-strict",
            "--prio",
            "--poll",
        ],
        Val::One,
    ),
    (
        &["-Cb", "--cpu-mask-batch", "-Crb", "--cpu-range-batch"],
        Val::One,
    ),
    (
        &["--cpu-strict-batch", "--prio-batch", "--poll-batch"],
        Val::One,
    ),
    (
        &["-cb", "--cont-batching", "-nocb", "--no-cont-batching"],
        Val::None,
    ),
    (
        &["--threads-http", "-to", "--timeout", "--sse-ping-interval"],
        Val::One,
    ),
    (
        &[
            "--reuse-port",
            "--warmup",
            "--no-warmup",
            "--perf",
            "--no-perf",
        ],
        Val::None,
    ),
    (
        &[
            "--log-disable",
            "--log-prefix",
            "--no-log-prefix",
            "--log-timestamps",
        ],
        Val::None,
    ),
    (
        &[
            "--no-log-timestamps",
            "--log-jsonl",
            "--no-log-jsonl",
            "--offline",
        ],
        Val::None,
    ),
    (
        &["--log-file", "-lv", "--verbosity", "--log-verbosity"],
        Val::One,
    ),
    (&["--log-colors"], Val::Opt(ON_OFF)),
    (
        &["--ui", "--webui", "--no-ui", "--no-webui", "--props"],
        Val::None,
    ),
    (
        &[
            "--path",
            "--ui-config",
            "--webui-config",
            "--ui-config-file",
        ],
        Val::One,
    ),
    (&["--webui-config-file"], Val::One),
    (
        &[
            "--cache-reuse",
            "-sps",
            "--slot-prompt-similarity",
            "--keep",
        ],
        Val::One,
    ),
    (
        &["-cms", "--checkpoint-min-step", "-cram", "--cache-ram"],
        Val::One,
    ),
    (
        &[
            "--cache-idle-slots",
            "--no-cache-idle-slots",
            "-e",
            "--escape",
            "--no-escape",
        ],
        Val::None,
    ),
    (
        &[
            "--reasoning-format",
            "--reasoning-budget",
            "--reasoning-effort",
        ],
        Val::One,
    ),
    (&["-rea", "--reasoning"], Val::Opt(ON_OFF)),
    (
        &[
            "--prefill-assistant",
            "--no-prefill-assistant",
            "--skip-chat-parsing",
        ],
        Val::None,
    ),
    (&["--no-skip-chat-parsing", "-sp", "--special"], Val::None),
    (
        &["--chat-template-kwargs", "-r", "--reverse-prompt"],
        Val::One,
    ),
    (
        &[
            "--spec-draft-p-split",
            "--draft-p-split",
            "--spec-draft-sampling",
        ],
        Val::One,
    ),
    (
        &[
            "--spec-draft-backend-sampling",
            "--no-spec-draft-backend-sampling",
        ],
        Val::None,
    ),
    (
        &[
            "--spec-ngram-mod-n-min",
            "--spec-ngram-mod-n-max",
            "--spec-ngram-mod-n-match",
        ],
        Val::One,
    ),
    (
        &["--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"],
        Val::One,
    ),
    (
        &["--spec-ngram-simple-min-hits", "--spec-ngram-map-k-size-n"],
        Val::One,
    ),
    (
        &["--spec-ngram-map-k-size-m", "--spec-ngram-map-k-min-hits"],
        Val::One,
    ),
    (
        &["--spec-ngram-map-k4v-size-n", "--spec-ngram-map-k4v-size-m"],
        Val::One,
    ),
    (
        &[
            "--spec-ngram-map-k4v-min-hits",
            "--spec-ngram-size-n",
            "--spec-ngram-size-m",
        ],
        Val::One,
    ),
    (&["--spec-ngram-min-hits"], Val::One),
];

/// llama-server flags whose feature specd does not have: refusing them is more honest than
/// serving something else than asked.
const UNSUPPORTED: &[&str] = &[
    "--lora",
    "--lora-scaled",
    "--lora-init-without-apply",
    "--control-vector",
    "--control-vector-scaled",
    "--control-vector-layer-range",
    "-mm",
    "--mmproj",
    "-mmu",
    "--mmproj-url",
    "--embedding",
    "--embeddings",
    "--rerank",
    "--reranking",
    "--pooling",
    "-hf",
    "-hfr",
    "--hf-repo",
    "-hff",
    "--hf-file",
    "-hfd",
    "-hfrd",
    "--hf-repo-draft",
    "-mu",
    "--model-url",
    "-dr",
    "--docker-repo",
    "--rope-scaling",
    "--rope-scale",
    "--rope-freq-base",
    "--rope-freq-scale",
    "--yarn-orig-ctx",
    "--yarn-ext-factor",
    "--yarn-attn-factor",
    "--yarn-beta-slow",
    "--yarn-beta-fast",
    "--override-kv",
    "--slot-save-path",
    "--api-prefix",
    "--ssl-key-file",
    "--ssl-cert-file",
    "--models-dir",
    "--models-preset",
    "--tools",
    "--mcp-servers-config",
    "--mcp-servers-json",
    "-ag",
    "--agent",
    "--samplers",
    "--sampler-seq",
    "--sampling-seq",
    "--mirostat",
    "--mirostat-lr",
    "--mirostat-ent",
    "--dry-multiplier",
    "--dry-base",
    "--dry-allowed-length",
    "--dry-penalty-last-n",
    "--dry-sequence-breaker",
    "--xtc-probability",
    "--xtc-threshold",
    "--dynatemp-range",
    "--dynatemp-exp",
    "--top-nsigma",
    "--top-n-sigma",
    "--adaptive-target",
    "--adaptive-decay",
    "-lcs",
    "--lookup-cache-static",
    "-lcd",
    "--lookup-cache-dynamic",
];

/// Rewrites a `specd serve …` command line written for llama-server into one clap parses:
/// renames (`-np` → `--parallel`), drops flags that mean nothing here (with a one-line
/// warning each), refuses llama-server features specd lacks, turns `--seed -1` into the
/// random-seed sentinel, and lets `-ub` win over `-b` (specd has one batch size).
/// Arguments before the `serve` subcommand are left alone.
pub fn preprocess(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    // Only the `serve` subcommand (the first argument) takes llama-server's command line.
    if args.get(1).is_none_or(|a| a != "serve") {
        return Ok(args);
    }
    let pos = 1;
    let mut out: Vec<OsString> = args[..=pos].to_vec();
    let mut rest = args[pos + 1..].iter().cloned().peekable();
    let mut has_ub = false;
    let mut b_at: Option<usize> = None; // index of a -b flag in `out`
    while let Some(arg) = rest.next() {
        let Some(s) = arg.to_str().map(str::to_string) else {
            out.push(arg);
            continue;
        };
        if s == "--" {
            out.push(arg);
            out.extend(rest.by_ref());
            break;
        }
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (n.to_string(), Some(v.to_string())),
            _ => (s.clone(), None),
        };
        let name = RENAMES
            .iter()
            .find(|(from, _)| *from == name)
            .map_or(name, |(_, to)| to.to_string());
        if let Some((_, val)) = IGNORED
            .iter()
            .find(|(names, _)| names.contains(&name.as_str()))
        {
            let mut shown = name.clone();
            if inline.is_none() {
                let take = match val {
                    Val::None => false,
                    Val::One => true,
                    Val::Opt(ok) => rest
                        .peek()
                        .and_then(|v| v.to_str())
                        .is_some_and(|v| ok.contains(&v.to_ascii_lowercase().as_str())),
                };
                if take {
                    if let Some(v) = rest.next() {
                        shown = format!("{name} {}", v.to_string_lossy());
                    }
                }
            }
            eprintln!("warning: '{shown}' has no effect in specd (CPU engine); ignored");
            continue;
        }
        if UNSUPPORTED.contains(&name.as_str()) {
            return Err(format!(
                "the llama-server flag '{name}' is not supported by specd"
            ));
        }
        match name.as_str() {
            "-s" | "--seed" => {
                let v = match inline {
                    Some(v) => Some(v),
                    None => rest.next().map(|v| v.to_string_lossy().into_owned()),
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
                    None => rest.next().map(|v| v.to_string_lossy().into_owned()),
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
            "-b" | "--batch-size" => b_at = Some(out.len()),
            _ => {}
        }
        match inline {
            Some(v) => out.push(format!("{name}={v}").into()),
            None => out.push(name.into()),
        }
    }
    if let (true, Some(i)) = (has_ub, b_at) {
        // -b is llama.cpp's logical batch; specd processes prompts in chunks of -ub.
        let inline = out[i].to_string_lossy().contains('=');
        out.drain(i..(i + if inline { 1 } else { 2 }).min(out.len()));
        eprintln!("warning: '-b' ignored: specd processes prompts in chunks of --ubatch-size");
    }
    Ok(out)
}

fn spinner(len: u64) -> ProgressBar {
    let pb = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

fn read_file(p: &std::path::Path) -> Result<String> {
    std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
}

/// Runs the server until Ctrl-C / SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    if a.context_shift {
        bail!("--context-shift is not possible with recurrent state (and not implemented for attention-only models): generation stops when a slot's context is full");
    }
    if a.no_jinja {
        eprintln!(
            "warning: '--no-jinja' has no effect: specd always renders chat templates with Jinja"
        );
    }
    let spec = a.spec.params()?;
    let rollback = a.spec.rollback()?;
    let mut sampler = a.sampling.params();
    sampler.typical_p = a.typical;
    sampler.validate().map_err(|e| anyhow::anyhow!("{e}"))?;

    let pb = spinner(if a.spec.model_draft.is_some() { 3 } else { 2 });
    let path = match &a.model.model {
        Some(p) => p.clone(),
        None => {
            pb.set_message("generating the demo model (first use)");
            demo_model_path()?
        }
    };
    pb.set_message(format!("loading {}", path.display()));
    let opts = ModelOptions {
        n_threads: a.model.threads,
        n_ubatch: a.model.batch_size,
    };
    let model = Arc::new(
        Model::load(&path, opts.clone()).with_context(|| format!("loading {}", path.display()))?,
    );
    pb.inc(1);
    let draft_model = match &a.spec.model_draft {
        Some(p) => {
            pb.set_message(format!("loading draft model {}", p.display()));
            let m = Model::load(p, opts)
                .with_context(|| format!("loading {}", p.display()))?
                .share_threads(&model);
            pb.inc(1);
            Some(Arc::new(m))
        }
        None => None,
    };

    let n_ctx = match a.model.ctx_size {
        0 => model.config().n_ctx_train.max(1),
        n => n,
    };
    let (n_parallel, kv_unified) = match a.parallel {
        None | Some(-1) => (4, !a.no_kv_unified),
        Some(n) if n >= 1 => (n as usize, a.kv_unified),
        Some(n) => bail!("--parallel {n}: need at least 1 slot (or -1 for auto)"),
    };
    let n_ctx_slot = if kv_unified {
        n_ctx
    } else {
        n_ctx / n_parallel
    };
    if n_ctx_slot < 8 {
        bail!("context of {n_ctx} tokens over {n_parallel} slots leaves {n_ctx_slot} per slot: raise -c or use --kv-unified");
    }

    let chat_template = match (&a.chat_template_file, &a.chat_template) {
        (Some(f), _) => read_file(f)?,
        (None, Some(t)) if t.trim() == "chatml" => specd_tokenizer::CHATML_TEMPLATE.to_string(),
        (None, Some(t)) if t.contains("{%") || t.contains("{{") => t.clone(),
        (None, Some(t)) => bail!(
            "--chat-template '{t}': specd's only built-in template is 'chatml'; give Jinja source or --chat-template-file"
        ),
        (None, None) => model
            .tokenizer()
            .chat_template()
            .unwrap_or(specd_tokenizer::CHATML_TEMPLATE)
            .to_string(),
    };

    let mut api_keys: Vec<String> = a
        .api_key
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(String::from)
        .collect();
    if let Some(f) = &a.api_key_file {
        api_keys.extend(
            read_file(f)?
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(String::from),
        );
    }

    let grammar = match (
        &a.grammar,
        &a.grammar_file,
        &a.json_schema,
        &a.json_schema_file,
    ) {
        (Some(g), _, _, _) => Some(GrammarSpec::Gbnf(g.clone())),
        (None, Some(f), _, _) => Some(GrammarSpec::Gbnf(read_file(f)?)),
        (None, None, Some(s), _) => Some(GrammarSpec::JsonSchema(
            serde_json::from_str(s).context("--json-schema is not valid JSON")?,
        )),
        (None, None, None, Some(f)) => Some(GrammarSpec::JsonSchema(
            serde_json::from_str(&read_file(f)?).context("--json-schema-file is not valid JSON")?,
        )),
        _ => None,
    };

    let body_limit = std::env::var("SPECD_MAX_BODY_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16 << 20);
    let model_path = path.display().to_string();
    let cfg = ServerConfig {
        host: a.host.clone(),
        port: a.port,
        n_parallel,
        n_ctx_slot,
        api_keys,
        metrics: a.metrics,
        slots: !a.no_slots,
        model_id: a.alias.clone().unwrap_or_else(|| model_path.clone()),
        model_path,
        tags: a
            .tags
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(String::from)
            .collect(),
        defaults: Defaults {
            n_predict: usize::try_from(a.n_predict).ok(),
            sampler,
            spec,
            cache_prompt: !a.no_cache_prompt,
            grammar,
            ignore_eos: a.ignore_eos,
            logit_bias: a.sampling.logit_bias.clone(),
        },
        chat_template,
        cors_origins: a
            .cors_origins
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(String::from)
            .collect(),
        body_limit,
        rollback,
        ctx_checkpoints: a.ctx_checkpoints,
        kv_unified,
        draft_model,
        verbose: a.verbose,
        kv_types: a.model.kv_types(),
    };

    pb.set_message("starting the engine");
    let state = AppState::new(cfg.clone(), model.clone()).map_err(anyhow::Error::msg)?;
    pb.inc(1);
    pb.finish_and_clear();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let addr = if cfg.host.contains(':') {
            format!("[{}]:{}", cfg.host, cfg.port)
        } else {
            format!("{}:{}", cfg.host, cfg.port)
        };
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        let mc = model.config();
        eprintln!(
            "specd: model {} ({}, {} layers, vocab {}), {} slots × {} tokens of context{}",
            cfg.model_id,
            mc.arch.name(),
            mc.n_layer,
            mc.n_vocab,
            cfg.n_parallel,
            cfg.n_ctx_slot,
            if cfg.defaults.spec.enabled() {
                format!(
                    ", speculation: {}",
                    cfg.defaults
                        .spec
                        .drafters
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                        .join(",")
                )
            } else {
                String::new()
            }
        );
        eprintln!("specd: {}", model.weights_summary());
        eprintln!("specd: listening on http://{local}");
        specd_server::serve(state, listener)
            .await
            .context("serving HTTP")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre(s: &str) -> Result<Vec<String>, String> {
        let args: Vec<OsString> = s.split_whitespace().map(OsString::from).collect();
        preprocess(args).map(|v| v.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn renames_two_letter_flags_and_drops_ignored_ones() {
        let v =
            pre("specd serve -np 2 -md d.gguf -ngl 99 -fa on -ctk f16 -ctv q8_0 -c 512 --port 0")
                .unwrap();
        assert_eq!(
            v,
            "specd serve --parallel 2 --model-draft d.gguf --cache-type-k f16 --cache-type-v f16 -c 512 --port 0"
                .split(' ')
                .collect::<Vec<_>>()
        );
        // -fa as a plain switch does not swallow the next flag.
        let v = pre("specd serve -fa -c 64").unwrap();
        assert_eq!(v, ["specd", "serve", "-c", "64"]);
        let v = pre("specd serve --n-gpu-layers=99 --flash-attn=auto -t 2").unwrap();
        assert_eq!(v, ["specd", "serve", "-t", "2"]);
    }

    #[test]
    fn seed_minus_one_and_batch_sizes() {
        let v = pre("specd serve --seed -1 -s 5 --seed=-1").unwrap();
        assert_eq!(
            v,
            [
                "specd",
                "serve",
                "--seed",
                "4294967295",
                "-s",
                "5",
                "--seed",
                "4294967295"
            ]
        );
        let v = pre("specd serve -b 2048 -ub 256").unwrap();
        assert_eq!(v, ["specd", "serve", "--ubatch-size", "256"]);
        let v = pre("specd serve -b 128").unwrap();
        assert_eq!(v, ["specd", "serve", "-b", "128"]);
    }

    #[test]
    fn refuses_unsupported_and_leaves_other_commands_alone() {
        let e = pre("specd serve --lora x.gguf").unwrap_err();
        assert!(e.contains("--lora"), "{e}");
        let v = pre("specd generate -np 2").unwrap();
        assert_eq!(v, ["specd", "generate", "-np", "2"]);
    }
}
