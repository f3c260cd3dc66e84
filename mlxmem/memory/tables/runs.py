"""The benchmark database: each `mlxmem bench` run as one row (the machine, the versions, the
model, the settings and the results, as JSON), in a DuckDB file of its own in the data
directory, apart from the person's chats. mlxmem.bench turns rows into BenchRun records."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import duckdb

from mlxmem import paths
from mlxmem.errors import StoreError
from mlxmem.memory.tables.connect import connect
from mlxmem.memory.tables.migrations import migrate
from mlxmem.memory.tables.rows import one_row

# The columns select_runs returns, in order.
RUN_COLUMNS = ("id", "kind", "created_at", "machine", "versions", "settings", "results")


def insert_run(
    db: str | Path | None,
    kind: str,
    created_at: datetime,
    model: str,
    json_columns: tuple[str, str, str, str],
) -> int:
    """Store a run in the benchmark database `db` (default: bench_db_path()): its kind, time
    (naive UTC), model label, and the machine, versions, settings and results as JSON; return
    its id."""
    with _connect(db) as con:
        (run_id,) = one_row(
            con.execute(
                "INSERT INTO bench_runs (kind, created_at, model, machine, versions, settings,"
                " results) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
                [kind, created_at, model, *json_columns],
            )
        )
    return run_id


def select_runs(
    db: str | Path | None, kind: str | None, run_id: int | None, limit: int
) -> list[tuple]:
    """Stored runs as RUN_COLUMNS rows, newest first (of one `kind`, or run `run_id`, if
    given)."""
    sql = f"SELECT {', '.join(RUN_COLUMNS)} FROM bench_runs"
    where: list[str] = []
    params: list = []
    if kind is not None:
        where.append("kind = ?")
        params.append(kind)
    if run_id is not None:
        where.append("id = ?")
        params.append(run_id)
    if where:
        sql += " WHERE " + " AND ".join(where)
    with _connect(db) as con:
        return con.execute(f"{sql} ORDER BY id DESC LIMIT ?", [*params, limit]).fetchall()


BENCH_DB_FILENAME = "bench.duckdb"


def bench_db_path() -> Path:
    """Where runs are kept by default: their own file in the data directory, apart from the
    person's chats."""
    return paths.data_dir() / BENCH_DB_FILENAME


@contextlib.contextmanager
def _connect(db: str | Path | None) -> Iterator[duckdb.DuckDBPyConnection]:
    path = Path(db).expanduser() if db is not None else bench_db_path()
    try:
        con = connect(str(path))
    except duckdb.Error as exc:
        raise StoreError(f"cannot open the benchmark database {path}: {exc}") from None
    try:
        migrate(con, RUN_MIGRATIONS)
        con.begin()
        yield con
        con.commit()
    except duckdb.Error as exc:
        raise StoreError(f"cannot use the benchmark database {path}: {exc}") from None
    finally:
        con.close()
        if db is None:
            paths.make_private(path)


def b001_runs(con: duckdb.DuckDBPyConnection) -> None:
    # IF NOT EXISTS: the chat database's m004 may have created this table already, when it
    # moved runs recorded before the split into this file.
    con.execute("CREATE SEQUENCE IF NOT EXISTS bench_runs_id_seq START 1")
    con.execute(
        """CREATE TABLE IF NOT EXISTS bench_runs (
            id BIGINT PRIMARY KEY DEFAULT nextval('bench_runs_id_seq'),
            kind VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL,
            model VARCHAR NOT NULL,
            machine VARCHAR NOT NULL,
            versions VARCHAR NOT NULL,
            settings VARCHAR NOT NULL,
            results VARCHAR NOT NULL
        )"""
    )


RUN_MIGRATIONS = [b001_runs]
