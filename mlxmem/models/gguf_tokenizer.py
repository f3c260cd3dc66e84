"""A Hugging Face tokenizer rebuilt from GGUF metadata (byte-level BPE, `gpt2` type).

Writes `tokenizer.json` and `tokenizer_config.json` (chat template, bos/eos) so that
`mlx_lm.load` finds an ordinary fast tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .gguf_file import GGUFError

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types
# How llama.cpp's `tokenizer.ggml.pre` names map to Hugging Face pre-tokenizer regexes
# (None: GPT-2's own regex inside ByteLevel). Only these are rebuilt; others are refused.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
PRE_TOKENIZERS = {
    "default": None,
    "gpt-2": None,
    "gpt2": None,
    "smollm": "digits",
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "qwen2": _QWEN2,
}


def check_tokenizer(metadata: dict[str, Any]) -> None:
    """Refuse, before any work, a tokenizer this module cannot rebuild."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(
            f"tokenizer type {kind!r} is not supported; mlxmem rebuilds only byte-level BPE "
            "('gpt2', used by Llama 3, Qwen 2, SmolLM)"
        )
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(
            f"pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    if "tokenizer.ggml.merges" not in metadata or "tokenizer.ggml.tokens" not in metadata:
        raise GGUFError("the file has no tokenizer (tokens and merges missing from its metadata)")
    tokens, merges = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.merges"]
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise GGUFError("tokenizer.ggml.tokens is not a list of strings")
    if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m for m in merges):
        raise GGUFError("tokenizer.ggml.merges is not a list of 'left right' strings")
    types = metadata.get("tokenizer.ggml.token_type", [])
    if not isinstance(types, list) or not all(type(t) is int for t in types):
        raise GGUFError("tokenizer.ggml.token_type is not a list of integers")


def write_tokenizer(metadata: dict[str, Any], out: Path, context_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json for `metadata` into `out`."""
    check_tokenizer(metadata)
    build_tokenizer(metadata).save(str(out / "tokenizer.json"))
    config = tokenizer_config(metadata, context_length)
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def build_tokenizer(metadata: dict[str, Any]):
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tokens = metadata["tokenizer.ggml.tokens"]
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(metadata)
    types = metadata.get("tokenizer.ggml.token_type", [])
    added = [
        AddedToken(tokens[i], special=(kind == CONTROL), normalized=False)
        for i, kind in enumerate(types)
        if kind in (CONTROL, USER_DEFINED)
    ]
    tokenizer.add_tokens(added)
    return tokenizer


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    regex = PRE_TOKENIZERS[pre]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex is None)
    if regex is None:
        return byte_level
    if regex == "digits":
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
    return pre_tokenizers.Sequence([split, byte_level])


def _post_processor(metadata: dict[str, Any]):
    from tokenizers import processors

    byte_level = processors.ByteLevel(trim_offsets=False)
    bos = _special(metadata, "bos")
    if not metadata.get("tokenizer.ggml.add_bos_token", False) or bos is None:
        return byte_level
    template = processors.TemplateProcessing(
        single=f"{bos[0]}:0 $A:0",
        pair=f"{bos[0]}:0 $A:0 {bos[0]}:1 $B:1",
        special_tokens=[bos],
    )
    return processors.Sequence([byte_level, template])


def _special(metadata: dict[str, Any], name: str) -> tuple[str, int] | None:
    token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
    tokens = metadata["tokenizer.ggml.tokens"]
    if token_id is None or not 0 <= token_id < len(tokens):
        return None
    return tokens[token_id], int(token_id)


def tokenizer_config(metadata: dict[str, Any], context_length: int) -> dict[str, Any]:
    """tokenizer_config.json: class, chat template and the named special tokens."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    for name in ("bos", "eos", "unknown", "padding"):
        special = _special(metadata, name)
        if special is not None:
            key = {"unknown": "unk", "padding": "pad"}.get(name, name)
            config[f"{key}_token"] = special[0]
    template = metadata.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config
