#!/usr/bin/env python3
"""Infill in the middle of a source file: plain vs speculative, specd vs llama-server.

Material. The trained pair in shared/models has no FIM tokens, so the script first makes a copy of
the target whose GGUF metadata names three of its own special tokens as the FIM roles
(`<|im_start|>` prefix, `<|endoftext|>` suffix, `<|im_end|>` middle) with llama.cpp's
`gguf_new_metadata.py` (tensors copied unchanged). Both servers load that same copy and build the
same prompt from it (`<pre>PREFIX<suf>SUFFIX<mid>`, extra files before it). The model was never
trained on FIM, so what it writes is a plausible continuation of the prefix, not a true middle: the
figures measure decoding speed on an infill-shaped prompt (the suffix and the extra file are in the
context, where the n-gram drafters find material), not infill quality.

Workload. A Python source file is cut at a line boundary: PREFIX = the lines before the hole,
SUFFIX = the lines after it (the hole's lines are left out), and a second file of the same package
goes in `input_extra`. Each request is greedy (`temperature` 0) with `ignore_eos`, `n_predict` N.

Runs. Both servers get the same command line (`-c 8192 -t T`): plain, and with
`--spec-type ngram-map-k` (the drafter specd's /infill uses by default). specd's plain figure comes
from its plain server with `"speculative": {"enabled": false}` in the request (its /infill would
otherwise speculate by default). The figure is `timings.predicted_per_second`, the median of
`--reps` requests after one warm-up request; the texts of plain and speculative runs must be equal (greedy).

Usage: python3 scripts/bench-infill.py [--specd target/debug/specd]
       [--llama ~/.cache/specd-peer/llama.cpp/bin/llama-server] [-m MODEL] [-t 2] [-n 128]
       [--reps 3] [--file /usr/lib/python3.11/json/decoder.py] [--extra .../json/scanner.py]
       [--hole 6] [--python PY]   (PY: a Python with numpy, pyyaml and tqdm, which gguf-py needs;
       e.g. `python3 -m venv /tmp/v && /tmp/v/bin/pip install numpy pyyaml tqdm`)
"""
import argparse, atexit, json, os, socket, statistics, subprocess, sys, tempfile, time, urllib.request

GGUF_PY = os.path.expanduser("~/.cache/specd-peer/llama.cpp/gguf-py")
ROLES = [("fim_pre", "<|im_start|>"), ("fim_suf", "<|endoftext|>"), ("fim_mid", "<|im_end|>")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    def __init__(self, cmd):
        self.port = free_port()
        cmd = cmd + ["--port", str(self.port), "--host", "127.0.0.1"]
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atexit.register(self.stop)
        for _ in range(600):
            if self.p.poll() is not None:
                raise RuntimeError(f"server exited: {' '.join(cmd)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not start: {' '.join(cmd)}")

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def fim_copy(python, model, out):
    """The target with FIM roles named in its metadata (llama.cpp's own metadata tool)."""
    cmd = [python, os.path.join(GGUF_PY, "gguf", "scripts", "gguf_new_metadata.py"), model, out, "--force"]
    for role, text in ROLES:
        cmd += ["--special-token", role, text]
    env = dict(os.environ, PYTHONPATH=GGUF_PY)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def workload(path, extra, hole):
    lines = open(path).read().splitlines(keepends=True)
    mid = len(lines) // 2
    # Start the hole at a line that opens a block, so the middle is code, not a blank line.
    while mid < len(lines) - hole and not lines[mid].strip():
        mid += 1
    return {
        "input_prefix": "".join(lines[:mid]),
        "input_suffix": "".join(lines[mid + hole:]),
        "input_extra": [{"filename": os.path.basename(extra), "text": open(extra).read()}],
    }


def run(server, body, reps):
    # One request first, not counted: the first one pays for page faults and lazy allocations.
    post(server.port, "/infill", dict(body, n_predict=4))
    rates, out = [], None
    for _ in range(reps):
        v = post(server.port, "/infill", body)
        rates.append(v["timings"]["predicted_per_second"])
        t = v["timings"]
        out = (v["content"], t.get("draft_n", 0), t.get("draft_n_accepted", 0), v["tokens_evaluated"])
    return statistics.median(rates), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specd", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "debug", "specd"))
    ap.add_argument("--llama", default=os.path.expanduser("~/.cache/specd-peer/llama.cpp/bin/llama-server"))
    ap.add_argument("-m", "--model", default="/work/shared/models/qwen35-code-target-f32.gguf")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--file", default="/usr/lib/python3.11/json/decoder.py")
    ap.add_argument("--extra", default="/usr/lib/python3.11/json/scanner.py")
    ap.add_argument("--hole", type=int, default=6, help="lines left out of the middle")
    ap.add_argument("--python", default=sys.executable, help="a Python with numpy, pyyaml, tqdm (gguf-py)")
    ap.add_argument("--spec-type", default="ngram-map-k", help="drafters of the speculative runs (both servers)")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="bench-infill-")
    model = os.path.join(tmp, "target-fim.gguf")
    fim_copy(a.python, a.model, model)
    common = ["-m", model, "-c", "8192", "-t", str(a.threads), "-np", "1"]
    spec = ["--spec-type", a.spec_type]
    body = dict(workload(a.file, a.extra, a.hole), n_predict=a.n_predict, temperature=0,
                ignore_eos=True, cache_prompt=False)
    plain_body = dict(body, speculative={"enabled": False})

    rows = {}
    for name, binary in [("specd", [a.specd, "serve"]), ("llama-server", [a.llama])]:
        s = Server(binary + common)
        rows[(name, "plain")] = run(s, plain_body if name == "specd" else body, a.reps)
        s.stop()
        s = Server(binary + common + spec)
        rows[(name, "spec")] = run(s, body, a.reps)
        s.stop()

    print(f"infill: {os.path.basename(a.file)} cut at the middle ({a.hole} lines out), extra "
          f"{os.path.basename(a.extra)}, n_predict {a.n_predict}, -t {a.threads}, median of {a.reps}")
    print(f"{'server':<13} {'mode':<6} {'prompt':>6} {'tok/s':>8} {'drafted':>8} {'accepted':>8}")
    for (name, mode), (tps, (_, dn, da, np)) in rows.items():
        print(f"{name:<13} {mode:<6} {np:>6} {tps:>8.1f} {dn:>8} {da:>8}")
    ok = True
    for name in ("specd", "llama-server"):
        p, s = rows[(name, "plain")], rows[(name, "spec")]
        same = p[1][0] == s[1][0]
        ok &= same
        print(f"{name}: speculative / plain = {s[0] / p[0]:.2f}x  (same text: {same})")
    for mode in ("plain", "spec"):
        print(f"{mode}: specd / llama-server = {rows[('specd', mode)][0] / rows[('llama-server', mode)][0]:.2f}x")
    same_prompt = rows[("specd", "plain")][1][3] == rows[("llama-server", "plain")][1][3]
    print(f"same prompt length on both servers: {same_prompt}")
    sys.exit(0 if ok and same_prompt else 1)


if __name__ == "__main__":
    main()
