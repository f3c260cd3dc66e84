"""Layer 1's rolling summaries, as stored: each covers a range of a conversation's turns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import duckdb

from mlxmem.errors import InputError
from mlxmem.memory.db import Database
from mlxmem.memory.turns import conversation_id
from mlxmem.text import as_utc, check_text, to_db, utc_now


@dataclass(frozen=True)
class Summary:
    id: int
    conversation: str
    text: str
    first_seq: int
    last_seq: int
    token_count: int | None
    created_at: datetime


SELECT_SUMMARIES = """SELECT s.id, c.name, s.text, s.first_seq, s.last_seq, s.token_count,
    s.created_at FROM summaries s JOIN conversations c ON c.id = s.conversation_id"""


class SummaryLog(Database):
    def add_summary(
        self, conversation: str, text: str, first_seq: int, last_seq: int, token_count: int | None
    ) -> Summary:
        """Record a summary of the turns first_seq..last_seq of `conversation`."""
        check_text(text, "summary")
        if first_seq > last_seq:
            raise InputError(f"empty range: {first_seq} is after {last_seq}")
        now = utc_now()
        with self.connect() as con:
            cid = conversation_id(con, conversation)
            (sid,) = con.execute(
                "INSERT INTO summaries (conversation_id, text, first_seq, last_seq, token_count,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                [cid, text, first_seq, last_seq, token_count, to_db(now)],
            ).fetchone()
        return Summary(sid, conversation, text, first_seq, last_seq, token_count, now)

    def latest_summary(self, conversation: str) -> Summary | None:
        """The summary reaching furthest into `conversation`, or None."""
        with self.connect() as con:
            return latest_summary(con, conversation)

    def summaries(self, conversation: str) -> list[Summary]:
        with self.connect() as con:
            rows = con.execute(f"{SELECT_SUMMARIES} WHERE c.name = ? ORDER BY s.id", [conversation])
            return [summary_of(row) for row in rows.fetchall()]


def latest_summary(con: duckdb.DuckDBPyConnection, conversation: str) -> Summary | None:
    row = con.execute(
        f"{SELECT_SUMMARIES} WHERE c.name = ? ORDER BY s.last_seq DESC, s.id DESC LIMIT 1",
        [conversation],
    ).fetchone()
    return None if row is None else summary_of(row)


def delete_covering(
    con: duckdb.DuckDBPyConnection, conversation: str, seqs: Sequence[int]
) -> list[Summary]:
    """Delete the summaries of `conversation` whose range covers one of `seqs`: they were
    built from those turns and would keep their content."""
    rows = con.execute(f"{SELECT_SUMMARIES} WHERE c.name = ?", [conversation]).fetchall()
    hit = [s for s in map(summary_of, rows) if any(s.first_seq <= q <= s.last_seq for q in seqs)]
    con.execute("DELETE FROM summaries WHERE list_contains(?, id)", [[s.id for s in hit]])
    return hit


def summary_of(row: tuple) -> Summary:
    return Summary(*row[:6], as_utc(row[6]))
