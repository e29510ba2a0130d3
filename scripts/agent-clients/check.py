#!/usr/bin/env python3
"""Checks the exchanges proxy.py logged for run.sh: CLAUDE_LOG CODEX_LOG."""
import json
import sys

failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def load(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


claude = load(sys.argv[1])
model = [e for e in claude if e["method"] == "POST" and e["path"].startswith("/v1/messages")]
check(all(e["status"] == 200 for e in claude),
      "Claude Code: every request answered 200 (%s)" % sorted({(e["method"], e["path"], e["status"]) for e in claude}))
first = [e for e in model if e.get("forced_call")]
check(bool(first) and '"tool_use"' in first[0]["response"] and "message_stop" in first[0]["response"],
      "Claude Code turn 1: a streamed tool_use answer")
second = [e for e in model if any(
    isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"])
    for m in e["request"].get("messages", []))]
check(bool(second) and any(
    isinstance(m.get("content"), list) and any(b.get("type") == "tool_use" for b in m["content"])
    for m in second[0]["request"]["messages"]),
      "Claude Code turn 2: the call and its result in the history, answered 200")
check(any(m.get("role") == "system" for e in model for m in e["request"].get("messages", [])),
      "Claude Code: system messages inside 'messages' were sent (and accepted)")

codex = load(sys.argv[2])
resp = [e for e in codex if e["method"] == "POST" and e["path"].endswith("/responses")]
check(bool(resp) and all(e["status"] == 200 for e in codex),
      "Codex CLI: every request answered 200 (%s)" % sorted({(e["method"], e["path"], e["status"]) for e in codex}))
first = [e for e in resp if e.get("forced_call")]
check(bool(first) and '"function_call"' in first[0]["response"] and "response.completed" in first[0]["response"],
      "Codex turn 1: a streamed function_call, response.completed")
check(bool(first) and [i.get("role") for i in first[0]["request"]["input"][:2]] == ["developer", "developer"],
      "Codex: two leading developer items (merged into one system prompt)")
check(bool(first) and any(t.get("type") == "namespace" for t in first[0]["request"].get("tools", []))
      and any(t.get("type") == "web_search" for t in first[0]["request"].get("tools", [])),
      "Codex: namespace and web_search tools accepted")
second = [e for e in resp if any(i.get("type") == "function_call_output" for i in e["request"].get("input", []))]
check(bool(second) and "response.completed" in second[0]["response"] or bool(second) and "response.incomplete" in second[0]["response"],
      "Codex turn 2: the call's output in the history, a finished response")
print("agent-clients: %d passed, %d failed" % (checks - len(failures), len(failures)))
sys.exit(1 if failures else 0)
