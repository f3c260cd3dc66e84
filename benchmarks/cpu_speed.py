"""Prefill and decode speed of one model on this machine, 4-bit as loaded or dequantized.

    python benchmarks/cpu_speed.py MODEL_DIR [--float32] [--prefill 256 1024] [--decode 32]

Run it twice, with and without LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3,
to compare the BLAS mlx[cpu] ships with against OpenBLAS. Prints one JSON line.
"""

import argparse
import json
import os
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

TEXT = (
    "The history of the lighthouse is a history of trade. Ships carried grain, wine and oil "
    "along the coasts, and every harbour that wanted their business had to be found at night. "
)


def prefill_tps(model, tokens: list[int], step: int = 512) -> float:
    cache = make_prompt_cache(model)
    start = time.perf_counter()
    for i in range(0, len(tokens), step):
        model(mx.array(tokens[i : i + step])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return len(tokens) / (time.perf_counter() - start)


def decode_tps(model, tokens: list[int], n: int) -> float:
    cache = make_prompt_cache(model)
    logits = model(mx.array(tokens)[None], cache=cache)
    token = mx.argmax(logits[:, -1], axis=-1)
    mx.eval(token)
    start = time.perf_counter()
    for _ in range(n):
        token = mx.argmax(model(token[None], cache=cache)[:, -1], axis=-1)
        mx.eval(token)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--float32", action="store_true")
    parser.add_argument("--prefill", type=int, nargs="*", default=[256, 1024])
    parser.add_argument("--decode", type=int, default=32)
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    if args.float32:
        from mlxmem.cpu import dequantize_for_cpu

        dequantize_for_cpu(model)
    ids = tokenizer.encode(TEXT * 80)
    openblas = "openblas" in os.environ.get("LD_PRELOAD", "")
    row = {
        "weights": "float32" if args.float32 else "as loaded",
        "blas": "OpenBLAS" if openblas else "mlx[cpu] bundled",
    }
    for n in args.prefill:
        row[f"prefill_{n}_tps"] = round(prefill_tps(model, ids[:n]), 1)
    row["decode_tps"] = round(decode_tps(model, ids[:64], args.decode), 1)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
