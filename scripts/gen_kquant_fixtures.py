#!/usr/bin/env python3
"""Writes the (de)quantisation fixtures of `crates/specd-gguf/tests/quant_fixtures.rs`.

The reference is the `gguf` PyPI package (gguf-py, llama.cpp's own Python library), a numpy
implementation independent of specd's Rust code (which uses candle's block types for most formats).
For every block type specd can dequantise it writes, into crates/specd-gguf/tests/fixtures/:

  <type>.blocks        raw block bytes, exactly as they would sit in a GGUF file
  <type>.expected.f32  gguf-py's dequantisation of those bytes (little-endian f32)
  <type>.input.f32     (only for types both gguf-py and specd can quantise) f32 values whose
                       gguf-py quantisation is the first blocks of <type>.blocks

Blocks come from two sources: random bytes with the f16 scale fields overwritten by chosen values
(every bit pattern of the quantised payload is a valid block, so this covers all code paths,
including signs, zero and subnormal scales and the largest 6-bit sub-scales), and, where gguf-py
can quantise, the quantisation of random normal data (the realistic case).

Usage: pip install gguf numpy && python3 scripts/gen_kquant_fixtures.py
   (or, with llama.cpp's own copy: PYTHONPATH=~/.cache/specd-peer/llama.cpp/gguf-py python3 ...)
The output is deterministic (fixed seed); re-running it must not change the committed files.
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "specd-gguf", "tests", "fixtures")

# type -> byte offsets of f16 scale fields (d, and dmin/m where the format has one)
SCALE_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
    T.IQ2_XXS: [0],
    T.IQ2_XS: [0],
    T.IQ2_S: [0],
    T.IQ3_XXS: [0],
    T.IQ3_S: [0],
    T.IQ1_S: [0],
    T.IQ1_M: [],  # its f16 is spread over the top nibbles of 4 u16 (see set_iq1_m_scale)
    T.TQ1_0: [52],
    T.TQ2_0: [64],
    T.MXFP4: [],  # an E8M0 exponent byte, not an f16 (see MXFP4_EXPONENTS)
}
# MXFP4 exponents: 2^(e-128) per step; the ends (subnormal steps, values that overflow to ±inf)
# and ordinary weight magnitudes.
MXFP4_EXPONENTS = [0, 1, 2, 118, 120, 122, 124, 127, 128, 200, 254, 255]
# Types gguf-py quantises and specd's `quantize` supports too: their bytes must agree.
QUANTIZE_TOO = {T.Q8_0, T.Q4_0, T.BF16}

# f16 scales covering the interesting cases: ordinary, negative, zero, tiny (subnormal), large.
SCALES = np.array([0.0123, -0.0456, 0.0, 6.0e-8, 3.1e-5, 1.0, -2.5, 7.9e-3], dtype=np.float16)


def random_blocks(rng, qtype, n_blocks):
    _, ts = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for i in range(n_blocks):
        for j, off in enumerate(SCALE_FIELDS[qtype]):
            s = SCALES[(i + 3 * j) % len(SCALES)]
            b[i, off:off + 2] = np.frombuffer(s.tobytes(), dtype=np.uint8)
        if qtype == T.IQ1_M:
            set_iq1_m_scale(b[i], SCALES[i % len(SCALES)])
        if qtype == T.MXFP4:
            b[i, 0] = MXFP4_EXPONENTS[i % len(MXFP4_EXPONENTS)]
    return b.reshape(-1)


def set_iq1_m_scale(block, s):
    """IQ1_M keeps nibble k of its f16 scale in the top nibble of u16 k of `scales` (bytes 48..56)."""
    bits = int(s.view(np.uint16))
    for k in range(4):
        hi = 48 + 2 * k + 1
        block[hi] = (block[hi] & 0x0F) | (((bits >> (4 * k)) & 0xF) << 4)


def write(name, arr):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.write(np.ascontiguousarray(arr).tobytes())
    return os.path.getsize(path)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20240611)
    total = 0
    # New types go at the end: the random stream of the earlier ones must not change.
    for qtype in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.BF16, T.F16,
                  T.IQ4_NL, T.IQ4_XS,
                  T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0,
                  T.MXFP4]:
        bs, ts = GGML_QUANT_SIZES[qtype]
        name = qtype.name.lower()
        parts = []
        inputs = None
        if qtype in (T.BF16, T.F16):
            # Ordinary values, subnormals, infinities, signed zeros, extremes (NaN payloads are left
            # out: their exact bits are not specified by either implementation).
            x = np.concatenate([
                rng.standard_normal(200).astype(np.float32),
                np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, -3e-39, 6e-8, 65504.0, 3.0e38, -1.2e-38],
                         dtype=np.float32),
            ])
            if qtype == T.BF16:
                inputs = x
                parts.append(quants.quantize(x, qtype).view(np.uint8).reshape(-1))
            else:
                with np.errstate(over="ignore"):  # 3e38 → inf on purpose
                    parts.append(x.astype(np.float16).view(np.uint8).reshape(-1))
        else:
            n_q = 0
            if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
                # Realistic data: normal values of a few magnitudes, including an all-zero block
                # and a block with one large outlier.
                rows = rng.standard_normal((8, bs)).astype(np.float32) * np.array(
                    [1.0, 0.02, 3.0, 1e-3, 0.5, 1.0, 0.1, 1.0], dtype=np.float32)[:, None]
                rows[5] = 0.0
                rows[6, 7] = 40.0
                x = rows.reshape(-1)
                if qtype in QUANTIZE_TOO:
                    inputs = x
                parts.append(quants.quantize(x.reshape(1, -1), qtype).reshape(-1))
                n_q = 8
            n_rand = 8 if bs == 256 else 16 - n_q + 8
            if qtype == T.MXFP4:
                n_rand = 2 * len(MXFP4_EXPONENTS)
            parts.append(random_blocks(rng, qtype, n_rand))
        raw = np.concatenate(parts).astype(np.uint8)
        assert raw.size % ts == 0
        expected = quants.dequantize(raw.reshape(1, -1), qtype).astype(np.float32).reshape(-1)
        assert expected.size == raw.size // ts * bs
        total += write(f"{name}.blocks", raw)
        total += write(f"{name}.expected.f32", expected.astype("<f4"))
        if inputs is not None:
            total += write(f"{name}.input.f32", inputs.astype("<f4"))
        print(f"{name}: {raw.size // ts} blocks, {expected.size} values", file=sys.stderr)
    print(f"wrote {total} bytes to {os.path.normpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
