#!/usr/bin/env python3
"""Parity of specd with llama.cpp on the same GGUF files (F32 weights, f32 KV cache, no flash
attention — the setting where the two engines should agree to ~1e-5).

For each synthetic model and prompt it compares:
  * tokenization of the prompt (llama-server /tokenize vs `specd generate --json`),
  * greedy token ids for N tokens (llama-server /completion, temperature 0),
  * the top-5 log-probabilities at every step where both engines saw the same context.

Usage: python3 scripts/parity.py [--llama-bin DIR] [--specd PATH] [--tokens 64] [--out PARITY.md]
Needs llama.cpp built by ../shared/tools/build-llamacpp.sh (default location is used).
"""
import argparse, json, os, subprocess, sys, tempfile, time, urllib.request

PROMPTS = [
    "def fibonacci(n):\n    ",
    "The quick brown fox",
    "import os\nimport sys\n\nclass Parser:\n    def __init__(self, text):",
    "for i in range(10):\n    print(i * i)\n# and now",
]
MODELS = [
    ("qwen35-tiny", ["--preset", "qwen35-tiny", "--type", "f32"]),
    ("qwen35-small", ["--preset", "qwen35-small", "--type", "f32"]),
    ("llama-small", ["--preset", "llama-small", "--type", "f32"]),
]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def start_server(bin_dir, model, port):
    cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "--port", str(port), "-c", "2048", "-t", "2",
           "-ctk", "f32", "-ctv", "f32", "-fa", "off", "-np", "1", "--no-warmup"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return p
        except Exception:
            pass
        if p.poll() is not None:
            raise RuntimeError(f"llama-server exited with {p.returncode} on {model}")
        time.sleep(0.2)
    p.kill()
    raise RuntimeError("llama-server did not start")


def specd_run(specd, model, tokens, n):
    cmd = [specd, "generate", "-m", model, "--prompt-tokens", ",".join(map(str, tokens)), "-n", str(n),
           "--temp", "0", "--ignore-eos", "--json", "--n-probs", "5", "-t", "2"]
    return json.loads(subprocess.check_output(cmd))


def specd_tokenize(specd, model, text):
    cmd = [specd, "generate", "-m", model, "-p", text, "-n", "1", "--temp", "0", "--json", "-t", "2"]
    return json.loads(subprocess.check_output(cmd))["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", default=os.path.expanduser("~/.cache/specd-peer/llama.cpp/bin"))
    ap.add_argument("--specd", default="target/release/specd")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default="PARITY.md")
    ap.add_argument("--port", type=int, default=18089)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.llama_bin, "llama-server")):
        sys.exit(f"llama.cpp not found in {a.llama_bin}: run ../shared/tools/build-llamacpp.sh")
    tmp = tempfile.mkdtemp(prefix="specd-parity-")
    lines = ["# Parity with llama.cpp", "",
             f"Command: `python3 scripts/parity.py --tokens {a.tokens}` (llama.cpp: llama-server -ctk f32 -ctv f32 -fa off, "
             "2 threads; specd: `specd generate --temp 0 --n-probs 5`). Synthetic models made by `specd make-test-model` "
             "with F32 weights and varied (untied-head) weights.", "",
             "| model | prompt | tokenization | greedy ids equal | max rel. diff of top-5 logprobs |",
             "|---|---|---|---|---|"]
    ok_all = True
    for name, args in MODELS:
        path = os.path.join(tmp, name + ".gguf")
        subprocess.check_call([a.specd, "make-test-model", *args, "-o", path], stderr=subprocess.DEVNULL)
        srv = start_server(a.llama_bin, path, a.port)
        try:
            for prompt in PROMPTS:
                lt = post(f"http://127.0.0.1:{a.port}/tokenize", {"content": prompt, "add_special": True})["tokens"]
                st = specd_tokenize(a.specd, path, prompt)
                tok_ok = lt == st
                r = post(f"http://127.0.0.1:{a.port}/completion", {
                    "prompt": lt, "n_predict": a.tokens, "temperature": 0, "n_probs": 5, "cache_prompt": False,
                    "ignore_eos": True, "return_tokens": True, "post_sampling_probs": False})
                ltoks = r["tokens"]
                lprobs = r.get("completion_probabilities", [])
                s = specd_run(a.specd, path, lt, a.tokens)
                stoks = s["tokens"]
                same = 0
                while same < min(len(ltoks), len(stoks)) and ltoks[same] == stoks[same]:
                    same += 1
                worst = 0.0
                # Steps 0..same share the context, so their distributions must agree.
                for i in range(min(same + 1, len(lprobs), len(s["probs"]))):
                    mine = {t: lp for t, lp in s["probs"][i]["top"]}
                    for e in lprobs[i]["top_logprobs"]:
                        if e["id"] in mine:
                            ref = e["logprob"]
                            worst = max(worst, abs(mine[e["id"]] - ref) / max(abs(ref), 1e-3))
                ok = tok_ok and same >= min(a.tokens, len(ltoks)) and worst < 1e-3
                ok_all &= ok
                lines.append(f"| {name} | `{json.dumps(prompt)[1:-1][:40]}` | {'same' if tok_ok else 'DIFFERENT'} "
                             f"({len(lt)} tok) | {same}/{len(ltoks)} | {worst:.2e} |")
                print(lines[-1], flush=True)
        finally:
            srv.kill()
            srv.wait()
    lines += ["", "Result: " + ("all agree." if ok_all else "DISAGREEMENT (see rows above).")]
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-1:]))
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
