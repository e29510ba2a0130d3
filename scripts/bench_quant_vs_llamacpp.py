#!/usr/bin/env python3
"""Prompt processing, generation and verification-width costs of specd against llama-bench on the
same GGUF files, threads and run, at each instruction-set level (issue 15).

For every file and level it alternates the two engines for --rounds rounds (specd first in odd
rounds, llama.cpp first in even ones, so a slow phase of the host hits both) and reports the
median of each figure and the ratio specd / llama.cpp.

Levels:
  amx     specd at its best level (AMX tiles for the prompt where the CPU has AMX-INT8), llama.cpp
          built by ../shared/tools/build-llamacpp.sh (native: its AMX buffer where the CPU has AMX)
  avx512  specd with SPECD_ISA=avx512 (AVX-512 VNNI), the same llama.cpp build
  (--peer LEVEL=DIR takes llama.cpp from DIR at that level instead: e.g. the build of
  scripts/build-llamacpp-no-amx.sh where the native build's AMX path does not run)
  avx2    specd with SPECD_NO_AVX512=1 (plain AVX2 + FMA + F16C kernels), llama.cpp built by
          scripts/build-llamacpp-avx2.sh (GGML_NATIVE=OFF, AVX2/FMA/F16C, no AVX-512, no VNNI)
  avxvnni specd with SPECD_ISA=avxvnni, against the same AVX2 llama.cpp build (it has no
          AVX-VNNI path enabled; read it as specd's gain from the 256-bit VNNI instruction)

Widths: specd's `bench --mode speed` times decode calls of 1/2/4/8 rows at a fixed depth;
llama.cpp's come from `llama-bench -p 1,2,4,8 -n 0` (time of one batch of w tokens, read as
w / pp_w), both divided by that engine's own one-row step.

Usage: python3 scripts/bench_quant_vs_llamacpp.py FILE.gguf [FILE..] [--levels amx,avx512,avx2]
       [--threads 2] [--rounds 3] [--n-prompt 128] [--n-gen 64] [--json out.json]
       [--peer LEVEL=DIR ...]
"""
import argparse, json, os, statistics, subprocess, sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.path.expanduser("~/.cache/specd-peer")
LLAMA = {"amx": os.path.join(PEER, "llama.cpp", "bin"),
         "avx512": os.path.join(PEER, "llama.cpp", "bin"),
         "avx2": os.path.join(PEER, "llama.cpp-avx2", "bin"),
         "avxvnni": os.path.join(PEER, "llama.cpp-avx2", "bin")}
SPECD_ENV = {"amx": {}, "avx512": {"SPECD_ISA": "avx512"}, "avx2": {"SPECD_NO_AVX512": "1"},
             "avxvnni": {"SPECD_ISA": "avxvnni"}}

WIDTHS = [2, 4, 8]


def run_specd(binary, path, level, a):
    env = dict(os.environ, **SPECD_ENV[level])
    cmd = [binary, "bench", "--mode", "speed", "-m", path, "-t", str(a.threads),
           "--n-prompt", str(a.n_prompt), "-n", str(a.n_gen), "--json", "-"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    s = json.loads(out)["speed"]
    ms = dict((int(w), v) for w, v in s["verify_ms_by_width"])
    return {"pp": s["pp_tok_s"], "tg": s["tg_tok_s"],
            "widths": {w: ms[w] / ms[1] for w in WIDTHS}}


def run_llama(path, level, a):
    bench = os.path.join(LLAMA[level], "llama-bench")
    def one(args):
        cmd = [bench, "-m", path, "-t", str(a.threads), "-r", "1", "-o", "json"] + args
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out)
    res = one(["-p", str(a.n_prompt), "-n", str(a.n_gen)])
    pp = next(r["avg_ts"] for r in res if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in res if r["n_gen"] > 0)
    res = one(["-p", ",".join(str(w) for w in [1] + WIDTHS), "-n", "0"])
    sec = {r["n_prompt"]: r["n_prompt"] / r["avg_ts"] for r in res if r["n_prompt"] > 0}
    return {"pp": pp, "tg": tg, "widths": {w: sec[w] / sec[1] for w in WIDTHS}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--levels", default="avx512,avx2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--specd", default=os.path.join(ROOT, "target", "release", "specd"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--peer", action="append", default=[], metavar="LEVEL=DIR",
                    help="llama.cpp bin directory for one level (repeatable)")
    a = ap.parse_args()
    for p in a.peer:
        level, _, d = p.partition("=")
        LLAMA[level] = os.path.expanduser(d)
    rows = []
    for path in a.files:
        for level in a.levels.split(","):
            if not os.path.exists(os.path.join(LLAMA[level], "llama-bench")):
                sys.exit(f"no llama-bench for {level} in {LLAMA[level]} (see the docstring)")
            s_runs, l_runs = [], []
            for r in range(a.rounds):
                order = [0, 1] if r % 2 == 0 else [1, 0]
                for o in order:
                    if o == 0:
                        s_runs.append(run_specd(a.specd, path, level, a))
                    else:
                        l_runs.append(run_llama(path, level, a))
                print(f"  {os.path.basename(path)} {level} round {r + 1}/{a.rounds}", file=sys.stderr)
            med = lambda runs, k: statistics.median(x[k] for x in runs)
            medw = lambda runs, w: statistics.median(x["widths"][w] for x in runs)
            row = {"file": os.path.basename(path), "level": level,
                   "specd_pp": med(s_runs, "pp"), "llama_pp": med(l_runs, "pp"),
                   "specd_tg": med(s_runs, "tg"), "llama_tg": med(l_runs, "tg"),
                   "specd_widths": {w: medw(s_runs, w) for w in WIDTHS},
                   "llama_widths": {w: medw(l_runs, w) for w in WIDTHS},
                   "rounds": {"specd": s_runs, "llama": l_runs}}
            rows.append(row)
    print(f"\n{a.threads} threads, pp{a.n_prompt}, tg{a.n_gen}, median of {a.rounds} alternated rounds\n")
    print("| file | level | pp specd | pp llama.cpp | pp ratio | tg specd | tg llama.cpp | tg ratio "
          "| widths 2/4/8 specd (steps) | widths 2/4/8 llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        sw = "/".join(f"{r['specd_widths'][w]:.2f}" for w in WIDTHS)
        lw = "/".join(f"{r['llama_widths'][w]:.2f}" for w in WIDTHS)
        print(f"| {r['file']} | {r['level']} | {r['specd_pp']:.1f} | {r['llama_pp']:.1f} | "
              f"**{r['specd_pp'] / r['llama_pp']:.2f}x** | {r['specd_tg']:.1f} | {r['llama_tg']:.1f} | "
              f"**{r['specd_tg'] / r['llama_tg']:.2f}x** | {sw} | {lw} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
