#!/usr/bin/env bash
# The real coding agents against `specd serve` with the real Qwen3.5 template (llama.cpp's
# models/templates/Qwen3.5-4B.jinja, kept in crates/specd-tokenizer/tests/real_templates/):
# Claude Code 2.1.197 and Codex CLI 0.171.0, installed from npm, each at its default settings
# (no model alias, no flag that turns its tools off) for one non-interactive task that takes
# two turns: the first answers with a shell tool call (`echo hi`, see proxy.py for why it is
# forced), the agent runs it, and the second request carries the call and its result.
# Checked: each agent's exit status and the HTTP exchanges (statuses, the history of the
# second turn, the system / developer messages the agents send), not the model's words.
#
#   scripts/agent-clients/run.sh [SPECD_BIN]
# Environment: AGENTS_DIR (npm prefix, default ~/.cache/specd-agents).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${1:-${SPECD_BIN:-$root/target/debug/specd}}
agents=${AGENTS_DIR:-$HOME/.cache/specd-agents}
template=$root/crates/specd-tokenizer/tests/real_templates/Qwen3.5-4B.jinja
mkdir -p "$agents"
if [[ ! -x $agents/node_modules/.bin/claude || ! -x $agents/node_modules/.bin/codex ]]; then
  command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; }
  (cd "$agents" && npm i --no-audit --no-fund --loglevel=error \
     @anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 >/dev/null)
fi
claude=$agents/node_modules/.bin/claude
codex=$agents/node_modules/.bin/codex
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [[ -n ${AGENT_CLIENTS_KEEP:-} ]]; then echo "kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$bin" make-test-model --preset qwen35-tiny --style repetitive -o "$work/tiny.gguf" >/dev/null
port=$(free_port)
"$bin" serve -m "$work/tiny.gguf" --jinja --chat-template-file "$template" -c 65536 \
  --port "$port" >"$work/specd.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$work/specd.log"; exit 1; }

run_agent() {  # NAME COMMAND...: through a fresh proxy; its exchanges land in $work/NAME.jsonl
  local name=$1; shift
  local pport; pport=$(free_port)
  python3 "$here/proxy.py" "$pport" "$port" "$work/$name.jsonl" &
  local proxy=$!
  pids+=($proxy)
  sleep 0.5
  mkdir -p "$work/$name-home" "$work/$name-cwd"
  local status=0
  (cd "$work/$name-cwd" && HOME=$work/$name-home PORT=$pport timeout 600 "$@" \
     </dev/null >"$work/$name.out" 2>&1) || status=$?
  kill "$proxy" 2>/dev/null || true
  echo "$name: exit $status"
  if [[ $status != 0 ]]; then tail -40 "$work/$name.out"; tail -40 "$work/specd.log"; return 1; fi
}

claude_run() {
  ANTHROPIC_BASE_URL=http://127.0.0.1:$PORT ANTHROPIC_AUTH_TOKEN=x \
    "$claude" -p "Run echo hi in the shell, then say what it printed."
}
codex_run() {
  mkdir -p "$HOME/.codex"
  cat >"$HOME/.codex/config.toml" <<TOML
model = "qwen3.5"
model_provider = "specd"

[model_providers.specd]
name = "specd"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
TOML
  "$codex" exec --skip-git-repo-check "Run echo hi in the shell, then say what it printed."
}
export -f claude_run codex_run
export claude codex
failed=0
run_agent claude bash -c claude_run || failed=1
run_agent codex bash -c codex_run || failed=1
python3 "$here/check.py" "$work/claude.jsonl" "$work/codex.jsonl" || failed=1
exit $failed
