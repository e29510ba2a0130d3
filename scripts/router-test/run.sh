#!/usr/bin/env bash
# specd workers behind SGLang's model gateway (sglang-router), end to end: installs the gateway
# with pip into its own virtual environment, then runs router_test.py (see there).
#
#   scripts/router-test/run.sh [router_test.py flags]
#
# SPECD_BIN: the specd binary (default: $CARGO_TARGET_DIR or target, debug profile).
# ROUTER_VENV: where the virtual environment lives (default: ~/.cache/specd-router-test/venv;
# kept between runs, so only the first run downloads).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# The version this script was written against: its CLI (`smg launch`) and the worker endpoints
# it reads.
version="0.3.2"
venv="${ROUTER_VENV:-$HOME/.cache/specd-router-test/venv}"
bin="${SPECD_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/specd}"
if [ ! -x "$bin" ]; then
    echo "router-test: no specd binary at $bin (cargo build --bin specd, or set SPECD_BIN)" >&2
    exit 1
fi
if ! "$venv/bin/python" -c "import sglang_router" 2>/dev/null \
    || [ "$("$venv/bin/python" -m pip show sglang-router 2>/dev/null | sed -n 's/^Version: //p')" != "$version" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "sglang-router==$version"
fi
if [ ! -x "$venv/bin/smg" ]; then
    echo "router-test: sglang-router $version installed no smg launcher in $venv/bin" >&2
    exit 1
fi
exec "$venv/bin/python" "$here/router_test.py" --specd "$bin" --smg "$venv/bin/smg" "$@"
