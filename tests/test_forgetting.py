"""Deleted means gone, when the process dies at any step of a deletion: the next command, any
command, finishes the erase before anything reads, caches included."""

import os
import subprocess
import sys

import pytest
from conftest import cli, files_containing

from mlxmem import paths
from mlxmem.memory.store import Store

MARKER = "MARKER-KILL-2718"
STEPS = ("erase:committed", "erase:facts-written", "erase:caches-wiped", "erase:copied")


def mlxmem_killed_at(step: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLXMEM_CRASH_AT": step}
    return subprocess.run(
        [sys.executable, "-m", "mlxmem_cli", *args], env=env, capture_output=True, timeout=120
    )


def seed(kind: str) -> list[str]:
    """MARKER in what the command deletes (and in a KV cache file); return the command."""
    store = Store()
    for i in range(30):  # enough rows that the marker lands in checkpointed blocks
        store.append_turn("default", "user" if i % 2 == 0 else "assistant", f"turn {i} " * 20)
    if kind == "history rm":
        store.add_fact("Likes tea.")
        store.append_turn("default", "user", f"my code is {MARKER}")
        args = ["history", "rm", "-c", "default", "--all"]
    else:
        fact = store.add_fact(f"Their code is {MARKER}.")
        if kind == "memory rm":
            store.append_turn("default", "assistant", f"Noted: {fact.text}")  # a reply quoting it
            args = ["memory", "rm", str(fact.id), "--with-mentions"]
        else:
            args = ["memory", "clear", "--yes"]
    (paths.cache_dir() / "default-chat.safetensors").write_bytes(f"kv {MARKER}".encode())
    assert files_containing(paths.data_dir(), MARKER)  # not vacuous
    return args


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("kind", ["memory rm", "memory clear", "history rm"])
def test_a_deletion_killed_at_any_step_is_finished_by_the_next_command(kind, step, mlxmem_home):
    killed = mlxmem_killed_at(step, *seed(kind))
    assert killed.returncode == 137, killed.stderr
    cli("history", "list")  # any command
    assert files_containing(mlxmem_home, MARKER) == []
