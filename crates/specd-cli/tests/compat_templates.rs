//! Real chat templates over HTTP: `specd serve --jinja --chat-template-file` with the Qwen3.5
//! template llama.cpp ships (models/templates/Qwen3.5-4B.jinja) renders an agent's conversation
//! — tools, a tool call whose arguments are a JSON string, the tool's result — to the prompt
//! llama-server renders for it, on `/apply-template` and on `/v1/chat/completions`;
//! `--chat-template-kwargs` and a request's `chat_template_kwargs` reach the template.

mod common;

use common::http::assert_error;
use common::Server;
use serde_json::{json, Value};

/// A template of llama.cpp's models/templates, as the tokenizer's tests keep it.
fn real_template(name: &str) -> String {
    format!(
        "{}/../specd-tokenizer/tests/real_templates/{name}.jinja",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `specd serve` with `template` and `extra` flags, `env` set.
fn serve_with(template: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let t = real_template(template);
    let mut args = vec!["--jinja", "--chat-template-file", &t, "-c", "4096"];
    args.extend_from_slice(extra);
    Server::start_env(&args, env)
}

fn serve(extra: &[&str]) -> Server {
    serve_with("Qwen3.5-4B", extra, &[])
}

/// A one-message conversation with `fields` added to the request.
fn hi(fields: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "Hi"}]});
    if let (Some(b), Some(f)) = (b.as_object_mut(), fields.as_object()) {
        b.extend(f.clone());
    }
    b
}

/// Qwen3.5's prompt for [`hi`] with thinking on, and off.
const THINKING: &str = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n";
const NO_THINKING: &str =
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

/// An agent's turn: tools with nested schemas (key order as sent, non-ASCII description), the
/// model's call with its arguments as a JSON string, the tool's result.
fn agent_conversation() -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Rename foo to bar in main.py"},
            {"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_0",
                "type": "function",
                "function": {
                    "name": "edit_file",
                    "arguments": "{\"path\": \"main.py\", \"edits\": [{\"old\": \"foo\", \"new\": \"bar\"}], \"dry_run\": false}"
                }
            }]},
            {"role": "tool", "tool_call_id": "call_0", "content": "1 edit applied"}
        ],
        "tools": [{"type": "function", "function": {
            "name": "edit_file",
            "description": "Édite un fichier",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "edits": {"type": "array", "items": {"type": "object", "properties": {
                        "old": {"type": "string"}, "new": {"type": "string"}
                    }}},
                    "dry_run": {"type": "boolean"}
                },
                "required": ["path", "edits"]
            }
        }}]
    })
}

/// What llama-server's `/apply-template` returns for [`agent_conversation`] with the same
/// template: the tool as Python's `json.dumps` writes it, the call's arguments as parameters
/// (`False` as Python prints it), the thinking block of the current turn.
const AGENT_PROMPT: &str = concat!(
    "<|im_start|>system\n",
    "# Tools\n",
    "\n",
    "You have access to the following functions:\n",
    "\n",
    "<tools>\n",
    "{\"type\": \"function\", \"function\": {\"name\": \"edit_file\", \"description\": \"Édite un fichier\", \"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"}, \"edits\": {\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"old\": {\"type\": \"string\"}, \"new\": {\"type\": \"string\"}}}}, \"dry_run\": {\"type\": \"boolean\"}}, \"required\": [\"path\", \"edits\"]}}}\n",
    "</tools>\n",
    "\n",
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n",
    "\n",
    "<tool_call>\n",
    "<function=example_function_name>\n",
    "<parameter=example_parameter_1>\n",
    "value_1\n",
    "</parameter>\n",
    "<parameter=example_parameter_2>\n",
    "This is the value for the second parameter\n",
    "that can span\n",
    "multiple lines\n",
    "</parameter>\n",
    "</function>\n",
    "</tool_call>\n",
    "\n",
    "<IMPORTANT>\n",
    "Reminder:\n",
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n",
    "- Required parameters MUST be specified\n",
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n",
    "- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n",
    "</IMPORTANT>\n",
    "\n",
    "You are a coding agent.<|im_end|>\n",
    "<|im_start|>user\n",
    "Rename foo to bar in main.py<|im_end|>\n",
    "<|im_start|>assistant\n",
    "<think>\n",
    "\n",
    "</think>\n",
    "\n",
    "<tool_call>\n",
    "<function=edit_file>\n",
    "<parameter=path>\n",
    "main.py\n",
    "</parameter>\n",
    "<parameter=edits>\n",
    "[{\"old\": \"foo\", \"new\": \"bar\"}]\n",
    "</parameter>\n",
    "<parameter=dry_run>\n",
    "False\n",
    "</parameter>\n",
    "</function>\n",
    "</tool_call><|im_end|>\n",
    "<|im_start|>user\n",
    "<tool_response>\n",
    "1 edit applied\n",
    "</tool_response><|im_end|>\n",
    "<|im_start|>assistant\n",
    "<think>\n",
);

#[test]
fn apply_template_renders_tool_calls_as_llama_server() {
    let s = serve(&[]);
    let r = s.post("/apply-template", &agent_conversation());
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!r.text().contains("cannot convert value into pairs"));
    assert_eq!(r.json()["prompt"], AGENT_PROMPT);
}

#[test]
fn chat_completion_prompt_has_the_tools() {
    let s = serve(&[]);
    let mut body = agent_conversation();
    body["max_tokens"] = json!(1);
    body["verbose"] = json!(true);
    let v = s.ok("/v1/chat/completions", &body);
    let prompt = v["__verbose"]["prompt"].as_str().expect("__verbose.prompt");
    assert!(prompt.ends_with(AGENT_PROMPT), "{prompt:?}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
}

#[test]
fn props_report_the_template_capabilities() {
    let s = serve(&[]);
    let v = s.get("/props").json();
    // As llama-server's /props reports them for this template.
    assert_eq!(
        v["chat_template_caps"],
        json!({
            "supports_object_arguments": true,
            "supports_parallel_tool_calls": true,
            "supports_preserve_reasoning": false,
            "supports_reasoning_effort": false,
            "supports_string_content": true,
            "supports_system_role": true,
            "supports_tool_calls": true,
            "supports_tools": true,
            "supports_typed_content": true
        })
    );
}

#[test]
fn template_kwargs_from_the_command_line_and_the_request() {
    let s = serve(&[]);
    assert_eq!(s.ok("/apply-template", &hi(json!({})))["prompt"], THINKING);
    let off = hi(json!({"chat_template_kwargs": {"enable_thinking": false}}));
    assert_eq!(s.ok("/apply-template", &off)["prompt"], NO_THINKING);
    drop(s);

    let s = serve(&["--chat-template-kwargs", r#"{"enable_thinking": false}"#]);
    assert_eq!(
        s.ok("/apply-template", &hi(json!({})))["prompt"],
        NO_THINKING
    );
    let on = hi(json!({"chat_template_kwargs": {"enable_thinking": true}}));
    assert_eq!(s.ok("/apply-template", &on)["prompt"], THINKING);
    // llama-server refuses a string where the template expects a boolean.
    let bad = hi(json!({"chat_template_kwargs": {"enable_thinking": "false"}}));
    let v = assert_error(
        &s.post("/apply-template", &bad),
        400,
        "invalid_request_error",
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains(r#"invalid type for "enable_thinking" (expected boolean, got string)"#),
        "{v}"
    );
}

#[test]
fn reasoning_flags_and_effort_set_enable_thinking() {
    let s = serve(&["-rea", "off"]);
    assert_eq!(
        s.ok("/apply-template", &hi(json!({})))["prompt"],
        NO_THINKING
    );
    drop(s);
    let s = serve_with("Qwen3.5-4B", &[], &[("LLAMA_ARG_REASONING", "off")]);
    assert_eq!(
        s.ok("/apply-template", &hi(json!({})))["prompt"],
        NO_THINKING
    );
    drop(s);
    let s = serve(&[
        "--chat-template-kwargs",
        r#"{"enable_thinking": false}"#,
        "--reasoning",
        "on",
    ]);
    assert_eq!(s.ok("/apply-template", &hi(json!({})))["prompt"], THINKING);
    // OpenAI's reasoning_effort "none" turns thinking off for the request.
    let none = hi(json!({"reasoning_effort": "none"}));
    assert_eq!(s.ok("/apply-template", &none)["prompt"], NO_THINKING);
    let high = hi(json!({"reasoning_effort": "high"}));
    assert_eq!(s.ok("/apply-template", &high)["prompt"], THINKING);
}

#[test]
fn no_reasoning_preserve_drops_earlier_reasoning() {
    // Nemotron 3 Nano keeps earlier turns' reasoning unless `truncate_history_thinking`; the
    // prompts are llama-server's for the same flags.
    let body = json!({"messages": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "A greeting."},
        {"role": "user", "content": "Bye!"}
    ]});
    let head =
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n";
    let tail =
        "Hello!<|im_end|>\n<|im_start|>user\nBye!<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let nemotron = "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16";
    let s = serve_with(nemotron, &[], &[]);
    assert_eq!(
        s.ok("/apply-template", &body)["prompt"],
        format!("{head}<think>\nA greeting.\n</think>\n{tail}")
    );
    drop(s);
    let s = serve_with(nemotron, &["--no-reasoning-preserve"], &[]);
    assert_eq!(
        s.ok("/apply-template", &body)["prompt"],
        format!("{head}<think></think>\n{tail}")
    );
}

#[test]
fn kwargs_must_be_a_json_object() {
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "-m"])
        .arg(common::model())
        .args(["--port", "0", "--chat-template-kwargs", "[1, 2]"])
        .output()
        .expect("running specd serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--chat-template-kwargs must be a JSON object"),
        "{err}"
    );
}

#[test]
fn tool_call_arguments_that_are_not_json_are_refused() {
    let s = serve(&[]);
    let mut body = agent_conversation();
    body["messages"][2]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    let v = assert_error(
        &s.post("/apply-template", &body),
        400,
        "invalid_request_error",
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("Failed to parse tool call arguments as JSON"),
        "{msg}"
    );
    // The server keeps serving.
    assert_eq!(s.post("/apply-template", &agent_conversation()).status, 200);
}
