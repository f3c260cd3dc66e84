"""The `llm` plugin through `llm` itself: its CLI (`llm tools list`, `llm fragments show`,
a prompt to its echo debug model that calls mlxmem's tools) and its Python API (a chain with
the toolbox); every kind of delete searched for after, in the same process and a new one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import llm
import pytest
from conftest import files_containing
from test_mcp import fill_log

from mlxmem.memory.store import Store
from mlxmem.surfaces.llm_plugin import Mlxmem, load_fragment


@pytest.fixture(autouse=True)
def llm_home(tmp_path, monkeypatch):
    """llm's own settings and log database, apart from the person's."""
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "llm"))
    return tmp_path / "llm"


def llm_cli(*args: str) -> str:
    """`llm ARGS...` in a process of its own; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "llm", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def tool_call(name: str, **arguments) -> dict:
    return {"name": f"Mlxmem_{name}", "arguments": arguments}


def run_tools(*calls: dict) -> list[str]:
    """A prompt to llm's echo model that calls mlxmem's tools: their outputs, in order."""
    chain = llm.get_model("echo").chain(json.dumps({"tool_calls": calls}), tools=[Mlxmem()])
    chain.text()
    outputs = [r.output for response in chain.responses() for r in response.prompt.tool_results]
    assert len(outputs) == len(calls)
    return outputs


def test_llm_tools_list_shows_mlxmem_tools():
    listed = llm_cli("tools", "list")
    for name in ("add_memories", "search_memory", "delete_memories", "search_turns", "recall"):
        assert f"Mlxmem_{name}(" in listed


def test_fragment_holds_the_facts_and_not_after_a_delete_through_the_toolbox(mlxmem_home):
    marker = "LLM-FACT-5101"
    fact = Store().add_fact(f"Their bike lock code is {marker}.")
    Store().add_fact("They like tea.")
    assert marker in llm_cli("fragments", "show", "mlxmem:facts")
    call = {"tool_calls": [tool_call("delete_memories", memory_ids=[fact.id])]}
    answer = llm_cli("-m", "echo", "-T", "Mlxmem", "--no-log", json.dumps(call))
    assert '"Mlxmem_delete_memories"' in answer and "Deleted 1 fact" in answer
    shown = llm_cli("fragments", "show", "mlxmem:facts")
    assert marker not in shown and "They like tea." in shown
    assert files_containing(mlxmem_home, marker) == []


def test_recall_fragment_holds_what_mlxmem_would_recall():
    Store().append_turn("walks", "user", "We saw a heron by the old mill on Sunday.")
    fragment = load_fragment("recall:Do you remember the heron?")
    assert "heron by the old mill" in fragment and fragment.source == "mlxmem:recall"
    with pytest.raises(ValueError, match="mlxmem:facts or mlxmem:recall:QUERY"):
        load_fragment("everything")


def searches(marker: str) -> list[dict]:
    return [
        tool_call("search_turns", query=marker, limit=50),
        tool_call("search_memory", query=marker),
        tool_call("list_memories", include_replaced=True),
        tool_call("recall", query=f"Do you remember the code {marker}?"),
        tool_call("list_turns", conversation="walks"),
        tool_call("list_turns", conversation="ranges"),
    ]


def test_every_kind_of_delete_through_the_toolbox_leaves_nothing_now_or_in_a_new_process(
    mlxmem_home,
):
    store = Store()
    ids = fill_log(store)
    fact = store.add_fact("Their code word is FACT-A-3306.")
    store.add_fact("Their code word is FACT-B-3307.")
    store.add_fact("Their spare code word is FACT-AUTO-3308.", source="automatic")
    edited = store.add_fact("Their old code word is FACT-EDIT-3309.")
    gone = ["TURN-ONE-3301", "WHOLE-CONV-3303", "RANGE-A-3304", "FACT-A-3306", "FACT-EDIT-3309"]
    gone += ["FACT-B-3307", "FACT-AUTO-3308"]
    for marker in ("TURN-ONE-3301", "RANGE-A-3304", "FACT-A-3306"):
        assert any(marker in output for output in run_tools(*searches(marker))), marker
    run_tools(
        tool_call("delete_turns", turn_ids=[ids["TURN-ONE-3301"]]),
        tool_call("delete_conversation", conversation="trips"),
        tool_call("delete_conversation", conversation="ranges", from_seq=1, to_seq=1),
        tool_call("delete_memories", memory_ids=[fact.id]),
        tool_call("edit_memory", memory_id=edited.id, text="Their code word is new."),
        tool_call("delete_all_memories", source="automatic"),
    )
    run_tools(tool_call("delete_all_memories"))
    for marker in gone:
        assert not any(marker in output for output in run_tools(*searches(marker))), marker
        assert files_containing(mlxmem_home, marker) == [], marker
    assert any("TURN-KEPT-3302" in output for output in run_tools(*searches("TURN-KEPT-3302")))
    # A new process: llm's Python API and its CLI's fragments.
    found = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NEW_PROCESS), json.dumps(gone)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == []
    recalls = [f"-fmlxmem:recall:Do you remember the code {marker}?" for marker in gone]
    prompt = llm_cli("-m", "echo", "--no-log", "-f", "mlxmem:facts", *recalls, "Hello.")
    assert "Facts about the user" in prompt and "TURN-KEPT-3302" in prompt  # not vacuous
    assert [marker for marker in gone if marker in prompt] == []


NEW_PROCESS = """
    import json, sys
    import llm
    from mlxmem.surfaces.llm_plugin import Mlxmem

    found = []
    for marker in json.loads(sys.argv[1]):
        calls = [
            {"name": "Mlxmem_search_turns", "arguments": {"query": marker}},
            {"name": "Mlxmem_search_memory", "arguments": {"query": marker}},
            {"name": "Mlxmem_recall", "arguments": {"query": f"Remember {marker}?"}},
        ]
        chain = llm.get_model("echo").chain(json.dumps({"tool_calls": calls}), tools=[Mlxmem()])
        chain.text()
        for response in chain.responses():
            found += [marker for r in response.prompt.tool_results if marker in r.output]
    print(json.dumps(found))
"""
