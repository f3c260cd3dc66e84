"""The CPU path: float32 instead of MLX's quantized CPU kernels, and OpenBLAS preloaded."""

import sys

import pytest

from mlxmem import cpu
from mlxmem.engine import MLXEngine
from mlxmem.models.tiny import make_tiny


@pytest.fixture(scope="module")
def tiny_q4(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("q4") / "model", seed=1, quantize=4)


@pytest.mark.e2e
def test_a_quantized_model_runs_as_float32_on_the_cpu(tiny_q4):
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    if not cpu.on_cpu_only():
        pytest.skip("dequantization happens only without a GPU")
    engine = MLXEngine(tiny_q4)
    modules = [m for _, m in engine.model.named_modules()]
    assert engine.dequantized and engine.model_id.endswith("-f32")
    assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for m in modules)
    assert all(p.dtype == mx.float32 for _, p in tree_flatten(engine.model.parameters()))


@pytest.mark.e2e
def test_the_switch_keeps_it_quantized(tiny_q4, monkeypatch):
    import mlx.nn as nn

    monkeypatch.setenv(cpu.DEQUANTIZE_ENV, "0")
    engine = MLXEngine(tiny_q4)
    assert not engine.dequantized and not engine.model_id.endswith("-f32")
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in engine.model.named_modules())


@pytest.fixture
def fake_openblas(tmp_path, monkeypatch):
    lib = tmp_path / "libblas.so.3"
    lib.write_bytes(b"")
    monkeypatch.setattr(cpu, "OPENBLAS", lib)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-m", "mlxmem.cli", "chat", "-m", "hi"])
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(cpu.NO_OPENBLAS_ENV, raising=False)
    return lib


def test_the_command_reruns_itself_once_with_openblas(fake_openblas):
    env, argv = cpu.openblas_argv()
    assert env["LD_PRELOAD"] == str(fake_openblas) and env[cpu.NO_OPENBLAS_ENV] == "1"
    assert argv == [sys.executable, "-m", "mlxmem.cli", "chat", "-m", "hi"]


def test_an_existing_preload_is_kept(fake_openblas, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/lib/other.so")
    env, _ = cpu.openblas_argv()
    assert env["LD_PRELOAD"] == f"{fake_openblas}:/lib/other.so"


@pytest.mark.parametrize("case", ["guard", "preloaded", "missing", "macos"])
def test_no_rerun_when_not_wanted_or_not_possible(fake_openblas, monkeypatch, case):
    if case == "guard":
        monkeypatch.setenv(cpu.NO_OPENBLAS_ENV, "1")
    elif case == "preloaded":
        monkeypatch.setenv("LD_PRELOAD", str(fake_openblas))
    elif case == "missing":
        fake_openblas.unlink()
    else:
        monkeypatch.setattr(sys, "platform", "darwin")
    assert cpu.openblas_argv() is None
