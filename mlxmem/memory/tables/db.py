"""The DuckDB file under layers 2 and 3: opening, locking, transactions, and erasing.

DuckDB lets only one process open a file for writing, and the chat process shares it with
`mlxmem memory` and `mlxmem history`. An operation takes a lock file, opens the database, works
in one transaction and closes it. An open costs tens of milliseconds, more than a cached turn of
a 3B model, so the interactive chat *holds* the store between operations (`holding()`): it keeps
the lock file and one connection, and every operation reuses them. Another process still gets
the store on demand: a process that finds the lock taken asks for it by holding a shared lock
on a second file (`.lock.want`) while it waits, and the holder, which looks for such a request
every few milliseconds, closes its connection and releases the lock as soon as no operation
runs; it opens the file again at its next operation. A holder that never releases (an older
mlxmem, a process stuck in an operation) still makes the others fail after LOCK_TIMEOUT_S with
the holder's pid.

A new database is made aside and moved into place whole, and a WAL that a kill left behind is
replayed or set aside (mlxmem.memory.tables.creation). Every connection is offline
(mlxmem.memory.tables.connect).

Deleted means gone, and erasing is one durable operation owned here, not by callers. The facts
live in their own small file (attached as `facts_db`), so erasing a fact rewrites the facts,
not the log; a transaction writes to one file, so an erase runs in steps:
1. in the main file, the rows go (turns, summaries), an "erase pending" record is written that
   names the facts to delete and whether the main file held removed text, and the forget epoch
   is bumped, in one transaction: a deletion takes effect here;
2. the facts named are deleted (and edited) in the facts file, in one transaction (an edit
   takes effect here: killed before it, the fact keeps its old text, as if never edited);
3. every KV cache file is deleted (a cache mirrors a prompt, so it may hold the removed text);
4. the facts file is compacted: DuckDB keeps the bytes of deleted or updated rows (after
   DELETE, CHECKPOINT and VACUUM alike), so the live data is copied into a fresh file
   (`.compact`) that is flushed and renamed over the old one;
5. last, the pending record goes: if the main file held removed text, it is compacted the same
   way and its copy leaves the record out, so the rename that replaces the file also ends the
   erase; otherwise the record is deleted in a transaction of its own (it holds no user text).
The record outlives every file that may still hold the text: if any step fails or the process
dies at any file-system call, the next open by any command redoes steps 2 to 5 (each can be
repeated) before anything reads, and a `.compact` file left without a record (by an older
version) makes it do the same.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import duckdb

from mlxmem import paths
from mlxmem.errors import StaleError, StoreError
from mlxmem.memory.tables import creation
from mlxmem.memory.tables.facts import FactEdit, write_erased_facts
from mlxmem.memory.tables.migrations import FACTS_DB, attach_facts, facts_path, migrate
from mlxmem.memory.tables.rows import one_row, sql_string

LOCK_TIMEOUT_S = 5.0
# How often a holder looks for another process's request for the store: the most a waiter
# waits beyond the holder's running operation and its close.
HOLD_POLL_S = 0.002
ERASE_PENDING = "compaction_pending"  # the key's name predates the cache wipe; kept for old files
FORGET_EPOCH = "forget_epoch"
_COMPACT_ALIAS = "mlxmem_compacted"
_COMPACT_SUFFIXES = (".compact", ".compact.wal")
# Tables of the main file whose rows can hold text a deletion removes.
_MAIN_TEXT_TABLES = ("turns", "summaries", "conversations")
T = TypeVar("T")


@dataclass
class Erasure:
    """A forgetting() block: `con` is its transaction on the main file; the facts to delete or
    edit are collected here and written to the facts file once the main file has committed."""

    con: duckdb.DuckDBPyConnection
    fact_ids: list[int] = field(default_factory=list)
    fact_edits: dict[int, FactEdit] = field(default_factory=dict)

    def delete_facts(self, ids: list[int]) -> None:
        self.fact_ids += [i for i in ids if i not in self.fact_ids]

    def edit_fact(
        self,
        fact_id: int,
        text: str,
        updated_at: datetime,
        device_uid: str | None = None,
        version: int | None = None,
        clock: str | None = None,
        replaced: tuple[str | None, datetime | None] = (None, None),
    ) -> None:
        """Replace a fact's text; `device_uid` names the device that wrote this version
        (None: this one), `version` its version counter (None: a local edit, one more),
        `clock` its version vector, `replaced` the fact that replaced it and when."""
        self.fact_edits[fact_id] = FactEdit(text, updated_at, device_uid, version, clock, *replaced)


@dataclass(frozen=True)
class ErasePlan:
    """The pending record: the facts still to delete, and whether the main file must be
    rewritten. A record from before the facts file ('1') means: rewrite everything."""

    fact_ids: tuple[int, ...] = ()
    main: bool = True

    @classmethod
    def parse(cls, value: str) -> ErasePlan:
        try:
            data = json.loads(value)
            return cls(tuple(data["fact_ids"]), bool(data["main"]))
        except (ValueError, KeyError, TypeError):
            return cls()

    def dumps(self) -> str:
        return json.dumps({"fact_ids": list(self.fact_ids), "main": self.main})


class Database:
    """One DuckDB file at `path`, with its KV cache folder `cache_dir` (default: `kv/` beside
    the file), opened per operation under a lock file."""

    def __init__(
        self,
        path: str | Path | None = None,
        timeout: float = LOCK_TIMEOUT_S,
        cache_dir: Path | None = None,
    ):
        self.path = Path(path) if path is not None else paths.db_path()
        self.timeout = timeout
        self.cache_dir = cache_dir or self.path.parent / paths.CACHE_DIRNAME
        self.facts_path = facts_path(self.path)
        self.opens = 0  # times this object opened the file: what a turn costs, counted
        # holding(): the lock file's descriptor and the connection kept between operations,
        # guarded by _mutex (the watcher thread releases them when another process asks).
        self._holding = 0
        self._held_fd: int | None = None
        self._held_con: duckdb.DuckDBPyConnection | None = None
        self._want_fd: int | None = None
        self._held_opens = 0  # times the held connection was opened (a new one sees others' writes)
        self._operations = 0  # operations run through this object
        self._mutex = threading.Lock()
        self._owner: int | None = None  # the thread in an operation on the held connection
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        paths.ensure_private_dir(self.path.parent)
        with self._lock():
            with self._transaction() as con:
                pending = con.execute(
                    "SELECT value FROM state WHERE key = ?", [ERASE_PENDING]
                ).fetchone()
            if pending or self._leftovers():
                self._erase_locked(ErasePlan.parse(pending[0]) if pending else ErasePlan())
            # A creation killed after its files moved in (create_aside): its empty folder.
            shutil.rmtree(creation.new_folder(self.path), ignore_errors=True)

    @contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One operation: lock, open, run a transaction, commit, close (while holding(): one
        transaction on the held connection). Do not nest."""
        with self._operation() as con, self._transaction_on(con):
            yield con

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Keep the lock file and one open connection between this object's operations until
        the block ends; each operation is still one transaction. Another process that asks
        for the store gets it within a few milliseconds once no operation runs here, and the
        next operation here opens it again. For a process that waits on a person between
        operations (the interactive chat); blocks nest."""
        if not self._holding:
            self._want_fd = open_lock_file(self._sibling(".lock.want"))
            self._stop.clear()
            self._watcher = threading.Thread(
                target=self._watch, name="mlxmem-store-holder", daemon=True
            )
            self._watcher.start()
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
            if self._holding == 0:
                self._stop.set()
                if self._watcher is not None:
                    self._watcher.join()
                self._watcher = None
                with self._mutex:
                    self._release()
                    if self._want_fd is not None:
                        os.close(self._want_fd)
                    self._want_fd = None

    def mark(self) -> tuple[int, int] | None:
        """While holding(): where this object stands. A mark equal to one taken earlier means
        no operation ran through this object since, and the held connection stayed open (so
        no other process wrote). None when not holding."""
        return (self._held_opens, self._operations) if self._holding else None

    @contextmanager
    def forgetting(self) -> Iterator[Erasure]:
        """Like connect(), for work that removes text: the block works in the main file's
        transaction (`Erasure.con`) and names the facts to delete or edit on the Erasure; the
        transaction also records the pending erase and bumps the forget epoch; the facts are
        written, the caches wiped and the files compacted before the lock is released. (A held
        connection is closed first: compaction replaces the files under it.)"""
        with self._alone(), self._lock():
            with self._transaction() as con:
                erasure = Erasure(con)
                before = _row_counts(con)
                yield erasure
                plan = ErasePlan(tuple(erasure.fact_ids), _row_counts(con) != before)
                con.execute(
                    "INSERT OR REPLACE INTO state VALUES (?, ?)", [ERASE_PENDING, plan.dumps()]
                )
                bump_forget_epoch(con)
            self._erase_locked(plan, erasure.fact_edits)

    @contextmanager
    def guarded(self, epoch: int | None) -> Iterator[duckdb.DuckDBPyConnection]:
        """Like connect(), for a write derived from what the store held at forget epoch
        `epoch` (a reply, a summary, a fact, a cache file): if anything was deleted since, it
        raises StaleError and writes nothing. None: no check."""
        with self.connect() as con:
            if epoch is not None and forget_epoch(con) != epoch:
                raise StaleError("something was deleted meanwhile; this result is discarded")
            yield con

    @contextmanager
    def steps(
        self, epoch: int | None
    ) -> Iterator[Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]]:
        """Like guarded(), for several transactions in one operation (one lock, one open): a
        transaction writes to one file, the log's or the facts'. The block calls the function
        it is given for each transaction (`with transaction() as con:`), and may work on under
        the same lock after them (a cache file, written under the same check)."""
        with self._operation() as con:
            with self._transaction_on(con):
                if epoch is not None and forget_epoch(con) != epoch:
                    raise StaleError("something was deleted meanwhile; this result is discarded")
            yield lambda: self._transaction_on(con)

    def _erase_locked(self, plan: ErasePlan, edits: dict[int, FactEdit] | None = None) -> None:
        """Steps 2 to 5; the pending record goes last, so a kill anywhere is redone."""
        crash_point("erase:committed")
        self._write_facts(plan.fact_ids, edits or {})
        crash_point("erase:facts-written")
        wipe_caches(self.cache_dir)
        crash_point("erase:caches-wiped")
        try:
            self._compact(self.facts_path, FACTS_DB, drop_pending=False)
            if plan.main:
                self._compact(self.path, None, drop_pending=True)
            else:
                with self._transaction() as con:
                    con.execute("DELETE FROM state WHERE key = ?", [ERASE_PENDING])
            crash_point("erase:done")
        except (duckdb.Error, OSError) as exc:
            for leftover in self._leftovers():
                leftover.unlink(missing_ok=True)
            raise StoreError(
                f"the deletion is saved, but its old bytes could not be erased from {self.path} "
                f"yet ({exc}); mlxmem retries when it next opens the database"
            ) from None

    def _write_facts(self, ids: tuple[int, ...], edits: dict[int, FactEdit]) -> None:
        """Step 2: delete (and edit) facts in the facts file; deleting again is harmless."""
        if not ids and not edits:
            return
        with self._transaction() as con:
            write_erased_facts(con, ids, edits)

    @contextmanager
    def _transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Open, one transaction, close (under a lock the caller holds)."""
        con = self._open()
        try:
            with self._transaction_on(con):
                yield con
        finally:
            con.close()  # rolls back an uncommitted transaction
            self._make_files_private()

    @contextmanager
    def _transaction_on(
        self, con: duckdb.DuckDBPyConnection
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """One transaction on an open connection; the caller closes it if this raises."""
        con.begin()
        try:
            yield con
        except duckdb.IOException as exc:  # a file cut short: DuckDB reads blocks lazily
            raise damaged_error(self.path, exc) from None
        try:
            con.commit()
        except duckdb.Error as exc:  # a full disk, most often: nothing was written
            raise StoreError(f"could not save to {self.path}: {exc}") from None
        crash_point("transaction:committed")  # in the WAL, not yet checkpointed

    @contextmanager
    def _operation(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """The lock and an open connection for one operation: taken and opened now and
        closed after, or, while holding(), the held ones (taken and opened again if another
        process asked for them)."""
        if not self._holding:
            try:
                with self._lock():
                    con = self._open()
                    try:
                        yield con
                    finally:
                        con.close()  # rolls back an uncommitted transaction
                        self._make_files_private()
            finally:
                self._operations += 1
            return
        with self._alone(release=False):
            if self._held_con is None:
                fd = self._take_lock()
                try:
                    self._held_con = self._open()
                except BaseException:
                    os.close(fd)
                    raise
                self._held_fd = fd
                self._held_opens += 1
            try:
                yield self._held_con
            except BaseException:
                self._release()  # closing rolls back what the operation left uncommitted
                raise
            self._make_files_private()
            if self._asked_for():
                self._release()

    @contextmanager
    def _alone(self, release: bool = True) -> Iterator[None]:
        """One operation of this object at a time while holding(); with `release`, the held
        connection is closed and the lock released first (the block opens its own)."""
        if not self._holding:
            try:
                yield
            finally:
                self._operations += 1
            return
        if self._owner == threading.get_ident():
            raise StoreError(f"database {self.path} is already open in this process (nested use?)")
        if not self._mutex.acquire(timeout=self.timeout):
            raise busy_error(self.path, str(os.getpid()))
        self._owner = threading.get_ident()
        try:
            if release:
                self._release()
            yield
        finally:
            self._operations += 1
            self._owner = None
            self._mutex.release()

    def _release(self) -> None:
        """Close the held connection and release the lock file (under _mutex)."""
        con, fd = self._held_con, self._held_fd
        self._held_con = self._held_fd = None
        try:
            if con is not None:
                con.close()
                self._make_files_private()
        finally:
            if fd is not None:
                os.close(fd)

    def _asked_for(self) -> bool:
        """Whether another process waits for the lock (holds the request lock); under _mutex."""
        if self._want_fd is None:
            return False
        try:
            fcntl.flock(self._want_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._want_fd, fcntl.LOCK_UN)
        return False

    def _watch(self) -> None:
        """The holder's watcher thread: release the store when another process asks for it
        and no operation runs here."""
        while not self._stop.wait(HOLD_POLL_S):
            if self._held_fd is None or not self._mutex.acquire(blocking=False):
                continue
            try:
                if self._held_fd is not None and self._asked_for():
                    self._release()
            except Exception:  # noqa: BLE001 - a close that failed: the next operation reopens
                pass
            finally:
                self._mutex.release()

    @contextmanager
    def _lock(self) -> Iterator[None]:
        fd = self._take_lock()
        try:
            yield
        finally:
            os.close(fd)

    def _take_lock(self) -> int:
        """Take the lock file; return its descriptor. While another process holds it, ask for
        it (a holder between operations releases it), up to the timeout."""
        # DuckDB's own lock lives on the database file, which compaction replaces: a separate
        # lock file keeps other mlxmem processes out from the delete until the replacement.
        fd = open_lock_file(self._sibling(".lock"))
        asking: list[int] = []

        def take() -> None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not asking:  # held while this process waits: the holder's watcher sees it
                    asking.append(open_lock_file(self._sibling(".lock.want")))
                    fcntl.flock(asking[0], fcntl.LOCK_SH)
                raise

        try:
            self._retry(take, self._holder_pid)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        finally:
            for want in asking:
                os.close(want)
        return fd

    def _open(self) -> duckdb.DuckDBPyConnection:
        if not self.path.exists():
            creation.create_aside(self.path, crash_point)
        had_facts = self.facts_path.exists()  # ATTACH creates a missing one, empty
        self.opens += 1
        con = self._retry(
            lambda: creation.connect_replaying(self.path, crash_point), lambda: "unknown"
        )
        try:
            attach_facts(con)
            if migrate(con):  # schema changes reach the files now, not a WAL left to replay
                con.execute(f"CHECKPOINT {FACTS_DB}")
                con.execute("CHECKPOINT")
            lost = not had_facts and not _has_table(con, FACTS_DB, "facts")
        except duckdb.Error as exc:
            con.close()
            raise damaged_error(self.path, exc) from None
        if lost:
            con.close()
            raise self._facts_lost_error()
        return con

    def _retry(self, attempt: Callable[[], T], holder_pid: Callable[[], str]) -> T:
        """Call attempt() until it stops failing on a lock held elsewhere, up to the timeout."""
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        while True:
            try:
                return attempt()
            except BlockingIOError:
                pid = holder_pid()
            except duckdb.IOException as exc:
                if "Could not set lock" not in str(exc):
                    raise open_error(self.path, exc) from None
                found = re.search(r"PID (\d+)", str(exc))
                pid = found.group(1) if found else "unknown"
            except duckdb.Error as exc:
                raise open_error(self.path, exc) from None
            if time.monotonic() > deadline:
                raise busy_error(self.path, pid)
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def _facts_lost_error(self) -> StoreError:
        """The facts file is gone while the log is not: say so, and leave no empty file for
        the next open to take for the real one."""
        for path in (self.facts_path, Path(f"{self.facts_path}.wal")):
            path.unlink(missing_ok=True)
        return StoreError(
            f"the facts file {self.facts_path} is missing, but the chat log {self.path} is "
            "there (deleted or moved?). mlxmem leaves the log untouched: restore the facts "
            f"file from a backup, or move {self.path.name} away too to start a new database."
        )

    def _holder_pid(self) -> str:
        try:
            return self._sibling(".lock").read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def _compact(self, path: Path, source: str | None, drop_pending: bool) -> None:
        """Rewrite `path` (attached as `source`; None: the main file) without the bytes of
        removed rows, and, with `drop_pending`, without the pending record."""
        con = self._open()
        try:
            if source is None:
                source = one_row(con.execute("SELECT current_database()"))[0]
            copy_database(con, path, source, drop_pending)
        finally:
            con.close()
        replace_with_copy(path)

    def _leftovers(self) -> list[Path]:
        """Copies an interrupted compaction left behind."""
        files = (self.path, self.facts_path)
        names = (Path(f"{path}{suffix}") for path in files for suffix in _COMPACT_SUFFIXES)
        return [name for name in names if os.path.lexists(name)]

    def _sibling(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def _make_files_private(self) -> None:
        for path in (self.path, self.facts_path):
            paths.make_private(path)
            paths.make_private(Path(f"{path}.wal"))


def copy_database(
    con: duckdb.DuckDBPyConnection, path: Path, source: str, drop_pending: bool
) -> None:
    """Copy database `source` of `con` into `path`.compact (without the pending record, with
    `drop_pending`): the copy holds the live rows only."""
    tmp = Path(f"{path}.compact")
    for leftover in (tmp, Path(f"{tmp}.wal")):
        leftover.unlink(missing_ok=True)
    crash_point("compact:leftovers-removed")
    con.execute(f"CHECKPOINT {_sql_ident(source)}")  # empties the WAL of the old file
    crash_point("compact:checkpointed")
    con.execute(f"ATTACH {sql_string(str(tmp))} AS {_COMPACT_ALIAS}")
    paths.make_private(tmp)
    crash_point("compact:attached")
    con.execute(f"COPY FROM DATABASE {_sql_ident(source)} TO {_COMPACT_ALIAS}")
    crash_point("compact:copied")
    if drop_pending:
        con.execute(f"DELETE FROM {_COMPACT_ALIAS}.state WHERE key = ?", [ERASE_PENDING])
    con.execute(f"DETACH {_COMPACT_ALIAS}")
    crash_point("compact:detached")


def replace_with_copy(path: Path) -> None:
    """Put the copy copy_database made in the place of `path`, durably."""
    tmp = Path(f"{path}.compact")
    # A WAL left by the old file would be replayed onto the new one.
    if Path(f"{path}.wal").exists() or Path(f"{tmp}.wal").exists():
        tmp.unlink(missing_ok=True)
        raise StoreError(f"could not compact {path}: its write-ahead log stayed behind")
    paths.make_private(tmp)
    paths.fsync_path(tmp)
    crash_point("compact:flushed")
    os.replace(tmp, path)
    crash_point("compact:replaced")
    paths.fsync_path(path.parent)
    crash_point("compact:dir-flushed")


def busy_error(path: Path, pid: str) -> StoreError:
    if pid == str(os.getpid()):
        return StoreError(f"database {path} is already open in this process (nested use?)")
    return StoreError(f"database is in use by another process (pid {pid}): {path}")


def open_error(path: Path, exc: duckdb.Error) -> StoreError:
    if "not a valid DuckDB database file" in str(exc):
        return StoreError(
            f"{path} is not a DuckDB database (corrupt, or another kind of file). "
            "mlxmem leaves it untouched: move it away to start a new database, "
            "or restore it from a backup."
        )
    return StoreError(f"cannot open the database {path}: {exc}")


def damaged_error(path: Path, exc: duckdb.Error) -> StoreError:
    return StoreError(
        f"cannot read the database {path}: {exc}. A file cut short or damaged is "
        "left untouched: restore it from a backup, or move it away to start a new database."
    )


def open_lock_file(lock: Path) -> int:
    """The descriptor of lock file `lock` (made private if new); StoreError, saying what to
    remove, if something else is in its place."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:  # a folder in its place, or no right to write it
        raise StoreError(
            f"cannot use {lock} as mlxmem's lock file ({exc.strerror}); it must be a file"
            " mlxmem can write: remove or rename what is there, and retry"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe or a device: not a lock file
        os.close(fd)
        raise StoreError(
            f"cannot use {lock} as mlxmem's lock file: it is not a regular file; remove or"
            " rename what is there, and retry"
        )
    return fd


def set_state(con: duckdb.DuckDBPyConnection, key: str, value: str) -> None:
    """Keep one of this data directory's small values in `state`, under `key`."""
    con.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", [key, value])


def forget_epoch(con: duckdb.DuckDBPyConnection) -> int:
    """Counts deletions and edits: anything derived before a change may hold removed text."""
    row = con.execute("SELECT value FROM state WHERE key = ?", [FORGET_EPOCH]).fetchone()
    return 0 if row is None else int(row[0])


def bump_forget_epoch(con: duckdb.DuckDBPyConnection) -> None:
    """Mark that what the store held changed under any reader: a chat in another process
    compares the epoch before it writes what it derived (a reply, a summary, a cache)."""
    con.execute(
        "INSERT OR REPLACE INTO state SELECT ?, CAST(coalesce(max(CAST(value AS"
        " BIGINT)), 0) + 1 AS VARCHAR) FROM state WHERE key = ?",
        [FORGET_EPOCH, FORGET_EPOCH],
    )


def _has_table(con: duckdb.DuckDBPyConnection, database: str, table: str) -> bool:
    found = con.execute(
        "SELECT 1 FROM duckdb_tables() WHERE database_name = ? AND table_name = ?",
        [database, table],
    ).fetchone()
    return found is not None


def _row_counts(con: duckdb.DuckDBPyConnection) -> tuple[int, ...]:
    """Rows in the main file's text-holding tables: if a block changed them, the main file
    holds removed bytes and must be rewritten."""
    return tuple(one_row(con.execute(f"SELECT count(*) FROM {t}"))[0] for t in _MAIN_TEXT_TABLES)


# The one fault-injection seam: each file-system step of an erase (and a few steps of a turn
# and of a sync) calls crash_point(name). Tests set `fault_hook` to die or fail there; it is
# None otherwise, and nothing else reads it.
fault_hook: Callable[[str], None] | None = None


def crash_point(name: str) -> None:
    """Hand step `name` to the tests' fault hook, if one is set."""
    if fault_hook is not None:
        fault_hook(name)


def wipe_caches(cache_dir: Path) -> int:
    """Delete every file under a KV cache folder; return how many. The cache is only an
    optimization: the engine rebuilds it from the store on the next call."""
    if not cache_dir.is_dir():
        return 0
    removed = 0
    # Deepest first, so that emptied folders can go too.
    for path in sorted(cache_dir.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)
            removed += 1
        crash_point("erase:cache-removed")
    return removed


def _sql_ident(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'
