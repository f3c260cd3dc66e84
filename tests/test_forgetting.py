"""Deleted means gone, when the process dies at any step of a deletion: the next command, any
command, finishes the erase before anything reads, caches included."""

import itertools
import os
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import cli, files_containing

from mlxmem import paths
from mlxmem.cli import history as cli_history
from mlxmem.cli import memory as cli_memory
from mlxmem.memory import forget
from mlxmem.memory.store import Store
from mlxmem.memory.tables import db
from mlxmem.memory.tables.tombstones import Tombstone
from mlxmem.memory.tables.turns import insert_turn
from mlxmem.text import utc_now

MARKER = "MARKER-KILL-2718"


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
    # A slot saved in blocks, as both engines save one (MLX arrays or llama.cpp states).
    blocks = paths.cache_dir() / "default-chat.blocks"
    blocks.mkdir()
    (blocks / "0f3a.safetensors").write_bytes(f"kv block {MARKER}".encode())
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


# -- a kill at every file-system call of an erase ---------------------------------------------
# Each case seeds a store once (MARKER in what the command removes, and in a KV cache file);
# every kill point gets a copy. After the kill, any later command runs; then either the command
# had not taken effect (all it would remove is still there, whole) or MARKER is in no file.

NEW_TEXT = "Their code is private."
# A command group of the CLI in a process of its own, without the top-level app's imports (the
# model side, seconds here): the strace sweep starts it some fifty times a command.
CLI_GROUP = (
    "import sys, importlib; group = importlib.import_module('mlxmem.cli.' + sys.argv[1]); "
    "group.app(sys.argv[2:], prog_name='mlxmem ' + sys.argv[1])"
)
STRACE_SYSCALLS = ("rename", "unlink", "fsync", "fdatasync", "ftruncate")
# Each kill point costs a process (about a second here), so by default every syscall for the
# command of the reproduction and a few for the others, whose erase runs the same steps
# (the seam's sweep covers every step of each); MLXMEM_TEST_ALL_KILLS=1 sweeps them all.
KINDS = ("memory rm", "memory edit", "history rm")
STRACE_SWEEPS = [
    (kind, syscall)
    for kind in KINDS
    for syscall in STRACE_SYSCALLS
    if kind == "memory rm"
    or (kind, syscall) in {("memory edit", "rename"), ("memory edit", "fdatasync"),
                           ("history rm", "rename")}
    or os.environ.get("MLXMEM_TEST_ALL_KILLS") == "1"
]  # fmt: skip


def seed_case(kind: str) -> tuple[list[str], Callable[[Store], bool]]:
    """Seed the store for `kind`; return the command and a check that says whether its effect
    is visible (True), or that nothing of it is (False), and fails on anything in between."""
    store = Store()
    with store.connect() as con:  # enough rows that the marker lands in checkpointed blocks
        for i in range(30):
            insert_turn(con, "default", "user" if i % 2 == 0 else "assistant", f"turn {i} " * 20)
    (paths.cache_dir() / "default-chat.safetensors").write_bytes(f"kv {MARKER}".encode())
    # A slot saved in blocks, as both engines save one (MLX arrays or llama.cpp states).
    blocks = paths.cache_dir() / "default-chat.blocks"
    blocks.mkdir()
    (blocks / "0f3a.safetensors").write_bytes(f"kv block {MARKER}".encode())
    if kind in ("history rm", "sync tombstone"):  # a turn with an automatic fact taken from it
        turn = store.append_turn("default", "user", f"my code is {MARKER}")
        fact = store.add_fact(f"Code: {MARKER}", source="automatic", turn_id=turn.id)
        args = ["history", "rm", str(turn.id)]
        if kind == "sync tombstone":  # the turn deleted on another device
            with store.connect() as con:
                (uid,) = con.execute("SELECT uid FROM turns WHERE id = ?", [turn.id]).fetchone()
            args = ["tombstone", uid]
        return args, lambda s: gone(s, fact.id, [turn.id])
    fact = store.add_fact(f"Their code is {MARKER}.")
    if kind == "memory edit":
        return ["memory", "edit", str(fact.id), NEW_TEXT], lambda s: edited(s, fact.id)
    quote = store.append_turn("default", "assistant", f"Noted: {fact.text}")
    args = ["memory", "rm", str(fact.id), "--with-mentions"]
    return args, lambda s: gone(s, fact.id, [quote.id])


def gone(store: Store, fact_id: int, turn_ids: list[int]) -> bool:
    there = [fact_id in {f.id for f in store.facts()}]
    turns = {t.id for t in store.turns("default")}
    there += [tid in turns for tid in turn_ids]
    assert len(set(there)) == 1, f"half a deletion: fact, turns there = {there}"
    return not there[0]


def edited(store: Store, fact_id: int) -> bool:
    (text,) = [f.text for f in store.facts() if f.id == fact_id]
    assert text in (NEW_TEXT, f"Their code is {MARKER}."), text
    return text == NEW_TEXT


def check_after_kill(home: Path, done: Callable[[Store], bool], where: str) -> bool:
    """Run a later command on `home`; return whether the killed command had taken effect."""
    cli("memory", "list")  # any command
    assert [p.name for p in home.iterdir() if ".compact" in p.name] == [], where
    took_effect = done(Store())
    if took_effect:
        assert files_containing(home, MARKER) == [], where
    return took_effect


def sweep(
    kind: str, tmp_path: Path, monkeypatch, killed_at: Callable[[list[str], int], bool]
) -> tuple[int, int]:
    """Kill `kind`'s command at kill point 1, 2, ... until it finishes unkilled; return how many
    kill points there were and at how many of them the command had taken effect."""
    template = tmp_path / "template"
    monkeypatch.setenv("MLXMEM_HOME", str(template))
    args, done = seed_case(kind)
    assert files_containing(template, MARKER)  # not vacuous
    effective = 0
    for n in itertools.count(1):
        home = tmp_path / f"kill-{n}"
        shutil.copytree(template, home)
        monkeypatch.setenv("MLXMEM_HOME", str(home))
        killed = killed_at(args, n)
        if not killed:  # the command ran to its end: past the last kill point
            assert check_after_kill(home, done, "unkilled")
            return n - 1, effective
        effective += check_after_kill(home, done, f"killed at {n}")
        shutil.rmtree(home)


def forked_killed_at(args: list[str], n: int) -> bool:
    """Run `mlxmem ARGS` in a forked process that dies, as kill -9 would (no cleanup, no
    flush), at the n-th step the fault seam sees; return whether it died there."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            steps = itertools.count(1)
            db.fault_hook = lambda name: os._exit(137) if next(steps) == n else None
            if args[0] == "tombstone":  # as a sync merges it
                forget.apply_tombstones(
                    Store(), [Tombstone(args[1], "message", utc_now(), "elsewhere")]
                )
            else:
                group = {"memory": cli_memory.app, "history": cli_history.app}[args[0]]
                group(args[1:], prog_name="mlxmem", standalone_mode=False)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 137), f"the command failed ({code}) at kill point {n}"
    return code == 137


@pytest.mark.parametrize("kind", [*KINDS, "sync tombstone"])
def test_a_kill_at_every_step_of_an_erase_leaves_the_text_in_no_file(kind, tmp_path, monkeypatch):
    """Every step the fault seam sees, exhaustively: each file-system call of the erase that
    mlxmem makes itself, each commit, and each statement of a compaction."""
    points, effective = sweep(kind, tmp_path, monkeypatch, forked_killed_at)
    print(f"{kind}: {points} kill points, {effective} after it took effect")
    assert 0 < effective < points, (points, effective)  # kills before and after it took effect


def strace_killed_at(syscall: str) -> Callable[[list[str], int], bool]:
    def killed_at(args: list[str], n: int) -> bool:
        result = subprocess.run(
            ["strace", "-f", "-qq", "-o", "/dev/null", f"-etrace={syscall}",
             f"-einject={syscall}:signal=SIGKILL:when={n}",
             sys.executable, "-c", CLI_GROUP, *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode in (0, -9), result.stderr
        return result.returncode == -9

    return killed_at


@pytest.fixture(scope="module")
def strace() -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace): no kernel-level kill sweep")
    tried = subprocess.run(["strace", "-qq", "-o", "/dev/null", "true"], capture_output=True)
    if tried.returncode != 0:
        pytest.skip(f"strace cannot trace here: {tried.stderr.decode().strip()}")


@pytest.mark.parametrize(("kind", "syscall"), STRACE_SWEEPS)
def test_sigkill_at_every_file_system_call_of_an_erase(
    kind, syscall, strace, tmp_path, monkeypatch
):
    """A real process killed by the kernel at the n-th call of `syscall` (strace's fault
    injection, which counts per thread), for every n the command reaches, DuckDB's own calls
    included."""
    points, effective = sweep(kind, tmp_path, monkeypatch, strace_killed_at(syscall))
    print(f"{kind} {syscall}: {points} kill points, {effective} after it took effect")
    assert points > 0  # strace's injection works here
