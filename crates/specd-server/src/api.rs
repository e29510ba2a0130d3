//! The endpoints that do not generate: health, models, props, slots, tokenize, detokenize,
//! apply-template.

use crate::error::{ApiError, ErrorKind, JsonBody};
use crate::generate::{generation_settings, on_worker, render_chat};
use crate::params::Fields;
use crate::AppState;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// `GET /health`: `{"status": "ok"}`, or 503 if the engine thread has stopped.
pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.sched.alive() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        ApiError::new(ErrorKind::Unavailable, "the engine thread has stopped").into_response()
    }
}

/// `GET /v1/models` (also `/models`): the one loaded model, as llama-server lists it — in
/// OpenAI's `data` and in Ollama's `models` shape.
pub async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    let c = st.model.info();
    let name = &st.cfg.model_id;
    Json(json!({
        "models": [{
            "name": name,
            "model": name,
            "modified_at": "",
            "size": "",
            "digest": "",
            "type": "model",
            "description": "",
            "tags": [""],
            "capabilities": ["completion"],
            "parameters": "",
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "",
                "families": [""],
                "parameter_size": "",
                "quantization_level": "",
            },
        }],
        "object": "list",
        "data": [{
            "id": name,
            "aliases": st.cfg.aliases,
            "tags": st.cfg.tags,
            "object": "model",
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "created": crate::generate::unix_now(),
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": 2,
                "n_vocab": c.n_vocab,
                "n_ctx": st.cfg.n_ctx_slot,
                "n_ctx_train": c.n_ctx_train,
                "n_embd": c.n_embd,
                "n_params": st.model.info().n_params,
                "size": st.model.info().file_weight_bytes,
                "ftype": st.model.info().file_type,
                "arch": c.arch,
            },
        }],
    }))
}

/// `GET /props`: server properties (llama-server's fields plus a `specd` object).
pub async fn props(State(st): State<Arc<AppState>>) -> Json<Value> {
    let d = &st.cfg.defaults;
    let settings = generation_settings(
        &st,
        &d.sampler,
        d.n_predict,
        &[],
        d.ignore_eos,
        0,
        &d.spec,
        false,
    );
    let snap = st.sched.snapshot();
    let mem = &snap.memory;
    Json(json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": st.cfg.n_ctx_slot,
            "speculative": d.spec.enabled(),
            "is_processing": false,
            "params": settings,
            "prompt": "",
        },
        "total_slots": st.cfg.n_parallel,
        "model_path": st.cfg.model_path,
        "model_alias": st.cfg.model_id,
        "chat_template": st.cfg.chat_template,
        "chat_template_caps": st.template.caps().to_json(),
        "modalities": {"vision": false, "audio": false},
        "bos_token": st.model.tokenizer().bos_id().and_then(|i| st.model.tokenizer().token_text(i)),
        "eos_token": st.model.tokenizer().eos_id().and_then(|i| st.model.tokenizer().token_text(i)),
        "build_info": format!("specd {}", env!("CARGO_PKG_VERSION")),
        "is_sleeping": snap.sleeping,
        "specd": {
            "arch": st.model.info().arch.as_str(),
            "weight_bytes": st.model.device().weight_bytes,
            "file_weight_bytes": st.model.info().file_weight_bytes,
            "device": {
                "backend": st.model.device().backend,
                "name": st.model.device().name,
                "weight_bytes": st.model.device().weight_bytes,
            },
            "n_ctx_slot": st.cfg.n_ctx_slot,
            "kv_unified": st.cfg.kv_unified,
            "rollback": st.cfg.rollback.name(),
            "ctx_checkpoints": st.cfg.ctx_checkpoints,
            "spec_types": d.spec.drafters.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "draft_model": st.cfg.draft_model.is_some(),
            // `/infill` (and `suffix`) speculate by default with these drafters.
            "infill": {
                "supported": crate::generate::infill_supported(&st),
                "spec_types": crate::generate::infill_drafters(d)
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>(),
            },
            "memory": {
                "kv_bytes": mem.kv_bytes,
                "recurrent_bytes": mem.recurrent_bytes,
                "rollback_bytes": mem.rollback_bytes,
                "checkpoint_bytes": mem.checkpoint_bytes,
                "checkpoints": mem.checkpoints,
            },
        },
    }))
}

/// Request settings `/slots` leaves out, as llama-server does: they can hold a request's text
/// (stop strings, grammars).
const SLOT_HIDDEN_SETTINGS: [&str; 8] = [
    "stop",
    "logit_bias",
    "grammar",
    "grammar_lazy",
    "grammar_triggers",
    "preserved_tokens",
    "dry_sequence_breakers",
    "json_schema",
];

/// `GET /slots`: every slot's state (501 with `--no-slots`). A slot that never had a task shows
/// only `id`, `n_ctx`, `speculative` and `is_processing`; one that had shows its running or
/// last task, with the counters of a finished task reset.
pub async fn slots(State(st): State<Arc<AppState>>) -> Response {
    if !st.cfg.slots {
        return ApiError::new(
            ErrorKind::NotSupported,
            "This server does not support slots endpoint. Start it with `--slots`",
        )
        .into_response();
    }
    let snap = st.sched.snapshot();
    let slots: Vec<Value> = snap
        .slots
        .iter()
        .map(|s| {
            let mut v = json!({
                "id": s.id,
                "n_ctx": st.cfg.n_ctx_slot,
                "speculative": st.cfg.defaults.spec.enabled(),
                "is_processing": s.processing,
            });
            let Some(id_task) = s.id_task else {
                return v;
            };
            let mut params = s.settings.clone();
            if let Some(p) = params.as_object_mut() {
                for k in SLOT_HIDDEN_SETTINGS {
                    p.remove(k);
                }
            }
            v["id_task"] = json!(id_task);
            v["n_prompt_tokens"] = json!(s.n_tokens);
            v["n_prompt_tokens_processed"] = json!(s.n_prompt_processed);
            v["n_prompt_tokens_cache"] = json!(s.n_prompt_cached);
            v["params"] = params;
            v["next_token"] = json!([{
                "has_next_token": s.processing,
                "has_new_line": s.has_new_line,
                "n_remain": s.n_remain.map_or(-1, |n| n as i64),
                "n_decoded": s.n_decoded,
            }]);
            v
        })
        .collect();
    Json(Value::Array(slots)).into_response()
}

/// `POST /tokenize`: `content`, `add_special` (false), `parse_special` (true), `with_pieces`.
pub async fn tokenize(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Response, ApiError> {
    let (_, bytes) = on_worker(&st, body, tokenize_body).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        bytes,
    )
        .into_response())
}

/// The response, written on the request worker straight from the ids: a near-limit body has
/// millions of tokens, and a `serde_json::Value` per token (an object per token with
/// `with_pieces`) would hold many times the text in memory.
fn tokenize_body(st: &AppState, f: &Fields) -> Result<Vec<u8>, ApiError> {
    // llama-server's fields, and vLLM's (`prompt`, `add_special_tokens`, `return_token_strs`;
    // its answer adds `count`, `max_model_len` and `token_strs`).
    let vllm = f.get("prompt").is_some();
    let content = match (f.str("content")?, f.str("prompt")?) {
        (Some(c), _) | (None, Some(c)) => c,
        (None, None) => {
            return Err(ApiError::invalid("'content' is required").with("param", "content"))
        }
    };
    let add_special = match f.bool("add_special")? {
        Some(b) => b,
        // vLLM adds them unless told not to; llama-server does not.
        None => f.bool("add_special_tokens")?.unwrap_or(vllm),
    };
    let parse_special = f.bool("parse_special")?.unwrap_or(true);
    let with_pieces = f.bool("with_pieces")?.unwrap_or(false);
    let tok = st.model.tokenizer();
    let ids = tok
        .encode(content, add_special, parse_special)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let token_strs = f.bool("return_token_strs")?.unwrap_or(false).then(|| {
        ids.iter()
            .map(|&id| tok.token_text(id).unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    });
    let out = TokenizeOut {
        tokens: Tokens {
            ids: &ids,
            tok,
            with_pieces,
        },
        count: vllm.then_some(ids.len()),
        max_model_len: vllm.then_some(st.cfg.n_ctx_slot),
        token_strs,
    };
    serde_json::to_vec(&out).map_err(|e| ApiError::server(e.to_string()))
}

#[derive(serde::Serialize)]
struct TokenizeOut<'a> {
    tokens: Tokens<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_model_len: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_strs: Option<Vec<String>>,
}

/// Token ids, or `{"id", "piece"}` objects with `with_pieces` (a piece that is not valid UTF-8
/// on its own is given as its bytes, as llama-server does).
struct Tokens<'a> {
    ids: &'a [u32],
    tok: &'a specd_tokenizer::Tokenizer,
    with_pieces: bool,
}

impl serde::Serialize for Tokens<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(self.ids.len()))?;
        for &id in self.ids {
            if !self.with_pieces {
                seq.serialize_element(&id)?;
                continue;
            }
            let bytes = self.tok.piece(id, true).unwrap_or_default();
            match std::str::from_utf8(&bytes) {
                Ok(text) => seq.serialize_element(&Piece { id, piece: text })?,
                Err(_) => seq.serialize_element(&Piece { id, piece: &bytes })?,
            }
        }
        seq.end()
    }
}

#[derive(serde::Serialize)]
struct Piece<P: serde::Serialize> {
    id: u32,
    piece: P,
}

/// `POST /detokenize`: `tokens` → `content` (special tokens rendered, as llama-server does).
pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let (_, content) = on_worker(&st, body, detokenize_body).await?;
    // `prompt` is vLLM's name for it.
    Ok(Json(json!({ "content": content, "prompt": content })))
}

/// `GET /tokenizer_info` (vLLM's; evaluation harnesses read it to tokenize through the server):
/// the special tokens, the context and the chat template.
pub async fn tokenizer_info(State(st): State<Arc<AppState>>) -> Json<Value> {
    let tok = st.model.tokenizer();
    let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).map(str::to_string);
    Json(json!({
        "tokenizer_class": "specd",
        "bos_token": text(tok.bos_id()),
        "eos_token": text(tok.eos_id()),
        "add_bos_token": tok.add_bos(),
        "add_eos_token": tok.add_eos(),
        "model_max_length": st.cfg.n_ctx_slot,
        // The template in use (`--chat-template` / `--chat-template-file` over the file's),
        // as vLLM reports its `--chat-template`.
        "chat_template": st.cfg.chat_template,
    }))
}

fn detokenize_body(st: &AppState, f: &Fields) -> Result<String, ApiError> {
    let ids: Vec<u32> = match f.get("tokens") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ApiError::invalid("'tokens' must be an array of token ids").with("param", "tokens")
            })?,
        Some(_) => {
            return Err(
                ApiError::invalid("'tokens' must be an array of token ids").with("param", "tokens")
            )
        }
    };
    st.model
        .tokenizer()
        .decode(&ids, true)
        .map_err(|e| ApiError::invalid(e.to_string()).with("param", "tokens"))
}

/// `POST /apply-template`: `messages` → `prompt`, the chat template applied.
pub async fn apply_template(
    State(st): State<Arc<AppState>>,
    JsonBody(body): JsonBody,
) -> Result<Json<Value>, ApiError> {
    let (_, prompt) = on_worker(&st, body, render_chat).await?;
    Ok(Json(json!({ "prompt": prompt })))
}

/// Unknown paths: llama-server's 404 body (Anthropic's shape under `/v1/messages`).
pub async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError::new(ErrorKind::NotFound, "File Not Found").response_for(uri.path())
}
