"""Layers 2 and 3: the chat log and the facts about the person, in one DuckDB file.

The file is never held open between operations: DuckDB lets only one process open a file for
writing, and the chat process shares it with `mlxmem memory` and `mlxmem history`. Every
operation takes a lock file, opens the database, works in one transaction and closes it.

Deleted means gone: DuckDB keeps the bytes of deleted or updated rows in the file (after DELETE,
CHECKPOINT and VACUUM alike), so every delete or edit ends with a compaction that copies the live
data into a fresh file and atomically replaces the old one.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import duckdb

from mlxmem import paths
from mlxmem.errors import InputError, NotFoundError, StoreError
from mlxmem.memory.migrations import migrate

ROLES = ("user", "assistant")
SOURCES = ("manual", "automatic")
SEARCH_LIMIT = 50
LOCK_TIMEOUT_S = 5.0
# Set in the same transaction as a delete, cleared only in the compacted copy: a crash between
# the delete and the file replacement is finished at the next open.
_COMPACTION_PENDING = "compaction_pending"
_COMPACT_ALIAS = "mlxmem_compacted"
_FORGET_EPOCH = "forget_epoch"
T = TypeVar("T")


@dataclass(frozen=True)
class Conversation:
    id: int
    name: str
    created_at: datetime
    message_count: int


@dataclass(frozen=True)
class Message:
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
class Summary:
    id: int
    conversation: str
    text: str
    first_seq: int
    last_seq: int
    token_count: int | None
    created_at: datetime


@dataclass(frozen=True)
class Fact:
    id: int
    text: str
    source: str
    created_at: datetime
    updated_at: datetime
    message_id: int | None


@dataclass(frozen=True)
class Deletion:
    """What a delete removed: the caller rebuilds these conversations' windows and caches."""

    messages: list[Message]
    summaries: list[Summary]
    conversations: list[str]


@dataclass(frozen=True)
class Snapshot:
    facts: list[Fact]
    summary: Summary | None
    turns: list[Message]  # the verbatim window: turns after the summary's range
    forget_epoch: int


_MESSAGES = """SELECT m.id, c.name, m.seq, m.role, m.text, m.created_at, m.token_count,
    m.interrupted, m.sampled_ids, m.sampled_by
    FROM messages m JOIN conversations c ON c.id = m.conversation_id"""
_SUMMARIES = """SELECT s.id, c.name, s.text, s.first_seq, s.last_seq, s.token_count,
    s.created_at FROM summaries s JOIN conversations c ON c.id = s.conversation_id"""
_FACTS = "SELECT id, text, source, created_at, updated_at, message_id FROM facts"
_CONVERSATIONS = """SELECT c.id, c.name, c.created_at, count(m.id) FROM conversations c
    LEFT JOIN messages m ON m.conversation_id = c.id"""


class Store:
    """The chat log and the facts, in the DuckDB file at `path` (default: paths.db_path())."""

    def __init__(self, path: str | Path | None = None, timeout: float = LOCK_TIMEOUT_S):
        self.path = Path(path) if path is not None else paths.db_path()
        self.timeout = timeout
        paths.ensure_private_dir(self.path.parent)
        with self._lock():
            with self._transaction() as con:
                pending = con.execute(
                    "SELECT count(*) FROM state WHERE key = ?", [_COMPACTION_PENDING]
                ).fetchone()[0]
            if pending:
                self._compact_locked()

    # -- opening, locking, compacting -------------------------------------------------------

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One operation: lock, open, run a transaction, commit, close. Do not nest."""
        with self._lock(), self._transaction() as con:
            yield con

    def compact(self) -> None:
        """Rewrite the file so that the bytes of deleted rows leave the disk."""
        with self._lock():
            self._compact_locked()

    @contextmanager
    def _forgetting(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Like connect(), for work that removes text: compacts before releasing the lock."""
        with self._lock():
            with self._transaction() as con:
                yield con
                con.execute("INSERT OR REPLACE INTO state VALUES (?, '1')", [_COMPACTION_PENDING])
                # A chat running in another process compares this before saving its KV cache.
                con.execute(
                    "INSERT OR REPLACE INTO state SELECT ?, CAST(coalesce(max(CAST(value AS"
                    " BIGINT)), 0) + 1 AS VARCHAR) FROM state WHERE key = ?",
                    [_FORGET_EPOCH, _FORGET_EPOCH],
                )
            self._compact_locked()

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        con = self._open()
        try:
            con.begin()
            yield con
            con.commit()
        finally:
            con.close()  # rolls back an uncommitted transaction
            self._make_files_private()

    @contextmanager
    def _lock(self) -> Iterator[None]:
        # DuckDB's own lock lives on the database file, which compaction replaces: a separate
        # lock file keeps other mlxmem processes out from the delete until the replacement.
        fd = os.open(self._sibling(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            self._retry(lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB), self._holder_pid)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)

    def _open(self) -> duckdb.DuckDBPyConnection:
        con = self._retry(lambda: duckdb.connect(str(self.path)), lambda: "unknown")
        try:
            migrate(con)
        except duckdb.Error as exc:
            con.close()
            raise StoreError(f"cannot read the database {self.path}: {exc}") from None
        return con

    def _retry(self, attempt: Callable[[], T], holder_pid: Callable[[], str]) -> T:
        """Call attempt() until it stops failing on a lock held elsewhere, up to the timeout."""
        deadline = time.monotonic() + self.timeout
        delay = 0.005
        while True:
            try:
                return attempt()
            except BlockingIOError:
                pid = holder_pid()
            except duckdb.IOException as exc:
                if "Could not set lock" not in str(exc):
                    raise self._open_error(exc) from None
                found = re.search(r"PID (\d+)", str(exc))
                pid = found.group(1) if found else "unknown"
            except duckdb.Error as exc:
                raise self._open_error(exc) from None
            if time.monotonic() > deadline:
                raise self._busy_error(pid)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _busy_error(self, pid: str) -> StoreError:
        if pid == str(os.getpid()):
            return StoreError(f"database {self.path} is already open in this process (nested use?)")
        return StoreError(f"database is in use by another process (pid {pid}): {self.path}")

    def _open_error(self, exc: duckdb.Error) -> StoreError:
        if "not a valid DuckDB database file" in str(exc):
            return StoreError(
                f"{self.path} is not a DuckDB database (corrupt, or another kind of file). "
                "mlxmem leaves it untouched: move it away to start a new database, "
                "or restore it from a backup."
            )
        return StoreError(f"cannot open the database {self.path}: {exc}")

    def _holder_pid(self) -> str:
        try:
            return self._sibling(".lock").read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def _compact_locked(self) -> None:
        try:
            self._write_compacted_copy()
        except duckdb.Error as exc:
            raise StoreError(
                f"the deletion is saved, but its old bytes could not be erased from {self.path} "
                f"yet ({exc}); mlxmem retries when it next opens the database"
            ) from None

    def _write_compacted_copy(self) -> None:
        tmp = self._sibling(".compact")
        for leftover in (tmp, Path(f"{tmp}.wal")):
            leftover.unlink(missing_ok=True)
        con = self._open()
        try:
            con.execute("CHECKPOINT")  # empties the WAL, which belongs to the old file
            source = con.execute("SELECT current_database()").fetchone()[0]
            con.execute(f"ATTACH {_sql_string(str(tmp))} AS {_COMPACT_ALIAS}")
            con.execute(f"COPY FROM DATABASE {_sql_ident(source)} TO {_COMPACT_ALIAS}")
            con.execute(f"DELETE FROM {_COMPACT_ALIAS}.state WHERE key = ?", [_COMPACTION_PENDING])
            con.execute(f"DETACH {_COMPACT_ALIAS}")
        finally:
            con.close()
        # A WAL left by the old file would be replayed onto the new one.
        if self._sibling(".wal").exists() or Path(f"{tmp}.wal").exists():
            tmp.unlink(missing_ok=True)
            raise StoreError(f"could not compact {self.path}: its write-ahead log stayed behind")
        paths.make_private(tmp)
        _fsync(tmp)
        os.replace(tmp, self.path)
        _fsync(self.path.parent)

    def _sibling(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def _make_files_private(self) -> None:
        for path in (self.path, self._sibling(".wal")):
            paths.make_private(path)

    # -- layer 2: the chat log ---------------------------------------------------------------

    def append_message(
        self,
        conversation: str,
        role: str,
        text: str,
        token_count: int | None = None,
        interrupted: bool = False,
        sampled_ids: list[int] | None = None,
        sampled_by: str | None = None,
    ) -> Message:
        """Append a turn (creating the conversation on first use); committed before return."""
        _check_choice(role, ROLES, "role")
        _check_text(text, "message")
        _check_text(conversation, "conversation name", allow_empty=False)
        now = _now()
        with self.connect() as con:
            cid = _conversation_id(con, conversation, create=now)
            seq = con.execute(
                "SELECT coalesce(max(seq), 0) + 1 FROM messages WHERE conversation_id = ?", [cid]
            ).fetchone()[0]
            (mid,) = con.execute(
                "INSERT INTO messages (conversation_id, seq, role, text, created_at, token_count,"
                " interrupted, sampled_ids, sampled_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " RETURNING id",
                [cid, seq, role, text, now, token_count, interrupted, sampled_ids, sampled_by],
            ).fetchone()
        ids = None if sampled_ids is None else tuple(sampled_ids)
        return Message(
            mid, conversation, seq, role, text, _utc(now), token_count, interrupted, ids, sampled_by
        )

    def messages(self, conversation: str, after_seq: int | None = None) -> list[Message]:
        """The turns of `conversation` in order (those after `after_seq` if given)."""
        with self.connect() as con:
            return _messages_after(con, conversation, after_seq)

    def snapshot(self, conversation: str) -> Snapshot:
        """Everything a turn reads, in one open of the file: the facts, the newest summary,
        the turns after it, and the forget epoch."""
        with self.connect() as con:
            summary = _latest_summary(con, conversation)
            return Snapshot(
                facts=[_fact(row) for row in con.execute(f"{_FACTS} ORDER BY id").fetchall()],
                summary=summary,
                turns=_messages_after(con, conversation, summary and summary.last_seq),
                forget_epoch=_forget_epoch(con),
            )

    def forget_epoch(self) -> int:
        """Counts deletions and edits: a KV cache built before a change may hold removed text."""
        with self.connect() as con:
            return _forget_epoch(con)

    def get_message(self, message_id: int) -> Message:
        with self.connect() as con:
            return _get_message(con, message_id)

    def conversation(self, name: str) -> Conversation:
        with self.connect() as con:
            row = con.execute(f"{_CONVERSATIONS} WHERE c.name = ? GROUP BY ALL", [name]).fetchone()
        if row is None:
            raise NotFoundError(f"no conversation named {name!r}")
        return _conversation(row)

    def conversations(self) -> list[Conversation]:
        with self.connect() as con:
            rows = con.execute(f"{_CONVERSATIONS} GROUP BY ALL ORDER BY c.id").fetchall()
        return [_conversation(row) for row in rows]

    def search(
        self, query: str, conversation: str | None = None, limit: int = SEARCH_LIMIT
    ) -> list[Message]:
        """Turns containing `query` (case-insensitive), newest first."""
        _check_text(query, "search query", allow_empty=False)
        pattern = "%" + re.sub(r"([\\%_])", r"\\\1", query) + "%"
        sql = f"{_MESSAGES} WHERE m.text ILIKE ? ESCAPE '\\'"
        params: list = [pattern]
        if conversation is not None:
            sql += " AND c.name = ?"
            params.append(conversation)
        with self.connect() as con:
            rows = con.execute(f"{sql} ORDER BY m.id DESC LIMIT ?", [*params, limit]).fetchall()
        return [_message(row) for row in rows]

    def delete_messages(self, ids: list[int]) -> Deletion:
        """Delete turns by id, and every summary whose range covers one of them."""
        with self._forgetting() as con:
            victims = [_get_message(con, mid) for mid in dict.fromkeys(ids)]
            return _delete_turns(con, victims)

    def delete_message_range(self, conversation: str, first_seq: int, last_seq: int) -> Deletion:
        """Delete the turns first_seq..last_seq (inclusive) of `conversation`."""
        if first_seq > last_seq:
            raise InputError(f"empty range: {first_seq} is after {last_seq}")
        with self._forgetting() as con:
            _conversation_id(con, conversation)
            rows = con.execute(
                f"{_MESSAGES} WHERE c.name = ? AND m.seq BETWEEN ? AND ? ORDER BY m.seq",
                [conversation, first_seq, last_seq],
            ).fetchall()
            if not rows:
                raise NotFoundError(
                    f"no turns {first_seq}..{last_seq} in conversation {conversation!r}"
                )
            return _delete_turns(con, [_message(row) for row in rows])

    def delete_conversation(self, name: str) -> Deletion:
        """Delete a conversation with all its turns and summaries."""
        with self._forgetting() as con:
            cid = _conversation_id(con, name)
            rows = con.execute(f"{_MESSAGES} WHERE c.id = ? ORDER BY m.seq", [cid]).fetchall()
            deletion = _delete_turns(con, [_message(row) for row in rows])
            rest = con.execute(f"{_SUMMARIES} WHERE c.id = ?", [cid]).fetchall()
            con.execute("DELETE FROM summaries WHERE conversation_id = ?", [cid])
            con.execute("DELETE FROM conversations WHERE id = ?", [cid])
        summaries = deletion.summaries + [_summary(row) for row in rest]
        return Deletion(deletion.messages, summaries, [name])

    # -- summaries ---------------------------------------------------------------------------

    def add_summary(
        self, conversation: str, text: str, first_seq: int, last_seq: int, token_count: int | None
    ) -> Summary:
        """Record a summary of the turns first_seq..last_seq of `conversation`."""
        _check_text(text, "summary")
        if first_seq > last_seq:
            raise InputError(f"empty range: {first_seq} is after {last_seq}")
        now = _now()
        with self.connect() as con:
            cid = _conversation_id(con, conversation)
            (sid,) = con.execute(
                "INSERT INTO summaries (conversation_id, text, first_seq, last_seq, token_count,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                [cid, text, first_seq, last_seq, token_count, now],
            ).fetchone()
        return Summary(sid, conversation, text, first_seq, last_seq, token_count, _utc(now))

    def latest_summary(self, conversation: str) -> Summary | None:
        """The summary reaching furthest into `conversation`, or None."""
        with self.connect() as con:
            return _latest_summary(con, conversation)

    def summaries(self, conversation: str) -> list[Summary]:
        with self.connect() as con:
            rows = con.execute(f"{_SUMMARIES} WHERE c.name = ? ORDER BY s.id", [conversation])
            return [_summary(row) for row in rows.fetchall()]

    # -- layer 3: facts ----------------------------------------------------------------------

    def facts(self) -> list[Fact]:
        with self.connect() as con:
            return [_fact(row) for row in con.execute(f"{_FACTS} ORDER BY id").fetchall()]

    def get_fact(self, fact_id: int) -> Fact:
        with self.connect() as con:
            return _get_fact(con, fact_id)

    def add_fact(self, text: str, source: str = "manual", message_id: int | None = None) -> Fact:
        """Add a fact; `message_id` names the turn it was extracted from, if any."""
        text = _check_text(text, "fact", allow_empty=False).strip()
        _check_choice(source, SOURCES, "source")
        now = _now()
        with self.connect() as con:
            if message_id is not None:
                _get_message(con, message_id)
            (fid,) = con.execute(
                "INSERT INTO facts (text, source, created_at, updated_at, message_id)"
                " VALUES (?, ?, ?, ?, ?) RETURNING id",
                [text, source, now, now, message_id],
            ).fetchone()
        return Fact(fid, text, source, _utc(now), _utc(now), message_id)

    def edit_fact(self, fact_id: int, text: str) -> Fact:
        """Replace a fact's text; the old text is compacted out of the file."""
        text = _check_text(text, "fact", allow_empty=False).strip()
        with self._forgetting() as con:
            _get_fact(con, fact_id)
            con.execute(
                "UPDATE facts SET text = ?, updated_at = ? WHERE id = ?", [text, _now(), fact_id]
            )
            return _get_fact(con, fact_id)

    def delete_facts(self, ids: list[int]) -> int:
        """Delete facts by id (all or none: an unknown id raises NotFoundError)."""
        ids = list(dict.fromkeys(ids))
        if not ids:
            return 0
        with self._forgetting() as con:
            for fid in ids:
                _get_fact(con, fid)
            con.execute("DELETE FROM facts WHERE list_contains(?, id)", [ids])
        return len(ids)

    def clear_facts(self, source: str | None = None) -> int:
        """Delete every fact (or every fact from `source`); return how many."""
        if source is not None:
            _check_choice(source, SOURCES, "source")
        with self._forgetting() as con:
            rows = con.execute(
                "DELETE FROM facts WHERE ? IS NULL OR source = ? RETURNING id", [source, source]
            ).fetchall()
        return len(rows)


def _messages_after(
    con: duckdb.DuckDBPyConnection, conversation: str, after_seq: int | None
) -> list[Message]:
    rows = con.execute(
        f"{_MESSAGES} WHERE c.name = ? AND m.seq > ? ORDER BY m.seq",
        [conversation, after_seq or 0],
    ).fetchall()
    return [_message(row) for row in rows]


def _latest_summary(con: duckdb.DuckDBPyConnection, conversation: str) -> Summary | None:
    row = con.execute(
        f"{_SUMMARIES} WHERE c.name = ? ORDER BY s.last_seq DESC, s.id DESC LIMIT 1",
        [conversation],
    ).fetchone()
    return None if row is None else _summary(row)


def _forget_epoch(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT value FROM state WHERE key = ?", [_FORGET_EPOCH]).fetchone()
    return 0 if row is None else int(row[0])


def _delete_turns(con: duckdb.DuckDBPyConnection, victims: list[Message]) -> Deletion:
    # A summary built from a deleted turn would keep its content: it goes too.
    summaries: list[Summary] = []
    for name in dict.fromkeys(m.conversation for m in victims):
        seqs = [m.seq for m in victims if m.conversation == name]
        rows = con.execute(f"{_SUMMARIES} WHERE c.name = ?", [name]).fetchall()
        summaries += [
            s for s in map(_summary, rows) if any(s.first_seq <= seq <= s.last_seq for seq in seqs)
        ]
    ids = [m.id for m in victims]
    con.execute("DELETE FROM summaries WHERE list_contains(?, id)", [[s.id for s in summaries]])
    con.execute("UPDATE facts SET message_id = NULL WHERE list_contains(?, message_id)", [ids])
    con.execute("DELETE FROM messages WHERE list_contains(?, id)", [ids])
    return Deletion(victims, summaries, list(dict.fromkeys(m.conversation for m in victims)))


def _conversation_id(
    con: duckdb.DuckDBPyConnection, name: str, create: datetime | None = None
) -> int:
    """The id of conversation `name`; created at time `create` if given and missing."""
    row = con.execute("SELECT id FROM conversations WHERE name = ?", [name]).fetchone()
    if row is not None:
        return row[0]
    if create is None:
        raise NotFoundError(f"no conversation named {name!r}")
    return con.execute(
        "INSERT INTO conversations (name, created_at) VALUES (?, ?) RETURNING id", [name, create]
    ).fetchone()[0]


def _get_message(con: duckdb.DuckDBPyConnection, message_id: int) -> Message:
    row = con.execute(f"{_MESSAGES} WHERE m.id = ?", [message_id]).fetchone()
    if row is None:
        raise NotFoundError(f"no message with id {message_id}")
    return _message(row)


def _get_fact(con: duckdb.DuckDBPyConnection, fact_id: int) -> Fact:
    row = con.execute(f"{_FACTS} WHERE id = ?", [fact_id]).fetchone()
    if row is None:
        raise NotFoundError(f"no fact with id {fact_id}")
    return _fact(row)


def _message(row: tuple) -> Message:
    ids = None if row[8] is None else tuple(row[8])
    return Message(*row[:5], _utc(row[5]), row[6], row[7], ids, row[9])


def _summary(row: tuple) -> Summary:
    return Summary(*row[:6], _utc(row[6]))


def _fact(row: tuple) -> Fact:
    return Fact(row[0], row[1], row[2], _utc(row[3]), _utc(row[4]), row[5])


def _conversation(row: tuple) -> Conversation:
    return Conversation(row[0], row[1], _utc(row[2]), row[3])


def _check_text(text: object, what: str, allow_empty: bool = True) -> str:
    if not isinstance(text, str):
        raise InputError(f"{what} must be text, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what} is not valid UTF-8 text (it has a lone surrogate)") from None
    if not allow_empty and not text.strip():
        raise InputError(f"{what} is empty")
    return text


def _check_choice(value: str, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise InputError(f"{what} must be one of {', '.join(choices)}, not {value!r}")


# Timestamps are stored as naive UTC (DuckDB TIMESTAMP) and handed out timezone-aware.
def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc)


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _sql_ident(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
