//! What a chat template does with its inputs — whether it reads typed content parts, has a system
//! role, takes tool-call arguments as a mapping, … — found by rendering small probe conversations
//! and looking for marker texts in the output.
//!
//! llama-server prepares a conversation for a template from the same facts (its
//! `chat_template_caps`, which `/props` reports): content parts joined into a string for
//! templates that only print strings, tool-call arguments parsed from their JSON string for
//! templates that read them as a mapping, a system message merged into the next one for templates
//! without a system role. llama.cpp finds them by tracking which input values its engine touched;
//! minijinja has no such tracking, so the probes here ask whether a value reached the output, with
//! the printing rules of [`crate::template_text`] (a mapping printed whole prints nothing, so a
//! template that prints a mapping without reading it does not count as reading it).

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use serde_json::{json, Value as Json};
use std::sync::Arc;

/// The capabilities of a chat template, named as llama-server's `/props` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateCaps {
    /// Renders string message content.
    pub string_content: bool,
    /// Renders typed content parts (`[{"type": "text", "text": ...}]`).
    pub typed_content: bool,
    /// Writes the tool list it is given.
    pub tools: bool,
    /// Writes the tool calls of assistant messages.
    pub tool_calls: bool,
    /// Writes more than one tool call of a message.
    pub parallel_tool_calls: bool,
    /// Writes a system message's content.
    pub system_role: bool,
    /// Takes a system message after other messages (Qwen3.5's template refuses one: "System
    /// message must be at the beginning"). Not one of llama-server's caps: specd's rule for
    /// later system messages reads it (`docs/chat-messages.md`).
    pub system_anywhere: bool,
    /// Takes two user messages in a row (templates that insist on alternating roles refuse).
    pub consecutive_users: bool,
    /// Writes the reasoning of assistant turns before the last user message when asked to keep
    /// it (`preserve_thinking`).
    pub preserve_reasoning: bool,
    /// Reads a `reasoning_effort` level.
    pub reasoning_effort: bool,
    /// Reads tool-call arguments as a mapping.
    pub object_arguments: bool,
    /// Renders differently with `enable_thinking` (so it is on by default, as in llama-server).
    pub thinking: bool,
}

impl TemplateCaps {
    /// The capabilities as llama-server's `/props` lists them (`chat_template_caps`).
    pub fn to_json(&self) -> Json {
        json!({
            "supports_object_arguments": self.object_arguments,
            "supports_parallel_tool_calls": self.parallel_tool_calls,
            "supports_preserve_reasoning": self.preserve_reasoning,
            "supports_reasoning_effort": self.reasoning_effort,
            "supports_string_content": self.string_content,
            "supports_system_role": self.system_role,
            "supports_tool_calls": self.tool_calls,
            "supports_tools": self.tools,
            "supports_typed_content": self.typed_content,
        })
    }
}

const STRING_MARK: &str = "SPECD_STRING_CONTENT";
const TYPED_MARK: &str = "SPECD_TYPED_CONTENT";
const SYSTEM_MARK: &str = "SPECD_SYSTEM_CONTENT";
const TOOL_MARK: &str = "specd_tool_definition";
const CALL_MARK: &str = "specd_tool_call";
const CALL2_MARK: &str = "specd_second_call";
const ARG_MARK: &str = "SPECD_ARGUMENT_VALUE";
const REASONING_MARK: &str = "SPECD_EARLIER_REASONING";

/// A list or mapping that prints nothing when printed or written as a whole (minijinja would
/// print its items, markers included; `tojson` / `string` write it as empty): a probe marker
/// inside it reaches the output only through a template that reads the items.
#[derive(Debug)]
enum Opaque {
    Seq(Vec<Value>),
    Map(Vec<(Value, Value)>),
}

impl Object for Opaque {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        match **self {
            Opaque::Seq(_) => ObjectRepr::Seq,
            Opaque::Map(_) => ObjectRepr::Map,
        }
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match &**self {
            Opaque::Seq(items) => items.get(key.as_usize()?).cloned(),
            Opaque::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|e| e.1.clone()),
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match &**self {
            Opaque::Seq(items) => Enumerator::Seq(items.len()),
            Opaque::Map(entries) => {
                Enumerator::Values(entries.iter().map(|e| e.0.clone()).collect())
            }
        }
    }

    fn render(self: &Arc<Self>, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        Ok(())
    }
}

/// Whether `v` is a probe's opaque list or mapping.
pub(crate) fn is_opaque(v: &Value) -> bool {
    v.downcast_object_ref::<Opaque>().is_some()
}

/// Finds the capabilities of a template; `render` renders a context (the variables as the
/// template sees them), an error when the template refuses it.
pub(crate) fn probe<E>(source: &str, render: impl Fn(Value) -> Result<String, E>) -> TemplateCaps {
    let context = |messages: Value, tools: Json, extra: &[(&str, Json)]| -> Value {
        let mut vars: Vec<(String, Value)> = vec![
            ("messages".into(), messages),
            ("tools".into(), Value::from_serialize(&tools)),
            ("bos_token".into(), "".into()),
            ("eos_token".into(), "".into()),
            ("add_generation_prompt".into(), true.into()),
        ];
        for (k, v) in extra {
            vars.push(((*k).into(), Value::from_serialize(v)));
        }
        vars.into_iter().collect()
    };
    let run = |messages: Json, tools: Json, extra: &[(&str, Json)]| -> Option<String> {
        render(context(Value::from_serialize(&messages), tools, extra)).ok()
    };
    let has = |out: &Option<String>, mark: &str| out.as_deref().is_some_and(|o| o.contains(mark));

    let part = Opaque::Map(vec![
        ("type".into(), "text".into()),
        ("text".into(), TYPED_MARK.into()),
    ]);
    let parts = Opaque::Seq(vec![Value::from_object(part)]);
    let message: Value = [
        ("role", Value::from("user")),
        ("content", Value::from_object(parts)),
    ]
    .into_iter()
    .collect();
    let typed = render(context(Value::from(vec![message]), json!([]), &[])).ok();
    let typed_content = has(&typed, TYPED_MARK);
    let string = run(
        json!([{"role": "user", "content": STRING_MARK}]),
        json!([]),
        &[],
    );
    let string_content = string.is_some() && (has(&string, STRING_MARK) || !typed_content);

    let system = run(
        json!([
            {"role": "system", "content": SYSTEM_MARK},
            {"role": "user", "content": "User message"},
        ]),
        json!([]),
        &[],
    );
    let system_role = has(&system, SYSTEM_MARK);
    let later_system = run(
        json!([
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "Assistant message"},
            {"role": "system", "content": SYSTEM_MARK},
            {"role": "user", "content": "User message"},
        ]),
        json!([]),
        &[],
    );
    let system_anywhere = has(&later_system, SYSTEM_MARK);
    let consecutive_users = run(
        json!([
            {"role": "user", "content": "User message"},
            {"role": "user", "content": STRING_MARK},
        ]),
        json!([]),
        &[],
    )
    .is_some();

    let tools_list = json!([{
        "name": "tool",
        "type": "function",
        "function": {
            "name": TOOL_MARK,
            "description": "Tool description",
            "parameters": {
                "type": "object",
                "properties": {"arg": {"type": "string", "description": "Arg description"}},
                "required": ["arg"],
            },
        },
    }]);
    let conversation = |calls: Json| {
        json!([
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"},
        ])
    };
    let call = |id: &str, name: &str, args: Json| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
    let mut tools = true;
    let mut tool_calls = true;
    let mut object_arguments = false;
    let with_objects = run(
        conversation(json!([call(
            "call00001",
            CALL_MARK,
            json!({"arg": ARG_MARK})
        )])),
        tools_list.clone(),
        &[],
    );
    if with_objects.is_some() {
        tools = has(&with_objects, TOOL_MARK);
        tool_calls = has(&with_objects, CALL_MARK) || has(&with_objects, ARG_MARK);
        object_arguments = tool_calls && has(&with_objects, ARG_MARK);
    }
    let args = if object_arguments {
        json!({"arg": "value"})
    } else {
        json!(r#"{"arg": "value"}"#)
    };
    if !object_arguments {
        let with_strings = run(
            conversation(json!([call("call00001", CALL_MARK, args.clone())])),
            tools_list.clone(),
            &[],
        );
        match with_strings {
            None => (tools, tool_calls) = (false, false),
            // Like llama.cpp, a second probe only takes capabilities away.
            Some(_) => {
                tools &= has(&with_strings, TOOL_MARK);
                tool_calls &= has(&with_strings, CALL_MARK);
            }
        }
    }
    let parallel = run(
        conversation(json!([
            call("call00001", CALL_MARK, args.clone()),
            call("call00002", CALL2_MARK, args),
        ])),
        tools_list,
        &[],
    );
    let parallel_tool_calls = has(&parallel, CALL2_MARK);

    let preserved = run(
        json!([
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "Assistant message", "reasoning_content": REASONING_MARK},
            {"role": "user", "content": "User message"},
            {"role": "assistant", "content": "Assistant message", "reasoning_content": "Reasoning content"},
            {"role": "user", "content": "User message"},
        ]),
        json!([]),
        &[
            ("enable_thinking", true.into()),
            ("preserve_thinking", true.into()),
            ("clear_thinking", false.into()),
            ("truncate_history_thinking", false.into()),
            ("drop_thinking", false.into()),
        ],
    );
    let preserve_reasoning = has(&preserved, REASONING_MARK);

    let user = json!([{"role": "user", "content": "test"}]);
    let effort = |level: &str| {
        run(
            user.clone(),
            json!([]),
            &[
                ("enable_thinking", true.into()),
                ("reasoning_effort", level.into()),
                ("reasoning_strength", level.into()),
            ],
        )
    };
    let low = effort("low");
    let reasoning_effort = ["none", "medium", "high", "max"]
        .iter()
        .any(|l| effort(l) != low);

    let thinking = thinking_by_default(source, &run, &render);

    TemplateCaps {
        string_content,
        typed_content,
        tools,
        tool_calls,
        parallel_tool_calls,
        system_role,
        system_anywhere,
        consecutive_users,
        preserve_reasoning,
        reasoning_effort,
        object_arguments,
        thinking,
    }
}

/// Whether llama-server turns thinking on by default for this template: where it finds the
/// template's reasoning markers. llama.cpp finds them by diffing renders
/// (common/chat-diff-analyzer.cpp); this follows its cases:
/// * a template family it knows (Qwen3-Coder / Qwen3.5 XML tools: it has `<think>`; old Qwen /
///   DeepSeek templates that split `</think>` out of the content; Granite 3.3; Nemotron Nano 2);
/// * an assistant turn's reasoning written before a marker (`<…>` / `[…]`), e.g. `</think>`;
/// * a generation prompt that `enable_thinking` changes at its end by markup only: one that
///   opens a reasoning block when on (`<think>\n`), or closes an empty one when off
///   (`<think>\n\n</think>\n\n`).
fn thinking_by_default<E>(
    source: &str,
    run: &impl Fn(Json, Json, &[(&str, Json)]) -> Option<String>,
    render: &impl Fn(Value) -> Result<String, E>,
) -> bool {
    let has = |s: &str| source.contains(s);
    // Families llama.cpp renders through a dedicated handler that says so itself.
    if has("<tool_call>") && has("<function=") && has("<parameter=") {
        return has("<think>");
    }
    if has("'<|tool_call>call:'") {
        return true; // Gemma 4
    }
    if (has("content.split('</think>')") && !has("reasoning_content") && !has("<SPECIAL_12>"))
        || has("Write your thoughts between <think></think> and write your response between <response></response>")
        || (has("<SPECIAL_10>") && has("<SPECIAL_11>") && has("<SPECIAL_12>") && has("<TOOL_RESPONSE>"))
    {
        return true;
    }

    // Reasoning written in an assistant turn, followed by a marker.
    let messages = json!([
        {"role": "user", "content": "User message"},
        {"role": "assistant", "content": "Assistant message", "reasoning_content": REASONING_MARK},
    ]);
    let vars: Vec<(&str, Value)> = vec![
        ("messages", Value::from_serialize(&messages)),
        ("bos_token", "".into()),
        ("eos_token", "".into()),
        ("enable_thinking", true.into()),
    ];
    if let Ok(out) = render(vars.into_iter().collect()) {
        if let Some(at) = out.find(REASONING_MARK) {
            let after = out[at + REASONING_MARK.len()..].trim_start();
            if markers(after)
                .first()
                .is_some_and(|m| after.starts_with(m.as_str()))
            {
                return true;
            }
        }
    }

    // The generation prompt with thinking off (a) and on (b).
    let user = json!([{"role": "user", "content": "User message"}]);
    let (Some(a), Some(b)) = (
        run(
            user.clone(),
            json!([]),
            &[("enable_thinking", false.into())],
        ),
        run(user, json!([]), &[("enable_thinking", true.into())]),
    ) else {
        return false;
    };
    let prefix = a
        .char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i);
    let suffix = a[prefix..]
        .chars()
        .rev()
        .zip(b[prefix..].chars().rev())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x.len_utf8())
        .sum::<usize>();
    let left = &a[prefix..a.len() - suffix];
    let right = &b[prefix..b.len() - suffix];
    match (left.trim().is_empty(), right.trim().is_empty()) {
        (true, false) => b.ends_with(right.trim()),
        (false, true) => a.ends_with(left.trim()),
        (false, false) => {
            // One prompt is the other plus an empty reasoning block (`<think></think>`), with
            // other differences before it (SmolLM3 changes its system text too).
            [(&b, &a), (&a, &b)].iter().any(|(base, extended)| {
                let anchor = &base[base.floor_char_boundary(base.len().saturating_sub(64))..];
                extended.rfind(anchor).is_some_and(|at| {
                    let extra = extended[at + anchor.len()..].trim();
                    let found = markers(extra);
                    found.len() == 2
                        && found.concat().len()
                            == extra.split_whitespace().collect::<String>().len()
                })
            })
        }
        (true, true) => false,
    }
}

/// The markup markers (`<…>`, `[…]`) in `text`, in order.
fn markers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut open: Option<(usize, char)> = None;
    for (i, c) in text.char_indices() {
        match open {
            None if c == '<' || c == '[' => open = Some((i, c)),
            Some((start, o)) if (o == '<' && c == '>') || (o == '[' && c == ']') => {
                out.push(text[start..=i].to_string());
                open = None;
            }
            _ => {}
        }
    }
    out
}
