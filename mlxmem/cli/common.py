"""What every command shares: `--json`, printing JSON records, the stderr console, and turning
library errors into `Error: ...` once, for the whole app."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.segment import Segment
from rich.text import Text
from typer.core import TyperGroup

from mlxmem.defaults import (
    DEFAULT_MAX_MESSAGE_CHARS,
    DEFAULT_MODEL,
    DEFAULT_RECALL,
    DEFAULT_REPLACE_FACTS,
    DEFAULT_SUMMARY,
    OFFLINE_MODEL,
    SummaryKind,
)
from mlxmem.defaults import MAX_MESSAGE_CHARS as MESSAGE_CHARS_CEILING
from mlxmem.engine.threads import THREADS_ENV
from mlxmem.errors import InputError, MlxmemError
from mlxmem.text import json_ready, plural, visible_controls  # noqa: F401 - the commands import them from here

if TYPE_CHECKING:
    from typer._click import Context  # Typer's own copy of click, which its groups take


class TerminalConsole(Console):
    """A rich Console that shows control characters in the text it prints as `\\x1b` and the
    like: everything it prints that came from the log, the facts or a model (an import, a
    synced file, a reply) reaches the terminal as text, never as an escape sequence. rich
    strips BEL and a few others, not ESC. rich's own styling is added after, and stays.

    Strings are made visible before layout (so columns fit); `render` does the same to every
    segment of text as a net for a Text built elsewhere (build them with `shown`)."""

    def render_str(self, text: str, **kwargs: Any) -> Any:
        return super().render_str(visible_controls(text), **kwargs)

    def render(self, renderable: Any, options: Any = None) -> Iterator[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or segment.text.isprintable():
                yield segment
            else:
                yield Segment(visible_controls(segment.text), segment.style)


def shown(text: str, **kwargs: Any) -> Text:
    """Stored text as a rich Text cell: no markup read in it, its control characters visible."""
    return Text(visible_controls(text), **kwargs)


# Status, warnings and errors go to stderr, so that stdout carries only the reply or the JSON.
err = TerminalConsole(stderr=True, highlight=False)


def one_line_warnings() -> None:
    """Print each warning as one `Warning: ...` line, without Python's file, line and source
    line (a warning is a message for the person, as an error is)."""

    def show(message, category, filename, lineno, file=None, line=None):
        err.print(f"Warning: {message}", markup=False)

    warnings.showwarning = show


def say(text: str, err: bool = False) -> None:
    """typer.echo for lines that may hold stored text: its control characters made visible."""
    typer.echo(visible_controls(text), err=err)


def out() -> TerminalConsole:
    """The console for tables on stdout (made per command: tests swap sys.stdout)."""
    return TerminalConsole()


JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")
MODEL = typer.Option(
    None,
    "--model",
    "-M",
    show_default=False,
    help="A registry alias (see `mlxmem models list`) or a path. Default: $MLXMEM_MODEL, else "
    "the one set with `mlxmem models default`, else the best this machine runs and can fetch: "
    f"{DEFAULT_MODEL} (MLX on Apple silicon, its GGUF on llama.cpp elsewhere), or "
    f"{OFFLINE_MODEL} from the package index where the hub is off (HF_HUB_OFFLINE) or "
    "unreachable.",
)


# The memory options every command that runs a turn takes (chat, serve): one declaration each.
CONTEXT_TOKENS = typer.Option(
    None, help="Context budget in tokens, overriding the model's (try a small window)."
)
FACTS = typer.Option(True, "--facts/--no-facts", help="Let the model note durable facts about you.")
REPLACE_FACTS = typer.Option(
    DEFAULT_REPLACE_FACTS,
    "--replace-facts/--no-replace-facts",
    help="Let a newly noted fact replace an older one it makes out of date (one short model "
    "call per likely candidate). Off by default: Qwen2.5-Coder-1.5B hides true facts far more "
    "often than out-of-date ones (`mlxmem eval facts --updates` measures a model). Replaced "
    "facts stay listed by `mlxmem memory list --all`.",
)
SUMMARY = typer.Option(
    SummaryKind(DEFAULT_SUMMARY),
    "--summary",
    help="How a fold writes the rolling summary: extractive (the folded sentences that carry "
    "the most names, numbers and dates, under their speaker and day; no model call) or model "
    "(the model writes it, checked; the extractive one where the check fails). Extractive by "
    "default: on Qwen2.5-Coder-1.5B, `mlxmem eval locomo` found the model's summary adding "
    "nothing to the answers.",
)
RECALL = typer.Option(
    DEFAULT_RECALL,
    "--recall/--no-recall",
    help="When a message may refer to the past, recall a few old turns from the log into it "
    "(BM25 over the turns that left the window; on by default, as measured by `mlxmem eval "
    "locomo`: --no-recall leaves the prompt to the window, summary and facts).",
)
MAX_MESSAGE_CHARS = typer.Option(
    DEFAULT_MAX_MESSAGE_CHARS,
    "--max-message-chars",
    min=1,
    max=MESSAGE_CHARS_CEILING,
    help="Refuse longer messages (the log keeps a message whole; the prompt, its head and tail;"
    f" at most {MESSAGE_CHARS_CEILING:,}, the most an import or a sync takes).",
)


ENGINE = typer.Option(
    None,
    "--engine",
    help="mlx or llamacpp (default: the model's engine in models.toml, else $MLXMEM_ENGINE or "
    "`engine` in config.toml where the model runs on it, else MLX on Apple silicon and "
    "llama.cpp where it is installed and the model has a GGUF file).",
)


def _use_threads(threads: int | None) -> int | None:
    # The engine reads $MLXMEM_THREADS when it is made (mlxmem.engine.threads): the option
    # reaches every engine the command makes, a server's and an eval's workers included.
    if threads is not None:
        os.environ[THREADS_ENV] = str(threads)
    return threads


THREADS = typer.Option(
    None,
    "--threads",
    min=1,
    callback=_use_threads,
    help=f"CPU threads the engine computes with (default: ${THREADS_ENV}, else every core"
    " this process may use).",
)


def model_or_default(model: str | None, engine: str | None = None, fetch: bool = False) -> str:
    """The model a command was given, else the person's default for `engine` (with `fetch`,
    downloaded now: a built-in default that cannot be downloaded falls back to one that can,
    and says so). A model that would be slow here, or cannot run, is named on stderr with what
    it costs (mlxmem.models.fit)."""
    from mlxmem.models.choice import default_model, fetch_default

    if model is None:
        chosen = fetch_default(engine) if fetch else default_model(engine)
        if chosen.notice:
            say(f"Note: {chosen.notice}", err=True)
        model = chosen.name
    say_cost(model, engine)
    return model


def say_cost(model: str, engine: str | None = None) -> None:
    """Name on stderr what `model` costs here, when it would be slow or cannot run."""
    from mlxmem.models import resolve
    from mlxmem.models.fit import cost_here

    cost = cost_here(resolve(model), engine)
    if cost:
        say(f"Note: {model}: {cost}", err=True)


def plain_typer(**kwargs: Any) -> typer.Typer:
    """A Typer app whose help is click's plain text: wrapped to the terminal (80 columns at
    most), every option name whole, and no `<bool>` type column as Typer's rich panels show."""
    return typer.Typer(rich_markup_mode=None, **kwargs)


class ErrorsAsMessages(TyperGroup):
    """The root group: an expected failure anywhere below it becomes `Error: ...` on stderr and
    exit code 1, with no traceback; Ctrl-C exits 130."""

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except MlxmemError as exc:
            say(f"Error: {exc}", err=True)
            raise typer.Exit(code=1) from None
        except KeyboardInterrupt:
            typer.echo("", err=True)
            raise typer.Exit(code=130) from None


def confirm(question: str, yes: bool) -> None:
    """The one rule for every bulk deletion: ask on a terminal; elsewhere (a script, a pipe)
    require --yes. A no, or no --yes, deletes nothing and exits 1."""
    if yes:
        return
    if not on_terminal():
        raise InputError(f"{question} Not on a terminal: run it again with --yes to confirm.")
    if not typer.confirm(question, default=False, err=True):
        typer.echo("Nothing deleted.", err=True)
        raise typer.Exit(code=1)


def on_terminal() -> bool:
    """Whether a person can answer a question: stdin is a terminal."""
    return sys.stdin.isatty()


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, ensure_ascii=False, indent=2, default=str)
    sys.stdout.write("\n")


def listed_plainly(items: Sequence[Any], as_json: bool, empty: str) -> bool:
    """What every listing command prints before its table: `items` as JSON with --json, or the
    line `empty` when there are none. True when that said it all (no table to print)."""
    if as_json:
        print_json([json_ready(item) for item in items])
        return True
    if not items:
        say(empty)
        return True
    return False


def nonempty_path(value: str) -> Path:
    """A path argument's parser: an empty one (an unset "$DIR") would otherwise be taken for
    the current directory."""
    if not value.strip():
        raise typer.BadParameter("the path is empty (an unset variable?)")
    return Path(value)
