"""A Hugging Face tokenizer rebuilt from GGUF metadata: byte-level BPE (`gpt2` type) or
SentencePiece BPE with byte fallback (`llama` type, as Gemma 3 has it).

Writes `tokenizer.json` and `tokenizer_config.json` (chat template, bos/eos) so that
`mlx_lm.load` finds an ordinary fast tokenizer.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .gguf_file import GGUFError

NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # llama.cpp token types
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
    if kind not in ("gpt2", "llama"):
        raise GGUFError(
            f"tokenizer type {kind!r} is not supported; mlxmem rebuilds byte-level BPE ('gpt2': "
            "Llama 3, Qwen 2, SmolLM) and SentencePiece BPE ('llama': Gemma 3)"
        )
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise GGUFError(
            "the file has no tokenizer (tokenizer.ggml.tokens is not a list of strings)"
        )
    types = metadata.get("tokenizer.ggml.token_type", [])
    if not isinstance(types, list) or not all(type(t) is int for t in types):
        raise GGUFError("tokenizer.ggml.token_type is not a list of integers")
    if kind == "llama":
        scores = metadata.get("tokenizer.ggml.scores")
        if not isinstance(scores, list) or len(scores) != len(tokens) or len(types) != len(tokens):
            raise GGUFError("a SentencePiece tokenizer needs one score and one type per token")
        if not all(type(v) in (int, float) and math.isfinite(v) for v in scores):
            raise GGUFError("tokenizer.ggml.scores holds values that are not finite numbers")
        return
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(
            f"pre-tokenizer {pre!r} is not supported; known: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) and " " in m for m in merges):
        raise GGUFError("tokenizer.ggml.merges is not a list of 'left right' strings")


def write_tokenizer(
    metadata: dict[str, Any], out: Path, context_length: int, template: str | None = None
) -> None:
    """Write tokenizer.json and tokenizer_config.json for `metadata` into `out`; `template`:
    the chat template to use when the file has none."""
    check_tokenizer(metadata)
    build_tokenizer(metadata).save(str(out / "tokenizer.json"))
    config = tokenizer_config(metadata, context_length)
    if template and "chat_template" not in config:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def build_tokenizer(metadata: dict[str, Any]):
    if metadata.get("tokenizer.ggml.model") == "llama":
        return build_sentencepiece_tokenizer(metadata)
    from tokenizers import Tokenizer, decoders, models

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
    _add_marked_tokens(tokenizer, tokens, types)
    return tokenizer


def build_sentencepiece_tokenizer(metadata: dict[str, Any]):
    """SentencePiece BPE (llama.cpp's `llama` type, as Gemma 3 has it) as a Hugging Face BPE
    with byte fallback. SentencePiece keeps no merge list: a piece is formed from two pieces
    whose concatenation it is, in the order of the merged piece's score (as transformers'
    SentencePieceExtractor rebuilds it)."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokens = metadata["tokenizer.ggml.tokens"]
    scores = metadata["tokenizer.ggml.scores"]
    types = metadata["tokenizer.ggml.token_type"]
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    normal = {t: i for t, i in vocab.items() if types[i] == NORMAL}
    candidates = []
    for piece, i in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                candidates.append((-scores[i], i, normal[left], normal[right], left, right))
    candidates.sort()
    merges = [(c[4], c[5]) for c in candidates]
    unk = _special(metadata, "unknown")
    model = models.BPE(
        vocab=vocab,
        merges=merges,
        unk_token=unk[0] if unk else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", False))
    steps = [normalizers.Prepend("▁")] if prefix else []
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    decode = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        decode.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(decode)
    bos = _special(metadata, "bos")
    if metadata.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        from tokenizers import processors

        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos[0]}:0 $A:0", pair=f"{bos[0]}:0 $A:0 {bos[0]}:1 $B:1", special_tokens=[bos]
        )
    _add_marked_tokens(tokenizer, tokens, types)
    return tokenizer


def _add_marked_tokens(tokenizer, tokens: list[str], types: list[int]) -> None:
    """The tokens the GGUF marks as control (added as special) or user-defined, added whole to
    the tokenizer, as both builders need."""
    from tokenizers import AddedToken

    added = [
        AddedToken(tokens[i], special=(kind == CONTROL), normalized=False)
        for i, kind in enumerate(types)
        if kind in (CONTROL, USER_DEFINED)
    ]
    tokenizer.add_tokens(added)


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
