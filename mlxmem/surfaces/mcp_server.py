"""`mlxmem mcp`: the memory as a Model Context Protocol server, on the official `mcp` SDK.

Tools: every public method of MemoryTools (facts, the chat log, recall), under its own name.
Resources: `mlxmem://facts` (the current facts) and `mlxmem://conversations/{name}` (a
conversation's turns). Over stdio (what a desktop client starts) or streamable HTTP on
loopback, where every request passes `mlxmem serve`'s own Host, Origin and token checks.

The server holds the store for its life, as `mlxmem chat` and `mlxmem serve` do
(Store.holding): a call reuses one open connection, and another process that asks for the
store gets it within milliseconds between calls; the next call here opens the file again
and so reads what the other process wrote or deleted.
"""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from starlette.types import ASGIApp, Receive, Scope, Send

from mlxmem import __version__
from mlxmem.errors import MlxmemError
from mlxmem.memory.store import Store
from mlxmem.serve.app import check_auth, check_origin
from mlxmem.serve.schema import ApiError

from .memory import MemoryTools

MCP_PATH = "/mcp"
FACTS_URI = "mlxmem://facts"
CONVERSATION_URI = "mlxmem://conversations/{name}"
INSTRUCTIONS = (
    "mlxmem is the person's long-term memory: facts about them (search_memory, add_memories, "
    "...) and the log of their chats (search_turns, list_turns, recall). Deletions are for "
    "good: the text is erased from disk."
)
READ, WRITE, ERASE = (
    ToolAnnotations(read_only_hint=True),
    ToolAnnotations(read_only_hint=False, destructive_hint=False),
    ToolAnnotations(read_only_hint=False, destructive_hint=True),
)


def tool_names() -> list[str]:
    """MemoryTools' public methods, in the order they are defined: the tools."""
    return [name for name in vars(MemoryTools) if not name.startswith("_")]


def build_server(tools: MemoryTools) -> MCPServer:
    """An MCP server whose tools and resources call `tools`."""
    server: MCPServer = MCPServer(
        "mlxmem", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING"
    )
    for name in tool_names():
        kind = ERASE if name.startswith("delete") else WRITE if _writes(name) else READ
        server.add_tool(_tool(getattr(tools, name)), annotations=kind)

    @server.resource(FACTS_URI, name="facts", mime_type="application/json")
    def facts() -> str:
        """The current facts about the person, as mlxmem's model sees them."""
        return _resource(tools.list_memories)

    @server.resource(CONVERSATION_URI, name="conversation", mime_type="application/json")
    def conversation(name: str) -> str:
        """A conversation's turns, oldest first (the newest 1,000)."""
        return _resource(lambda: tools.list_turns(name, last=1000))

    return server


def _writes(name: str) -> bool:
    return name.startswith(("add_", "edit_", "restore_", "keep_"))


def _tool(method: Callable[..., dict]) -> Callable[..., dict]:
    """`method` as a tool: an expected failure (a bad id, a missing conversation) is one
    line for the client, not a traceback in the server's log."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> dict:
        with _errors(ToolError):
            return method(*args, **kwargs)

    return call


def _resource(read: Callable[[], dict]) -> str:
    with _errors(ResourceError):
        return json.dumps(read(), ensure_ascii=False, indent=1)


@contextmanager
def _errors(kind: type[Exception]) -> Iterator[None]:
    try:
        yield
    except MlxmemError as exc:
        raise kind(str(exc)) from None


@contextmanager
def held_server(store: Store | None = None) -> Iterator[MCPServer]:
    """The server over `store` (default: the data directory's), held while the block runs."""
    store = store or Store()
    with store.holding():
        yield build_server(MemoryTools(store))


def run_stdio() -> None:
    with held_server() as server:
        server.run("stdio")


class Guard:
    """ASGI middleware: `mlxmem serve`'s checks on every HTTP request (the Host names
    loopback unless `allow_remote`, a browser's Origin is this server's, the token when set);
    a request that fails one is answered with serve's JSON error and goes no further."""

    def __init__(self, app: ASGIApp, token: str | None, allow_remote: bool):
        self.app, self.token, self.allow_remote = app, token, allow_remote

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]
            }
            try:
                check_origin(headers.get("host"), headers.get("origin"), self.allow_remote)
                check_auth(headers.get("authorization"), self.token)
            except ApiError as exc:
                await _refuse(send, exc)
                return
        await self.app(scope, receive, send)


async def _refuse(send: Send, exc: ApiError) -> None:
    body = json.dumps(exc.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if exc.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def http_app(server: MCPServer, token: str | None, allow_remote: bool) -> ASGIApp:
    """The streamable HTTP app at MCP_PATH behind Guard. The SDK's own Host and Origin check
    is off: Guard makes serve's, the one rule for both servers."""
    app = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return Guard(app, token, allow_remote)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free one), so that a taken port fails before serving
    and the address can be printed before the first request."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)  # a client may connect at once: it waits for the server to accept
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}{MCP_PATH}" if ":" in host else f"http://{host}:{port}{MCP_PATH}"


def run_http(sock: socket.socket, token: str | None, allow_remote: bool) -> None:
    """Serve streamable HTTP on `sock` until interrupted."""
    import uvicorn  # the mcp SDK's own HTTP server

    with held_server() as server:
        app = http_app(server, token, allow_remote)
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        uvicorn.Server(config).run(sockets=[sock])
