#!/usr/bin/env python3
"""The engine stays on its side of the backend seam (docs/architecture.md):

* `specd-spec` depends on no backend crate: its direct dependencies are the seam
  (`specd-backend`) and crates that know nothing of the hardware;
* its code names no CPU type, reads no KV row or state buffer and calls no thread pool;
* no function in it is longer than MAX_FN_LINES lines (tests aside): the engine reads like its
  round.

Exits 1 with the offending lines.
"""
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEC = ROOT / "crates" / "specd-spec"
ALLOWED_DEPS = {"specd-backend", "specd-sampling", "specd-tokenizer", "specd-output",
                "thiserror", "serde"}
# CPU-side crates and types, memory internals, thread pools.
FORBIDDEN = re.compile(
    r"\b(specd_models|specd_ops|specd_memory|rayon|Pool|GdnLayerIo|KvLayer|"
    r"kv_append|recurrent_state|gdn_layer|install\s*\()|\bMemory\b(?!\()")
MAX_FN_LINES = 80


def deps_ok():
    manifest = tomllib.loads((SPEC / "Cargo.toml").read_text())
    extra = set(manifest.get("dependencies", {})) - ALLOWED_DEPS
    for d in sorted(extra):
        print(f"crates/specd-spec/Cargo.toml: dependency '{d}' is not allowed on the engine's "
              f"side of the seam")
    return not extra


def code_lines(path):
    """The lines of `path` outside `#[cfg(test)]` modules, with comments blanked."""
    lines = path.read_text().splitlines()
    out, skip_depth, depth, pending_test = [], None, 0, False
    for i, line in enumerate(lines, 1):
        code = re.sub(r"//.*", "", line)
        if "#[cfg(test)]" in code:
            pending_test = True
        opens, closes = code.count("{"), code.count("}")
        if pending_test and opens and skip_depth is None:
            skip_depth, pending_test = depth, False
        depth += opens - closes
        if skip_depth is not None:
            if depth <= skip_depth:
                skip_depth = None
            continue
        out.append((i, code))
    return out


def long_functions(path, lines):
    bad = []
    start = None
    for idx, (i, code) in enumerate(lines):
        m = re.match(r"(\s*)(pub(\([^)]*\))? )?(const )?(unsafe )?fn \w+", code)
        if m and start is None:
            start, indent = i, len(m.group(1))
            continue
        if start is not None and re.match(r"\s{%d}\}\s*$" % indent, code):
            if i - start + 1 > MAX_FN_LINES:
                bad.append(f"{path.relative_to(ROOT)}:{start}: function of {i - start + 1} lines "
                           f"(more than {MAX_FN_LINES})")
            start = None
    return bad


def main():
    ok = deps_ok()
    for path in sorted((SPEC / "src").rglob("*.rs")):
        lines = code_lines(path)
        for i, code in lines:
            if FORBIDDEN.search(code):
                print(f"{path.relative_to(ROOT)}:{i}: names the CPU side of the seam: "
                      f"{code.strip()}")
                ok = False
        for msg in long_functions(path, lines):
            print(msg)
            ok = False
    print("seam check:", "ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
