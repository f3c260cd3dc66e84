"""The looks for a fact after a reply (layer 3 from layer 2), and the queue of those postponed.

A person's message that may hold a fact is marked in the log (`look_due`) when it is logged.
It is looked at after its reply, or later if a message is waiting for the model: the look
gives way, and the message waits in the queue for the next turn. Each mark is cleared once
its look is done, so a Ctrl-C, a server's stop or a kill leaves the queue in the log, and the
next Companion reads it back."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from mlxmem.defaults import FACTS_SLOT
from mlxmem.engine import Engine
from mlxmem.errors import StaleError
from mlxmem.memory.extraction import FactExtractor, Look, should_extract
from mlxmem.memory.store import Fact, Store, Turn, TurnWrites
from mlxmem.memory.tables.facts import check_fact_text
from mlxmem.memory.turn import ChatSettings

# Messages whose look for a fact may wait for a later turn: beyond them, the oldest is looked
# at without giving way to the person's next message (a short wait, and no fact lost).
POSTPONE_LIMIT = 3


@dataclass(frozen=True)
class Candidate:
    """A fact a look took from a message after the reply, checked, not stored yet (noted once
    stored), and the id of the current fact it makes out of date (or None)."""

    text: str
    message: Turn
    replaces: int | None

    def row(self) -> tuple[str, int, int | None]:
        """As TurnWrites.facts stores it: the text, its turn's id, the fact it replaces."""
        return self.text, self.message.id, self.replaces


def look_due(settings: ChatSettings, text: str) -> bool:
    """Whether the person's message `text` is to be looked at for a fact."""
    return settings.extract_facts and should_extract(text)


@dataclass
class FactLooks:
    """The looks for facts in one conversation's messages, and the queue of the postponed."""

    engine: Engine
    store: Store
    conversation: str
    settings: ChatSettings
    extractor: FactExtractor
    # Messages whose look is still to come, oldest first, as the log's marks say.
    postponed: list[Turn] = field(init=False)
    looked: list[int] = field(default_factory=list)  # looked at since the marks were cleared

    def __post_init__(self) -> None:
        self.postponed = self.due_in_store()

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

    def clear_looked(self, writes: TurnWrites) -> None:
        """Clear the log's marks of the messages looked at, in a transaction of their own
        after the facts found in them are stored (a kill between the two looks again: the
        fact is then a duplicate, not lost)."""
        if self.looked:
            writes.looked(self.looked)
            self.looked = []

    def catch_up(
        self, facts: list[Fact], epoch: int, should_yield: Callable[[], bool] | None
    ) -> list[tuple[Fact, int | None]]:
        """Look at the postponed messages now (the store at forget epoch `epoch` holds `facts`)
        and store what is found, each with the id of the fact it replaced; none if a deletion
        came since."""
        candidates = self.look(None, facts, None, should_yield, [])
        if not candidates and not self.looked:
            return []
        try:
            with self.store.turn_writes(epoch) as writes:
                noted = writes.facts([c.row() for c in candidates]) if candidates else []
                self.clear_looked(writes)
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
    ) -> list[Candidate]:
        """Look for a fact in each message postponed so far, oldest first, then in `user`'s
        (None: this message is not looked at), adding each look's outcome to `outcomes`. Each
        look stops when `should_yield()` turns true (a message is waiting for the model), and
        it and the rest are postponed again: the person never waits for a fact, and a fact is
        never lost to a fast typist, since beyond POSTPONE_LIMIT messages the oldest is looked
        at without yielding."""
        queue = [*self.postponed, *([user] if user is not None else [])]
        self.postponed = []
        candidates: list[Candidate] = []
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
                    candidates.append(
                        Candidate(look.fact, message, self._replaces(look.fact, facts))
                    )
                    shown.append(look.fact)
        except KeyboardInterrupt:
            # Nothing found is stored: every message waits for its look again.
            self.postponed = queue
            raise
        self.looked += looked
        return candidates

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
