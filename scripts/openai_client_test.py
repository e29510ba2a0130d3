#!/usr/bin/env python3
"""Talks to a running `specd serve` with the official `openai` Python package: a chat, a
streamed chat and a `response_format: json_schema` request.

    python3 scripts/openai_client_test.py [--base-url http://127.0.0.1:8080/v1] [--api-key KEY]

Installs `openai` (into target/venv-openai, or with --user when venv is unavailable) if it
is missing. Exits non-zero on any failure.
"""

import argparse
import json
import os
import subprocess
import sys


def ensure_openai():
    try:
        import openai  # noqa: F401
        return None
    except ImportError:
        pass
    venv = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "venv-openai")
    py = os.path.join(venv, "bin", "python")
    try:
        if not os.path.exists(py):
            subprocess.check_call([sys.executable, "-m", "venv", venv])
        subprocess.check_call([py, "-m", "pip", "install", "-q", "openai"])
        return py
    except (subprocess.CalledProcessError, OSError):
        subprocess.check_call(
            [sys.executable, "-m", "pip", "install", "-q", "--user", "openai"]
        )
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default=os.environ.get("SPECD_URL", "http://127.0.0.1:8080/v1"))
    ap.add_argument("--api-key", default=os.environ.get("SPECD_API_KEY", "sk-no-key-required"))
    ap.add_argument("--model", default="specd")
    args = ap.parse_args()

    if os.environ.get("SPECD_OPENAI_CHILD") != "1":
        py = ensure_openai()
        if py is not None:
            # Re-run inside the venv that now has the package.
            env = dict(os.environ, SPECD_OPENAI_CHILD="1")
            sys.exit(subprocess.call([py, os.path.abspath(__file__)] + sys.argv[1:], env=env))

    import openai

    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key)
    print(f"openai {openai.__version__} -> {args.base_url}")
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."},
    ]

    # 1. A chat.
    r = client.chat.completions.create(model=args.model, messages=msgs, max_tokens=32, temperature=0)
    c = r.choices[0]
    assert r.object == "chat.completion", r.object
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    print(f"chat: finish={c.finish_reason} usage={r.usage.prompt_tokens}+{r.usage.completion_tokens} "
          f"content={c.message.content!r}")

    # 2. The same chat, streamed: the chunks add up to the same text (greedy).
    parts, finish, n_chunks = [], None, 0
    stream = client.chat.completions.create(
        model=args.model, messages=msgs, max_tokens=32, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        n_chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        if d.content:
            parts.append(d.content)
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    text = "".join(parts)
    assert finish in ("stop", "length"), finish
    assert text == c.message.content, (text, c.message.content)
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens
    print(f"stream: {n_chunks} chunks, finish={finish}, same text as the non-streamed chat: yes")

    # 3. Structured output: the reply follows the JSON schema.
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer", "maximum": 99}},
        "required": ["name", "n"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": "Give a name and a number as JSON."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}},
    )
    out = r.choices[0].message.content
    print(f"json_schema: finish={r.choices[0].finish_reason} content={out!r}")
    if r.choices[0].finish_reason == "stop":
        obj = json.loads(out)
        assert set(obj) == {"name", "n"}, obj
        assert isinstance(obj["name"], str) and isinstance(obj["n"], int), obj
        print(f"json_schema: valid JSON matching the schema: {obj}")
    else:
        # Cut off by max_tokens: still a prefix of schema-valid JSON.
        assert out.startswith('{"name":'), out
        print("json_schema: cut off by max_tokens, output is a schema-valid prefix")
    print("OK")


if __name__ == "__main__":
    main()
