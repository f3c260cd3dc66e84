"""After every delete, on every surface (the CLI, serve's memory API, the REPL), in the same
process and in a new one, search finds nothing of what was deleted: no delete that returns
success while search still finds the item, no in-process object that keeps answering, no
index row (recall's terms) left behind."""

import io
import os
import subprocess
import sys
from urllib.parse import quote

import pytest
from conftest import cli
from serve_helpers import fake_server, request
from test_serve import ask

from mlxmem.cli.repl import Session
from mlxmem.cli.terminal import Terminal
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.recall import recall_query, search_before
from mlxmem.memory.store import Store
from mlxmem.memory.tables.terms import stem
from mlxmem.testing import FakeEngine

WORD = "zanzibar"  # in what is deleted, and nowhere else
TEXT = f"We sailed to {WORD} last spring."
DRAFT = f"Do you remember when we sailed to {WORD}?"  # a message recall answers
CONTEXT = f"/v1/memory/context?conversation=now&draft={quote(DRAFT)}"


def seed() -> tuple[Store, int, int]:
    """A conversation holding WORD (a turn, its reply quoting it) among others, a fact of it,
    and another conversation; return the store and the turn's and the fact's ids."""
    store = Store()
    turn = store.append_turn("trip", "user", TEXT)
    store.append_turn("trip", "assistant", f"Noted: {TEXT}")
    store.append_turn("trip", "user", "The boat was small.")
    fact = store.add_fact(f"Sailed to {WORD}.")
    store.append_turn("now", "user", "Hello again.")
    return store, turn.id, fact.id


def found(store: Store) -> dict[str, object]:
    """Where WORD is found through `store` (an object made before the delete)."""
    with store.connect() as con:
        recalled = search_before(con, "now", 0, recall_query(DRAFT))
        stale = con.execute(
            "SELECT (SELECT count(*) FROM recall_terms WHERE turn_id NOT IN"
            " (SELECT id FROM turns)) + (SELECT count(*) FROM recall_docs WHERE turn_id"
            " NOT IN (SELECT id FROM turns))"
        ).fetchone()[0]
        indexed = con.execute(
            "SELECT (SELECT count(*) FROM recall_terms WHERE term = $1)"
            " + (SELECT coalesce(sum(df), 0) FROM recall_vocab WHERE term = $1)",
            [stem(WORD)],
        ).fetchone()[0]
    return {
        "search": [t.id for t in store.search(WORD)],
        "recall": [t.id for t in recalled if WORD in t.text.lower()],
        "index rows of deleted turns": stale,
        "index rows of the word": indexed,
        "facts": [f.id for f in store.facts() if WORD in f.text.lower()],
    }


NOTHING = {
    "search": [],
    "recall": [],
    "index rows of deleted turns": 0,
    "index rows of the word": 0,
    "facts": [],
}


def in_a_new_process() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "mlxmem.cli", "history", "search", WORD, "--json"],
        capture_output=True, text=True, env=os.environ.copy(), timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


# Each deletes every turn and fact holding WORD: with its mentions, or the whole conversation.
CLI_DELETES = {
    "history rm --with-mentions, then memory rm": lambda turn, fact: [
        ["history", "rm", str(turn), "--with-mentions"],
        ["memory", "rm", str(fact), "--with-mentions"],
    ],
    "memory rm --with-mentions, then history rm": lambda turn, fact: [
        ["memory", "rm", str(fact), "--with-mentions"],
        ["history", "rm", str(turn), str(turn + 1)],
    ],
    "history rm --all, then memory clear": lambda turn, fact: [
        ["history", "rm", "-c", "trip", "--all", "--yes"],
        ["memory", "clear", "--yes"],
    ],
}


@pytest.mark.parametrize("kind", list(CLI_DELETES))
def test_the_cli_finds_nothing_after_a_delete_in_this_process_or_a_new_one(kind):
    store, turn, fact = seed()
    before = found(store)
    assert before["search"] and before["recall"] and before["facts"]  # not vacuous
    assert before["index rows of the word"] > 0
    for args in CLI_DELETES[kind](turn, fact):
        cli(*args)
    assert found(store) == NOTHING  # the object made before the delete
    assert found(Store()) == NOTHING
    assert in_a_new_process().strip() in ("[]", "")


def test_a_store_held_open_across_a_delete_in_another_process_finds_nothing():
    """The chat holds its store (one connection kept open): a delete from another process
    reaches its next search, not a view from before."""
    store, turn, fact = seed()
    with store.holding():
        assert found(store)["search"]
        deleted = subprocess.run(
            [sys.executable, "-m", "mlxmem.cli", "history", "rm", str(turn), "--with-mentions"],
            capture_output=True, text=True, env=os.environ.copy(), timeout=120,
        )  # fmt: skip
        assert deleted.returncode == 0, deleted.stderr
        cli("memory", "rm", str(fact))
        assert found(store) == NOTHING


def test_serves_memory_api_finds_nothing_after_its_own_delete_or_the_clis():
    with fake_server() as server:
        ask(server, TEXT, user="trip")
        ask(server, "The boat was small.", user="trip")
        ask(server, "Hello again.", user="now")
        hits = request(server, "GET", f"/v1/memory/search?q={WORD}")[1]["data"]
        assert [t["text"] for t in hits] == [TEXT]
        context = request(server, "GET", CONTEXT)
        assert context[1]["recalled"], context  # recall finds it before the delete
        status, gone, _ = request(server, "DELETE", f"/v1/memory/turns/{hits[0]['id']}")
        assert status == 200 and gone["turns"] == [hits[0]["id"]]
        assert request(server, "GET", f"/v1/memory/search?q={WORD}")[1]["data"] == []
        context = request(server, "GET", CONTEXT)
        assert context[1]["recalled"] == [], context
        # A turn deleted by the CLI while the server runs: gone from the server's answers too.
        ask(server, f"Back to {WORD} again.", user="trip")
        (again,) = request(server, "GET", f"/v1/memory/search?q={WORD}")[1]["data"]
        cli("history", "rm", str(again["id"]))
        assert request(server, "GET", f"/v1/memory/search?q={WORD}")[1]["data"] == []
        context = request(server, "GET", CONTEXT)
        assert context[1]["recalled"] == [], context
    assert found(Store())["index rows of deleted turns"] == 0
    assert in_a_new_process().strip() in ("[]", "")


def test_the_repl_recalls_nothing_after_a_delete_from_inside_or_outside(capsys):
    store, turn, fact = seed()
    responder = FakeEngine().responder

    def open_chat(model: str, conversation: str) -> Companion:
        settings = ChatSettings(extract_facts=False)
        return Companion(FakeEngine(responder), store, conversation, 2000, 120, settings)

    out = io.StringIO()
    session = Session(open_chat, "fake", "now", Terminal(out))

    def shown(line: str) -> str:
        capsys.readouterr()
        session.command(line)
        return capsys.readouterr().err

    assert f"{turn}" in shown(f"/context {DRAFT}")  # recalled before the delete
    assert f"[{fact}]" in shown("/memory")
    assert "deleted" in shown(f"/forget {fact}").lower()
    assert f"[{fact}]" not in shown("/memory")
    cli("history", "rm", str(turn), "--with-mentions")  # another front end, the same store
    assert "recalled from the log" not in shown(f"/context {DRAFT}")
    assert found(store) == NOTHING
