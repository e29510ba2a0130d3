#!/usr/bin/env python3
"""Checks specd's llama-quantize mixes (`specd make-test-model --type q4_k_m ...`) against
llama.cpp's own `llama-quantize`, tensor by tensor, and that llama.cpp runs the files specd writes.

For every preset and mix:
  1. `specd make-test-model --preset P --type f16` writes an F16 model;
  2. `llama-quantize --allow-requantize F16.gguf ref.gguf Q4_K_M` quantises it;
  3. `specd make-test-model --preset P --type q4_k_m` writes specd's file directly;
  4. the tensor types (and general.file_type) of 2 and 3 are compared name by name (read with
     gguf-py's GGUFReader).
With --run, every specd-written file is also loaded and run by `llama-simple -n 8 "def"`.

MoE presets (qwen35moe-*, qwen3next-*) check llama-quantize's expert rules too: the tiny ones have 8
experts (llama.cpp's 8-expert attention promotions), the small ones 16.

Mixes without a llama.cpp counterpart (q4_k_xl, specd's own dynamic mix) are only run, not compared.

Usage (llama.cpp built by ../shared/tools/build-llamacpp.sh; needs numpy):
  python3 scripts/check_quant_mix.py [--specd target/release/specd] [--llama ~/.cache/specd-peer/llama.cpp]
      [--presets qwen35-tiny qwen35-small llama-small qwen35moe-tiny qwen35moe-small] [--mixes q4_k_m q5_k_m q6_k iq4_xs] [--mtp] [--run]
Exit status 0 when every compared file matches and every run succeeds.
"""
import argparse
import os
import subprocess
import sys
import tempfile

FTYPE_ARG = {"q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K", "iq4_xs": "IQ4_XS"}


def tensor_types(path):
    from gguf import GGUFReader  # noqa: E402 (needs the path set up in main)

    r = GGUFReader(path)
    types = {t.name: t.tensor_type.name for t in r.tensors}
    ft = r.fields.get("general.file_type")
    file_type = int(ft.parts[ft.data[0]][0]) if ft is not None else None
    return types, file_type


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--specd", default=os.path.join(here, "..", "target", "release", "specd"))
    ap.add_argument("--llama", default=os.path.expanduser("~/.cache/specd-peer/llama.cpp"),
                    help="directory with bin/ and gguf-py/ (build-llamacpp.sh's PEER_DIR)")
    ap.add_argument("--presets", nargs="+", default=["qwen35-tiny", "qwen35-small", "llama-small"])
    ap.add_argument("--mixes", nargs="+", default=["q4_k_m", "q5_k_m", "q6_k", "iq4_xs"])
    ap.add_argument("--styles", nargs="+", default=["varied", "repetitive"],
                    help="weight styles (repetitive = tied embeddings, no output.weight)")
    ap.add_argument("--mtp", action="store_true", help="also check models with an MTP block")
    ap.add_argument("--run", action="store_true", help="run every specd-written file with llama-simple")
    ap.add_argument("--keep", help="directory to keep the files in (default: a temporary one)")
    a = ap.parse_args()

    sys.path.insert(0, os.path.join(a.llama, "gguf-py"))
    quantize = os.path.join(a.llama, "bin", "llama-quantize")
    simple = os.path.join(a.llama, "bin", "llama-simple")
    out = a.keep or tempfile.mkdtemp(prefix="specd-mix-")
    os.makedirs(out, exist_ok=True)

    def make(preset, style, mtp, t, path):
        cmd = [a.specd, "make-test-model", "--preset", preset, "--style", style, "--type", t, "-o", path]
        if mtp:
            cmd.append("--mtp")
        subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)

    failures = 0
    variants = [(p, s, m) for p in a.presets for s in a.styles for m in ([False, True] if a.mtp else [False])
                if not (m and p.startswith("llama"))]
    for preset, style, mtp in variants:
        tag = f"{preset}-{style}" + ("-mtp" if mtp else "")
        f16 = os.path.join(out, f"{tag}-f16.gguf")
        make(preset, style, mtp, "f16", f16)
        for mix in a.mixes:
            mine = os.path.join(out, f"{tag}-{mix}.specd.gguf")
            make(preset, style, mtp, mix, mine)
            if mix in FTYPE_ARG:
                ref = os.path.join(out, f"{tag}-{mix}.llama.gguf")
                r = subprocess.run([quantize, "--allow-requantize", f16, ref, FTYPE_ARG[mix]], errors="replace",
                                   capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"FAIL {tag} {mix}: llama-quantize exited {r.returncode}\n{r.stderr[-2000:]}")
                    failures += 1
                    continue
                want, want_ft = tensor_types(ref)
                got, got_ft = tensor_types(mine)
                diffs = [f"  {n}: llama.cpp {want.get(n)} specd {got.get(n)}"
                         for n in sorted(set(want) | set(got)) if want.get(n) != got.get(n)]
                if want_ft != got_ft:
                    diffs.append(f"  general.file_type: llama.cpp {want_ft} specd {got_ft}")
                counts = {}
                for t in got.values():
                    counts[t] = counts.get(t, 0) + 1
                summary = " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))
                if diffs:
                    failures += 1
                    print(f"FAIL {tag} {mix}: {len(diffs)} differences\n" + "\n".join(diffs))
                else:
                    print(f"ok   {tag} {mix}: {len(got)} tensors match llama-quantize ({summary})")
            if a.run:
                r = subprocess.run([simple, "-m", mine, "-n", "8", "def"], capture_output=True, text=True, errors="replace",
                                   timeout=300)
                if r.returncode != 0:
                    failures += 1
                    print(f"FAIL {tag} {mix}: llama-simple exited {r.returncode}\n{r.stderr[-2000:]}")
                else:
                    text = r.stdout.strip().replace("\n", "\\n")
                    print(f"ok   {tag} {mix}: llama-simple ran: {text[:80]!r}")
    print(f"{failures} failure(s); files in {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
