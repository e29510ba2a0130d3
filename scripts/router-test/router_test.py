#!/usr/bin/env python3
"""specd workers behind SGLang's model gateway (`smg launch`, pip package sglang-router), on
loopback only. Run through run.sh, which installs the gateway into its own virtual environment.

Starts a generated test model on WORKERS `specd serve` workers and the gateway in front of them
(`--policy manual --assignment-mode min_group`: a conversation's `X-SMG-Routing-Key` keeps it
on one worker), then checks:

 1. discovery: the gateway's `/v1/models` lists the workers' model name;
 2. stickiness: every follow-up turn of several concurrent conversations reuses its whole
    history from the worker's memory (`timings.cache_n` >= the previous turn's prompt but its
    last token);
 3. the gateway's `/get_loads` has every worker's load, `/engine_metrics` every worker's metrics;
 4. a worker killed mid-stream: what the streaming client sees (reported), and under load every
    request still succeeds (failures counted, none may be lost);
 5. the worker restarted on its port is taken back (it serves requests again).

Every wait is bounded; every process started here is stopped on every way out (its whole process
group). Exit status 0 only if every check passed.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

MODEL_NAME = "specd-test"
HOST = "127.0.0.1"


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def call(method, url, body=None, headers=None, timeout=60):
    """(status, body bytes); status None and the error text when the connection fails."""
    u = urllib.parse.urlsplit(url)
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        data = None if body is None else json.dumps(body).encode()
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        c.request(method, u.path + (f"?{u.query}" if u.query else ""), body=data, headers=h)
        r = c.getresponse()
        out = r.read()
        c.close()
        return r.status, out
    except (OSError, http.client.HTTPException) as e:
        return None, f"{type(e).__name__}: {e}".encode()


def get_json(url, timeout=30):
    status, body = call("GET", url, timeout=timeout)
    if status != 200:
        raise Failure(f"GET {url}: {status} {body[:300]!r}")
    return json.loads(body)


def wait_for(what, fn, timeout):
    """Polls fn() until it returns a true value (returned), at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
            last = v
        except Failure as e:
            last = e
        time.sleep(0.2)
    raise Failure(f"timed out after {timeout} s waiting for {what} (last: {last})")


class Procs:
    """Processes started here, each in its own session, stopped with their process group."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = {}

    def start(self, name, argv):
        log = open(os.path.join(self.logdir, f"{name}.log"), "ab")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[name] = p
        return p

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)

    def stop_all(self):
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)

    def log_tail(self, name, n=40):
        try:
            with open(os.path.join(self.logdir, f"{name}.log"), "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return ""


class Cluster:
    def __init__(self, args, procs, model):
        self.args = args
        self.procs = procs
        self.model = model
        self.ports = [free_port() for _ in range(args.workers)]
        self.urls = [f"http://{HOST}:{p}" for p in self.ports]
        self.router_port = free_port()
        self.router = f"http://{HOST}:{self.router_port}"

    def start_worker(self, i):
        a = self.args
        self.procs.start(
            f"worker{i}",
            [a.specd, "serve", "-m", self.model, "--host", HOST, "--port", str(self.ports[i]),
             "-t", "1", "-np", str(a.parallel), "-c", str(a.parallel * 2048), "--metrics",
             "--metrics-strict",
             "-a", MODEL_NAME],
        )
        wait_for(f"worker {i} /health",
                 lambda: call("GET", self.urls[i] + "/health", timeout=5)[0] == 200, 120)

    def start_router(self):
        a = self.args
        self.procs.start(
            "router",
            [a.smg, "launch", "--host", HOST, "--port", str(self.router_port),
             # The gateway's own metrics listener binds every interface unless told.
             "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
             "--worker-urls", *self.urls,
             "--policy", "manual", "--assignment-mode", "min_group",
             "--health-check-interval-secs", "1",
             # A request whose worker is dead is retried (5 attempts in all, ~0.5 s), on the same
             # worker while that worker's circuit breaker is closed: with the default threshold
             # (10 failures) two such requests can use up their attempts before it opens, so it
             # opens after 3 and every request's 4th attempt goes to a live worker. It is tried
             # again after --cb-timeout-duration-secs (default 60 s).
             "--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "5",
             "--log-level", "info"],
        )

    def chat(self, key, messages, max_tokens, extra=None, timeout=60):
        body = {"model": MODEL_NAME, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0}
        body.update(extra or {})
        status, out = call("POST", self.router + "/v1/chat/completions", body,
                           {"X-SMG-Routing-Key": key}, timeout=timeout)
        return status, out


def check_models(c):
    def listed():
        v = get_json(c.router + "/v1/models", timeout=5)
        ids = [m.get("id") for m in v.get("data", [])]
        return ids if MODEL_NAME in ids else None

    ids = wait_for(f"{MODEL_NAME} in the gateway's /v1/models", listed, 90)
    print(f"ok   discovery: gateway /v1/models lists {ids}")


def check_stickiness(c, n_conv, n_turns):
    results = {}

    def converse(i):
        key = f"conversation-{i}"
        msgs = [{"role": "system", "content": "You write short Python snippets."}]
        prev = None
        rows = []
        for t in range(n_turns):
            msgs.append({"role": "user",
                         "content": f"Conversation {i}, turn {t}: print the number {i * 10 + t}."})
            status, out = c.chat(key, msgs, 12)
            if status != 200:
                rows.append((t, None, prev, f"status {status}: {out[:200]!r}"))
                break
            v = json.loads(out)
            tm = v.get("timings")
            if tm is None:
                rows.append((t, None, prev, f"no timings in the gateway's answer: {v}"))
                break
            total = tm["cache_n"] + tm["prompt_n"]
            rows.append((t, tm["cache_n"], prev, None))
            msgs.append({"role": "assistant", "content": v["choices"][0]["message"]["content"]})
            prev = total
        results[i] = rows

    threads = [threading.Thread(target=converse, args=(i,)) for i in range(n_conv)]
    for t in threads:
        t.start()
        # Staggered, a new conversation's first turn meets a worker whose slots keep the
        # others' histories (which the slot choice must leave alone).
        time.sleep(c.args.stagger)
    for t in threads:
        t.join(timeout=300)
    bad = []
    for i in range(n_conv):
        for t, cache_n, prev, err in results.get(i, [(0, None, None, "no result")]):
            if err:
                bad.append(f"conversation {i} turn {t}: {err}")
            # The previous prompt's last token is processed again: the prompt-end checkpoint
            # of the recurrent state sits before it (it made the previous turn's first token).
            elif t > 0 and cache_n < prev - 1:
                bad.append(f"conversation {i} turn {t}: cache_n {cache_n} < history {prev} - 1")
        if len(results.get(i, [])) != n_turns:
            bad.append(f"conversation {i}: {len(results.get(i, []))} of {n_turns} turns")
    if bad:
        raise Failure("stickiness:\n  " + "\n  ".join(bad))
    n = sum(len(r) - 1 for r in results.values())
    print(f"ok   stickiness: {n_conv} concurrent conversations, every one of {n} follow-up "
          f"turns reused its whole history")


def check_loads_and_metrics(c):
    loads = get_json(c.router + "/get_loads")
    # sglang-router 0.3.2 says `workers`; newer gateways `loads`.
    got = {l["worker"]: l["load"] for l in loads.get("workers", loads.get("loads", []))}
    if sorted(got) != sorted(c.urls) or any(v < 0 for v in got.values()):
        raise Failure(f"/get_loads: {loads}")
    print(f"ok   /get_loads: {got}")
    status, text = call("GET", c.router + "/engine_metrics")
    text = text.decode(errors="replace")
    if status != 200:
        raise Failure(f"/engine_metrics: {status} {text[:300]}")
    for url in c.urls:
        needle = f'llamacpp_tokens_predicted_total{{worker_addr="{url}"}}'
        if needle not in text:
            raise Failure(f"/engine_metrics lacks {needle}:\n{text[:2000]}")
    n = sum(1 for l in text.splitlines() if l and not l.startswith("#"))
    print(f"ok   /engine_metrics: {n} samples from {len(c.urls)} workers")


STREAM_TOKENS = 100000


def worker_of_stream(c):
    """The worker running the long stream (a processing slot with its n_predict)."""
    for i, url in enumerate(c.urls):
        status, out = call("GET", url + "/slots", timeout=5)
        if status != 200:
            continue
        for s in json.loads(out):
            if s.get("is_processing") and s.get("params", {}).get("n_predict") == STREAM_TOKENS:
                return i + 1  # 0 is false for wait_for
    return None


def observe_kill_mid_stream(c):
    """Kills the worker that streams an answer; returns what the client saw."""
    u = urllib.parse.urlsplit(c.router)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    body = {"model": MODEL_NAME, "stream": True, "max_tokens": STREAM_TOKENS, "ignore_eos": True,
            "temperature": 0, "messages": [{"role": "user", "content": "Count to a million."}]}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "X-SMG-Routing-Key": "stream"})
    r = conn.getresponse()
    if r.status != 200:
        raise Failure(f"stream: status {r.status} {r.read()[:300]!r}")
    events, ended = 0, None
    line = r.readline()  # the first event: the generation runs
    victim = wait_for("the streaming worker", lambda: worker_of_stream(c), 10) - 1
    c.procs.kill(f"worker{victim}")
    try:
        while line:
            s = line.decode(errors="replace").strip()
            if s.startswith("data:"):
                events += 1
                if s == "data: [DONE]":
                    ended = "a final `data: [DONE]`"
                    break
                if '"error"' in s:
                    ended = f"an error event: {s[:200]}"
                    break
            line = r.readline()
        if ended is None:
            ended = "the stream ending without `data: [DONE]` (no error event)"
    except (OSError, http.client.HTTPException) as e:
        ended = f"a broken connection ({type(e).__name__}: {e})"
    conn.close()
    print(f"note worker {victim} killed mid-stream: after {events} events the client saw {ended}")
    return victim


def load(c, stop, stats, lock, tag):
    """Short chat requests with routing keys until `stop` is set; counts outcomes."""
    n = 0
    while not stop.is_set():
        key = f"{tag}-{n % 4}"
        n += 1
        status, out = c.chat(key, [{"role": "user", "content": f"Say {n}."}], 4)
        time.sleep(0.02)  # paced: the point is requests in flight at the kill, not throughput
        with lock:
            stats["sent"] += 1
            if status == 200:
                stats["ok"] += 1
                stats["last_ok"] = time.monotonic()
            else:
                stats["failed"] += 1
                stats["errors"].append(f"{status}: {out[:160]!r}")


def check_failover(c):
    stop = threading.Event()
    lock = threading.Lock()
    stats = {"sent": 0, "ok": 0, "failed": 0, "errors": [], "last_ok": 0.0}
    threads = [threading.Thread(target=load, args=(c, stop, stats, lock, f"client{i}"))
               for i in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1)
        # Killed while the load's requests are in flight too.
        victim = observe_kill_mid_stream(c)
        time.sleep(c.args.load_secs)
        with lock:
            before = dict(stats)
        if before["ok"] == 0:
            raise Failure(f"no request succeeded with worker {victim} down: {before['errors'][:5]}")
        # Restart it on its port; the gateway's health check takes it back.
        c.start_worker(victim)
        url = c.urls[victim]

        def served():
            # New routing keys go to the worker with the fewest (the restarted one).
            for k in range(4):
                c.chat(f"after-restart-{time.monotonic_ns()}-{k}",
                       [{"role": "user", "content": "Hello."}], 2)
            status, out = call("GET", url + "/metrics", timeout=5)
            if status != 200:
                return None
            for l in out.decode().splitlines():
                if l.startswith("specd:requests_finished_total "):
                    return float(l.split()[1]) > 0
            return None

        t_back = time.monotonic()
        wait_for(f"worker {victim} serving again behind the gateway", served, 60)
        back_secs = time.monotonic() - t_back
        time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    if stats["failed"]:
        raise Failure(f"{stats['failed']} of {stats['sent']} requests failed with a worker down "
                      f"or restarting: {stats['errors'][:5]}")
    print(f"ok   failover: {stats['sent']} requests with worker {victim} killed and restarted, "
          f"0 failed; the restarted worker served again {back_secs:.1f} s after it was up")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specd", required=True, help="the specd binary")
    ap.add_argument("--smg", required=True, help="the gateway's launcher (smg)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4, help="slots per worker (-np)")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--load-secs", type=float, default=6.0)
    ap.add_argument("--stagger", type=float, default=0.01,
                    help="seconds between the conversations' starts: their turns interleave on a worker, which the slot choice must survive (0: all at once)")
    ap.add_argument("--keep-logs", action="store_true")
    args = ap.parse_args()
    if args.workers < 2:
        ap.error("--workers: at least 2 (one is killed)")

    # A signal ends the run through the cleanup below, like any other failure.
    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    tmp = tempfile.mkdtemp(prefix="specd-router-test-")
    procs = Procs(tmp)
    ok = False
    t0 = time.monotonic()
    try:
        model = os.path.join(tmp, "tiny.gguf")
        subprocess.run([args.specd, "make-test-model", "--preset", "qwen35-tiny", "-o", model],
                       check=True, stdout=subprocess.DEVNULL, timeout=300)
        c = Cluster(args, procs, model)
        for i in range(args.workers):
            c.start_worker(i)
        c.start_router()
        check_models(c)
        check_stickiness(c, args.conversations, args.turns)
        check_loads_and_metrics(c)
        check_failover(c)
        ok = True
    except Failure as e:
        print(f"FAIL {e}", file=sys.stderr)
    except subprocess.SubprocessError as e:
        print(f"FAIL {e}", file=sys.stderr)
    finally:
        procs.stop_all()
        if not ok:
            for name in ["router"] + [f"worker{i}" for i in range(args.workers)]:
                tail = procs.log_tail(name)
                if tail:
                    print(f"--- {name} log (last lines) ---\n{tail}", file=sys.stderr)
        if ok and not args.keep_logs:
            for f in os.listdir(tmp):
                os.remove(os.path.join(tmp, f))
            os.rmdir(tmp)
        else:
            print(f"logs in {tmp}", file=sys.stderr)
    print(f"{'PASS' if ok else 'FAIL'} router test ({time.monotonic() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
