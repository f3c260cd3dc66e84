"""Layers 2 and 3 in one DuckDB file: the chat log (turns, in conversations), the rolling
summaries derived from it, and the facts about the person.

`Store` joins one class per kind of record (`TurnLog`, `SummaryLog`, `FactList`) over the
`Database` that opens, locks and erases; deleting turns lives here because it reaches into
all three kinds.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from mlxmem.errors import InputError, NotFoundError
from mlxmem.memory import summaries
from mlxmem.memory.db import FORGET_EPOCH
from mlxmem.memory.facts import Fact, FactList, all_facts
from mlxmem.memory.summaries import Summary, SummaryLog, latest_summary, summary_of
from mlxmem.memory.turns import (
    SELECT_TURNS,
    Conversation,
    Turn,
    TurnLog,
    conversation_id,
    get_turn,
    turn_of,
    turns_after,
)

__all__ = ["Conversation", "Deletion", "Fact", "Snapshot", "Store", "Summary", "Turn"]


@dataclass(frozen=True)
class Deletion:
    """What a delete removed."""

    turns: list[Turn]
    summaries: list[Summary]
    conversations: list[str]


@dataclass(frozen=True)
class Snapshot:
    facts: list[Fact]
    summary: Summary | None
    turns: list[Turn]  # the verbatim window: turns after the summary's range
    forget_epoch: int


class Store(TurnLog, SummaryLog, FactList):
    """The chat log, summaries and facts in the DuckDB file at `path` (default:
    paths.db_path()), with the KV cache folder its deletions wipe."""

    def snapshot(self, conversation: str) -> Snapshot:
        """Everything a turn reads, in one open of the file: the facts, the newest summary,
        the turns after it, and the forget epoch."""
        with self.connect() as con:
            summary = latest_summary(con, conversation)
            return Snapshot(
                facts=all_facts(con),
                summary=summary,
                turns=turns_after(con, conversation, summary and summary.last_seq),
                forget_epoch=_forget_epoch(con),
            )

    def forget_epoch(self) -> int:
        """Counts deletions and edits: a KV cache built before a change may hold removed text."""
        with self.connect() as con:
            return _forget_epoch(con)

    def delete_turns(self, ids: list[int]) -> Deletion:
        """Delete turns by id, and every summary whose range covers one of them."""
        with self.forgetting() as con:
            victims = [get_turn(con, tid) for tid in dict.fromkeys(ids)]
            return _delete_turns(con, victims)

    def delete_turn_range(self, conversation: str, first_seq: int, last_seq: int) -> Deletion:
        """Delete the turns first_seq..last_seq (inclusive) of `conversation`."""
        if first_seq > last_seq:
            raise InputError(f"empty range: {first_seq} is after {last_seq}")
        with self.forgetting() as con:
            conversation_id(con, conversation)
            rows = con.execute(
                f"{SELECT_TURNS} WHERE c.name = ? AND m.seq BETWEEN ? AND ? ORDER BY m.seq",
                [conversation, first_seq, last_seq],
            ).fetchall()
            if not rows:
                raise NotFoundError(
                    f"no turns {first_seq}..{last_seq} in conversation {conversation!r}"
                )
            return _delete_turns(con, [turn_of(row) for row in rows])

    def delete_conversation(self, name: str) -> Deletion:
        """Delete a conversation with all its turns and summaries."""
        with self.forgetting() as con:
            cid = conversation_id(con, name)
            rows = con.execute(f"{SELECT_TURNS} WHERE c.id = ? ORDER BY m.seq", [cid]).fetchall()
            deletion = _delete_turns(con, [turn_of(row) for row in rows])
            rest = con.execute(f"{summaries.SELECT_SUMMARIES} WHERE c.id = ?", [cid]).fetchall()
            con.execute("DELETE FROM summaries WHERE conversation_id = ?", [cid])
            con.execute("DELETE FROM conversations WHERE id = ?", [cid])
        return Deletion(deletion.turns, deletion.summaries + [summary_of(r) for r in rest], [name])


def _forget_epoch(con: duckdb.DuckDBPyConnection) -> int:
    row = con.execute("SELECT value FROM state WHERE key = ?", [FORGET_EPOCH]).fetchone()
    return 0 if row is None else int(row[0])


def _delete_turns(con: duckdb.DuckDBPyConnection, victims: list[Turn]) -> Deletion:
    names = list(dict.fromkeys(t.conversation for t in victims))
    hit: list[Summary] = []
    for name in names:
        hit += summaries.delete_covering(
            con, name, [t.seq for t in victims if t.conversation == name]
        )
    ids = [t.id for t in victims]
    con.execute("UPDATE facts SET message_id = NULL WHERE list_contains(?, message_id)", [ids])
    con.execute("DELETE FROM messages WHERE list_contains(?, id)", [ids])
    return Deletion(victims, hit, names)
