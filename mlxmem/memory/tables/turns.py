"""Layer 2: the chat log. Every turn, whole and unchanged, in conversations."""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import duckdb

from mlxmem.errors import InputError, NotFoundError
from mlxmem.memory.tables.db import Database
from mlxmem.memory.tables.rows import one_row
from mlxmem.memory.tables.terms import index_turns, unindex
from mlxmem.text import ROLES, as_utc, check_new_name, check_text, to_db, utc_now

SEARCH_LIMIT = 50
# Conversations are named, not numbered, across devices: "default" on two devices is one
# conversation, whose uid is derived from its name in this namespace.
CONVERSATION_NAMESPACE = uuid.UUID("6f1f5b0e-3d8a-4c1e-9a57-2b8e4d6c9f13")


@dataclass(frozen=True)
class Conversation:
    id: int
    name: str
    created_at: datetime
    turn_count: int
    private: bool = False  # kept out of recall in every other conversation


@dataclass(frozen=True)
class Turn:
    id: int
    conversation: str
    seq: int
    role: str
    text: str
    created_at: datetime
    token_count: int | None
    interrupted: bool
    sampled_ids: tuple[int, ...] | None = None  # for an assistant turn: the ids it was sampled as
    sampled_by: str | None = None  # the model identity those ids belong to


@dataclass(frozen=True)
class DatedTurn:
    """One turn of a chat log written elsewhere, at a known time (`at`, timezone-aware): what
    TurnLog.import_log loads."""

    conversation: str
    role: str
    text: str
    at: datetime
    token_count: int | None = None


SELECT_TURNS = """SELECT m.id, c.name, m.seq, m.role, m.text, m.created_at, m.token_count,
    m.interrupted, m.sampled_ids, m.sampled_by
    FROM turns m JOIN conversations c ON c.id = m.conversation_id"""
_CONVERSATIONS = """SELECT c.id, c.name, c.created_at, count(m.id), c.private FROM conversations c
    LEFT JOIN turns m ON m.conversation_id = c.id"""


class TurnLog(Database):
    def append_turn(
        self,
        conversation: str,
        role: str,
        text: str,
        token_count: int | None = None,
        interrupted: bool = False,
        sampled_ids: list[int] | None = None,
        sampled_by: str | None = None,
        epoch: int | None = None,
        at: datetime | None = None,
        look_due: bool = False,
        checked: bool = False,
    ) -> Turn:
        """Append a turn; committed before return. Without `epoch` the conversation is
        created on first use. With it (a reply, derived from what the store held at that
        forget epoch) the write is refused with StaleError if anything was deleted since, and
        a deleted conversation is never recreated. `at`: when the turn was written, if not
        now (see insert_turn). `checked`: the caller checked `text` already (the Companion's
        message: a message is checked once on its way through a turn)."""
        if not checked:
            check_text(text, "message")
        with self.guarded(epoch) as con:
            return insert_turn(
                con,
                conversation,
                role,
                text,
                token_count,
                interrupted,
                sampled_ids,
                sampled_by,
                create=epoch is None,
                at=at,
                look_due=look_due,
            )

    def looks_due(self, conversation: str) -> list[Turn]:
        """The person's messages in `conversation` whose look for a fact is still to come,
        oldest first (see insert_turn's `look_due`)."""
        with self.connect() as con:
            rows = con.execute(
                f"{SELECT_TURNS} WHERE c.name = ? AND m.look_due ORDER BY m.seq", [conversation]
            ).fetchall()
        return [turn_of(row) for row in rows]

    def import_log(self, turns: Sequence[DatedTurn]) -> int:
        """Append a dated chat log's turns in one transaction (see import_turns); return how
        many."""
        with self.connect() as con:
            return import_turns(con, turns)

    def turns(self, conversation: str, after_seq: int | None = None) -> list[Turn]:
        """The turns of `conversation` in order (those after `after_seq` if given)."""
        with self.connect() as con:
            return turns_after(con, conversation, after_seq)

    def get_turn(self, turn_id: int) -> Turn:
        with self.connect() as con:
            return get_turn(con, turn_id)

    def conversation(self, name: str) -> Conversation:
        with self.connect() as con:
            row = con.execute(f"{_CONVERSATIONS} WHERE c.name = ? GROUP BY ALL", [name]).fetchone()
        if row is None:
            raise NotFoundError(f"no conversation named {name!r}")
        return _conversation(row)

    def set_private(self, name: str, private: bool = True, create: bool = False) -> Conversation:
        """Keep a conversation out of recall in the others (or let it back in). With `create`,
        a conversation not yet written to is created, so that its first turn is private."""
        check_text(name, "conversation name", allow_empty=False)
        with self.connect() as con:
            now = utc_now()
            cid = conversation_id(con, name, create=now if create else None, new=True)
            # A change is a new version of the flag, which sync carries (records.py); setting
            # it to what it is changes nothing.
            con.execute(
                "UPDATE conversations SET private = $1, private_version = private_version + 1,"
                " private_at = $2, private_device = NULL WHERE id = $3 AND private <> $1",
                [private, to_db(now), cid],
            )
            row = one_row(con.execute(f"{_CONVERSATIONS} WHERE c.id = ? GROUP BY ALL", [cid]))
        return _conversation(row)

    def check_name(self, name: str) -> str:
        """`name`, if a conversation may be opened under it: one this log holds (made before,
        or on another device), or a new name check_new_name accepts; else InputError. For
        front ends to call before a model loads, so that a bad name fails at once."""
        with self.connect() as con:
            held = con.execute("SELECT 1 FROM conversations WHERE name = ?", [name]).fetchone()
        return name if held else check_new_name(name)

    def private_conversations(self) -> set[str]:
        """The names of the conversations kept out of recall (set_private): one read of the
        conversations table, where `conversations()` also counts every turn."""
        with self.connect() as con:
            rows = con.execute("SELECT name FROM conversations WHERE private").fetchall()
        return {name for (name,) in rows}

    def conversations(self) -> list[Conversation]:
        with self.connect() as con:
            rows = con.execute(f"{_CONVERSATIONS} GROUP BY ALL ORDER BY c.id").fetchall()
        return [_conversation(row) for row in rows]

    def search(
        self,
        query: str,
        conversation: str | None = None,
        limit: int = SEARCH_LIMIT,
        shared_only: bool = False,
    ) -> list[Turn]:
        """Turns containing `query` (case-insensitive), newest first; `shared_only`: none of
        a conversation kept private (set_private)."""
        check_text(query, "search query", allow_empty=False)
        pattern = "%" + re.sub(r"([\\%_])", r"\\\1", query) + "%"
        sql = f"{SELECT_TURNS} WHERE m.text ILIKE ? ESCAPE '\\'"
        params: list = [pattern]
        if conversation is not None:
            sql += " AND c.name = ?"
            params.append(conversation)
        if shared_only:
            sql += " AND NOT c.private"
        with self.connect() as con:
            rows = con.execute(f"{sql} ORDER BY m.id DESC LIMIT ?", [*params, limit]).fetchall()
        return [turn_of(row) for row in rows]


def insert_turn(
    con: duckdb.DuckDBPyConnection,
    conversation: str,
    role: str,
    text: str,
    token_count: int | None = None,
    interrupted: bool = False,
    sampled_ids: list[int] | None = None,
    sampled_by: str | None = None,
    create: bool = True,
    at: datetime | None = None,
    look_due: bool = False,
) -> Turn:
    """Append a turn inside an open transaction (see TurnLog.append_turn), written at time `at`
    (timezone-aware; default now): a turn written elsewhere first, such as a chat log being
    imported or replayed, keeps its own time, which the window, recall and summaries show.
    Either way it is recorded no older than the conversation's newest turn. `look_due`: a
    person's message to look at for a fact (until clear_looks). `text` is checked by the
    caller (TurnLog.append_turn, or the Companion's checked_message: a message is checked
    once on its way through a turn)."""
    if role not in ROLES:
        raise InputError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    check_text(conversation, "conversation name", allow_empty=False)
    now = utc_now() if at is None else turn_time(at)
    cid = conversation_id(con, conversation, create=now if create else None, new=True)
    # A turn is never older than the turns before it, whatever this device's clock says:
    # devices order a conversation by time, so each device's own order must agree with it.
    (latest,) = one_row(
        con.execute("SELECT max(created_at) FROM turns WHERE conversation_id = ?", [cid])
    )
    if latest is not None and as_utc(latest) >= now:
        now = as_utc(latest) + timedelta(microseconds=1)
    (seq,) = one_row(
        con.execute(
            "UPDATE conversations SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq",
            [cid],
        )
    )
    (mid,) = one_row(
        con.execute(
            "INSERT INTO turns (conversation_id, seq, role, text, created_at, token_count,"
            " interrupted, sampled_ids, sampled_by, look_due)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            [
                cid,
                seq,
                role,
                text,
                to_db(now),
                token_count,
                interrupted,
                sampled_ids,
                sampled_by,
                look_due,
            ],
        )
    )
    index_turns(con, [(mid, text)])  # recall's index, in the same transaction
    ids = None if sampled_ids is None else tuple(sampled_ids)
    return Turn(mid, conversation, seq, role, text, now, token_count, interrupted, ids, sampled_by)


def insert_synced_turns(
    con: duckdb.DuckDBPyConnection,
    conversation_id: int,
    rows: list[tuple[int, str, str, datetime, bool, str, str | None]],
) -> None:
    """Insert turns another device wrote, as they were written there: (seq, role, text,
    created_at, interrupted, uid, device_uid) each, numbered by the caller (sync's merge), and
    index them for recall, in the caller's transaction. One statement for all of them (row by
    row is ~4 ms a turn)."""
    if not rows:
        return
    columns = [list(column) for column in zip(*rows, strict=True)]
    inserted = con.execute(
        "INSERT INTO turns (conversation_id, seq, role, text, created_at, interrupted, uid,"
        " device_uid) SELECT ?, unnest(?), unnest(?), unnest(?), unnest(?), unnest(?),"
        " unnest(?), unnest(?::VARCHAR[]) RETURNING id, text",
        [conversation_id, *columns],
    ).fetchall()
    index_turns(con, inserted)


def import_turns(con: duckdb.DuckDBPyConnection, turns: Sequence[DatedTurn]) -> int:
    """Append a dated log's turns in the order given, inside the caller's transaction, with one
    statement per table however many there are (row by row is ~4 ms a turn; a million load in
    seconds this way), and index them for recall. A conversation missing is created at its
    first turn's time. Each conversation's turns must be in time order, none older than those
    it holds, as insert_turn keeps them: InputError otherwise (the caller's transaction then
    writes nothing). Message ids follow the order given."""
    rows: list[tuple[int, int, str, str, datetime, int | None]] = []
    ends: dict[str, tuple[int, int, datetime | None]] = {}  # name: (id, last seq, newest time)
    for n, turn in enumerate(turns, 1):
        if turn.role not in ROLES:
            raise InputError(f"turn {n}: role must be one of {', '.join(ROLES)}, not {turn.role!r}")
        check_text(turn.text, f"turn {n}'s text")
        at = turn_time(turn.at)
        if turn.conversation not in ends:
            check_text(turn.conversation, "conversation name", allow_empty=False)
            cid = conversation_id(con, turn.conversation, create=at, new=True)
            last_seq, newest = one_row(
                con.execute(
                    "SELECT c.last_seq, max(m.created_at) FROM conversations c LEFT JOIN"
                    " turns m ON m.conversation_id = c.id WHERE c.id = ? GROUP BY ALL",
                    [cid],
                )
            )
            ends[turn.conversation] = (cid, last_seq, newest and as_utc(newest))
        cid, seq, newest = ends[turn.conversation]
        if newest is not None and at < newest:
            raise InputError(
                f"turn {n} ({at.isoformat()}) is older than the turn before it in conversation"
                f" {turn.conversation!r}: a log's turns are imported in time order"
            )
        ends[turn.conversation] = (cid, seq + 1, at)
        rows.append((cid, seq + 1, turn.role, turn.text, to_db(at), turn.token_count))
    if not rows:
        return 0
    columns = [list(column) for column in zip(*rows, strict=True)]
    inserted = con.execute(
        "INSERT INTO turns (conversation_id, seq, role, text, created_at, token_count)"
        " SELECT cid, seq, role, text, created, tokens FROM (SELECT unnest(?::BIGINT[]) AS cid,"
        " unnest(?::BIGINT[]) AS seq, unnest(?::VARCHAR[]) AS role, unnest(?::VARCHAR[]) AS text,"
        " unnest(?::TIMESTAMP[]) AS created, unnest(?::INTEGER[]) AS tokens,"
        " unnest(range(?)) AS k) ORDER BY k RETURNING id, text",
        [*columns, len(rows)],
    ).fetchall()
    for cid, last_seq, _ in ends.values():
        con.execute("UPDATE conversations SET last_seq = ? WHERE id = ?", [last_seq, cid])
    index_turns(con, inserted)
    return len(rows)


def delete_turn_rows(con: duckdb.DuckDBPyConnection, ids: list[int]) -> None:
    """Delete turns and their rows in recall's index, inside the caller's erase."""
    unindex(con, ids)
    con.execute("DELETE FROM turns WHERE list_contains(?, id)", [ids])


def turn_time(at: datetime) -> datetime:
    """`at` as a turn's time (UTC); a time without a time zone is refused, not guessed."""
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InputError(f"a turn's time must be a datetime with a time zone, not {at!r}")
    return at.astimezone(timezone.utc)


def turns_after(
    con: duckdb.DuckDBPyConnection, conversation: str, after_seq: int | None
) -> list[Turn]:
    rows = con.execute(
        f"{SELECT_TURNS} WHERE c.name = ? AND m.seq > ? ORDER BY m.seq",
        [conversation, after_seq or 0],
    ).fetchall()
    return [turn_of(row) for row in rows]


def clear_looks(con: duckdb.DuckDBPyConnection, turn_ids: Sequence[int]) -> None:
    """The looks for a fact at these turns are done (inside an open transaction)."""
    if turn_ids:
        con.execute(
            "UPDATE turns SET look_due = false WHERE list_contains(?, id)", [list(turn_ids)]
        )


def conversation_id(
    con: duckdb.DuckDBPyConnection, name: str, create: datetime | None = None, new: bool = False
) -> int:
    """The id of conversation `name`; created at time `create` if given and missing, with a
    name check_new_name accepts if `new` (made here, not merged from another device)."""
    row = con.execute("SELECT id FROM conversations WHERE name = ?", [name]).fetchone()
    if row is not None:
        return row[0]
    if create is None:
        raise NotFoundError(f"no conversation named {name!r}")
    if new:
        check_new_name(name)
    return one_row(
        con.execute(
            "INSERT INTO conversations (name, created_at) VALUES (?, ?) RETURNING id",
            [name, to_db(create)],
        )
    )[0]


def keep_private_after_deletion(
    con: duckdb.DuckDBPyConnection, cid: int, deleted_at: datetime
) -> None:
    """Conversation `cid` was deleted on one device while another wrote turns to it, which
    keep it alive: its turns stay out of recall (private) on every device until the person
    lets them back in, whatever the flag was (the device that deleted no longer knows it).
    The flag starts again at version 1, as a conversation made anew does, stamped after the
    deletion (`deleted_at`, naive UTC), so that the device which deleted takes it."""
    stamp = max(to_db(utc_now()), deleted_at + timedelta(microseconds=1))
    con.execute(
        "UPDATE conversations SET private = true, private_version = 1, private_at = ?,"
        " private_device = NULL WHERE id = ?",
        [stamp, cid],
    )


@functools.lru_cache(maxsize=4096)  # a sync names every turn's conversation: 100,000 uuid5s
def conversation_uid(name: str) -> str:
    """The globally unique id of the conversation named `name`, the same on every device."""
    return str(uuid.uuid5(CONVERSATION_NAMESPACE, name))


def get_turn(con: duckdb.DuckDBPyConnection, turn_id: int) -> Turn:
    row = con.execute(f"{SELECT_TURNS} WHERE m.id = ?", [turn_id]).fetchone()
    if row is None:
        raise NotFoundError(f"no turn with id {turn_id}")
    return turn_of(row)


def turn_of(row: tuple) -> Turn:
    ids = None if row[8] is None else tuple(row[8])
    return Turn(row[0], row[1], row[2], row[3], row[4], as_utc(row[5]), row[6], row[7], ids, row[9])


def _conversation(row: tuple) -> Conversation:
    return Conversation(row[0], row[1], as_utc(row[2]), row[3], bool(row[4]))


def drop_conversation_row(con: duckdb.DuckDBPyConnection, cid: int) -> None:
    """Conversation `cid`'s own row, inside the caller's erase (its turns and summaries first)."""
    con.execute("DELETE FROM conversations WHERE id = ?", [cid])


def set_private(
    con: duckdb.DuckDBPyConnection,
    cid: int,
    private: bool,
    version: int,
    at: datetime,
    device: str | None,
) -> None:
    """Conversation `cid`'s private flag as another device set it (`device`; None: this one)."""
    con.execute(
        "UPDATE conversations SET private = ?, private_version = ?, private_at = ?,"
        " private_device = ? WHERE id = ?",
        [private, version, to_db(at), device, cid],
    )


def renumber(con: duckdb.DuckDBPyConnection, cid: int, last_seq: int, seqs: dict[int, int]) -> None:
    """Give turns new numbers (`seqs`: turn id to seq) after a merge put other turns among
    them, and conversation `cid` its new last seq."""
    con.execute("UPDATE conversations SET last_seq = ? WHERE id = ?", [last_seq, cid])
    if seqs:
        con.execute(
            "UPDATE turns SET seq = m.seq FROM (SELECT unnest(?) AS id, unnest(?) AS seq) m"
            " WHERE turns.id = m.id",
            [list(seqs), list(seqs.values())],
        )
