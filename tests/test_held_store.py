"""The store held between turns (`Store.holding`), as the interactive chat holds it: another
process still gets it, a deletion made elsewhere still takes effect at the next reply, and the
snapshot a turn keeps in memory is the one the store would read."""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import files_containing, scripted, user_text

from mlxmem import paths
from mlxmem.errors import StoreError
from mlxmem.memory import store as store_module
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.recall import RECALL_TURNS
from mlxmem.memory.store import Store
from mlxmem.testing import FakeEngine

MARKER = "MARKER-HELD-5501"


def other_process(code: str) -> str:
    """Run `code` in a Python process of its own on this test's data directory; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def in_memory(monkeypatch) -> list:
    """Every snapshot a turn builds in memory, each checked against a fresh read of the store
    in the same transaction (so the check itself moves nothing)."""
    built = []
    real = store_module._extended

    def extended(con, previous, turn, recall_terms=(), recall_limit=RECALL_TURNS):
        snap = real(con, previous, turn, recall_terms, recall_limit)
        fresh = store_module._snapshot(con, turn.conversation, recall_terms, recall_limit)
        assert snap == fresh
        built.append(snap)
        return snap

    monkeypatch.setattr(store_module, "_extended", extended)
    return built


def test_a_held_store_goes_to_another_process_that_asks_and_is_opened_again_after():
    store = Store()
    with store.holding():
        store.add_fact("likes tea")  # opens the file, and keeps it open
        opens = store.opens
        store.facts()
        assert store.opens == opens  # held: nothing opened again
        out = other_process(
            """
            from mlxmem.memory.store import Store
            store = Store(timeout=5)
            store.add_fact("written by another process")
            print(len(store.facts()))
            """
        )
        assert out.split() == ["2"]
        assert [f.text for f in store.facts()] == ["likes tea", "written by another process"]
        assert store.opens == opens + 1  # released to the other process, then opened again
    assert Store().facts()  # released when the block ends


def test_a_holder_busy_in_an_operation_keeps_the_store_and_others_fail_with_its_pid():
    """A holder releases only between operations; a waiter gives up after its timeout with
    the holder's pid, as with any process that keeps the lock (an older mlxmem)."""
    store = Store()
    with store.holding(), store.connect():
        out = other_process(
            """
            from mlxmem.errors import StoreError
            from mlxmem.memory.store import Store
            try:
                Store(timeout=0.3)
            except StoreError as exc:
                print(exc)
            """
        )
    assert f"in use by another process (pid {os.getpid()})" in out


def test_nested_use_of_a_held_store_is_reported_at_once():
    store = Store(timeout=0.2)
    with store.holding(), store.connect():
        with pytest.raises(StoreError, match="already open in this process"):
            store.facts()


def test_a_deletion_elsewhere_while_the_chat_holds_the_store_takes_effect_at_the_next_reply(
    mlxmem_home,
):
    engine = FakeEngine(scripted)
    store = Store()
    fact = store.add_fact(f"Their locker code is {MARKER}.")
    companion = Companion(engine, store, "default", 600, 120, ChatSettings(extract_facts=False))
    with store.holding():
        first = companion.send("What is my locker code?")
        assert MARKER in engine.decode(first.prompt.tokens)
        (paths.cache_dir() / "default-chat.safetensors").write_bytes(f"kv {MARKER}".encode())
        assert files_containing(mlxmem_home, MARKER)  # not vacuous: in the facts and a cache
        other_process(
            f"""
            from mlxmem.memory.store import Store
            print(Store(timeout=5).delete_facts([{fact.id}]).describe())
            """
        )
        second = companion.send("And what else do you remember?")
        assert MARKER not in engine.decode(second.prompt.tokens)
        assert [f.id for f in store.facts()] == []
    assert files_containing(mlxmem_home, MARKER) == []


def test_the_snapshot_kept_in_memory_is_what_the_store_holds_after_turns_folds_and_facts(
    in_memory,
):
    engine = FakeEngine(scripted)
    store = Store()
    companion = Companion(engine, store, "default", 600, 120, ChatSettings())
    results = []
    with store.holding():
        for i in range(14):
            results.append(companion.send(user_text(i)))
        # Every turn after the first extended the last one's snapshot, checked against a
        # fresh read: turns after a fold and after a fact among them (not vacuous).
        assert len(in_memory) == 13
        assert any(r.folds for r in results[:-1])
        assert any(r.fact_added for r in results[:-1])
        kept = companion._kept[0]
        assert kept == store.snapshot("default")


def test_the_snapshot_is_read_again_after_any_other_operation(in_memory):
    engine = FakeEngine(scripted)
    store = Store()
    companion = Companion(engine, store, "default", 600, 120, ChatSettings(extract_facts=False))
    with store.holding():
        companion.send(user_text(1))
        companion.send(user_text(2))
        assert len(in_memory) == 1
        store.add_fact("likes green tea")  # through the same store, not by a turn
        result = companion.send(user_text(3))
        assert len(in_memory) == 1  # read again: the new fact is in the prompt
        assert "likes green tea" in engine.decode(result.prompt.tokens)
        companion.send(user_text(4))
        assert len(in_memory) == 2
        other_process(  # another process writes: the store was released and opened again
            """
            from mlxmem.memory.store import Store
            Store(timeout=5).add_fact("likes black coffee")
            """
        )
        result = companion.send(user_text(5))
        assert len(in_memory) == 2
        assert "likes black coffee" in engine.decode(result.prompt.tokens)


def test_a_store_not_held_reads_every_turn_afresh(in_memory):
    store = Store()
    companion = Companion(FakeEngine(scripted), store, "default", 600, 120, ChatSettings())
    for i in range(3):
        companion.send(user_text(i))
    assert in_memory == []
    assert store.mark() is None


def last_user_message(prompt: str) -> str:
    """The content of the last user turn of a FakeEngine prompt."""
    head = "<|start_header_id|>user<|end_header_id|>\n\n"
    return prompt[prompt.rindex(head) + len(head) :].split("<|eot_id|>")[0]


def test_two_companions_in_one_conversation_answer_every_message_through_folds():
    # Two front ends on one conversation (serve and chat both default to `default`): each
    # folds a window the other filled, and re-reads the store while the other writes.
    # Two fakes, two vocabularies: two model ids, so neither reuses the other's token ids.
    engines = {n: FakeEngine(scripted, model_id=f"fake-{n}") for n in "ab"}
    companions = {
        n: Companion(e, Store(), "default", 700, 60, ChatSettings()) for n, e in engines.items()
    }
    meanwhile = []

    def b_writes_meanwhile(status: str) -> None:
        if "folding" in status and len(meanwhile) < 6:
            text = f"b meanwhile {len(meanwhile)} " + "words " * 20
            meanwhile.append(text.strip())
            assert not companions["b"].send(text).discarded

    sent = []
    for i in range(20):
        # Now and then A's message is longer than any in its window: A answers from the newest
        # turns that fit and folds after its reply, and B writes meanwhile.
        for name in "ab":
            text = (f"{name} message {i} " + "words " * (90 if i % 3 == 2 else 20)).strip()
            companion = companions[name]
            # B writes while A folds after its reply.
            hook = b_writes_meanwhile if name == "a" else None
            result = companion.reply(companion.begin(text), on_status=hook)
            assert not result.discarded
            sent.append(text)
            # The reply was written to this message, not to one the other logged after it.
            replies = [c for c in engines[name].calls if scripted(c.prompt).startswith("That")]
            assert last_user_message(replies[-1].prompt) == text
    assert meanwhile, "the other companion never wrote during a fold"
    with Store().connect() as con:
        logged = [row[0] for row in con.execute(
            "SELECT text FROM turns WHERE role = 'user' ORDER BY seq").fetchall()]  # fmt: skip
        replies = con.execute("SELECT count(*) FROM turns WHERE role = 'assistant'").fetchone()
    assert sorted(logged) == sorted(sent + meanwhile)  # every message logged, once
    assert replies[0] == len(logged)  # and every one answered
