#!/usr/bin/env bash
# Builds specd, serves the built-in demo model, runs scripts/openai_client_test.py (the official
# `openai` Python client: chat, streamed chat, json_schema) against it, and stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PORT:-8765}"
cargo build -p specd
BIN="target/debug/specd"
LOG="$(mktemp)"
"$BIN" serve --port "$PORT" -c 2048 -np 2 --alias specd-demo >"$LOG" 2>&1 &
PID=$!
cleanup() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -f "$LOG"; }
trap cleanup EXIT
for _ in $(seq 1 600); do
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$PID" 2>/dev/null; then cat "$LOG"; echo "server exited" >&2; exit 1; fi
  sleep 0.5
done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { cat "$LOG"; echo "server did not start" >&2; exit 1; }
python3 scripts/openai_client_test.py --base-url "http://127.0.0.1:$PORT/v1" --model specd-demo
