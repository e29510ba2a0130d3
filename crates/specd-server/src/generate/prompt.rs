//! Prompts: the prompt forms of `/completion` and `/v1/completions`, and chat messages through
//! the chat template.

use crate::error::ApiError;
use crate::params::Fields;
use crate::AppState;
use serde_json::Value;
use specd_tokenizer::{ChatMessage, Continuation};

/// Whether a chat prompt ends with a generation prompt, and how its last message is continued
/// (`continue_final_message`, or `prefill`: a final assistant message), if it is.
pub(crate) fn continuation(
    f: &Fields,
    msgs: &[Value],
    prefill: bool,
) -> Result<(bool, Option<Continuation>), ApiError> {
    let mut add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
    let last_text = |m: &Value| match m.get("content") {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    };
    // true (the content, or the reasoning when the message has only reasoning), or the part.
    let mut auto = false;
    let mut part = match f.get("continue_final_message") {
        Some(Value::Bool(true)) => {
            auto = true;
            Some(Continuation::Content)
        }
        Some(Value::String(s)) if s == "content" => Some(Continuation::Content),
        Some(Value::String(s)) if s == "reasoning_content" => Some(Continuation::Reasoning),
        _ => None,
    };
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_string);
    let n = msgs.len();
    // Assistant prefill: a final assistant message is continued (llama-server's default).
    if prefill && part.is_none() && n > 0 && role(&msgs[n - 1]).as_deref() == Some("assistant") {
        if n >= 2 && role(&msgs[n - 2]).as_deref() == Some("assistant") {
            return Err(ApiError::invalid(
                "Cannot have 2 or more assistant messages at the end of the list.",
            ));
        }
        part = Some(Continuation::Content);
        auto = true;
        add_generation_prompt = false;
    }
    let Some(mut part) = part else {
        return Ok((add_generation_prompt, None));
    };
    if add_generation_prompt {
        return Err(ApiError::invalid(
            "Cannot set both add_generation_prompt and continue_final_message to true.",
        ));
    }
    if let Some(last) = msgs.last() {
        let tool_calls = last.get("tool_calls").and_then(Value::as_array);
        if role(last).as_deref() == Some("assistant") && tool_calls.is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::invalid(
                "Cannot continue an assistant message that contains tool calls.",
            ));
        }
        let reasoning = last.get("reasoning_content").and_then(Value::as_str);
        if auto && last_text(last) && reasoning.is_some_and(|r| !r.is_empty()) {
            part = Continuation::Reasoning;
        }
    }
    Ok((false, Some(part)))
}

/// Checks `messages` as llama-server does (same messages); media parts are refused, specd
/// serving text models only.
pub(crate) fn check_messages(f: &Fields) -> Result<Vec<Value>, ApiError> {
    let msgs = match f.0.get("messages") {
        None => return Err(ApiError::invalid("'messages' is required").with("param", "messages")),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(
                ApiError::invalid("Expected 'messages' to be an array").with("param", "messages")
            )
        }
    };
    // llama-server renders an empty list (the template's bare generation prompt) and answers
    // 200; OpenAI refuses it, and a prompt of no message is a client's bug, not a question.
    if msgs.is_empty() {
        return Err(
            ApiError::invalid("'messages' must contain at least one message")
                .with("param", "messages"),
        );
    }
    for m in msgs {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content");
        if role != "assistant" && content.is_none() {
            return Err(ApiError::invalid(
                "All non-assistant messages must contain 'content'",
            ));
        }
        if role == "assistant" && content.is_none() {
            if m.get("tool_calls").is_none() {
                return Err(ApiError::invalid(
                    "Assistant message must contain either 'content' or 'tool_calls'!",
                ));
            }
            continue;
        }
        match content {
            None | Some(Value::String(_)) | Some(Value::Null) => {}
            Some(Value::Array(parts)) => {
                for p in parts {
                    match p.get("type").and_then(Value::as_str) {
                        Some("text") => {}
                        Some(t @ ("image_url" | "input_audio" | "input_video" | "video_url")) => {
                            return Err(ApiError::invalid(format!(
                                "content of type '{t}' is not supported: specd serves text models"
                            )))
                        }
                        _ => return Err(ApiError::invalid("unsupported content[].type")),
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "Expected 'content' to be a string or an array",
                ))
            }
        }
    }
    Ok(msgs.clone())
}

/// Applies the chat template to a request's `messages` (with `tools` and
/// `chat_template_kwargs` visible to the template): a generation prompt after them, or — with
/// `continue_final_message`, or a final assistant message (prefill) — the last one left open.
pub fn render_chat(st: &AppState, f: &Fields) -> Result<String, ApiError> {
    render_chat_marked(st, f, false).map(|(text, _)| text)
}

/// [`render_chat`], with `marked`: the byte offsets in the text worth a checkpoint
/// ([`specd_tokenizer::ChatTemplate::render_marked`]).
fn render_chat_marked(
    st: &AppState,
    f: &Fields,
    marked: bool,
) -> Result<(String, Vec<usize>), ApiError> {
    let raw = check_messages(f)?;
    let (add_generation_prompt, part) = continuation(f, &raw, st.cfg.prefill_assistant)?;
    let msgs: Vec<ChatMessage> = raw
        .into_iter()
        .map(|m| {
            serde_json::from_value(m.clone()).map_err(|e| {
                ApiError::invalid(format!("Failed to parse messages: {e}: {m}"))
                    .with("param", "messages")
            })
        })
        .collect::<Result<_, _>>()?;
    let mut extra = f
        .object("chat_template_kwargs")?
        .map(|o| o.0.clone())
        .unwrap_or_default();
    // OpenAI's `reasoning_effort`: a level for templates that read one; "none" turns thinking off.
    match f.get("reasoning_effort").and_then(Value::as_str) {
        Some("none") => {
            extra.insert("enable_thinking".into(), false.into());
            extra.remove("reasoning_effort");
        }
        Some(level) if !level.is_empty() => {
            extra.insert("reasoning_effort".into(), level.into());
        }
        _ => {}
    }
    // A call the request forces starts without thinking (unless the request asks for thinking
    // itself): a grammar that admits the call only after the thinking ends may not see it end.
    let forced = match f.get("tool_choice") {
        Some(Value::String(c)) => c == "required",
        Some(Value::Object(_)) => true,
        _ => false,
    };
    if forced {
        extra.entry("enable_thinking").or_insert(false.into());
    }
    if let Some(t) = f.get("tools") {
        extra.insert("tools".into(), t.clone());
    }
    let out = match part {
        None if marked => st
            .template
            .render_marked(&msgs, add_generation_prompt, &extra),
        None => st
            .template
            .render(&msgs, add_generation_prompt, &extra)
            .map(|t| (t, Vec::new())),
        Some(p) => st
            .template
            .render_continuation(&msgs, p, &extra)
            .map(|t| (t, Vec::new())),
    };
    out.map_err(|e| ApiError::invalid(format!("applying the chat template: {e}")))
}

/// Byte offsets in a prompt's text as token positions of its tokens `ids`: for each offset, the
/// tokens that lie wholly before it. None where the tokens do not spell the text piece by piece
/// (a tokenizer that changes the text, e.g. adding a leading space).
fn byte_marks_to_positions(st: &AppState, text: &str, ids: &[u32], marks: &[usize]) -> Vec<usize> {
    let tok = st.model.tokenizer();
    let text = text.as_bytes();
    let piece = |id: u32| tok.piece(id, true).unwrap_or_default();
    // A BOS the tokenizer added is not in the text.
    let skip = match (ids.first(), tok.bos_id()) {
        (Some(&first), Some(b)) if first == b && !text.starts_with(&piece(b)) => 1,
        _ => 0,
    };
    let mut out = Vec::with_capacity(marks.len());
    let mut at = 0;
    let mut next = marks.iter().copied().peekable();
    for (i, &id) in ids.iter().enumerate().skip(skip) {
        let piece = piece(id);
        while let Some(m) = next.next_if(|&m| m < at + piece.len()) {
            if m >= at && i > 0 {
                out.push(i);
            }
        }
        if text.get(at..at + piece.len()) != Some(&piece[..]) {
            return Vec::new();
        }
        at += piece.len();
    }
    if at != text.len() {
        return Vec::new();
    }
    out.dedup();
    out
}

/// Text → tokens as llama-server does for prompts: BOS as the model asks, special tokens parsed.
pub(crate) fn tokenize_prompt(
    st: &AppState,
    text: &str,
    add_special: bool,
) -> Result<Vec<u32>, ApiError> {
    let tok = st.model.tokenizer();
    let mut ids = tok
        .encode(text, add_special, true)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    // A template that writes BOS itself plus the tokenizer's own: keep one.
    if let Some(b) = tok.bos_id() {
        if ids.len() >= 2 && ids[0] == b && ids[1] == b {
            ids.remove(0);
        }
    }
    Ok(ids)
}

pub(crate) fn is_int(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

pub(crate) fn bad_prompt() -> ApiError {
    ApiError::invalid(
        "\"prompt\" elements must be a string, a list of tokens, a JSON object containing a prompt string, or a list of mixed strings & tokens.",
    )
    .with("param", "prompt")
}

/// A token id of a prompt; ids outside the vocabulary are refused as llama-server does.
pub(crate) fn prompt_token(st: &AppState, v: &Value) -> Result<u32, ApiError> {
    let n_vocab = st.model.info().n_vocab;
    v.as_u64()
        .filter(|&t| t < n_vocab as u64)
        .map(|t| t as u32)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "Prompt contains invalid tokens: {v} in the prompt is not a token id (the vocabulary has {n_vocab})"
            ))
            .with("param", "prompt")
        })
}

/// A string, or token ids mixed with strings: BOS (when the model wants one) only before a
/// leading string.
pub(crate) fn tokenize_mixed(st: &AppState, v: &Value) -> Result<Vec<u32>, ApiError> {
    match v {
        Value::String(s) => tokenize_prompt(st, s, true),
        Value::Array(items) => {
            let mut out = Vec::new();
            for (i, it) in items.iter().enumerate() {
                match it {
                    Value::String(s) => out.extend(tokenize_prompt(st, s, i == 0)?),
                    n if is_int(n) => out.push(prompt_token(st, n)?),
                    _ => return Err(bad_prompt()),
                }
            }
            Ok(out)
        }
        _ => Err(bad_prompt()),
    }
}

/// One prompt: a string, token ids (maybe mixed with strings), or
/// `{"prompt_string": ..., "multimodal_data": [...]}` (text only: specd has no multimodal
/// models).
pub(crate) fn sub_prompt(st: &AppState, v: &Value) -> Result<Vec<u32>, ApiError> {
    match v {
        Value::String(_) | Value::Array(_) => tokenize_mixed(st, v),
        Value::Object(o) => {
            let Some(p) = o.get("prompt_string") else {
                return Err(bad_prompt());
            };
            if o.contains_key("multimodal_data") {
                return Err(ApiError::invalid(
                    "Multimodal data provided, but model does not support multimodal requests.",
                )
                .with("param", "prompt"));
            }
            tokenize_mixed(st, p)
        }
        _ => Err(bad_prompt()),
    }
}

/// `prompt` of `/completion` and `/v1/completions`, read as llama-server reads it: an array
/// holding any token id is one prompt; any other array is a list of prompts (one result each).
pub(crate) fn parse_prompts(st: &AppState, f: &Fields) -> Result<Vec<Vec<u32>>, ApiError> {
    let Some(p) = f.0.get("prompt") else {
        return Err(ApiError::invalid("\"prompt\" is required").with("param", "prompt"));
    };
    let prompts: Vec<&Value> = match p {
        Value::Array(a) if !a.iter().any(is_int) => a.iter().collect(),
        other => vec![other],
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("\"prompt\" must not be empty").with("param", "prompt"));
    }
    prompts
        .into_iter()
        .map(|v| {
            st.limits
                .check_prompt_bytes(text_bytes(v), st.cfg.n_ctx_slot)?;
            sub_prompt(st, v)
        })
        .collect()
}

/// Bytes of the text in a prompt (its strings; token ids count nothing).
fn text_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(text_bytes).sum(),
        Value::Object(o) => o.get("prompt_string").map_or(0, text_bytes),
        _ => 0,
    }
}

/// The prompt of a chat request: its messages through the chat template, tokenized.
pub(crate) fn chat_prompt(st: &AppState, f: &Fields) -> Result<Vec<u32>, ApiError> {
    let text = render_chat(st, f)?;
    tokenize_prompt(st, &text, true)
}

/// [`chat_prompt`] with the prompt's text (the output stage reads how the prompt ends), for a
/// generation: a text longer than the context can hold is refused before it is tokenized.
/// Also the prompt positions worth a checkpoint ([`GenParams::checkpoints`]).
///
/// [`GenParams::checkpoints`]: crate::params::GenParams::checkpoints
pub(crate) fn chat_prompt_text(
    st: &AppState,
    f: &Fields,
) -> Result<(String, Vec<u32>, Vec<usize>), ApiError> {
    let (text, marks) = render_chat_marked(st, f, st.model.info().hybrid)?;
    st.limits
        .check_prompt_bytes(text.len(), st.cfg.n_ctx_slot)?;
    let ids = tokenize_prompt(st, &text, true)?;
    let positions = byte_marks_to_positions(st, &text, &ids, &marks);
    Ok((text, ids, positions))
}
