"""A new data directory survives a kill at any point of its first command, and nothing opens a
network connection: the database is made aside and moved into place whole, a WAL DuckDB fails
to replay on connecting is replayed through an attach, and every connection is offline."""

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from conftest import cli
from test_forgetting import CLI_GROUP, forked_killed_at, strace  # noqa: F401 - a fixture

import mlxmem
from mlxmem import paths
from mlxmem.errors import StoreError
from mlxmem.memory.store import Store
from mlxmem.memory.tables import db
from mlxmem.memory.tables.connect import connect
from mlxmem.memory.tables.migrations import facts_path

FACT = "Their dog is called Biscuit."
FIRST = ["memory", "add", FACT]  # a first command that writes both files of the pair
# The calls that change files: each one is a kill point of the sweep.
FS_CALLS = "write,pwrite64,rename,unlink,fsync,fdatasync,ftruncate,mkdir,rmdir"


def opens_after(home: Path, where: str) -> bool:
    """Any later command opens the store; return whether the first command's fact is there."""
    result = subprocess.run(
        [sys.executable, "-c", CLI_GROUP, "memory", "list"],
        capture_output=True, text=True, env={**os.environ, "MLXMEM_HOME": str(home)},
    )  # fmt: skip
    assert result.returncode == 0, f"{where}: {result.stderr}"
    assert "Traceback" not in result.stderr, where
    leftovers = [p.name for p in home.iterdir() if p.name.endswith((".new", ".wal"))]
    assert leftovers == [], f"{where}: {leftovers}"
    return FACT in result.stdout


def strace_first_run(home: Path, n: int) -> bool:
    """The first command killed by the kernel at its n-th file-changing call (each thread
    counts its own), DuckDB's included; return whether it died."""
    result = subprocess.run(
        ["strace", "-f", "-qq", "-o", "/dev/null", f"-etrace={FS_CALLS}",
         f"-einject={FS_CALLS}:signal=SIGKILL:when={n}", sys.executable, "-c", CLI_GROUP, *FIRST],
        capture_output=True, text=True, timeout=120, env={**os.environ, "MLXMEM_HOME": str(home)},
    )  # fmt: skip
    assert result.returncode in (0, -9), result.stderr
    return result.returncode == -9


def sweep_first_run(tmp_path: Path, killed_at) -> tuple[int, int]:
    """Kill the first command at point 1, 2, ... until it runs to its end; return the kill
    points and how many of them left the fact in."""
    kept = 0
    for n in itertools.count(1):
        home = tmp_path / f"kill-{n}"
        home.mkdir(mode=0o700)
        if not killed_at(home, n):
            assert opens_after(home, "unkilled")
            return n - 1, kept
        kept += opens_after(home, f"killed at {n}")
        shutil.rmtree(home)
    raise AssertionError("unreachable")


def test_a_kill_at_every_step_of_a_first_run_leaves_a_store_that_opens(tmp_path, monkeypatch):
    def killed_at(home: Path, n: int) -> bool:
        monkeypatch.setenv("MLXMEM_HOME", str(home))
        return forked_killed_at(FIRST, n)

    points, kept = sweep_first_run(tmp_path, killed_at)
    print(f"first run: {points} kill points, the fact kept after {kept}")
    assert points >= 5  # the creation's steps are among them


def test_sigkill_at_every_file_system_call_of_a_first_run(strace, tmp_path):  # noqa: F811
    points, kept = sweep_first_run(tmp_path, strace_first_run)
    print(f"first run under strace: {points} kill points, the fact kept after {kept}")
    assert points > 10 and 0 <= kept < points


def test_a_creation_killed_between_its_two_renames_is_made_again():
    """The facts file moved in, the log not: the empty facts file is replaced, not adopted."""
    home = paths.data_dir()

    def stop(name: str) -> None:
        if name == "create:facts-moved":
            raise KeyboardInterrupt

    db.fault_hook = stop
    try:
        with pytest.raises(KeyboardInterrupt):
            Store()
    finally:
        db.fault_hook = None
    assert facts_path(paths.db_path()).exists() and not paths.db_path().exists()
    Store().add_fact(FACT)
    assert [f.text for f in Store().facts()] == [FACT]
    assert sorted(p.name for p in home.iterdir() if "duckdb" in p.name) == [
        "mlxmem.duckdb",
        "mlxmem.duckdb.lock",
        "mlxmem.facts.duckdb",
    ]


def test_a_facts_file_with_facts_but_no_log_is_left_untouched():
    Store().add_fact(FACT)
    paths.db_path().unlink()
    facts = facts_path(paths.db_path())
    before = facts.read_bytes()
    with pytest.raises(StoreError, match="holds 1 facts; mlxmem leaves it untouched"):
        Store()
    assert facts.read_bytes() == before and not paths.db_path().exists()


def first_run_killed_before_its_checkpoint(path: Path, text: str) -> None:
    """A first run as mlxmem made it before: the schema made in the file itself, a turn
    logged, and the process killed before DuckDB checkpointed. DuckDB fails to replay that
    WAL on connecting (a default that names gen_random_uuid)."""
    script = (
        "import duckdb, os, sys; from mlxmem.memory.tables.migrations import attach_facts, migrate;"
        " from mlxmem.memory.tables.turns import insert_turn; con = duckdb.connect(sys.argv[1]);"
        " attach_facts(con); migrate(con); insert_turn(con, 'default', 'user', sys.argv[2]);"
        " os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", script, str(path), text], check=True)


def test_a_wal_duckdb_cannot_replay_on_connecting_is_replayed_and_nothing_lost():
    path = paths.db_path()
    first_run_killed_before_its_checkpoint(path, "I walked Biscuit today.")
    wal = Path(f"{path}.wal")
    assert wal.exists()
    with pytest.raises(duckdb.Error, match="replaying WAL"):  # offline, DuckDB fails so
        connect(str(path)).close()
    assert [t.text for t in Store().turns("default")] == ["I walked Biscuit today."]
    assert not wal.exists()  # replayed into the file and emptied
    cli("history", "list")  # every later command opens it


def test_a_wal_that_cannot_be_replayed_at_all_is_moved_aside_with_one_line():
    first_run_killed_before_its_checkpoint(paths.db_path(), "I walked Biscuit today.")
    wal = Path(f"{paths.db_path()}.wal")
    data = bytearray(wal.read_bytes())
    data[len(data) // 2 :] = b"\xff" * (len(data) - len(data) // 2)  # damaged past its middle
    wal.write_bytes(bytes(data))
    with pytest.warns(UserWarning) as caught:
        turns = Store().turns("default")
    (aside,) = paths.data_dir().glob("mlxmem.duckdb.wal.unreplayable-*")
    assert aside.read_bytes() == bytes(data)  # every byte kept
    assert turns == []  # the file had never been checkpointed: a new database took its place
    message = str(caught[0].message)
    assert "\n" not in message and "could not be replayed" in message and aside.name in message
    cli("memory", "list")  # and every later command opens it


# -- no network -------------------------------------------------------------------------------


def inet_connects(args: list[str], home: Path, timeout: float | None = None) -> list[str]:
    """Run `args` under strace, every connect() and sendto() failing with ENETUNREACH as in a
    network namespace with no interface, and HOME empty (so is DuckDB's extension folder);
    return the attempts to reach an internet address."""
    log = home.parent / f"net-{time.monotonic_ns()}.log"
    empty = home.parent / "empty-home"
    empty.mkdir(exist_ok=True)
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(log), "-etrace=connect,sendto,sendmsg",
         "-einject=connect,sendto,sendmsg:error=ENETUNREACH", *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "MLXMEM_HOME": str(home), "HOME": str(empty)},
    )  # fmt: skip
    text = log.read_text()
    return [line for line in text.splitlines() if re.search(r"AF_INET6?|sin6?_port", line)]


def test_no_connection_attempt_on_a_first_run_a_crash_and_the_recovery(strace, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    python = [sys.executable, "-c", CLI_GROUP]
    # The guard sees DuckDB's own download attempt: a bare connection to a store whose WAL
    # it cannot replay tries to fetch an extension.
    os.environ["MLXMEM_HOME"] = str(home)
    path = paths.db_path()
    first_run_killed_before_its_checkpoint(path, "hello")
    bare = [sys.executable, "-c", f"import duckdb; duckdb.connect({str(path)!r})"]
    assert inet_connects(bare, home), "the guard saw no download attempt"
    assert inet_connects([*python, "memory", "list"], home) == []  # the recovery, offline
    # A first run killed at each step, then the next command: offline throughout.
    for n in (3, 8, 15):
        fresh = tmp_path / f"fresh-{n}"
        fresh.mkdir(mode=0o700)
        strace_first_run(fresh, n)
        assert inet_connects([*python, "memory", "list"], fresh) == [], n
        assert inet_connects([*python, *FIRST], fresh) == [], n


# -- `mlxmem chat ... hi` on an empty data directory, killed at several delays -----------------


@pytest.mark.e2e
def test_chat_killed_at_any_delay_on_an_empty_home_leaves_a_store_every_command_opens(
    tmp_path,
):
    from mlxmem.models.tiny import make_tiny

    tiny = make_tiny(tmp_path / "tiny", seed=3)
    args = [sys.executable, "-m", "mlxmem.cli", "chat", "--model", str(tiny)]
    args += ["--max-tokens", "4", "-m", "hi"]

    def run(home: Path, delay: float | None) -> float:
        start = time.monotonic()
        proc = subprocess.Popen(
            args, env={**os.environ, "MLXMEM_HOME": str(home)}, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        return time.monotonic() - start

    whole = run(tmp_path / "whole", None)  # the delays span a whole run on this machine
    for i, delay in enumerate([0.2 + (whole - 0.2) * k / 7 for k in range(8)]):
        home = tmp_path / f"home-{i}"
        home.mkdir(mode=0o700)
        run(home, delay)
        for command in (["memory", "list"], ["history", "list"]):
            os.environ["MLXMEM_HOME"] = str(home)
            cli(*command)
        assert [p.name for p in home.iterdir() if p.name.endswith(".new")] == []


def test_every_duckdb_connection_goes_through_the_offline_connect():
    """No module opens DuckDB but through mlxmem.memory.tables.connect, which turns extension
    autoinstall and autoload off (checked here on a live connection)."""
    root = Path(mlxmem.__file__).parent  # the whole package, every folder
    direct = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "duckdb.connect(" in path.read_text() and path.name != "connect.py"
    ]
    assert direct == []
    with connect() as con:
        settings = con.execute(
            "SELECT current_setting('autoinstall_known_extensions'),"
            " current_setting('autoload_known_extensions')"
        ).fetchone()
    assert settings == (False, False)
