#!/usr/bin/env python3
"""Runs the commands of README.md (and docs/http-api.md) as written: a new user's path (.ci/run).

Fenced blocks are read by their info string:

  ```sh build    the build command: run first (skipped with --binary)
  ```sh server   started in the background; the check waits for its /health
  ```sh test     the test command: not run here (.ci/run runs it), but it must be the command
                 .ci/run runs, line for line
  ```sh          run in order once the server is up; every curl in it must get a 2xx answer
  ```python      run with a Python that has the `openai` and `anthropic` packages (a virtual
                 environment under target/venv-readme is made for them unless --python is given)

Other blocks (```text, ```toml, …) hold placeholders (MODEL.gguf, HOST:PORT) and are not run.

Usage: python3 scripts/check-readme-commands.py [--binary target/debug/specd] [--python PY]
  --binary PATH  use an already built binary: the build block is skipped and the commands'
                 `target/release/specd` becomes PATH (CI passes the debug binary it built)
"""
import argparse
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = ["README.md", "docs/http-api.md"]
FENCE = re.compile(r"^```(\w*)[ \t]*([\w -]*)$")
HEALTH = "http://127.0.0.1:8080/health"
# Every curl of a checked block fails on an HTTP error status (curl alone exits 0 on a 500).
CURL_STRICT = 'curl() { command curl --fail-with-body "$@"; }\n'


def blocks(path):
    """(language, tags, text, first line) of each fenced block of a Markdown file."""
    out = []
    lang = None
    for n, line in enumerate((ROOT / path).read_text(encoding="utf-8").splitlines(), 1):
        if lang is None:
            m = FENCE.match(line)
            if m and line != "```":
                lang, tags, body, start = m.group(1), set(m.group(2).split()), [], n
            elif line == "```":
                lang, tags, body, start = "", set(), [], n
        elif line.startswith("```"):
            out.append((lang, tags, "\n".join(body) + "\n", f"{path}:{start}"))
            lang = None
        else:
            body.append(line)
    return out


def python_env(given):
    if given:
        return given
    venv = ROOT / "target" / "venv-readme"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
    subprocess.check_call([str(py), "-m", "pip", "install", "-q", "openai", "anthropic"])
    return str(py)


def wait_health(proc, secs=180):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(HEALTH, timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:
            time.sleep(0.5)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary")
    ap.add_argument("--python")
    a = ap.parse_args()
    os.chdir(ROOT)

    def as_run(text):
        return text.replace("target/release/specd", a.binary) if a.binary else text

    all_blocks = [b for f in FILES for b in blocks(f)]
    failures = []
    ran = 0

    tests = [b for b in all_blocks if b[0] == "sh" and "test" in b[1]]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for _, _, text, where in tests:
        for cmd in text.strip().splitlines():
            if cmd.strip() and not cmd.lstrip().startswith("#") and cmd.strip() not in ci:
                failures.append(f"{where}: `{cmd.strip()}` is not a line of .ci/run")
    if not tests:
        failures.append("README.md has no ```sh test block")

    for _, tags, text, where in all_blocks:
        if tags & {"build"} and not a.binary:
            print(f"== {where} (build)\n{text}", flush=True)
            ran += 1
            if subprocess.run(["bash", "-euo", "pipefail", "-c", text]).returncode != 0:
                sys.exit(f"check-readme-commands: the build block at {where} failed")

    try:
        with urllib.request.urlopen(HEALTH, timeout=2):
            sys.exit("check-readme-commands: something already answers on 127.0.0.1:8080; stop it first")
    except OSError:
        pass

    servers = []
    py = None
    try:
        for lang, tags, text, where in all_blocks:
            if lang != "sh" or not tags & {"server"}:
                continue
            print(f"== {where} (server, in the background)\n{as_run(text)}", flush=True)
            log = open(ROOT / "target" / "check-readme-server.log", "w")
            p = subprocess.Popen(["bash", "-c", "exec " + as_run(text).strip()], stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            servers.append(p)
            ran += 1
            if not wait_health(p):
                print((ROOT / "target" / "check-readme-server.log").read_text()[-4000:])
                sys.exit(f"check-readme-commands: the server of {where} did not come up")
        if not servers:
            failures.append("README.md has no ```sh server block")
        for lang, tags, text, where in all_blocks:
            if lang == "sh" and not tags:
                script = CURL_STRICT + as_run(text)
                cmd = ["bash", "-euo", "pipefail", "-c", script]
            elif lang == "python":
                py = py or python_env(a.python)
                cmd = [py, "-c", text]
            else:
                continue
            print(f"== {where}\n{as_run(text)}", flush=True)
            ran += 1
            t0 = time.time()
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                out = (r.stdout + r.stderr).strip()
                print(out[:1500] + (" …" if len(out) > 1500 else ""))
                if r.returncode != 0:
                    failures.append(f"{where}: exit status {r.returncode}")
                elif not r.stdout.strip():
                    failures.append(f"{where}: printed nothing")
            except subprocess.TimeoutExpired:
                failures.append(f"{where}: still running after 300 s")
            print(f"-- {time.time() - t0:.1f} s", flush=True)
    finally:
        for p in servers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
    for f in failures:
        print("FAIL", f)
    print(f"check-readme-commands: {ran} blocks run, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
