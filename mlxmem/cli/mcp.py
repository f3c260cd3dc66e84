"""`mlxmem mcp`: the memory as an MCP server, for Claude Desktop, Cursor and other clients."""

from __future__ import annotations

import errno

import typer

from mlxmem.errors import InputError

from .common import err
from .serve import ALLOW_REMOTE, DEFAULT_HOST, token_option

DEFAULT_MCP_PORT = 8765


def mcp(
    http: bool = typer.Option(
        False, "--http", help="Serve streamable HTTP at /mcp instead of stdio."
    ),
    host: str = typer.Option(DEFAULT_HOST, help="With --http: address (loopback by default)."),
    port: int = typer.Option(
        DEFAULT_MCP_PORT, min=0, max=65535, help="With --http: port (0: any free one)."
    ),
    allow_remote: bool = ALLOW_REMOTE,
    token: str = token_option(
        "MLXMEM_MCP_TOKEN",
        "With --http: require `Authorization: Bearer TOKEN` (env MLXMEM_MCP_TOKEN).",
    ),
) -> None:
    """Serve the memory over the Model Context Protocol: tools to list, search, add, edit and
    delete the facts, search, list and delete the chat log, and recall; the facts and each
    conversation as resources.

    Over stdio by default (what a desktop client starts: see docs/mcp.md for the JSON to
    paste into its settings); --http serves on loopback with `mlxmem serve`'s rules. A delete
    is the same erase as `mlxmem memory rm` / `history rm`. It runs beside `mlxmem chat` and
    `mlxmem serve` on the same data directory.
    """
    from mlxmem.serve.http import check_binding
    from mlxmem.surfaces import mcp_server

    if not http:
        if (host, port, allow_remote) != (DEFAULT_HOST, DEFAULT_MCP_PORT, False):
            raise InputError("--host, --port and --allow-remote go with --http")
        mcp_server.run_stdio()
        return
    check_binding(host, allow_remote, token)
    try:
        sock = mcp_server.bind(host, port)
    except OSError as exc:
        hint = "; choose another --port, or --port 0" if exc.errno == errno.EADDRINUSE else ""
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    # One plain line: scripts read the address from it with --port 0.
    typer.echo(f"mlxmem mcp on {mcp_server.url_of(sock)} (Ctrl-C stops)", err=True)
    try:
        mcp_server.run_http(sock, token, allow_remote)
    except KeyboardInterrupt:
        err.print("stopping")
