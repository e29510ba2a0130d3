//! Code infill: llama-server's `POST /infill`, and OpenAI's `suffix` on `/v1/completions`.
//!
//! The prompt is the model's fill-in-the-middle layout, built from its FIM tokens (GGUF
//! metadata, or found by their text): the repo-level format of Qwen2.5/3-Coder
//! (`<|repo_name|>myproject`, `<|file_sep|>NAME` before each extra file), then
//! `<|fim_prefix|>PREFIX PROMPT<|fim_suffix|>SUFFIX<|fim_middle|>`. Token budgets are
//! llama-server's so the same request gives the same prompt tokens.

use super::llama::respond;
use super::prompt::{is_int, prompt_token, tokenize_prompt};
use super::stream::into_response;
use super::*;
use crate::error::{ErrorKind, JsonBody};
use crate::scope::Caller;
use axum::extract::State;
use axum::response::Response;
use serde_json::Value;
use specd_tokenizer::FimTokens;

/// Drafters an infill request uses when neither it nor the server names any: the suffix and the
/// extra files are in the prompt, and the middle usually reuses their lines and ends by
/// rejoining the suffix. `ngram-map-k` indexes this request's own tokens only (no table shared
/// with other requests, unlike `ngram-mod`) and sizes its drafts by what was accepted last.
pub const INFILL_DRAFTERS: [DrafterKind; 1] = [DrafterKind::NgramMapK];

/// The project name of the repo-level format (llama-server writes this fixed name too).
const REPO_NAME: &str = "myproject";
/// The name of the file being edited in the repo-level format (fixed, as in llama-server).
const FILE_NAME: &str = "filename";
/// Separates extra files for a model without a file separator token.
const SNIPPET_SEPARATOR: &str = "\n\n--- snippet ---\n\n";

/// The FIM tokens a layout needs, or llama-server's 501 naming those missing.
fn fim_tokens(st: &AppState) -> Result<(FimTokens, [u32; 3]), ApiError> {
    let fim = st.model.tokenizer().fim();
    if let (Some(p), Some(s), Some(m)) = (fim.pre, fim.suf, fim.mid) {
        return Ok((fim, [p, s, m]));
    }
    let mut missing = String::new();
    for (id, what) in [
        (fim.pre, "prefix"),
        (fim.suf, "suffix"),
        (fim.mid, "middle"),
    ] {
        if id.is_none() {
            missing.push_str(&format!("{what} token is missing. "));
        }
    }
    Err(ApiError::new(
        ErrorKind::NotSupported,
        format!("Infill is not supported by this model: {missing}"),
    ))
}

/// Plain text (special tokens not parsed: code may contain `<|im_end|>` literally).
fn tokenize_text(st: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    st.model
        .tokenizer()
        .encode(text, false, false)
        .map_err(|e| ApiError::invalid(e.to_string()))
}

/// `input_prefix` / `input_suffix`: a string, or token ids mixed with strings.
fn tokenize_part(st: &AppState, key: &str, v: &Value) -> Result<Vec<u32>, ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "\"{key}\" must be a string or an array of strings and token ids"
        ))
        .with("param", key)
    };
    match v {
        Value::String(s) => tokenize_text(st, s),
        Value::Array(items) => {
            let mut out = Vec::new();
            for it in items {
                match it {
                    Value::String(s) => out.extend(tokenize_text(st, s)?),
                    n if is_int(n) => out.push(prompt_token(st, n)?),
                    _ => return Err(bad()),
                }
            }
            Ok(out)
        }
        _ => Err(bad()),
    }
}

/// One `input_extra` file.
struct ExtraFile {
    filename: String,
    text: String,
}

/// `input_extra`: `[{"filename": string (optional), "text": string}]`, checked as llama-server
/// does (same messages).
fn parse_extra(f: &Fields) -> Result<Vec<ExtraFile>, ApiError> {
    let items = match f.get("input_extra") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::invalid(
                "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
            )
            .with("param", "input_extra"))
        }
    };
    items
        .iter()
        .map(|c| {
            let Some(text) = c.get("text").and_then(Value::as_str) else {
                return Err(ApiError::invalid(
                    "extra_context chunk must contain a \"text\" field with a string value",
                )
                .with("param", "input_extra"));
            };
            let filename = match c.get("filename") {
                None => "tmp",
                Some(Value::String(s)) => s.as_str(),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "extra_context chunk's \"filename\" field must be a string",
                    )
                    .with("param", "input_extra"))
                }
            };
            Ok(ExtraFile {
                filename: filename.to_string(),
                text: text.to_string(),
            })
        })
        .collect()
}

/// The parts of a FIM prompt, tokenized.
struct FimParts {
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    /// Written after the prefix, where the middle starts (`prompt` of `/infill`).
    prompt: Vec<u32>,
    extra: Vec<ExtraFile>,
}

/// Lays out a FIM prompt as llama-server does. The prefix keeps its last 3/4 of a batch, the
/// suffix its first 1/4 less the prompt and two markers; the extra files (with the repo-level
/// markers) fill what the context leaves after a batch and twice the server's `n_predict`, their
/// oldest tokens dropped first — and they go before BOS, where llama-server puts them.
fn layout(
    st: &AppState,
    fim: FimTokens,
    [pre, suf, mid]: [u32; 3],
    p: FimParts,
) -> Result<Vec<u32>, ApiError> {
    let mut extra = Vec::new();
    if let Some(rep) = fim.rep {
        extra.push(rep);
        extra.extend(tokenize_text(st, &format!("{REPO_NAME}\n"))?);
    }
    for file in &p.extra {
        match fim.sep {
            Some(sep) => {
                extra.push(sep);
                extra.extend(tokenize_text(st, &format!("{}\n", file.filename))?);
            }
            None => extra.extend(tokenize_text(st, SNIPPET_SEPARATOR)?),
        }
        extra.extend(tokenize_text(st, &file.text)?);
    }
    if let Some(sep) = fim.sep {
        extra.push(sep);
        extra.extend(tokenize_text(st, &format!("{FILE_NAME}\n"))?);
    }

    // The batch llama-server would have (`-b`, 2048 by default; specd's prompts go in
    // `--ubatch-size` chunks, and -b only sets this budget).
    let n_batch = st.cfg.infill_batch;
    let n_prefix = p.prefix.len().min(3 * (n_batch / 4));
    let n_suffix = p
        .suffix
        .len()
        .min((n_batch / 4).saturating_sub(2 + p.prompt.len()));
    // llama-server's n_predict is -1 when unlimited: the budget then grows by 2.
    let n_predict = st.cfg.defaults.n_predict.map_or(-1, |n| n as i64);
    let room = st.cfg.n_ctx_slot as i64 - n_batch as i64 - 2 * n_predict;
    let n_extra = (room.max(0) as usize).min(extra.len());

    let mut out = Vec::with_capacity(n_extra + n_prefix + n_suffix + p.prompt.len() + 4);
    out.extend_from_slice(&extra[extra.len() - n_extra..]);
    let tok = st.model.tokenizer();
    if tok.add_bos() {
        out.extend(tok.bos_id());
    }
    out.push(pre);
    out.extend_from_slice(&p.prefix[p.prefix.len() - n_prefix..]);
    out.extend_from_slice(&p.prompt);
    out.push(suf);
    out.extend_from_slice(&p.suffix[..n_suffix]);
    out.push(mid);
    Ok(out)
}

/// The drafters an infill request that names none uses: those `--spec-type` named, else
/// [`INFILL_DRAFTERS`] (chosen for infill over the server's general default).
pub fn infill_drafters(defaults: &crate::params::Defaults) -> Vec<DrafterKind> {
    if defaults.spec.drafters.is_empty() || !defaults.spec_named {
        INFILL_DRAFTERS.to_vec()
    } else {
        defaults.spec.drafters.clone()
    }
}

/// Whether the model can infill (it has prefix, suffix and middle tokens).
pub fn infill_supported(st: &AppState) -> bool {
    fim_tokens(st).is_ok()
}

/// Turns speculation on for an infill request that does not choose its drafters, when the
/// server's default has none: n-gram drafting from the prompt's own code is free material.
fn infill_spec(st: &AppState, f: &Fields, g: &mut GenParams) -> Result<(), ApiError> {
    let nested = f.object("speculative")?;
    let says = |k: &str| {
        f.get(&format!("speculative.{k}")).is_some()
            || nested.as_ref().is_some_and(|n| n.get(k).is_some())
    };
    if !says("type") && !says("enabled") {
        g.spec.drafters = infill_drafters(&st.cfg.defaults);
    }
    Ok(())
}

/// `POST /infill`: llama-server's code infill. Fields: `input_prefix`, `input_suffix` (required),
/// `input_extra`, `prompt` (a string, written where the middle starts), and every `/completion`
/// field; the answer is `/completion`'s.
pub async fn infill(
    State(st): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(body): JsonBody,
) -> Response {
    into_response(infill_inner(st, caller, body).await)
}

async fn infill_inner(
    st: Arc<AppState>,
    caller: Caller,
    body: Value,
) -> Result<Response, ApiError> {
    let (_, (tokens, g, x)) = on_worker(&st, body, move |st, f| {
        let prompt = match f.get("prompt") {
            None => Vec::new(),
            Some(Value::String(s)) => tokenize_prompt(st, s, false)?,
            Some(_) => {
                return Err(ApiError::invalid("\"prompt\" must be a string").with("param", "prompt"))
            }
        };
        let part = |key: &str| match f.get(key) {
            Some(v) => tokenize_part(st, key, v),
            None => Err(ApiError::invalid(format!("\"{key}\" is required")).with("param", key)),
        };
        let (prefix, suffix) = (part("input_prefix")?, part("input_suffix")?);
        let extra = parse_extra(f)?;
        let mut g = gen_params(st, f, Api::Llama, caller)?;
        infill_spec(st, f, &mut g)?;
        let x = Extras::of(st, f, &g)?;
        // The model's ability is checked once the request is known to be valid: a malformed
        // request is told what is wrong with it (400) on any model, not only that this model
        // cannot infill (501).
        let (fim, ids) = fim_tokens(st)?;
        let parts = FimParts {
            prefix,
            suffix,
            prompt,
            extra,
        };
        Ok((layout(st, fim, ids, parts)?, g, x))
    })
    .await?;
    respond(st, tasks(vec![tokens], &g), x).await
}

/// OpenAI's `suffix` on `/v1/completions`: each prompt becomes the prefix of a FIM prompt with
/// this suffix (None: no `suffix`, or an empty one, a plain completion). llama-server ignores
/// the field; specd honours it on a model with FIM tokens and refuses it (501, as `/infill`)
/// on one without, rather than answer a different question.
pub(crate) fn suffix_prompts(
    st: &AppState,
    f: &Fields,
    g: &mut GenParams,
) -> Result<Option<Vec<Vec<u32>>>, ApiError> {
    let suffix = match f.get("suffix") {
        None => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(ApiError::invalid("'suffix' must be a string").with("param", "suffix"))
        }
    };
    let prompts: Vec<&Value> = match f.get("prompt") {
        Some(Value::Array(a)) if !a.iter().any(is_int) => a.iter().collect(),
        Some(p) => vec![p],
        None => return Err(ApiError::invalid("\"prompt\" is required").with("param", "prompt")),
    };
    infill_spec(st, f, g)?;
    let suffix = tokenize_text(st, &suffix)?;
    let prefixes = prompts
        .into_iter()
        .map(|p| tokenize_part(st, "prompt", p))
        .collect::<Result<Vec<_>, _>>()?;
    // As `/infill`: the request is checked before the model's FIM tokens (400 before 501).
    let (fim, ids) = fim_tokens(st)?;
    prefixes
        .into_iter()
        .map(|prefix| {
            let parts = FimParts {
                prefix,
                suffix: suffix.clone(),
                prompt: Vec::new(),
                extra: Vec::new(),
            };
            layout(st, fim, ids, parts)
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}
