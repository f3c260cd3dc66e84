"""Layers 2 and 3 in one DuckDB file: the chat log (turns, in conversations), the rolling
summaries derived from it, and the facts about the person.

`Store` joins one class per kind of record (`TurnLog`, `SummaryLog`, `FactList`) over the
`Database` that opens, locks and erases, and reads the snapshot a turn is written from in one
open of the file. Deleting, which reaches into all three kinds, is mlxmem.memory.forget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

import duckdb

from mlxmem.memory import forget
from mlxmem.memory.forget import LAST_SEQ, Deletion
from mlxmem.memory.recall import RECALL_TURNS, RecallQuery, search_before
from mlxmem.memory.tables.dates import Span
from mlxmem.memory.tables.db import forget_epoch
from mlxmem.memory.tables.fact_list import FactList
from mlxmem.memory.tables.facts import Fact, all_facts, note_automatic
from mlxmem.memory.tables.rows import one_row
from mlxmem.memory.tables.summaries import Summary, SummaryLog, insert_summary, latest_summary
from mlxmem.memory.tables.tombstones import Tombstone
from mlxmem.memory.tables.turns import (
    Conversation,
    Turn,
    TurnLog,
    clear_looks,
    insert_turn,
    turns_after,
)
from mlxmem.text import as_utc

NO_QUERY = RecallQuery()  # nothing to recall
Transaction = Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]

__all__ = [
    "LAST_SEQ",
    "Conversation",
    "Deletion",
    "Fact",
    "Snapshot",
    "Store",
    "Summary",
    "Tombstone",
    "Turn",
]


@dataclass(frozen=True)
class Snapshot:
    facts: list[Fact]  # the current ones
    summary: Summary | None
    turns: list[Turn]  # the verbatim window: turns after the summary's range
    forget_epoch: int
    recalled: list[Turn] = field(default_factory=list)  # older turns matching `query`
    # When the summary's first and last turns were written: the days it covers, and the turn
    # before the window, whose day decides whether the window's first turn shows its date.
    summary_span: Span | None = None
    # Replaced facts: one whose replacement has not joined the prompt yet stays in it (see
    # mlxmem.memory.prompt.prompt_facts).
    replaced: list[Fact] = field(default_factory=list)


class TurnWrites:
    """What a turn writes after its reply, each write a transaction of its own, all under one
    check that nothing was deleted since the turn read the store (Store.turn_writes)."""

    def __init__(self, transaction: Transaction):
        self._transaction = transaction

    def reply(
        self,
        snap: Snapshot,
        text: str,
        token_count: int,
        interrupted: bool,
        sampled: tuple[list[int] | None, str | None],
        at: datetime | None,
    ) -> Snapshot:
        """Log the model's reply to the newest turn of `snap` (`sampled`: the ids the model
        sampled, and the model's identity; None, None when the text is not all the model's);
        `snap` with it."""
        with self._transaction() as con:
            turn = insert_turn(
                con, snap.turns[-1].conversation, "assistant", text, token_count, interrupted,
                *sampled, create=False, at=at,
            )  # fmt: skip
        return with_turn(snap, turn)

    def summaries(self, snap: Snapshot, made: Sequence[Summary]) -> Snapshot:
        """Store the summaries folds made, oldest first; `snap` with the newest."""
        with self._transaction() as con:
            for summary in made:
                snap = with_summary(snap, insert_summary(con, summary))
        return snap

    def facts(self, found: Sequence[tuple[str, int, int | None]]) -> list[tuple[Fact, int | None]]:
        """Store the automatic facts `found` (text, the turn it came from, the id of the fact it
        replaces), each noted with the id it replaced; one said already is left out."""
        with self._transaction() as con:
            noted = [note_automatic(con, *f) for f in found]
        return [n for n in noted if n is not None]

    def looked(self, turn_ids: Sequence[int]) -> None:
        """The turns looked at for a fact: their marks in the log go."""
        with self._transaction() as con:
            clear_looks(con, list(turn_ids))


class Store(TurnLog, SummaryLog, FactList):
    """The chat log, summaries and facts in the DuckDB file at `path` (default:
    paths.db_path()), with the KV cache folder its deletions wipe: what a chat, history,
    memory and serve read and write. Deleting goes through mlxmem.memory.forget; a sync goes
    through mlxmem.memory.sync.synclog.SyncLog over the same file."""

    def snapshot(
        self, conversation: str, query: RecallQuery = NO_QUERY, recall_limit: int = RECALL_TURNS
    ) -> Snapshot:
        """Everything a turn reads, in one open of the file: the facts, the newest summary,
        the turns after it, the forget epoch, and (given `query`) the turns before the
        window that match them best."""
        with self.connect() as con:
            return _snapshot(con, conversation, query, recall_limit)

    @contextmanager
    def turn_writes(self, epoch: int) -> Iterator[TurnWrites]:
        """A turn's writes after its reply (TurnWrites), in one operation; StaleError, and
        nothing written, if anything was deleted since forget epoch `epoch`. The block may work
        on under the same check after them (a cache file)."""
        with self.steps(epoch) as transaction:
            yield TurnWrites(transaction)

    def append_and_snapshot(
        self,
        conversation: str,
        text: str,
        token_ids: Sequence[int],
        encoded_by: str,
        query: RecallQuery = NO_QUERY,
        at: datetime | None = None,
        previous: Snapshot | None = None,
        mark: tuple[int, int] | None = None,
        look_due: bool = False,
    ) -> tuple[Turn, Snapshot]:
        """Log the person's message with the token ids `encoded_by` (a model identity) encoded
        it as, and read the snapshot the reply is written from (with the turns recalled for
        `query`): one open of the file, where opening one costs more than the rest of
        the turn's bookkeeping. `at`: when it was written, if not now (a chat log replayed).
        `previous`: the conversation's snapshot when this store's mark() was `mark`; if the
        mark has not moved (the store stayed held and nothing ran through it since, so nothing
        wrote), the snapshot is `previous` plus the new turn, and nothing is read again.
        `look_due`: the message is to be looked at for a fact (see insert_turn)."""
        with self.connect() as con:
            unchanged = previous is not None and mark is not None and mark == self.mark()
            ids = list(token_ids)
            turn = insert_turn(
                con,
                conversation,
                "user",
                text,
                len(ids),
                False,
                ids,
                encoded_by,
                at=at,
                look_due=look_due,
            )
            if unchanged and previous is not None:
                return turn, _extended(con, previous, turn, query)
            return turn, _snapshot(con, conversation, query)

    def delete_facts(self, ids: list[int], with_mentions: bool = False) -> Deletion:
        """forget.delete_facts: the facts, the summaries that saw them, and (`with_mentions`)
        the turns that quote them."""
        return forget.delete_facts(self, ids, with_mentions)

    def clear_facts(self, source: str | None = None) -> Deletion:
        """Delete every fact (or every fact from `source`), as delete_facts does."""
        return forget.clear_facts(self, source)

    def edit_fact(self, fact_id: int, text: str) -> Fact:
        """Replace a fact's text; the old text is erased (forget.edit_fact)."""
        return forget.edit_fact(self, fact_id, text)

    def mentions(self, fact: Fact) -> list[Turn]:
        """Turns of the log that still contain a fact's text (a reply that quoted it)."""
        return forget.mentions(self, fact)

    def delete_turns(self, ids: list[int], with_mentions: bool = False) -> Deletion:
        """forget.delete_turns: the turns, the summaries and automatic facts derived from
        them, and (`with_mentions`) the turns that repeat them."""
        return forget.delete_turns(self, ids, with_mentions)

    def delete_turn_range(self, conversation: str, first_seq: int, last_seq: int) -> Deletion:
        """Delete the turns first_seq..last_seq (inclusive) of `conversation`."""
        return forget.delete_turn_range(self, conversation, first_seq, last_seq)

    def delete_conversation(self, name: str) -> Deletion:
        """Delete a conversation with all its turns and summaries."""
        return forget.delete_conversation(self, name)


def _snapshot(
    con: duckdb.DuckDBPyConnection,
    conversation: str,
    query: RecallQuery = NO_QUERY,
    recall_limit: int = RECALL_TURNS,
) -> Snapshot:
    summary = latest_summary(con, conversation)
    recalled = []
    if query:
        last_seq = summary.last_seq if summary is not None else 0
        recalled = search_before(con, conversation, last_seq, query, recall_limit)
    facts = all_facts(con, replaced=True)
    return Snapshot(
        facts=[f for f in facts if f.replaced_by is None],
        replaced=[f for f in facts if f.replaced_by is not None],
        summary=summary,
        turns=turns_after(con, conversation, summary.last_seq if summary else None),
        forget_epoch=forget_epoch(con),
        recalled=recalled,
        summary_span=_span(con, conversation, summary.first_seq, summary.last_seq)
        if summary
        else None,
    )


def _span(
    con: duckdb.DuckDBPyConnection, conversation: str, first_seq: int, last_seq: int
) -> Span | None:
    """When the turns first_seq..last_seq were written, first and last (a conversation's turns
    are in time order)."""
    first, last = one_row(
        con.execute(
            "SELECT min(m.created_at), max(m.created_at) FROM turns m JOIN conversations c"
            " ON c.id = m.conversation_id WHERE c.name = ? AND m.seq BETWEEN ? AND ?",
            [conversation, first_seq, last_seq],
        )
    )
    return None if first is None else (as_utc(first), as_utc(last))


def _extended(
    con: duckdb.DuckDBPyConnection,
    previous: Snapshot,
    turn: Turn,
    query: RecallQuery = NO_QUERY,
    recall_limit: int = RECALL_TURNS,
) -> Snapshot:
    """`previous` with `turn` appended to its window, and the turns recalled for
    `query` searched afresh: what _snapshot would read if nothing else changed."""
    snap, summary = with_turn(previous, turn), previous.summary
    if not query:
        return snap
    last_seq = summary.last_seq if summary is not None else 0
    recalled = search_before(con, turn.conversation, last_seq, query, recall_limit)
    return replace(snap, recalled=recalled)


def with_turn(snap: Snapshot, turn: Turn) -> Snapshot:
    """`snap` once `turn` (just logged) is the newest turn of its window, as _snapshot would
    read it (nothing recalled)."""
    return replace(snap, turns=[*snap.turns, turn], recalled=[])


def with_summary(snap: Snapshot, summary: Summary) -> Snapshot:
    """`snap` once `summary` (a fold of its oldest turns, rolling its summary forward) is the
    newest summary: the turns it covers leave the window, as _snapshot would read it."""
    covered = [t.created_at for t in snap.turns if summary.first_seq <= t.seq <= summary.last_seq]
    if (
        snap.summary is not None
        and snap.summary_span
        and summary.first_seq <= snap.summary.first_seq
    ):
        covered += snap.summary_span
    return replace(
        snap,
        summary=summary,
        turns=[t for t in snap.turns if t.seq > summary.last_seq],
        recalled=[],
        summary_span=(min(covered), max(covered)) if covered else None,
    )


def with_fact(snap: Snapshot, fact: Fact, replaces: int | None = None) -> Snapshot:
    """`snap` once `fact` (just added, so the highest id) is among the facts, having replaced
    fact `replaces` if given."""
    gone = [
        replace(f, replaced_by=fact.id, replaced_at=fact.created_at)
        for f in snap.facts
        if f.id == replaces
    ]
    facts = [f for f in snap.facts if f.id != replaces]
    return replace(snap, facts=[*facts, fact], replaced=snap.replaced + gone, recalled=[])
