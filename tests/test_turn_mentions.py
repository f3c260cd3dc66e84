"""Deleting a user turn lists the turns that may repeat it (its reply, a turn quoting it
whole), and --with-mentions deletes them too, as for a fact (issue 23, Low): in the store,
`mlxmem history rm` and the API."""

from conftest import cli, files_containing
from serve_helpers import fake_server, request

from mlxmem.memory.store import Store

SECRET = "my pin is PINSECRET77"


def seed():
    store = Store()
    user = store.append_turn("default", "user", SECRET)
    reply = store.append_turn("default", "assistant", "Got it: your pin is PINSECRET77.")
    other = store.append_turn("default", "user", "What's the weather?")
    store.append_turn("default", "assistant", "Sunny.")
    elsewhere = store.append_turn("notes", "user", f"Earlier I said {SECRET!r}, remember")
    return store, user, reply, other, elsewhere


def texts(store):
    return [t.text for c in ("default", "notes") for t in store.turns(c)]


def test_the_reply_and_a_turn_quoting_it_are_listed_not_deleted(mlxmem_home):
    store, user, reply, _, elsewhere = seed()
    deletion = store.delete_turns([user.id])
    assert [t.id for t in deletion.mentions] == [reply.id, elsewhere.id]
    assert [t["id"] for t in deletion.to_json()["mentions"]] == [reply.id, elsewhere.id]
    assert SECRET not in texts(store) and reply.text in texts(store)


def test_with_mentions_they_are_deleted_in_the_same_erase(mlxmem_home):
    store, user, reply, other, elsewhere = seed()
    deletion = store.delete_turns([user.id], with_mentions=True)
    assert {t.id for t in deletion.turns} == {user.id, reply.id, elsewhere.id}
    assert deletion.mentions == []
    assert texts(store) == ["What's the weather?", "Sunny."]
    assert files_containing(mlxmem_home, "PINSECRET77") == []


def test_an_assistant_turn_or_a_turn_deleted_with_its_reply_has_no_mentions(mlxmem_home):
    store, user, reply, other, _ = seed()
    sunny = store.turns("default")[-1]
    assert store.delete_turns([sunny.id]).mentions == []  # an assistant turn
    assert store.delete_turns([other.id]).mentions == []  # its reply is gone already
    assert store.delete_turns([user.id, reply.id]).mentions != []  # the quote elsewhere


def test_history_rm_lists_them_and_deletes_them_with_mentions(mlxmem_home):
    store, user, reply, _, elsewhere = seed()
    out = cli("history", "rm", str(user.id)).output
    assert "Deleted 1 turn." in out and "2 turns of the log may still repeat it" in out
    assert f"[{reply.id}] default #2 assistant: Got it" in out and "--with-mentions" in out
    cli("history", "rm", str(reply.id), str(elsewhere.id))
    assert files_containing(mlxmem_home, "PINSECRET77") == []


def test_history_rm_with_mentions(mlxmem_home):
    store, user, *_ = seed()
    out = cli("history", "rm", str(user.id), "--with-mentions").output
    assert out.startswith("Deleted 3 turns") and "may still repeat" not in out
    assert files_containing(mlxmem_home, "PINSECRET77") == []


def test_with_mentions_needs_turn_ids(mlxmem_home):
    seed()
    result = cli("history", "rm", "-c", "default", "--all", "--yes", "--with-mentions", code=1)
    assert "--with-mentions goes with turn IDs" in result.output
    assert len(Store().turns("default")) == 4


def test_the_api_lists_them_or_deletes_them(mlxmem_home):
    store, user, reply, _, elsewhere = seed()
    with fake_server() as server:
        status, body, _ = request(server, "DELETE", f"/v1/memory/turns/{user.id}")
        assert status == 200 and [t["id"] for t in body["mentions"]] == [reply.id, elsewhere.id]
        status, body, _ = request(
            server, "DELETE", f"/v1/memory/turns/{reply.id}?with_mentions=true"
        )
        assert status == 200 and body["turns"] == [reply.id]
    assert [t.text for t in store.turns("notes")] == [elsewhere.text]  # listed, kept


def test_a_short_message_or_a_part_of_a_word_is_not_a_quote(mlxmem_home):
    store = Store()
    hi = store.append_turn("default", "user", "hi")
    reply = store.append_turn("default", "assistant", "Hello!")
    unrelated = [
        store.append_turn("notes", "user", text).id
        for text in ("I think this is fine", "Which school was it?", "hi there, hi again")
    ]
    deletion = store.delete_turns([hi.id], with_mentions=True)
    assert {t.id for t in deletion.turns} == {hi.id, reply.id}  # its reply, nothing else
    assert [t.id for t in store.turns("notes")] == unrelated
    fact = store.add_fact("The user likes tea.", source="manual")
    store.append_turn("notes", "user", "the user likes teapots, not tea")  # no whole quote
    quoted = store.append_turn("notes", "assistant", "Noted: THE USER LIKES  TEA.")
    assert [t.id for t in store.mentions(fact)] == [quoted.id]
