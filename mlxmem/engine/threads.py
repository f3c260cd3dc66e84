"""How many CPU threads an engine computes with: `--threads`, else `$MLXMEM_THREADS`, else a
default chosen by measurement (benchmarks/README.md, "Threads").

llama.cpp splits each step of its graph among its threads, which meet at a barrier after
every step and spin while they wait. With as many threads as cores, a thread that another
process has taken the core from holds the others spinning at every barrier: a turn that took
2 s alone took minutes beside a 2-thread job on 2 cores. One core left free keeps the
barriers short on a busy machine, at some cost on a quiet one.
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


def default_threads(cores: int) -> int:
    """All cores but one, from 2 cores up (see the module docstring)."""
    return max(1, cores - 1)


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
        return default_threads(available_cores())
    if requested < 1:
        raise InputError(f"threads must be at least 1, not {requested}")
    return requested
