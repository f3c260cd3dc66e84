"""What every command shares: `--json`, printing JSON records, the stderr console, and turning
library errors into `Error: ...` once, for the whole app."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import datetime
from typing import Any

import click
import typer
from rich.console import Console
from typer.core import TyperGroup

from mlxmem.errors import MlxmemError
from mlxmem.memory.store import Deletion

# Status, warnings and errors go to stderr, so that stdout carries only the reply or the JSON.
err = Console(stderr=True, highlight=False)

JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")

# Token ids kept for the model's KV cache: not for people or scripts reading the log.
INTERNAL_FIELDS = {"sampled_ids", "sampled_by"}


class ErrorsAsMessages(TyperGroup):
    """The root group: an expected failure anywhere below it becomes `Error: ...` on stderr and
    exit code 1, with no traceback; Ctrl-C exits 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MlxmemError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(code=1) from None
        except KeyboardInterrupt:
            typer.echo("", err=True)
            raise typer.Exit(code=130) from None


def as_record(value: Any) -> dict[str, Any]:
    """A dataclass as a JSON-ready dict, with ISO 8601 timestamps and no internal fields."""
    return {
        key: item.isoformat() if isinstance(item, datetime) else item
        for key, item in asdict(value).items()
        if key not in INTERNAL_FIELDS
    }


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, ensure_ascii=False, indent=2, default=str)
    sys.stdout.write("\n")


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def describe(deletion: Deletion) -> str:
    """What a deletion removed, in a sentence the person can check."""
    parts = []
    if deletion.turns:
        parts.append(plural(len(deletion.turns), "turn"))
    if deletion.facts:
        auto = [f for f in deletion.facts if deletion.turns and f.source == "automatic"]
        asked = len(deletion.facts) - len(auto)
        if asked:
            parts.append(plural(asked, "fact"))
        if auto:
            quoted = "; ".join(f"[{f.id}] {f.text}" for f in auto)
            parts.append(f"{plural(len(auto), 'automatic fact')} taken from them ({quoted})")
    if deletion.summaries:
        parts.append(plural(len(deletion.summaries), "summary", "summaries") + " that saw them")
    if not parts:
        return "Nothing to delete."
    text = "Deleted " + (", ".join(parts[:-1]) + " and " if len(parts) > 1 else "") + parts[-1]
    if deletion.summaries:
        text += "; the older turns are summarized again, without it, before the next reply"
    return text + "."
