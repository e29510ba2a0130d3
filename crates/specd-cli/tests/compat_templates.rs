//! Real chat templates over HTTP: `specd serve --jinja --chat-template-file` with the Qwen3.5
//! template llama.cpp ships (models/templates/Qwen3.5-4B.jinja) renders an agent's conversation
//! — tools, a tool call whose arguments are a JSON string, the tool's result — to the prompt
//! llama-server renders for it, on `/apply-template` and on `/v1/chat/completions`;
//! `--chat-template-kwargs` and a request's `chat_template_kwargs` reach the template.

mod common;

use common::http::assert_error;
use common::Server;
use serde_json::{json, Value};

fn qwen35_template() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../specd-tokenizer/tests/real_templates/Qwen3.5-4B.jinja"
    )
    .to_string()
}

fn serve(extra: &[&str]) -> Server {
    let t = qwen35_template();
    let mut args = vec!["--jinja", "--chat-template-file", &t, "-c", "4096"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

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
    let hi = |kwargs: Option<Value>| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}]});
        if let Some(k) = kwargs {
            b["chat_template_kwargs"] = k;
        }
        b
    };
    let thinking = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let no_thinking =
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";

    let s = serve(&[]);
    assert_eq!(s.ok("/apply-template", &hi(None))["prompt"], thinking);
    let off = hi(Some(json!({"enable_thinking": false})));
    assert_eq!(s.ok("/apply-template", &off)["prompt"], no_thinking);
    drop(s);

    let s = serve(&["--chat-template-kwargs", r#"{"enable_thinking": false}"#]);
    assert_eq!(s.ok("/apply-template", &hi(None))["prompt"], no_thinking);
    let on = hi(Some(json!({"enable_thinking": true})));
    assert_eq!(s.ok("/apply-template", &on)["prompt"], thinking);
    // llama-server refuses a string where the template expects a boolean.
    let v = assert_error(
        &s.post(
            "/apply-template",
            &hi(Some(json!({"enable_thinking": "false"}))),
        ),
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
