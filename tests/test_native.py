"""The canary that decides how llama.cpp may load on this CPU (mlxmem.engine.native), run with
children that stand in for a build: one killed by SIGSEGV as the AMX kernels are, one that
exits cleanly. No AMX machine and no llama.cpp needed."""

import json
import sys

import pytest

from mlxmem.engine import native
from mlxmem.errors import ModelLoadError

SEGFAULT = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
CLEAN = "pass"


def canary(tmp_path, programs: dict[str, str], runs: list[str]) -> native.Canary:
    """A canary whose child for each load runs `programs[load]`; `runs` records the loads
    tried."""

    def command(load: str) -> list[str]:
        runs.append(load)
        return [sys.executable, "-c", programs[load]]

    return native.Canary("build-cpu-model", command, tmp_path / native.VERDICTS_FILENAME)


def test_an_amx_build_is_told_by_its_system_info():
    assert native.amx_build("CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |")
    assert not native.amx_build("CPU : SSE3 = 1 | AVX2 = 1 | REPACK = 1 |")


def test_a_child_killed_by_sigsegv_gives_the_safe_load_and_the_verdict_is_kept(tmp_path):
    runs: list[str] = []
    check = canary(tmp_path, {"default": SEGFAULT, "no-extra-bufts": CLEAN}, runs)
    assert native.safe_load(check) == "no-extra-bufts"
    assert runs == ["default", "no-extra-bufts"]
    saved = json.loads(check.verdicts.read_text())
    assert saved == {"build-cpu-model": "no-extra-bufts"}
    assert native.safe_load(check) == "no-extra-bufts"
    assert runs == ["default", "no-extra-bufts"]  # cached: no child this time


def test_a_cpu_where_the_default_load_works_keeps_it(tmp_path):
    runs: list[str] = []
    check = canary(tmp_path, {"default": CLEAN, "no-extra-bufts": SEGFAULT}, runs)
    assert native.safe_load(check) == "default"
    assert runs == ["default"]


def test_when_every_load_crashes_the_engine_refuses_in_one_line_with_the_way_out(tmp_path):
    runs: list[str] = []
    check = canary(tmp_path, {"default": SEGFAULT, "no-extra-bufts": SEGFAULT}, runs)
    for _ in range(2):
        with pytest.raises(ModelLoadError) as refused:
            native.safe_load(check)
        message = str(refused.value)
        assert "\n" not in message and "install.sh" in message and "--engine mlx" in message
    assert runs == ["default", "no-extra-bufts"]  # the second refusal came from the cache


def test_a_hung_child_is_passed_over_and_nothing_is_cached(tmp_path):
    """A child that does not finish (a cold disk, a busy machine) says nothing about the
    build: the next load is used this time, and the next engine asks again."""
    runs: list[str] = []
    hang = "import time; time.sleep(30)"
    check = canary(tmp_path, {"default": hang, "no-extra-bufts": CLEAN}, runs)
    check = native.Canary(check.key, check.command, check.verdicts, timeout_s=0.5)
    assert native.safe_load(check) == "no-extra-bufts"
    assert native.safe_load(check) == "no-extra-bufts"
    assert runs == ["default", "no-extra-bufts"] * 2
    assert check.key not in native._read_verdicts(check.verdicts)


def test_when_every_child_hangs_the_engine_refuses_and_caches_nothing(tmp_path):
    runs: list[str] = []
    hang = "import time; time.sleep(30)"
    check = canary(tmp_path, {"default": hang, "no-extra-bufts": hang}, runs)
    check = native.Canary(check.key, check.command, check.verdicts, timeout_s=0.5)
    with pytest.raises(ModelLoadError, match="did not finish"):
        native.safe_load(check)
    assert check.key not in native._read_verdicts(check.verdicts)


def test_a_damaged_verdict_file_runs_the_canary_again(tmp_path):
    runs: list[str] = []
    check = canary(tmp_path, {"default": CLEAN, "no-extra-bufts": CLEAN}, runs)
    check.verdicts.write_text("{not json")
    assert native.safe_load(check) == "default"
    assert json.loads(check.verdicts.read_text()) == {"build-cpu-model": "default"}


def test_the_key_names_the_build_the_cpu_and_the_model():
    one = native.canary_key("AMX_INT8 = 1", "0.3.36", "model-a")
    assert one == native.canary_key("AMX_INT8 = 1", "0.3.36", "model-a")
    assert one != native.canary_key("AMX_INT8 = 1", "0.3.37", "model-a")
    assert one != native.canary_key("AMX_INT8 = 1", "0.3.36", "model-b")
    assert one != native.canary_key("AMX_INT8 = 0", "0.3.36", "model-a")
