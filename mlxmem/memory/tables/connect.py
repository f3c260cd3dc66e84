"""Every DuckDB connection mlxmem opens, opened offline.

DuckDB installs and loads "known" extensions on demand by default: a statement (or a WAL
replay) that names a function of an extension that is not loaded makes it download the
extension from extensions.duckdb.org and load its code. mlxmem makes no network access except
a model download the person asked for, so every connection turns both off; what mlxmem uses
is statically linked into the Python wheel.
"""

from __future__ import annotations

import duckdb

# DuckDB's configuration names (the same in 1.x and 2.x).
OFFLINE_CONFIG: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}


def connect(database: str = ":memory:", read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to `database` that never installs nor loads an extension."""
    return duckdb.connect(database, read_only=read_only, config=dict(OFFLINE_CONFIG))
