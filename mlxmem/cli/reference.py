"""docs/cli.md: every command's `--help`, written from the Typer app itself.

    python -m mlxmem.cli.reference docs/cli.md

rewrites the page; tests/test_docs.py fails when the page differs from what this writes now.
The help comes from click's own `Command.get_help` on a context of fixed width with colours
off, so the page is the same on every machine and terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import typer.main

from mlxmem.cli.main import app

WIDTH = 80  # the width `--help` wraps to in the tests' runner, and in this page
REGENERATE = "python -m mlxmem.cli.reference docs/cli.md"

HEADER = f"""# Command reference

Every `mlxmem` command's `--help`, as the command prints it at {WIDTH} columns.
Regenerate it with `{REGENERATE}`;
a test fails when this page and the commands differ.
What the commands are for, with examples: [README](../README.md#use).
"""


def command_help() -> Iterator[tuple[list[str], str]]:
    """(the words naming a command, its help text) for `mlxmem` and every command below it,
    in the order `mlxmem --help` lists them."""
    # Typer (0.29) has its own copy of click: its commands make their own contexts.
    command = typer.main.get_command(app)
    ctx = command.make_context("mlxmem", [], resilient_parsing=True)
    ctx.terminal_width = ctx.max_content_width = WIDTH
    ctx.color = False
    yield from _walk(command, ctx, [])


def _walk(command, ctx, path: list[str]) -> Iterator[tuple[list[str], str]]:
    yield path, command.get_help(ctx)
    if not hasattr(command, "list_commands"):  # a leaf
        return
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        sub_ctx = sub.make_context(name, [], parent=ctx, resilient_parsing=True)
        yield from _walk(sub, sub_ctx, path + [name])


def render() -> str:
    """The whole page."""
    parts = [HEADER]
    helps = list(command_help())
    parts.append("\n".join(f"- [{_title(p)}](#{_anchor(p)})" for p, _ in helps) + "\n")
    for path, text in helps:
        parts.append(f"## {_title(path)}\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(parts)


def _title(path: list[str]) -> str:
    return " ".join(["mlxmem", *path])


def _anchor(path: list[str]) -> str:
    """GitHub's anchor for a heading of plain words: lower case, spaces to hyphens."""
    return "-".join(["mlxmem", *path]).lower()


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit(f"usage: {REGENERATE}")
    Path(argv[0]).write_text(render(), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
