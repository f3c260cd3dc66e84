"""Recall across the person's conversations: what was said in one conversation reaches a
question asked in another, unless that conversation is private or deleted (a kill during the
deletion included). Fake engine and real DuckDB files; the CLI with a tiny real model."""

import json
import shutil
import subprocess
import sys

from conftest import cli, files_containing
from test_forgetting import forked_killed_at

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.context.budget import RECALL_HEADER
from mlxmem.memory.recall import recall_line
from mlxmem.memory.store import Store
from mlxmem.models.tiny import make_tiny
from mlxmem.testing import FakeEngine

SECRET = "My grandmother's greenhouse in Tromso grows purple kohlrabi."
QUESTION = "What grows in my grandmother's greenhouse?"


def companion(store: Store, conversation: str, engine: FakeEngine | None = None) -> Companion:
    settings = ChatSettings(recall=True, extract_facts=False)
    return Companion(engine or FakeEngine(), store, conversation, 2048, 200, settings)


def test_a_turn_told_in_one_conversation_is_recalled_in_another():
    store = Store()
    companion(store, "garden").send(SECRET)
    result = companion(store, "today").send(QUESTION)
    secret = store.turns("garden")[0]
    assert result.prompt.recalled[0] == secret.id
    newest = result.prompt.messages[-1].content
    assert newest.startswith(RECALL_HEADER)
    # Another conversation's turn names it; a turn of this one shows its day only.
    assert f'in "garden"] user: {SECRET}' in newest
    assert recall_line(secret, "garden").startswith("- [") and "garden" not in recall_line(
        secret, "garden"
    )


def test_the_turns_still_in_this_conversations_window_are_not_recalled():
    store = Store()
    chat = companion(store, "garden")
    chat.send(SECRET)
    result = chat.send(QUESTION)  # the secret is in the verbatim window: in the prompt already
    assert result.prompt.recalled == []
    assert sum(SECRET in m.content for m in result.prompt.messages) == 1


def test_a_private_conversation_is_not_recalled_elsewhere_and_can_be_let_back_in():
    store = Store()
    companion(store, "garden").send(SECRET)
    assert store.set_private("garden").private
    assert [c.private for c in store.conversations()] == [True]
    assert companion(store, "today").context(QUESTION).recalled == []
    store.set_private("garden", False)
    assert companion(store, "today").context(QUESTION).recalled != []


def test_a_conversation_deleted_between_two_recalls_is_not_recalled_again():
    store = Store()
    companion(store, "garden").send(SECRET)
    today = companion(store, "today")
    assert today.context(QUESTION).recalled != []
    store.delete_conversation("garden")
    prompt = today.context(QUESTION)
    assert prompt.recalled == [] and all("kohlrabi" not in m.content for m in prompt.messages)


def test_a_kill_during_the_deletion_never_leaves_a_recallable_turn(mlxmem_home, tmp_path):
    """The deletion is killed at each of its steps in turn; after each kill and a reopen, the
    conversation is either whole and recalled, or gone: never recalled, in no file."""
    store = Store()
    companion(store, "garden").send(SECRET)
    companion(store, "today").send("Hello there")
    template = tmp_path / "template"
    shutil.copytree(mlxmem_home, template)
    outcomes = []
    for n in range(1, 200):
        shutil.rmtree(mlxmem_home)
        shutil.copytree(template, mlxmem_home)
        killed = forked_killed_at(["history", "rm", "-c", "garden", "--all", "--yes"], n)
        cli("history", "list")  # a later command opens the store and finishes any erase
        recalled = companion(Store(), "today").context(QUESTION).recalled
        deleted = "garden" not in [c.name for c in Store().conversations()]
        if deleted:
            assert recalled == [], f"killed at {n}: a deleted turn was recalled"
            assert files_containing(mlxmem_home, "kohlrabi") == [], f"killed at {n}"
        else:
            assert recalled != [], f"killed at {n}: the conversation is here but not recalled"
        outcomes.append(deleted)
        if not killed:
            break
    assert outcomes[-1] and not outcomes[0] and len(outcomes) > 2, outcomes


def test_through_the_cli_a_turn_of_conversation_a_is_recalled_in_b_until_a_is_removed(
    mlxmem_home, tmp_path
):
    tiny = make_tiny(tmp_path / "tiny", seed=3)

    def chat(conversation: str, text: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "mlxmem.cli", "chat", "-M", str(tiny), "-c", conversation,
             "--max-tokens", "4", "--temp", "0", "--json", text],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    chat("A", SECRET)
    secret = Store().turns("A")[0]
    assert secret.id in chat("B", QUESTION)["recalled"]
    listed = cli("history", "list").output
    assert "shared" in listed
    cli("history", "private", "A")
    assert "private" in cli("history", "list").output
    assert chat("B", QUESTION)["recalled"] == []
    cli("history", "private", "A", "--off")
    assert secret.id in chat("B", QUESTION)["recalled"]
    cli("history", "rm", "-c", "A", "--all", "--yes")
    assert chat("B", QUESTION)["recalled"] == []
    assert files_containing(mlxmem_home, "kohlrabi") == []


def test_chat_private_starts_a_conversation_kept_out_of_recall(mlxmem_home, tmp_path):
    tiny = make_tiny(tmp_path / "tiny", seed=3)
    cli("chat", "-M", str(tiny), "-c", "diary", "--private", "--max-tokens", "2", SECRET)
    (diary,) = json.loads(cli("history", "list", "--json").output)
    assert diary["name"] == "diary" and diary["private"] is True
    assert companion(Store(), "today").context(QUESTION).recalled == []
