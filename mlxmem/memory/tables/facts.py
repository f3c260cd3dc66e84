"""Layer 3 as stored: the facts about the person, each manual or automatic."""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime

import duckdb

from mlxmem.errors import DuplicateFactError, InputError, NotFoundError
from mlxmem.memory.tables.rows import device_of, one_row
from mlxmem.text import as_utc, check_text, to_db, utc_now

SOURCES = ("manual", "automatic")
# A fact is short (a preference, a person, a habit): every prompt carries every fact, so a
# long one costs every turn (a 3 MB fact added ~5 s to each). Automatic facts are shorter
# still (mlxmem.memory.extraction.MAX_FACT_CHARS).
MAX_FACT_CHARS = 1_000


@dataclass(frozen=True)
class Fact:
    id: int
    text: str
    source: str
    created_at: datetime
    updated_at: datetime
    turn_id: int | None  # the turn an automatic fact was extracted from
    # The fact that replaced this one, and when (`memory add --replaces`): a replaced fact is
    # out of the prompt; it is current again if the fact that replaced it is deleted.
    replaced_by: int | None = None
    replaced_at: datetime | None = None


@dataclass(frozen=True)
class FactEdit:
    text: str
    updated_at: datetime
    device_uid: str | None = None
    version: int | None = None  # the version another device wrote; None: one more than now
    clock: str | None = None  # its version vector (JSON; facts.edited_clock), None: unknown
    replaced_by: str | None = None  # the uid of the fact that replaced it, if one did
    replaced_at: datetime | None = None


SELECT_FACTS = (
    "SELECT id, text, source, created_at, updated_at, turn_id,"
    " (SELECT r.id FROM facts r WHERE r.uid = facts.replaced_by), replaced_at FROM facts"
)


def insert_fact(
    con: duckdb.DuckDBPyConnection,
    text: str,
    source: str,
    turn_id: int | None = None,
    now: datetime | None = None,
) -> Fact:
    """Add a fact inside an open transaction; its id comes from the facts file's counter, so
    an id is never handed out twice (deleted facts' included)."""
    now = now or utc_now()
    counter = "UPDATE fact_counter SET last_id = last_id + 1 RETURNING last_id"
    (fid,) = one_row(con.execute(counter))
    con.execute(
        "INSERT INTO facts (id, text, source, created_at, updated_at, turn_id, turn_uid)"
        " SELECT ?, ?, ?, ?, ?, ?, (SELECT uid FROM turns WHERE id = ?)",
        [fid, text, source, to_db(now), to_db(now), turn_id, turn_id],
    )
    return Fact(fid, text, source, now, now, turn_id)


def same_text(a: str, b: str) -> bool:
    """Do two facts say the same, but for case, punctuation and spacing? ("I am vegetarian"
    and "i am  Vegetarian."; not "I am vegan", nor a paraphrase.)"""
    return normalize(a) == normalize(b)


def normalize(text: str) -> str:
    """Case, punctuation and whitespace folded away, for duplicate checks."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"['’`]", "", text)  # "user's" and "users" are the same word here
    text = "".join(ch if ch.isalnum() else " " for ch in text)
    return " ".join(text.split())


def duplicate_of(
    con: duckdb.DuckDBPyConnection, text: str, other_than: int | None = None
) -> Fact | None:
    """The stored fact (not `other_than`) that says what `text` says, if any (same_text)."""
    return next((f for f in all_facts(con) if f.id != other_than and same_text(f.text, text)), None)


def refuse_duplicate(
    con: duckdb.DuckDBPyConnection, text: str, other_than: int | None = None
) -> None:
    """DuplicateFactError naming the stored fact that already says `text`, if one does: two
    copies of a fact cost every prompt twice and leave one behind when the other is deleted."""
    if (same := duplicate_of(con, text, other_than)) is not None:
        raise DuplicateFactError(
            f"fact {same.id} already says that: {same.text!r}"
            f" (`mlxmem memory edit {same.id} TEXT` changes it)"
        )


def all_facts(con: duckdb.DuckDBPyConnection, replaced: bool = False) -> list[Fact]:
    """The current facts (those in the prompt), and the replaced ones too if `replaced`."""
    facts = [fact_of(row) for row in con.execute(f"{SELECT_FACTS} ORDER BY id").fetchall()]
    return [f for f in facts if replaced or f.replaced_by is None]


def get_fact(con: duckdb.DuckDBPyConnection, fact_id: int) -> Fact:
    row = con.execute(f"{SELECT_FACTS} WHERE id = ?", [fact_id]).fetchone()
    if row is None:
        raise NotFoundError(f"no fact with id {fact_id}")
    return fact_of(row)


def stored_clock(clock: str | None, version: int) -> dict[str, int] | None:
    """A stored fact's version vector (the facts.clock column); None when it is unknown."""
    if clock is not None:
        return json.loads(clock)
    return {} if version == 0 else None


def edited_clock(clock: dict[str, int] | None, device: str) -> str:
    """The version vector of an edit made on `device` over a version whose vector is `clock`
    (an unknown one counts as empty: the edit is then concurrent with any other of its kind)."""
    clock = dict(clock or {})
    clock[device] = clock.get(device, 0) + 1
    return json.dumps(clock, sort_keys=True)


@dataclass(frozen=True)
class FactVersion:
    """What a new version of a stored fact carries on: its version counter, version vector
    (JSON, or None: see stored_clock), and the uid of the fact that replaced it, with when."""

    version: int
    clock: str | None
    replaced_by: str | None
    replaced_at: datetime | None


def version_of(con: duckdb.DuckDBPyConnection, fact_id: int) -> FactVersion | None:
    """The stored fact's FactVersion (None for a fact not stored)."""
    row = con.execute(
        "SELECT coalesce(version, 0), clock, replaced_by, replaced_at FROM facts WHERE id = ?",
        [fact_id],
    ).fetchone()
    return None if row is None else FactVersion(*row)


def note_automatic(
    con: duckdb.DuckDBPyConnection, text: str, turn_id: int, replaces: int | None
) -> tuple[Fact, int | None] | None:
    """Store an automatic fact taken from turn `turn_id`, replacing fact `replaces` if it is
    still current; the fact and the id it replaced. None if a fact stored meanwhile says the
    same (the look checked those it was shown)."""
    if duplicate_of(con, text) is not None:
        return None
    added = insert_fact(con, text, "automatic", turn_id)
    if replaces is not None and not mark_replaced(con, replaces, added.id, added.created_at):
        replaces = None
    return added, replaces


def mark_replaced(con: duckdb.DuckDBPyConnection, fact_id: int, by: int, now: datetime) -> bool:
    """Fact `fact_id` is replaced by fact `by`: a new version of it (the same text), so that the
    replacement travels to other devices as an edit does. False (nothing changed) if the fact
    is gone or already replaced (by another process, while a turn decided)."""
    stored = version_of(con, fact_id)
    if stored is None or _replacing_fact_here(con, stored.replaced_by):
        return False
    set_replaced(con, fact_id, by, now)
    return True


def _replacing_fact_here(con: duckdb.DuckDBPyConnection, uid: str | None) -> bool:
    """Whether the fact with `uid` (one that replaced another) is stored: once it is deleted,
    the fact it replaced is current again, and can be replaced anew."""
    if uid is None:
        return False
    return con.execute("SELECT 1 FROM facts WHERE uid = ?", [uid]).fetchone() is not None


def set_replaced(
    con: duckdb.DuckDBPyConnection, fact_id: int, by: int | None, now: datetime
) -> None:
    """A new version of a stored fact, replaced by fact `by` (None: current again)."""
    stored = version_of(con, fact_id)
    assert stored is not None
    device, _ = device_of(con)
    con.execute(
        "UPDATE facts SET replaced_by = (SELECT uid FROM facts WHERE id = ?), replaced_at = ?,"
        " updated_at = ?, device_uid = NULL, version = ?, clock = ? WHERE id = ?",
        [
            by,
            None if by is None else to_db(now),
            to_db(now),
            stored.version + 1,
            edited_clock(stored_clock(stored.clock, stored.version), device),
            fact_id,
        ],
    )


def fact_of(row: tuple) -> Fact:
    """A row of SELECT_FACTS; a fact whose replacing fact is gone is current (no replaced_at)."""
    replaced = row[6] is not None
    return Fact(
        row[0],
        row[1],
        row[2],
        as_utc(row[3]),
        as_utc(row[4]),
        row[5],
        row[6],
        as_utc(row[7]) if replaced else None,
    )


def check_fact_text(text: object) -> str:
    """A fact's text, stripped; InputError if it is not text, is blank or is too long."""
    text = check_text(text, "fact", allow_empty=False).strip()
    if len(text) > MAX_FACT_CHARS:
        raise InputError(
            f"a fact is at most {MAX_FACT_CHARS:,} characters, and this one has {len(text):,}:"
            " keep it to a sentence or two (the chat log is the place for long text)"
        )
    return text


def check_source(source: str) -> None:
    if source not in SOURCES:
        raise InputError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")


def write_erased_facts(
    con: duckdb.DuckDBPyConnection, ids: tuple[int, ...], edits: dict[int, FactEdit]
) -> None:
    """The facts step of an erase (mlxmem.memory.tables.db): delete facts `ids` and rewrite
    the texts `edits` names, in the facts file; doing it again is harmless."""
    if ids:
        con.execute("DELETE FROM facts WHERE list_contains(?, id)", [list(ids)])
    for fact_id, edit in edits.items():
        con.execute(
            "UPDATE facts SET text = ?, updated_at = ?, device_uid = ?,"
            " version = coalesce(?, coalesce(version, 0) + 1), clock = ?,"
            " replaced_by = ?, replaced_at = ? WHERE id = ?",
            [
                edit.text,
                edit.updated_at,
                edit.device_uid,
                edit.version,
                edit.clock,
                edit.replaced_by,
                edit.replaced_at,
                fact_id,
            ],
        )


# The columns a merge sets on a fact it adds from another device's record.
SYNCED_COLUMNS = (
    "uid",
    "device_uid",
    "updated_at",
    "version",
    "turn_uid",
    "fork_of",
    "clock",
    "replaced_by",
    "replaced_at",
)


def set_synced(con: duckdb.DuckDBPyConnection, fact_id: int, **values: object) -> None:
    """Set fact `fact_id`'s sync columns (SYNCED_COLUMNS) to what another device's record says."""
    unknown = set(values) - set(SYNCED_COLUMNS)
    if unknown:
        raise ValueError(f"not a synced column of facts: {sorted(unknown)}")
    assignments = ", ".join(f"{column} = ?" for column in values)
    con.execute(f"UPDATE facts SET {assignments} WHERE id = ?", [*values.values(), fact_id])


def link_to_turns(con: duckdb.DuckDBPyConnection) -> None:
    """Facts that arrived before the turn they were taken from: linked to it, now it is here."""
    con.execute(
        "UPDATE facts SET turn_id = m.id FROM turns m"
        " WHERE facts.turn_id IS NULL AND facts.turn_uid = m.uid"
    )
