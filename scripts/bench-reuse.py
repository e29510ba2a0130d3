#!/usr/bin/env python3
"""Prompt reuse across the turns of a conversation: specd vs llama-server on the same file.

For each template (llama.cpp's Qwen3.5, Qwen3-Coder and Qwen3 templates, as kept in
crates/specd-tokenizer/tests/real_templates/), thinking on and off, and each API (chat
completions, Anthropic Messages, Responses), both servers (`-np 1`, `--jinja
--chat-template-file`) run the same agent-shaped conversation: a system prompt with tools, then
TURNS turns; after each, the history gets a scripted answer (with thinking when on; the same for
both servers, so their prompts are the same; `--own-answers`: each server's own answer) and the
next user message. Printed per turn: prompt tokens and the tokens each server
reused (`timings.cache_n` where it reports it, else the API's cached-token count), and the
seconds the turn took.

  scripts/bench-reuse.py [--turns N] [--system-tokens N] [--model FILE] [--apis chat,...]
Environment: SPECD_BIN (target/release/specd), LLAMA_SERVER
(~/.cache/specd-peer/llama.cpp/bin/llama-server).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = os.path.join(ROOT, "crates/specd-tokenizer/tests/real_templates")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.load(r)


def start(cmd, port):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except Exception:
            time.sleep(0.2)
    p.kill()
    sys.exit(f"server did not start: {cmd}")


TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": f"Tool number {i}: " + "reads files and reports. " * 6,
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}} for i in range(6)]


def system_prompt(words):
    return "You are a coding agent. " + " ".join(f"rule{i} keep edits small." for i in range(words // 4))


def turn(port, api, system, history, thinking, max_tokens):
    """One request; returns (prompt tokens, reused tokens, seconds, answer message)."""
    kw = {"enable_thinking": thinking}
    t0 = time.time()
    if api == "chat":
        v = post(port, "/v1/chat/completions", {
            "messages": [{"role": "system", "content": system}] + history, "tools": TOOLS,
            "max_tokens": max_tokens, "temperature": 0, "chat_template_kwargs": kw})
        m = v["choices"][0]["message"]
        answer = {"role": "assistant", "content": m.get("content") or ""}
        if m.get("reasoning_content"):
            answer["reasoning_content"] = m["reasoning_content"]
        t = v.get("timings", {})
        return t.get("prompt_n", 0) + t.get("cache_n", 0), t.get("cache_n"), time.time() - t0, answer
    if api == "anthropic":
        msgs = []
        for h in history:
            if h["role"] == "assistant":
                blocks = []
                if h.get("reasoning_content"):
                    blocks.append({"type": "thinking", "thinking": h["reasoning_content"], "signature": ""})
                blocks.append({"type": "text", "text": h["content"] or "."})
                msgs.append({"role": "assistant", "content": blocks})
            else:
                msgs.append(h)
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"]} for t in TOOLS]
        body = {"system": system, "messages": msgs, "tools": tools, "max_tokens": max_tokens,
                "temperature": 0,
                "thinking": {"type": "enabled", "budget_tokens": 1024} if thinking else {"type": "disabled"},
                # llama-server ignores `thinking: disabled` (b11434 maps only `enabled`, to a
                # budget) and renders its default; the kwarg gives both servers the same prompt.
                "chat_template_kwargs": kw}
        v = post(port, "/v1/messages", body)
        text = "".join(b.get("text", "") for b in v["content"] if b["type"] == "text")
        think = "".join(b.get("thinking", "") for b in v["content"] if b["type"] == "thinking")
        answer = {"role": "assistant", "content": text}
        if think:
            answer["reasoning_content"] = think
        t = v.get("timings", {})
        u = v.get("usage", {})
        n = t.get("prompt_n", 0) + t.get("cache_n", 0) if t else u.get("input_tokens", 0)
        cached = t.get("cache_n", u.get("cache_read_input_tokens"))
        return n, cached, time.time() - t0, answer
    # Responses
    items = []
    for h in history:
        if h["role"] == "assistant":
            if h.get("reasoning_content"):
                items.append({"type": "reasoning", "summary": [],
                              "content": [{"type": "reasoning_text", "text": h["reasoning_content"]}]})
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": h["content"] or "."}]})
        else:
            items.append({"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": h["content"]}]})
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    v = post(port, "/v1/responses", {"instructions": system, "input": items, "tools": tools,
                                      "max_output_tokens": max_tokens, "temperature": 0,
                                      "chat_template_kwargs": kw})
    text, think = "", ""
    for it in v.get("output", []):
        if it["type"] == "message":
            text += "".join(c.get("text", "") for c in it["content"])
        elif it["type"] == "reasoning":
            think += "".join(c.get("text", "") for c in it.get("content", []))
    answer = {"role": "assistant", "content": text}
    if think:
        answer["reasoning_content"] = think
    t = v.get("timings", {})
    u = v.get("usage", {})
    n = t.get("prompt_n", 0) + t.get("cache_n", 0) if t else u.get("input_tokens", 0)
    cached = t.get("cache_n", (u.get("input_tokens_details") or {}).get("cached_tokens"))
    return n, cached, time.time() - t0, answer


def conversation(port, api, thinking, turns, system, max_tokens, own_answers):
    history, rows = [], []
    for i in range(turns):
        history.append({"role": "user", "content": f"Step {i}: look at file_{i}.rs and fix the bug in it."})
        n, cached, secs, answer = turn(port, api, system, history, thinking, max_tokens)
        rows.append((n, cached, secs))
        if not own_answers:
            # The same history for both servers (an agent's edited transcript), so that their
            # reuse compares: what the model generated is not what the history holds.
            answer = {"role": "assistant", "content": f"I fixed the bug in file_{i}.rs."}
            if thinking:
                answer["reasoning_content"] = f"The bug in file_{i}.rs is an off-by-one."
        history.append(answer)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--system-words", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--model")
    ap.add_argument("--templates", default="Qwen3.5-4B,Qwen3-Coder,Qwen-Qwen3-0.6B")
    ap.add_argument("--apis", default="chat,anthropic,responses")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--own-answers", action="store_true",
                    help="history holds each server's own answers (then the servers' prompts differ)")
    a = ap.parse_args()
    specd = os.environ.get("SPECD_BIN", os.path.join(ROOT, "target/release/specd"))
    llama = os.environ.get("LLAMA_SERVER", os.path.expanduser("~/.cache/specd-peer/llama.cpp/bin/llama-server"))
    tmp = tempfile.mkdtemp()
    model = a.model
    if not model:
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([specd, "make-test-model", "--preset", "qwen35-tiny", "-o", model],
                       check=True, stdout=subprocess.DEVNULL)
    system = system_prompt(a.system_words)
    print(f"model {model}, {a.turns} turns, threads {a.threads}")
    print("template        think api        turn  prompt  specd reused (s)   llama-server reused (s)")
    worse = 0
    for tpl in a.templates.split(","):
        path = os.path.join(TEMPLATES, tpl + ".jinja")
        common = ["-m", model, "--jinja", "--chat-template-file", path, "-np", "1", "-c", str(a.ctx),
                  "-t", str(a.threads)]
        results = {}
        for name, exe in (("specd", [specd, "serve"]), ("llama", [llama])):
            port = free_port()
            p = start(exe + common + ["--port", str(port)], port)
            try:
                for api in a.apis.split(","):
                    for thinking in (True, False):
                        try:
                            results[(name, api, thinking)] = conversation(
                                port, api, thinking, a.turns, system, a.max_tokens,
                                a.own_answers)
                        except Exception as e:  # a server that refuses the shape
                            results[(name, api, thinking)] = str(e)
            finally:
                p.kill()
                p.wait()
        for api in a.apis.split(","):
            for thinking in (True, False):
                s, l = results[("specd", api, thinking)], results[("llama", api, thinking)]
                for i in range(a.turns):
                    sr = s[i] if isinstance(s, list) else None
                    lr = l[i] if isinstance(l, list) else None
                    fmt = lambda r, e: f"{r[1]!s:>6} ({r[2]:5.2f})" if r else f"error: {e[:40]}"
                    n = (sr or lr or (0,))[0]
                    print(f"{tpl:15} {'on ' if thinking else 'off'}   {api:10} {i + 1:4} {n:7}  "
                          f"{fmt(sr, s)}     {fmt(lr, l)}")
                    if i > 0 and sr and lr and (sr[1] or 0) < (lr[1] or 0):
                        worse += 1
    print(f"follow-up turns where specd reused less than llama-server: {worse}")


main()
