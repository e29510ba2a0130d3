#!/usr/bin/env python3
"""llama.cpp's built-in chat template names (`--chat-template llama3`, ...) on llama-server and specd.

  scripts/named-chat-templates.py capture [--port N]   # llama-server -> crates/specd-tokenizer/tests/named_templates.json
  scripts/named-chat-templates.py check   [--port N]   # specd serve: /apply-template equals the captured prompts

`capture` starts llama-server once per name (`--chat-template NAME --no-jinja`, the C++ renderer of
src/llama-chat.cpp that these names select) and records what POST /apply-template returns for a set
of conversations. `check` starts `specd serve --chat-template NAME` and compares its /apply-template
with the record byte for byte. The Rust test `named_templates` renders the same record without a
server. Environment: LLAMA_SERVER (default ~/.cache/specd-peer/llama.cpp/bin/llama-server),
SPECD_BIN (default target/debug/specd), MODEL (default ../shared/models/qwen35-code-target-f32.gguf).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "crates/specd-tokenizer/tests/named_templates.json")

# The names llama-server accepts (src/llama-chat.cpp, LLM_CHAT_TEMPLATES).
NAMES = """bailing bailing-think bailing2 chatglm3 chatglm4 chatml command-r deepseek deepseek-ocr deepseek2
deepseek3 exaone-moe exaone3 exaone4 falcon3 gemma gigachat glmedge gpt-oss granite granite-4.0
granite-4.1 grok-2 hunyuan-dense hunyuan-moe hunyuan-vl kimi-k2 llama2 llama2-sys llama2-sys-bos
llama2-sys-strip llama3 llama4 megrez minicpm mistral-v1 mistral-v3 mistral-v3-tekken mistral-v7
mistral-v7-tekken monarch openchat orion pangu-embedded phi3 phi4 rwkv-world seed_oss smolvlm
solar-open vicuna vicuna-orca yandex zephyr""".split()


def msg(role, content):
    return {"role": role, "content": content}


# Conversations: system/user/assistant turns, whitespace that some templates trim, several turns,
# a final assistant turn, a tool turn, non-ASCII text; with and without the generation prompt.
CASES = [
    {"messages": [msg("system", "You are a test."), msg("user", "Hi there")]},
    {"messages": [msg("user", "Hello")], "add_generation_prompt": False},
    {"messages": [msg("system", "Be brief."), msg("user", "What is 2+2?"), msg("assistant", "4"),
                  msg("user", "And 3+3?")]},
    {"messages": [msg("user", "Hi"), msg("assistant", "Hello! How can I help?")],
     "add_generation_prompt": False},
    {"messages": [msg("system", "  Be kind.\n"), msg("user", " \tpadded question \n"),
                  msg("assistant", "\n padded answer  "), msg("user", "next\r\n")]},
    {"messages": [msg("user", "first"), msg("user", "second"), msg("assistant", "reply"),
                  msg("assistant", "more")], "add_generation_prompt": False},
    {"messages": [msg("user", "Weather?"), msg("assistant", "Checking."), msg("tool", "sunny, 21C"),
                  msg("user", "Thanks")]},
    {"messages": [msg("system", "Réponds en français."), msg("user", "Grüße, 世界! 😀")]},
    {"messages": [msg("assistant", "I start."), msg("user", "ok")]},
]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


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
    p = start(cmd, port)
    try:
        out = []
        for case in CASES:
            status, body = post(port, "/apply-template", case)
            if status != 200:
                raise RuntimeError(f"{' '.join(cmd)}: /apply-template {case}: {status} {body}")
            out.append(body["prompt"])
        return out
    finally:
        stop(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["capture", "check"])
    ap.add_argument("--port", type=int, default=18105)
    ap.add_argument("names", nargs="*", default=NAMES)
    a = ap.parse_intermixed_args()
    model = os.environ.get("MODEL", os.path.join(ROOT, "../shared/models/qwen35-code-target-f32.gguf"))
    if a.what == "capture":
        server = os.environ.get("LLAMA_SERVER",
                                os.path.expanduser("~/.cache/specd-peer/llama.cpp/bin/llama-server"))
        record = {"cases": CASES, "prompts": {}}
        for name in a.names:
            # --no-prefill-assistant: a final assistant turn is rendered as a closed turn, the
            # template's own output (prefill is request handling, not the template).
            cmd = [server, "-m", model, "--port", str(a.port), "-t", "1", "-c", "256", "--no-jinja",
                   "--no-prefill-assistant", "--chat-template", name]
            record["prompts"][name] = render_all(cmd, a.port)
            print(f"captured {name}", file=sys.stderr)
        with open(FIXTURE, "w", encoding="utf-8") as f:
            json.dump(record, f, ensure_ascii=False, indent=1)
            f.write("\n")
        return 0
    record = json.load(open(FIXTURE, encoding="utf-8"))
    specd = os.environ.get("SPECD_BIN", os.path.join(ROOT, "target/debug/specd"))
    bad = 0
    for name in a.names:
        cmd = [specd, "serve", "-m", model, "--port", str(a.port), "-t", "1", "-c", "256",
               "--no-prefill-assistant", "--chat-template", name]
        got = render_all(cmd, a.port)
        for case, want, have in zip(record["cases"], record["prompts"][name], got):
            if want != have:
                bad += 1
                print(f"DIFF {name}: {json.dumps(case, ensure_ascii=False)}\n  llama-server: {want!r}\n"
                      f"  specd:        {have!r}")
        print(f"checked {name}", file=sys.stderr)
    print(f"{bad} differences over {len(a.names)} names x {len(record['cases'])} conversations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
