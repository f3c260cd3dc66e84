"""`mlxmem serve` end to end: the real command in its own process, real MLX on a tiny
random-weight model, the openai client, and the CLI beside it on the same data directory."""

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest
from serve_helpers import request

from mlxmem.models.tiny import make_tiny

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=3)


class Running:
    """A server process and its URL, for `serve_helpers.request`."""

    def __init__(self, proc: subprocess.Popen, url: str):
        self.proc = proc
        self.url = url


def start(model: str, timeout: float = 180.0, preexec_fn=None) -> Running:
    """Start `mlxmem serve` on a free port; its first line says where it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxmem.cli", "serve", "--model", model, "--port", "0", "-q"],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen += lines.get(timeout=1.0)
        except queue.Empty:
            continue
        found = re.search(r"http://127\.0\.0\.1:\d+", seen)
        if found:
            return Running(proc, found.group(0))
    proc.kill()
    raise AssertionError(f"the server did not start: {seen}")


def mlxmem(*args) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "mlxmem.cli", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_serve_streams_caches_and_shares_memory_with_the_cli(tiny):
    server = start(str(tiny))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0)
        first = {"role": "user", "content": "Hello, I am Ana and I live in Porto."}
        chunks = list(
            client.chat.completions.create(
                model=str(tiny),
                messages=[first],
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=8,
                temperature=0,
            )
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].usage.completion_tokens > 0
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
        second = client.chat.completions.create(
            model=str(tiny),
            messages=[{"role": "user", "content": "Where do I live?"}],
            max_tokens=8,
            temperature=0,
        )
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert 0 < cached < second.usage.prompt_tokens

        log = json.loads(mlxmem("history", "show", "--json"))
        assert [t["role"] for t in log] == ["user", "assistant"] * 2
        assert log[1]["text"] == streamed
        assert log[3]["text"] == second.choices[0].message.content

        status, fact, _ = request(server, "POST", "/v1/memory/facts", {"text": "Ana has a cat"})
        assert status == 201
        context = request(server, "GET", "/v1/memory/context")[1]
        assert context["layers"]["facts"] > 0
        listed = json.loads(mlxmem("memory", "list", "--json"))
        assert [(f["id"], f["text"], f["source"]) for f in listed] == [
            (fact["id"], "Ana has a cat", "manual")
        ]
        assert request(server, "DELETE", f"/v1/memory/facts/{fact['id']}")[0] == 200
        assert request(server, "GET", "/v1/memory/context")[1]["layers"]["facts"] == 0
        assert json.loads(mlxmem("memory", "list", "--json")) == []
        assert request(server, "GET", "/v1/memory/facts")[1]["data"] == []
    finally:
        server.proc.send_signal(signal.SIGINT)
        code = server.proc.wait(60)
    assert code == 0  # Ctrl-C stops the server cleanly


def ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `mlxmem serve &` in a script leaves it


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_serve_stops_cleanly_on_sigint_even_when_started_ignoring_it_and_on_sigterm(tiny, stop):
    server = start(str(tiny), preexec_fn=ignore_sigint)
    try:
        assert request(server, "GET", "/v1/models")[0] == 200
        server.proc.send_signal(stop)
        assert server.proc.wait(60) == 0
    finally:
        server.proc.kill()  # a server that did not stop is not left running
