"""Tiny random-weight models in mlx-lm's format, for testing the machinery offline.

A tiny model has the Llama architecture (or any shape from `mlxmem/models/archs/*.json`), random
weights drawn from a seed, and a small SentencePiece tokenizer trained on the spot from text
written in this module. Its output is gibberish: it says nothing about quality and everything
about token budgets, KV-cache reuse and speed ratios.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import io
import json
import os
import random
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, cast

from mlxmem.errors import InputError, MlxmemError

BOS = "<|begin_of_text|>"
END_OF_TEXT = "<|end_of_text|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
EOT = "<|eot_id|>"
# Their order fixes their ids: right after the SentencePiece vocabulary.
SPECIAL_TOKENS = (BOS, END_OF_TEXT, START_HEADER, END_HEADER, EOT)

# Llama-3 style. Each message renders on its own (no look-behind or look-ahead across messages),
# so a prompt can be tokenized piece by piece for KV prefix reuse.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

SPM_VOCAB_SIZE = 1000
DEFAULT_GROUP_SIZE = 64
README_TITLE = "# mlxmem tiny model"

# Llama-3.2 in miniature: same rope, GQA and tied embeddings, a sliver of the width.
TINY_SHAPE: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 256,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
}


def tiny_shape(layers: int | None = None, hidden: int | None = None) -> dict[str, Any] | None:
    """Overrides of TINY_SHAPE for `layers` and a `hidden` size (its heads keep 16 dimensions
    each; the MLP is twice as wide), or None for the default shape. InputError for a hidden size
    that the heads cannot divide."""
    shape: dict[str, Any] = {}
    if layers is not None:
        shape["num_hidden_layers"] = layers
    if hidden is not None:
        if hidden % 16 or hidden < 16:
            raise InputError(f"--hidden must be a multiple of 16 (its heads' width), not {hidden}")
        heads = hidden // 16
        shape |= {
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": max(1, heads // 2),
        }
    return shape or None


# Keys of a real config that describe the checkpoint, not the shape: never copied.
_NOT_SHAPE = ("quantization", "quantization_config", "bos_token_id", "eos_token_id", "pad_token_id")


def make_tiny(
    path: str | Path,
    seed: int = 0,
    quantize: int | None = None,
    arch: dict[str, Any] | None = None,
    *,
    group_size: int = DEFAULT_GROUP_SIZE,
    dtype: str = "float32",
) -> Path:
    """Write a random-weight model that `mlx_lm.load(path)` loads, and return its directory.

    `seed` fixes the weights (same seed, same files). `quantize` is the bits per weight
    (e.g. 4), with `group_size`; None keeps `dtype` weights. `arch` overrides the config shape
    (hidden_size, num_hidden_layers, vocab_size...); an `arch` that names a `model_type` is a
    whole config (see `load_arch`) and replaces the tiny shape instead. Its `quantization` and
    token ids are ignored. A `vocab_size` above the tokenizer's pads the tokenizer with unused
    pieces (see `build_tokenizer`), so every id the model emits decodes. Refuses to overwrite a
    directory that is not a tiny model.
    """
    path = Path(path).expanduser()
    _check_overwritable(path)
    tokenizer = build_tokenizer((arch or {}).get("vocab_size"))
    config = tiny_config(tokenizer, arch)
    model = random_model(config, seed, dtype)
    if quantize is not None:
        config = quantize_weights(model, config, quantize, group_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        _write(staging, model, config, tokenizer, seed, quantize)
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def is_tiny(path: str | Path) -> bool:
    """Whether `path` holds a model written by `make_tiny`."""
    readme = Path(path) / "README.md"
    return readme.is_file() and readme.read_text(encoding="utf-8").startswith(README_TITLE)


def tiny_config(tokenizer: Any, arch: dict[str, Any] | None = None) -> dict[str, Any]:
    """The config.json of a tiny model: the tiny shape, overridden by `arch`, with our ids."""
    arch = {k: v for k, v in (arch or {}).items() if k not in _NOT_SHAPE}
    vocab = len(tokenizer)
    base = {} if "model_type" in arch else TINY_SHAPE
    config = {**base, "vocab_size": vocab, **arch}
    if config["vocab_size"] < vocab:
        raise MlxmemError(
            f"vocab_size {config['vocab_size']} is smaller than the tiny tokenizer's {vocab}"
        )
    config["bos_token_id"] = tokenizer.convert_tokens_to_ids(BOS)
    config["eos_token_id"] = tokenizer.convert_tokens_to_ids(EOT)
    return config


def random_model(config: dict[str, Any], seed: int, dtype: str = "float32"):
    """An mlx-lm model of `config`'s architecture with weights drawn from `seed`.

    Seeds mlx's global random state (layer initializers draw from it).
    """
    import mlx.core as mx

    try:
        module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    except ImportError:
        raise MlxmemError(f"mlx-lm has no model type {config['model_type']!r}") from None
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    _uniform_embeddings(model)
    if dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    return model


def _uniform_embeddings(model) -> None:
    import mlx.core as mx
    import mlx.nn as nn

    # mlx draws embeddings from a normal distribution, ~40x slower than uniform on the CPU
    # (14 s for a 128k-token vocabulary); a uniform draw of the same variance is as random.
    for _, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            rows, dims = module.weight.shape
            bound = (3 / dims) ** 0.5
            module.weight = mx.random.uniform(-bound, bound, (rows, dims))


def quantize_weights(model, config: dict[str, Any], bits: int, group_size: int) -> dict[str, Any]:
    """Quantize `model` in place the way mlx-lm does; return the config that records it."""
    import mlx.nn as nn

    def predicate(_path: str, module) -> bool:
        return hasattr(module, "to_quantized") and module.weight.shape[-1] % group_size == 0

    nn.quantize(model, group_size, bits, class_predicate=predicate)
    quantization = {"group_size": group_size, "bits": bits, "mode": "affine"}
    return {**config, "quantization": quantization}


def build_tokenizer(vocab_size: int | None = None):
    """A Llama-3 style HF tokenizer over a SentencePiece unigram model trained right now.

    Byte fallback encodes any Unicode; the special tokens are added tokens after the pieces
    (one id each, never produced from plain text); encoding with special tokens prepends BOS, as
    Llama-3 does. A `vocab_size` above the natural size pads the pieces with `<unusedN>` pieces
    that no text encodes to, so that every id of a model with that many rows still decodes.
    """
    # No "PyTorch was not found" advice on import: mlx does the computing here.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import Unigram
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(Unigram(_pad(_train_spm(), vocab_size), unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    # The decoder mlx-lm recognizes as SentencePiece without a leading space to strip.
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOT,
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def _train_spm() -> list[tuple[str, float]]:
    """Train a SentencePiece unigram model on `_corpus()`; return its (piece, score) list."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()),
        model_writer=out,
        model_type="unigram",
        vocab_size=SPM_VOCAB_SIZE,
        byte_fallback=True,
        character_coverage=1.0,
        # Keep text exactly as given: no NFKC, no dummy prefix, no whitespace squeezing.
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        split_digits=True,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        num_threads=1,  # one thread: the same pieces and scores on every run
        minloglevel=2,
    )
    # protobuf makes ModelProto when the module is imported: no stub declares it.
    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(out.getvalue())
    return [(p.piece, p.score) for p in proto.pieces]


def _pad(pieces: list[tuple[str, float]], vocab_size: int | None) -> list[tuple[str, float]]:
    missing = (vocab_size or 0) - len(pieces) - len(SPECIAL_TOKENS)
    # Far below any real piece, so segmentation never picks one (ids stay those of the pieces).
    score = min(s for _, s in pieces) - 1e4
    return pieces + [(f"<unused{i}>", score) for i in range(max(missing, 0))]


def _corpus(lines: int = 4000) -> list[str]:
    """English-ish training text: random sentences over `_WORDS`, the Zen of Python, chat bits."""
    rng = random.Random(0)
    sentences = []
    for _ in range(lines):
        text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 16)))
        sentences.append(text[0].upper() + text[1:] + rng.choice(".!?,:;."))
    roles = ["system", "user", "assistant", "summary", "facts"] * 40
    return sentences + _zen().splitlines() * 5 + roles + _SYMBOL_LINES * 20


def _zen() -> str:
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints it
        import this
    return codecs.decode(this.s, "rot13")


def _write(path: Path, model, config: dict[str, Any], tokenizer, seed: int, bits) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import save_config, save_model

    # One array at a time keeps peak memory near the quantized size for large shapes.
    # A list of (name, array) pairs (a dict only when given one to fill).
    for _, array in cast("list[tuple[str, Any]]", tree_flatten(model.parameters())):
        mx.eval(array)
    save_model(path, model)
    save_config(dict(config), path / "config.json")
    tokenizer.save_pretrained(path)
    _patch_tokenizer_config(path)
    (path / "README.md").write_text(_readme(config, seed, bits), encoding="utf-8")


def _patch_tokenizer_config(path: Path) -> None:
    # transformers 5 writes its internal class name; this one loads in 4.x and 5.x alike.
    file = path / "tokenizer_config.json"
    data = json.loads(file.read_text(encoding="utf-8"))
    data["tokenizer_class"] = "PreTrainedTokenizerFast"
    file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _readme(config: dict[str, Any], seed: int, bits: int | None) -> str:
    quant = f"{bits}-bit (group size {config['quantization']['group_size']})" if bits else "none"
    return (
        f"{README_TITLE}\n\n"
        "Random weights: the output is gibberish. Written by `mlxmem models make-tiny` to test\n"
        "the machinery (token budgets, KV-cache reuse, speed) offline, never to judge quality.\n\n"
        f"- architecture: {config['model_type']}, hidden {config['hidden_size']}, "
        f"{config['num_hidden_layers']} layers, {config['num_attention_heads']} heads, "
        f"{config.get('num_key_value_heads')} KV heads, vocab {config['vocab_size']}\n"
        f"- seed: {seed}\n"
        f"- quantization: {quant}\n"
        "- tokenizer: SentencePiece unigram with byte fallback, trained on generated text;\n"
        "  Llama-3 style special tokens and chat template\n"
    )


def _check_overwritable(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise MlxmemError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not is_tiny(path):
        raise MlxmemError(f"{path} is not empty and is not a tiny model; refusing to overwrite it")


def list_archs() -> list[str]:
    """Names of the real model configs shipped in `mlxmem/models/archs` (for `load_arch`)."""
    files = resources.files("mlxmem.models.archs").iterdir()
    return sorted(f.name[: -len(".json")] for f in files if f.name.endswith(".json"))


def load_arch(name: str) -> dict[str, Any]:
    """A real model's config.json (its shape) by name, e.g. `load_arch("llama-3.2-3b")`."""
    if name not in list_archs():
        raise MlxmemError(f"unknown arch {name!r}; known: {', '.join(list_archs())}")
    archs = resources.files("mlxmem.models.archs")
    return json.loads(archs.joinpath(f"{name}.json").read_text(encoding="utf-8"))


_SYMBOL_LINES = [
    "0 1 2 3 4 5 6 7 8 9 10 12 24 100 365 2024 2025 3.14 1,000 50%",
    "Hello, world! How are you? I'm fine; thanks. (yes) [no] {maybe}",
    "\"quoted\" 'single' - -- _ / \\ @ # $ & * + = < > | ~ ` ^",
    "Dear diary, today I felt calm. Tomorrow: call Mom at 9:30.",
]

_WORDS = """
the a an and or but if when while because so then than now today yesterday tomorrow
morning afternoon evening night week weekend month year hour minute moment time day
I you he she we they it me him her us them my your his its our their mine yours this that
these those there here who what where why how which whose all some any none each every
is was are were be been being am have has had do does did done will would can could
shall should may might must go goes went gone come came see saw seen say said tell told
think thought feel felt want wanted need needed like liked love loved hate know knew known
make made take took give gave get got find found keep kept leave left bring brought begin
began start started stop stopped try tried ask asked answer answered work worked play
played walk walked run ran read wrote write written talk talked speak spoke eat ate drink
drank sleep slept call called meet met help helped remember remembered forget forgot
learn learned teach taught buy bought pay paid send sent open opened close closed wait
waited watch watched listen listened hear heard cook cooked clean cleaned drive drove
travel travelled visit visited move moved live lived stay stayed plan planned hope hoped
worry worried laugh laughed cry cried smile smiled sing sang dance danced swim swam
friend friends family mother father mom dad sister brother son daughter child children
baby parent parents grandmother grandfather aunt uncle cousin wife husband partner
neighbor colleague boss team manager doctor nurse teacher student dentist therapist
dog cat bird fish horse garden flower tree forest river lake sea ocean beach mountain
house home room kitchen bedroom door window table chair bed sofa car bus train plane
bike street road city town village country school office shop store market hospital
park library museum church station airport restaurant cafe bakery gym pool
book books music song songs movie film show game games picture photo phone computer
email message letter note journal diary story stories idea ideas question questions
coffee tea water juice milk bread cheese apple banana orange rice pasta soup salad
pizza cake cookie chocolate sugar salt dinner lunch breakfast meal snack
birthday holiday vacation trip party wedding meeting appointment interview exam test
project deadline job career money rent bill bills budget health exercise yoga
rain snow sun wind cloud weather cold hot warm cool spring summer autumn winter
happy sad tired busy calm angry worried excited nervous anxious proud grateful lonely
bored curious hopeful scared stressed relaxed sick healthy strong weak kind gentle
good bad better best worse worst new old young big small large little long short tall
early late fast slow quick easy hard difficult simple important special different same
first last next other another own real true false right wrong sure ready free full empty
again always never sometimes often usually rarely already still just only also even
really very quite too much many more most less least enough almost about around
with without from into onto over under after before during since until between through
of in on at to for by up down out off near far away back together alone inside outside
yes no not maybe please thanks thank sorry hello goodbye okay well oh
one two three four five six seven eight nine ten hundred thousand
Monday Tuesday Wednesday Thursday Friday Saturday Sunday
January February March April May June July August September October November December
Anna Ben Clara David Emma Frank Grace Henry Iris Jack Kate Leo Maria Noah Olivia Paul
Alice Bob Carol Dan Eve Sam Tom Lucy Max Mia Zoe
user assistant system summary fact facts memory memories preference preferences habit
habits person people name names favorite allergic vegetarian anniversary
""".split()


def make_tiny_gguf(
    path: str | Path, seed: int = 0, layers: int | None = None, hidden: int | None = None
) -> Path:
    """Write the tiny model as a GGUF file for the llama.cpp engine (random float32 weights of
    the tiny shape, llama.cpp's rope rather than Llama 3's scaled one) and return its path.

    Written with llama.cpp's own `gguf` package. The vocabulary is a byte-level BPE (GPT-2's
    kind, which llama.cpp tokenizes as Hugging Face's tokenizers do) trained on the spot on the
    tiny model's corpus, with the Llama-3 style special tokens and chat template, so a prompt
    tokenizes into words as on a real model. (The tiny SentencePiece pieces would not do:
    llama.cpp merges pieces by score, which finds a unigram model's pieces badly, 3.4 times
    the tokens of SmolLM2's per message.) The embeddings and the output layer are drawn wider
    than the other weights, and apart, so that greedy decoding wanders instead of repeating
    one token."""
    import gguf
    import numpy as np

    path = Path(path).expanduser()
    if path.suffix != ".gguf":
        raise InputError(f"{path}: a GGUF file's name ends in .gguf")
    shape = TINY_SHAPE | (tiny_shape(layers, hidden) or {})
    width, ffn = shape["hidden_size"], shape["intermediate_size"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = width // heads
    tokens, merges = _train_bpe()
    types = [3 if t in SPECIAL_TOKENS else 1 for t in tokens]  # 3: control, 1: normal
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("mlxmem tiny (random weights)")
    writer.add_block_count(shape["num_hidden_layers"])
    writer.add_context_length(8192)
    writer.add_embedding_length(width)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    writer.add_rope_freq_base(shape["rope_theta"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_bos_token_id(tokens.index(BOS))
    writer.add_eos_token_id(tokens.index(EOT))
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)

    def tensor(name: str, *dims: int, scale: float = 0.05) -> None:
        values = scale * rng.standard_normal(dims) if len(dims) > 1 else np.ones(dims)
        writer.add_tensor(name, values.astype(np.float32))

    tensor("token_embd.weight", len(tokens), width, scale=1.0)
    tensor("output.weight", len(tokens), width, scale=1.0)  # untied: tied ones echo the input
    tensor("output_norm.weight", width)
    for i in range(shape["num_hidden_layers"]):
        block = f"blk.{i}"
        tensor(f"{block}.attn_norm.weight", width)
        tensor(f"{block}.ffn_norm.weight", width)
        tensor(f"{block}.attn_q.weight", heads * head_dim, width)
        tensor(f"{block}.attn_k.weight", kv_heads * head_dim, width)
        tensor(f"{block}.attn_v.weight", kv_heads * head_dim, width)
        tensor(f"{block}.attn_output.weight", width, heads * head_dim)
        tensor(f"{block}.ffn_gate.weight", ffn, width)
        tensor(f"{block}.ffn_up.weight", ffn, width)
        tensor(f"{block}.ffn_down.weight", width, ffn)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _train_bpe() -> tuple[list[str], list[str]]:
    """A byte-level BPE of about SPM_VOCAB_SIZE tokens trained on `_corpus()` with Hugging
    Face's tokenizers: its tokens in id order (the special tokens last) and its merges."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=SPM_VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    state = json.loads(tok.to_str())["model"]
    vocab = sorted(state["vocab"].items(), key=lambda item: item[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    return [t for t, _ in vocab] + list(SPECIAL_TOKENS), merges
