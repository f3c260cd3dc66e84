"""The MCP server, the `llm` plugin, a chat and `mlxmem serve` on one data directory at once:
each writes while the others hold the store, nothing fails as locked, and a delete made
through one is gone from every other at its next read."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from conftest import files_containing, scripted
from serve_helpers import fake_server, request
from test_llm_plugin import llm_home  # noqa: F401 - autouse: llm's own files apart
from test_mcp import call, resource, stdio_client

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.surfaces.llm_plugin import Mlxmem
from mlxmem.testing import FakeEngine

MARKER = "TOGETHER-9107"


def llm_fragment(name: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "llm", "fragments", "show", name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def served_prompt(server, engine: FakeEngine, text: str) -> str:
    """The prompt `mlxmem serve` writes its reply from, for a new message."""
    body = {"model": "fake", "messages": [{"role": "user", "content": text}]}
    status, answer, _ = request(server, "POST", "/v1/chat/completions", body)
    assert status == 200, answer
    return engine.calls[-1].prompt


def test_mcp_llm_chat_and_serve_at_once_see_one_another_and_a_delete_everywhere(
    mlxmem_home,
    llm_home,  # noqa: F811
):
    chat_engine, served_engine = FakeEngine(scripted), FakeEngine(scripted)
    store = Store()
    chat = Companion(chat_engine, store, "journal", 600, 120, ChatSettings(extract_facts=False))
    toolbox = Mlxmem()  # llm's toolbox, in this process, opening the store per call

    async def session() -> None:
        async with stdio_client() as mcp:
            with fake_server(served_engine) as server, store.holding():
                chat.send("Hello, journal.")
                fact = toolbox.add_memories(f"Their gate code is {MARKER}.")
                assert [f["id"] for f in (await call(mcp, "search_memory", query="gate"))["items"]]
                _, facts, _ = request(server, "GET", "/v1/memory/facts")
                assert MARKER in str(facts)
                assert MARKER in chat_engine.decode(chat.send("My gate code?").prompt.tokens)
                assert MARKER in served_prompt(server, served_engine, "What is my gate code?")
                assert MARKER in llm_fragment("mlxmem:facts")

                await call(mcp, "delete_memories", memory_ids=[fact["id"]])
                assert MARKER not in str(request(server, "GET", "/v1/memory/facts")[1])
                assert MARKER not in served_prompt(server, served_engine, "And my gate code?")
                assert MARKER not in chat_engine.decode(chat.send("Gate code?").prompt.tokens)
                assert toolbox.search_memory("gate code")["items"] == []
                assert MARKER not in llm_fragment("mlxmem:facts")
                assert MARKER not in await resource(mcp, "mlxmem://facts")

                # A turn said to the chat, deleted through serve's memory API, gone from MCP.
                chat.send(f"Note the locker number {MARKER}-L.")
                found = (await call(mcp, "search_turns", query=f"{MARKER}-L"))["items"]
                assert [(t["conversation"], t["role"]) for t in found] == [("journal", "user")]
                deleted = request(server, "DELETE", f"/v1/memory/turns/{found[0]['id']}")
                assert deleted[0] == 200, deleted[1]
                assert (await call(mcp, "search_turns", query=f"{MARKER}-L"))["items"] == []
                assert toolbox.search_turns(f"{MARKER}-L")["items"] == []

    asyncio.run(session())
    assert files_containing(mlxmem_home, MARKER) == []
