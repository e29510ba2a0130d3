#!/usr/bin/env python3
"""specd vs llama.cpp on the same GGUF file, same threads, same run (→ BENCHMARKS.md).

1. Engine speed: `llama-bench -p N -n N -t T` next to `specd bench --mode speed` (pp and tg tok/s,
   and specd's cost of verification batches by width).
2. Speculation at controlled acceptance: both servers are started with the *same* llama-server
   command line (`specd serve` takes llama-server's flags) — plain, and `--spec-type ngram-mod`
   with `--spec-synth-rates` P_i = a^(i+1) (per-token acceptance a, draft length n) — and each gets
   the same greedy /completion request. The figure is `timings.predicted_per_second`; requests go
   round-robin to plain and speculative servers (`--reps` rounds per row) and each speedup is the
   median over rounds of speculative / plain of the same round, plain first in even rounds and
   second in odd ones. specd's plain figure comes from the speculative server itself, with
   speculation switched off for the request (`"speculative": {"enabled": false}`): two identical
   plain specd servers ran 3 % apart (paired median, 10 rounds) — as large as the effects measured
   here — while llama-server has no per-request switch and keeps its own plain server. specd's synthetic
   drafter drafts the true continuation corrupted so position i is accepted with probability P_i
   (its output stays the plain output);
   llama.cpp's flips a coin per drafted token. specd runs with `--spec-rollback fast` (default)
   and `checkpoint` (llama.cpp's way), to measure the rollback itself, and with `--spec-adaptive`:
   its never-slower controller picks the draft lengths (synthetic acceptance alone drafts n-max
   every round, as llama.cpp does).

Usage: python3 scripts/bench_vs_llamacpp.py -m MODEL.gguf [-t 2] [--n-gen 128]
       [--rates 0,0.25,0.5,0.75,0.9,1] [--lens 4,8,16] [--json out.json]
       (SRV_ERR=/tmp/srv_ in the environment keeps each server's stderr in /tmp/srv_PORT.)
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


class Server:
    """A running server (`binary`: the command, a list) answering greedy /completion requests."""

    def __init__(self, binary, args):
        self.port = free_port()
        cmd = binary + args + ["--port", str(self.port), "--host", "127.0.0.1"]
        err = open(os.environ["SRV_ERR"] + str(self.port), "w") if os.environ.get("SRV_ERR") else subprocess.DEVNULL
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        atexit.register(self.p.kill)
        for _ in range(600):
            if self.p.poll() is not None:
                raise RuntimeError(f"server exited: {' '.join(cmd)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.5)
        raise RuntimeError(f"server did not start: {' '.join(cmd)}")

    def timings(self, n_gen, plain=False):
        body = {"prompt": PROMPT, "n_predict": n_gen, "temperature": 0, "ignore_eos": True,
                "cache_prompt": False, "seed": 1}
        if plain:
            body["speculative"] = {"enabled": False}
        r = post(self.port, "/completion", body)
        return r["timings"], r

    def close(self):
        self.p.kill()
        self.p.wait()


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


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
               "specd fast": ([a.specd, "serve"], ["--spec-rollback", "fast", "--spec-adaptive"]),
               "specd checkpoint": ([a.specd, "serve"], ["--spec-rollback", "checkpoint", "--spec-adaptive"])}
    # llama.cpp's plain server stays up for the whole run; each row starts its speculative
    # servers and then sends requests round-robin — per engine a plain and a speculative request
    # — `reps` times. Every speedup is the median over rounds of (speculative / plain of the same
    # round): this host's speed drifts in bursts of tens of percent, and only a plain figure
    # taken seconds before or after the speculative one, paired round by round, keeps rows that
    # do exactly plain's work at 1.0x.
    llama_plain = Server(engines["llama.cpp"][0], base)
    llama_plain.timings(a.n_gen)
    plain_all = {name: [] for name in engines}
    rows = []
    print("\n| per-token acceptance | n-max | " + " | ".join(f"{e} tok/s (speedup)" for e in engines) + " | specd acc. len |")
    print("|---|---|" + "---|" * len(engines) + "---|")
    for n in [int(x) for x in a.lens.split(",")]:
        for rate in [float(x) for x in a.rates.split(",")]:
            # llama.cpp wants 64 unconditional rates; positions past n-max are never drafted.
            rates = ",".join(f"{rate ** (i + 1) if i < n else 0.0:.6f}" for i in range(64))
            spec = ["--spec-type", "ngram-mod", "--spec-draft-n-max", str(n), "--spec-draft-n-min", "0",
                    "--spec-synth-rates", rates]
            srv = {name: Server(binary, base + extra + spec) for name, (binary, extra) in engines.items()}
            # One unmeasured request per new server: the first one pays for allocations (and
            # specd's synthetic reference run; llama.cpp's n-gram drafter has no history yet).
            for x in srv.values():
                x.timings(a.n_gen)
            tps = {name: [] for name in engines}
            ptps = {name: [] for name in engines}
            ratio = {name: [] for name in engines}
            acc = []
            last = {}
            try:
                for rep in range(a.reps):
                    for name in engines:
                        def plain():
                            if name == "llama.cpp":
                                return llama_plain.timings(a.n_gen)[0]["predicted_per_second"]
                            return srv[name].timings(a.n_gen, plain=True)[0]["predicted_per_second"]
                        if rep % 2 == 0:
                            ptps[name].append(plain())
                        t, resp = srv[name].timings(a.n_gen)
                        if rep % 2 == 1:
                            ptps[name].append(plain())
                        tps[name].append(t["predicted_per_second"])
                        ratio[name].append(t["predicted_per_second"] / ptps[name][-1])
                        last[name] = t
                        if name == "specd fast":
                            al = (resp.get("speculative") or t.get("speculative") or {}).get("acceptance_length")
                            if al is not None:
                                acc.append(al)
            finally:
                for x in srv.values():
                    x.close()
            for name, v in ptps.items():
                plain_all[name].extend(v)
            row = {"rate": rate, "n_max": n}
            cells = []
            for name in engines:
                row[name] = {"tok_s": median(tps[name]), "plain_tok_s": median(ptps[name]),
                             "speedup": median(ratio[name]), "speedups": ratio[name],
                             "draft_n": last[name].get("draft_n"),
                             "draft_n_accepted": last[name].get("draft_n_accepted")}
                cells.append(f"{row[name]['tok_s']:.2f} ({row[name]['speedup']:.2f}×)")
            acc_len = median(acc) if acc else None
            rows.append(row)
            print(f"| {rate} | {n} | " + " | ".join(cells) + f" | {acc_len if acc_len is None else round(acc_len, 2)} |", flush=True)
    llama_plain.close()
    plain = {k: median(v) for k, v in plain_all.items()}
    out["plain"] = plain
    out["synthetic"] = rows
    print("\nplain tok/s: " + ", ".join(f"{k} {v:.2f}" for k, v in plain.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
