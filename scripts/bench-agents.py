#!/usr/bin/env python3
"""Agent workload side by side: specd vs llama-server, plain vs speculative, same file and flags.

The workload is a coding agent re-emitting an edited file through a tool call: the conversation
holds a source file, the user asks for a small edit, and the request forces a `write_file` call
(`tool_choice: required` with `write_file` the only tool), so the answer is the whole file again inside the call's
arguments — the case where n-gram drafts from the prompt pay.

Each server is started with the same model, chat template, threads and context, once without
speculation and once per `--spec-type`; every request is greedy with a fixed token budget. The
script prints each configuration's generation speed (median of `timings.predicted_per_second`
over the files, as both servers report it), the acceptance rate, and the ratios
speculative / plain and specd / llama-server.

    scripts/bench-agents.py --specd target/release/specd \
        --llama-server ~/.cache/specd-peer/llama.cpp/bin/llama-server \
        -m ../shared/models/qwen35-code-target-f32.gguf \
        --chat-template-file path/to/Qwen3.5-4B.jinja -t 2 -n 256
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

# Source files the agent edits: Python standard-library modules (what the trained pair knows),
# each cut to a window of lines, with a rename to ask for.
FILES = [
    ("textwrap.py", 1, 90, "TextWrapper", "LineWrapper"),
    ("shlex.py", 1, 90, "shlex", "Lexer"),
    ("bisect.py", 1, 80, "insort_right", "insert_right"),
]

WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "description": "Write the whole content of a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path of the file"},
                "content": {"type": "string", "description": "The new content"},
            },
            "required": ["path", "content"],
        },
    },
}


def stdlib_dir():
    import sysconfig

    return sysconfig.get_paths()["stdlib"]


def requests_for(n_predict):
    out = []
    for name, a, b, old, new in FILES:
        with open(os.path.join(stdlib_dir(), name), encoding="utf-8") as f:
            code = "".join(f.readlines()[a - 1 : b])
        out.append(
            {
                "messages": [
                    {"role": "system", "content": "You are a coding agent. Change files with the write_file tool."},
                    {
                        "role": "user",
                        "content": f"This is {name}:\n```python\n{code}```\n"
                        f"Rename `{old}` to `{new}` and write the whole file back.",
                    },
                ],
                "tools": [WRITE_FILE],
                # `required` with the one tool: llama-server takes tool_choice as a string only.
                "tool_choice": "required",
                # The agent wants the edit, not deliberation: thinking off, so the forced call
                # starts at once (with thinking on, a small model may think past the budget).
                "chat_template_kwargs": {"enable_thinking": False},
                "temperature": 0,
                "max_tokens": n_predict,
            }
        )
    return out


def post(url, body, timeout=600):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(base, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.3)
    raise RuntimeError("server did not become ready")


def run_config(binary, args, spec, port, reqs, reps):
    cmd = [binary, "-m", args.model, "--port", str(port), "-t", str(args.threads),
           "-c", str(args.ctx), "-np", "1", "--jinja", "--chat-template-file", args.chat_template_file]
    if spec != "none":
        cmd += ["--spec-type", spec]
        if "draft" in spec and args.model_draft:
            cmd += ["-md", args.model_draft]
    if os.path.basename(binary).startswith("specd"):
        cmd = [binary, "serve"] + cmd[1:]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        post(base + "/v1/chat/completions", reqs[0])  # warm-up
        speeds, drafted, accepted, calls, texts = [], 0, 0, 0, []
        for _ in range(reps):
            for r in reqs:
                v = post(base + "/v1/chat/completions", r)
                t = v.get("timings", {})
                speeds.append(t.get("predicted_per_second", 0.0))
                drafted += t.get("draft_n", 0)
                accepted += t.get("draft_n_accepted", 0)
                msg = v["choices"][0]["message"]
                calls += len(msg.get("tool_calls") or [])
                texts.append(json.dumps(msg.get("tool_calls") or msg.get("content"), sort_keys=True))
        return {
            "tok_s": statistics.median(speeds),
            "acceptance": accepted / drafted if drafted else None,
            "tool_calls": calls,
            "requests": reps * len(reqs),
            "texts": texts,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def strip_ids(texts):
    out = []
    for t in texts:
        v = json.loads(t)
        if isinstance(v, list):
            v = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in v]
        out.append(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specd", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft")
    ap.add_argument("--chat-template-file", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("-n", "--n-predict", type=int, default=256)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--spec-type", action="append", default=None,
                    help="speculative configuration(s) to compare with plain (default ngram-mod)")
    ap.add_argument("--port", type=int, default=18777)
    args = ap.parse_args()
    specs = args.spec_type or ["ngram-mod"]
    reqs = requests_for(args.n_predict)
    results = {}
    for name, binary in (("llama-server", args.llama_server), ("specd", args.specd)):
        for spec in ["none"] + specs:
            r = run_config(binary, args, spec, args.port, reqs, args.reps)
            results[(name, spec)] = r
            acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
            same = ""
            if spec != "none":
                same = "  same output as plain: " + (
                    "yes" if strip_ids(r["texts"]) == strip_ids(results[(name, "none")]["texts"]) else "NO")
            print(f"{name:13s} {spec:12s} {r['tok_s']:8.1f} tok/s  acceptance {acc:>5s}  "
                  f"tool calls {r['tool_calls']}/{r['requests']}{same}", flush=True)
    print()
    for spec in specs:
        for name in ("llama-server", "specd"):
            ratio = results[(name, spec)]["tok_s"] / results[(name, "none")]["tok_s"]
            print(f"{name:13s} {spec} / plain: {ratio:.2f}x")
    for spec in ["none"] + specs:
        ratio = results[("specd", spec)]["tok_s"] / results[("llama-server", spec)]["tok_s"]
        print(f"specd / llama-server ({spec}): {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
