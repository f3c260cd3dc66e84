"""Whether llama.cpp's fastest load is safe on this CPU: a canary decode in a child process.

On Xeons with AMX, a llama.cpp built with `-march=native` compiles its AMX kernels, and the
first `llama_decode` can die of SIGSEGV in `ggml_backend_amx_mul_mat` (llama.cpp #20824):
a native crash that no Python code can catch. llama.cpp puts a model's weights in its "extra"
buffer types (AMX, then the CPU repack buffer) when `llama_model_params.use_extra_bufts` is
on; with it off no AMX buffer exists, so the crashing kernel cannot be reached, but the
repacking that speeds up decoding is off too (a Qwen2.5-Coder-1.5B Q4_K_M decoded 11.3
instead of 14.3 tokens/s: docs/llamacpp.md).

What was weighed, and why a canary:
- `use_extra_bufts = False` on every AMX build: always safe, always the slower load, also
  on CPUs where the AMX path works.
- A buffer-type override (`tensor_buft_overrides`) that sends the weights to the CPU repack
  buffer and skips AMX: llama.cpp takes an override's buffer type as it is, without asking
  whether that buffer can hold the tensor, and the repack buffer dereferences a null pointer
  for a tensor it cannot repack (`ggml_backend_cpu_repack_buffer_set_tensor`, whose rules
  depend on the quant type, the shape and the CPU's features). An override is only safe
  with a copy of those rules, which change between releases: not taken.
- A canary: on an AMX build only, a child process loads the model as the engine would and
  decodes a prompt and a few tokens. If it exits cleanly the default load is used; if it dies
  (a signal, an error, a hang) the engine loads with `use_extra_bufts = False`, and if that
  dies too the engine refuses to load with one line that says how to rebuild llama.cpp. The
  verdict is cached per build (version and system info), CPU and model file, so the child
  runs once (a second or two, about the load of the model), and a CPU where AMX works keeps it.

The runner takes the command it runs, so the decision is tested without an AMX machine.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlxmem.errors import ModelLoadError
from mlxmem.paths import write_whole

VERDICTS_FILENAME = "llamacpp-canary.json"
CANARY_TIMEOUT_S = 120.0
# The loads tried in turn: llama.cpp's default (extra buffer types: AMX, repacking), then
# without them.
LOADS = ("default", "no-extra-bufts")
# install.sh's flags, not llama.cpp's GGML_AMX_* options: a -march=native build ignores those
# and compiles AMX in whenever the CPU has it; only the compiler's -mno-amx-* leave it out.
REBUILD_HINT = (
    "rebuild it without AMX: `pip uninstall -y llama-cpp-python`, then `sh install.sh` in"
    " mlxmem's clone (it builds llama.cpp for this CPU without AMX), or run with --engine mlx"
)


def amx_build(system_info: str) -> bool:
    """Whether llama.cpp was built with its AMX kernels (`llama_print_system_info`)."""
    return "AMX_INT8 = 1" in system_info


@dataclass(frozen=True)
class Canary:
    """The check of one build, CPU and model: `command(load)` is the child's argv for a load
    of LOADS; `key` names what the verdict holds for."""

    key: str
    command: Callable[[str], Sequence[str]]
    verdicts: Path
    timeout_s: float = CANARY_TIMEOUT_S


def safe_load(canary: Canary) -> str:
    """The first of LOADS whose canary child exits cleanly, from the cached verdict where there
    is one; ModelLoadError when none does."""
    cached = _read_verdicts(canary.verdicts).get(canary.key)
    if cached in LOADS:
        return cached
    if cached is None:
        # Only a child that exited says something about the build: one that timed out (a cold
        # disk, a busy machine) or could not start leaves nothing cached, and the next load
        # asks again.
        decided = True
        for load in LOADS:
            survived = _survives(canary.command(load), canary.timeout_s)
            if survived:
                if decided:
                    _record(canary, load)
                return load
            decided = decided and survived is not None
        if not decided:
            raise ModelLoadError(
                "llama.cpp's check of this build did not finish in "
                f"{canary.timeout_s:.0f} s; try again, or {REBUILD_HINT}"
            )
        _record(canary, "none")
    raise ModelLoadError(f"llama.cpp crashes on this CPU with every load tried; {REBUILD_HINT}")


def _survives(command: Sequence[str], timeout_s: float) -> bool | None:
    """Whether `command` exits with status 0 (a signal, such as SIGSEGV, gives a negative
    status); None when it did not finish within `timeout_s` or could not start."""
    try:
        done = subprocess.run(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.returncode == 0


def _read_verdicts(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or damaged: the canary runs again
    return data if isinstance(data, dict) else {}


def _record(canary: Canary, verdict: str) -> None:
    verdicts = _read_verdicts(canary.verdicts)
    verdicts[canary.key] = verdict
    try:
        write_whole(canary.verdicts, json.dumps(verdicts, indent=1, sort_keys=True))
    except OSError:
        pass  # the canary runs again next time: slower, not wrong


def canary_key(system_info: str, version: str, model_id: str) -> str:
    """What a verdict holds for: the build (its version and system info), the CPU (its model
    and flags) and the model file."""
    parts = [version, system_info, _cpu_description(), model_id]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _cpu_description() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags")
    lines = [line for line in text.splitlines() if line.split(":")[0].strip() in wanted]
    return "\n".join(dict.fromkeys(lines))  # the first CPU's lines; the others repeat them


def child_command(gguf: Path, threads: int) -> Callable[[str], list[str]]:
    """The argv of a canary child for `gguf`: this interpreter running `mlxmem.engine.canary`."""

    def command(load: str) -> list[str]:
        return [sys.executable, "-m", "mlxmem.engine.canary", str(gguf), load, str(threads)]

    return command


def verdicts_path(directory: Path) -> Path:
    return directory / VERDICTS_FILENAME
