"""What an MCP tool call of `mlxmem mcp` costs on a long-lived log: a data directory of
`--turns` turns (100,000 by default) in 1,000 conversations and 300 facts, built as `mlxmem
bench scale` builds it, then each tool called through the `mcp` SDK's own client, round trip
included, over stdio (the server a subprocess, as a desktop client runs it) and in process
(the SDK's in-memory transport: the server's own share).

    python benchmarks/mcp_calls.py [--turns 100000] [--trials 20] [--json]

Calls: list_memories, search_memory (facts), search_turns for a word of one old turn (the
whole log scanned) and for a common one (newest first, stops early), list_turns (the newest
20 of the conversation chatted in), list_conversations, recall (mlxmem's own recall for a
question about the past). One warm-up of each, then `--trials` rounds, the calls interleaved
within a round; medians with their range, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

from mlxmem.bench.scale import NEEDLE, RECALL_QUESTION, SCALE_CONVERSATION, build_log
from mlxmem.memory.store import Store
from mlxmem.surfaces.mcp_server import build_server
from mlxmem.surfaces.memory import MemoryTools

GOAL_MS = 50.0  # for a search or a list (recall runs mlxmem's whole ranking, as a turn does)
CALLS: dict[str, dict[str, Any]] = {
    "list_memories": {},
    "search_memory": {"query": "Anna matters"},
    "search_turns (rare word)": {"query": NEEDLE},
    "search_turns (common word)": {"query": "Anna"},
    "list_turns": {"conversation": SCALE_CONVERSATION, "last": 20},
    "list_conversations": {},
    "recall": {"query": RECALL_QUESTION},
}


async def measure(client: Client, trials: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in CALLS}
    for round_ in range(trials + 1):  # round 0 warms up
        for name, arguments in CALLS.items():
            start = time.perf_counter()
            result = await client.call_tool(name.split()[0], arguments)
            elapsed = (time.perf_counter() - start) * 1e3
            assert not result.is_error, result.content
            if round_:
                times[name].append(elapsed)
    return times


async def over_stdio(home: Path, trials: int) -> dict[str, list[float]]:
    env = {**os.environ, "MLXMEM_HOME": str(home)}
    args = ["-c", "from mlxmem.cli.main import run; run()", "mcp"]
    params = StdioServerParameters(command=sys.executable, args=args, env=env)
    async with Client(params, read_timeout_seconds=120) as client:
        return await measure(client, trials)


async def in_process(store: Store, trials: int) -> dict[str, list[float]]:
    with store.holding():
        async with Client(build_server(MemoryTools(store))) as client:
            return await measure(client, trials)


def summary(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
        for name, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlxmem-bench-mcp-") as tmp:
        home = Path(tmp)
        start = time.perf_counter()
        store = build_log(home / "mlxmem.duckdb", args.turns, conversations=args.conversations)
        build_s = time.perf_counter() - start
        results = {
            "stdio": summary(asyncio.run(over_stdio(home, args.trials))),
            "in_process": summary(asyncio.run(in_process(store, args.trials))),
        }
    report = {
        "kind": "mcp_calls",
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "build_s": round(build_s, 1),
        "goal_ms": GOAL_MS,
        "results": results,
        "met": all(
            r["median_ms"] <= GOAL_MS
            for name, r in results["stdio"].items()
            if name.startswith(("search", "list"))
        ),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.turns:,} turns, {args.conversations:,} conversations (built in {build_s:.0f} s)")
    print(f"{'call':28} {'stdio ms (range)':>24} {'in process ms (range)':>24}")
    for name in CALLS:
        cells = [results[t][name] for t in ("stdio", "in_process")]
        shown = [f"{c['median_ms']:.1f} ({c['min_ms']:.1f}-{c['max_ms']:.1f})" for c in cells]
        print(f"{name:28} {shown[0]:>24} {shown[1]:>24}")
    print(f"goal: each search and list median <= {GOAL_MS:.0f} ms over stdio: {report['met']}")


if __name__ == "__main__":
    main()
