"""`mlxmem chat`: interactive, streaming, or one-shot with a PROMPT, `-m` or stdin."""

from __future__ import annotations

import os
import sys
import warnings
from typing import TextIO

import typer
from rich.table import Table

from mlxmem import paths
from mlxmem.defaults import (
    DEFAULT_CONVERSATION,
    DEFAULT_MAX_MESSAGE_CHARS,
    DEFAULT_RECALL,
    DEFAULT_SEED,
    DEFAULT_TEMP,
    DEFAULT_TOP_P,
)
from mlxmem.engine import load_engine
from mlxmem.errors import InputError, MlxmemError
from mlxmem.memory.companion import ChatSettings, Companion, TurnResult
from mlxmem.memory.store import Store

from .common import MODEL, err, model_or_default, print_json

HELP = """\
Commands:
  /memory          what mlxmem remembers about you (id, source, text)
  /remember TEXT   add a fact yourself
  /forget ID...    delete facts for good
  /context [TEXT]  how the context budget is spent right now (for TEXT, with what recall adds)
  /help            this list
  /quit            leave (Ctrl-D works too; Ctrl-C stops a reply)"""


def register(app: typer.Typer) -> None:
    app.command("chat")(chat)


PROMPT = typer.Argument(
    None,
    metavar="[PROMPT]",
    show_default=False,
    help="Send one message, print the reply and exit.",
)


def chat(
    prompt: str = PROMPT,
    message: str = typer.Option(
        None,
        "--message",
        "-m",
        help="The message, as an option (the same as PROMPT; kept for scripts).",
    ),
    model: str = MODEL,
    conversation: str = typer.Option(
        DEFAULT_CONVERSATION, "--conversation", "-c", help="Which conversation to continue."
    ),
    temp: float = typer.Option(DEFAULT_TEMP, help="Sampling temperature (0: greedy)."),
    top_p: float = typer.Option(DEFAULT_TOP_P, help="Nucleus sampling threshold."),
    max_tokens: int = typer.Option(
        None,
        min=1,
        help="Longest reply in tokens (default and limit: the model's response reserve).",
    ),
    seed: int = typer.Option(DEFAULT_SEED, help="Random seed for sampling."),
    context_tokens: int = typer.Option(
        None, help="Context budget in tokens, overriding the model's (try a small window)."
    ),
    facts: bool = typer.Option(
        True, "--facts/--no-facts", help="Let the model note durable facts about you."
    ),
    recall: bool = typer.Option(
        DEFAULT_RECALL,
        "--recall/--no-recall",
        help="When a message may refer to the past, recall a few old turns from the log into "
        "it (BM25 over the turns that left the window).",
    ),
    max_message_chars: int = typer.Option(
        DEFAULT_MAX_MESSAGE_CHARS,
        "--max-message-chars",
        min=1,
        help="Refuse longer messages (the log keeps a message whole; the prompt, its head and "
        "tail).",
    ),
    json_output: bool = typer.Option(
        False, "--json", help="With -m or stdin: print one JSON object with the reply and stats."
    ),
    interactive: bool = typer.Option(
        False, "--interactive", "-i", help="Read lines and /commands from stdin even if piped."
    ),
) -> None:
    """Chat with a model that remembers.

    Every turn is saved to the chat log first; the model sees a rolling summary of older turns,
    the newest turns verbatim and the facts listed by `mlxmem memory list`.

    One message: `mlxmem chat "hello"`. Text piped in is sent too: `cat notes.txt | mlxmem
    chat "summarize"` sends the prompt, a blank line, then the text. Without a prompt and with
    nothing piped in, starts an interactive session (type /help there).

    -m is the message, not the model as in `llm`: the model is -M/--model. `-m NAME` where NAME
    is a model's alias is refused as a likely mix-up; send that word as PROMPT instead.
    """
    _one_line_warnings()
    if prompt is not None and message is not None:
        raise InputError("give the message once: as PROMPT or with -m, not both")
    if message is not None and message in _aliases():
        raise InputError(
            f"-m sends a message, and {message!r} is the name of a model: for the model, use "
            f"-M {message} (or --model {message}); to send the word, give it as PROMPT: "
            f"mlxmem chat {message!r}"
        )
    message = prompt if message is None else message
    if not interactive:
        message = _with_piped_text(message)
    if message is not None and not message.strip():
        raise InputError("empty message")
    model = model_or_default(model)
    engine, spec = load_engine(model, cache_dir=paths.cache_dir())
    companion = Companion(
        engine,
        Store(),
        conversation,
        context_tokens or spec.context_tokens,
        spec.response_reserve,
        ChatSettings(
            temp=temp,
            top_p=top_p,
            max_tokens=max_tokens,
            seed=seed,
            extract_facts=facts,
            recall=recall,
            max_message_chars=max_message_chars,
        ),
    )
    if message is not None:
        _one_shot(companion, message, json_output, model, Terminal())
    else:
        _interactive(companion, Terminal())


def _one_shot(
    companion: Companion, message: str, json_output: bool, model: str, term: Terminal
) -> None:
    if json_output:
        result = companion.send(message)
        print_json({"conversation": companion.conversation, "model": model, **result.to_dict()})
        return
    result = companion.send(message, on_text=term.write)
    term.end_line()
    _report_after(result)


def _interactive(companion: Companion, term: Terminal) -> None:
    err.print(f"[dim]conversation {companion.conversation!r} - /help for commands[/dim]")
    while True:
        try:
            line = input(">>> ")
        except (EOFError, KeyboardInterrupt):
            term.write("\n")
            return
        if not line.strip():
            continue
        if line.startswith("/"):
            if not _command(companion, line.strip()):
                return
            continue
        try:
            result = companion.send(line, on_text=term.write, on_status=term.status)
        except MlxmemError as exc:
            err.print(f"Error: {exc}")
            continue
        except KeyboardInterrupt:
            term.end_line()
            err.print("(interrupted)")
            continue
        term.end_line()
        _report_after(result)


def _command(companion: Companion, line: str) -> bool:
    """Run a slash command; False means quit."""
    name, _, arg = line.partition(" ")
    try:
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            err.print(HELP)
        elif name == "/memory":
            _print_facts(companion)
        elif name == "/remember":
            fact = companion.remember(arg)
            err.print(f"remembered [{fact.id}] {fact.text}")
        elif name == "/forget":
            ids = [int(x) for x in arg.split()] if arg.strip() else []
            if not ids:
                raise InputError("usage: /forget ID...")
            err.print(companion.forget(ids).describe())
        elif name == "/context":
            _print_context(companion, arg.strip() or None)
        else:
            err.print(f"unknown command {name}; /help lists them")
    except ValueError:  # int() of an id
        err.print("Error: IDs are numbers (see /memory)")
    except MlxmemError as exc:
        err.print(f"Error: {exc}")
    return True


def _print_facts(companion: Companion) -> None:
    facts = companion.store.facts()
    if not facts:
        err.print("nothing remembered yet; /remember TEXT adds a fact")
    for f in facts:
        err.print(f"[{f.id}] ({f.source}) {f.text}")


def _print_context(companion: Companion, draft: str | None = None) -> None:
    prompt = companion.context(draft)
    table = Table(title=f"context budget: {prompt.budget} tokens")
    table.add_column("layer")
    table.add_column("tokens", justify="right")
    table.add_column("share", justify="right")
    for layer, tokens in prompt.layers.to_dict().items():
        table.add_row(layer, str(tokens), f"{100 * tokens / prompt.budget:.0f}%")
    err.print(table)
    if prompt.recalled:
        err.print(f"recalled from the log: turn id(s) {', '.join(map(str, prompt.recalled))}")
    if prompt.facts_left_out:
        err.print(f"{prompt.facts_left_out} fact(s) left out: the facts share is full")


def _report_after(result: TurnResult) -> None:
    if result.interrupted:
        err.print("[dim](reply interrupted; kept in the log as interrupted)[/dim]")
    if result.fact_added is not None:
        err.print(f"[dim]remembered [{result.fact_added.id}] {result.fact_added.text}[/dim]")


class Terminal:
    """Where the reply streams: stdout, remembering whether the reply's line is still open,
    and going quiet if the reader goes away (`| head`): the turn is logged all the same."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.line_open = False
        self.gone = False

    def write(self, text: str) -> None:
        if not text or self.gone:
            return
        self.line_open = not text.endswith("\n")
        try:
            self.stream.write(text)
            self.stream.flush()
        except BrokenPipeError:
            # Python's advice: point the descriptor at /dev/null, so that the flush at exit
            # does not fail again.
            self.gone = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())

    def end_line(self) -> None:
        if self.line_open:
            self.write("\n")

    def status(self, text: str) -> None:
        self.end_line()
        err.print(f"[dim]... {text}[/dim]")


def _aliases() -> set[str]:
    from mlxmem.models import load_registry

    return set(load_registry())


def _with_piped_text(message: str | None) -> str | None:
    """The message with any text piped into stdin joined after it (a blank line between), or
    the piped text alone; never drops what was piped."""
    if sys.stdin is None or sys.stdin.isatty():
        return message
    piped = _read_stdin()
    if message is None:
        return piped
    return f"{message}\n\n{piped}" if piped.strip() else message


def _read_stdin() -> str:
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"standard input is not valid UTF-8 (byte {exc.start})") from None


def _one_line_warnings() -> None:
    def show(message, category, filename, lineno, file=None, line=None):
        err.print(f"Warning: {message}", markup=False)

    warnings.showwarning = show
