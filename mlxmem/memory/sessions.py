"""Companions by conversation over one engine, as a long-running front end keeps them
(`mlxmem serve`), and the rule that keeps deleted text out of their KV slots in memory."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from mlxmem.defaults import FACTS_SLOT
from mlxmem.engine import Engine
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Fact, Store

# Companions kept between turns. One is cheap to rebuild from the store, so the least recently
# used goes beyond this: a client inventing names cannot grow the server without bound. (The
# KV slots have their own cap, in the engine's slot pool.)
MAX_COMPANIONS = 64


@dataclass
class Sessions:
    """One Companion (and so one KV slot) per conversation, least recently used out. Touch it
    from the model's thread only: the engine's slots live there."""

    store: Store
    context_tokens: int
    response_reserve: int
    settings: ChatSettings
    limit: int = MAX_COMPANIONS
    _companions: OrderedDict[str, Companion] = field(default_factory=OrderedDict)
    _epoch: int | None = None

    def names(self) -> list[str]:
        """The conversations kept, least recently used first."""
        return list(self._companions)

    def get(self, engine: Engine, conversation: str) -> Companion:
        """The conversation's Companion, made on first use; evicting one drops its slot, else
        a later deletion could not reach the text it holds."""
        companion = self._companions.get(conversation)
        if companion is None:
            companion = Companion(
                engine,
                self.store,
                conversation,
                self.context_tokens,
                self.response_reserve,
                self.settings,
            )
            self._companions[conversation] = companion
            while len(self._companions) > self.limit:
                _, gone = self._companions.popitem(last=False)
                engine.drop_slot(gone.slot)
        self._companions.move_to_end(conversation)
        return companion

    def catch_up(
        self, should_yield: Callable[[], bool]
    ) -> list[tuple[str, list[tuple[Fact, int | None]]]]:
        """Each kept conversation's postponed looks for a fact (Companion.catch_up), until
        `should_yield()`; the facts noted, by conversation."""
        noted = []
        for name, companion in list(self._companions.items()):
            if should_yield():
                break
            if facts := companion.catch_up(should_yield):
                noted.append((name, facts))
        return noted

    def saw_epoch(self, engine: Engine, current: Companion, epoch: int) -> None:
        """Called with each turn's forget epoch. When it moved (a deletion, through any front
        end), the other conversations' slots in memory may hold the deleted text: drop them
        and their Companions (rebuilt from the store at their next turn). The current one's
        slot is trimmed by its own turn, and the fact extractor's slot goes too."""
        if self._epoch is not None and epoch != self._epoch:
            for name, companion in list(self._companions.items()):
                if companion is not current:
                    engine.drop_slot(companion.slot)
                    del self._companions[name]
            # The extractor's slot is shared: a Companion made after the deletion never saw
            # the epoch move, so it would not drop it.
            engine.drop_slot(FACTS_SLOT)
        self._epoch = epoch
