"""How many CPU threads an engine computes with: `--threads`, else `$MLXMEM_THREADS`, else
every core this process may use, a default chosen by measurement (docs/llamacpp.md,
"Threads on a busy machine").

llama.cpp splits each step of its graph among its threads, which meet at an OpenMP barrier
after every step. By default OpenMP's threads spin at a barrier, so a thread whose core
another process took holds the others spinning: beside a 2-thread job on 2 cores a SmolLM2
turn took 4 to 7 times its time alone. With OpenMP's passive wait (mlxmem.engine.llamacpp sets
OMP_WAIT_POLICY) the waiting threads sleep instead: all cores then beat one thread both alone
and beside the job, and the turn beside the job took 1.7 to 2.5 times its time alone.
"""

from __future__ import annotations

import os

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
