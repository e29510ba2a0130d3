//! Slot save / restore / erase: llama-server's `POST /slots/{id}?action=save|restore|erase`
//! (enabled by `--slot-save-path DIR`). A saved slot is the tokens it keeps for prompt reuse and
//! its memory; restoring it into any slot makes the next request there reuse that prefix.
//!
//! The file keeps llama.cpp's sequence-state container, so tools that read its header keep
//! working: magic `ggsq`, version, the number of 32-bit words of the token payload, the payload
//! (llama-server's packed form: a -1 marker, version 1, the token count and tokens, no media;
//! a plain token list is read too), then the memory — specd's own format
//! ([`specd_memory::Memory::save_sequence`]), as llama.cpp's is its own. A file written by
//! llama.cpp is recognised and refused with a clear error.

use crate::error::{ApiError, ErrorKind};
use crate::params::Fields;
use crate::scheduler::SlotTask;
use crate::scope::Caller;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;

/// llama.cpp's sequence-state magic ('ggsq') and container version.
const SEQ_MAGIC: u32 = 0x6767_7371;
const SEQ_VERSION: u32 = 4;
/// First word of llama-server's packed token payload (`LLAMA_TOKEN_NULL`) and its version.
const PACKED_MARKER: u32 = u32::MAX;
const PACKED_VERSION: u32 = 1;

/// The container: header, packed token payload, memory bytes.
fn encode(tokens: &[u32], memory: &[u8]) -> Vec<u8> {
    let words = 4 + tokens.len();
    let mut out = Vec::with_capacity(12 + words * 4 + memory.len());
    for w in [
        SEQ_MAGIC,
        SEQ_VERSION,
        words as u32,
        PACKED_MARKER,
        PACKED_VERSION,
    ] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&0u32.to_le_bytes()); // no media chunks
    out.extend_from_slice(memory);
    out
}

/// Tokens and memory bytes of a slot file.
fn decode(bytes: &[u8]) -> Result<(Vec<u32>, &[u8]), String> {
    let word = |i: usize| -> Result<u32, String> {
        bytes
            .get(i * 4..i * 4 + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| "the file ends early".to_string())
    };
    if word(0)? != SEQ_MAGIC {
        return Err("not a slot save file".into());
    }
    if word(1)? != SEQ_VERSION {
        return Err(format!("unsupported slot file version {}", word(1)?));
    }
    let n_words = word(2)? as usize;
    let payload: Vec<u32> = (0..n_words)
        .map(|i| word(3 + i))
        .collect::<Result<_, _>>()?;
    let tokens = if payload.first() == Some(&PACKED_MARKER) {
        if payload.get(1) != Some(&PACKED_VERSION) {
            return Err("unsupported token payload version".into());
        }
        let n = *payload.get(2).ok_or("the token payload ends early")? as usize;
        let toks = payload
            .get(3..3 + n)
            .ok_or("the token payload ends early")?
            .to_vec();
        match payload.get(3 + n) {
            Some(0) if payload.len() == 4 + n => {}
            Some(0) => return Err("trailing data in the token payload".into()),
            Some(_) => return Err("media tokens cannot be restored (no multimodal support)".into()),
            None => return Err("the token payload ends early".into()),
        }
        toks
    } else {
        payload // a plain token list, as older llama-server versions wrote
    };
    let memory = &bytes[(3 + n_words) * 4..];
    if !memory.starts_with(b"SPCDMEM") {
        return Err("the memory in this file was not saved by specd (llama.cpp's state format cannot be read)".into());
    }
    Ok((tokens, memory))
}

/// llama.cpp's filename rule: one path component, no control or reserved characters, no
/// leading/trailing space, no trailing dot, no "..".
fn valid_filename(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.chars().any(|c| {
            (c as u32) <= 0x1F
                || (0x7F..=0x9F).contains(&(c as u32))
                || matches!(
                    c,
                    '/' | '\\'
                        | ':'
                        | '*'
                        | '?'
                        | '"'
                        | '<'
                        | '>'
                        | '|'
                        | '\u{FF0E}'
                        | '\u{2215}'
                        | '\u{2216}'
                        | '\u{FFFD}'
                        | '\u{FEFF}'
                )
        })
        && !name.starts_with(' ')
        && !name.ends_with(' ')
        && !name.ends_with('.')
        && !name.contains("..")
        // specd's own: the temporary files of saves in progress (or cut short by a crash).
        && !name.starts_with(".specd-")
}

fn filename(body: &Value) -> Result<String, ApiError> {
    let f = Fields::of(body);
    let name = f
        .str("filename")?
        .ok_or_else(|| ApiError::invalid("'filename' is required"))?;
    if !valid_filename(name) {
        return Err(ApiError::invalid("Invalid filename"));
    }
    Ok(name.to_string())
}

async fn ask<T>(
    st: &AppState,
    make: impl FnOnce(oneshot::Sender<Result<T, ApiError>>) -> SlotTask,
) -> Result<T, ApiError> {
    let (tx, rx) = oneshot::channel();
    st.sched.slot_task(make(tx))?;
    rx.await
        .map_err(|_| ApiError::server("the engine thread stopped"))?
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// `POST /slots/{id_slot}?action=save|restore|erase`.
pub async fn action(
    State(st): State<Arc<AppState>>,
    caller: Caller,
    Path(id_slot): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    // `erase` comes without a body; the others carry a JSON object.
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        Ok(Value::Null)
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("invalid JSON: {e}")))
    };
    let r = match body {
        Ok(b) => action_inner(&st, caller.scope(None), &id_slot, &q, b).await,
        Err(e) => Err(e),
    };
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn action_inner(
    st: &AppState,
    scope: u64,
    id_slot: &str,
    q: &HashMap<String, String>,
    body: Value,
) -> Result<Value, ApiError> {
    // The request is validated before the capability is checked: a malformed one is a 400 on
    // every server, whether or not it saves slots.
    let slot: usize = id_slot
        .parse()
        .map_err(|_| ApiError::invalid("Invalid slot ID"))?;
    let action = q.get("action").map(String::as_str);
    if !matches!(action, Some("save" | "restore" | "erase")) {
        return Err(ApiError::invalid("Invalid action"));
    }
    if matches!(action, Some("save" | "restore")) {
        filename(&body)?;
    }
    let Some(dir) = st.cfg.slot_save_path.clone() else {
        return Err(ApiError::new(
            ErrorKind::NotSupported,
            "This server does not support slots action. Start it with `--slot-save-path`",
        ));
    };
    let t0 = Instant::now();
    match action {
        Some("save") => {
            let name = filename(&body)?;
            let (tokens, memory) = ask(st, |reply| SlotTask::Save { slot, scope, reply }).await?;
            let data = encode(&tokens, &memory);
            let path = dir.join(&name);
            let n = data.len();
            tokio::task::spawn_blocking(move || crate::atomic_file::write(&path, &data))
                .await
                .map_err(|e| ApiError::server(format!("Unable to save slot: {e}")))?
                .map_err(|e| ApiError::server(format!("Unable to save slot: {e}")))?;
            Ok(json!({
                "id_slot": slot, "filename": name, "n_saved": tokens.len(), "n_written": n,
                "timings": {"save_ms": ms(t0)},
            }))
        }
        Some("restore") => {
            let name = filename(&body)?;
            let path = dir.join(&name);
            let data = tokio::task::spawn_blocking(move || std::fs::read(path))
                .await
                .map_err(|e| ApiError::server(format!("Unable to restore slot: {e}")))?
                .map_err(|e| ApiError::invalid(format!("Unable to restore slot: {e}")))?;
            let (tokens, memory) = decode(&data)
                .map_err(|e| ApiError::invalid(format!("Unable to restore slot: {e}")))?;
            if tokens.len() > st.cfg.n_ctx_slot {
                return Err(ApiError::invalid(
                    "Unable to restore slot: Restored prompt does not fit in the slot context",
                ));
            }
            let n = tokens.len();
            let state = memory.to_vec();
            ask(st, |reply| SlotTask::Restore {
                slot,
                scope,
                tokens,
                state,
                reply,
            })
            .await?;
            Ok(json!({
                "id_slot": slot, "filename": name, "n_restored": n, "n_read": data.len(),
                "timings": {"restore_ms": ms(t0)},
            }))
        }
        Some("erase") => {
            let n = ask(st, |reply| SlotTask::Erase { slot, reply }).await?;
            Ok(json!({"id_slot": slot, "n_erased": n}))
        }
        _ => Err(ApiError::invalid("Invalid action")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_round_trips_and_reads_plain_token_lists() {
        let mem = b"SPCDMEM\0rest".to_vec();
        let data = encode(&[5, 6, 7], &mem);
        let (t, m) = decode(&data).unwrap();
        assert_eq!((t, m), (vec![5, 6, 7], mem.as_slice()));
        // The header words llama.cpp's tools read: magic, version, payload words.
        assert_eq!(&data[..4], b"qsgg");
        assert_eq!(
            u32::from_le_bytes([data[8], data[9], data[10], data[11]]),
            7
        );
        // A plain token list in place of the packed payload.
        let mut plain = Vec::new();
        for w in [SEQ_MAGIC, SEQ_VERSION, 2, 9, 8] {
            plain.extend_from_slice(&w.to_le_bytes());
        }
        plain.extend_from_slice(&mem);
        assert_eq!(decode(&plain).unwrap().0, vec![9, 8]);
    }

    #[test]
    fn bad_files_are_errors() {
        let mem = b"SPCDMEM\0".to_vec();
        let good = encode(&[1, 2], &mem);
        assert!(decode(&good[..10]).is_err());
        assert!(decode(b"GGUF....").is_err());
        let mut media = good.clone();
        let at = media.len() - mem.len() - 4;
        media[at] = 1;
        assert!(decode(&media).unwrap_err().contains("media"));
        let foreign = encode(&[1, 2], b"llama state");
        assert!(decode(&foreign).unwrap_err().contains("not saved by specd"));
    }

    #[test]
    fn filenames_follow_llama_cpp_rules() {
        for ok in ["slot1.bin", "a b.bin", "é.bin"] {
            assert!(valid_filename(ok), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "a/b",
            "a\\b",
            "x.",
            " x",
            "x ",
            "a:b",
            "..",
            "a\u{7}b",
            ".specd-1x2.tmp",
        ] {
            assert!(!valid_filename(bad), "{bad:?}");
        }
    }
}
