"""An in-process `mlxmem serve` on the deterministic FakeEngine, and raw HTTP for what the
openai client cannot send."""

from __future__ import annotations

import http.client
import json
from contextlib import contextmanager
from urllib.parse import urlsplit

from mlxmem.memory.companion import ChatSettings
from mlxmem.serve import ServeConfig, make_server
from mlxmem.testing import FakeEngine

MODEL = "fake"


@contextmanager
def fake_server(
    engine: FakeEngine | None = None,
    token: str | None = None,
    default_conversation: str = "default",
    **settings,
):
    """A server on a free loopback port over `engine` (a FakeEngine), with a 1,024-token
    budget and fact extraction off unless `settings` say otherwise."""
    engine = engine or FakeEngine()
    chat = ChatSettings(**{"extract_facts": False, "temp": 0.0, **settings})
    config = ServeConfig(MODEL, 1024, 128, chat)
    server = make_server(
        lambda: engine, config, token=token, default_conversation=default_conversation
    )
    server.start()
    try:
        yield server
    finally:
        server.close()


def request(server, method: str, path: str, body=None, headers: dict | None = None):
    """(status, JSON body, headers) of one request; `body` a dict (sent as JSON) or bytes."""
    url = urlsplit(server.url)
    con = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body
    headers = {"Content-Type": "application/json", **(headers or {})} if data else headers
    try:
        con.request(method, path, body=data, headers=headers or {})
        response = con.getresponse()
        payload = response.read()
        kind = response.getheader("Content-Type", "")
        parsed = json.loads(payload) if kind.startswith("application/json") else payload
        return response.status, parsed, dict(response.getheaders())
    finally:
        con.close()


def assert_error(result, status: int, code: str | None = None) -> dict:
    """An OpenAI-shaped error with `status` (and `code`); returns the error object."""
    got, body, _ = result
    assert got == status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error
