"""Layer 1's rolling summaries, as stored: each covers a range of a conversation's turns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import duckdb

from mlxmem.errors import InputError
from mlxmem.memory.tables.db import Database
from mlxmem.memory.tables.rows import one_row
from mlxmem.memory.tables.turns import conversation_id
from mlxmem.text import as_utc, check_text, to_db, utc_now


@dataclass(frozen=True)
class Summary:
    id: int  # 0: made by a fold, not stored yet
    conversation: str
    text: str
    first_seq: int
    last_seq: int
    token_count: int | None
    created_at: datetime
    fact_ids: tuple[int, ...] = ()  # the facts that were in the summary's prompt
    # Who wrote it: "model"; "model+extractive" (the model's, then the folded turns' sentences
    # with the names, numbers and dates it left out); or "extractive" (the model's failed the
    # check, or it could not see every folded turn); None for one written before sources were
    # recorded.
    source: str | None = None


SOURCES = ("model", "model+extractive", "extractive")


def describe_source(source: str | None) -> str:
    """Who wrote a summary, as the front ends say it."""
    if source == "model":
        return "written by the model"
    if source == "model+extractive":
        return "written by the model, then the names, numbers and dates it left out, from the turns"
    if source == "extractive":
        return "extractive: picked from the turns, the model's summary failed the check"
    return "unknown: written before sources were recorded"


SELECT_SUMMARIES = """SELECT s.id, c.name, s.text, s.first_seq, s.last_seq, s.token_count,
    s.created_at, s.fact_ids, s.source
    FROM summaries s JOIN conversations c ON c.id = s.conversation_id"""


class SummaryLog(Database):
    def add_summary(
        self,
        conversation: str,
        text: str,
        first_seq: int,
        last_seq: int,
        token_count: int | None,
        fact_ids: Sequence[int] = (),
        epoch: int | None = None,
        source: str = "model",
    ) -> Summary:
        """Record a summary of the turns first_seq..last_seq of `conversation`, written with
        the facts `fact_ids` in its prompt, by `source` (see SOURCES). With `epoch`, refused
        (StaleError) if anything was deleted since the store was read at that forget epoch."""
        check_text(text, "summary")
        if first_seq > last_seq:
            raise InputError(f"empty range: {first_seq} is after {last_seq}")
        summary = Summary(
            0,
            conversation,
            text,
            first_seq,
            last_seq,
            token_count,
            utc_now(),
            tuple(fact_ids),
            source,
        )
        with self.guarded(epoch) as con:
            return insert_summary(con, summary)

    def latest_summary(self, conversation: str) -> Summary | None:
        """The summary reaching furthest into `conversation`, or None."""
        with self.connect() as con:
            return latest_summary(con, conversation)

    def summaries(self, conversation: str) -> list[Summary]:
        with self.connect() as con:
            rows = con.execute(f"{SELECT_SUMMARIES} WHERE c.name = ? ORDER BY s.id", [conversation])
            return [summary_of(row) for row in rows.fetchall()]


def insert_summary(con: duckdb.DuckDBPyConnection, summary: Summary) -> Summary:
    """Record `summary` (made, not yet stored: its id is not used) inside an open transaction;
    return it with the id it was given."""
    if summary.source not in SOURCES:
        raise InputError(f"unknown summary source {summary.source!r}: one of {', '.join(SOURCES)}")
    cid = conversation_id(con, summary.conversation)
    (sid,) = one_row(
        con.execute(
            "INSERT INTO summaries (conversation_id, text, first_seq, last_seq, token_count,"
            " created_at, fact_ids, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            [
                cid,
                summary.text,
                summary.first_seq,
                summary.last_seq,
                summary.token_count,
                to_db(summary.created_at),
                list(summary.fact_ids),
                summary.source,
            ],
        )
    )
    return replace(summary, id=sid)


def latest_summary(con: duckdb.DuckDBPyConnection, conversation: str) -> Summary | None:
    row = con.execute(
        f"{SELECT_SUMMARIES} WHERE c.name = ? ORDER BY s.last_seq DESC, s.id DESC LIMIT 1",
        [conversation],
    ).fetchone()
    return None if row is None else summary_of(row)


def delete_derived(
    con: duckdb.DuckDBPyConnection,
    conversation: str,
    seqs: Sequence[int] = (),
    fact_ids: Sequence[int] = (),
) -> list[Summary]:
    """Delete the summaries of `conversation` that saw one of the turns `seqs` (in their
    range) or one of the facts `fact_ids` (in their prompt), and every later summary of the
    conversation, which rolled them forward. The window then reaches back to the newest summary
    left, and the next turn folds it again from the remaining log."""
    rows = con.execute(f"{SELECT_SUMMARIES} WHERE c.name = ? ORDER BY s.id", [conversation])
    found = [summary_of(row) for row in rows.fetchall()]
    saw = [
        s
        for s in found
        if any(s.first_seq <= q <= s.last_seq for q in seqs) or set(s.fact_ids) & set(fact_ids)
    ]
    if not saw:
        return []
    hit = [s for s in found if s.id >= saw[0].id]
    con.execute("DELETE FROM summaries WHERE list_contains(?, id)", [[s.id for s in hit]])
    return hit


def summary_of(row: tuple) -> Summary:
    return Summary(
        row[0], row[1], row[2], row[3], row[4], row[5], as_utc(row[6]), tuple(row[7] or ()), row[8]
    )


def delete_of_conversation(con: duckdb.DuckDBPyConnection, cid: int) -> None:
    """Every summary of conversation `cid`, inside the caller's erase."""
    con.execute("DELETE FROM summaries WHERE conversation_id = ?", [cid])
