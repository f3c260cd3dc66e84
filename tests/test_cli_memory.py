"""`mlxmem memory` and `mlxmem history`, as transcripts: run the command, read the output,
then check the rows in the database."""

import json

import pytest
from conftest import cli
from typer.testing import CliRunner

from mlxmem import paths
from mlxmem.cli.main import app
from mlxmem.memory.store import Store

runner = CliRunner()


mlxmem = cli


def as_json(*args: str) -> list:
    return json.loads(mlxmem(*args, "--json").stdout)


def error(*args: str) -> str:
    """Run a command that must fail like an expected failure: `Error: ...`, exit 1, no trace."""
    result = mlxmem(*args, code=1)
    assert result.stderr.startswith("Error: ")
    assert "Traceback" not in result.output
    return result.stderr


# -- memory -----------------------------------------------------------------------------------


def test_memory_add_list_edit_rm():
    assert mlxmem("memory", "add", "My sister is Anna.").stdout == "Added fact 1.\n"
    mlxmem("memory", "add", "Likes [bold]green[/bold] tea.")
    assert [(f["id"], f["source"], f["text"]) for f in as_json("memory", "list")] == [
        (1, "manual", "My sister is Anna."),
        (2, "manual", "Likes [bold]green[/bold] tea."),
    ]
    table = mlxmem("memory", "list").stdout
    assert "[bold]green[/bold]" in table and "manual" in table  # markup shown, not applied

    assert mlxmem("memory", "edit", "2", "Likes black tea.").stdout == "Updated fact 2.\n"
    assert Store().get_fact(2).text == "Likes black tea."

    assert mlxmem("memory", "rm", "1").stdout == "Deleted 1 fact.\n"
    assert [f.id for f in Store().facts()] == [2]


def test_a_fact_said_again_is_refused_with_the_one_that_says_it():
    mlxmem("memory", "add", "I am vegetarian")
    for again in ["I am vegetarian", "i am  Vegetarian."]:  # exact, and case or spacing only
        message = error("memory", "add", again)
        assert "fact 1 already says that: 'I am vegetarian'" in message
    mlxmem("memory", "add", "I am vegan")  # not the same fact
    assert "fact 1 already says that" in error("memory", "edit", "2", "I AM VEGETARIAN")
    mlxmem("memory", "edit", "1", "I am Vegetarian.")  # a fact may be rewritten in its own words
    assert [f.text for f in Store().facts()] == ["I am Vegetarian.", "I am vegan"]


def test_memory_clear_needs_yes():
    mlxmem("memory", "add", "one")
    Store().add_fact("two", source="automatic")
    assert "--yes" in error("memory", "clear")
    assert len(Store().facts()) == 2
    # A bad source is refused before anything is asked (not "Delete every bogus fact?").
    bogus = error("memory", "clear", "--source", "bogus")
    assert "bogus" in bogus and "Delete" not in bogus and "--yes" not in bogus
    assert mlxmem("memory", "clear", "--yes", "--source", "automatic").stdout == "Deleted 1 fact.\n"
    assert mlxmem("memory", "clear", "--yes").stdout == "Deleted 1 fact.\n"
    assert as_json("memory", "list") == []
    assert "No facts yet" in mlxmem("memory", "list").stdout


def test_memory_errors():
    mlxmem("memory", "add", "one")
    assert error("memory", "rm", "1", "99") == "Error: no fact with id 99\n"
    assert [f.id for f in Store().facts()] == [1]  # all or nothing
    assert "no fact with id 7" in error("memory", "edit", "7", "x")
    assert "empty" in error("memory", "add", "   ")
    assert "empty" in error("memory", "edit", "1", "")


def test_memory_commands_leave_no_trace_of_deleted_text(mlxmem_home):
    mlxmem("memory", "add", "pin is MARKER-CLI-3e1f")
    mlxmem("memory", "add", "old MARKER-CLI-EDIT-3e1f")
    (paths.cache_dir() / "chat.safetensors").write_bytes(b"MARKER-CLI-3e1f")
    mlxmem("memory", "rm", "1")
    mlxmem("memory", "edit", "2", "new")
    assert list(paths.cache_dir().iterdir()) == []  # KV caches may hold the text: dropped
    for path in mlxmem_home.rglob("*"):
        if path.is_file():
            assert b"MARKER-CLI" not in path.read_bytes(), path


# -- history ----------------------------------------------------------------------------------


@pytest.fixture
def chat():
    store = Store()
    for i, text in enumerate(["Hi, I'm Sam.", "Hello Sam!", "My cat is Miso.", "Cute name!"]):
        store.append_turn("default", ("user", "assistant")[i % 2], text)
    store.append_turn("work", "user", "Standup moved to ten.")
    store.add_summary("default", "Sam introduced themselves.", 1, 2, 6)
    return store


def test_history_list_and_show(chat):
    listed = as_json("history", "list")
    assert [(c["name"], c["turn_count"]) for c in listed] == [("default", 4), ("work", 1)]
    # Scripts written before the rename read the old key: it is still there.
    assert [c["message_count"] for c in listed] == [4, 1]
    turns = as_json("history", "show")
    assert [(t["id"], t["seq"], t["role"], t["text"]) for t in turns] == [
        (1, 1, "user", "Hi, I'm Sam."),
        (2, 2, "assistant", "Hello Sam!"),
        (3, 3, "user", "My cat is Miso."),
        (4, 4, "assistant", "Cute name!"),
    ]
    assert [t["text"] for t in as_json("history", "show", "--last", "1")] == ["Cute name!"]
    assert [t["text"] for t in as_json("history", "show", "work")] == ["Standup moved to ten."]
    shown = mlxmem("history", "show").stdout
    assert "My cat is Miso." in shown and "assistant" in shown
    assert "work" in mlxmem("history", "list").stdout
    assert "no conversation named 'nope'" in error("history", "show", "nope")


def test_history_show_summaries_and_who_wrote_them(chat):
    chat.add_summary("default", "[8 May 2023] Sam: My cat is Miso.", 1, 4, 9, source="extractive")
    rows = as_json("history", "show", "--summaries")
    assert [(s["first_seq"], s["last_seq"], s["source"], s["text"]) for s in rows] == [
        (1, 2, "model", "Sam introduced themselves."),
        (1, 4, "extractive", "[8 May 2023] Sam: My cat is Miso."),
    ]
    assert [s["source"] for s in as_json("history", "show", "--summaries", "-n", "1")] == [
        "extractive"
    ]
    table = mlxmem("history", "show", "--summaries").stdout
    assert "extractive" in table and "model" in table and "1-4" in table
    shown = mlxmem("history", "show").stdout
    assert "Turns #1-#4 are folded into a summary (extractive: picked from the turns" in shown
    assert mlxmem("history", "show", "work", "--summaries").stdout == "No summaries.\n"
    assert as_json("history", "show", "work", "--summaries") == []


def test_history_show_empty_default():
    assert mlxmem("history", "show").stdout == "No turns.\n"
    assert as_json("history", "show") == []


def test_history_search(chat):
    assert [t["text"] for t in as_json("history", "search", "SAM")] == [
        "Hello Sam!",
        "Hi, I'm Sam.",
    ]
    assert as_json("history", "search", "sam", "--conversation", "work") == []
    assert "Miso" in mlxmem("history", "search", "miso").stdout
    assert mlxmem("history", "search", "zebra").stdout == "No turns.\n"


def test_history_rm_one_turn(chat):
    assert mlxmem("history", "rm", "2").stdout == (
        "Deleted 1 turn and 1 summary that saw them; the older turns are summarized again, "
        "without it, before the next reply.\n"
    )
    assert [m.seq for m in Store().turns("default")] == [1, 3, 4]
    assert Store().latest_summary("default") is None
    assert "no turn with id 2" in error("history", "rm", "2")


def test_history_rm_range_and_conversation(chat):
    range_args = ["history", "rm", "--conversation", "default", "--from", "3", "--to", "4"]
    assert "--yes" in error(*range_args)  # a bulk deletion, and no terminal to ask on
    assert mlxmem(*range_args, "--yes").stdout == "Deleted 2 turns.\n"
    assert [m.seq for m in Store().turns("default")] == [1, 2]
    assert Store().latest_summary("default") is not None  # covers 1-2 only: kept
    assert "no turns 5.. in conversation" in error(
        "history", "rm", "-c", "default", "--from", "5", "-y"
    )
    assert "--yes" in error("history", "rm", "-c", "work", "--all")
    assert len(Store().turns("work")) == 1  # nothing deleted
    assert mlxmem("history", "rm", "-c", "work", "--all", "--yes").stdout == "Deleted 1 turn.\n"
    assert [c.name for c in Store().conversations()] == ["default"]


def test_history_rm_refuses_turn_numbers_below_one(chat):
    # `--to 0` once read as "no last turn": the range 2..0 deleted every turn from 2 on.
    for bounds in (["--from", "2", "--to", "0"], ["--from", "0", "--to", "0"], ["--from", "-1"]):
        result = mlxmem("history", "rm", "-c", "default", *bounds, "--yes", code=2)
        assert "Traceback" not in result.output
    assert [m.seq for m in Store().turns("default")] == [1, 2, 3, 4]


def test_bulk_deletions_ask_on_a_terminal(chat, monkeypatch):
    from mlxmem.cli import common

    monkeypatch.setattr(common, "on_terminal", lambda: True)
    no = runner.invoke(app, ["history", "rm", "-c", "work", "--all"], input="n\n")
    assert no.exit_code == 1 and "Delete conversation 'work' (1 turn) for good?" in no.output
    assert "Nothing deleted." in no.output and len(Store().turns("work")) == 1
    yes = runner.invoke(app, ["history", "rm", "-c", "work", "--all"], input="y\n")
    assert yes.exit_code == 0 and "Deleted 1 turn." in yes.output
    Store().add_fact("Likes tea.")
    kept = runner.invoke(app, ["memory", "clear"], input="\n")  # the default answer is no
    assert kept.exit_code == 1 and len(Store().facts()) == 1


def test_history_rm_drops_kv_caches(chat):
    cache = paths.cache_dir() / "default.safetensors"
    cache.write_bytes(b"kv")
    mlxmem("history", "rm", "1")
    assert not cache.exists()


def test_history_rm_needs_a_target(chat):
    assert "say what to delete" in error("history", "rm")
    assert "say what to delete" in error("history", "rm", "1", "--all")
    assert "say what to delete" in error("history", "rm", "-c", "default")
    assert "say what to delete" in error("history", "rm", "-c", "default", "--all", "--to", "2")
    assert len(Store().turns("default")) == 4
    assert "no conversation named 'nope'" in error("history", "rm", "-c", "nope", "--all")


# -- a fact that replaces another ---------------------------------------------------------------


def test_a_fact_that_replaces_another_leaves_it_listed_out_of_the_prompt():
    mlxmem("memory", "add", "I live in Lisbon")
    said = mlxmem("memory", "add", "I moved to Porto", "--replaces", "1").stdout
    assert said.startswith("Added fact 2. Fact 1 is replaced")
    assert [f["text"] for f in as_json("memory", "list")] == ["I moved to Porto"]
    lisbon, porto = as_json("memory", "list", "--all")
    assert (lisbon["text"], lisbon["replaced_by"], porto["replaced_by"]) == (
        "I live in Lisbon",
        2,
        None,
    )
    assert lisbon["replaced_at"] is not None
    # What a chat's prompt gets: the current facts only.
    assert [f.text for f in Store().snapshot("default").facts] == ["I moved to Porto"]
    assert "already replaced by fact 2" in error("memory", "add", "Faro", "--replaces", "1")
    assert "no fact with id 9" in error("memory", "add", "Faro", "--replaces", "9")
    mlxmem("memory", "rm", "1", "--yes")
    assert [f["text"] for f in as_json("memory", "list", "--all")] == ["I moved to Porto"]
    home = paths.db_path().parent
    assert [p for p in home.rglob("*") if p.is_file() and b"Lisbon" in p.read_bytes()] == []


def test_a_replacement_made_in_error_is_undone_by_restore():
    mlxmem("memory", "add", "I live in Lisbon")
    mlxmem("memory", "add", "I moved to Porto", "--replaces", "1")
    said = mlxmem("memory", "restore", "1").stdout
    assert "Fact 1 is current again" in said and "'I live in Lisbon'" in said
    assert [(f["id"], f["replaced_by"]) for f in as_json("memory", "list", "--all")] == [
        (1, None),
        (2, None),
    ]
    assert [f.text for f in Store().snapshot("default").facts] == [
        "I live in Lisbon",
        "I moved to Porto",
    ]
    assert "fact 1 is not replaced" in error("memory", "restore", "1")
    assert "no fact with id 9" in error("memory", "restore", "9")
    # Replaced again after the restore: the same fact can be replaced anew.
    mlxmem("memory", "add", "I moved to Faro", "--replaces", "1")
    assert [f["text"] for f in as_json("memory", "list")] == ["I moved to Porto", "I moved to Faro"]
    # A restore that would say twice what a current fact says is refused.
    mlxmem("memory", "add", "I live in Lisbon!")  # 1 is replaced: not a duplicate of a current one
    assert "fact 4 already says that" in error("memory", "restore", "1")


def test_a_fact_whose_replacement_was_deleted_can_be_replaced_again():
    mlxmem("memory", "add", "I live in Lisbon")
    mlxmem("memory", "add", "I moved to Porto", "--replaces", "1")
    mlxmem("memory", "rm", "2")  # Lisbon is current again
    mlxmem("memory", "add", "I moved to Faro", "--replaces", "1")
    assert [f["text"] for f in as_json("memory", "list")] == ["I moved to Faro"]
    lisbon = as_json("memory", "list", "--all")[0]
    assert (lisbon["text"], lisbon["replaced_by"]) == ("I live in Lisbon", 3)


def test_deleting_the_replacing_fact_says_the_old_one_is_current_again():
    mlxmem("memory", "add", "I live in Lisbon")
    mlxmem("memory", "add", "I moved to Porto", "--replaces", "1")
    said = mlxmem("memory", "rm", "2").stdout
    assert "Fact 1 is current again" in said and "'I live in Lisbon'" in said
    assert [(f["id"], f["replaced_by"]) for f in as_json("memory", "list")] == [(1, None)]
    assert [f.text for f in Store().snapshot("default").facts] == ["I live in Lisbon"]
    # Deleting both at once brings neither back.
    mlxmem("memory", "add", "I moved to Faro", "--replaces", "1")
    assert "current again" not in mlxmem("memory", "rm", "1", "3").stdout
    assert as_json("memory", "list", "--all") == []
