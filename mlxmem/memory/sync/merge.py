"""The store's side of a sync: merging records from other devices (or an export file) into
the store, by uid. `mlxmem.sync` reads and writes the folder; every statement is here.

- Tombstones first: what they name is deleted through the store's erase path, and they are
  kept, so a change for a tombstoned uid is ignored, now and later.
- Turns are immutable: the union by uid. A conversation's turns are ordered by (time,
  device, uid) on every device; a turn that sorts among existing ones renumbers the turns after
  it (to fresh seq numbers, never reused), the summaries that saw them are deleted (the next
  reply folds the log again) and the KV caches are wiped.
- Facts: each edit adds one to the fact's version counter and to its device's count in the
  fact's version vector. A version whose vector has seen the local one replaces the local text
  through the erase path, so the old text leaves the disk. Two versions neither of which saw
  the other were made on two devices before they met: the higher counter, then (updated_at,
  device), picks the text the fact keeps (a slow clock cannot undo a later edit), and the other
  text becomes a fact of its own (reported in MergeResult.conflicts), so neither edit is lost:
  on every device that sees both, whichever wrote the losing text, and every version a merge
  brings counts, not only the newest. Between versions from before vectors, the counters alone
  decide.
- A conversation's private flag: the higher version wins, private wins a tie. A turn carries
  its conversation's flag as its writer held it (records.py): merged as a flag record, before
  the turn, so the turn is as private here as it was where it was written, whatever file
  holding the flag itself is late, half copied, or sent by no one.
Each step is one transaction and can be repeated: a merge cut short anywhere is finished by the
next one, and a merge that finds nothing new changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby

import duckdb

from mlxmem.memory import forget
from mlxmem.memory.sync.records import (
    Record,
    carried_flag,
    clock_order,
    fact_clock,
    fact_key,
    fact_version,
    timestamp,
    turn_key,
)
from mlxmem.memory.tables import summaries, tombstones
from mlxmem.memory.tables.db import Database, bump_forget_epoch, crash_point, wipe_caches
from mlxmem.memory.tables.facts import (
    FactEdit,
    insert_fact,
    link_to_turns,
    set_synced,
    stored_clock,
)
from mlxmem.memory.tables.rows import one_row
from mlxmem.memory.tables.tombstones import Tombstone, fork_uid
from mlxmem.memory.tables.turns import (
    conversation_id,
    conversation_uid,
    insert_synced_turns,
    keep_private_after_deletion,
    renumber,
    set_private,
)
from mlxmem.text import name_problem


@dataclass
class MergeResult:
    turns: int = 0  # turns added
    facts: int = 0  # facts added
    fact_edits: int = 0  # facts given a newer version
    deleted_turns: int = 0
    deleted_facts: int = 0
    renumbered: list[str] = field(default_factory=list)  # conversations whose turns moved
    private_changes: int = 0  # conversations whose private flag changed
    # Facts two devices edited before they met: (the fact, which took the winning text; the
    # fact added to keep this side's text; the device that wrote that text).
    conflicts: list[tuple[int, int, str]] = field(default_factory=list)
    # Conversations that received turns under a name a new one may not have here (a space at
    # an end, a control character: written by an older version, or by hand): kept as they
    # are, so that nothing is lost and every device still agrees, and reported.
    odd_names: list[str] = field(default_factory=list)


def merge_records(db: Database, records: list[Record], device: str) -> MergeResult:
    """Merge `records` into the database `db`, whose own device id is `device` (`SyncLog.merge`
    calls this)."""
    result = MergeResult()
    _merge_tombstones(db, [r for r in records if r["kind"] == "tombstone"], result)
    crash_point("sync:tombstones-merged")
    turns = [r for r in records if r["kind"] == "message"]  # the sync format names a turn so
    # Before the turns: a private conversation's turns must never be recallable here, not even
    # between two steps of a merge cut short. The flags the turns carry count as flag records
    # (one of each: a conversation's turns carry the same few).
    flags = [r for r in records if r["kind"] == "conversation"]
    carried = {json.dumps(f, sort_keys=True): f for f in map(carried_flag, turns) if f}
    _merge_private(db, flags + list(carried.values()), turns, device, result)
    _merge_turns(db, turns, device, result)
    crash_point("sync:turns-merged")
    _merge_facts(db, [r for r in records if r["kind"] == "fact"], device, result)
    crash_point("sync:facts-merged")
    return result


def _merge_private(
    db: Database, records: list[Record], turns: list[Record], device: str, result: MergeResult
) -> None:
    """A conversation's private flag: the higher version wins, private wins a tie (two changes
    made beside each other keep it out of recall). A flag older than the conversation's
    deletion here is stale. A conversation not here yet is created (at its first turn among
    `turns`, else at the change), so that its turns are private from the first; but one
    deleted here is made again only by turns, never by a flag alone (its name would stay)."""
    if not records:
        return
    first: dict[str, datetime] = {}
    for m in turns:
        at = timestamp(m["created_at"])
        first[m["conversation"]] = min(at, first.get(m["conversation"], at))
    with db.connect() as con:
        for r in records:
            at = timestamp(r["updated_at"])
            gone = con.execute(
                "SELECT max(deleted_at) FROM tombstones WHERE uid = ?", [r["uid"]]
            ).fetchone()
            deleted = gone[0] if gone else None
            if deleted is not None and deleted >= at:
                continue
            here = con.execute("SELECT id FROM conversations WHERE name = ?", [r["name"]])
            if here.fetchone() is None and deleted is not None and r["name"] not in first:
                continue
            cid = conversation_id(con, r["name"], create=min(at, first.get(r["name"], at)))
            private, version = one_row(
                con.execute(
                    "SELECT private, private_version FROM conversations WHERE id = ?", [cid]
                )
            )
            incoming = r["version"], r["private"]
            if incoming <= (version, private):  # (n, True) beats (n, False)
                continue
            origin = None if r["device"] == device else r["device"]
            set_private(con, cid, r["private"], r["version"], at, origin)
            result.private_changes += 1


def _merge_tombstones(db: Database, records: list[Record], result: MergeResult) -> None:
    with db.connect() as con:
        known = dict(con.execute("SELECT uid, deleted_at FROM tombstones").fetchall())
    new = {}
    for r in records:
        at = timestamp(r["deleted_at"])
        if r["uid"] not in known or (r["of"] == "conversation" and at > known[r["uid"]]):
            new[r["uid"]] = Tombstone(r["uid"], r["of"], at, r["device"])
    if new:
        deletion = forget.apply_tombstones(db, list(new.values()))
        result.deleted_turns += len(deletion.turns)
        result.deleted_facts += len(deletion.facts)


def _merge_turns(db: Database, records: list[Record], device: str, result: MergeResult) -> None:
    with db.connect() as con:
        have = _uids(con, "SELECT uid FROM turns UNION ALL SELECT uid FROM tombstones")
        new = {r["uid"]: r for r in records if r["uid"] not in have}
        if not new:
            return
        ordered = sorted(new.values(), key=lambda r: (r["conversation"], turn_key(r)))
        for name, group in groupby(ordered, key=lambda r: r["conversation"]):
            if _merge_conversation(con, name, list(group), device):
                result.renumbered.append(name)
            if name_problem(name) is not None:
                result.odd_names.append(name)
        if result.renumbered:
            # Turns moved under what a running chat read: it must not write a summary or a
            # cache from before; the caches may mirror the old order.
            _invalidate(db, con)
        result.turns += len(new)
    with db.connect() as con:  # facts that came before their turn: linked to it now
        link_to_turns(con)


def _merge_conversation(
    con: duckdb.DuckDBPyConnection, name: str, incoming: list[Record], device: str
) -> bool:
    """Insert a conversation's new turns (sorted by turn_key) in order; return whether turns
    already there were renumbered."""
    deleted = con.execute(
        "SELECT t.deleted_at, t.device_uid IS NULL, t.published_at FROM tombstones t"
        " WHERE t.uid = ? AND NOT EXISTS (SELECT 1 FROM conversations WHERE name = ?)",
        [conversation_uid(name), name],
    ).fetchone()
    earliest = timestamp(incoming[0]["created_at"])
    cid = conversation_id(con, name, create=earliest)
    if deleted is not None:
        deleted_at, here, published = deleted
        # Deleted (and gone) here, and written to elsewhere before the writer could know: made
        # again, out of recall (the device that wrote does the same when the deletion reaches
        # it). No device can know of a deletion made here before this device's sync put it in
        # the folder: a turn written until then went into the conversation as it was, private
        # perhaps. Turns written after are a new conversation of that name, as the device that
        # wrote them says with its flag.
        before = earliest <= deleted_at or (here and (published is None or earliest < published))
        if before:
            keep_private_after_deletion(con, cid, deleted_at)
    rows = con.execute(
        "SELECT id, seq, created_at, coalesce(device_uid, ?), uid FROM turns"
        " WHERE conversation_id = ? ORDER BY seq",
        [device, cid],
    ).fetchall()
    first = turn_key(incoming[0])
    start = next((i for i, row in enumerate(rows) if tuple(row[2:]) > first), len(rows))
    moved = rows[start:]
    merged = sorted(
        [((row[2], row[3], row[4]), row) for row in moved] + [(turn_key(r), r) for r in incoming],
        key=lambda pair: pair[0],
    )
    (last_seq,) = one_row(con.execute("SELECT last_seq FROM conversations WHERE id = ?", [cid]))
    numbered = list(enumerate((item for _, item in merged), start=last_seq + 1))
    added = [(seq, r) for seq, r in numbered if isinstance(r, dict)]
    renumbered = [(seq, row[0]) for seq, row in numbered if not isinstance(row, dict)]
    # One statement each for the new turns and the moved ones (row by row is ~4 ms a turn);
    # the store's insert also indexes the new turns for recall.
    insert_synced_turns(
        con,
        cid,
        [
            (
                seq,
                r["role"],
                r["text"],
                timestamp(r["created_at"]),
                r["interrupted"],
                r["uid"],
                _origin(r, device),
            )
            for seq, r in added
        ],
    )
    renumber(con, cid, last_seq + len(merged), {mid: seq for seq, mid in renumbered})
    if moved:
        summaries.delete_derived(con, name, seqs=[row[1] for row in moved])
    return bool(moved)


@dataclass(frozen=True)
class _Version:
    """One version of a fact in a merge: the one held here (`record` None) or a record's."""

    text: str
    source: str
    updated_at: datetime
    device: str
    version: int
    clock: dict[str, int] | None
    record: Record | None = None

    @staticmethod
    def of(record: Record) -> _Version:
        return _Version(
            record["text"],
            record["source"],
            timestamp(record["updated_at"]),
            record["device"],
            fact_version(record),
            fact_clock(record),
            record,
        )

    def key(self) -> tuple[int, datetime, str]:
        """records.fact_key: which of two versions made beside each other wins."""
        return (self.version, self.updated_at, self.device)

    def stands_to(self, other: _Version) -> str:
        """How `other` stands to this version, as records.clock_order says; without vectors
        (an edit from before them) the counters decide: equal counters are concurrent."""
        order = clock_order(self.clock, other.clock)
        if order is not None:
            return order
        if other.key() == self.key():
            return "same"
        if other.version == self.version:
            return "concurrent"
        return "newer" if other.version > self.version else "older"


def _winner(versions: list[_Version]) -> tuple[_Version, list[_Version]]:
    """The version a fact keeps among `versions` (the one held here first, if any), and the
    others made beside it with another text: the versions no other one has seen (by their
    vectors) compete, and the tie-break (records.fact_key) picks the winner."""
    live = [
        v
        for i, v in enumerate(versions)
        if not any(
            (o.stands_to(v) == "older" or (o.stands_to(v) == "same" and j < i))
            for j, o in enumerate(versions)
            if j != i
        )
    ]
    best = max(live or versions, key=_Version.key)  # `or`: no order is a cycle, but be safe
    return best, [v for v in live if v is not best and v.text != best.text]


def _merge_facts(db: Database, records: list[Record], device: str, result: MergeResult) -> None:
    """Facts by uid. Every version this merge sees counts, not only the newest: two devices'
    edits made beside each other may arrive together, and the text that loses is kept as a
    fork here too. Its writer forks it as well (the same uid), but a deletion of the fact may
    reach the writer first, and take the text it holds under the fact's uid along."""
    incoming: dict[str, dict[tuple, Record]] = {}
    for r in records:
        incoming.setdefault(r["uid"], {})[fact_key(r)] = r
    if not incoming:
        return
    edits = {}
    late = []  # facts of a deleted turn or fact: deleted here too, in the main file
    with db.connect() as con:
        dead = _uids(con, "SELECT uid FROM tombstones")
        local = {
            row[0]: row[1:]
            for row in con.execute(
                "SELECT f.uid, f.id, f.text, f.source, f.updated_at, coalesce(f.device_uid, ?),"
                " coalesce(f.version, 0), f.turn_id, f.clock FROM facts f",
                [device],
            ).fetchall()
        }
        for uid, seen in incoming.items():
            if uid in dead:
                continue
            newest_first = [r for _, r in sorted(seen.items(), reverse=True)]
            theirs = [_Version.of(r) for r in newest_first]
            if uid not in local and newest_first[0].get("message_uid") in dead:
                # Taken from a turn deleted here before the fact arrived (deleting a turn
                # deletes its automatic facts): deleted too, and that travels. A fork of a
                # deleted fact is welcome: it keeps the other text, which nobody deleted (a
                # fork of the deleted text itself has a tombstone of its own).
                late.append(uid)
                continue
            if uid in local:
                fid, text, source, updated_at, dev, ver, turn_id, clock = local[uid]
                here = _Version(text, source, updated_at, dev, ver, stored_clock(clock, ver))
                best, losers = _winner([here, *theirs])
                if best.record is not None:  # not the version held here
                    edits[fid] = FactEdit(
                        best.text,
                        best.updated_at,
                        _origin(best.record, device),
                        best.version,
                        _clock_json(best.record),
                        *_replaced(best.record),
                    )
            else:
                best, losers = _winner(theirs)
                assert best.record is not None
                fid, turn_id = _insert_fact(con, best.record, device)
                result.facts += 1
            # Two devices edited the fact since they last met: the tie-break picks the text
            # the fact keeps, and each other text is kept as a fact of its own.
            for v in losers:
                loser = (v.text, v.source, v.updated_at, v.device, v.version, turn_id)
                fork = _fork_fact(con, uid, loser, device, dead)
                if fork is not None:
                    result.conflicts.append((fid, fork, v.device))
                    # The same fork may arrive later in this merge, made by another device:
                    # it is this row, not a new fact.
                    local[fork_uid(uid, v.version, v.device)] = (
                        fork, v.text, v.source, v.updated_at, v.device, 0, None, None
                    )  # fmt: skip
    if late:
        # Its own transaction: one transaction writes to one file, and the facts went to the
        # facts file.
        with db.connect() as con:
            tombstones.add_fact_uids(con, late)
    if edits:
        forget.replace_fact_versions(db, edits)
        result.fact_edits += len(edits)


def _fork_fact(
    con: duckdb.DuckDBPyConnection,
    uid: str,
    loser: tuple,
    device: str,
    dead: set[str],
) -> int | None:
    """Keep the text of a concurrent edit that lost the tie-break as a new fact; its uid is
    derived from the edit (fact, version, device), so every device that forks the same edit
    makes the same fact, and a deletion of it travels like any other. Its id, or None if it is
    already here or was deleted. `loser`: the local row (text, source, updated_at, device,
    version, turn_id); `device`: this device."""
    text, source, updated_at, dev, ver, turn_id = loser
    fork = fork_uid(uid, ver, dev)
    if fork in dead or con.execute("SELECT 1 FROM facts WHERE uid = ?", [fork]).fetchone():
        return None
    fact = insert_fact(con, text, source, turn_id, updated_at)
    set_synced(con, fact.id, uid=fork, device_uid=None if dev == device else dev, fork_of=uid)
    return fact.id


def _insert_fact(con: duckdb.DuckDBPyConnection, r: Record, device: str) -> tuple[int, int | None]:
    """Add the fact a record holds; its id, and its turn's (None if not here)."""
    row = con.execute("SELECT id FROM turns WHERE uid = ?", [r["message_uid"]]).fetchone()
    turn_id = row[0] if row else None
    fact = insert_fact(con, r["text"], r["source"], turn_id, timestamp(r["created_at"]))
    replaced_by, replaced_at = _replaced(r)
    set_synced(
        con,
        fact.id,
        uid=r["uid"],
        device_uid=_origin(r, device),
        updated_at=timestamp(r["updated_at"]),
        version=fact_version(r),
        turn_uid=r["message_uid"],
        fork_of=r.get("fork_of"),
        clock=_clock_json(r),
        replaced_by=replaced_by,
        replaced_at=replaced_at,
    )
    return fact.id, turn_id


def _clock_json(record: Record) -> str | None:
    """A fact record's version vector as stored (facts.clock), None if it carries none."""
    return json.dumps(record["clock"], sort_keys=True) if record.get("clock") else None


def _replaced(record: Record) -> tuple[str | None, datetime | None]:
    """The fact that replaced this one, and when (None, None if none did)."""
    if record.get("replaced_by") is None:
        return None, None
    return record["replaced_by"], timestamp(record.get("replaced_at") or record["updated_at"])


def _origin(record: Record, device: str) -> str | None:
    """The device column of a merged row: NULL if this device wrote it (an export re-imported)."""
    return None if record["device"] == device else record["device"]


def _uids(con: duckdb.DuckDBPyConnection, sql: str) -> set[str]:
    return {uid for (uid,) in con.execute(sql).fetchall()}


def _invalidate(db: Database, con: duckdb.DuckDBPyConnection) -> None:
    """What the database held changed under every reader (turns renumbered): bump the forget
    epoch in `con`'s transaction, so a running chat discards what it derived from before, and
    wipe the KV caches, which may mirror the old order."""
    bump_forget_epoch(con)
    wipe_caches(db.cache_dir)
