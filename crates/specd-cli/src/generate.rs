//! `specd generate`: one prompt, one continuation, optionally speculative.

use crate::demo::demo_model_path;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use specd_backend::Backend;
use specd_memory::{KvType, MemoryConfig};
use specd_models::{CpuBackend, Model, ModelOptions};
use specd_sampling::{GrammarSpec, SamplerParams};
use specd_spec::{DrafterKind, Engine, RollbackKind, SequenceRequest, SpecParams, VerifyKind};
use specd_tokenizer::ChatMessage;
use std::io::Write;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

/// Options shared by commands that load a model.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: the built-in demo model, generated on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Compute threads (default: all cores).
    #[arg(short = 't', long = "threads", default_value_t = 0)]
    pub threads: usize,
    /// Context size in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: usize,
    /// Rows per forward pass (prompt processing chunk).
    #[arg(
        short = 'b',
        long = "batch-size",
        alias = "ubatch-size",
        default_value_t = 512
    )]
    pub batch_size: usize,
    /// KV cache type for keys: f32 (default, exact activations) or f16 (llama.cpp's default;
    /// half the memory and the attention traffic on long contexts).
    #[arg(long = "cache-type-k", visible_alias = "ctk", default_value = "f32")]
    pub cache_type_k: KvType,
    /// KV cache type for values: f32 or f16.
    #[arg(long = "cache-type-v", visible_alias = "ctv", default_value = "f32")]
    pub cache_type_v: KvType,
}

impl ModelArgs {
    /// The KV cache types chosen (K, V).
    pub fn kv_types(&self) -> (KvType, KvType) {
        (self.cache_type_k, self.cache_type_v)
    }
    /// Loads the model (or the demo model).
    pub fn load(&self) -> Result<Arc<Model>> {
        let path = match &self.model {
            Some(p) => p.clone(),
            None => demo_model_path()?,
        };
        let opts = ModelOptions {
            n_threads: self.threads,
            n_ubatch: self.batch_size,
        };
        let m = Model::load(&path, opts).with_context(|| format!("loading {}", path.display()))?;
        eprintln!("specd: {}", m.weights_summary());
        Ok(Arc::new(m))
    }
    /// Loads a draft model on the target's compute threads (they never compute at once).
    pub fn load_draft(&self, path: &Path, target: &Model) -> Result<Arc<dyn Backend>> {
        let opts = ModelOptions {
            n_threads: self.threads,
            n_ubatch: self.batch_size,
        };
        let m = Model::load(path, opts)
            .with_context(|| format!("loading {}", path.display()))?
            .share_threads(target);
        Ok(cpu_backend(&Arc::new(m)))
    }
}

/// A model loaded here on the backend that runs it: the CPU's (the one backend so far).
pub fn cpu_backend(model: &Arc<Model>) -> Arc<dyn Backend> {
    Arc::new(CpuBackend::new(model.clone()))
}

/// Sampling flags (llama.cpp names).
#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: i32,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// RNG seed (default: random).
    #[arg(short = 's', long = "seed", default_value_t = u32::MAX)]
    pub seed: u32,
    /// Logit bias `TOKEN_ID+BIAS` or `TOKEN_ID-BIAS` (`15043-inf` bans), repeatable: added to
    /// the token's logit before the rest of the sampler chain.
    #[arg(
        short = 'l',
        long = "logit-bias",
        value_name = "TOKEN_ID(+/-)BIAS",
        value_parser = parse_logit_bias,
        allow_hyphen_values = true
    )]
    pub logit_bias: Vec<(u32, f32)>,
}

/// llama.cpp's `--logit-bias TOKEN_ID(+/-)BIAS`: an id, a sign, a number (`inf` allowed).
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let bad = || format!("'{s}': expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043-1");
    let t = s.trim_start();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let id: u32 = t[..digits].parse().map_err(|_| bad())?;
    let rest = t[digits..].trim_start();
    let (sign, value) = match rest.as_bytes().first() {
        Some(b'+') => (1.0, &rest[1..]),
        Some(b'-') => (-1.0, &rest[1..]),
        _ => return Err(bad()),
    };
    let bias: f32 = value.trim().parse().map_err(|_| bad())?;
    if bias.is_nan() {
        return Err(bad());
    }
    Ok((id, sign * bias))
}

impl SamplingArgs {
    pub fn params(&self) -> SamplerParams {
        SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplerParams::default()
        }
    }
}

/// Speculation flags (llama.cpp names).
#[derive(Args, Clone)]
pub struct SpecArgs {
    /// Drafters, comma separated: ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod,
    /// ngram-cache, draft-simple, draft-mtp, synthetic; `none` (or empty): no speculation.
    /// Default: ngram-mod, then draft-mtp when the model has an MTP head and draft-simple when
    /// --model-draft gives a draft model (the controller keeps each from slowing decoding).
    #[arg(long = "spec-type")]
    pub spec_type: Option<String>,
    #[arg(long = "spec-draft-n-max", alias = "draft-max", default_value_t = 16)]
    pub n_max: usize,
    #[arg(long = "spec-draft-n-min", alias = "draft-min", default_value_t = 0)]
    pub n_min: usize,
    /// A model drafter stops drafting where its top probability falls below this (llama-server's
    /// default: 0, the controller alone decides how much to draft).
    #[arg(
        long = "spec-draft-p-min",
        alias = "draft-p-min",
        default_value_t = 0.0
    )]
    pub p_min: f32,
    /// Draft model for draft-simple.
    #[arg(long = "model-draft", alias = "md")]
    pub model_draft: Option<PathBuf>,
    /// How recurrent state is rolled back: replay (re-run the recurrence; `fast` is its earlier
    /// name), snapshot, checkpoint.
    #[arg(long = "spec-rollback", default_value = "replay")]
    pub rollback: String,
    /// Synthetic drafter: unconditional per-position acceptance probabilities P0,P1,...
    /// Drafts are then n-max long, as llama-server's, unless --spec-adaptive.
    #[arg(long = "spec-synth-rates")]
    pub synth_rates: Option<String>,
    /// Synthetic drafter: target mean acceptance length, including the target's token.
    #[arg(long = "spec-synth-len")]
    pub synth_len: Option<f32>,
    /// Always draft n-max (no never-slower controller).
    #[arg(long = "spec-fixed", overrides_with = "adaptive")]
    pub fixed: bool,
    /// Keep the never-slower controller with synthetic acceptance (--spec-synth-*), which
    /// otherwise drafts n-max tokens every round like llama-server, so that a seeded request
    /// repeats its draft counts: the controller's lengths follow measured timings.
    #[arg(long = "spec-adaptive", overrides_with = "fixed")]
    pub adaptive: bool,
    /// Draft verification: exact (output identical to plain decoding) or probabilistic
    /// (rejection sampling for draft-simple / draft-mtp: same output distribution, not the same
    /// tokens).
    #[arg(long = "spec-verify", default_value = "exact")]
    pub verify: String,
}

impl SpecArgs {
    /// The drafters `--spec-type` names. Without the flag: specd's default, speculation on
    /// (`ngram-mod`, then `draft-mtp` when `has_mtp`, then `draft-simple` with a draft model);
    /// `none` anywhere in the list turns speculation off, as in llama-server.
    pub fn drafters(&self, has_mtp: bool) -> Result<Vec<DrafterKind>> {
        let synth = self.synth_rates.is_some() || self.synth_len.is_some();
        let mut drafters = match self.spec_type.as_deref() {
            Some(list) if list.split(',').any(|t| t.trim() == "none") => Vec::new(),
            Some(list) => DrafterKind::parse_list(list).map_err(anyhow::Error::msg)?,
            // The synthetic flags name their drafter (below); nothing else is added to it.
            None if synth => Vec::new(),
            None => {
                let mut d = vec![DrafterKind::NgramMod];
                if has_mtp {
                    d.push(DrafterKind::DraftMtp);
                }
                if self.model_draft.is_some() {
                    d.push(DrafterKind::DraftSimple);
                }
                d
            }
        };
        if synth && !drafters.contains(&DrafterKind::Synthetic) {
            drafters.insert(0, DrafterKind::Synthetic);
        }
        Ok(drafters)
    }

    /// Speculation parameters for a model with (`has_mtp`) or without an MTP head.
    pub fn params(&self, has_mtp: bool) -> Result<SpecParams> {
        let drafters = self.drafters(has_mtp)?;
        let synth = self.synth_rates.is_some() || self.synth_len.is_some();
        let mut p = SpecParams {
            drafters,
            n_max: self.n_max,
            n_min: self.n_min,
            p_min: self.p_min,
            // llama-server's synthetic acceptance is a benchmark of the pipeline at fixed draft
            // lengths, and its tests expect two identical seeded requests to draft and accept
            // the same counts; the controller's choices follow timings.
            adaptive: !self.fixed && (!synth || self.adaptive),
            synth_len: self.synth_len,
            verify: VerifyKind::parse(&self.verify).with_context(|| {
                format!(
                    "unknown verification '{}' (exact, probabilistic)",
                    self.verify
                )
            })?,
            ..SpecParams::default()
        };
        if let Some(r) = &self.synth_rates {
            p.synth_rates = r
                .split(',')
                .map(|x| {
                    x.trim()
                        .parse::<f32>()
                        .with_context(|| format!("bad rate '{x}'"))
                })
                .collect::<Result<_>>()?;
        }
        p.validate().map_err(anyhow::Error::msg)?;
        Ok(p)
    }
    pub fn rollback(&self) -> Result<RollbackKind> {
        RollbackKind::parse(&self.rollback).with_context(|| {
            format!(
                "unknown rollback '{}' (replay, snapshot, checkpoint)",
                self.rollback
            )
        })
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt", default_value = "")]
    pub prompt: String,
    /// Prompt as comma-separated token ids (instead of text).
    #[arg(long = "prompt-tokens")]
    pub prompt_tokens: Option<String>,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Wrap the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Do not stop at end-of-generation tokens.
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Print one JSON object (prompt, token ids, text, timings, statistics) instead of text.
    #[arg(long)]
    pub json: bool,
    /// With --json: the top N log-probabilities of each generated token.
    #[arg(long = "n-probs", default_value_t = 0)]
    pub n_probs: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    #[command(flatten)]
    pub grammar: GrammarArgs,
}

/// Output constraints (llama.cpp names).
#[derive(Args, Clone, Default)]
pub struct GrammarArgs {
    /// GBNF grammar the output must follow (start rule `root`).
    #[arg(long = "grammar")]
    pub grammar: Option<String>,
    /// File with a GBNF grammar.
    #[arg(long = "grammar-file")]
    pub grammar_file: Option<PathBuf>,
    /// JSON schema the output must follow (`{}` for any JSON object).
    #[arg(short = 'j', long = "json-schema")]
    pub json_schema: Option<String>,
    /// File with a JSON schema.
    #[arg(long = "json-schema-file")]
    pub json_schema_file: Option<PathBuf>,
}

impl GrammarArgs {
    /// The constraint, if one was given (at most one may be).
    pub fn spec(&self) -> Result<Option<GrammarSpec>> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
        };
        let mut given = Vec::new();
        if let Some(g) = &self.grammar {
            given.push(GrammarSpec::Gbnf(g.clone()));
        }
        if let Some(p) = &self.grammar_file {
            given.push(GrammarSpec::Gbnf(read(p)?));
        }
        for text in [
            self.json_schema.clone(),
            self.json_schema_file.as_ref().map(read).transpose()?,
        ]
        .into_iter()
        .flatten()
        {
            let v: serde_json::Value =
                serde_json::from_str(&text).context("the JSON schema is not valid JSON")?;
            given.push(GrammarSpec::JsonSchema(v));
        }
        if given.len() > 1 {
            bail!(
                "give at most one of --grammar, --grammar-file, --json-schema, --json-schema-file"
            );
        }
        Ok(given.pop())
    }
}

pub fn run(a: GenerateArgs) -> Result<()> {
    let cpu = a.model.load()?;
    let model = cpu_backend(&cpu);
    let tok = model.tokenizer();
    let prompt_text = if a.chat {
        let tmpl = tok
            .chat_template()
            .context("the model has no chat template")?;
        let t = specd_tokenizer::ChatTemplate::new(tmpl)?;
        let msgs = vec![ChatMessage::new("user", &a.prompt)];
        t.render(&msgs, true, &Default::default())?
    } else {
        a.prompt.clone()
    };
    let prompt: Vec<u32> = match &a.prompt_tokens {
        Some(s) => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<u32>()
                    .with_context(|| format!("bad token id '{x}'"))
            })
            .collect::<Result<_>>()?,
        None => tok.encode(&prompt_text, true, a.chat)?,
    };
    if prompt.is_empty() {
        bail!("the prompt is empty (give -p TEXT or --prompt-tokens)");
    }
    let spec = a.spec.params(model.info().has_mtp)?;
    let mem_cfg = MemoryConfig {
        n_ctx: a.model.ctx_size,
        max_seqs: 1,
        kv_type_k: a.model.cache_type_k,
        kv_type_v: a.model.cache_type_v,
        ..Default::default()
    };
    let mut req = SequenceRequest {
        prompt: prompt.clone(),
        n_predict: a.n_predict,
        sampler: a.sampling.params(),
        ignore_eos: a.ignore_eos,
        stop: Vec::new(),
        spec: spec.clone(),
        reference: None,
        draft_model: None,
        n_probs: a.n_probs,
        post_sampling_probs: false,
        grammar: a.grammar.spec()?,
        logit_bias: a.sampling.logit_bias.clone(),
        reasoning_budget: None,
        cache_prompt: false,
        cache_scope: 0,
        time_limit: None,
        checkpoints: Vec::new(),
        prompt_logprobs: None,
    };
    if let Some(p) = &a.spec.model_draft {
        req.draft_model = Some(a.model.load_draft(p, &cpu)?);
    }
    if spec.drafters.contains(&specd_spec::DrafterKind::Synthetic) {
        // The synthetic drafter needs the true continuation: run plain decoding first.
        let mut plain = Engine::new(model.clone(), mem_cfg.clone(), RollbackKind::Replay)?;
        let mut r = req.clone();
        r.spec = SpecParams::default();
        let out = plain.generate(0, r)?;
        let mut reference = prompt.clone();
        reference.extend_from_slice(&out.tokens);
        req.reference = Some(Arc::new(reference));
    }
    let mut engine = Engine::new(model.clone(), mem_cfg, a.spec.rollback()?)?;
    if a.json {
        let out = engine.generate(0, req)?;
        let v = json!({
            "prompt": prompt_text,
            "prompt_tokens": prompt,
            "tokens": out.tokens,
            "text": out.text,
            "stop_reason": out.reason,
            "probs": out.probs,
            "timings": {
                "prompt_n": out.n_prompt,
                "prompt_ms": out.prompt_secs * 1e3,
                "prompt_per_second": out.n_prompt as f64 / out.prompt_secs.max(1e-9),
                "predicted_n": out.tokens.len(),
                "predicted_ms": out.gen_secs * 1e3,
                "predicted_per_second": out.tokens.len() as f64 / out.gen_secs.max(1e-9),
            },
            "speculative": {
                "types": spec.drafters.iter().map(|d| d.name()).collect::<Vec<_>>(),
                "rollback": a.spec.rollback()?.name(),
                "verify": spec.verify.name(),
                "acceptance_length": out.stats.acceptance_length(),
                "acceptance_rate": out.stats.acceptance_rate(),
                "stats": out.stats,
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    engine.add(0, req)?;
    let mut stdout = std::io::stdout();
    loop {
        for ev in engine.step() {
            match ev {
                specd_spec::StepEvent::Tokens { text, .. } => {
                    print!("{text}");
                    stdout.flush().ok();
                }
                specd_spec::StepEvent::Finished { output, .. } => {
                    println!();
                    eprintln!(
                        "[prompt {} tok, {:.1} tok/s | generated {} tok, {:.1} tok/s | acceptance length {:.2}]",
                        output.n_prompt,
                        output.n_prompt as f64 / output.prompt_secs.max(1e-9),
                        output.tokens.len(),
                        output.tokens.len() as f64 / output.gen_secs.max(1e-9),
                        output.stats.acceptance_length()
                    );
                    return Ok(());
                }
                specd_spec::StepEvent::Failed { error, .. } => bail!(error),
            }
        }
    }
}
