"""The one row of a query that always returns one row.

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
