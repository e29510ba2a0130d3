#!/usr/bin/env python3
"""Token ids and log-probabilities of two specd binaries, side by side: every drafter, rollback
kind and sampler (greedy and seeded) on the synthetic presets the property tests use — qwen35,
llama, a K-quant mix, and qwen35moe / qwen3next with MTP heads — plus the trained pair. Prints
the runs that differ and exits 1 if any does. For refactors that must not change behaviour.

    python3 scripts/compare-outputs.py --a /tmp/specd-before --b target/release/specd
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models")

# (file name, make-test-model arguments or None for a trained file, has an MTP head)
PRESETS = [
    ("qwen35.gguf", ["--preset", "qwen35-tiny", "--mtp"], True),
    ("qwen35-rep.gguf", ["--preset", "qwen35-tiny", "--style", "repetitive", "--mtp"], True),
    ("llama.gguf", ["--preset", "llama-tiny"], False),
    ("kquant.gguf", ["--preset", "qwen35-tiny", "--type", "q4_k_xl", "--mtp"], True),
    ("moe.gguf", ["--preset", "qwen35moe-tiny", "--mtp"], True),
    ("moe-rep.gguf", ["--preset", "qwen35moe-tiny", "--style", "repetitive", "--mtp"], True),
    ("next.gguf", ["--preset", "qwen3next-tiny", "--mtp"], True),
    ("next-rep.gguf", ["--preset", "qwen3next-tiny", "--style", "repetitive", "--mtp"], True),
]
DRAFTERS = ["none", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache",
            "synthetic", "draft-mtp"]
ROLLBACKS = ["replay", "snapshot", "checkpoint"]
SAMPLERS = [["--temp", "0"], ["--temp", "0.8", "-s", "7"]]
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"


def run(binary, model, extra, n):
    cmd = [binary, "generate", "-m", model, "-p", PROMPT, "-n", str(n), "-t", "2", "--json",
           "--n-probs", "2", "--ignore-eos"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:]}
    d = json.loads(out.stdout)
    return {"tokens": d["tokens"], "probs": d["probs"]}


def cases(d):
    for name, _, mtp in PRESETS:
        for drafter, rb, samp in itertools.product(DRAFTERS, ROLLBACKS, SAMPLERS):
            if drafter == "draft-mtp" and not mtp:
                continue
            if drafter == "none" and rb != "replay":
                continue
            yield (os.path.join(d, name), ["--spec-type", drafter, "--spec-rollback", rb] + samp)
    target = os.path.join(SHARED, "qwen35-code-target-f32.gguf")
    draft = os.path.join(SHARED, "qwen35-code-draft-f32.gguf")
    if os.path.exists(target):
        for drafter, rb, samp in itertools.product(
                ["none", "ngram-mod", "draft-simple"], ROLLBACKS, SAMPLERS):
            extra = ["--spec-type", drafter, "--spec-rollback", rb] + samp
            if drafter == "draft-simple":
                extra += ["--model-draft", draft]
            yield (target, extra)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="one binary (say, before a change)")
    ap.add_argument("--b", required=True, help="the other (after)")
    ap.add_argument("-n", type=int, default=48, help="tokens per run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for name, make, _ in PRESETS:
            subprocess.run([args.a, "make-test-model", "-o", os.path.join(d, name)] + make,
                           check=True, capture_output=True)
        n_runs = n_diff = 0
        for model, extra in cases(d):
            # Alternated, so that nothing of the host's state favours one binary.
            ra = run(args.a, model, extra, args.n)
            rb = run(args.b, model, extra, args.n)
            n_runs += 1
            if ra != rb or "error" in ra:
                n_diff += 1
                print(f"DIFFERS: {os.path.basename(model)} {' '.join(extra)}: {str(ra)[:200]} | "
                      f"{str(rb)[:200]}")
        print(f"{n_runs} runs, {n_diff} differ or fail")
        sys.exit(1 if n_diff else 0)


if __name__ == "__main__":
    main()
