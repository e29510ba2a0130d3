//! llama-server's command line on `specd serve`.
//!
//! llama-server's two-letter short flags (`-np`, `-md`, `-ub`, …) and the flags that mean
//! nothing on specd's CPU engine (`-ngl`, `-fa`, `--mlock`, …) are handled by [`preprocess`]
//! before clap sees the arguments: the first are renamed to their long forms, the second are
//! dropped with a one-line warning. llama-server flags specd cannot honour are an error saying
//! so; anything else unknown is clap's usual error naming the flag.

use std::ffi::OsString;

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
    "-l",
    "--logit-bias",
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
