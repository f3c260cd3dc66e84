"""How a database file comes to be, and how one that a kill left half-made opens again.

A new database (the log and the facts file) is made in a folder beside them, migrated and
checkpointed, and moved into place whole, so that a kill during a first run leaves no database
or a whole one, never a WAL to replay. DuckDB replays the WAL of the file it starts on before
its built-in functions are registered, so a WAL holding a schema change (an older first run, a
migration killed before its checkpoint) fails there; such a WAL is replayed through an attach,
and one that fails there too is moved aside and said, never deleted.

Each function takes the log's path and `step`, called after each file-system step with its
name: the store's fault-injection seam (mlxmem.memory.tables.db.crash_point).
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import duckdb

from mlxmem import paths
from mlxmem.errors import StoreError
from mlxmem.memory.tables.connect import connect
from mlxmem.memory.tables.migrations import FACTS_DB, attach_facts, facts_path, migrate
from mlxmem.memory.tables.rows import one_row, sql_string

Step = Callable[[str], None]
_REPLAY_ALIAS = "mlxmem_replayed"


def new_folder(path: Path) -> Path:
    """The folder a new database is made in, beside `path`."""
    return path.with_name(path.name + ".new")


def connect_replaying(path: Path, step: Step) -> duckdb.DuckDBPyConnection:
    """Connect to the log at `path`; a WAL that DuckDB fails to replay on connecting is
    replayed through an attach (replay_wal) and the connection tried again."""
    try:
        return connect(str(path))
    except duckdb.Error as exc:
        if "replaying WAL" not in str(exc):
            raise
    replay_wal(path, step)
    if not path.exists():  # a blank file whose WAL was set aside (drop_if_blank)
        create_aside(path, step)
    return connect(str(path))


def replay_wal(path: Path, step: Step) -> None:
    """Replay the WAL of the file at `path` into it and empty it. Attached to a running
    instance, a WAL that names a built-in function (a DEFAULT gen_random_uuid()) replays; on
    connecting, DuckDB would look for that function in an extension to download. A WAL that
    fails here too is moved aside, never deleted."""
    mem = connect()
    try:
        mem.execute(f"ATTACH {sql_string(str(path))} AS {_REPLAY_ALIAS}")
        mem.execute(f"CHECKPOINT {_REPLAY_ALIAS}")
        mem.execute(f"DETACH {_REPLAY_ALIAS}")
    except duckdb.IOException as exc:
        if "Could not set lock" in str(exc):
            raise
        set_wal_aside(path, exc)
    except duckdb.Error as exc:
        set_wal_aside(path, exc)
    finally:
        mem.close()
    drop_if_blank(path, step)


def drop_if_blank(path: Path, step: Step) -> None:
    """Remove the file at `path` if it holds no table: a first run (of an older mlxmem) killed
    before its first checkpoint, whose WAL was set aside; a new database takes its place."""
    if Path(f"{path}.wal").exists() or count_tables(path) != 0:
        return
    path.unlink()
    step("create:blank-removed")


def set_wal_aside(path: Path, exc: duckdb.Error) -> None:
    """Move a WAL that cannot be replayed beside the file, under a name that says so, and say
    so in one line: the database opens at its last checkpoint."""
    wal = Path(f"{path}.wal")
    aside = wal.with_name(f"{wal.name}.unreplayable-{time.strftime('%Y%m%dT%H%M%S')}")
    os.replace(wal, aside)
    paths.fsync_path(path.parent)
    reason = str(exc).splitlines()[0]
    warnings.warn(
        f"the database's write-ahead log could not be replayed ({reason}); it was moved to "
        f"{aside} and {path.name} opens without the changes made just before a crash."
        f" Keep {aside.name} to report the problem or restore from a backup; delete it "
        "when you no longer need it (it may hold text you deleted).",
        stacklevel=2,
    )


def create_aside(path: Path, step: Step) -> None:
    """Make a new database (the log and the facts file) in a folder beside them, migrated and
    checkpointed (no WAL to replay), and move it into place: the facts file, then the log,
    whose arrival ends the creation. A kill at any point leaves no database (the next open
    starts again; the folder holds only an empty schema) or a whole one."""
    work = new_folder(path)
    shutil.rmtree(work, ignore_errors=True)
    step("create:leftovers-removed")
    clear_place_for_new(path, step)
    work.mkdir(mode=0o700)
    new = work / path.name
    con = connect(str(new))
    try:
        attach_facts(con)
        migrate(con)
        con.execute(f"CHECKPOINT {FACTS_DB}")
        con.execute("CHECKPOINT")
    finally:
        con.close()
    for made in (new, facts_path(new)):
        paths.make_private(made)
        paths.fsync_path(made)
    step("create:made")
    os.replace(facts_path(new), facts_path(path))
    step("create:facts-moved")
    os.replace(new, path)
    step("create:moved")
    paths.fsync_path(path.parent)
    shutil.rmtree(work, ignore_errors=True)


def clear_place_for_new(path: Path, step: Step) -> None:
    """Before a new database moves in: a facts file without a log is one a creation moved in
    before it was killed (no facts: it goes, with its WAL), or a person's (facts in it, or
    unreadable: refused, untouched); a WAL without its file is moved aside, never replayed
    onto the new one."""
    if Path(f"{path}.wal").exists():
        set_wal_aside(path, duckdb.Error("its database file is missing"))
    facts = facts_path(path)
    if not facts.exists():
        return
    held = count_facts(facts)
    if held != 0:
        what = "cannot be read" if held is None else f"holds {held} facts"
        raise StoreError(
            f"the chat log {path} is missing, but the facts file {facts} "
            f"{what}; mlxmem leaves it untouched: restore the log from a backup, or move "
            f"{facts.name} away to start a new database."
        )
    for leftover in (facts, Path(f"{facts}.wal")):
        leftover.unlink(missing_ok=True)
    step("create:empty-facts-removed")


def count_tables(path: Path) -> int | None:
    """The tables in the database file at `path`, opened read-only; None if it cannot be."""
    mem = connect()
    try:
        mem.execute(f"ATTACH {sql_string(str(path))} AS {_REPLAY_ALIAS} (READ_ONLY)")
        query = "SELECT count(*) FROM duckdb_tables() WHERE database_name = ?"
        return int(one_row(mem.execute(query, [_REPLAY_ALIAS]))[0])
    except duckdb.Error:
        return None
    finally:
        mem.close()


def count_facts(path: Path) -> int | None:
    """The facts in the facts file at `path` (its WAL replayed, the file untouched); None if
    it cannot be read as one."""
    mem = connect()
    try:
        mem.execute(f"ATTACH {sql_string(str(path))} AS {_REPLAY_ALIAS} (READ_ONLY)")
        return int(one_row(mem.execute(f"SELECT count(*) FROM {_REPLAY_ALIAS}.facts"))[0])
    except duckdb.Error:
        return None
    finally:
        mem.close()
