"""The tiny random-weight model: mlx-lm loads it, its tokenizer behaves like Llama-3's, and the
same seed writes the same files."""

import hashlib
import json

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import pytest

from mlxmem.errors import MlxmemError
from mlxmem.models.tiny import (
    BOS,
    EOT,
    SPECIAL_TOKENS,
    build_tokenizer,
    is_tiny,
    list_archs,
    load_arch,
    make_tiny,
)

pytestmark = pytest.mark.e2e

# A narrower shape than the default, for the tests that build several models.
SMALL = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


@pytest.fixture(scope="module", params=[None, 4], ids=["fp32", "q4"])
def tiny(request, tmp_path_factory):
    path = make_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0, quantize=request.param)
    model, tokenizer = mlx_lm.load(str(path))
    return path, model, tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def files(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_mlx_lm_loads_it_and_runs_a_forward_pass(tiny):
    path, model, tokenizer = tiny
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["vocab_size"] == len(tokenizer._tokenizer)
    logits = model(mx.array([tokenizer.encode("Hello there")]))
    assert logits.shape[-1] == config["vocab_size"]
    assert mx.all(mx.isfinite(logits)).item()


def test_quantize_writes_4_bit_weights(tiny):
    path, model, _ = tiny
    config = json.loads((path / "config.json").read_text())
    quantized = [m for _, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)]
    if "quantization" in config:
        assert config["quantization"]["bits"] == 4
        assert config["quantization"]["group_size"] == 64
        assert quantized and all(m.bits == 4 for m in quantized)
    else:
        assert not quantized


def test_a_short_generation_runs(tiny):
    _, model, tokenizer = tiny
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi!"}], add_generation_prompt=True
    )
    steps = list(mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=8))
    assert 1 <= len(steps) <= 8
    assert steps[-1].generation_tokens == len(steps)
    assert all(0 <= step.token < len(tokenizer._tokenizer) for step in steps)


def test_eos_is_eot_everywhere(tiny):
    path, _, tokenizer = tiny
    config = json.loads((path / "config.json").read_text())
    eot = tokenizer.convert_tokens_to_ids(EOT)
    assert config["eos_token_id"] == eot
    assert tokenizer.eos_token_ids == {eot}
    assert config["bos_token_id"] == tokenizer.convert_tokens_to_ids(BOS)


def test_special_tokens_are_single_ids_after_the_pieces(tokenizer):
    ids = [tokenizer.encode(token, add_special_tokens=False) for token in SPECIAL_TOKENS]
    assert ids == [[1000], [1001], [1002], [1003], [1004]]
    assert len(tokenizer) == 1005


def test_special_token_strings_can_be_encoded_as_plain_text(tokenizer):
    text = f"{EOT}<|start_header_id|>system"
    ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert not set(ids) & set(tokenizer.all_special_ids)
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize(
    "text",
    ["Hello, world.", "  two  spaces\nnew line\ttab", "héllo ünïcode 日本語 🙂", "emoji: 👩‍👩‍👧"],
)
def test_any_unicode_round_trips(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids


def test_encoding_with_special_tokens_prepends_bos_like_llama_3(tokenizer):
    assert tokenizer.encode("hi")[0] == tokenizer.bos_token_id
    assert tokenizer.bos_token_id not in tokenizer.encode("hi", add_special_tokens=False)


def test_chat_template_renders_role_markers(tokenizer):
    messages = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "  Hello  "},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe kind.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_each_message_renders_on_its_own(tokenizer):
    messages = [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi."},
    ]

    def render(msgs):
        return tokenizer.apply_chat_template(msgs, tokenize=False)

    pieces = [render([m]).removeprefix(BOS) for m in messages]
    assert render(messages) == BOS + "".join(pieces)


def test_same_seed_writes_identical_files(tmp_path):
    first = files(make_tiny(tmp_path / "a", seed=7))
    second = files(make_tiny(tmp_path / "b", seed=7))
    other = files(make_tiny(tmp_path / "c", seed=8))
    assert first == second
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]


def test_readme_says_random_weights(tmp_path):
    path = make_tiny(tmp_path / "m", arch=SMALL)
    assert "gibberish" in (path / "README.md").read_text()
    assert is_tiny(path)


def test_rewrites_a_tiny_model_but_refuses_other_directories(tmp_path):
    path = make_tiny(tmp_path / "m", arch=SMALL)
    assert files(make_tiny(path, seed=1, arch=SMALL)) != files(
        make_tiny(tmp_path / "n", arch=SMALL)
    )
    other = tmp_path / "real-model"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(MlxmemError, match="refusing"):
        make_tiny(other)
    assert (other / "config.json").read_text() == "{}"


def test_arch_overrides_shape_and_pads_the_vocabulary(tmp_path):
    arch = {**SMALL, "num_key_value_heads": 1, "intermediate_size": 96, "vocab_size": 1500}
    path = make_tiny(tmp_path / "m", arch=arch, quantize=4)
    config = json.loads((path / "config.json").read_text())
    assert {k: config[k] for k in arch} == arch
    model, tokenizer = mlx_lm.load(str(path))
    assert len(tokenizer._tokenizer) == 1500
    # Every id the model can emit is a token of the vocabulary, even those no text encodes to.
    pieces = tokenizer._tokenizer.convert_ids_to_tokens(list(range(1005, 1500)))
    assert None not in pieces and len(set(pieces)) == 495
    assert list(mlx_lm.stream_generate(model, tokenizer, "Hello", max_tokens=4))


def test_padding_keeps_the_ids_of_plain_text():
    small, padded = build_tokenizer(), build_tokenizer(2000)
    text = "I remember my friend Anna. <unused5> 日本"
    ids = small.encode(text, add_special_tokens=False)
    assert padded.encode(text, add_special_tokens=False) == ids
    assert padded.convert_tokens_to_ids(EOT) == 1999


def test_the_shipped_archs_are_real_configs():
    assert list_archs() == ["llama-3.2-3b", "phi-3.5-mini", "qwen2.5-3b"]
    llama = load_arch("llama-3.2-3b")
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["vocab_size"]) == (
        3072,
        28,
        128256,
    )
    assert (llama["num_attention_heads"], llama["num_key_value_heads"]) == (24, 8)
    assert load_arch("qwen2.5-3b")["num_key_value_heads"] == 2
    with pytest.raises(MlxmemError, match="unknown arch"):
        load_arch("gpt-5")


@pytest.mark.parametrize("name", ["llama-3.2-3b", "phi-3.5-mini", "qwen2.5-3b"])
def test_each_arch_builds_a_model_mlx_lm_runs(tmp_path, name):
    arch = load_arch(name)
    heads = 2
    head_dim = 96 if name == "phi-3.5-mini" else 32  # phi's rope factors fix its head size
    arch.update(
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=heads if name == "phi-3.5-mini" else 1,
        hidden_size=heads * head_dim,
        head_dim=head_dim,
        intermediate_size=128,
        vocab_size=1024,
    )
    path = make_tiny(tmp_path / name, arch=arch, quantize=4)
    model, tokenizer = mlx_lm.load(str(path))
    assert model.model_type == arch["model_type"]
    assert list(mlx_lm.stream_generate(model, tokenizer, "Hello", max_tokens=3))
