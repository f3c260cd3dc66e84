"""The Store's calls on facts (layer 3): reading, adding, restoring. Deleting and editing,
which reach other tables, are mlxmem.memory.forget's; the SQL is mlxmem.memory.tables.facts'."""

from __future__ import annotations

from dataclasses import replace

from mlxmem.errors import InputError
from mlxmem.memory.tables.db import Database
from mlxmem.memory.tables.facts import (
    Fact,
    all_facts,
    check_fact_text,
    check_source,
    get_fact,
    insert_fact,
    mark_replaced,
    refuse_duplicate,
    set_replaced,
)
from mlxmem.memory.tables.turns import get_turn
from mlxmem.text import utc_now


class FactList(Database):
    def facts(self, replaced: bool = False) -> list[Fact]:
        """The current facts; with `replaced`, the replaced ones too (see Fact.replaced_by)."""
        with self.connect() as con:
            return all_facts(con, replaced)

    def get_fact(self, fact_id: int) -> Fact:
        with self.connect() as con:
            return get_fact(con, fact_id)

    def add_fact(
        self,
        text: str,
        source: str = "manual",
        turn_id: int | None = None,
        epoch: int | None = None,
        replaces: int | None = None,
    ) -> Fact:
        """Add a fact; `turn_id` names the turn it was extracted from, if any; `replaces`
        the id of a current fact it makes out of date ("I moved to Porto" over "I live in
        Lisbon"), which leaves the prompt and stays listed. With `epoch`, refused (StaleError)
        if anything was deleted since that forget epoch."""
        text = check_fact_text(text)
        check_source(source)
        now = utc_now()
        with self.guarded(epoch) as con:
            if turn_id is not None:
                get_turn(con, turn_id)
            if replaces is not None:
                old = get_fact(con, replaces)
                if old.replaced_by is not None:
                    raise InputError(
                        f"fact {old.id} was already replaced by fact {old.replaced_by}"
                        f" (`mlxmem memory add TEXT --replaces {old.replaced_by}` replaces that)"
                    )
            refuse_duplicate(con, text)
            fact = insert_fact(con, text, source, turn_id, now)
            if replaces is not None:
                mark_replaced(con, replaces, fact.id, now)
            return fact

    def restore_fact(self, fact_id: int) -> Fact:
        """Make a replaced fact current again (a replacement made in error): it returns to the
        prompt from the next reply; the fact that replaced it stays, current too. A new
        version of the fact, so that the restore travels to other devices as an edit does.
        InputError if the fact is not replaced."""
        with self.connect() as con:
            fact = get_fact(con, fact_id)
            if fact.replaced_by is None:
                raise InputError(f"fact {fact_id} is not replaced; nothing to restore")
            refuse_duplicate(con, fact.text, other_than=fact_id)  # current again: once only
            now = utc_now()
            set_replaced(con, fact_id, None, now)
            return replace(fact, updated_at=now, replaced_by=None, replaced_at=None)
