"""The looks for a fact after a reply (layer 3 from layer 2), and the queue of those postponed.

A person's message that may hold a fact is marked in the log (`look_due`) when it is logged.
It is looked at after its reply, or later if a message is waiting for the model: the look
gives way, and the message waits in the queue for the next turn. Each mark is cleared once
its look is done, so a Ctrl-C, a server's stop or a kill leaves the queue in the log, and the
next Companion reads it back."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

import duckdb

from mlxmem.defaults import FACTS_SLOT
from mlxmem.engine import Engine
from mlxmem.errors import StaleError
from mlxmem.memory.extraction import FactExtractor, Look, should_extract
from mlxmem.memory.store import Fact, Store, Turn
from mlxmem.memory.tables.facts import check_fact_text, duplicate_of, insert_fact, mark_replaced
from mlxmem.memory.tables.turns import clear_looks
from mlxmem.memory.turn import ChatSettings

# Messages whose look for a fact may wait for a later turn: beyond them, the oldest is looked
# at without giving way to the person's next message (a short wait, and no fact lost).
POSTPONE_LIMIT = 3

Transaction = Callable[[], AbstractContextManager[duckdb.DuckDBPyConnection]]


@dataclass(frozen=True)
class Found:
    """A fact taken from a message after the reply, checked, not stored yet, and the id of
    the current fact it makes out of date (or None)."""

    text: str
    message: Turn
    replaces: int | None


def look_due(settings: ChatSettings, text: str) -> bool:
    """Whether the person's message `text` is to be looked at for a fact."""
    return settings.extract_facts and should_extract(text)


def insert_found(
    con: duckdb.DuckDBPyConnection, found: list[Found]
) -> list[tuple[Fact, int | None]]:
    """Store the facts `found` (inside a store operation), each with the id of the fact it
    replaced; one stored meanwhile is not stored twice (extraction checked those it was
    shown)."""
    noted: list[tuple[Fact, int | None]] = []
    for f in found:
        if duplicate_of(con, f.text) is not None:
            continue
        added = insert_fact(con, f.text, "automatic", f.message.id)
        replaced = f.replaces
        if replaced is not None and not mark_replaced(con, replaced, added.id, added.created_at):
            replaced = None
        noted.append((added, replaced))
    return noted


class FactLooks:
    """The looks for facts in one conversation's messages, and the queue of the postponed."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        conversation: str,
        context_tokens: int,
        settings: ChatSettings,
    ):
        self.engine = engine
        self.store = store
        self.conversation = conversation
        self.settings = settings
        self.extractor = FactExtractor(engine, context_tokens)
        # Messages whose look is still to come, oldest first, as the log's marks say.
        self.postponed: list[Turn] = self.due_in_store()
        self.looked: list[int] = []  # turns looked at since the marks were last cleared

    def due_in_store(self) -> list[Turn]:
        """The messages of this conversation the log marks for a look (none when this
        conversation does not look for facts)."""
        return self.store.looks_due(self.conversation) if self.settings.extract_facts else []

    def due(self, text: str) -> bool:
        return look_due(self.settings, text)

    def reread(self) -> None:
        """Read the queue back from the log: after a deletion, one of the messages may be
        what was deleted, and the log's marks say which are left."""
        self.postponed, self.looked = self.due_in_store(), []

    def forget_slot(self) -> None:
        """A deletion came: the extractor's slot in memory ends with an older message, which
        may be the deleted one, so it goes, and the queue is read again."""
        self.engine.drop_slot(FACTS_SLOT)
        self.reread()

    def clear_looked(self, transaction: Transaction) -> None:
        """Clear the log's marks of the messages looked at, in a transaction of their own
        after the facts found in them are stored (a kill between the two looks again: the
        fact is then a duplicate, not lost)."""
        if self.looked:
            with transaction() as con:
                clear_looks(con, self.looked)
            self.looked = []

    def catch_up(
        self, facts: list[Fact], epoch: int, should_yield: Callable[[], bool] | None
    ) -> list[tuple[Fact, int | None]]:
        """Look at the postponed messages now (the store at forget epoch `epoch` holds `facts`)
        and store what is found, each with the id of the fact it replaced; none if a deletion
        came since."""
        found = self.look(None, facts, None, should_yield, [])
        if not found and not self.looked:
            return []
        try:
            with self.store.steps(epoch) as transaction:
                noted = []
                if found:
                    with transaction() as con:
                        noted = insert_found(con, found)
                self.clear_looked(transaction)
                return noted
        except StaleError:
            self.reread()
            return []

    def look(
        self,
        user: Turn | None,
        facts: list[Fact],
        on_status: Callable[[str], None] | None,
        should_yield: Callable[[], bool] | None,
        outcomes: list[str],
    ) -> list[Found]:
        """Look for a fact in each message postponed so far, oldest first, then in `user`'s
        (None: this message is not looked at), adding each look's outcome to `outcomes`. Each
        look stops when `should_yield()` turns true (a message is waiting for the model), and
        it and the rest are postponed again: the person never waits for a fact, and a fact is
        never lost to a fast typist, since beyond POSTPONE_LIMIT messages the oldest is looked
        at without yielding."""
        queue = [*self.postponed, *([user] if user is not None else [])]
        self.postponed = []
        found: list[Found] = []
        shown = [f.text for f in facts]
        looked = []
        try:
            for i, message, look in self._looks(queue, shown, on_status, should_yield):
                outcomes.append(look.outcome)
                if look.outcome == "postponed":
                    self.postponed = queue[i:]
                    break
                looked.append(message.id)
                if look.fact is not None:
                    found.append(Found(look.fact, message, self._replaces(look.fact, facts)))
                    shown.append(look.fact)
        except KeyboardInterrupt:
            # Nothing found is stored: every message waits for its look again.
            self.postponed = queue
            raise
        self.looked += looked
        return found

    def _looks(
        self,
        queue: list[Turn],
        shown: list[str],
        on_status: Callable[[str], None] | None,
        should_yield: Callable[[], bool] | None,
    ) -> Iterator[tuple[int, Turn, Look]]:
        """Each message of `queue` with its look, the last POSTPONE_LIMIT giving way."""
        for i, message in enumerate(queue):
            stop = should_yield if len(queue) - i <= POSTPONE_LIMIT else None
            if stop is not None and stop():
                yield i, message, Look(None, "postponed")
            else:
                yield i, message, self._extract(message, shown, on_status, stop)

    def _extract(
        self,
        user: Turn,
        facts: list[str],
        on_status: Callable[[str], None] | None,
        should_stop: Callable[[], bool] | None,
    ) -> Look:
        """The look for a fact in the person's message; a fact kept is checked, not stored
        yet."""
        if on_status:
            on_status("looking for something to remember")
        try:
            look = self.extractor.extract(user.text, facts, should_stop)
            return replace(look, fact=look.fact and check_fact_text(look.fact))
        except Exception as exc:  # noqa: BLE001 - extraction is best effort by design
            warnings.warn(f"fact extraction failed: {exc}", stacklevel=2)
            return Look(None, "failed")

    def _replaces(self, fact: str, facts: list[Fact]) -> int | None:
        """The id of a current fact that the new automatic `fact` replaces, if any (best
        effort, as extraction is); None when replacement is off."""
        if not self.settings.replace_facts:
            return None
        try:
            return self.extractor.replaces(fact, [(f.id, f.text) for f in facts])
        except Exception as exc:  # noqa: BLE001 - best effort by design
            warnings.warn(f"fact replacement check failed: {exc}", stacklevel=2)
            return None
