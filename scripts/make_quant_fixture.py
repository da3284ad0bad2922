#!/usr/bin/env python3
"""Writes tests/fixtures/quant_blocks.json: random blocks of every GGUF block type the loader
reads, and the f32 bits the `gguf` Python package (llama.cpp's gguf-py) dequantises them to.
tests/loaders.rs checks our dequantisation against it bit for bit.

Usage: python3 scripts/make_quant_fixture.py   (needs numpy and gguf, e.g. gguf 0.19.0)
"""
import importlib.metadata
import json
import numpy as np
import gguf
from gguf.quants import dequantize

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# Byte offsets of the f16 scales in each block, set to finite values (random bytes could be
# NaN or inf, whose dequantisation says nothing).
F16_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
          "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
BLOCKS = 3


def main():
    rng = np.random.default_rng(2026)
    out = {"gguf_version": importlib.metadata.version("gguf"), "types": []}
    for name in TYPES:
        qtype = gguf.GGMLQuantizationType[name]
        per_block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(BLOCKS, block_bytes), dtype=np.uint8)
        for at in F16_AT[name]:
            scale = rng.uniform(-0.05, 0.05, size=BLOCKS).astype(np.float16)
            raw[:, at:at + 2] = scale.view(np.uint8).reshape(BLOCKS, 2)
        values = dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert values.size == BLOCKS * per_block
        out["types"].append({
            "type": name, "ggml_type": int(qtype), "blocks": raw.reshape(-1).tobytes().hex(),
            "f32_bits": values.view(np.uint32).tolist(),
        })
    with open("tests/fixtures/quant_blocks.json", "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
