"""Would 8-bit stored KV caches change what the model says? Issue 11 asks before offering them.

    python benchmarks/kv8.py MODEL_DIR [--lengths 500 1500] [--steps 32] [--data LOCOMO_DIR]

A stored prefix quantized to 8 bits (mlx's affine quantization, as mlx-lm's QuantizedKVCache
uses: groups of 64, or 32 for a small head) would be dequantized on load. For each length
this prefills a prompt cut from LoCoMo conv-26 (in the model's chat template) once, makes an
8-bit round trip of the cache, and compares: the next-token logits (largest absolute
difference; does the top token agree), `--steps` greedy tokens after the prefix, and the
bytes the prefix takes as safetensors either way. Prints one JSON line per length.
"""

import argparse
import json
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlxmem.engine import Message, MLXEngine
from mlxmem.eval.locomo import default_data_dir, exchanges, load_conversation

BITS = 8


def group_size(head_dim: int) -> int:
    return 64 if head_dim % 64 == 0 else 32  # mlx-lm's default, or what a small head allows


def conversation_tokens(engine: MLXEngine, data: Path, length: int) -> list[int]:
    pairs, _ = exchanges(load_conversation(data, "conv-26"))
    messages = [Message("system", "You are a companion who remembers what the person says.")]
    for user, reply in pairs:
        messages += [Message("user", user), Message("assistant", reply)]
        tokens = engine.encode_chat(messages + [Message("user", "What did we talk about?")])
        if len(tokens) >= length:
            return tokens[:length]
    raise SystemExit(f"conv-26 is shorter than {length} tokens")


def prefill(engine: MLXEngine, tokens: list[int]) -> list[KVCache]:
    cache = [KVCache() for _ in engine.model.layers]
    for i in range(0, len(tokens), 512):
        engine.model(mx.array(tokens[i : i + 512])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def round_trip(cache: list[KVCache]) -> tuple[list[KVCache], dict[str, mx.array]]:
    """The cache after an 8-bit store and load, and the arrays that would be stored."""
    out, stored = [], {}
    for i, c in enumerate(cache):
        q = KVCache()
        for name in ("keys", "values"):
            full = getattr(c, name)[..., : c.offset, :]
            group = group_size(full.shape[-1])
            w, scales, biases = mx.quantize(full, group_size=group, bits=BITS)
            stored |= {
                f"{i}.{name}.q": w,
                f"{i}.{name}.scales": scales,
                f"{i}.{name}.biases": biases,
            }
            back = mx.dequantize(w, scales, biases, group_size=group, bits=BITS).astype(full.dtype)
            setattr(q, name, back)
        q.offset = c.offset
        out.append(q)
    return out, stored


def copy(cache: list[KVCache]) -> list[KVCache]:
    out = []
    for c in cache:
        d = KVCache()
        d.keys, d.values, d.offset = (
            c.keys[..., : c.offset, :],
            c.values[..., : c.offset, :],
            c.offset,
        )
        out.append(d)
    return out


def greedy(engine: MLXEngine, cache: list[KVCache], last: int, steps: int):
    token, out, first_logits = last, [], None
    for _ in range(steps):
        logits = engine.model(mx.array([[token]]), cache=cache)[0, -1].astype(mx.float32)
        if first_logits is None:
            first_logits = logits
        token = int(mx.argmax(logits).item())
        out.append(token)
    return out, first_logits


def nbytes_as_file(arrays: dict[str, mx.array]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kv.safetensors"
        mx.save_safetensors(str(path), arrays)
        return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--lengths", type=int, nargs="+", default=[500, 1500])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--data", type=Path, default=None)
    args = parser.parse_args()
    engine = MLXEngine(args.model)
    data = args.data or default_data_dir()
    for length in args.lengths:
        tokens = conversation_tokens(engine, data, length)
        full = prefill(engine, tokens[:-1])
        eight, stored = round_trip(full)
        fp = {
            f"{i}.{n}": getattr(c, n)[..., : c.offset, :]
            for i, c in enumerate(full)
            for n in ("keys", "values")
        }
        ref, ref_logits = greedy(engine, copy(full), tokens[-1], args.steps)
        got, got_logits = greedy(engine, eight, tokens[-1], args.steps)
        diverged = next((i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if a != b), None)
        print(
            json.dumps(
                {
                    "model": str(args.model),
                    "dtype": str(full[0].keys.dtype),
                    "prefix_tokens": len(tokens) - 1,
                    "max_abs_logit_diff": float(mx.max(mx.abs(ref_logits - got_logits)).item()),
                    "logit_range": float((mx.max(ref_logits) - mx.min(ref_logits)).item()),
                    "top1_agrees": int(mx.argmax(ref_logits).item())
                    == int(mx.argmax(got_logits).item()),
                    "greedy_steps": args.steps,
                    "greedy_identical": ref == got,
                    "first_divergence": diverged,
                    "bytes_full": nbytes_as_file(fp),
                    "bytes_8bit": nbytes_as_file(stored),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
