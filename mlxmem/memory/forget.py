"""Forgetting: every step of a deletion's cascade, in one place.

A deletion reaches further than the rows asked for: the turns that quote a deleted turn or
fact (its `mentions`), the summaries that saw it, the automatic facts taken from a deleted
turn, its rows in recall's index, and the facts it had replaced (current again). Each
operation here runs in one `Database.forgetting()` block: the rows go in one transaction that
also records tombstones (uids and times, never text) for sync, and the erase that follows
rewrites the files and wipes the KV caches, so the bytes leave the disk, even after a kill at
any step. The Store, the sync merge and the server all delete through these functions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import duckdb

from mlxmem.errors import InputError, NotFoundError
from mlxmem.memory.tables import summaries, tombstones
from mlxmem.memory.tables.db import Database, Erasure
from mlxmem.memory.tables.facts import (
    SELECT_FACTS,
    Fact,
    FactEdit,
    all_facts,
    check_fact_text,
    check_source,
    edited_clock,
    fact_of,
    get_fact,
    refuse_duplicate,
    stored_clock,
    version_of,
)
from mlxmem.memory.tables.rows import device_of
from mlxmem.memory.tables.summaries import Summary, summary_of
from mlxmem.memory.tables.tombstones import Tombstone, add_tombstones, fork_uid
from mlxmem.memory.tables.turns import (
    SEARCH_LIMIT,
    SELECT_TURNS,
    Turn,
    conversation_id,
    conversation_uid,
    delete_turn_rows,
    drop_conversation_row,
    get_turn,
    keep_private_after_deletion,
    turn_of,
    turns_after,
)
from mlxmem.text import json_ready, plural, to_db, utc_now

LAST_SEQ = 2**31 - 1  # the end of an open range of turns ("from turn 5 on")
# A tombstone's columns as a deletion writes them (published_at is the sync's to set).


@dataclass(frozen=True)
class Deletion:
    """What a delete removed: the turns and facts asked for, the automatic facts taken from
    those turns, and the summaries that saw any of them (rebuilt from the remaining log before
    the next reply). `mentions`: turns left in the log that still quote a deleted fact."""

    turns: list[Turn]
    summaries: list[Summary]
    conversations: list[str]
    facts: list[Fact] = field(default_factory=list)
    mentions: list[Turn] = field(default_factory=list)
    # Facts a deleted fact had replaced: with it gone, they are current (in the prompt) again.
    current_again: list[Fact] = field(default_factory=list)

    def describe(self) -> str:
        """What was removed, in a sentence the person can check (every front end prints it)."""
        parts = []
        if self.turns:
            parts.append(plural(len(self.turns), "turn"))
        if self.facts:
            auto = [f for f in self.facts if self.turns and f.source == "automatic"]
            asked = len(self.facts) - len(auto)
            if asked:
                parts.append(plural(asked, "fact"))
            if auto:
                quoted = "; ".join(f"[{f.id}] {f.text}" for f in auto)
                parts.append(f"{plural(len(auto), 'automatic fact')} taken from them ({quoted})")
        if self.summaries:
            parts.append(plural(len(self.summaries), "summary", "summaries") + " that saw them")
        if not parts:
            return "Nothing to delete."
        text = "Deleted " + (", ".join(parts[:-1]) + " and " if len(parts) > 1 else "") + parts[-1]
        if self.summaries:
            text += "; the older turns are summarized again, without it, before the next reply"
        text += "."
        for fact in self.current_again:
            text += (
                f" Fact {fact.id} is current again, as the fact that replaced it is deleted:"
                f" {fact.text!r} (`mlxmem memory rm {fact.id}` deletes it too)."
            )
        return text

    def to_json(self) -> dict:
        """The deletion as JSON-ready data: ids and facts removed, the sentence, what still
        quotes a deleted fact."""
        return {
            "object": "mlxmem.deletion",
            "message": self.describe(),
            "turns": [t.id for t in self.turns],
            "facts": [json_ready(f) for f in self.facts],
            "summaries": len(self.summaries),
            "conversations": self.conversations,
            "mentions": [json_ready(t) for t in self.mentions],
            "current_again": [json_ready(f) for f in self.current_again],
        }


def delete_facts(db: Database, ids: list[int], with_mentions: bool = False) -> Deletion:
    """Delete facts by id (all or none: an unknown id raises NotFoundError), and the
    summaries that had them in their prompt; their bytes are erased from the files and
    every KV cache. Turns of the log that quote a fact (a reply that repeated it) are
    deleted in the same operation `with_mentions`, else listed as the `mentions`."""
    with db.forgetting() as erasure:  # one open: the facts, their quotes, the erase
        con = erasure.con
        facts = [get_fact(con, fid) for fid in dict.fromkeys(ids)]
        quoting = list({t.id: t for f in facts for t in quoting_turns(con, f.text)}.values())
        deleted = _delete_facts(erasure, facts)
        if not with_mentions:
            return replace(deleted, mentions=quoting)
        turns = _delete_turns(erasure, [get_turn(con, t.id) for t in quoting])
        hit = deleted.summaries + turns.summaries
        return Deletion(
            turns.turns,
            hit,
            turns.conversations,
            deleted.facts + turns.facts,
            current_again=_still_here(deleted, turns),
        )


def clear_facts(db: Database, source: str | None = None) -> Deletion:
    """Delete every fact (or every fact from `source`), as delete_facts does."""
    if source is not None:
        check_source(source)
    with db.forgetting() as erasure:
        facts = all_facts(erasure.con, replaced=True)
        victims = [f for f in facts if source is None or f.source == source]
        return _delete_facts(erasure, victims)


def edit_fact(db: Database, fact_id: int, text: str) -> Fact:
    """Replace a fact's text; the old text is erased from disk and caches, with the
    summaries that saw it."""
    text = check_fact_text(text)
    now = utc_now()
    with db.forgetting() as erasure:
        old = get_fact(erasure.con, fact_id)
        refuse_duplicate(erasure.con, text, other_than=fact_id)
        _summaries_that_saw(erasure.con, [fact_id])
        stored = version_of(erasure.con, fact_id)
        assert stored is not None  # get_fact found it, in this transaction
        device, _ = device_of(erasure.con)
        clock = edited_clock(stored_clock(stored.clock, stored.version), device)
        replaced = (stored.replaced_by, stored.replaced_at)
        erasure.edit_fact(fact_id, text, to_db(now), clock=clock, replaced=replaced)
    return replace(old, text=text, updated_at=now)


def replace_fact_versions(db: Database, edits: dict[int, FactEdit]) -> None:
    """Give facts the newer versions another device wrote; the old text is erased from disk
    and caches, with the summaries that saw it, as edit_fact does."""
    with db.forgetting() as erasure:
        _summaries_that_saw(erasure.con, list(edits))
        for fact_id, edit in edits.items():
            erasure.edit_fact(
                fact_id,
                edit.text,
                to_db(edit.updated_at),
                edit.device_uid,
                edit.version,
                edit.clock,
                (edit.replaced_by, edit.replaced_at),
            )


def delete_turns(db: Database, ids: list[int], with_mentions: bool = False) -> Deletion:
    """Delete turns by id, and every summary whose range covers one of them. Turns left
    in the log may repeat a deleted user turn (its reply, a turn that contains its whole
    text): they are deleted in the same operation `with_mentions`, else listed as the
    `mentions`."""
    with db.forgetting() as erasure:
        victims = [get_turn(erasure.con, tid) for tid in dict.fromkeys(ids)]
        quoting = _turn_mentions(erasure.con, victims)
        if with_mentions:
            return _delete_turns(erasure, victims + quoting)
        return replace(_delete_turns(erasure, victims), mentions=quoting)


def delete_turn_range(db: Database, conversation: str, first_seq: int, last_seq: int) -> Deletion:
    """Delete the turns first_seq..last_seq (inclusive) of `conversation`."""
    if first_seq > last_seq:
        raise InputError(f"empty range: {first_seq} is after {last_seq}")
    with db.forgetting() as erasure:
        con = erasure.con
        conversation_id(con, conversation)
        rows = con.execute(
            f"{SELECT_TURNS} WHERE c.name = ? AND m.seq BETWEEN ? AND ? ORDER BY m.seq",
            [conversation, first_seq, last_seq],
        ).fetchall()
        if not rows:
            span = f"{first_seq}..{'' if last_seq == LAST_SEQ else last_seq}"
            raise NotFoundError(f"no turns {span} in conversation {conversation!r}")
        return _delete_turns(erasure, [turn_of(row) for row in rows])


def delete_conversation(db: Database, name: str) -> Deletion:
    """Delete a conversation with all its turns and summaries."""
    with db.forgetting() as erasure:
        con = erasure.con
        cid = conversation_id(con, name)
        rows = con.execute(f"{SELECT_TURNS} WHERE c.id = ? ORDER BY m.seq", [cid]).fetchall()
        deletion = _delete_turns(erasure, [turn_of(row) for row in rows])
        rest = con.execute(f"{summaries.SELECT_SUMMARIES} WHERE c.id = ?", [cid]).fetchall()
        _drop_conversation(con, cid)
        tombstones.add_conversation(con, conversation_uid(name))
    hit = deletion.summaries + [summary_of(r) for r in rest]
    return Deletion(
        deletion.turns, hit, [name], deletion.facts, current_again=deletion.current_again
    )


def apply_tombstones(db: Database, arrived: Sequence[Tombstone]) -> Deletion:
    """Delete what another device deleted, by uid, as the local deletes do (rows, derived
    summaries and automatic facts, caches, old bytes), and keep the tombstones, so that
    nothing with those uids comes back. A conversation's tombstone removes it only if no
    turn is left in it (one written elsewhere meanwhile keeps it)."""
    with db.forgetting() as erasure:
        con = erasure.con
        for t in arrived:
            tombstones.keep(con, t, _db_time(t.deleted_at))
        uids = [t.uid for t in arrived]
        rows = con.execute(f"{SELECT_TURNS} WHERE list_contains(?, m.uid)", [uids]).fetchall()
        turns = _delete_turns(erasure, [turn_of(row) for row in rows], name_forks=False)
        # Facts by uid, and those taken from a tombstoned turn not (yet) linked to it here.
        rows = con.execute(
            f"{SELECT_FACTS} WHERE list_contains(?, uid) OR list_contains(?, turn_uid)",
            [uids, uids],
        ).fetchall()
        gone = {f.id for f in turns.facts}
        keep = [f for f in map(fact_of, rows) if f.id not in gone]
        facts = _delete_facts(erasure, keep, name_forks=False)
        names = [
            name
            for (name,) in con.execute("SELECT name FROM conversations").fetchall()
            if conversation_uid(name) in uids
        ]
        emptied = [n for n in names if not turns_after(con, n, None)]
        for name in emptied:
            _drop_conversation(con, conversation_id(con, name))
        deleted_at = {t.uid: t.deleted_at for t in arrived}
        for name in set(names) - set(emptied):  # turns written here meanwhile keep it
            at = _db_time(deleted_at[conversation_uid(name)])
            keep_private_after_deletion(con, conversation_id(con, name), at)
    return Deletion(
        turns.turns,
        turns.summaries + facts.summaries,
        emptied,
        turns.facts + facts.facts,
        current_again=_still_here(turns, facts),
    )


# A text shorter than this ("hi", "Tea") is no quote: as a substring it is in many unrelated
# turns, and `--with-mentions` would delete them.
MIN_QUOTE_WORDS = 3


def quoting_turns(con: duckdb.DuckDBPyConnection, text: str) -> list[Turn]:
    """Turns that contain `text` whole, as words (case-insensitive), oldest first; none for a
    text of fewer than MIN_QUOTE_WORDS words."""
    text = " ".join(text.split())
    if len(re.findall(r"\w+", text)) < MIN_QUOTE_WORDS:
        return []
    words = r"\s+".join(re.escape(w) for w in text.split(" "))
    pattern = rf"(^|\W){words}(\W|$)"
    rows = con.execute(
        f"{SELECT_TURNS} WHERE regexp_matches(m.text, ?, 'i') ORDER BY m.id LIMIT ?",
        [pattern, SEARCH_LIMIT],
    ).fetchall()
    return [turn_of(row) for row in rows]


def _turn_mentions(con: duckdb.DuckDBPyConnection, victims: list[Turn]) -> list[Turn]:
    """The turns left in the log that may repeat a deleted user turn: its reply (the
    assistant turns after it, up to the next user turn), and any turn containing its whole
    text, as a fact's mentions are found."""
    gone = {t.id for t in victims}
    found: dict[int, Turn] = {}
    for victim in (t for t in victims if t.role == "user"):
        after = con.execute(
            f"{SELECT_TURNS} WHERE c.name = ? AND m.seq > ? ORDER BY m.seq LIMIT 16",
            [victim.conversation, victim.seq],
        ).fetchall()
        for turn in map(turn_of, after):
            if turn.role != "assistant":
                break
            found.setdefault(turn.id, turn)
        for turn in quoting_turns(con, victim.text):
            found.setdefault(turn.id, turn)
    return sorted((t for t in found.values() if t.id not in gone), key=lambda t: t.id)


def _delete_turns(erasure: Erasure, victims: list[Turn], name_forks: bool = True) -> Deletion:
    """Delete turns, the automatic facts extracted from them, and every summary that saw
    either (`name_forks`: see _delete_facts)."""
    con = erasure.con
    ids = [t.id for t in victims]
    rows = con.execute(f"{SELECT_FACTS} WHERE list_contains(?, turn_id)", [ids]).fetchall()
    taken = [fact_of(row) for row in rows]
    names = list(dict.fromkeys(t.conversation for t in victims))
    hit: list[Summary] = []
    for name in names:
        seqs = [t.seq for t in victims if t.conversation == name]
        hit += summaries.delete_derived(con, name, seqs=seqs)
    deletion = _delete_facts(erasure, taken, name_forks)
    add_tombstones(con, "message", "turns", ids)
    delete_turn_rows(con, ids)  # with their rows in recall's index
    return Deletion(
        victims, hit + deletion.summaries, names, taken, current_again=deletion.current_again
    )


def _still_here(*deletions: Deletion) -> list[Fact]:
    """The facts current again after these deletions, less those one of them deleted."""
    gone = {f.id for d in deletions for f in d.facts}
    again = {f.id: f for d in deletions for f in d.current_again if f.id not in gone}
    return sorted(again.values(), key=lambda f: f.id)


def _delete_facts(erasure: Erasure, victims: list[Fact], name_forks: bool = True) -> Deletion:
    """Delete facts (from the facts file, once the main file has committed), and in every
    conversation the summaries that had them in their prompt.

    A deletion made here (`name_forks`) also tombstones the fork its current text would become
    on a device that saw a concurrent edit win (records.fork_uid), so that the deleted text
    cannot come back as a fork. A deletion that arrives from another device does not: the
    device that deleted named the fork of the text it deleted, and the text held here may be an
    older one that lost and lives on as a fork elsewhere. Forks that hold another text are
    facts of their own: they stay."""
    ids = [f.id for f in victims]
    con = erasure.con
    device, _ = device_of(con)
    # Version 0 is the text the fact was added with, the same on every device: never a fork.
    rows = con.execute(
        "SELECT uid, version, coalesce(device_uid, ?) FROM facts"
        " WHERE list_contains(?, id) AND coalesce(version, 0) > 0",
        [device, ids if name_forks else []],
    ).fetchall()
    hit = _summaries_that_saw(con, ids)
    replaced = con.execute(
        f"{SELECT_FACTS} WHERE list_contains((SELECT list(uid) FROM facts WHERE"
        " list_contains(?, id)), replaced_by) AND NOT list_contains(?, id) ORDER BY id",
        [ids, ids],
    ).fetchall()
    current_again = [replace(fact_of(r), replaced_by=None, replaced_at=None) for r in replaced]
    add_tombstones(con, "fact", "facts", ids)
    if rows:
        tombstones.add_fact_uids(con, [fork_uid(*row) for row in rows])
    erasure.delete_facts(ids)
    return Deletion([], hit, [], victims, current_again=current_again)


def _summaries_that_saw(con: duckdb.DuckDBPyConnection, fact_ids: list[int]) -> list[Summary]:
    """Delete, in every conversation, the summaries written with one of these facts in their
    prompt (and the later ones built on them)."""
    hit: list[Summary] = []
    if fact_ids:
        for (name,) in con.execute("SELECT name FROM conversations ORDER BY id").fetchall():
            hit += summaries.delete_derived(con, name, fact_ids=fact_ids)
    return hit


def _db_time(value: datetime) -> datetime:
    """A time as stored (naive UTC): a record's time is naive UTC already (records.timestamp),
    which to_db would take for local time."""
    return value if value.tzinfo is None else to_db(value)


def _drop_conversation(con: duckdb.DuckDBPyConnection, cid: int) -> None:
    """The conversation's row and its summaries (its turns are deleted first, by the caller)."""
    summaries.delete_of_conversation(con, cid)
    drop_conversation_row(con, cid)


def mentions(db: Database, fact: Fact) -> list[Turn]:
    """Turns of the log that still contain a fact's text (a reply that quoted it)."""
    with db.connect() as con:
        return quoting_turns(con, fact.text)
