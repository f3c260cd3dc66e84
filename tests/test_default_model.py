"""A first run on any machine: without --model, the best model this machine runs and can fetch;
a model's GGUF downloaded once and kept as the file llama.cpp runs (MLX's conversion made from
it); and a model that would be slow here, or cannot run here, says what it costs."""

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from conftest import cli
from huggingface_hub import constants

from mlxmem import paths
from mlxmem.defaults import DEFAULT_MODEL, OFFLINE_MODEL
from mlxmem.errors import ModelLoadError
from mlxmem.models import choice, fit, hub_gguf, resolve, wheels
from mlxmem.models.tiny import make_tiny_gguf


def linux(monkeypatch, llamacpp: bool = True) -> None:
    """As off Apple silicon, with or without llama-cpp-python, and no engine preference."""
    monkeypatch.setattr(choice, "apple_silicon", lambda: False)
    monkeypatch.setattr(choice, "llamacpp_installed", lambda: llamacpp)
    monkeypatch.setattr("mlxmem.cpu.on_cpu_only", lambda: True)
    monkeypatch.delenv("MLXMEM_ENGINE")


def hub_allowed_but_unreachable(monkeypatch) -> None:
    """HF_HUB_OFFLINE unset, and the hub at an address where nothing listens."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def listed() -> dict[str, dict]:
    return {r["alias"]: r for r in json.loads(cli("models", "list", "--json").stdout)}


# -- the default --------------------------------------------------------------------------------


def test_on_apple_silicon_the_default_is_the_3b_on_mlx(monkeypatch):
    monkeypatch.setattr(choice, "apple_silicon", lambda: True)
    monkeypatch.delenv("MLXMEM_ENGINE")
    hub_allowed_but_unreachable(monkeypatch)
    chosen = choice.default_model()
    assert (chosen.name, chosen.chosen_by) == (DEFAULT_MODEL, "built in")
    assert choice.engine_for(resolve(chosen.name)).name == "mlx"
    assert fit.note(resolve(DEFAULT_MODEL)) == ""  # Metal: nothing to warn about


def test_elsewhere_with_the_hub_the_default_is_the_3b_gguf_on_llama_cpp(monkeypatch):
    linux(monkeypatch)
    hub_allowed_but_unreachable(monkeypatch)  # allowed: the choice itself touches no network
    records = listed()
    default = next(r for r in records.values() if r["default"])
    assert default["alias"] == DEFAULT_MODEL and default["engine"] == "llamacpp"
    assert default["gguf"].endswith("-Q4_K_M.gguf") and default["note"] == ""
    spec = resolve(DEFAULT_MODEL)
    assert spec.gguf_path == paths.data_dir() / "models" / f"{DEFAULT_MODEL}.gguf"
    assert len(spec.gguf_sha256) == 64 and spec.gguf_bytes  # pinned, not taken from the hub


def test_without_the_hub_the_default_is_the_trained_gguf_from_the_package_index(monkeypatch):
    linux(monkeypatch)  # HF_HUB_OFFLINE=1, as every test runs
    chosen = choice.default_model()
    assert chosen.name == OFFLINE_MODEL and "HF_HUB_OFFLINE" in chosen.why
    assert listed()[OFFLINE_MODEL]["default"] and listed()[OFFLINE_MODEL]["engine"] == "llamacpp"
    kept = resolve(DEFAULT_MODEL).gguf_path  # the 3B pulled earlier, while online
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"GGUF")
    assert choice.default_model().name == DEFAULT_MODEL


def test_an_unreachable_hub_falls_back_at_once_with_one_line(monkeypatch, capsys):
    from mlxmem.cli.common import model_or_default

    linux(monkeypatch)
    hub_allowed_but_unreachable(monkeypatch)
    chosen = choice.fetch_default(progress=False)
    assert chosen.name == OFFLINE_MODEL and "cannot reach 127.0.0.1" in chosen.notice
    assert "\n" not in chosen.notice
    assert not list((paths.data_dir() / "models").iterdir())  # no partial download left
    monkeypatch.setattr(wheels, "download_wheel_set", lambda *a: pytest.fail("downloaded"))
    monkeypatch.setattr(choice, "fetch_default", lambda engine: chosen)  # the 1.5B not pulled
    assert model_or_default(None, fetch=True) == OFFLINE_MODEL
    err = capsys.readouterr().err
    assert err.startswith("Note: llama-3.2-3b cannot be downloaded") and err.count("\n") == 1


def test_with_mlx_on_a_gpu_off_a_mac_the_default_is_the_3b_on_mlx(monkeypatch):
    linux(monkeypatch, llamacpp=False)
    monkeypatch.setattr("mlxmem.cpu.on_cpu_only", lambda: False)  # mlx[cuda]
    hub_allowed_but_unreachable(monkeypatch)  # allowed: the choice itself touches no network
    chosen = choice.default_model()
    assert chosen.name == DEFAULT_MODEL and "on mlx" in chosen.why
    assert fit.note(resolve(DEFAULT_MODEL)) == ""


def test_with_mlx_only_off_a_mac_no_3b_runs_in_float32_unannounced(monkeypatch, capsys):
    from mlxmem.cli.common import model_or_default

    linux(monkeypatch, llamacpp=False)
    chosen = choice.default_model()
    assert chosen.name == OFFLINE_MODEL and "float32" in chosen.why
    records = listed()
    assert records[DEFAULT_MODEL]["engine"] == "mlx"
    note = records[DEFAULT_MODEL]["note"]
    assert note.startswith("slow here: MLX's CPU path runs it in float32, about 13 GB")
    assert "tokens/s" in note and "llama-cpp-python" in note
    assert records["smollm2-135m"]["engine"] == "mlx" and records["smollm2-135m"]["note"] == ""
    assert model_or_default(DEFAULT_MODEL) == DEFAULT_MODEL
    assert capsys.readouterr().err.startswith("Note: llama-3.2-3b: slow here: ")
    assert model_or_default("smollm2-135m", "llamacpp") == "smollm2-135m"
    assert capsys.readouterr().err == ""  # loading it says why it cannot, once, as an error
    monkeypatch.setattr(fit, "physical_memory", lambda: 8_000_000_000)
    assert fit.note(resolve(DEFAULT_MODEL)).startswith("cannot run here: on MLX's CPU path")


# -- a GGUF from the hub, checked ------------------------------------------------------------


@pytest.fixture
def hub_entry(tmp_path, monkeypatch):
    """A registry entry whose GGUF comes from a hub repo, pinned by SHA-256; the hub's download
    writes `served` (what the hub holds) where huggingface_hub would."""
    served = tmp_path / "served.gguf"
    served.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    digest = hashlib.sha256(served.read_bytes()).hexdigest()

    def download(repo, filename, local_dir):
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(served.read_bytes())
        return str(target)

    monkeypatch.setattr("huggingface_hub.hf_hub_download", download)
    monkeypatch.setattr(hub_gguf, "check_reachable", lambda: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    paths.data_dir().mkdir(parents=True, mode=0o700, exist_ok=True)
    (paths.data_dir() / "models.toml").write_text(
        f'[models.h]\nrepo = "o/mlx"\ngguf_repo = "o/gguf"\ngguf_file = "m.gguf"\n'
        f'gguf_sha256 = "{digest}"\n'
    )
    return served


def test_a_hub_gguf_is_kept_once_checked(hub_entry):
    from mlxmem.models import ensure_gguf

    spec = resolve("h")
    assert ensure_gguf(spec, progress=False) == paths.models_dir() / "h.gguf"
    assert [p.name for p in paths.models_dir().iterdir()] == ["h.gguf"]  # no staging left
    assert "Deleted h" in cli("models", "rm", "h", "--yes").stdout
    assert not list(paths.models_dir().iterdir())


def test_a_hub_gguf_that_differs_from_its_pin_is_refused_and_leaves_nothing(hub_entry):
    from mlxmem.models import ensure_gguf

    hub_entry.write_bytes(hub_entry.read_bytes() + b"changed")
    with pytest.raises(ModelLoadError, match="SHA-256 is .* refused"):
        ensure_gguf(resolve("h"), progress=False)
    assert not list(paths.models_dir().iterdir())


# -- one download per model --------------------------------------------------------------------


def write_wheel(folder: Path, name: str, files: dict[str, bytes]) -> None:
    """A minimal valid wheel `name`-1.0 holding `files`, as pip can download it."""
    dist = f"{name}-1.0.dist-info"
    meta = {
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in [*files, *meta]) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as archive:
        for member, data in {**files, **meta, f"{dist}/RECORD": record.encode()}.items():
            archive.writestr(member, data)


@pytest.fixture
def split_on_an_index(tmp_path, monkeypatch):
    """A tiny trained-shaped GGUF split across two wheels on a package index of its own (a
    folder pip reads with --find-links), registered as `parts`; returns the pip runs."""
    gguf = make_tiny_gguf(tmp_path / "tiny.gguf", layers=1, hidden=64).read_bytes()
    index = tmp_path / "index"
    index.mkdir()
    half = len(gguf) // 2
    for i, data in ((1, gguf[:half]), (2, gguf[half:])):
        write_wheel(index, f"mmtest_part{i}", {f"mmtest_part{i}/data/part{i:02d}.bin": data})
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    paths.data_dir().mkdir(parents=True, mode=0o700, exist_ok=True)
    (paths.data_dir() / "models.toml").write_text(
        '[models.parts]\ngguf_wheel = "mmtest-part{i}==1.0"\n'
        'gguf_file = "mmtest_part{i}/data/part{i:02d}.bin"\ngguf_parts = 2\n'
        f'gguf_bytes = {len(gguf)}\ngguf_sha256 = "{hashlib.sha256(gguf).hexdigest()}"\n'
        'path = "models/parts"\n'
    )
    runs = []
    real = wheels.download_wheel_set

    def counted(requirements, dest, progress):
        runs.append(requirements)
        return real(requirements, dest, progress)

    monkeypatch.setattr(wheels, "download_wheel_set", counted)
    return runs, len(gguf)


def test_one_download_from_pull_to_both_engines_and_rm_removes_both(split_on_an_index):
    runs, size = split_on_an_index
    models = paths.data_dir() / "models"
    pulled = cli("models", "pull", "parts", "--engine", "llamacpp").stdout
    assert len(runs) == 1 and runs[0] == ["mmtest-part1==1.0", "mmtest-part2==1.0"]
    assert sorted(p.name for p in models.iterdir()) == ["parts.gguf"]  # no MLX conversion
    assert (models / "parts.gguf").stat().st_size == size
    assert f"Kept: {models / 'parts.gguf'} (" in pulled and "kB)" in pulled
    if choice.llamacpp_installed():
        args = ["--model", "parts", "--max-tokens", "2", "--no-facts", "-m", "hi"]
        cli("chat", "--engine", "llamacpp", *args)
    cli("chat", "--engine", "mlx", "--model", "parts", "--max-tokens", "2", "--no-facts", "hi")
    assert len(runs) == 1  # the conversion was made from the kept file
    assert sorted(p.name for p in models.iterdir()) == ["parts", "parts.gguf"]
    removed = cli("models", "rm", "parts", "--yes").stdout
    assert "parts.gguf" in removed and not list(models.iterdir())


def test_readme_install_script_builds_llama_cpp_as_ci_does():
    """install.sh (README's install command) and .ci/llamacpp-wheel (CI's build) turn off the
    same parts of llama.cpp: what CI tests is what a person's install builds."""
    import re

    root = Path(__file__).resolve().parents[1]
    flags = [
        set(re.findall(r"-D\w+=OFF|-mno-[\w-]*\w", (root / name).read_text()))
        for name in ("install.sh", ".ci/llamacpp-wheel")
    ]
    assert (
        flags[0] == flags[1] and "-mno-amx-int8" in flags[0] and "-DGGML_AMX_INT8=OFF" in flags[0]
    )
    assert "--no-cache-dir" in (root / "install.sh").read_text()


def test_offline_a_hub_gguf_names_the_way_out_without_advising_the_failed_command(monkeypatch):
    linux(monkeypatch)
    out = cli("models", "pull", DEFAULT_MODEL, code=1).output
    assert "HF_HUB_OFFLINE" in out and "package index" in out and "models pull" not in out


def test_an_unpinned_hub_gguf_is_checked_against_the_hubs_own_sha256(hub_entry, monkeypatch):
    from mlxmem.models import ensure_gguf

    toml = paths.data_dir() / "models.toml"
    pinned = toml.read_text()
    digest = pinned.split('gguf_sha256 = "')[1][:64]
    toml.write_text(pinned.replace(f'gguf_sha256 = "{digest}"\n', ""))
    asked = []
    monkeypatch.setattr(hub_gguf, "hub_sha256", lambda repo, f: asked.append(f) or "0" * 64)
    with pytest.raises(ModelLoadError, match="refused"):
        ensure_gguf(resolve("h"), progress=False)
    monkeypatch.setattr(hub_gguf, "hub_sha256", lambda repo, f: asked.append(f) or digest)
    assert ensure_gguf(resolve("h"), progress=False).is_file()
    assert asked == ["m.gguf", "m.gguf"]
