"""Does the GGUF conversion lose anything? Perplexity of the converted model on a fixed text
against float32 weights dequantized by llama.cpp's own reader (`gguf`), on the same tokens.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python benchmarks/gguf_perplexity.py FILE.gguf --tokens 1024 --out results/x.json

Both directories are written by `mlxmem.models.gguf.convert_gguf` (the reference with
`float32=True`) under --workdir and reused on a second run. The converted model runs as mlxmem
runs it: on a CPU-only machine dequantized to float32 at load (mlxmem/cpu.py); `--quantized`
keeps MLX's quantized matmuls instead (slow on the CPU). Also reports prefill tok/s (the
perplexity pass) and decode tok/s (greedy, --decode tokens) of the converted model.

The default text (the Apache License) is one a code model has nearly memorized (perplexity
1.4-2.8), so also run it on text no model has seen, the seeded synthetic journal:
`--text benchmarks/scenarios/journal.jsonl`.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import time
from pathlib import Path

DEFAULT_TEXT = Path("/usr/share/common-licenses/Apache-2.0")


def perplexity(model, tokens) -> tuple[float, float]:
    """(perplexity of tokens[1:] given the ones before, seconds of the forward pass)."""
    import mlx.core as mx
    import mlx.nn as nn

    inputs, targets = mx.array(tokens[:-1])[None], mx.array(tokens[1:])[None]
    start = time.perf_counter()
    logits = model(inputs).astype(mx.float32)
    loss = nn.losses.cross_entropy(logits, targets).mean()
    mx.eval(loss)
    return math.exp(loss.item()), time.perf_counter() - start


def decode_speed(model, tokenizer, n: int) -> float:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        add_generation_prompt=True,
    )
    last = None
    for response in stream_generate(
        model, tokenizer, prompt, max_tokens=n, sampler=make_sampler(0)
    ):
        last = response
    return last.generation_tps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="text, or .jsonl turns")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--decode", type=int, default=32, help="0: skip the decode timing")
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache/mlxmem-ppl")
    parser.add_argument("--quantized", action="store_true", help="no float32 dequantization")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from mlx_lm import load

    from mlxmem.cpu import dequantize_for_cpu
    from mlxmem.models.gguf import convert_gguf

    work = args.workdir / args.gguf.stem
    dirs = {"converted": work / "converted", "float32": work / "float32"}
    seconds = {}
    for kind, path in dirs.items():
        if not (path / "config.json").is_file():
            start = time.perf_counter()
            convert_gguf(args.gguf, path, progress=True, force=True, float32=kind == "float32")
            seconds[kind] = round(time.perf_counter() - start, 1)
    text = args.text.read_text(encoding="utf-8")
    if args.text.suffix == ".jsonl":  # a conversation (benchmarks/scenarios): its turns' text
        text = "\n\n".join(json.loads(line)["text"] for line in text.splitlines() if line)
    result = {
        "gguf": args.gguf.name,
        "text": str(args.text),
        "text_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "convert_seconds": seconds,
        "quantized_matmuls": args.quantized,
    }
    tokens = None
    for kind, path in dirs.items():
        model, tokenizer = load(str(path))
        if kind == "converted" and not args.quantized:
            dequantize_for_cpu(model)
        if tokens is None:
            tokens = tokenizer.encode(text)[: args.tokens + 1]
            result["tokens"] = len(tokens) - 1
        ppl, forward = perplexity(model, tokens)
        result[kind] = {
            "perplexity": round(ppl, 4),
            "prefill_tok_s": round(len(tokens) / forward, 1),
        }
        if kind == "converted" and args.decode:
            result[kind]["decode_tok_s"] = round(decode_speed(model, tokenizer, args.decode), 1)
        print(kind, result[kind], flush=True)
        del model
        gc.collect()
    ratio = result["converted"]["perplexity"] / result["float32"]["perplexity"]
    result["ratio"] = round(ratio, 5)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
