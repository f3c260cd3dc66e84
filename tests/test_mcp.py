"""`mlxmem mcp` through the `mcp` SDK's own client: over stdio (the server a subprocess, as a
desktop client starts it) and over streamable HTTP; every kind of delete searched for after,
in the same server process and in a new one; beside a chat that holds the store; serve's
Host, Origin and token rules on HTTP; private conversations kept out."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from conftest import cli, files_containing, scripted
from mcp import Client, StdioServerParameters

from mlxmem.cli.repl import Session
from mlxmem.cli.terminal import Terminal
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.surfaces.mcp_server import build_server
from mlxmem.surfaces.memory import MemoryTools
from mlxmem.testing import FakeEngine

MLXMEM = [sys.executable, "-c", "from mlxmem.cli.main import run; run()"]
OPENMEMORY_NAMES = {
    "add_memories",
    "search_memory",
    "list_memories",
    "delete_memories",
    "delete_all_memories",
}


@asynccontextmanager
async def stdio_client() -> AsyncIterator[Client]:
    params = StdioServerParameters(
        command=MLXMEM[0], args=[*MLXMEM[1:], "mcp"], env=dict(os.environ)
    )
    async with Client(params, read_timeout_seconds=60) as client:
        yield client


@asynccontextmanager
async def http_server(*args: str) -> AsyncIterator[tuple[str, subprocess.Popen]]:
    """`mlxmem mcp --http --port 0 ARGS`: its URL (from the line it prints) and process."""
    proc = subprocess.Popen(
        [*MLXMEM, "mcp", "--http", "--port", "0", *args], stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        line = await asyncio.to_thread(proc.stderr.readline)
        assert line.startswith("mlxmem mcp on http://"), line
        yield line.split()[3], proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@asynccontextmanager
async def http_client() -> AsyncIterator[Client]:
    async with http_server() as (url, _), Client(url, read_timeout_seconds=60) as client:
        yield client


CLIENTS = {"stdio": stdio_client, "http": http_client}


async def call(client: Client, tool: str, **arguments: Any) -> dict:
    """A tool's answer, which must not be an error."""
    result = await client.call_tool(tool, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    assert not result.is_error, text
    return json.loads(text)


async def failure(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error
    return result.content[0].text  # type: ignore[union-attr]


async def resource(client: Client, uri: str) -> str:
    contents = (await client.read_resource(uri)).contents
    return "".join(getattr(c, "text", "") for c in contents)


@pytest.mark.parametrize("transport", CLIENTS)
def test_add_search_delete_and_the_fact_is_gone_everywhere(transport, mlxmem_home):
    marker = f"MCP-FACT-{transport}-7301"

    async def session() -> None:
        async with CLIENTS[transport]() as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert OPENMEMORY_NAMES <= names and {"search_turns", "recall"} <= names
            text = f"My locker code is {marker}."
            added = await call(client, "add_memories", text=text, source="automatic")
            assert added["source"] == "automatic"
            listed = await call(client, "list_memories", source="automatic")
            assert texts_of(listed, "text") == [text]
            found = await call(client, "search_memory", query="locker code")
            assert [f["id"] for f in found["items"]] == [added["id"]]
            assert marker in await resource(client, "mlxmem://facts")
            assert files_containing(mlxmem_home, marker)  # not vacuous: on disk before
            deleted = await call(client, "delete_memories", memory_ids=[added["id"]])
            assert [f["id"] for f in deleted["facts"]] == [added["id"]]
            assert (await call(client, "search_memory", query="locker code"))["items"] == []
            assert (await call(client, "list_memories", include_replaced=True))["items"] == []
            assert marker not in await resource(client, "mlxmem://facts")
            assert files_containing(mlxmem_home, marker) == []
        async with CLIENTS[transport]() as client:  # a new server process
            assert (await call(client, "search_memory", query=marker))["items"] == []

    asyncio.run(session())
    assert Store().facts(replaced=True) == []


def fill_log(store: Store) -> dict[str, int]:
    """Turns for each kind of delete, each with its own marker; the marker -> turn id."""
    ids = {}
    for conversation, marker in [
        ("walks", "TURN-ONE-3301"),
        ("walks", "TURN-KEPT-3302"),
        ("trips", "WHOLE-CONV-3303"),
        ("ranges", "RANGE-A-3304"),
        ("ranges", "RANGE-B-3305"),
    ]:
        text = f"Remember the walk by the river, code {marker}."
        ids[marker] = store.append_turn(conversation, "user", text).id
    return ids


async def search_everywhere(client: Client, marker: str) -> list[str]:
    """Every read of the log and the facts that could show `marker`: what holds it."""
    hits = []
    if (await call(client, "search_turns", query=marker, limit=50))["items"]:
        hits.append("search_turns")
    if (await call(client, "search_memory", query=marker))["items"]:
        hits.append("search_memory")
    if marker in json.dumps(await call(client, "list_memories", include_replaced=True)):
        hits.append("list_memories")
    recalled = await call(client, "recall", query=f"Do you remember the code {marker}?")
    if marker in json.dumps(recalled):
        hits.append("recall")
    for c in (await call(client, "list_conversations"))["items"]:
        if marker in json.dumps(await call(client, "list_turns", conversation=c["name"])):
            hits.append(f"list_turns {c['name']}")
        if marker in await resource(client, f"mlxmem://conversations/{c['name']}"):
            hits.append(f"resource {c['name']}")
    if marker in await resource(client, "mlxmem://facts"):
        hits.append("facts resource")
    return hits


@pytest.mark.parametrize("transport", CLIENTS)
def test_every_kind_of_delete_leaves_nothing_to_find_now_or_in_a_new_process(
    transport, mlxmem_home
):
    store = Store()
    ids = fill_log(store)
    facts = {
        m: store.add_fact(f"Their code word is {m}.").id for m in ("FACT-A-3306", "FACT-B-3307")
    }
    store.add_fact("Their spare code word is FACT-AUTO-3308.", source="automatic")
    gone = ["TURN-ONE-3301", "WHOLE-CONV-3303", "RANGE-A-3304", "FACT-A-3306", "FACT-EDIT-3309"]
    gone += ["FACT-B-3307", "FACT-AUTO-3308"]
    edited = store.add_fact("Their old code word is FACT-EDIT-3309.").id

    async def session() -> None:
        async with CLIENTS[transport]() as client:
            for marker in ("TURN-ONE-3301", "RANGE-A-3304", "FACT-A-3306", "FACT-AUTO-3308"):
                assert await search_everywhere(client, marker), marker  # found before
            await call(client, "delete_turns", turn_ids=[ids["TURN-ONE-3301"]])
            await call(client, "delete_conversation", conversation="trips")
            await call(client, "delete_conversation", conversation="ranges", from_seq=1, to_seq=1)
            await call(client, "delete_memories", memory_ids=[facts["FACT-A-3306"]])
            await call(client, "edit_memory", memory_id=edited, text="Their code word is new.")
            await call(client, "delete_all_memories", source="automatic")
            await call(client, "delete_all_memories")
            for marker in gone:
                assert await search_everywhere(client, marker) == [], marker
            assert await search_everywhere(client, "TURN-KEPT-3302")  # the rest is still there
            assert await search_everywhere(client, "RANGE-B-3305")
        async with CLIENTS[transport]() as client:
            for marker in gone:
                assert await search_everywhere(client, marker) == [], marker

    asyncio.run(session())
    for marker in gone:
        assert files_containing(mlxmem_home, marker) == [], marker


def test_beside_a_chat_holding_the_store_its_next_turn_does_not_see_the_deleted_fact(
    mlxmem_home,
):
    """The chat (a Companion holding the store, as `mlxmem chat` does) in this process, the
    MCP server in another: both write, neither waits for the other to stop."""
    marker = "HELD-CHAT-6402"
    engine = FakeEngine(scripted)
    store = Store()
    chat = Companion(engine, store, "default", 600, 120, ChatSettings(extract_facts=False))

    async def session() -> None:
        async with stdio_client() as client:
            with store.holding():
                chat.send("Hello there.")
                added = await call(client, "add_memories", text=f"Their PIN is {marker}.")
                seen = chat.send("What is my PIN?")
                assert marker in engine.decode(seen.prompt.tokens)
                found = await call(client, "search_memory", query="PIN")
                assert [f["id"] for f in found["items"]] == [added["id"]]
                await call(client, "delete_memories", memory_ids=[added["id"]])
                after = chat.send("And now, what is my PIN?")
                assert marker not in engine.decode(after.prompt.tokens)
                assert (await call(client, "search_memory", query="PIN"))["items"] == []
                assert marker not in await resource(client, "mlxmem://facts")
                assert [t["text"] for t in (await call(client, "list_turns"))["items"]][-2:] == [
                    "And now, what is my PIN?",
                    after.reply,
                ]

    asyncio.run(session())
    assert files_containing(mlxmem_home, marker) == []


def test_beside_the_chat_repl_a_fact_it_remembered_is_deleted_over_mcp_and_not_seen_again(
    capsys, mlxmem_home
):
    """`mlxmem chat`'s own REPL session (on the fake engine, holding the store as it does)
    remembers a fact; the MCP server, another process, finds and deletes it; the REPL's next
    turn and its /memory no longer have it."""
    marker = "REPL-FACT-6403"

    def responder(prompt: str) -> str:
        return "I see the code." if marker in prompt else "I see no code."

    store = Store()

    def open_chat(model: str, conversation: str) -> Companion:
        return Companion(FakeEngine(responder), store, conversation, 800, 120, ChatSettings())

    out = io.StringIO()
    session = Session(open_chat, "fake", "default", Terminal(out))

    async def session_with_mcp() -> None:
        async with stdio_client() as client:
            with store.holding():
                session.command(f"/remember My door code is {marker}.")
                session.send("What is my door code?")
                session.settle()
                found = (await call(client, "search_memory", query="door code"))["items"]
                assert [f["text"] for f in found] == [f"My door code is {marker}."]
                await call(client, "delete_memories", memory_ids=[found[0]["id"]])
                session.send("And now, my door code?")
                session.settle()
                session.command("/memory")

    asyncio.run(session_with_mcp())
    session.model_thread.close()
    assert out.getvalue().splitlines() == ["I see the code.", "I see no code."]
    said = capsys.readouterr().err
    assert f"remembered [1] My door code is {marker}." in said
    assert "nothing remembered yet" in said
    assert files_containing(mlxmem_home, marker) == []


def test_http_keeps_serves_host_origin_and_token_rules():
    async def probe() -> None:
        async with http_server("--token", "s3cret") as (url, _):
            init = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            async with httpx2.AsyncClient() as http:
                bare = await http.post(url, json=init)
                assert bare.status_code == 401
                auth = {"Authorization": "Bearer s3cret"}
                host = await http.post(url, json=init, headers={**auth, "Host": "evil.example"})
                assert host.status_code == 403
                assert host.json()["error"]["code"] == "forbidden_host"
                origin = {**auth, "Origin": "http://evil.example"}
                assert (await http.post(url, json=init, headers=origin)).status_code == 403
            client = httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret"})
            from mcp.client.streamable_http import streamable_http_client

            async with Client(streamable_http_client(url, http_client=client)) as mcp_client:
                assert (await call(mcp_client, "list_memories"))["items"] == []

    asyncio.run(probe())
    result = cli("mcp", "--http", "--host", "0.0.0.0", code=1)
    assert "not a loopback address" in result.output
    assert "go with --http" in cli("mcp", "--port", "9000", code=1).output


def test_a_port_in_use_is_one_line():
    async def taken() -> None:
        async with http_server() as (url, _):
            port = url.rsplit(":", 1)[1].split("/")[0]
            result = cli("mcp", "--http", "--port", port, code=1)
            assert "cannot listen on 127.0.0.1" in result.output and "--port 0" in result.output

    asyncio.run(taken())


def test_a_private_conversation_is_never_shown_outside_itself():
    store = Store()
    store.append_turn("diary", "user", "Write this down: Their code is PRIVATE-8801.")
    store.append_turn("walks", "user", "The river code is SHARED-8802, remember it.")
    fact = store.add_fact("Their code is PRIVATE-8801.")

    async def session() -> None:
        async with Client(build_server(MemoryTools(store))) as client:  # in process
            assert (await call(client, "search_turns", query="PRIVATE-8801"))["items"]
            assert (await call(client, "keep_private", conversation="diary"))["private"]
            assert (await call(client, "search_turns", query="PRIVATE-8801"))["items"] == []
            assert (await call(client, "search_turns", query="SHARED-8802"))["items"]
            asked = "Do you remember my secret code PRIVATE-8801?"
            assert "PRIVATE-8801" not in json.dumps(await call(client, "recall", query=asked))
            names = texts_of(await call(client, "list_conversations"), "name")
            assert names == ["walks"]
            assert "private" in await failure(client, "list_turns", conversation="diary")
            assert "private" in await failure(
                client, "search_turns", query="x", conversation="diary"
            )
            deleted = await call(client, "delete_memories", memory_ids=[fact.id])
            assert deleted["mentions"] == [] and deleted["private_mentions"] == 1
            await call(client, "delete_conversation", conversation="diary")  # deleting is allowed
            assert "no conversation" in await failure(client, "list_turns", conversation="diary")

    asyncio.run(session())


def texts_of(answer: dict, key: str) -> list[str]:
    return [item[key] for item in answer["items"]]


def test_a_replaced_fact_is_restored_as_memory_restore_does():
    async def session() -> None:
        async with Client(build_server(MemoryTools(Store()))) as client:
            old = await call(client, "add_memories", text="I live in Lisbon.")
            await call(client, "add_memories", text="I moved to Porto.", replaces=old["id"])
            assert texts_of(await call(client, "list_memories"), "text") == ["I moved to Porto."]
            every = await call(client, "list_memories", include_replaced=True)
            assert [f["replaced_by"] is None for f in every["items"]] == [False, True]
            await call(client, "restore_memory", memory_id=old["id"])
            listed = texts_of(await call(client, "list_memories"), "text")
            assert sorted(listed) == ["I live in Lisbon.", "I moved to Porto."]
            every = await call(client, "list_memories", include_replaced=True)
            assert [f["replaced_by"] for f in every["items"]] == [None, None]

    asyncio.run(session())


def test_bad_input_is_one_line_and_changes_nothing():
    store = Store()
    store.add_fact("They like tea.")

    async def session() -> None:
        async with Client(build_server(MemoryTools(store))) as client:
            assert "no fact with id 42" in await failure(client, "delete_memories", memory_ids=[42])
            assert "source" in await failure(client, "delete_all_memories", source="bogus")
            assert "limit" in await failure(client, "search_turns", query="tea", limit=0)
            assert "already" in await failure(client, "add_memories", text="They like tea.")

    asyncio.run(session())
    assert [f.text for f in store.facts()] == ["They like tea."]


def test_the_tools_are_the_shared_operations_and_each_is_documented():
    """The server lists every public operation of MemoryTools, and each has its help."""

    async def listed() -> dict[str, str | None]:
        async with Client(build_server(MemoryTools(Store()))) as client:
            return {t.name: t.description for t in (await client.list_tools()).tools}

    tools = asyncio.run(listed())
    assert set(tools) == {n for n in dir(MemoryTools) if not n.startswith("_")}
    assert all(tools.values()), [n for n, d in tools.items() if not d]
