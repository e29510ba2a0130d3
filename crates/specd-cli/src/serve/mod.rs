//! `specd serve`: the HTTP server, started with llama-server's command line.
//!
//! [`llama_flags`] maps llama-server's command line onto [`args::ServeArgs`]; [`run`] loads the
//! model, builds the server's configuration and serves.

mod args;
mod listen;
mod llama_flags;

pub use args::ServeArgs;
pub use llama_flags::preprocess;

use crate::demo::demo_model_path;
use crate::generate::cpu_backend;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use specd_models::{Model, ModelOptions};
use specd_sampling::GrammarSpec;
use specd_server::cors::Cors;
use specd_server::params::Defaults;
use specd_server::{AppState, ServerConfig};
use std::sync::Arc;
use std::time::Duration;

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

/// The chat template `--chat-template` gives: Jinja source, or the name of one of llama.cpp's
/// built-in templates.
fn chat_template(t: &str) -> Result<String> {
    if let Some(src) = specd_tokenizer::templates::named(t.trim()) {
        return Ok(src.to_string());
    }
    if t.contains("{%") || t.contains("{{") {
        return Ok(t.to_string());
    }
    let names: Vec<&str> = specd_tokenizer::templates::names().collect();
    bail!(
        "--chat-template '{t}' is neither Jinja source nor a built-in template name; the built-in templates are: {}",
        names.join(", ")
    )
}

/// The variables every chat template render starts from: `--chat-template-kwargs`, then what
/// `--reasoning`, `--reasoning-effort` and `--[no-]reasoning-preserve` set (`enable_thinking`,
/// `reasoning_effort`, `preserve_reasoning`), as llama-server sets them.
fn template_kwargs(a: &ServeArgs) -> Result<serde_json::Map<String, serde_json::Value>> {
    let mut kwargs = match &a.chat_template_kwargs {
        None => serde_json::Map::new(),
        Some(s) => match serde_json::from_str(s) {
            Ok(serde_json::Value::Object(o)) => o,
            _ => bail!(
                "--chat-template-kwargs must be a JSON object, e.g. '{{\"enable_thinking\": false}}'"
            ),
        },
    };
    if let Some(r) = &a.reasoning {
        match r.to_ascii_lowercase().as_str() {
            "on" | "enabled" | "true" | "1" => {
                kwargs.insert("enable_thinking".into(), true.into());
            }
            "off" | "disabled" | "false" | "0" => {
                kwargs.insert("enable_thinking".into(), false.into());
            }
            "auto" => {}
            _ => bail!("--reasoning {r}: expected on, off or auto"),
        }
    }
    match a.reasoning_effort.as_deref() {
        None => {}
        Some("default") => {
            kwargs.remove("reasoning_effort");
        }
        Some(level) => {
            kwargs.insert("reasoning_effort".into(), level.into());
        }
    }
    if a.reasoning_preserve || a.no_reasoning_preserve {
        kwargs.insert("preserve_reasoning".into(), a.reasoning_preserve.into());
    }
    Ok(kwargs)
}

/// `--cors-origins`, or its default: loopback origins only (`localhost`; see
/// `specd_server::cors` for why — llama-server's default is any origin, and only its agent tools
/// or MCP servers make it localhost). Those are accepted with a warning: specd has none of them.
fn cors_origins(a: &ServeArgs) -> String {
    for (flag, v) in [
        ("--tools", &a.tools),
        ("--mcp-servers-config", &a.mcp_servers_config),
        ("--mcp-servers-json", &a.mcp_servers_json),
    ] {
        if let Some(v) = v {
            eprintln!("warning: '{flag} {v}' accepted, but specd has no built-in agent tools or MCP servers (/tools is not served)");
        }
    }
    if a.agent && !a.no_agent {
        eprintln!(
            "warning: '--agent' accepted, but specd has no built-in agent tools and no web UI"
        );
    }
    match &a.cors_origins {
        Some(l) => l.clone(),
        None => specd_server::cors::DEFAULT_ORIGINS.to_string(),
    }
}

/// A comma-separated list of names (`--alias`, `--tags`) as a sorted set, the way llama-server
/// keeps them: trimmed, empty ones dropped, each once.
fn name_set(list: Option<&str>) -> Vec<String> {
    let set: std::collections::BTreeSet<&str> = list
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    set.into_iter().map(String::from).collect()
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
    if a.sleep_idle_seconds == 0 || a.sleep_idle_seconds < -1 {
        bail!(
            "--sleep-idle-seconds {}: cannot be 0 or less than -1",
            a.sleep_idle_seconds
        );
    }
    let hosts = listen::parse_hosts(&a.host)?;
    let cors_origins = cors_origins(&a);
    let allowed_hosts =
        specd_server::host::AllowedHosts::parse(a.allowed_hosts.as_deref().unwrap_or(""))
            .map_err(anyhow::Error::msg)?;
    let explicit_template = match (&a.chat_template_file, &a.chat_template) {
        (Some(f), _) => Some(read_file(f)?),
        (None, Some(t)) => Some(chat_template(t)?),
        (None, None) => None,
    };
    // Checked before the model loads, so a bad flag fails at once; the default drafters
    // depend on the model (an MTP head) and are chosen once it is loaded.
    a.spec.params(false)?;
    let rollback = a.spec.rollback()?;
    let mut sampler = a.sampling.params();
    sampler.typical_p = a.typical;
    sampler.validate().map_err(|e| anyhow::anyhow!("{e}"))?;

    let pb = spinner(if a.spec.model_draft.is_some() { 3 } else { 2 });
    let path = match &a.model.model {
        Some(p) => p.clone(),
        None => {
            pb.set_message("the built-in demo model");
            demo_model_path()?
        }
    };
    pb.set_message(format!("loading {}", path.display()));
    let opts = ModelOptions {
        n_threads: a.model.threads,
        n_ubatch: a.model.batch_size,
    };
    let cpu =
        Arc::new(Model::load(&path, opts).with_context(|| format!("loading {}", path.display()))?);
    let model = cpu_backend(&cpu);
    pb.inc(1);
    let spec = a.spec.params(model.info().has_mtp)?;
    let draft_model = match &a.spec.model_draft {
        Some(p) => {
            pb.set_message(format!("loading draft model {}", p.display()));
            let m = a.model.load_draft(p, &cpu)?;
            pb.inc(1);
            Some(m)
        }
        None => None,
    };

    let n_ctx = match a.model.ctx_size {
        0 => model.info().n_ctx_train.max(1),
        n => n,
    };
    let (n_parallel, kv_unified) = match a.parallel {
        None | Some(-1) => (4, !a.no_kv_unified),
        Some(n) if n >= 1 => (n as usize, a.kv_unified),
        Some(n) => bail!("--parallel {n}: need at least 1 slot (or -1 for auto)"),
    };
    // --kv-unified-per-slot: the slots share the memory, each up to N tokens.
    let kv_unified = kv_unified || a.kv_unified_per_slot.is_some();
    let n_ctx_slot = match a.kv_unified_per_slot {
        Some(n) => n,
        None if kv_unified => n_ctx,
        None => n_ctx / n_parallel,
    };
    if n_ctx_slot < 8 {
        bail!("context of {n_ctx} tokens over {n_parallel} slots leaves {n_ctx_slot} per slot: raise -c or use --kv-unified");
    }

    let chat_template = match explicit_template {
        Some(t) => t,
        None => model
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

    let slot_save_path = match &a.slot_save_path {
        Some(d) if !d.is_dir() => bail!("--slot-save-path {}: not a directory", d.display()),
        other => other.clone(),
    };

    let vertex = specd_server::vertex::Vertex::from_env().map_err(anyhow::Error::msg)?;
    let port = match &vertex {
        Some(v) if v.port != a.port => {
            eprintln!(
                "warning: Google Cloud Vertex AI mode: AIP_HTTP_PORT {} replaces --port {}",
                v.port, a.port
            );
            v.port
        }
        _ => a.port,
    };

    let body_limit: usize = std::env::var("SPECD_MAX_BODY_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16 << 20);
    let threads_http = match a.threads_http {
        n if n >= 1 => n as usize,
        -1 | 0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => bail!("--threads-http {n}: need at least 1 (or -1: one per CPU core)"),
    };
    if a.timeout == 0 {
        bail!("--timeout 0: need at least 1 second");
    }
    if !(a.shutdown_grace >= 0.0 && a.shutdown_grace.is_finite()) {
        bail!(
            "--shutdown-grace {}: need a number of seconds, 0 or more",
            a.shutdown_grace
        );
    }
    let max_pending_bytes = a.max_pending_bytes.unwrap_or(body_limit.saturating_mul(4));
    if max_pending_bytes < body_limit {
        bail!("--max-pending-bytes {max_pending_bytes}: less than one request body may hold ({body_limit} bytes)");
    }
    if cors_origins == "*" && api_keys.is_empty() {
        // llama-server's warning for the same setting (its default there, an opt-in here).
        eprintln!("warning: security: no API key is set and CORS allows all origins: any web page opened in a browser on this machine can use this server and read its answers (set --api-key, or leave --cors-origins at its default, localhost)");
    }
    let model_path = path.display().to_string();
    let aliases = name_set(a.alias.as_deref());
    let cfg = ServerConfig {
        host: a.host.clone(),
        port,
        n_parallel,
        n_ctx_slot,
        api_keys,
        metrics: a.metrics,
        metrics_strict: a.metrics_strict,
        slots: !a.no_slots,
        model_id: aliases
            .first()
            .cloned()
            .unwrap_or_else(|| model_path.clone()),
        aliases,
        model_path,
        tags: name_set(a.tags.as_deref()),
        defaults: Defaults {
            n_predict: usize::try_from(a.n_predict).ok(),
            sampler,
            spec,
            spec_named: a.spec.spec_type.is_some(),
            cache_prompt: !a.no_cache_prompt,
            grammar,
            ignore_eos: a.ignore_eos,
            logit_bias: a.sampling.logit_bias.clone(),
        },
        chat_template,
        chat_template_kwargs: template_kwargs(&a)?,
        cors: Cors {
            origins: cors_origins,
            methods: a.cors_methods.clone(),
            headers: a.cors_headers.clone(),
            credentials: !a.no_cors_credentials,
        },
        allowed_hosts,
        body_limit,
        threads_http,
        max_pending_bytes,
        timeout: Duration::from_secs(a.timeout),
        shutdown_grace: Duration::from_secs_f64(a.shutdown_grace),
        rollback,
        ctx_checkpoints: a.ctx_checkpoints,
        cache_ram: match a.cache_ram {
            -1 => usize::MAX,
            mib => usize::try_from(mib).unwrap_or(0).saturating_mul(1 << 20),
        },
        kv_unified,
        cache_idle_slots: !a.no_cache_idle_slots,
        draft_model,
        verbose: a.verbose,
        prefill_assistant: !a.no_prefill_assistant,
        reasoning_format: specd_output::ReasoningFormat::parse(&a.reasoning_format)
            .unwrap_or_default(),
        reasoning_budget: a.reasoning_budget,
        reasoning_budget_message: a.reasoning_budget_message.clone(),
        kv_types: a.model.kv_types(),
        sleep_idle: u64::try_from(a.sleep_idle_seconds)
            .ok()
            .map(Duration::from_secs),
        slot_save_path,
        vertex,
        infill_batch: a.infill_batch.max(1),
    };
    if cfg.free_idle_slots() {
        // The tag is llama-server's debug line for this setting (its server tests read it).
        tracing::debug!(
            "idle slots go to the prompt cache in RAM when a request starts \
             __TEST_TAG_CACHE_IDLE_SLOTS_ENABLED__"
        );
    } else if a.cache_idle_slots && cfg.cache_ram == 0 {
        eprintln!("warning: --cache-idle-slots requires --cache-ram, disabling");
    }

    pb.set_message("starting the engine");
    let state = AppState::new(cfg.clone(), model.clone()).map_err(anyhow::Error::msg)?;
    pb.inc(1);
    pb.finish_and_clear();

    let reuse_port = a.reuse_port;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listeners = listen::bind(&hosts, cfg.port, reuse_port).await?;
        let mc = model.info();
        eprintln!(
            "specd: model {} ({}, {} layers, vocab {}), {} slots × {} tokens of context{}",
            cfg.model_id,
            mc.arch,
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
        let mut sockets = Vec::with_capacity(listeners.len());
        for (l, url) in listeners {
            eprintln!("specd: listening on {url}");
            sockets.push(l);
        }
        specd_server::serve(state, sockets)
            .await
            .context("serving HTTP")
    })
}
