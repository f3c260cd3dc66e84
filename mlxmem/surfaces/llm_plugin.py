"""mlxmem as a plugin for simonw's `llm` (found through the `llm` entry point in pyproject):

- a toolbox, `Mlxmem` (`llm -T Mlxmem ...`): MemoryTools' operations, the same as the MCP
  server's, as tools named `Mlxmem_search_memory`, `Mlxmem_delete_memories`, ...;
- fragments: `-f mlxmem:facts` (the current facts) and `-f mlxmem:recall:QUERY` (the turns
  recall's ranking finds for QUERY).

Each reads the data directory ($MLXMEM_HOME, else the platform's) through the Store at every
call, so a delete made anywhere is seen by the next call. `llm` keeps its own log of prompts,
fragments and tool results in its own database (`llm logs`), outside mlxmem's data directory:
mlxmem's deletes do not reach it (docs/mcp.md says how to keep text out of it).
"""

from __future__ import annotations

from pathlib import Path

import llm

from mlxmem import paths
from mlxmem.defaults import DEFAULT_CONVERSATION
from mlxmem.memory.store import Store

from .memory import MemoryTools

FRAGMENT_PREFIX = "mlxmem"
FACTS_HEADER = "Facts about the user (from mlxmem's memory):"
RECALL_HEADER = "Turns of earlier conversations that may be relevant (found by mlxmem's recall):"


def store_at(data_dir: str | None) -> Store:
    """The store of `data_dir`, else of the data directory."""
    return Store(Path(data_dir) / paths.DB_FILENAME if data_dir else None)


class Mlxmem(MemoryTools, llm.Toolbox):
    """mlxmem's long-term memory of the user: facts about them and the log of their chats,
    searchable, editable and deletable for good."""

    def __init__(self, data_dir: str | None = None):
        super().__init__(store_at(data_dir))


def load_fragment(argument: str) -> llm.Fragment:
    """`facts`, or `recall:QUERY`."""
    kind, _, query = argument.partition(":")
    tools = MemoryTools(store_at(None))
    if kind == "facts" and not query:
        lines = [f"- {f['text']}" for f in tools.list_memories()["items"]]
        return llm.Fragment("\n".join([FACTS_HEADER, *lines]), f"{FRAGMENT_PREFIX}:facts")
    if kind == "recall" and query.strip():
        turns = tools.recall(query, DEFAULT_CONVERSATION)["items"]
        lines = [
            f"- [{t['created_at'][:10]}, {t['conversation']}] {t['role']}: {t['text']}"
            for t in turns
        ]
        return llm.Fragment("\n".join([RECALL_HEADER, *lines]), f"{FRAGMENT_PREFIX}:recall")
    raise ValueError("use mlxmem:facts or mlxmem:recall:QUERY")


@llm.hookimpl
def register_tools(register) -> None:
    register(Mlxmem)


@llm.hookimpl
def register_fragment_loaders(register) -> None:
    register(FRAGMENT_PREFIX, load_fragment)
