//! A chat request's messages, tools and `chat_template_kwargs` as a chat template sees them,
//! prepared the way llama-server prepares them (common/chat.cpp), so that templates render the
//! prompt llama-server renders:
//!
//! * each message rebuilt from the fields templates know (`role`, `content`, `reasoning_content`,
//!   `name`, `tool_call_id`, `tool_calls`), content never null;
//! * content parts joined by a newline for templates that only print strings, strings wrapped
//!   in a text part for templates that only read parts ([`TemplateCaps`]);
//! * tool-call `arguments`, sent as a JSON string in the OpenAI API, parsed into a mapping for
//!   templates that read them as one (Qwen3.5 / Qwen3-Coder iterate them with `|items`);
//! * `developer` messages as `system`; system messages anywhere in the conversation brought to
//!   where the template takes them ([`fold_system`]), and a system message merged into the next
//!   message for templates without a system role;
//! * tools rebuilt as `{"type": "function", "function": {name, description, parameters}}`;
//! * `enable_thinking`, today's date (`date_string`, `datetime`), the kwargs, and the variables
//!   that `preserve_reasoning` / `reasoning_effort` stand for.

use crate::template_caps::TemplateCaps;
use crate::{ChatMessage, TokenizerError};
use serde_json::{Map, Value as Json};

fn bad(msg: String) -> TokenizerError {
    TokenizerError::Template(msg)
}

/// A message with the fields templates are given, in llama-server's order.
fn message(m: &ChatMessage) -> Result<Json, TokenizerError> {
    m.validate()?;
    let mut o = Map::new();
    o.insert("role".into(), m.role.clone().into());
    let content = match &m.content {
        Json::String(s) => Json::String(s.clone()),
        Json::Array(parts) if !parts.is_empty() => Json::Array(
            parts
                .iter()
                .map(|p| {
                    let mut part = Map::new();
                    part.insert("type".into(), p.get("type").cloned().unwrap_or_default());
                    part.insert("text".into(), p.get("text").cloned().unwrap_or_default());
                    Json::Object(part)
                })
                .collect(),
        ),
        _ => Json::String(String::new()),
    };
    o.insert("content".into(), content);
    for key in ["reasoning_content", "name", "tool_call_id"] {
        match m.extra.get(key) {
            None | Some(Json::Null) => {}
            Some(Json::String(s)) if s.is_empty() => {}
            Some(Json::String(s)) => {
                o.insert(key.into(), s.clone().into());
            }
            Some(_) => {
                return Err(bad(format!(
                    "Failed to parse messages: '{key}' must be a string"
                )))
            }
        }
    }
    match m.extra.get("tool_calls") {
        None | Some(Json::Null) => {}
        Some(Json::Array(calls)) if calls.is_empty() => {}
        Some(Json::Array(calls)) => {
            let calls = calls.iter().map(tool_call).collect::<Result<_, _>>()?;
            o.insert("tool_calls".into(), Json::Array(calls));
        }
        Some(_) => {
            return Err(bad(
                "Failed to parse messages: 'tool_calls' must be an array".into(),
            ))
        }
    }
    Ok(Json::Object(o))
}

/// One tool call: `{"type": "function", "function": {"name", "arguments"}, "id"}`, arguments as
/// a string (an object given is written as compact JSON, as llama-server stores it).
fn tool_call(c: &Json) -> Result<Json, TokenizerError> {
    let fail = |what: &str| bad(format!("Failed to parse messages: {what}: {c}"));
    match c.get("type") {
        None => return Err(fail("Missing tool call type")),
        Some(t) if t != "function" => return Err(fail("Unsupported tool call type")),
        _ => {}
    }
    let f = c
        .get("function")
        .ok_or_else(|| fail("Missing tool call function"))?;
    let name = match f.get("name") {
        Some(Json::String(n)) => n.clone(),
        _ => return Err(fail("Missing tool call name")),
    };
    let arguments = match f.get("arguments") {
        Some(Json::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => return Err(fail("Missing tool call arguments")),
    };
    let mut function = Map::new();
    function.insert("name".into(), name.into());
    function.insert("arguments".into(), arguments.into());
    let mut o = Map::new();
    o.insert("type".into(), "function".into());
    o.insert("function".into(), Json::Object(function));
    match c.get("id") {
        Some(Json::String(id)) if !id.is_empty() => {
            o.insert("id".into(), id.clone().into());
        }
        _ => {}
    }
    Ok(Json::Object(o))
}

/// Text parts joined by a newline (as llama-server joins them for string-only templates).
fn joined(parts: &[Json]) -> String {
    parts
        .iter()
        .filter(|p| p.get("type").and_then(Json::as_str) == Some("text"))
        .filter_map(|p| p.get("text").and_then(Json::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The messages of a request as the template with `caps` is given them.
pub(crate) fn messages(
    msgs: &[ChatMessage],
    caps: &TemplateCaps,
    keep_developer: bool,
) -> Result<Vec<Json>, TokenizerError> {
    let only_string = caps.string_content && !caps.typed_content;
    let only_typed = !caps.string_content && caps.typed_content;
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        let mut j = message(m)?;
        if let Some(o) = j.as_object_mut() {
            if let Some(content) = o.get_mut("content") {
                let text = match &*content {
                    Json::Array(parts) if only_string => Some(Json::from(joined(parts))),
                    Json::String(s) if only_typed => {
                        Some(serde_json::json!([{"type": "text", "text": s}]))
                    }
                    _ => None,
                };
                if let Some(t) = text {
                    *content = t;
                }
            }
            if !keep_developer && o.get("role").and_then(Json::as_str) == Some("developer") {
                o.insert("role".into(), "system".into());
            }
            if caps.object_arguments {
                parse_arguments(o)?;
            }
        }
        out.push(j);
    }
    fold_system(&mut out, caps, only_typed);
    if !caps.system_role && out.first().and_then(|m| m.get("role")) == Some(&"system".into()) {
        let first = out.remove(0);
        if let Some(next) = out.first_mut() {
            let text = |m: &Json| -> Result<String, TokenizerError> {
                match m.get("content") {
                    Some(Json::String(s)) => Ok(s.clone()),
                    _ => Err(bad(
                        "this template has no system role: the system message is merged into the next message, which needs string content".into(),
                    )),
                }
            };
            let merged = format!("{}\n{}", text(&first)?, text(next)?);
            next["content"] = merged.into();
        }
    }
    Ok(out)
}

fn role_of(m: &Json) -> &str {
    m.get("role").and_then(Json::as_str).unwrap_or("")
}

/// A prepared message's text (string content, or its text parts joined by a newline).
fn text_of(m: &Json) -> String {
    match m.get("content") {
        Some(Json::String(s)) => s.clone(),
        Some(Json::Array(parts)) => joined(parts),
        _ => String::new(),
    }
}

/// Sets a prepared message's text, in the content form the template reads.
fn set_text(m: &mut Json, text: String, only_typed: bool) {
    m["content"] = if only_typed {
        serde_json::json!([{"type": "text", "text": text}])
    } else {
        Json::String(text)
    };
}

/// System messages (and `developer` ones, which are system messages by now) wherever a client
/// puts them, brought to where the template takes them (`docs/chat-messages.md`). A template
/// that takes system messages anywhere gets them as sent (as llama-server sends them). For one
/// that takes only a leading system message (Qwen3.5):
/// * the leading run is merged into one system message (texts joined by a blank line);
/// * each later one becomes a user message in the same place (moving it into the leading system
///   message would change the prompt's prefix each time one appears, and with it all prompt
///   reuse), merged into the user message next to it for templates that refuse two user
///   messages in a row.
fn fold_system(out: &mut Vec<Json>, caps: &TemplateCaps, only_typed: bool) {
    if caps.system_anywhere {
        return;
    }
    while out.len() >= 2 && role_of(&out[0]) == "system" && role_of(&out[1]) == "system" {
        let second = out.remove(1);
        let text = format!("{}\n\n{}", text_of(&out[0]), text_of(&second));
        set_text(&mut out[0], text, only_typed);
    }
    let mut i = 1;
    while i < out.len() {
        if role_of(&out[i]) != "system" {
            i += 1;
            continue;
        }
        out[i]["role"] = "user".into();
        if caps.consecutive_users {
            i += 1;
            continue;
        }
        let text = text_of(&out[i]);
        if out.get(i + 1).is_some_and(|m| role_of(m) == "user") {
            let merged = format!("{text}\n\n{}", text_of(&out[i + 1]));
            set_text(&mut out[i + 1], merged, only_typed);
            out.remove(i);
        } else if role_of(&out[i - 1]) == "user" {
            let merged = format!("{}\n\n{text}", text_of(&out[i - 1]));
            set_text(&mut out[i - 1], merged, only_typed);
            out.remove(i);
        } else {
            i += 1;
        }
    }
}

/// Tool-call arguments, a JSON string, parsed for templates that read them as a mapping.
fn parse_arguments(msg: &mut Map<String, Json>) -> Result<(), TokenizerError> {
    let Some(Json::Array(calls)) = msg.get_mut("tool_calls") else {
        return Ok(());
    };
    for c in calls {
        if let Some(args) = c.pointer_mut("/function/arguments") {
            if let Json::String(s) = args {
                *args = serde_json::from_str(s).map_err(|e| {
                    bad(format!("Failed to parse tool call arguments as JSON: {e}"))
                })?;
            }
        }
    }
    Ok(())
}

/// The request's `tools` as templates are given them (none when empty).
pub(crate) fn tools(tools: Option<&Json>) -> Result<Option<Json>, TokenizerError> {
    let list = match tools {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Array(list)) => list,
        Some(other) => {
            return Err(bad(format!(
                "Failed to parse tools: Expected 'tools' to be an array, got {other}"
            )))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for t in list {
        let fail = |what: &str| bad(format!("Failed to parse tools: {what}: {t}"));
        match t.get("type") {
            None => return Err(fail("Missing tool type")),
            Some(ty) if ty != "function" => return Err(fail("Unsupported tool type")),
            _ => {}
        }
        let f = t
            .get("function")
            .ok_or_else(|| fail("Missing tool function"))?;
        let name = match f.get("name") {
            Some(Json::String(n)) => n.clone(),
            _ => return Err(fail("Missing tool function name")),
        };
        let description = match f.get("description") {
            None => String::new(),
            Some(Json::String(d)) => d.clone(),
            Some(_) => return Err(fail("Tool description must be a string")),
        };
        let parameters = f
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| Json::Object(Map::new()));
        let mut function = Map::new();
        function.insert("name".into(), name.into());
        function.insert("description".into(), description.into());
        function.insert("parameters".into(), parameters);
        let mut o = Map::new();
        o.insert("type".into(), "function".into());
        o.insert("function".into(), Json::Object(function));
        out.push(Json::Object(o));
    }
    Ok((!out.is_empty()).then_some(Json::Array(out)))
}

/// The value of `enable_thinking` a request asks for in its kwargs: a boolean, or nothing;
/// a string is refused as llama-server refuses it.
pub(crate) fn enable_thinking(kwargs: &Map<String, Json>) -> Result<Option<bool>, TokenizerError> {
    match kwargs.get("enable_thinking") {
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(Json::String(_)) => Err(bad(
            "invalid type for \"enable_thinking\" (expected boolean, got string)".into(),
        )),
        _ => Ok(None),
    }
}
