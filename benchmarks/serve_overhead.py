"""What `mlxmem serve` adds to a turn: the same conversation sent through HTTP (the OpenAI
endpoint, whole and streamed) and by calling the Companion directly, on the same kind of
engine, each in its own empty data directory.

    python benchmarks/serve_overhead.py [--engine fake|tiny] [--turns 30] [--json]

On a shared machine a turn's own time varies more than the server adds, so it also measures
what the server adds directly: each request's latency less the time from its turn's start to
its reply logged, which the response reports (`added_ms`), and GET /v1/models, a round trip
with no turn in it.
`fake` is the deterministic FakeEngine (the turn is then nearly all store and HTTP work, so
the overhead shows at its largest); `tiny` is a random-weight model through real MLX. Fixed
messages, warm-up turns not counted, medians. Prints a table, or one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.serve import ServeConfig, make_server

BUDGET, RESERVE = 1024, 128


def messages(n: int) -> list[str]:
    return [
        f"Message {i}: today I walked by the river and thought about turn {i}." for i in range(n)
    ]


def engine_factory(kind: str, workdir: Path) -> Callable:
    if kind == "fake":
        from mlxmem.testing import FakeEngine

        return FakeEngine
    from mlxmem.engine import MLXEngine
    from mlxmem.models.tiny import make_tiny

    model = make_tiny(workdir / "tiny", seed=0)
    return lambda: MLXEngine(model)


def settings(max_tokens: int) -> ChatSettings:
    # Recall off, as in `mlxmem bench speed`: the recorded figures measure the window and summary.
    return ChatSettings(temp=0.0, max_tokens=max_tokens, extract_facts=False, recall=False)


class Direct:
    """Turns by calling the Companion: holding the store between turns, as the interactive
    `mlxmem chat` does, or opening it per operation, as a one-shot `chat -m` does. `first`
    keeps each turn's time to its first reply text."""

    def __init__(self, make_engine: Callable, max_tokens: int, held: bool):
        engine = make_engine()
        store = Store()
        self.companion = Companion(engine, store, "bench", BUDGET, RESERVE, settings(max_tokens))
        self._held = contextlib.ExitStack()
        if held:
            self._held.enter_context(store.holding())
        self.first: list[float] = []

    def turn(self, text: str) -> None:
        start, first = time.perf_counter(), []
        self.companion.send(text, on_text=lambda _: first or first.append(time.perf_counter()))
        self.first.append(first[0] - start)

    def close(self) -> None:
        self._held.close()


class OverHttp:
    """Turns as requests to a server on this machine, over one kept-alive connection (a
    stream ends with its connection, so a streamed turn opens a new one)."""

    def __init__(self, make_engine: Callable, max_tokens: int, stream: bool):
        config = ServeConfig("bench", BUDGET, RESERVE, settings(max_tokens))
        self.server = make_server(make_engine, config)
        self.server.start()
        # The time each turn took from its start to its reply logged, as the response reports
        # it (`mlxmem.timings`): the request's latency less this is what the server adds,
        # whatever the turn cost.
        self.inside: list[float] = []
        self.stream = stream
        self.first: list[float] = []
        self.con = http.client.HTTPConnection(*self.server.server_address[:2], timeout=300)

    def turn(self, text: str) -> None:
        body = {"model": "bench", "user": "bench", "stream": self.stream}
        body["messages"] = [{"role": "user", "content": text}]
        headers = {"Content-Type": "application/json"}
        start = time.perf_counter()
        self.con.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        response = self.con.getresponse()
        if self.stream:  # the time to the first chunk that carries reply text
            while b'"content"' not in (line := response.readline()):
                assert line, "the stream ended before any reply text"
            self.first.append(time.perf_counter() - start)
        payload = response.read()
        assert response.status == 200, payload
        if self.stream:
            self.con.close()
            # The chunk that carries mlxmem's fields, among the server-sent events.
            line = next(x for x in payload.split(b"\n") if b'"mlxmem"' in x)
            payload = line.removeprefix(b"data: ")
        timings = json.loads(payload)["mlxmem"]["timings"]
        self.inside.append(timings["reply_logged_ms"] / 1e3)

    def ping(self) -> None:
        """GET /v1/models: a round trip with no turn in it, the floor of any request."""
        self.con.request("GET", "/v1/models")
        self.con.getresponse().read()

    def close(self) -> None:
        self.con.close()
        self.server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["fake", "tiny"], default="fake")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    texts = messages(args.warmup + args.turns)
    times: dict[str, list[float]] = {"direct": [], "direct_held": [], "http": [], "http_stream": []}
    pings: list[float] = []
    with tempfile.TemporaryDirectory() as work:
        make_engine = engine_factory(args.engine, Path(work))
        runners = {}
        for name in times:  # each in its own data directory, fixed when its store is made
            os.environ["MLXMEM_HOME"] = str(Path(work) / name)
            if name.startswith("direct"):
                runners[name] = Direct(make_engine, args.max_tokens, held=name == "direct_held")
            else:
                runners[name] = OverHttp(make_engine, args.max_tokens, name == "http_stream")
        try:
            # Interleaved, turn by turn, a different one going first each time: a slow spell
            # on a shared machine hits all three, and none always runs first.
            names = list(runners)
            for i, text in enumerate(texts):
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    start = time.perf_counter()
                    runners[name].turn(text)
                    times[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                runners["http"].ping()
                pings.append(time.perf_counter() - start)
        finally:
            for runner in runners.values():
                runner.close()
    counted = {name: t[args.warmup :] for name, t in times.items()}
    added = {
        name: statistics.median(
            (total - inside) * 1000
            for total, inside in zip(
                counted[name], runners[name].inside[args.warmup :], strict=True
            )
        )
        for name in ("http", "http_stream")
    }
    medians = {name: statistics.median(t) * 1000 for name, t in counted.items()}

    def paired(name: str) -> float:
        """The median of per-turn differences from the direct call, in ms."""
        pairs = zip(counted[name], counted["direct"], strict=True)
        return statistics.median(a - b for a, b in pairs) * 1000

    # Before the first token: a streamed request's time to its first reply text, against the
    # held chat's (the server holds its store too).
    first = {
        name: statistics.median(runners[name].first[args.warmup :]) * 1000
        for name in ("direct_held", "direct", "http_stream")
    }
    result = {
        "engine": args.engine,
        "first_text_ms": {k: round(v, 2) for k, v in first.items()},
        "serve_vs_held_ratio": round(first["http_stream"] / first["direct_held"], 3),
        "turns": args.turns,
        "median_ms": {k: round(v, 2) for k, v in medians.items()},
        "overhead_ms": {k: round(paired(k), 2) for k in ("http", "http_stream")},
        "added_ms": {k: round(v, 2) for k, v in added.items()},
        "round_trip_ms": round(statistics.median(pings[args.warmup :]) * 1000, 3),
        "ratio": {k: round(medians[k] / medians["direct"], 3) for k in ("http", "http_stream")},
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"engine {args.engine}, {args.turns} turns (median per turn)")
    for name, ms in medians.items():
        extra = ""
        if name.startswith("http"):
            extra = f"  vs direct {paired(name):+.2f} ms (paired), added {added[name]:.2f} ms"
        print(f"  {name:12} {ms:8.2f} ms{extra}")
    print(f"  a request with no turn (GET /v1/models): {result['round_trip_ms']:.3f} ms")
    print(
        f"  to the first reply text: served (streamed) {first['http_stream']:.2f} ms, held chat"
        f" {first['direct_held']:.2f} ms, unheld {first['direct']:.2f} ms:"
        f" serve_vs_held_ratio {result['serve_vs_held_ratio']:.2f}"
    )


if __name__ == "__main__":
    main()
