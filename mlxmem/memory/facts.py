"""Layer 3 as stored: the facts about the person, each manual or automatic."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime

import duckdb

from mlxmem.errors import DuplicateFactError, InputError, NotFoundError
from mlxmem.memory.db import Database
from mlxmem.memory.turns import get_turn
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
    message_id: int | None  # the turn an automatic fact was extracted from


SELECT_FACTS = "SELECT id, text, source, created_at, updated_at, message_id FROM facts"


class FactList(Database):
    def facts(self) -> list[Fact]:
        with self.connect() as con:
            return all_facts(con)

    def get_fact(self, fact_id: int) -> Fact:
        with self.connect() as con:
            return get_fact(con, fact_id)

    def add_fact(
        self,
        text: str,
        source: str = "manual",
        message_id: int | None = None,
        epoch: int | None = None,
    ) -> Fact:
        """Add a fact; `message_id` names the turn it was extracted from, if any. With
        `epoch`, refused (StaleError) if anything was deleted since that forget epoch."""
        text = check_fact_text(text)
        check_source(source)
        now = utc_now()
        with self.guarded(epoch) as con:
            if message_id is not None:
                get_turn(con, message_id)
            refuse_duplicate(con, text)
            return insert_fact(con, text, source, message_id, now)


def insert_fact(
    con: duckdb.DuckDBPyConnection,
    text: str,
    source: str,
    message_id: int | None = None,
    now: datetime | None = None,
) -> Fact:
    """Add a fact inside an open transaction; its id comes from the facts file's counter, so
    an id is never handed out twice (deleted facts' included)."""
    now = now or utc_now()
    counter = "UPDATE fact_counter SET last_id = last_id + 1 RETURNING last_id"
    (fid,) = con.execute(counter).fetchone()
    con.execute(
        "INSERT INTO facts (id, text, source, created_at, updated_at, message_id, message_uid)"
        " SELECT ?, ?, ?, ?, ?, ?, (SELECT uid FROM messages WHERE id = ?)",
        [fid, text, source, to_db(now), to_db(now), message_id, message_id],
    )
    return Fact(fid, text, source, now, now, message_id)


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


def all_facts(con: duckdb.DuckDBPyConnection) -> list[Fact]:
    return [fact_of(row) for row in con.execute(f"{SELECT_FACTS} ORDER BY id").fetchall()]


def get_fact(con: duckdb.DuckDBPyConnection, fact_id: int) -> Fact:
    row = con.execute(f"{SELECT_FACTS} WHERE id = ?", [fact_id]).fetchone()
    if row is None:
        raise NotFoundError(f"no fact with id {fact_id}")
    return fact_of(row)


def version_of(con: duckdb.DuckDBPyConnection, fact_id: int) -> tuple[int, str | None]:
    """A stored fact's version counter and version vector (JSON, or None: see records)."""
    (version, clock) = con.execute(
        "SELECT coalesce(version, 0), clock FROM facts WHERE id = ?", [fact_id]
    ).fetchone()
    return version, clock


def fact_of(row: tuple) -> Fact:
    return Fact(row[0], row[1], row[2], as_utc(row[3]), as_utc(row[4]), row[5])


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
