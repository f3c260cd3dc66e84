"""Small readers every table's owner shares: the one row of a query that always returns one
row, and this device's id and name (kept in `state` by mlxmem.memory.tables.db).

DuckDB's `fetchone()` is typed as returning a row or None. An aggregate (`count(*)`, `max()`),
`current_database()`, or the RETURNING clause of a one-row INSERT or UPDATE always gives a row:
`one_row` says so, and fails plainly if a query breaks that.
"""

from __future__ import annotations

from typing import Any

import duckdb


def one_row(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...]:
    """The next row of the executed query `result`, which must have one."""
    row = result.fetchone()
    if row is None:
        raise LookupError("the query returned no row, where it always returns one")
    return row


def device_of(con: duckdb.DuckDBPyConnection) -> tuple[str, str]:
    """This data directory's device id and name."""
    rows = dict(
        con.execute(
            "SELECT key, value FROM state WHERE key IN ('device_uid', 'device_name')"
        ).fetchall()
    )
    return rows["device_uid"], rows["device_name"]


def sql_string(value: str) -> str:
    """`value` as an SQL string literal (for statements that take no parameters: ATTACH)."""
    return "'" + value.replace("'", "''") + "'"
