//! What a chat request asks of the output stage: the reasoning split (`reasoning_format`, and
//! whether the prompt opened the thinking block), tool-call parsing (`tools`, `tool_choice`,
//! `parallel_tool_calls`, the format the chat template teaches) and, for `tool_choice:
//! required` or a named function, the grammar that makes the model call; and the thinking
//! budget the sampler enforces.

use super::gen_params;
use super::prompt::chat_prompt_text;
use crate::error::ApiError;
use crate::params::{Api, Fields, GenParams};
use crate::scope::Caller;
use crate::AppState;
use serde_json::Value;
use specd_output::{tool_grammar, OutputConfig, ReasoningFormat, ToolFormat, ToolSpec};
use specd_sampling::{GrammarSpec, ReasoningBudget};

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
enum Choice {
    Auto,
    None,
    Required,
    Named(String),
}

fn bad(msg: impl Into<String>, param: &str) -> ApiError {
    ApiError::invalid(msg).with("param", param)
}

/// `tools`: OpenAI function tools.
fn parse_tools(f: &Fields) -> Result<Vec<ToolSpec>, ApiError> {
    let tools = match f.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("'tools' must be an array", "tools")),
    };
    tools
        .iter()
        .map(|t| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("function");
            if kind != "function" {
                return Err(bad(
                    format!("tools[].type '{kind}' is not supported (only 'function')"),
                    "tools",
                ));
            }
            let func = t
                .get("function")
                .filter(|v| v.is_object())
                .ok_or_else(|| bad("tools[].function must be an object", "tools"))?;
            let name = func
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad("tools[].function.name must be a non-empty string", "tools"))?;
            let parameters = match func.get("parameters") {
                None | Some(Value::Null) => Value::Object(Default::default()),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(bad(
                        "tools[].function.parameters must be a JSON schema (an object)",
                        "tools",
                    ))
                }
            };
            Ok(ToolSpec {
                name: name.to_string(),
                parameters,
            })
        })
        .collect()
}

fn parse_choice(f: &Fields) -> Result<Choice, ApiError> {
    match f.get("tool_choice") {
        None | Some(Value::Null) => Ok(Choice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(Choice::Auto),
            "none" => Ok(Choice::None),
            "required" => Ok(Choice::Required),
            _ => Err(bad(format!("Invalid tool_choice: {s}"), "tool_choice")),
        },
        // OpenAI's named function: {"type": "function", "function": {"name": …}}.
        Some(Value::Object(o)) => o
            .get("function")
            .and_then(|v| v.get("name"))
            .and_then(Value::as_str)
            .map(|n| Choice::Named(n.to_string()))
            .ok_or_else(|| {
                bad(
                    "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": …}}",
                    "tool_choice",
                )
            }),
        Some(_) => Err(bad("tool_choice must be a string or an object", "tool_choice")),
    }
}

/// The output stage of a chat request whose prompt is `prompt_text`, and the grammar that
/// enforces a tool call when the request asks for one.
pub(crate) fn chat_output(
    st: &AppState,
    f: &Fields,
    prompt_text: &str,
) -> Result<(OutputConfig, Option<GrammarSpec>), ApiError> {
    let asked = match f.str("reasoning_format")? {
        None => st.cfg.reasoning_format,
        Some(s) => ReasoningFormat::parse(s).ok_or_else(|| {
            bad(
                format!("Unknown reasoning format: {s} (none, deepseek, deepseek-legacy, auto)"),
                "reasoning_format",
            )
        })?,
    };
    // Only a template that knows thinking blocks has reasoning to split off (llama-server
    // reads it off the template's source too): other models' text is all content.
    let reasoning = if st.cfg.chat_template.contains("<think>") {
        asked
    } else {
        ReasoningFormat::None
    };
    // A prompt ending in an open `<think>` (Qwen3 / Qwen3.5 with thinking on): the output
    // starts inside the reasoning.
    let in_reasoning = prompt_text.trim_end().ends_with("<think>");
    let tools = parse_tools(f)?;
    let choice = parse_choice(f)?;
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    let mut cfg = OutputConfig {
        reasoning,
        in_reasoning,
        tool_format: None,
        tools: Vec::new(),
    };
    if tools.is_empty() {
        return match choice {
            Choice::Required | Choice::Named(_) => Err(bad(
                "tool_choice requires 'tools' holding at least one function",
                "tool_choice",
            )),
            _ => Ok((cfg, None)),
        };
    }
    if choice == Choice::None {
        return Ok((cfg, None));
    }
    // llama-server's rule: a tool-call grammar and the client's own cannot both hold.
    if f.get("grammar").is_some() {
        return Err(ApiError::invalid(
            "Cannot use custom grammar constraints with tools.",
        ));
    }
    let format = ToolFormat::of_template(&st.cfg.chat_template);
    let forced: Vec<ToolSpec> = match &choice {
        Choice::Named(n) => {
            let t = tools.iter().find(|t| &t.name == n).ok_or_else(|| {
                bad(
                    format!("tool_choice names function '{n}', which is not in 'tools'"),
                    "tool_choice",
                )
            })?;
            vec![t.clone()]
        }
        Choice::Required => tools.clone(),
        _ => Vec::new(),
    };
    // A response format set by the request keeps its own grammar.
    let own_format = f.get("json_schema").is_some() || f.get("response_format").is_some();
    let grammar = (!forced.is_empty() && !own_format)
        .then(|| GrammarSpec::Lark(tool_grammar(format, &forced, parallel, in_reasoning)));
    cfg.tool_format = Some(format);
    cfg.tools = tools;
    Ok((cfg, grammar))
}

/// Prompt tokens the thinking budget is primed with: enough to see whether the generation
/// prompt opened (or opened and closed) a thinking block.
const BUDGET_PRIMING: usize = 16;

/// The thinking budget of a chat request whose prompt is `prompt` (llama-server's
/// `reasoning_budget_tokens` / `thinking_budget_tokens`, else `--reasoning-budget`; -1: none):
/// for templates with `<think>` blocks, the end tag (after `reasoning_budget_message`) is
/// forced once a block has run for the budget.
pub(crate) fn reasoning_budget(
    st: &AppState,
    f: &Fields,
    prompt: &[u32],
) -> Result<Option<ReasoningBudget>, ApiError> {
    let mut budget = -1;
    for key in ["reasoning_budget_tokens", "thinking_budget_tokens"] {
        if let Some(v) = f.i64(key)? {
            if v < -1 {
                return Err(bad(format!("'{key}' must be -1 (no limit) or more"), key));
            }
            if v >= 0 {
                budget = v;
                break;
            }
        }
    }
    if budget < 0 {
        budget = st.cfg.reasoning_budget;
    }
    if budget < 0 || !st.cfg.chat_template.contains("<think>") {
        return Ok(None);
    }
    let tok = st.model.tokenizer();
    let encode = |text: &str| {
        tok.encode(text, false, true)
            .map_err(|e| ApiError::server(format!("tokenizing the thinking tags: {e}")))
    };
    let message = match f.str("reasoning_budget_message")? {
        Some(m) => m.to_string(),
        None => st.cfg.reasoning_budget_message.clone(),
    };
    let end = encode("</think>")?;
    let mut forced = if message.is_empty() {
        Vec::new()
    } else {
        encode(&message)?
    };
    forced.extend_from_slice(&end);
    let budget = usize::try_from(budget).unwrap_or(usize::MAX);
    Ok(
        ReasoningBudget::new(encode("<think>")?, vec![end], forced, budget).map(|mut b| {
            b.prime(&prompt[prompt.len().saturating_sub(BUDGET_PRIMING)..]);
            b
        }),
    )
}

/// A chat request made ready for the engine — where every chat dialect (OpenAI chat, Anthropic
/// Messages, OpenAI Responses, each converted to a chat request first) starts: its prompt, its
/// generation parameters with the tool-call grammar and the thinking budget, and the output
/// stage's settings.
pub(crate) fn chat_request(
    st: &AppState,
    f: &Fields,
    caller: Caller,
) -> Result<(Vec<u32>, GenParams, OutputConfig), ApiError> {
    let mut g = gen_params(st, f, Api::OaiChat, caller)?;
    let (text, prompt, marks) = chat_prompt_text(st, f)?;
    g.checkpoints = marks;
    let (out_cfg, tool_grammar) = chat_output(st, f, &text)?;
    if tool_grammar.is_some() {
        g.grammar = tool_grammar;
    }
    g.reasoning_budget = reasoning_budget(st, f, &prompt)?;
    Ok((prompt, g, out_cfg))
}
