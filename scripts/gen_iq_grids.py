#!/usr/bin/env python3
"""Writes `crates/specd-gguf/src/iq_grids.rs`: the lattice tables of ggml's IQ1/IQ2/IQ3 formats.

The tables are format data (a file's grid indices mean nothing without them), so they are taken
verbatim, value for value, from ggml's `ggml-common.h` rather than re-derived; the fixtures of
`tests/quant_fixtures.rs` then check every decoder that uses them against gguf-py, whose copies
of the grids are packed differently (2 or 3 bits per coordinate), bit for bit.

Usage: python3 scripts/gen_iq_grids.py PATH/TO/ggml/src/ggml-common.h
"""
import os
import re
import sys

TABLES = [
    # (ggml name, Rust name, element type, length, what it is)
    ("ksigns_iq2xs", "KSIGNS_IQ2XS", "u8", 128,
     "7 sign bits → 8 sign bits with even parity (bit 7 makes the count of minus signs even)."),
    ("iq2xxs_grid", "IQ2XXS_GRID", "u64", 256, "IQ2_XXS: 256 points of the E8 lattice, 8 bytes each."),
    ("iq2xs_grid", "IQ2XS_GRID", "u64", 512, "IQ2_XS: 512 E8 lattice points, 8 bytes each."),
    ("iq2s_grid", "IQ2S_GRID", "u64", 1024, "IQ2_S: 1024 E8 lattice points, 8 bytes each."),
    ("iq3xxs_grid", "IQ3XXS_GRID", "u32", 256, "IQ3_XXS: 256 D4 lattice points, 4 bytes each."),
    ("iq3s_grid", "IQ3S_GRID", "u32", 512, "IQ3_S: 512 D4 lattice points, 4 bytes each."),
    ("iq1s_grid", "IQ1S_GRID", "u64", 2048,
     "IQ1_S / IQ1_M: 2048 points with coordinates in {-1, 0, 1}, 8 signed bytes each."),
]

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "specd-gguf", "src", "iq_grids.rs")


def main():
    src = open(sys.argv[1]).read()
    out = [
        "//! Lattice and sign tables of ggml's IQ1 / IQ2 / IQ3 formats, value for value from ggml's",
        "//! `ggml-common.h` (written by `scripts/gen_iq_grids.py`; do not edit by hand). Entry `k` of a",
        "//! grid is read as its little-endian bytes: byte `j` is coordinate `j` of lattice point `k`.",
        "",
    ]
    for cname, rname, ty, n, doc in TABLES:
        m = re.search(r"GGML_TABLE_BEGIN\(\w+, " + cname + r", \w+\)(.*?)GGML_TABLE_END\(\)", src, re.S)
        if not m:
            sys.exit(f"{cname} not found")
        vals = [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", m.group(1))]
        if len(vals) != n:
            sys.exit(f"{cname}: {len(vals)} values, expected {n}")
        per = {"u8": 16, "u32": 6, "u64": 4}[ty]
        fmt = {"u8": "{:3d}", "u32": "0x{:08x}", "u64": "0x{:016x}"}[ty]
        out.append(f"/// {doc}")
        out.append("#[rustfmt::skip]")
        out.append(f"pub(crate) static {rname}: [{ty}; {n}] = [")
        for i in range(0, n, per):
            out.append("    " + ", ".join(fmt.format(v) for v in vals[i:i + per]) + ",")
        out.append("];")
        out.append("")
    with open(OUT, "w") as f:
        f.write("\n".join(out))
    print(f"wrote {os.path.normpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
