"""The model registry and `mlxmem models`: aliases, overrides from the data directory, local
paths, and clear errors (never a download) when a hub model is missing offline."""

import json

import pytest
from conftest import cli
from huggingface_hub import constants
from huggingface_hub.errors import LocalEntryNotFoundError
from typer.testing import CliRunner

from mlxmem.defaults import DEFAULT_MODEL
from mlxmem.errors import MlxmemError, ModelLoadError, ModelNotFoundError
from mlxmem.models import ensure_local, is_downloaded, load_registry, resolve
from mlxmem.models import registry as models
from mlxmem.models.tiny import is_tiny, list_archs

runner = CliRunner()
LLAMA_REPO = "mlx-community/Llama-3.2-3B-Instruct-4bit"


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, so that a real one on this machine changes nothing."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def cached_snapshot(cache, repo):
    """Lay out `repo` in the hub cache as a finished download would."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"weights")
    return snapshot


mlxmem = cli


# -- registry --------------------------------------------------------------------------------


def test_registry_has_the_three_hub_models_and_tiny_with_4096_budgets():
    registry = load_registry()
    assert {"llama-3.2-3b", "qwen2.5-3b", "phi-3.5-mini", "tiny"} <= set(registry)
    assert registry[DEFAULT_MODEL].repo == LLAMA_REPO
    assert registry["qwen2.5-3b"].repo == "mlx-community/Qwen2.5-3B-Instruct-4bit"
    assert registry["phi-3.5-mini"].repo == "mlx-community/Phi-3.5-mini-instruct-4bit"
    for spec in registry.values():
        assert (spec.context_tokens, spec.response_reserve) == (4096, 512)
        assert spec.arch is None or spec.arch in list_archs()


def test_tiny_is_generated_inside_the_data_directory(mlxmem_home):
    tiny = load_registry()["tiny"]
    assert tiny.generated == "tiny"
    assert tiny.path == mlxmem_home / "models" / "tiny"


def test_data_dir_models_toml_overrides_fields_and_adds_entries(mlxmem_home, tmp_path):
    mlxmem_home.mkdir(parents=True, exist_ok=True)
    (mlxmem_home / "models.toml").write_text(
        '[models."llama-3.2-3b"]\ncontext_tokens = 2048\nrestart = "recompute"\n\n'
        f'[models.mine]\npath = "{tmp_path / "mine"}"\nresponse_reserve = 256\n'
    )
    registry = load_registry()
    assert registry["llama-3.2-3b"].context_tokens == 2048
    assert registry["llama-3.2-3b"].repo == LLAMA_REPO  # the fields not overridden stay
    assert (registry["llama-3.2-3b"].restart, registry["mine"].restart) == ("recompute", "auto")
    assert registry["mine"].path == tmp_path / "mine"
    assert (registry["mine"].context_tokens, registry["mine"].response_reserve) == (4096, 256)


@pytest.mark.parametrize(
    "entry, message",
    [
        ('[models.x]\nrepo = "a/b"\ncontext = 5\n', "unknown field"),
        ('[models.x]\ndescription = "no source"\n', "needs a repo or a path"),
        ('[models.x]\nrepo = "a/b"\nresponse_reserve = 5000\n', "response_reserve <"),
        ('[models.x]\nrepo = "a/b"\nrestart = "sometimes"\n', "restart must be one of"),
        ("[models.x\n", "invalid TOML"),
    ],
)
def test_a_bad_user_models_toml_is_a_clear_error_that_stops_nothing_else(
    mlxmem_home, entry, message
):
    mlxmem_home.mkdir(parents=True, exist_ok=True)
    (mlxmem_home / "models.toml").write_text(entry)
    with pytest.raises(MlxmemError, match=message):
        resolve("x")
    assert "x" not in load_registry() and message.split()[-1] in " ".join(
        models.registry_problems().values()
    )
    assert resolve("tiny").generated == "tiny" and "smollm2-135m" in load_registry()


# -- resolve and ensure_local ----------------------------------------------------------------


def test_resolve_a_local_model_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    spec = resolve(str(tmp_path))
    assert (spec.path, spec.repo) == (tmp_path, None)
    assert (spec.context_tokens, spec.response_reserve) == (4096, 512)
    assert is_downloaded(spec)
    assert ensure_local(spec) == tmp_path


def test_a_directory_without_config_json_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        ensure_local(resolve(str(tmp_path)))


def test_an_unknown_alias_lists_the_aliases():
    with pytest.raises(ModelNotFoundError, match="llama-3.2-3b") as raised:
        resolve("no-such-model")
    assert "tiny" in str(raised.value)


def test_a_hub_repo_id_resolves_to_an_ad_hoc_spec():
    spec = resolve("mlx-community/SmolLM3-3B-4bit")
    assert (spec.repo, spec.path, spec.context_tokens) == (
        "mlx-community/SmolLM3-3B-4bit",
        None,
        4096,
    )


def test_offline_an_uncached_hub_model_names_the_repo_and_the_fix(monkeypatch):
    def cache_only(*args, **kwargs):
        assert kwargs.get("local_files_only"), "tried to download"
        raise LocalEntryNotFoundError("not cached")

    monkeypatch.setattr("huggingface_hub.snapshot_download", cache_only)
    spec = resolve("qwen2.5-3b")
    assert not is_downloaded(spec)
    with pytest.raises(ModelNotFoundError) as raised:
        ensure_local(spec)
    message = str(raised.value)
    assert "mlx-community/Qwen2.5-3B-Instruct-4bit" in message
    assert "mlxmem models pull qwen2.5-3b" in message
    assert "--model PATH" in message


def test_a_cached_hub_model_is_found_offline(hf_cache):
    snapshot = cached_snapshot(hf_cache, LLAMA_REPO)
    spec = resolve(DEFAULT_MODEL)
    assert is_downloaded(spec)
    assert ensure_local(spec) == snapshot


def test_a_cached_snapshot_without_weights_is_not_downloaded(hf_cache):
    (cached_snapshot(hf_cache, LLAMA_REPO) / "model.safetensors").unlink()
    assert not is_downloaded(resolve(DEFAULT_MODEL))
    with pytest.raises(ModelNotFoundError, match=LLAMA_REPO):
        ensure_local(resolve(DEFAULT_MODEL))


def test_tiny_is_written_on_first_use_and_then_reused():
    spec = resolve("tiny")
    assert not is_downloaded(spec)
    path = ensure_local(spec, progress=False)
    assert is_tiny(path) and is_downloaded(spec)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_local(spec) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_offline_is_read_from_the_environment_at_call_time(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert models.hub_offline()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert not models.hub_offline()


# -- CLI --------------------------------------------------------------------------------------


@pytest.fixture
def on_a_mac(monkeypatch):
    """As on Apple silicon, where the built-in default is the 3B on MLX."""
    from mlxmem.models import choice

    monkeypatch.setattr(choice, "apple_silicon", lambda: True)


def test_models_list_json(hf_cache, on_a_mac):
    cached_snapshot(hf_cache, LLAMA_REPO)
    records = {r["alias"]: r for r in json.loads(mlxmem("models", "list", "--json").stdout)}
    assert records["llama-3.2-3b"]["default"] is True
    assert records["llama-3.2-3b"]["downloaded"] is True
    assert records["qwen2.5-3b"]["downloaded"] is False
    assert records["tiny"]["path"].endswith("models/tiny")
    assert all(r["context_tokens"] == 4096 for r in records.values())


def test_models_list_table():
    out = mlxmem("models", "list").stdout
    assert "qwen2.5-coder-1.5b *" in out and "qwen2.5-3b" in out and "* default" in out


def test_models_make_tiny(tmp_path):
    path = tmp_path / "tiny"
    out = mlxmem("models", "make-tiny", str(path), "--seed", "3", "--quantize", "4").stdout
    assert str(path) in out and "random-weight" in out
    assert json.loads((path / "config.json").read_text())["quantization"]["bits"] == 4


def test_models_make_tiny_of_one_layer_and_a_narrow_width_loads_and_generates(tmp_path):
    path = tmp_path / "nano"
    mlxmem("models", "make-tiny", str(path), "--layers", "1", "--hidden", "64")
    config = json.loads((path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (1, 64)
    assert config["num_attention_heads"] * 16 == 64  # heads of 16 dimensions
    from mlx_lm import generate, load

    model, tokenizer = load(str(path))
    assert len(model.layers) == 1
    assert isinstance(generate(model, tokenizer, "hello", max_tokens=3), str)
    result = mlxmem("models", "make-tiny", str(tmp_path / "bad"), "--hidden", "70", code=1)
    assert "multiple of 16" in result.stderr and not (tmp_path / "bad").exists()


def test_models_make_tiny_help_says_the_output_is_gibberish():
    assert "gibberish" in mlxmem("models", "make-tiny", "--help").stdout


def test_models_pull_offline_is_an_error_without_a_traceback():
    result = mlxmem("models", "pull", "qwen2.5-3b", code=1)
    assert result.stderr.startswith("Error: ")
    assert "mlx-community/Qwen2.5-3B-Instruct-4bit" in result.stderr
    assert "Traceback" not in result.output


def test_models_pull_tiny_writes_it():
    assert "Ready:" in mlxmem("models", "pull", "tiny").stdout
    assert "Already on disk:" in mlxmem("models", "pull", "tiny").stdout


def test_models_pull_unknown_alias():
    assert "unknown model" in mlxmem("models", "pull", "nope", code=1).stderr


def test_a_missing_path_is_never_taken_for_a_hub_repo_to_download(monkeypatch):
    def no_download(*args, **kwargs):
        assert kwargs.get("local_files_only"), "tried to download"
        raise LocalEntryNotFoundError("not cached")

    monkeypatch.setattr("huggingface_hub.snapshot_download", no_download)
    with pytest.raises(ModelNotFoundError, match="no such model directory: some/dir"):
        ensure_local(resolve("some/dir"))
    assert (
        "models pull some/dir" in mlxmem("chat", "--model", "some/dir", "-m", "hi", code=1).output
    )


def test_the_default_model_survives_odd_text_and_hand_edits_of_the_config(mlxmem_home):
    from mlxmem.models.choice import config_path

    cli("models", "default", "tiny")
    path = config_path()
    path.write_text(path.read_text() + 'note = "a\\u007fb"\n[extra]\nkey = 1\n')
    cli("models", "default", "tiny")  # rewritten: still valid TOML, the table dropped
    assert "extra" not in path.read_text()
    assert cli("models", "default").output.strip().startswith("tiny")
