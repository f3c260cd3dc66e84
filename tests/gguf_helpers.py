"""Small synthetic GGUF files for tests: random weights, a byte-level BPE vocabulary."""

from __future__ import annotations

import struct
from pathlib import Path

import mlx.core as mx

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table, in byte order."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[str], list[int]]:
    merges = ["Ġ t", "h e", "Ġt he", "i s", "Ġ c"]
    tokens = SPECIALS + byte_chars() + ["Ġt", "he", "Ġthe", "is", "Ġc"]
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, merges, types


def write_gguf(
    path: Path, arch: str = "llama", hidden: int = 64, layers: int = 2, tied: bool = True,
    dtype=mx.float32, extra_tensors: dict | None = None, meta: dict | None = None,
) -> Path:  # fmt: skip
    """A random-weight model of `arch` as GGUF, with float tensors only (gemma3: with a
    SentencePiece vocabulary and no chat template, as Gemma 3's base models have)."""
    tokens, merges, types = spm_vocabulary() if arch == "gemma3" else vocabulary()
    heads, kv_heads, ffn = 4, 2, 2 * hidden
    head_dim = hidden // heads
    keys = mx.random.split(mx.random.key(0), 512)
    shapes = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,)}
    if not tied:
        shapes["output.weight"] = (len(tokens), hidden)
    for i in range(layers):
        b = f"blk.{i}"
        shapes |= {
            f"{b}.attn_norm.weight": (hidden,), f"{b}.ffn_norm.weight": (hidden,),
            f"{b}.attn_q.weight": (hidden, hidden),
            f"{b}.attn_k.weight": (kv_heads * head_dim, hidden),
            f"{b}.attn_v.weight": (kv_heads * head_dim, hidden),
            f"{b}.attn_output.weight": (hidden, hidden), f"{b}.ffn_gate.weight": (ffn, hidden),
            f"{b}.ffn_up.weight": (ffn, hidden), f"{b}.ffn_down.weight": (hidden, ffn),
        }  # fmt: skip
        if arch == "gemma3":
            shapes |= {
                f"{b}.attn_q_norm.weight": (head_dim,),
                f"{b}.attn_k_norm.weight": (head_dim,),
            }
            shapes |= {f"{b}.post_attention_norm.weight": (hidden,)}
            shapes |= {f"{b}.post_ffw_norm.weight": (hidden,)}
        if arch == "qwen2":
            for part, n in (("attn_q", hidden), ("attn_k", kv_heads * head_dim)):
                shapes[f"{b}.{part}.bias"] = (n,)
            shapes[f"{b}.attn_v.bias"] = (kv_heads * head_dim,)
    weights = {
        name: (0.05 * mx.random.normal(shape, key=keys[i])).astype(dtype)
        for i, (name, shape) in enumerate(sorted(shapes.items()))
    }
    weights |= extra_tensors or {}
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    metadata = {
        "general.architecture": arch,
        "general.name": "Test Model",
        "general.basename": "testmodel",
        "general.size_label": "1M",
        "general.license": "mit",
        f"{arch}.embedding_length": u32(hidden),
        f"{arch}.block_count": u32(layers),
        f"{arch}.feed_forward_length": u32(ffn),
        f"{arch}.attention.head_count": u32(heads),
        f"{arch}.attention.head_count_kv": u32(kv_heads),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        f"{arch}.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        f"{arch}.context_length": u32(2048),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(1),
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.chat_template": CHATML,
    }
    if arch == "gemma3":
        del metadata["tokenizer.ggml.merges"], metadata["tokenizer.chat_template"]
        metadata["tokenizer.ggml.model"] = "llama"
        metadata["tokenizer.ggml.scores"] = mx.array([-float(i) for i in range(len(tokens))])
        metadata["tokenizer.ggml.bos_token_id"] = u32(2)
        metadata["tokenizer.ggml.eos_token_id"] = u32(1)
        metadata[f"{arch}.attention.key_length"] = u32(head_dim)
        metadata[f"{arch}.attention.sliding_window"] = u32(512)
    metadata |= meta or {}
    mx.save_gguf(str(path), weights, metadata)
    return Path(path)


def retype_tensor(path: Path, name: str, type_id: int) -> None:
    """Rewrite the type of tensor `name` in the header (the data is not converted)."""
    data = bytearray(path.read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    path.write_bytes(bytes(data))


def f16_to_bf16(path: Path) -> None:
    """Rewrite every F16 tensor of `path` as BF16 (same size; mx.save_gguf cannot write it)."""
    import numpy as np

    from mlxmem.models.gguf_file import read_header

    header = read_header(path)
    data = bytearray(path.read_bytes())
    for t in header.tensors:
        start = header.data_start + t.offset
        values = np.frombuffer(bytes(data[start : start + t.nbytes]), dtype="<f2")
        u32 = values.astype("<f4").view("<u4")
        bits = (u32 + 0x7FFF + ((u32 >> 16) & 1)) >> 16  # round to nearest even, as MLX does
        data[start : start + t.nbytes] = bits.astype("<u2").tobytes()
    path.write_bytes(bytes(data))
    for t in header.tensors:
        retype_tensor(path, t.name, 30)


# Where each type keeps its float16 fields (d, m / dmin), by the block layouts of ggml-common.h;
# every other byte of a block is codes or small scales, for which any value is valid.
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2],
    "Q5_K": [0, 2], "Q6_K": [208], "Q2_K": [80, 82], "Q3_K": [108], "IQ4_NL": [0], "IQ4_XS": [0],
}  # fmt: skip


def make_blocks(kind: str, n_blocks: int, seed: int = 0, scale: float = 0.01):
    """`n_blocks` blocks of GGUF type `kind`, built by hand: random codes and sub-block scales,
    float16 scale fields of about `scale`, and some edge cases (a zero scale; for Q6_K, pairs of
    sub-blocks with equal, opposite and zero scales)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    rng = np.random.default_rng(seed)
    size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    for offset in F16_FIELDS.get(kind, []):
        d = (rng.uniform(-1, 1, n_blocks) * scale).astype(np.float16)
        d[0] = 0  # a block whose scale (or minimum) is zero
        blocks[:, offset : offset + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if kind == "Q6_K" and n_blocks > 1:
        sc = blocks[1, 192:208].view(np.int8)
        sc[0:2] = [17, 17]  # equal scales: exact
        sc[2:4] = [-128, 127]
        sc[4:6] = [40, -40]  # equal and opposite: the clipped extreme
        sc[6:8] = [0, 0]
        sc[8:10] = [0, -5]
    return blocks


def spm_vocabulary() -> tuple[list[str], list[str], list[int]]:
    """A SentencePiece vocabulary: control tokens, 256 byte tokens, pieces by falling score."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    pieces = ["▁", "t", "h", "e", "c", "a", "▁t", "he", "▁the", "at", "▁c", "▁cat", "the"]
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [3] * len(specials) + [6] * 256 + [1] * len(pieces)
    return tokens, [], types


def write_typed_gguf(src: Path, dest: Path, types: dict[str, str], seed: int = 0) -> Path:
    """`src` (a float GGUF from write_gguf) rewritten with llama.cpp's GGUFWriter, the tensors
    named in `types` replaced by hand-built blocks of that type (same shape, random codes)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dest, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub)
    for i, t in enumerate(reader.tensors):
        shape = [int(d) for d in reversed(t.shape.tolist())]  # rows, columns
        if t.name in types:
            kind = types[t.name]
            qtype = gguf.GGMLQuantizationType[kind]
            per_block = gguf.GGML_QUANT_SIZES[qtype][0]
            n_blocks = shape[0] * shape[1] // per_block
            blocks = make_blocks(kind, n_blocks, seed + i).reshape(shape[0], -1)
            writer.add_tensor(t.name, blocks, raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, np.array(t.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dest)


def nested_arrays_gguf(path: Path, depth: int) -> Path:
    """A GGUF header whose one metadata value is an array of arrays `depth` deep."""
    key = b"general.nested"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    data += struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 0, 0)
    path.write_bytes(data)
    return Path(path)
