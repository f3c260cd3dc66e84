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
        [sys.executable, "-m", "mlxmem.cli", *args], env=env, capture_output=True, timeout=120
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


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32M", "tmpfs", str(mount)],
                          capture_output=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_fails_cleanly_and_the_next_command_finishes_the_erase(small_disk, monkeypatch):
    """history rm rewrites the log's file; with room for the delete but not for the rewritten
    copy it fails cleanly, and the next command finishes the erase. (Erasing a fact rewrites
    only the small facts file, which a nearly full disk still takes.)"""
    home = small_disk / "home"
    monkeypatch.setenv("MLXMEM_HOME", str(home))
    store = Store()
    for i in range(100):
        store.append_turn("default", "user" if i % 2 == 0 else "assistant", f"turn {i} " * 40)
    turn = store.append_turn("default", "user", f"my code is {MARKER}")
    (paths.cache_dir() / "default-chat.safetensors").write_bytes(f"kv {MARKER}".encode())
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # leave room for the delete, not for a compacted copy
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        f.write(b"\0" * max(0, free - store.path.stat().st_size // 8))
    result = subprocess.run(
        [sys.executable, "-m", "mlxmem.cli", "history", "rm", str(turn.id)],
        capture_output=True, text=True, env={**os.environ, "MLXMEM_NO_OPENBLAS": "1"},
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr.startswith("Error:"), result.stderr
    assert "Traceback" not in result.stderr
    assert not list(paths.cache_dir().iterdir())  # the caches went with the delete
    assert [p.name for p in home.iterdir() if ".compact" in p.name] == []
    filler.unlink()  # space is freed
    cli("memory", "list")
    assert files_containing(small_disk, MARKER) == []
    assert len(Store().turns("default")) == 100
