"""How many CPU threads an engine computes with, and how they wait for each other: `--threads`,
else `$MLXMEM_THREADS`, else every core this process may use (docs/llamacpp.md, "Threads on
a busy machine").

llama.cpp splits each step of its graph among its threads, which meet at an OpenMP barrier
after every step, hundreds of times a token. How a thread waits there decides both speeds:
- libgomp's default spins up to 300,000 turns, the whole wait on a quiet machine. Beside
  another busy process, a thread whose core was taken keeps the others spinning: a SmolLM2
  turn beside a 2-thread job on 2 cores took 3.4-3.6x its time alone (4-7x under more load).
- OMP_WAIT_POLICY=passive sleeps at once: 1.2-1.8x beside that job, but a sleep and a
  wake-up at every step decode 2.4x slower on a quiet machine (24 ms a token against 10).
- A short spin, then sleep (GOMP_SPINCOUNT=300): about the quiet machine's speed (turn
  1.50-1.62 s against 1.41 default and 2.18-2.49 passive) and 2.1x beside the job
  (3.21-3.41 s; passive 2.68-4.42). Spinning longer (1,000 to 10,000 turns) won little alone
  and lost beside the job (2.55-3.6x). The MLX engine has no such barrier.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mlxmem.errors import InputError

THREADS_ENV = "MLXMEM_THREADS"


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def engine_threads(requested: int | None = None) -> int:
    """The threads to use: `requested` (--threads), else $MLXMEM_THREADS, else the default."""
    if requested is None:
        raw = os.environ.get(THREADS_ENV, "").strip()
        if raw:
            try:
                requested = int(raw)
            except ValueError:
                raise InputError(f"{THREADS_ENV}={raw!r} is not a number of threads") from None
    if requested is None:
        return available_cores()
    if requested < 1:
        raise InputError(f"threads must be at least 1, not {requested}")
    return requested


SPIN_COUNT = 300  # libgomp's turns of spinning at a barrier before a thread sleeps


def barrier_wait(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make libgomp's threads spin SPIN_COUNT turns at a barrier, then
    sleep (see above); none where the person chose how they wait (OMP_WAIT_POLICY or
    GOMP_SPINCOUNT in `environ`). Effective only before libgomp loads; other OpenMP runtimes
    ignore them."""
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
