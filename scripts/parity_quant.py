#!/usr/bin/env python3
"""Parity of specd with llama.cpp on files quantised by llama.cpp's own `llama-quantize` (issue 15's bar).

Source models:
  * `specd make-test-model --preset qwen35-small --type f16` (synthetic random weights, hidden 256, so
    every matrix row is a whole number of 256-weight super-blocks),
  * ../shared/models/qwen35-code-target-f32.gguf (trained weights; its GDN `ssm_out` rows are 128 wide,
    so llama-quantize falls back to a 32-block type for those six tensors).
Each is quantised with `llama-quantize SRC OUT TYPE` for TYPE in Q4_K_M, Q6_K, IQ4_XS, Q3_K_M, Q2_K (or `--types ...`). Because the
trained model's IQ4_XS file gets IQ4_NL fallback tensors, it is also quantised a second time with
`--tensor-type ssm_out=q8_0`, so that the IQ4_XS kernels are also measured without the IQ4_NL ones
(the variant was added when specd could not load IQ4_NL; it now runs IQ4_NL natively).

For every quantised file, llama-server and `specd serve` run on the same file side by side (127.0.0.1,
1 thread each, one slot, f32 KV cache, no flash attention on llama.cpp's side), and:
  a. greedy: 64-token greedy continuations of parity.py's four prompts (`/completion` with the prompt as
     llama.cpp's token ids, temperature 0, ignore_eos, cache_prompt false). Reported: the common prefix in
     tokens per prompt; bar: >= 32 on at least 3 of 4 prompts. At the first differing step both engines'
     top-2 log-probabilities are recorded (a near-tie tells rounding from a bug).
  b. teacher-forced: a fixed token sequence (the start of crates/specd-testmodel/corpus/python-stdlib.py.txt,
     tokenised by each engine's /tokenize, which must agree) of POSITIONS+1 tokens; for p = 1..POSITIONS
     each engine is asked for the next-token distribution after the first p tokens (`/completion`,
     n_predict 1, n_probs 5, temperature 0, cache_prompt true, so each request evaluates one new token;
     positions in increasing order). Reported: positions whose top-1 token agrees (bar: >= 99 %), the
     max |Δ logprob| of the top-1 token where both agree, and at each disagreement both engines' top-1/top-2
     margins (in nats).
  Both servers are asked for `post_sampling_probs: false`, i.e. log-probabilities of the full softmax over
  the vocabulary, before any sampler (llama-server's default reports them; `post_sampling_probs: true`
  would report sampler output) — the script checks that every entry carries `logprob`, not `prob`.
  c. the same specd measurements again with `SPECD_NO_AVX512=1` (the AVX2 kernels): greedy ids and
     teacher-forced log-probabilities are compared with the AVX-512 run (the matmul kernels are
     bit-identical across levels; attention, norms and the delta rule are not, so near-ties can flip).

Results go into PARITY.md as the section "## Quantised files (llama-quantize)" (replaced when present,
the rest of the file is kept), and as JSON into WORK/results.json.

Usage: python3 scripts/parity_quant.py [--work /work/qm/parity] [--llama-bin DIR] [--specd PATH]
           [--positions 512] [--tokens 64] [--threads 1] [--out PARITY.md] [--no-avx2] [--only NAME ...]
           [--types TYPE ...]
"""
import argparse, datetime, json, os, re, shutil, subprocess, sys, threading, time, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parity import PROMPTS, llama_steps  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
TRAINED = os.path.normpath(os.path.join(ROOT, "..", "shared", "models", "qwen35-code-target-f32.gguf"))
CORPUS = os.path.join(ROOT, "crates", "specd-testmodel", "corpus", "python-stdlib.py.txt")
TYPES = ["Q4_K_M", "Q6_K", "IQ4_XS", "Q3_K_M", "Q2_K"]
SECTION = "## Quantised files (llama-quantize)"
N_PROBS = 5
SELF_STRIDE = 8
CTX = 2048


def post(url, body, timeout=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Server:
    """A llama-server or `specd serve` process on 127.0.0.1:port; stderr goes to a log file."""

    def __init__(self, name, cmd, port, log, env=None):
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            if self.p.poll() is not None:
                self.log.close()
                raise RuntimeError(f"{name} exited with {self.p.returncode}: see {log}:\n"
                                   + open(log, errors="replace").read()[-2000:])
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{name} did not start (see {log})")

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()

    def tokenize(self, text):
        return post(self.url + "/tokenize", {"content": text, "add_special": True})["tokens"]

    def completion(self, body):
        r = post(self.url + "/completion", body)
        for e in r.get("completion_probabilities", []):
            if "logprob" not in e or any("logprob" not in t for t in e["top_logprobs"]):
                raise RuntimeError(f"{self.name} returned no log-probabilities (post-sampling probs?): {e}")
        return r


def llama_server(bin_dir, model, port, threads, log):
    cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port),
           "-c", str(CTX), "-t", str(threads), "-tb", str(threads), "-ctk", "f32", "-ctv", "f32", "-fa", "off",
           "-np", "1", "--no-warmup"]
    return Server("llama-server", cmd, port, log)


def specd_server(specd, model, port, threads, log, avx2=False):
    env = dict(os.environ)
    env.pop("SPECD_NO_AVX512", None)
    if avx2:
        env["SPECD_NO_AVX512"] = "1"
    cmd = [specd, "serve", "-m", model, "--host", "127.0.0.1", "--port", str(port), "-c", str(CTX),
           "-t", str(threads), "-ctk", "f32", "-ctv", "f32", "--parallel", "1"]
    return Server("specd" + (" (AVX2)" if avx2 else ""), cmd, port, log, env)


def gguf_tokens(path):
    """tokenizer.ggml.tokens of a GGUF file (a minimal metadata reader: gguf-py needs numpy)."""
    import struct
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    with open(path, "rb") as f:
        magic, _version, _n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF", path

        def string():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def skip(t):
            if t == 8:
                string()
            elif t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                if et in sizes:
                    f.seek(sizes[et] * n, 1)
                else:
                    for _ in range(n):
                        skip(et)
            else:
                f.seek(sizes[t], 1)

        for _ in range(n_kv):
            key = string().decode()
            (t,) = struct.unpack("<I", f.read(4))
            if key == "tokenizer.ggml.tokens":
                et, n = struct.unpack("<IQ", f.read(12))
                assert et == 8
                return [string().decode("utf-8") for _ in range(n)]
            skip(t)
    raise RuntimeError(f"{path} has no tokenizer.ggml.tokens")


def incomplete_utf8_tokens(path):
    """Ids of the tokens whose bytes end in an incomplete UTF-8 sequence (byte-level BPE vocabulary).

    llama-server withholds such a token's text and, with n_predict 1, its `completion_probabilities`
    (server's validate_utf8). The teacher-forced requests to llama-server ban them with `logit_bias`:
    the reported `post_sampling_probs: false` log-probabilities are those of the raw logits, before the
    samplers, so they are unchanged (checked: the banned token is still listed with its log-probability),
    while the sampled token, which carries the entry, becomes a complete one."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    out = []
    for i, t in enumerate(gguf_tokens(path)):
        if not all(ch in dec for ch in t):
            continue  # special / control tokens: plain text
        raw = bytes(dec[ch] for ch in t)
        for k in range(1, min(4, len(raw)) + 1):
            c = raw[-k]
            need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 0
            if need and k < need:
                out.append(i)
                break
    return out


# ---------------------------------------------------------------------------------------------- measurements

def greedy(srv, prompt_ids, n):
    r = srv.completion({"prompt": prompt_ids, "n_predict": n, "temperature": 0, "n_probs": 2,
                        "cache_prompt": False, "ignore_eos": True, "return_tokens": True,
                        "post_sampling_probs": False})
    toks = r["tokens"]
    steps = llama_steps(toks, r.get("completion_probabilities", []))
    return {"tokens": toks, "steps": {i: [[t["id"], t["logprob"]] for t in top] for i, top in steps.items()}}


def teacher_forced(srv, seq, positions, out, key, extra=None):
    """out[key] = list over p = 1..positions of the top-N_PROBS [[id, logprob], ...] after seq[:p]."""
    res = []
    try:
        for p in range(1, positions + 1):
            r = srv.completion({"prompt": seq[:p], "n_predict": 1, "temperature": 0, "n_probs": N_PROBS,
                                "cache_prompt": True, "ignore_eos": True, "return_tokens": True,
                                "post_sampling_probs": False, **(extra or {})})
            cp = r.get("completion_probabilities", [])
            res.append([[t["id"], t["logprob"]] for t in cp[0]["top_logprobs"]] if cp else None)
            evaluated = r.get("timings", {}).get("prompt_n")
            if p > 1 and evaluated is not None and evaluated != 1:
                out.setdefault(key + "_recomputed", []).append([p, evaluated])
    except Exception as e:  # reported by the caller
        out[key + "_error"] = repr(e)
    out[key] = res


def both(fa, fb):
    """Runs two callables concurrently (one per server, each on its own core)."""
    ta = threading.Thread(target=fa)
    tb = threading.Thread(target=fb)
    ta.start(); tb.start(); ta.join(); tb.join()


def first_diff(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def margin(top):
    return top[0][1] - top[1][1] if top and len(top) >= 2 else None


def compare_tf(ref, mine):
    """Teacher-forced comparison: ref and mine are lists of top lists (None: no probabilities)."""
    agree, n, max_d, disagreements, missing = 0, 0, 0.0, [], 0
    for p, (a, b) in enumerate(zip(ref, mine), start=1):
        if not a or not b:
            missing += 1
            continue
        n += 1
        if a[0][0] == b[0][0]:
            agree += 1
            max_d = max(max_d, abs(a[0][1] - b[0][1]))
        else:
            la, lb = dict(map(tuple, a)), dict(map(tuple, b))
            disagreements.append({
                "pos": p, "llama_top": a[:3], "specd_top": b[:3],
                "llama_margin": margin(a), "specd_margin": margin(b),
                # how far each engine puts the other's choice below its own (None: outside its top-N_PROBS)
                "llama_gap_to_specd_top1": a[0][1] - la[b[0][0]] if b[0][0] in la else None,
                "specd_gap_to_llama_top1": b[0][1] - lb[a[0][0]] if a[0][0] in lb else None})
    return {"agree": agree, "n": n, "missing": missing, "max_dlogprob_agree": max_d, "disagreements": disagreements}


def compare_levels(g512, g2, tf512, tf2):
    """AVX-512 vs AVX2 specd: greedy ids, teacher-forced top-1 ids and the max |Δ logprob| of all reported."""
    greedy_same = all(g512[k]["tokens"] == g2[k]["tokens"] for k in range(len(g512)))
    top1_same, max_d = True, 0.0
    for a, b in zip(tf512, tf2):
        if not a or not b:
            continue
        top1_same &= a[0][0] == b[0][0]
        lb = dict(map(tuple, b))
        for t, lp in a:
            if t in lb:
                max_d = max(max_d, abs(lp - lb[t]))
    return {"greedy_ids_identical": greedy_same, "tf_top1_identical": top1_same, "max_dlogprob": max_d,
            "tf_n": min(len(tf512), len(tf2))}


# ---------------------------------------------------------------------------------------------- models

def make_models(a):
    """Returns [(model name, type label, path or None, quantize command, note)]."""
    os.makedirs(a.work, exist_ok=True)
    q = os.path.join(a.llama_bin, "llama-quantize")
    sources = []
    small = os.path.join(a.work, "qwen35-small-f16.gguf")
    if not os.path.exists(small):
        subprocess.check_call([a.specd, "make-test-model", "--preset", "qwen35-small", "--type", "f16", "-o", small],
                              stderr=subprocess.DEVNULL)
    sources.append(("qwen35-small (synthetic, f16 source)", "qwen35-small", small))
    if os.path.exists(TRAINED):
        sources.append(("qwen35-code-target (trained, f32 source)", "qwen35-code-target", TRAINED))
    else:
        print(f"skipping the trained model: {TRAINED} not found", file=sys.stderr)
    out = []
    for label, stem, src in sources:
        variants = [(t, t, []) for t in a.types]
        if stem == "qwen35-code-target" and "IQ4_XS" in a.types:
            variants.append(("IQ4_XS, ssm_out=q8_0", "IQ4_XS", ["--tensor-type", "ssm_out=q8_0"]))
        for tlabel, t, extra in variants:
            name = f"{stem}-{t}" + ("-ssmq8" if extra else "") + ".gguf"
            path = os.path.join(a.work, name)
            cmd = [q, *extra, src, path, t, "2"]
            log = path + ".quantize.log"
            if not os.path.exists(path):
                with open(log, "w") as f:
                    subprocess.check_call(cmd, stdout=f, stderr=subprocess.STDOUT)
            types = {}
            if os.path.exists(log):
                for m in re.finditer(r"converting to (\w+)", open(log).read()):
                    types[m.group(1)] = types.get(m.group(1), 0) + 1
            out.append((label, tlabel, path, " ".join(["llama-quantize", *extra, os.path.basename(src), name, t]),
                        types))
    return out


# ---------------------------------------------------------------------------------------------- main

def run_file(a, path, seq_text):
    res = {"file": path}
    base = os.path.splitext(path)[0]
    lsrv = llama_server(a.llama_bin, path, a.port, a.threads, base + ".llama-server.log")
    try:
        try:
            ssrv = specd_server(a.specd, path, a.port + 1, a.threads, base + ".specd.log")
        except RuntimeError as e:
            res["specd_error"] = next((l for l in str(e).splitlines()[1:] if "error" in l.lower()),
                                      str(e).splitlines()[0]).replace(os.path.dirname(path) + "/", "")
            return res
        try:
            # tokenization: prompts and the teacher-forced text must tokenise identically
            lp = [lsrv.tokenize(p) for p in PROMPTS]
            sp = [ssrv.tokenize(p) for p in PROMPTS]
            lseq, sseq = lsrv.tokenize(seq_text), ssrv.tokenize(seq_text)
            res["tokenization_same"] = lp == sp and lseq == sseq
            if len(lseq) < a.positions + 1:
                raise RuntimeError(f"teacher-forced text gives {len(lseq)} tokens, need {a.positions + 1}")
            seq = lseq[:a.positions + 1]
            g = {}
            both(lambda: g.__setitem__("llama", [greedy(lsrv, ids, a.tokens) for ids in lp]),
                 lambda: g.__setitem__("specd", [greedy(ssrv, ids, a.tokens) for ids in lp]))
            tf = {}
            ban = {"logit_bias": [[t, False] for t in incomplete_utf8_tokens(path)]}
            both(lambda: teacher_forced(lsrv, seq, a.positions, tf, "llama", ban),
                 lambda: teacher_forced(ssrv, seq, a.positions, tf, "specd"))
            # llama.cpp against itself: the whole prompt in one batch (cache_prompt false) instead of one
            # token at a time, every SELF_STRIDE-th position — the spread its own code paths give.
            selfp = list(range(SELF_STRIDE, a.positions + 1, SELF_STRIDE))
            tf["llama_batch"] = []
            for p in selfp:
                r = lsrv.completion({"prompt": seq[:p], "n_predict": 1, "temperature": 0, "n_probs": N_PROBS,
                                     "cache_prompt": False, "return_tokens": True, "post_sampling_probs": False,
                                     **ban})
                cp = r.get("completion_probabilities", [])
                tf["llama_batch"].append([[t["id"], t["logprob"]] for t in cp[0]["top_logprobs"]] if cp else None)
            res["llama_self"] = compare_tf([tf["llama"][p - 1] for p in selfp], tf["llama_batch"])
            res["llama_self"]["positions"] = selfp
            res["specd_sub"] = compare_tf([tf["llama"][p - 1] for p in selfp], [tf["specd"][p - 1] for p in selfp])
        finally:
            ssrv.stop()
        if not a.no_avx2:
            ssrv = specd_server(a.specd, path, a.port + 1, a.threads, base + ".specd-avx2.log", avx2=True)
            try:
                g["specd_avx2"] = [greedy(ssrv, ids, a.tokens) for ids in lp]
                teacher_forced(ssrv, seq, a.positions, tf, "specd_avx2")
            finally:
                ssrv.stop()
    finally:
        lsrv.stop()
    for k in list(tf):
        if k.endswith("_error") or k.endswith("_recomputed"):
            res[k] = tf[k]
    res["greedy"] = []
    for i in range(len(PROMPTS)):
        lt, st = g["llama"][i]["tokens"], g["specd"][i]["tokens"]
        d = first_diff(lt, st)
        row = {"prompt": i, "prompt_tokens": len(lp[i]), "common": d, "n": len(lt)}
        if d < min(len(lt), len(st)):
            ls, ss = g["llama"][i]["steps"].get(d), g["specd"][i]["steps"].get(d)
            row.update({"llama_top": ls, "specd_top": ss, "llama_margin": margin(ls), "specd_margin": margin(ss)})
        res["greedy"].append(row)
    res["teacher_forced"] = compare_tf(tf["llama"], tf["specd"])
    if "specd_avx2" in g:
        res["avx2_vs_avx512"] = compare_levels(g["specd"], g["specd_avx2"], tf["specd"], tf["specd_avx2"])
        res["teacher_forced_avx2"] = {k: v for k, v in compare_tf(tf["llama"], tf["specd_avx2"]).items()
                                      if k != "disagreements"}
    res["raw"] = {"greedy": g, "teacher_forced": tf, "sequence": seq}
    return res


def fmt_top(top):
    return ", ".join(f"{t}:{lp:.3f}" for t, lp in (top or [])[:2])


def render(a, files, results, cmdline):
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")
    vnni = "avx512_vnni" in flags.split()
    version = subprocess.run([os.path.join(a.llama_bin, "llama-server"), "--version"], capture_output=True,
                             text=True).stderr.strip().splitlines()
    L = [SECTION, "",
         f"Command: `{cmdline}` — {datetime.date.today().isoformat()}, CPU: {cpu} "
         f"(AVX-512 VNNI {'present' if vnni else 'absent'}; specd picks AVX-512 VNNI kernels on it unless "
         "`SPECD_NO_AVX512=1`), llama.cpp " + "; ".join(version) + ".", "",
         "* Files: each source quantised by llama.cpp's own `llama-quantize SRC OUT TYPE` (no imatrix). The "
         "synthetic model is `specd make-test-model --preset qwen35-small --type f16` (random weights, hidden 256); "
         "the trained one is `../shared/models/qwen35-code-target-f32.gguf` (its GDN `ssm_out` rows are 128 wide, "
         "so llama-quantize falls back to q5_0 / q8_0 / iq4_nl for those 6 tensors).",
         f"* Both engines on the same file at once, {a.threads} thread each, one slot, f32 KV cache: "
         f"`llama-server -c {CTX} -t {a.threads} -ctk f32 -ctv f32 -fa off -np 1 --no-warmup` and "
         f"`specd serve -c {CTX} -t {a.threads} -ctk f32 -ctv f32 --parallel 1`, both queried through "
         "`/tokenize` and `/completion` with `post_sampling_probs: false` (log-probabilities of the full softmax).",
         f"* greedy: common prefix (tokens) of the {a.tokens}-token greedy continuations of parity.py's 4 prompts "
         "(prompt as token ids, temperature 0, ignore_eos); bar ≥ 32 on ≥ 3 of 4 prompts. At a divergence "
         "both engines' top-1/top-2 margin (nats) at the first differing step is listed.",
         f"* teacher-forced: the first {a.positions + 1} tokens of `crates/specd-testmodel/corpus/python-stdlib.py.txt` "
         f"(identical tokenization on both checked); for p = 1..{a.positions} the next-token distribution after "
         "the first p tokens (`n_predict 1, n_probs 5, cache_prompt true`, one new token evaluated per request); "
         "agreement = positions whose top-1 token is the same (bar ≥ 99 %); Δ = max |top-1 logprob difference| "
         "where they agree; at disagreements, each engine's top-1 minus top-2 logprob.",
         f"* llama.cpp vs itself: at every {SELF_STRIDE}th teacher-forced position llama-server is asked again "
         "with `cache_prompt: false` (the whole prefix in one batch instead of one token at a time); its top-1 "
         "agreement with its own incremental answers and the max |Δ top-1 logprob| show how far llama.cpp's own "
         "code paths spread on the file (activations are rounded to 8 bits before every quantised matrix product, "
         "so a last-bit difference upstream can move a rounding step); specd's numbers on the same positions are "
         "given beside them. specd itself gives the same logprobs both ways (batch-invariant kernels).",
         "* AVX2: specd rerun with `SPECD_NO_AVX512=1`; compared with its AVX-512 run (greedy ids, teacher-forced "
         "top-1 and every reported logprob).", "",
         "| model | type | tensor types (llama-quantize) | greedy common prefix (per prompt) | prompts ≥ 32 | "
         "teacher-forced top-1 agreement | max Δ logprob (agree) | llama.cpp vs itself | pass | notes |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    all_ok, avx_lines, detail = True, [], []
    for (label, tlabel, path, qcmd, types), r in zip(files, results):
        tt = ", ".join(f"{k}×{v}" for k, v in sorted(types.items(), key=lambda kv: -kv[1]))
        if "specd_error" in r:
            all_ok = False
            L.append(f"| {label} | {tlabel} | {tt} | — | — | — | — | — | NO | specd does not load the file: "
                     f"`{r['specd_error'].strip()[-160:]}` |")
            continue
        gr = r["greedy"]
        pref = " / ".join(f"{x['common']}" for x in gr)
        n32 = sum(x["common"] >= min(32, x["n"]) for x in gr)
        tf = r["teacher_forced"]
        frac = tf["agree"] / max(tf["n"], 1)
        ok = n32 >= 3 and frac >= 0.99 and tf["n"] == a.positions and r.get("tokenization_same", False)
        all_ok &= ok
        notes = []
        if not r.get("tokenization_same", True):
            notes.append("TOKENIZATION DIFFERS")
        if tf["missing"]:
            notes.append(f"{tf['missing']} positions without probabilities")
        for k in ("llama_error", "specd_error", "specd_avx2_error"):
            if k in r:
                notes.append(f"{k}: {r[k][:80]}")
        for k in ("llama_recomputed", "specd_recomputed"):
            if k in r:
                notes.append(f"{k.split('_')[0]} re-evaluated more than 1 token at {len(r[k])} positions")
        for x in gr:
            if x["common"] < x["n"]:
                notes.append(f"p{x['prompt']} diverges at {x['common']}: margins llama {x['llama_margin']:.3g}, "
                             f"specd {x['specd_margin']:.3g}" if x.get("llama_margin") is not None
                             and x.get("specd_margin") is not None else f"p{x['prompt']} diverges at {x['common']}")
        if tf["disagreements"]:
            ms = [max(d["llama_margin"] or 0, d["specd_margin"] or 0) for d in tf["disagreements"]]
            notes.append(f"tf disagreements at {', '.join(str(d['pos']) for d in tf['disagreements'][:8])}"
                         f"{'…' if len(ms) > 8 else ''}; larger top1-top2 margin there: min {min(ms):.2g}, "
                         f"max {max(ms):.2g}")
        ls_, sp_ = r.get("llama_self"), r.get("specd_sub")
        selfcol = (f"{ls_['agree']}/{ls_['n']}, Δ {ls_['max_dlogprob_agree']:.1e} (specd on the same positions: "
                   f"{sp_['agree']}/{sp_['n']}, Δ {sp_['max_dlogprob_agree']:.1e})") if ls_ else "—"
        L.append(f"| {label} | {tlabel} | {tt} | {pref} | {n32}/4 | {tf['agree']}/{tf['n']} ({100 * frac:.1f} %) | "
                 f"{tf['max_dlogprob_agree']:.1e} | {selfcol} | {'yes' if ok else 'NO'} | {'; '.join(notes)} |")
        for d in tf["disagreements"]:
            detail.append(f"| {label} | {tlabel} | {d['pos']} | {fmt_top(d['llama_top'])} | {fmt_top(d['specd_top'])} |")
        if "avx2_vs_avx512" in r:
            c, t2 = r["avx2_vs_avx512"], r["teacher_forced_avx2"]
            avx_lines.append(
                f"| {label} | {tlabel} | {'yes' if c['greedy_ids_identical'] else 'NO'} | "
                f"{'yes' if c['tf_top1_identical'] else 'NO'} | {c['max_dlogprob']:.1e} | "
                f"{t2['agree']}/{t2['n']} |")
    L += ["", "Result: " + ("every file meets the bar." if all_ok else "NOT every file meets the bar (see rows).")]
    ok_r = [r for r in results if "teacher_forced" in r]
    if ok_r:
        dis = [max(d["llama_margin"] or 0, d["specd_margin"] or 0) for r in ok_r for d in r["teacher_forced"]["disagreements"]]
        agree_d = max(r["teacher_forced"]["max_dlogprob_agree"] for r in ok_r)
        self_d = max((r["llama_self"]["max_dlogprob_agree"] for r in ok_r if "llama_self" in r), default=float("nan"))
        self_a = sum(r["llama_self"]["agree"] for r in ok_r if "llama_self" in r)
        self_n = sum(r["llama_self"]["n"] for r in ok_r if "llama_self" in r)
        L += ["", f"Size of the differences: the largest top-1/top-2 margin (the larger of the two engines') at any "
              f"teacher-forced disagreement is {max(dis, default=0):.3f} nats; the largest |Δ top-1 logprob| at agreeing "
              f"positions is {agree_d:.3f}; llama.cpp against itself (batch vs one token at a time) differs by up to "
              f"{self_d:.3f} and agrees on {self_a}/{self_n} sampled positions. Disagreements "
              + ("all sit inside that spread (near-ties), none at a clear margin." if max(dis, default=0) <= max(agree_d, self_d)
                 else "include margins beyond that spread: look at the detail table.")]
    if avx_lines:
        same = sum(r["avx2_vs_avx512"]["greedy_ids_identical"] for r in results if "avx2_vs_avx512" in r)
        L += ["", f"AVX2 vs AVX-512: greedy ids identical on {same}/{len(avx_lines)} files; "
              + ("the runs are bit-identical." if all(r["avx2_vs_avx512"]["max_dlogprob"] == 0 for r in results
                                                    if "avx2_vs_avx512" in r)
                 else "the runs are not bit-identical end to end (see the AVX2 table).")]
    if detail:
        L += ["", "Teacher-forced disagreements (token id:logprob of each engine's top-2):", "",
              "| model | type | position | llama.cpp | specd |", "|---|---|---|---|---|", *detail]
    if avx_lines:
        L += ["", "specd at the AVX2 level (`SPECD_NO_AVX512=1`) against its AVX-512 VNNI run:", "",
              "| model | type | greedy ids identical (4 prompts) | teacher-forced top-1 identical | "
              "max Δ logprob (all reported tokens) | AVX2 agreement with llama.cpp |", "|---|---|---|---|---|---|",
              *avx_lines]
    return L, all_ok


def write_section(out, lines):
    text = open(out).read() if os.path.exists(out) else ""
    start = text.find("\n" + SECTION + "\n")
    new = "\n".join(lines) + "\n"
    if start < 0 and text.startswith(SECTION + "\n"):
        start = -1
        rest = text[len(SECTION) + 1:]
    elif start < 0:
        with open(out, "w") as f:
            f.write(text.rstrip("\n") + ("\n\n" if text else "") + new)
        return
    else:
        rest = text[start + 1 + len(SECTION) + 1:]
    m = re.search(r"^## ", rest, re.M)
    tail = rest[m.start():] if m else ""
    head = text[:start + 1] if start >= 0 else ""
    with open(out, "w") as f:
        f.write(head + new + ("\n" + tail if tail else ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bin", default=os.path.expanduser("~/.cache/specd-peer/llama.cpp/bin"))
    ap.add_argument("--specd", default=os.path.join(ROOT, "target", "release", "specd"))
    ap.add_argument("--work", default="/work/qm/parity")
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--port", type=int, default=18291, help="llama-server's port; specd gets the next one")
    ap.add_argument("--out", default=os.path.join(ROOT, "PARITY.md"))
    ap.add_argument("--no-avx2", action="store_true", help="skip the SPECD_NO_AVX512=1 rerun")
    ap.add_argument("--types", nargs="*", default=TYPES,
                    help="llama-quantize types to measure (Q4_1, Q5_0, Q5_1 are measured with --types Q4_1 Q5_0 Q5_1)")
    ap.add_argument("--only", nargs="*", help="only files whose name contains one of these")
    ap.add_argument("--no-write", action="store_true", help="do not touch PARITY.md")
    a = ap.parse_args()
    cmdline = "python3 scripts/parity_quant.py" + "".join(
        f" {x}" for x in sys.argv[1:])
    if not os.path.exists(os.path.join(a.llama_bin, "llama-server")):
        sys.exit(f"llama.cpp not found in {a.llama_bin}")
    if not os.path.exists(a.specd):
        sys.exit(f"{a.specd} not found: build specd (`cargo build --release -p specd`)")
    os.makedirs(a.work, exist_ok=True)
    # A private copy: a concurrent `cargo build` may replace target/release/specd while it links.
    a.specd = shutil.copy2(a.specd, os.path.join(a.work, "specd"))
    seq_text = open(CORPUS, encoding="utf-8").read()[:12000]
    files = make_models(a)
    if a.only:
        files = [f for f in files if any(o in os.path.basename(f[2]) for o in a.only)]
    results = []
    for f in files:
        t0 = time.time()
        print(f"== {os.path.basename(f[2])}", flush=True)
        r = run_file(a, f[2], seq_text)
        results.append(r)
        summary = {k: v for k, v in r.items() if k != "raw"}
        if "teacher_forced" in summary:
            summary["teacher_forced"] = {k: v for k, v in summary["teacher_forced"].items() if k != "disagreements"}
            summary["tf_disagreements"] = len(r["teacher_forced"]["disagreements"])
        print(json.dumps(summary), f"({time.time() - t0:.0f} s)", flush=True)
    with open(os.path.join(a.work, "results.json"), "w") as fh:
        json.dump([{"name": f[0], "type": f[1], "quantize": f[3], "tensor_types": f[4], **r}
                   for f, r in zip(files, results)], fh)
    lines, ok = render(a, files, results, cmdline)
    print("\n".join(lines))
    if not a.no_write:
        write_section(a.out, lines)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
