"""Changes as records: what a sync folder's change files and an export file hold.

Four kinds, one JSON object each, every one naming the device that wrote it:
- message: a turn (the format keeps the name older devices read), immutable, by uid, with its
  conversation's name (and uid, derived from it); a fact names its turn by `message_uid`. A
  turn in a conversation whose flag was ever set also carries that flag (`sharing`: the
  fields of the conversation record below) as its writer holds it when it writes the file, so
  a turn's privacy arrives with the turn: it depends on no other file arriving first, half
  copied or missing, nor on which device sends the flag;
- fact: one version of a fact: its version vector (`clock`: how many of the fact's edits each
  device made, this one included) tells whether it descends from the version a device holds
  or was made beside it; between two made beside each other, its version counter (each edit
  adds one), then (updated_at, device), decide which text the fact keeps;
- tombstone: a deletion: a uid, what it was, and when; never the deleted text;
- conversation: whether a conversation is private (kept out of recall in the others), with the
  version of that flag (each change adds one; the higher wins, and private wins a tie, so two
  changes made beside each other keep it out of recall). Only for a conversation whose flag
  was ever set. An mlxmem from before this kind skips a file that holds one, and reads it
  once upgraded (a skipped file is read again at the next sync).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeGuard

import duckdb

from mlxmem.defaults import MAX_MESSAGE_CHARS
from mlxmem.errors import InputError
from mlxmem.memory.tables.facts import MAX_FACT_CHARS, SOURCES
from mlxmem.memory.tables.turns import conversation_uid
from mlxmem.text import ROLES, as_utc, check_text, to_db, utc_now

Record = dict[str, Any]
TOMBSTONE_KINDS = ("message", "fact", "conversation")
# The times a record may carry: wide enough for any real clock, even a badly skewed one. The
# latest moves with the clock: a turn written after one at the limit is stamped a microsecond
# after it (a conversation's turns are in time order), and the clock outruns that, so what a
# device writes after an accepted record is accepted in turn, where a fixed limit would refuse
# it for good.
EARLIEST = datetime(1970, 1, 1)
AHEAD = timedelta(days=100 * 365)
# Two limits, so that one device's clock does not decide what another can read. A record
# enters the devices' records by an import only up to AHEAD past the importing device's clock
# (its own turns and facts carry its clock); a sync reads up to SKEW more. So a file holding a
# record at its writer's limit is read at once on a device whose clock is behind the writer's
# (by up to SKEW), where one limit for both made that whole file unreadable there, with its
# device's other new files and the deletions they hold, until the reader's clock caught up.
# Refusing only the one record instead would lose it for good on that device (a file is read
# once) and leave the devices disagreeing. The slack costs nothing: the bound only keeps
# clocks far from overflowing. (A record crafted into the folder past AHEAD, and sent on by a
# device that read it, still waits on a device whose clock is behind that one's.)
SKEW = timedelta(days=100 * 365)


def latest_time() -> datetime:
    """The latest time a record may carry when it enters by an import, now (naive UTC, as
    stored); a sync reads up to SKEW later (see timestamp)."""
    return to_db(utc_now()) + AHEAD  # this device's clock, as every other time it writes


MAX_VERSION = 2**62  # a fact's version counter: far beyond any number of edits, inside BIGINT
MAX_FLAG_VERSION = 2**31 - 1  # a private flag's version counter: an INTEGER column
MAX_CLOCK_DEVICES = 10_000  # devices in one fact's version vector: far beyond a person's


def local_records(con: duckdb.DuckDBPyConnection, device: str) -> list[Record]:
    """Everything the store holds as records: every turn, every fact's current version and
    every tombstone; rows written here (device NULL) are named as `device`."""
    turns = con.execute(
        "SELECT m.uid, c.name, m.role, m.text, m.created_at, coalesce(m.device_uid, ?),"
        " m.interrupted, c.private, c.private_version, c.private_at,"
        " coalesce(c.private_device, ?) FROM turns m"
        " JOIN conversations c ON c.id = m.conversation_id ORDER BY c.id, m.seq",
        [device, device],
    ).fetchall()
    facts = con.execute(
        "SELECT f.uid, f.text, f.source, f.created_at, f.updated_at, coalesce(f.device_uid, ?),"
        " coalesce(m.uid, f.turn_uid), coalesce(f.version, 0), f.fork_of, f.clock,"
        " f.replaced_by, f.replaced_at FROM facts f"
        " LEFT JOIN turns m ON m.id = f.turn_id ORDER BY f.id",
        [device],
    ).fetchall()
    tombstones = con.execute(
        "SELECT uid, kind, deleted_at, coalesce(device_uid, ?) FROM tombstones"
        " ORDER BY deleted_at, uid",
        [device],
    ).fetchall()
    conversations = con.execute(
        "SELECT name, private, private_version, private_at, coalesce(private_device, ?)"
        " FROM conversations WHERE private_version > 0 ORDER BY id",
        [device],
    ).fetchall()
    return (
        [turn_record(*row[:7], sharing=_sharing(*row[7:])) for row in turns]
        + [fact_record(*row) for row in facts]
        + [tombstone_record(*row) for row in tombstones]
        + [conversation_record(*row) for row in conversations]
    )


def turn_record(
    uid, conversation, role, text, created_at, device, interrupted, *, sharing=None
) -> Record:
    record = {
        "kind": "message",
        "uid": uid,
        "conversation": conversation,
        "conversation_uid": conversation_uid(conversation),
        "role": role,
        "text": text,
        "created_at": iso(created_at),
        "device": device,
        "interrupted": bool(interrupted),
    }
    if sharing is not None:
        record["sharing"] = sharing
    return record


def _sharing(private, version, updated_at, device) -> dict | None:
    """A turn's copy of its conversation's flag (None: the flag was never set). The flag as
    the store holds it now, not as it was when the turn was written: a change of the flag
    changes the turns' records, so their device rewrites the files that hold them (rare, and
    no column to keep), and a turn is never sent without the flag it was written under."""
    if not version:
        return None
    return {
        "private": bool(private),
        "version": version,
        "updated_at": iso(updated_at),
        "device": device,
    }


def carried_flag(record: Record) -> Record | None:
    """The conversation record a turn record carries (its `sharing`), or None."""
    sharing = record.get("sharing")
    if sharing is None:
        return None
    name = record["conversation"]
    return {"kind": "conversation", "uid": conversation_uid(name), "name": name, **sharing}


def fact_record(
    uid,
    text,
    source,
    created_at,
    updated_at,
    device,
    turn_uid,
    version=0,
    fork_of=None,
    clock=None,
    replaced_by=None,
    replaced_at=None,
) -> Record:
    record = {
        "kind": "fact",
        "uid": uid,
        "text": text,
        "source": source,
        "created_at": iso(created_at),
        "updated_at": iso(updated_at),
        "device": device,
        "message_uid": turn_uid,  # the format's name
        "version": version,
    }
    if fork_of is not None:  # the losing text of a sync conflict: the fact it came from
        record["fork_of"] = fork_of
    if clock:  # a stored version vector (JSON); none for a fact never edited, or from before
        record["clock"] = json.loads(clock)
    if replaced_by is not None:  # the fact that replaced this one (`memory add --replaces`)
        record["replaced_by"] = replaced_by
        record["replaced_at"] = iso(replaced_at)
    return record


def tombstone_record(uid, of, deleted_at, device) -> Record:
    return {
        "kind": "tombstone",
        "uid": uid,
        "of": of,
        "deleted_at": iso(deleted_at),
        "device": device,
    }


def conversation_record(name, private, version, updated_at, device) -> Record:
    return {
        "kind": "conversation",
        "uid": conversation_uid(name),
        "name": name,
        "private": bool(private),
        "version": version,
        "updated_at": iso(updated_at),
        "device": device,
    }


def version(record: Record) -> tuple[str, str, str]:
    """What makes a record distinct: a fact has one record per version (its updated_at), a
    tombstone one per deletion time (a conversation can be deleted again), a message one."""
    return (record["kind"], record["uid"], record.get("updated_at") or record.get("deleted_at", ""))


def fact_key(record: Record) -> tuple[int, datetime, str]:
    """Which version of a fact wins: the higher version counter (a device adds one to the
    version it has when it edits, so a clock cannot reverse the order), then, between two
    edits of the same version (made on two devices before they met), the later updated_at
    and the greater device id. A record from before version counters is version 0."""
    return (fact_version(record), timestamp(record["updated_at"]), record["device"])


def fact_version(record: Record) -> int:
    """A fact record's version counter; a record from before counters has none: version 0 if
    it was never edited, else 1 (migration m010 numbers the stored facts the same way)."""
    if "version" in record:
        return record["version"]
    return int(timestamp(record["updated_at"]) != timestamp(record["created_at"]))


def fact_clock(record: Record) -> dict[str, int] | None:
    """A fact record's version vector; None when it is unknown (an edit from before vectors)."""
    if "clock" in record:
        return record["clock"]
    return {} if fact_version(record) == 0 else None


def clock_order(mine: dict[str, int] | None, theirs: dict[str, int] | None) -> str | None:
    """How the version `theirs` stands to `mine`: "same", "older" (mine has seen it), "newer"
    (it has seen mine) or "concurrent" (made beside each other: neither saw the other); None
    when either vector is unknown. The textbook version-vector order (Parker et al., 1983):
    a version counter alone cannot tell a newer edit from one made beside an older edit."""
    if mine is None or theirs is None:
        return None
    devices = mine.keys() | theirs.keys()
    ahead = any(theirs.get(d, 0) > mine.get(d, 0) for d in devices)
    behind = any(theirs.get(d, 0) < mine.get(d, 0) for d in devices)
    return {(False, False): "same", (False, True): "older", (True, False): "newer"}.get(
        (ahead, behind), "concurrent"
    )


def _is_clock(value: object) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= MAX_CLOCK_DEVICES
        and all(_is_uuid(d) and type(n) is int and 0 < n <= MAX_VERSION for d, n in value.items())
    )


def turn_key(record: Record) -> tuple[datetime, str, str]:
    """The order of a conversation's turns on every device: time, then device, then uid."""
    return (timestamp(record["created_at"]), record["device"], record["uid"])


def iso(value: datetime) -> str:
    """A stored (naive UTC) timestamp as ISO 8601 with its offset."""
    return as_utc(value).isoformat()


def timestamp(value: str, skew: timedelta = SKEW) -> datetime:
    """An ISO 8601 timestamp as the naive UTC datetime DuckDB stores; InputError for one that
    is not a time or lies outside EARLIEST..latest_time() + `skew` (a crafted 9999-12-31 would
    overflow every later turn's clock). `skew`: SKEW for what a sync reads, none for what
    enters by an import (see SKEW)."""
    try:
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is not None:
            parsed = parsed.astimezone(timezone.utc).replace(tzinfo=None)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"not an ISO 8601 time: {str(value)[:40]!r}") from None
    latest = latest_time() + skew
    if not EARLIEST <= parsed <= latest:
        raise InputError(
            f"time {str(value)[:40]!r} is outside {EARLIEST.year}..{latest:%Y-%m-%d}"
            f" ({(AHEAD + skew).days // 365} years from now)"
        )
    return parsed


def check_record(record: object, entering: bool = False) -> Record:
    """`record` if it is a well-formed change, else InputError saying what is wrong.
    `entering`: the record enters the devices' records here (an import), so its times must
    lie within AHEAD of this device's clock; a sync reads SKEW more (see SKEW)."""
    if not isinstance(record, dict):
        raise InputError("a record must be a JSON object")
    kind = record.get("kind")
    # A kind that is a JSON list or object is no key of _FIELDS (and unhashable): unknown.
    if not isinstance(kind, str) or kind not in _FIELDS:
        raise InputError(f"unknown record kind {kind!r}")
    fields = _FIELDS[kind]
    for name in fields:
        if name not in record:
            raise InputError(f"{kind} record without {name!r}")
    checks = {**fields, **_OPTIONAL.get(kind, {})}
    for name in (n for n in checks if n in record):
        try:
            ok = checks[name](record[name])
        except (TypeError, ValueError, InputError):
            ok = False
        if not ok:
            raise InputError(f"{kind} record with a bad {name!r}: {str(record[name])[:40]!r}")
    if kind == "fact" and len(record["text"]) > MAX_FACT_CHARS:
        raise InputError(
            f"fact record of {len(record['text']):,} characters, over the limit of"
            f" {MAX_FACT_CHARS:,} for a fact"
        )
    if kind == "message" and len(record["text"]) > MAX_MESSAGE_CHARS:
        raise InputError(
            f"message record of {len(record['text']):,} characters, over the limit of"
            f" {MAX_MESSAGE_CHARS:,} for a message"
        )
    if kind == "message" and record["conversation_uid"] != conversation_uid(record["conversation"]):
        raise InputError("message record whose conversation_uid does not match its name")
    if kind == "conversation" and record["uid"] != conversation_uid(record["name"]):
        raise InputError("conversation record whose uid does not match its name")
    if entering:
        times = {n: record[n] for n in _TIMES if n in record}
        if "sharing" in record:
            times["sharing"] = record["sharing"]["updated_at"]
        for name, value in times.items():
            try:
                timestamp(value, skew=timedelta(0))
            except InputError as exc:
                raise InputError(f"{kind} record with a bad {name!r}: {exc}") from None
    return record


_TIMES = ("created_at", "updated_at", "deleted_at", "replaced_at")  # a record's times


def _is_uuid(value: object) -> bool:
    return isinstance(value, str) and str(uuid.UUID(value)) == value


def _is_time(value: object) -> bool:
    return isinstance(value, str) and timestamp(value) is not None


def _is_text(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and check_text(value) == value


def _is_name(value: object) -> bool:
    return _is_text(value) and bool(value.strip())


_FIELDS = {
    "message": {
        "uid": _is_uuid,
        "conversation": _is_name,
        "conversation_uid": _is_uuid,
        "role": lambda v: v in ROLES,
        "text": _is_text,
        "created_at": _is_time,
        "device": _is_uuid,
        "interrupted": lambda v: isinstance(v, bool),
    },
    "fact": {
        "uid": _is_uuid,
        "text": _is_name,
        "source": lambda v: v in SOURCES,
        "created_at": _is_time,
        "updated_at": _is_time,
        "device": _is_uuid,
        "message_uid": lambda v: v is None or _is_uuid(v),
    },
    "tombstone": {
        "uid": _is_uuid,
        "of": lambda v: v in TOMBSTONE_KINDS,
        "deleted_at": _is_time,
        "device": _is_uuid,
    },
    "conversation": {
        "uid": _is_uuid,
        "name": _is_name,
        "private": lambda v: isinstance(v, bool),
        "version": lambda v: type(v) is int and 1 <= v <= MAX_FLAG_VERSION,
        "updated_at": _is_time,
        "device": _is_uuid,
    },
}


def _is_sharing(value: object) -> bool:
    """A turn's copy of its conversation's flag: the conversation record's own fields."""
    fields = {n: c for n, c in _FIELDS["conversation"].items() if n not in ("uid", "name")}
    return (
        isinstance(value, dict)
        and value.keys() == fields.keys()
        and all(check(value[name]) for name, check in fields.items())
    )


# Fields a record may lack (written by an mlxmem from before them).
_OPTIONAL: dict[str, dict[str, Callable[[Any], bool]]] = {
    "message": {"sharing": _is_sharing},
    "fact": {
        "version": lambda v: type(v) is int and 0 <= v <= MAX_VERSION,
        "fork_of": _is_uuid,
        "clock": _is_clock,
        "replaced_by": _is_uuid,
        "replaced_at": _is_time,
    },
}
