"""The memory operations that MCP clients and `llm` see, as one class of typed methods whose
docstrings are the tools' descriptions: `mlxmem.surfaces.mcp_server` registers each public
method as an MCP tool, and `mlxmem.surfaces.llm_plugin` makes the class an `llm.Toolbox`.

Each method is one or two calls of the Store, the same as the `mlxmem memory` / `mlxmem
history` command of the same purpose: a delete is `Store.delete_facts`, `clear_facts`,
`delete_turns`, `delete_turn_range` or `delete_conversation` (the durable erase of
mlxmem.memory.forget), a search of the log is `Store.search`, recall is `Store.snapshot` with
the message's recall query. Fact names follow mem0's OpenMemory (`add_memories`,
`search_memory`, `list_memories`, `delete_memories`, `delete_all_memories`), so a person who
used it finds them.

These surfaces are outside every conversation, so a private conversation (`mlxmem history
private`) is never shown here: its turns are left out of searches, listings, recall and the
turns a deletion reports; it can still be deleted.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from typing import Any

from mlxmem.defaults import DEFAULT_CONVERSATION
from mlxmem.errors import InputError
from mlxmem.memory.recall import RECALL_TURNS, recall_query
from mlxmem.memory.store import LAST_SEQ, Deletion, Fact, Store
from mlxmem.memory.tables.facts import check_source
from mlxmem.memory.tables.terms import terms
from mlxmem.text import json_ready

SEARCH_RESULTS = 10  # facts or turns a search returns unless asked for more
LIST_TURNS = 20  # the newest turns of a conversation a listing returns unless asked
MAX_RESULTS = 1000  # the most one call returns: a client's context is small


class MemoryTools:
    """The facts (layer 3) and the chat log (layer 2) of one data directory, for a client
    outside mlxmem. Every method reads or writes through `store`; none keeps a copy."""

    def __init__(self, store: Store):
        self._store = store

    # -- Facts ------------------------------------------------------------------------------

    def list_memories(self, source: str | None = None, include_replaced: bool = False) -> dict:
        """List the facts mlxmem knows about the person (its long-term memory), each with its
        id, text and source: "manual" (added by the person) or "automatic" (noted from a
        chat). source: only "manual" or "automatic" ones. include_replaced: also the facts a
        newer one replaced (no longer shown to the model)."""
        if source is not None:
            check_source(source)
        facts = self._store.facts(replaced=include_replaced)
        return _listing([f for f in facts if source is None or f.source == source])

    def search_memory(self, query: str, limit: int = SEARCH_RESULTS) -> dict:
        """Search the facts about the person for QUERY: those sharing the most words with it
        (stemmed, as mlxmem's recall reads words) come first."""
        wanted = set(terms(query))
        if not wanted and not query.strip():
            raise InputError("search_memory needs a query")
        scored = [(_fact_score(f, query, wanted), f) for f in self._store.facts()]
        found = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], -s[1].id))
        return _listing([f for _, f in found[: _limit(limit)]])

    def add_memories(self, text: str, replaces: int | None = None, source: str = "manual") -> dict:
        """Add a fact about the person; mlxmem's model sees it from its next reply. source:
        "manual" when the person asked for it to be remembered, "automatic" when the
        assistant noted it on its own. replaces: the id of a fact this one makes out of date
        ("I moved to Porto" over "I live in Lisbon"): it leaves the model's view and stays
        listed as replaced."""
        return json_ready(self._store.add_fact(text, source=source, replaces=replaces))

    def edit_memory(self, memory_id: int, text: str) -> dict:
        """Replace a fact's text; the old text is erased from disk."""
        return json_ready(self._store.edit_fact(memory_id, text))

    def restore_memory(self, memory_id: int) -> dict:
        """Make a replaced fact current again (a replacement made in error); the fact that
        replaced it stays."""
        return json_ready(self._store.restore_fact(memory_id))

    def delete_memories(self, memory_ids: list[int], with_mentions: bool = False) -> dict:
        """Delete facts by id, for good: erased from the database files, every cache, and the
        summaries that saw them. Turns of the chat log that still quote a fact are listed
        under "mentions"; with_mentions=true deletes them too."""
        return self._deletion(self._store.delete_facts(memory_ids, with_mentions))

    def delete_all_memories(self, source: str | None = None) -> dict:
        """Delete every fact about the person (or only the "manual" or "automatic" ones), for
        good, as delete_memories does."""
        return self._deletion(self._store.clear_facts(source))

    # -- The chat log -----------------------------------------------------------------------

    def list_conversations(self) -> dict:
        """List the conversations of mlxmem's chat log with their number of turns and the day
        each started (private ones are not shown here)."""
        shown = [c for c in self._store.conversations() if not c.private]
        return _listing(shown)

    def keep_private(self, conversation: str) -> dict:
        """Keep a conversation private: out of recall in other conversations, and out of
        every answer here. Only the person lets it back (`mlxmem history private --off`)."""
        return json_ready(self._store.set_private(conversation, True))

    def list_turns(self, conversation: str = DEFAULT_CONVERSATION, last: int = LIST_TURNS) -> dict:
        """The newest turns of a conversation (oldest first), each with its id, number (seq),
        role, text and date."""
        self._check_shown(conversation)
        count = self._store.conversation(conversation).turn_count
        last = _limit(last)
        # A turn's seq is at least its place in the conversation, so the newest `last` turns
        # all come after seq `count - last` (more do too if turns were deleted).
        turns = self._store.turns(conversation, after_seq=max(0, count - last))
        return _listing(turns[-last:])

    def search_turns(
        self, query: str, conversation: str | None = None, limit: int = SEARCH_RESULTS
    ) -> dict:
        """Find turns of the chat log containing QUERY (case-insensitive), newest first, in
        every conversation or in one, each with its conversation and date."""
        if conversation is not None:
            self._check_shown(conversation)
            found = self._store.search(query, conversation=conversation, limit=_limit(limit))
            return _listing(found)
        return _listing(self._store.search(query, limit=_limit(limit), shared_only=True))

    def delete_turns(self, turn_ids: list[int], with_mentions: bool = False) -> dict:
        """Delete turns of the chat log by id, for good, with the summaries and automatic
        facts derived from them. Turns that may repeat a deleted one (its reply) are listed
        under "mentions"; with_mentions=true deletes them too."""
        return self._deletion(self._store.delete_turns(turn_ids, with_mentions))

    def delete_conversation(
        self, conversation: str, from_seq: int | None = None, to_seq: int | None = None
    ) -> dict:
        """Delete a whole conversation for good, or with from_seq/to_seq only its turns
        numbered from_seq to to_seq (inclusive; either end may be left open)."""
        if from_seq is None and to_seq is None:
            return self._deletion(self._store.delete_conversation(conversation))
        first, last = from_seq or 1, LAST_SEQ if to_seq is None else to_seq
        return self._deletion(self._store.delete_turn_range(conversation, first, last))

    def recall(
        self, query: str, conversation: str = DEFAULT_CONVERSATION, limit: int = RECALL_TURNS
    ) -> dict:
        """The turns of the chat log that recall's ranking finds for QUERY, best first (a
        chat's own search, asked whatever QUERY says; a chat recalls only for messages about
        the past, within its token budget): from every conversation not kept private, and
        from `conversation`'s own turns that left its window."""
        self._check_shown(conversation)
        asked = recall_query(query, date.today())
        if not asked:
            return _listing([])
        snap = self._store.snapshot(conversation, asked, recall_limit=_limit(limit))
        return _listing(snap.recalled)

    # -- Shared -----------------------------------------------------------------------------

    def _check_shown(self, conversation: str) -> None:
        if conversation in self._store.private_conversations():
            raise InputError(
                f"conversation {conversation!r} is private: its turns are shown only inside it"
                f" (`mlxmem history show {conversation}`)"
            )

    def _deletion(self, deletion: Deletion) -> dict:
        """Deletion.to_json(), without the text of a private conversation's turns."""
        private = self._store.private_conversations() if deletion.mentions else set()
        shown = [t for t in deletion.mentions if t.conversation not in private]
        body = replace(deletion, mentions=shown).to_json()
        if len(shown) < len(deletion.mentions):
            body["private_mentions"] = len(deletion.mentions) - len(shown)
        return body


def _fact_score(fact: Fact, query: str, wanted: set[str]) -> int:
    """How well a fact matches a query: the query's words it shares, and one more when it
    holds the query's text whole."""
    whole = query.strip().lower() in fact.text.lower()
    return len(wanted & set(terms(fact.text))) + int(bool(query.strip()) and whole)


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_RESULTS:
        raise InputError(f"limit is between 1 and {MAX_RESULTS}, not {limit}")
    return limit


def _listing(items: list[Any]) -> dict:
    return {"count": len(items), "items": [json_ready(item) for item in items]}
