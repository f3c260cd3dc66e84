"""The table `tombstones`: what was deleted (a uid and a time, never its text), so that a
deletion travels to other devices and nothing with that uid comes back. Every write to the
table is here."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

import duckdb

from mlxmem.text import to_db, utc_now

_INSERT = "INSERT INTO tombstones (uid, kind, deleted_at, device_uid)"
# The namespace of the uids given to the losing text of two concurrent edits of a fact.
FORK_NAMESPACE = uuid.UUID("5b0c3f7e-6d1a-4c0e-9a57-2f1d8e3b9c41")


@dataclass(frozen=True)
class Tombstone:
    """A deletion as it travels between devices: what was deleted (a uid), and when."""

    uid: str
    kind: str  # message, fact or conversation
    deleted_at: datetime
    device_uid: str | None = None  # the device that deleted it (None: this one)


def fork_uid(fact_uid: str, version: int, device: str) -> str:
    """The uid of the fact that keeps the text `device` gave fact `fact_uid` at `version`, when
    a concurrent edit elsewhere wins the fact: derived from the edit, so every device that forks
    the same text makes the same fact, and a deletion of that text can name it in advance."""
    return str(uuid.uuid5(FORK_NAMESPACE, f"{fact_uid}:{version}:{device}"))


def add_tombstones(con: duckdb.DuckDBPyConnection, kind: str, table: str, ids: list[int]) -> None:
    """Record that the rows `ids` of `table` (turns or facts) were deleted here and now: their
    uids and the time, never their text, so that the deletion can travel to other devices."""
    con.execute(
        f"{_INSERT} SELECT uid, ?, ?, NULL FROM {table} WHERE list_contains(?, id)"
        " ON CONFLICT DO NOTHING",
        [kind, to_db(utc_now()), ids],
    )


def add_fact_uids(con: duckdb.DuckDBPyConnection, uids: list[str]) -> None:
    """Tombstones, here and now, for facts known by uid only (a fork not stored here yet)."""
    con.execute(
        f"{_INSERT} SELECT unnest(?), 'fact', ?, NULL ON CONFLICT DO NOTHING",
        [uids, to_db(utc_now())],
    )


def add_conversation(con: duckdb.DuckDBPyConnection, uid: str) -> None:
    """This device deleted the conversation `uid` now: a later deletion of a conversation of
    the same name is news again (unpublished, dated now)."""
    con.execute(
        f"{_INSERT} VALUES (?, 'conversation', ?, NULL) ON CONFLICT (uid)"
        " DO UPDATE SET deleted_at = excluded.deleted_at, device_uid = NULL,"
        " published_at = NULL",
        [uid, to_db(utc_now())],
    )


def keep(con: duckdb.DuckDBPyConnection, tombstone: Tombstone, deleted_at: datetime) -> None:
    """Keep another device's tombstone (stored at `deleted_at`, naive UTC): the later time wins."""
    con.execute(
        f"{_INSERT} VALUES (?, ?, ?, ?) ON CONFLICT (uid) DO UPDATE SET"
        " deleted_at = greatest(deleted_at, excluded.deleted_at)",
        [tombstone.uid, tombstone.kind, deleted_at, tombstone.device_uid],
    )


def mark_published(con: duckdb.DuckDBPyConnection, uids: Collection[str]) -> None:
    """This device's own deletions of the conversations `uids` are in the sync folder now (the
    first time only)."""
    con.execute(
        "UPDATE tombstones SET published_at = ? WHERE list_contains(?, uid)"
        " AND kind = 'conversation' AND device_uid IS NULL AND published_at IS NULL",
        [to_db(utc_now()), list(uids)],
    )
