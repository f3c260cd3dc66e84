"""What a deletion follows across devices: a fact synced before its turn is linked to it when
the turn comes, a fact forked from a sync conflict outlives the fact it came from, and a batch
mixing late facts of deleted turns with new facts merges (two files, two transactions)."""

import uuid

from conftest import files_containing

from mlxmem.memory.store import Store
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.memory.tables.tombstones import fork_uid
from mlxmem.memory.tables.turns import conversation_uid

OTHER = str(uuid.uuid4())  # another device
T0 = "2026-11-01T10:00:00+00:00"


def uid() -> str:
    return str(uuid.uuid4())


def message(mid: str, text: str) -> dict:
    return {
        "kind": "message", "uid": mid, "conversation": "default",
        "conversation_uid": conversation_uid("default"), "role": "user", "text": text,
        "created_at": T0, "device": OTHER, "interrupted": False,
    }  # fmt: skip


def fact(fid: str, text: str, message_uid=None, fork_of=None, version=0) -> dict:
    record = {
        "kind": "fact", "uid": fid, "text": text, "source": "automatic", "created_at": T0,
        "updated_at": T0, "device": OTHER, "message_uid": message_uid, "version": version,
    }  # fmt: skip
    return record | ({"fork_of": fork_of} if fork_of else {})


def tombstone(of: str, what: str) -> dict:
    return {"kind": "tombstone", "uid": of, "of": what, "deleted_at": T0, "device": OTHER}


def texts(store: Store) -> list[str]:
    return sorted(f.text for f in store.facts())


def test_late_facts_of_a_deleted_turn_and_new_facts_merge_in_one_batch(mlxmem_home):
    store, log = Store(), SyncLog()
    gone = uid()
    log.merge([message(gone, "I keep bees SECRET-BEES")])
    log.merge(
        [
            tombstone(gone, "message"),
            fact(uid(), "The user keeps bees SECRET-BEES.", message_uid=gone),
            fact(uid(), "The user likes tea."),
        ]
    )
    assert texts(store) == ["The user likes tea."]
    assert files_containing(mlxmem_home, "SECRET-BEES") == []


def test_a_fact_synced_before_its_turn_is_deleted_with_the_turn(mlxmem_home):
    store, log = Store(), SyncLog()
    turn = uid()
    log.merge([fact(uid(), "The user's PIN is PIN-4242.", message_uid=turn)])
    log.merge([message(turn, "my PIN is PIN-4242")])  # the turn's file came later
    (logged,) = store.turns("default")
    assert [f.turn_id for f in store.facts()] == [logged.id]
    store.delete_turns([logged.id])
    assert store.facts() == [] and files_containing(mlxmem_home, "PIN-4242") == []


def test_a_tombstone_for_a_turn_reaches_a_fact_not_yet_linked_to_it(mlxmem_home):
    store, log = Store(), SyncLog()
    turn = uid()
    log.merge([fact(uid(), "The user's code is CODE-777.", message_uid=turn)])
    log.merge([tombstone(turn, "message")])
    assert store.facts() == [] and files_containing(mlxmem_home, "CODE-777") == []


def test_a_fork_outlives_the_fact_it_came_from(mlxmem_home):
    # A fork keeps the text of a concurrent edit: another text than the fact's, which nobody
    # deleted. Deleting the fact, here or elsewhere, leaves it.
    store, log = Store(), SyncLog()
    original, fork = uid(), uid()
    log.merge(
        [fact(original, "Lives in GONE-TEXT."), fact(fork, "Lives in KEPT-TEXT.", None, original)]
    )
    assert len(store.facts()) == 2
    log.merge([tombstone(original, "fact")])
    assert texts(store) == ["Lives in KEPT-TEXT."]
    assert files_containing(mlxmem_home, "GONE-TEXT") == []
    # A fork arriving after its fact was deleted is kept the same way.
    late = uid()
    log.merge([fact(late, "Lives in LATE-TEXT.", None, original)])
    assert texts(store) == ["Lives in KEPT-TEXT.", "Lives in LATE-TEXT."]


def test_deleting_a_fact_here_keeps_its_forks_and_names_the_fork_of_its_text(mlxmem_home):
    store, log = Store(), SyncLog()
    original, fork = uid(), uid()
    log.merge(
        [
            fact(original, "Drinks GONE-COFFEE.", version=1),  # an edit, which a conflict forks
            fact(fork, "Drinks FORKED-TEA.", None, original),
        ]
    )
    (gone,) = [f for f in store.facts() if "COFFEE" in f.text]
    deletion = store.delete_facts([gone.id])
    assert [f.text for f in deletion.facts] == ["Drinks GONE-COFFEE."]
    assert texts(store) == ["Drinks FORKED-TEA."]
    assert files_containing(mlxmem_home, "GONE-COFFEE") == []
    # The deleted text, forked on a device that saw a concurrent edit win, stays out.
    dead = {r["uid"] for r in log.changes() if r["kind"] == "tombstone"}
    assert fork_uid(original, 1, OTHER) in dead
    log.merge([fact(fork_uid(original, 1, OTHER), "Drinks GONE-COFFEE.", None, original, 1)])
    assert texts(store) == ["Drinks FORKED-TEA."]
    assert files_containing(mlxmem_home, "GONE-COFFEE") == []


def test_a_conversation_name_a_new_one_may_not_have_arrives_whole_and_is_reported(mlxmem_home):
    # Written by an older version, or by hand: a space at an end, a newline. Nothing is lost,
    # the name stays what every device calls it, and the merge says which names are odd.
    store, log = Store(), SyncLog()
    records = []
    for name in ("work ", "two\nlines", "fine"):
        record = message(uid(), f"a turn in {name!r}")
        records.append(record | {"conversation": name, "conversation_uid": conversation_uid(name)})
    result = log.merge(records)
    assert sorted(result.odd_names) == ["two\nlines", "work "]
    for name in ("work ", "two\nlines", "fine"):
        assert [t.text for t in store.turns(name)] == [f"a turn in {name!r}"]
        assert store.check_name(name) == name  # opens by its name
    assert log.merge(records).odd_names == []  # nothing new arrived in them
