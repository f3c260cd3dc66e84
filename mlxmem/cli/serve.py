"""`mlxmem serve`: the OpenAI-compatible HTTP API, the memory API and the page."""

from __future__ import annotations

import errno
import os
import signal
import sys
from typing import Any

import typer

from mlxmem import paths
from mlxmem.defaults import DEFAULT_CONVERSATION, SummaryKind
from mlxmem.engine import engine_loader
from mlxmem.errors import InputError
from mlxmem.memory.companion import ChatSettings
from mlxmem.memory.context.budget import context_budget
from mlxmem.memory.store import Store
from mlxmem.models import resolve

from .common import (
    CONTEXT_TOKENS,
    ENGINE,
    FACTS,
    MAX_MESSAGE_CHARS,
    MODEL,
    RECALL,
    REPLACE_FACTS,
    SUMMARY,
    THREADS,
    err,
    model_or_default,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080

# The binding options of every server (serve, mcp --http), checked alike by check_binding.
ALLOW_REMOTE = typer.Option(
    False, "--allow-remote", help="Allow a --host other than loopback (needs a token)."
)


def token_option(envvar: str, help: str) -> Any:
    """A server's --token: the bearer token each request must carry, else from `envvar`."""
    return typer.Option(None, "--token", envvar=envvar, help=help)


def serve(
    host: str = typer.Option(DEFAULT_HOST, help="Address to listen on (loopback by default)."),
    port: int = typer.Option(DEFAULT_PORT, min=0, max=65535, help="Port (0: any free one)."),
    model: str = MODEL,
    allow_remote: bool = ALLOW_REMOTE,
    token: str = token_option(
        "MLXMEM_SERVE_TOKEN",
        "Require `Authorization: Bearer TOKEN` on every request (env MLXMEM_SERVE_TOKEN).",
    ),
    conversation: str = typer.Option(
        DEFAULT_CONVERSATION,
        "--conversation",
        "-c",
        help="The conversation of a request that names none.",
    ),
    context_tokens: int = CONTEXT_TOKENS,
    engine_name: str | None = ENGINE,
    threads: int | None = THREADS,
    facts: bool = FACTS,
    replace_facts: bool = REPLACE_FACTS,
    summary: SummaryKind = SUMMARY,
    recall: bool = RECALL,
    max_message_chars: int = MAX_MESSAGE_CHARS,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not log each request."),
) -> None:
    """Serve the model over HTTP: OpenAI's /v1/chat/completions, a memory API under
    /v1/memory, and a page at /.

    Each request is one turn of one conversation (the X-Mlxmem-Conversation header or the
    request's `user` field; default: the chat's default conversation). mlxmem keeps the
    history: only the last user message is new; earlier messages must match the log.
    """
    from mlxmem.serve import ServeConfig, check_binding, make_server

    check_binding(host, allow_remote, token)
    Store().check_name(conversation)  # before the model loads: a bad name fails at once
    model = model_or_default(model, engine_name, fetch=True)
    spec = resolve(model)
    settings = ChatSettings(
        extract_facts=facts,
        replace_facts=replace_facts,
        summary=summary.value,
        recall=recall,
        max_message_chars=max_message_chars,
        context_tokens=context_tokens,
    )
    budget = context_budget(settings.context_tokens, spec.context_tokens)
    config = ServeConfig(model, budget, spec.response_reserve, settings)
    load = engine_loader(spec, paths.cache_dir(), engine_name, settings.context_tokens)
    try:
        server = make_server(
            # On the model's own thread.
            load,
            config,
            host=host,
            port=port,
            token=token,
            default_conversation=conversation,
            log_requests=not quiet,
            allow_remote=allow_remote,
        )
    except OSError as exc:  # the port is taken, or the address is not this machine's
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            hint = "; choose another --port, or --port 0 for any free one (the address is printed)"
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    _stop_on_signals()  # before the address is printed: a script may signal as soon as it reads it
    try:
        # One plain line (no rich wrapping): scripts read the address from it with --port 0.
        typer.echo(f"mlxmem serving {model} on {server.url} (Ctrl-C stops)", err=True)
        server.serve_forever()
    except KeyboardInterrupt:
        err.print("stopping")
    finally:
        server.close()
    # MLX (0.32), once used from a thread other than the main one, sometimes aborts the
    # process in its exit-time destructors ("terminate called without an active exception").
    # Everything is on disk by now (the log and the caches are written every turn): leave
    # without running them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _stop_on_signals() -> None:
    """Ctrl-C and a service manager's SIGTERM both stop the server the same clean way. Set
    here, not inherited: a shell starting a job in the background (`mlxmem serve &` in a
    script) leaves SIGINT ignored, and Python then never turns it into KeyboardInterrupt."""

    def stop(signum, frame):
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second one must not cut the close short
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
