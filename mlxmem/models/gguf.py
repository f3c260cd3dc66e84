"""Converting a GGUF file (llama.cpp, Ollama, LM Studio) into an mlx-lm model directory.

llama.cpp's own Python reader (the `gguf` package) reads the weights, every tensor type it
knows; `gguf_quant` maps each onto MLX's quantization at the source's precision (Q4_K, Q5_0,
Q8_0, ... stay quantized in groups of 32, with per-layer bits in config.json; see its
docstring for each type). Tensors are renamed to mlx-lm's names, `config.json` comes from the
metadata and the tokenizer is rebuilt from it.
llama.cpp stores Llama's Q/K rows permuted for interleaved RoPE, which mlx-lm runs as
`rope_traditional: true` without undoing the permutation.

Everything is written into a temporary directory next to the target and renamed at the end,
so a failure (foreign or truncated file, Ctrl-C) leaves nothing half-written.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from mlxmem import paths

from . import gguf_quant
from .gguf_file import GGUFError, GGUFHeader, read_header
from .gguf_tokenizer import check_tokenizer, write_tokenizer

SHARD_BYTES = 1 << 30
# Architectures whose GGUF tensors map one to one onto an mlx-lm model, with RoPE layout.
ARCHS = {
    "llama": {"model_type": "llama", "class": "LlamaForCausalLM", "rope_traditional": True},
    "qwen2": {"model_type": "qwen2", "class": "Qwen2ForCausalLM", "rope_traditional": False},
    "gemma3": {
        "model_type": "gemma3_text",
        "class": "Gemma3ForCausalLM",
        "rope_traditional": False,
    },
}
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 normalizes four times per block, and its queries and keys too.
_GEMMA3_BLOCK = _BLOCK | {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_BLOCKS = {"gemma3": _GEMMA3_BLOCK}
# Gemma scales by (1 + weight) in its RMSNorm; llama.cpp's converter stores weight + 1 (its
# norm multiplies by the weight as stored), mlx-lm's Gemma adds the 1 itself: take it off.
NORM_SHIFT = {"gemma3": 1.0}
# Gemma 3's local (sliding-window) layers: llama.cpp fixes these, the file does not say them.
GEMMA3_LOCAL = {"sliding_window_pattern": 6, "rope_local_base_freq": 10000.0}
# Gemma's chat template, for a file that has none (the base models): a system message joins
# the first user turn, as in Google's template.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') "
    "+ message['content'] | trim + '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
# Llama 3.1/3.2 files carry their RoPE scaling only as this tensor of per-frequency factors;
# it becomes mlx-lm's `llama3` rope_scaling when it matches these (Meta's) parameters.
ROPE_FREQS = "rope_freqs.weight"


class Llama3Rope(TypedDict):
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


LLAMA3_ROPE: Llama3Rope = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias|scales|biases)$")
_TOP_NAME = re.compile(r"^(\w+)\.(weight|bias|scales|biases)$")
_ALIAS = re.compile(r"^[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class ImportResult:
    alias: str
    path: Path
    arch: str
    tensor_types: dict[str, int]  # GGUF type name -> tensor count
    seconds: float
    context_tokens: int  # what the registry entry gets: the file's context, at most 4,096
    description: str
    license: str


def check_supported(header: GGUFHeader) -> None:
    """Refuse an architecture, tensor or tokenizer that would not convert cleanly."""
    if header.arch not in ARCHS:
        raise GGUFError(
            f"{header.path.name}: architecture {header.arch or '(none)'!r} is not supported; "
            f"mlxmem converts {', '.join(sorted(ARCHS))} GGUF files"
        )
    for tensor in header.tensors:
        if tensor.name != ROPE_FREQS:
            mlx_name(tensor.name, header.arch)
    check_tokenizer(header.metadata)
    model_config(header)


def mlx_name(gguf_name: str, arch: str = "llama") -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    names = _BLOCKS.get(arch, _BLOCK)
    block = _BLOCK_NAME.match(gguf_name)
    if block and block.group(2) in names:
        layer, part, suffix = block.groups()
        return f"model.layers.{layer}.{names[part]}.{suffix}"
    top = _TOP_NAME.match(gguf_name)
    if top and top.group(1) in _TOP:
        return f"{_TOP[top.group(1)]}.{top.group(2)}"
    raise GGUFError(f"tensor {gguf_name!r} has no counterpart in mlx-lm's model; not converted")


def model_config(
    header: GGUFHeader, layers: dict[str, dict[str, int]] | None = None
) -> dict[str, Any]:
    """config.json for mlx-lm from the GGUF metadata; `layers`: the quantized layers' group
    size and bits, as the conversion wrote them."""
    arch = ARCHS[header.arch]
    hidden = _int(header, "embedding_length", None, MAX_DIM)
    heads = _int(header, "attention.head_count", None, MAX_DIM)
    if isinstance(header.arch_value("attention.head_count_kv"), list):
        raise GGUFError("per-layer KV head counts are not supported")
    kv_heads = _int(header, "attention.head_count_kv", heads, heads)
    if heads % kv_heads:
        raise GGUFError(f"{heads} attention heads do not share {kv_heads} KV heads evenly")
    if "attention.key_length" not in _arch_keys(header) and hidden % heads:
        raise GGUFError(f"hidden size {hidden} is not a multiple of {heads} heads")
    head_dim = _int(header, "attention.key_length", hidden // heads, MAX_DIM)
    if _int(header, "rope.dimension_count", head_dim, MAX_DIM) != head_dim:
        raise GGUFError("partial rotary embeddings (rope.dimension_count < head dim) unsupported")
    names = {t.name for t in header.tensors}
    meta = header.metadata
    vocab = len(meta["tokenizer.ggml.tokens"])
    embedding = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if embedding is None or embedding.shape != (hidden, vocab):
        shape = embedding.shape if embedding else "missing"
        raise GGUFError(
            f"token_embd.weight is {shape}, not ({hidden}, {vocab}) as the metadata says"
        )
    config = {
        "model_type": arch["model_type"],
        "architectures": [arch["class"]],
        "hidden_size": hidden,
        "num_hidden_layers": _int(header, "block_count", None, MAX_LAYERS),
        "intermediate_size": _int(header, "feed_forward_length", None, MAX_DIM * 8),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": _float(header, "attention.layer_norm_rms_epsilon", 1e-5),
        "vocab_size": vocab,
        "rope_theta": _float(header, "rope.freq_base", 10000.0),
        "rope_traditional": arch["rope_traditional"],
        "rope_scaling": _rope_scaling(header) or _llama3_rope_scaling(header, head_dim),
        "max_position_embeddings": context_length(header),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _token_id(meta, "bos", vocab),
        "eos_token_id": _token_id(meta, "eos", vocab),
    }
    if header.arch == "qwen2":
        del config["head_dim"]  # mlx-lm's qwen2 derives it
    if header.arch == "gemma3":
        config |= _gemma3_config(header, config)
    if layers:
        config["quantization"] = quantization_config(layers)
    return config


def _gemma3_config(header: GGUFHeader, config: dict[str, Any]) -> dict[str, Any]:
    """What mlx-lm's gemma3_text needs beyond the common keys, as llama.cpp runs the file:
    the sliding window, local RoPE base, the attention scale (1/sqrt(head dim), except the
    27B's hidden/heads), and <end_of_turn> as an end of reply."""
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    window = _int(header, "attention.sliding_window", 512, 1 << 20)
    scalar = config["hidden_size"] // heads if layers == 62 else config["head_dim"]
    extra = {"sliding_window": window, "query_pre_attn_scalar": scalar, **GEMMA3_LOCAL}
    tokens = header.metadata["tokenizer.ggml.tokens"]
    eos = [config["eos_token_id"]] if config["eos_token_id"] is not None else []
    if "<end_of_turn>" in tokens:
        eos.append(tokens.index("<end_of_turn>"))
    extra["eos_token_id"] = eos
    return extra


MAX_DIM = 1 << 16
MAX_LAYERS = 1024
MIN_CONTEXT = 256  # room for instructions, a turn and a reply; below this mlxmem cannot work


def _arch_keys(header: GGUFHeader) -> set[str]:
    prefix = f"{header.arch}."
    return {k[len(prefix) :] for k in header.metadata if k.startswith(prefix)}


def _int(header: GGUFHeader, key: str, default: int | None, high: int, low: int = 1) -> int:
    """An integer `<arch>.<key>` from low to high (a hostile file may hold 0, a string, a list)."""
    value = header.arch_value(key, default)
    if value is None:
        raise GGUFError(f"{header.arch}.{key} is missing from the file's metadata")
    if type(value) is not int or not low <= value <= high:
        raise GGUFError(
            f"{header.arch}.{key} = {value!r:.40} is not an integer from {low} to {high}"
        )
    return value


def _float(header: GGUFHeader, key: str, default: float | None) -> float:
    """The positive number `key` of the header (`default` if absent; None: it must be there)."""
    value = header.arch_value(key, default)
    if type(value) not in (int, float) or not (math.isfinite(value) and value > 0):
        raise GGUFError(f"{header.arch}.{key} = {value!r:.40} is not a positive number")
    return float(value)


def _token_id(meta: dict[str, Any], name: str, vocab: int) -> int | None:
    value = meta.get(f"tokenizer.ggml.{name}_token_id")
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < vocab:
        raise GGUFError(f"tokenizer.ggml.{name}_token_id = {value!r:.40} is not a token id")
    return value


def context_length(header: GGUFHeader) -> int:
    """The file's context length: an integer of at least MIN_CONTEXT tokens."""
    return _int(header, "context_length", 4096, 1 << 24, low=MIN_CONTEXT)


def metadata_text(value: Any, limit: int = 200) -> str:
    """A metadata string made safe for a registry entry and a terminal: no control characters,
    at most `limit` characters."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(value))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def quantization_config(layers: dict[str, dict[str, int]]) -> dict[str, Any]:
    """mlx-lm's `quantization`: the commonest bits as the default, and an entry for each layer
    with other bits (mlx-lm's load_model reads `quantization[<layer path>]` first)."""
    counts: dict[int, int] = {}
    for params in layers.values():
        counts[params["bits"]] = counts.get(params["bits"], 0) + 1
    bits = max(sorted(counts), key=counts.__getitem__)
    config: dict[str, Any] = {"group_size": gguf_quant.GROUP, "bits": bits}
    config |= {path: p for path, p in sorted(layers.items()) if p["bits"] != bits}
    return config


def _rope_scaling(header: GGUFHeader) -> dict[str, Any] | None:
    kind = header.arch_value("rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": _float(header, "rope.scaling.factor", None)}
    raise GGUFError(f"RoPE scaling {kind!r} is not supported (none and linear are)")


def _llama3_rope_scaling(header: GGUFHeader, head_dim: int) -> dict[str, Any] | None:
    tensor = next((t for t in header.tensors if t.name == ROPE_FREQS), None)
    if tensor is None:
        return None
    import numpy as np

    if tensor.type_name != "F32" or tensor.shape != (head_dim // 2,):
        raise GGUFError(f"{ROPE_FREQS}: expected {head_dim // 2} F32 values")
    with open(header.path, "rb") as f:
        f.seek(header.data_start + tensor.offset)
        factors = np.frombuffer(f.read(tensor.nbytes), dtype="<f4")
    factor = float(factors.max())
    theta = float(header.arch_value("rope.freq_base", 10000.0))
    expected = llama3_rope_factors(theta, head_dim, factor, **LLAMA3_ROPE)
    if not np.allclose(factors, expected, rtol=1e-4):
        raise GGUFError(f"{ROPE_FREQS} is not Llama 3 RoPE scaling; mlxmem cannot map it")
    return {"rope_type": "llama3", "factor": factor, **LLAMA3_ROPE}


def llama3_rope_factors(
    theta: float,
    head_dim: int,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> list[float]:
    """The per-frequency factors llama.cpp's converter writes as rope_freqs for Llama 3."""
    old = original_max_position_embeddings
    low_wavelen, high_wavelen = old / low_freq_factor, old / high_freq_factor
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


def convert_gguf(
    gguf: Path, out: Path, progress: bool = True, force: bool = False, float32: bool = False
) -> Path:
    """Convert the GGUF file `gguf` into the mlx-lm model directory `out` (all or nothing).
    `float32`: every tensor dequantized to float32 by llama.cpp's reader instead (a reference
    for checking the conversion, e.g. benchmarks/gguf_perplexity.py)."""
    header = read_header(Path(gguf))
    check_supported(header)
    out = Path(out)
    _check_target(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _staging(out) as tmp:
        layers = _write_weights(header, tmp, progress, float32)
        config = model_config(header, layers)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        try:
            template = GEMMA_TEMPLATE if header.arch == "gemma3" else None
            write_tokenizer(header.metadata, tmp, config["max_position_embeddings"], template)
        except GGUFError:
            raise
        except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception types
            raise GGUFError(f"the file's tokenizer cannot be rebuilt: {exc}") from None
        _check_loads(tmp)
    return out


def _check_target(out: Path, force: bool) -> None:
    if out.exists() and any(out.iterdir()) and not force:
        raise GGUFError(f"{out} already exists and is not empty (pass --force to replace it)")


@contextmanager
def _staging(out: Path) -> Iterator[Path]:
    """A temporary directory beside `out`, renamed to `out` on success, removed on failure."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def open_reader(header: GGUFHeader):
    """llama.cpp's reader over a file whose header `read_header` has already checked; it must
    see the same tensors."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(header.path)
    except Exception as exc:  # noqa: BLE001 - ValueError, IndexError, KeyError, ...
        raise GGUFError(f"{header.path}: llama.cpp's reader refuses it: {exc}") from None
    seen = [(t.name, int(t.tensor_type), int(t.data_offset)) for t in reader.tensors]
    expected = [(t.name, t.type_id, header.data_start + t.offset) for t in header.tensors]
    if seen != expected:
        raise GGUFError(f"{header.path}: its tensor table reads two different ways; not converted")
    return reader


def _write_weights(
    header: GGUFHeader, out: Path, progress: bool, float32: bool = False
) -> dict[str, dict[str, int]]:
    """Write the weights as safetensors shards; return each quantized layer's group size and
    bits (mlx-lm's per-layer quantization config)."""
    reader = open_reader(header)
    tensors = [t for t in reader.tensors if t.name != ROPE_FREQS]  # now the config's rope_scaling
    shard: dict[str, Any] = {}
    shards: list[dict[str, Any]] = []
    layers: dict[str, dict[str, int]] = {}
    size = 0
    with _progress(progress, f"Converting {header.path.name}", len(tensors)) as advance:
        for tensor in sorted(tensors, key=lambda t: t.name):
            arrays, quantized = _convert_tensor(tensor, float32, header.arch)
            if quantized:
                layers[quantized[0]] = {"group_size": gguf_quant.GROUP, "bits": quantized[1]}
            for name, array in arrays.items():
                shard[name] = array
                size += array.nbytes
            advance(1)
            if size >= SHARD_BYTES:
                shards.append(shard)
                shard, size = {}, 0
    shards.append(shard)
    _save_shards(shards, out)
    return layers


def _convert_tensor(
    tensor, float32: bool = False, arch: str = "llama"
) -> tuple[dict[str, Any], tuple[str, int] | None]:
    """One GGUF tensor as MLX arrays under mlx-lm's names, and (layer path, bits) when it
    stays quantized."""
    import mlx.core as mx
    import numpy as np

    name, kind = tensor.name, tensor.tensor_type.name
    target = mlx_name(name, arch)
    quantizable = tensor.data.ndim == 2 and target.endswith(".weight")
    try:
        if float32:
            c = gguf_quant.Converted(gguf_quant.dequantize(tensor.data, kind), dtype="float32")
        else:
            c = gguf_quant.convert(tensor.data, kind, quantizable)
    except (ValueError, IndexError) as exc:
        raise GGUFError(f"tensor {name} ({kind}) cannot be read: {exc}") from None
    if arch in NORM_SHIFT and name.endswith("norm.weight") and c.scales is None:
        c.weight = c.weight.astype(np.float32) - np.float32(NORM_SHIFT[arch])
        c.dtype = "float32"
    quantized = c.quantization()
    parts = [c.weight] if quantized is None else [quantized[0], quantized[1]]
    if not all(np.isfinite(p).all() for p in parts):
        raise GGUFError(f"tensor {name} has values that are not finite (inf or NaN) once read")
    weight = mx.array(c.weight)
    if c.dtype == "bfloat16":
        weight = weight.astype(mx.bfloat16)
    if quantized is None:
        return {target: weight}, None
    scales, biases, bits = quantized
    layer = target.removesuffix(".weight")
    arrays = {target: weight, f"{layer}.scales": mx.array(scales)}
    arrays[f"{layer}.biases"] = mx.array(biases)
    return arrays, (layer, bits)


def _save_shards(shards: list[dict[str, Any]], out: Path) -> None:
    import mlx.core as mx

    n = len(shards)
    for i, shard in enumerate(shards, 1):
        name = "model.safetensors" if n == 1 else f"model-{i:05d}-of-{n:05d}.safetensors"
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})


def _check_loads(path: Path) -> None:
    """mlx-lm must build the model from the directory (names, shapes, quantization)."""
    from mlx_lm.utils import load_model

    try:
        load_model(path, lazy=True)
    except Exception as exc:  # noqa: BLE001 - mlx-lm raises ValueError, KeyError, ...
        raise GGUFError(f"the converted model does not load in mlx-lm: {exc}") from None


@contextmanager
def _progress(enabled: bool, label: str, total: int, in_bytes: bool = False):
    if not enabled:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TimeRemainingColumn,
    )

    count = DownloadColumn() if in_bytes else MofNCompleteColumn()
    columns = ("{task.description}", BarColumn(), count, TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def default_alias(header: GGUFHeader, gguf: Path) -> str:
    """`general.basename`-`general.size_label` (e.g. smollm2-135m), else the file name."""
    meta = header.metadata
    parts = [meta.get("general.basename"), meta.get("general.size_label")]
    name = "-".join(str(p) for p in parts if p) or Path(gguf).stem
    return re.sub(r"[^\w.-]+", "-", name).strip("-.").lower() or "gguf-model"


def convert_into_models(
    gguf: Path, alias: str | None = None, progress: bool = True, force: bool = False
) -> ImportResult:
    """Convert `gguf` into the data directory's models folder as `alias` (not registered:
    `mlxmem.models.import_gguf` does both)."""
    start = time.perf_counter()
    header = read_header(Path(gguf))
    check_supported(header)
    alias = alias or default_alias(header, Path(gguf))
    if not _ALIAS.match(alias):
        raise GGUFError(f"alias {alias!r}: use letters, digits, '.', '_' and '-'")
    out = convert_gguf(Path(gguf), paths.models_dir() / alias, progress, force)
    types: dict[str, int] = {}
    for tensor in header.tensors:
        types[tensor.type_name] = types.get(tensor.type_name, 0) + 1
    return ImportResult(
        alias,
        out,
        header.arch,
        types,
        time.perf_counter() - start,
        context_tokens=min(context_length(header), 4096),
        description=metadata_text(
            f"{header.metadata.get('general.name', alias)}, imported from {Path(gguf)}", 400
        ),
        license=metadata_text(header.metadata.get("general.license", ""), 100),
    )
