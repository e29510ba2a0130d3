#!/usr/bin/env python3
"""specd vs llama.cpp on the same GGUF file, same threads, same run (→ BENCHMARKS.md).

1. Engine speed: `llama-bench -p N -n N -t T` next to `specd bench --mode speed` (pp and tg tok/s,
   and specd's cost of verification batches by width).
2. Speculation at controlled acceptance: both servers are started with the *same* llama-server
   command line (`specd serve` takes llama-server's flags) — plain, and `--spec-type ngram-mod`
   with `--spec-synth-rates` P_i = a^(i+1) (per-token acceptance a, draft length n) — and each gets
   the same greedy /completion request. The figure is `timings.predicted_per_second`; the speedup
   is over the same engine's plain run, measured again right before each row. specd's synthetic
   drafter drafts the true continuation corrupted so position i is accepted with probability P_i
   (its output stays the plain output);
   llama.cpp's flips a coin per drafted token. specd runs with `--spec-rollback fast` (default)
   and `checkpoint` (llama.cpp's way), to measure the rollback itself.

Usage: python3 scripts/bench_vs_llamacpp.py -m MODEL.gguf [-t 2] [--n-gen 128]
       [--rates 0,0.25,0.5,0.75,0.9,1] [--lens 4,8,16] [--json out.json]
"""
import argparse, atexit, json, os, socket, subprocess, sys, time, urllib.request

PROMPT = "def quicksort(items):\n    \"\"\"Sort a list in place.\"\"\"\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def run_server(binary, args, n_gen, reps):
    """Starts a server (`binary`: the command, a list), sends `reps` identical greedy requests,
    returns the timings of the fastest."""
    port = free_port()
    cmd = binary + args + ["--port", str(port), "--host", "127.0.0.1"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    atexit.register(p.kill)
    try:
        for _ in range(600):
            if p.poll() is not None:
                raise RuntimeError(f"server exited: {' '.join(cmd)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"server did not start: {' '.join(cmd)}")
        best = None
        for _ in range(reps):
            r = post(port, "/completion", {"prompt": PROMPT, "n_predict": n_gen, "temperature": 0,
                                           "ignore_eos": True, "cache_prompt": False, "seed": 1})
            t = r["timings"]
            if best is None or t["predicted_per_second"] > best["predicted_per_second"]:
                best = t
        return best
    finally:
        p.kill()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--n-prompt", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--rates", default="0,0.25,0.5,0.75,0.9,1")
    ap.add_argument("--lens", default="4,8,16")
    ap.add_argument("--llama-bin", default=os.path.expanduser("~/.cache/specd-peer/llama.cpp/bin"))
    ap.add_argument("--specd", default="target/release/specd")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {"model": a.model, "threads": a.threads, "n_gen": a.n_gen}

    if not a.skip_speed:
        lb = subprocess.run([f"{a.llama_bin}/llama-bench", "-m", a.model, "-t", str(a.threads), "-p", str(a.n_prompt),
                             "-n", str(a.n_gen), "-r", "3", "-o", "json"], capture_output=True, text=True, check=True)
        rows = json.loads(lb.stdout)
        llama = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}
        sb = subprocess.run([a.specd, "bench", "--mode", "speed", "-m", a.model, "-t", str(a.threads), "--n-prompt",
                             str(a.n_prompt), "-n", str(a.n_gen), "-r", "3", "--json"], capture_output=True, text=True, check=True)
        sp = json.loads(sb.stdout)["speed"]
        out["speed"] = {"llama": llama, "specd": {"pp": sp["pp_tok_s"], "tg": sp["tg_tok_s"]},
                        "specd_verify_ms_by_width": sp["verify_ms_by_width"]}
        print(f"\n| test | llama.cpp tok/s | specd tok/s | specd / llama.cpp |\n|---|---|---|---|")
        for k, n in (("pp", a.n_prompt), ("tg", a.n_gen)):
            print(f"| {k}{n} | {llama[k]:.2f} | {out['speed']['specd'][k]:.2f} | {out['speed']['specd'][k] / llama[k]:.2f} |")
        print("\nspecd verification batch cost by width (ms):", sp["verify_ms_by_width"])

    base = ["-m", a.model, "-t", str(a.threads), "-c", "2048", "-np", "1", "--no-warmup"]
    engines = {"llama.cpp": ([f"{a.llama_bin}/llama-server"], []),
               "specd fast": ([a.specd, "serve"], ["--spec-rollback", "fast"]),
               "specd checkpoint": ([a.specd, "serve"], ["--spec-rollback", "checkpoint"])}
    plain = {}
    for name, (binary, extra) in engines.items():
        if name == "specd checkpoint":
            plain[name] = plain["specd fast"]
            continue
        plain[name] = run_server(binary, base + extra, a.n_gen, a.reps)["predicted_per_second"]
    out["plain"] = plain
    rows = []
    print("\n| per-token acceptance | n-max | " + " | ".join(f"{e} tok/s (speedup)" for e in engines) + " | specd acc. len |")
    print("|---|---|" + "---|" * len(engines) + "---|")
    for n in [int(x) for x in a.lens.split(",")]:
        for rate in [float(x) for x in a.rates.split(",")]:
            # llama.cpp wants 64 unconditional rates; positions past n-max are never drafted.
            rates = ",".join(f"{rate ** (i + 1) if i < n else 0.0:.6f}" for i in range(64))
            spec = ["--spec-type", "ngram-mod", "--spec-draft-n-max", str(n), "--spec-draft-n-min", "0",
                    "--spec-synth-rates", rates]
            row = {"rate": rate, "n_max": n}
            cells = []
            acc_len = None
            row_plain = {}
            for name, (binary, extra) in engines.items():
                # Plain decoding is measured again next to each row (and the row's speedups are
                # over that): this host's speed drifts in bursts, and a plain figure taken minutes
                # earlier made rows that drafted nothing read 0.75x or 1.3x.
                if name == "specd checkpoint":
                    row_plain[name] = row_plain["specd fast"]
                else:
                    row_plain[name] = run_server(binary, base + extra, a.n_gen, a.reps)["predicted_per_second"]
                t = run_server(binary, base + extra + spec, a.n_gen, a.reps)
                tps = t["predicted_per_second"]
                row[name] = {"tok_s": tps, "plain_tok_s": row_plain[name], "speedup": tps / row_plain[name],
                             "draft_n": t.get("draft_n"), "draft_n_accepted": t.get("draft_n_accepted")}
                if name == "specd fast":
                    acc_len = (t.get("speculative") or {}).get("acceptance_length")
                cells.append(f"{tps:.2f} ({tps / row_plain[name]:.2f}×)")
            rows.append(row)
            print(f"| {rate} | {n} | " + " | ".join(cells) + f" | {acc_len if acc_len is None else round(acc_len, 2)} |", flush=True)
    out["synthetic"] = rows
    print("\nplain tok/s: " + ", ".join(f"{k} {v:.2f}" for k, v in plain.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
