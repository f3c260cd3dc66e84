"""`mlxmem chat`: interactive, streaming, or one-shot with a PROMPT, `-m` or stdin."""

from __future__ import annotations

import sys

import typer

from mlxmem.defaults import (
    DEFAULT_CONVERSATION,
    DEFAULT_SEED,
    DEFAULT_TEMP,
    DEFAULT_TOP_P,
    SummaryKind,
)
from mlxmem.errors import InputError
from mlxmem.memory.companion import ChatSettings, Companion, open_companion
from mlxmem.memory.store import Store

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
    model_or_default,
    one_line_warnings,
    print_json,
    say_cost,
)
from .repl import Opener, Session
from .terminal import PrefillProgress, Terminal, report_after

PROMPT = typer.Argument(
    None,
    metavar="PROMPT",
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
        DEFAULT_CONVERSATION,
        "--conversation",
        "-c",
        help="Which conversation to continue, or to start (a new name has no space at either"
        " end and no control character).",
    ),
    system: str = typer.Option(
        None,
        "--system",
        "-s",
        help="Instructions for this run instead of mlxmem's own; the facts and the summary "
        "still follow them. They open the prompt, so a change re-reads the kept turns once.",
    ),
    temp: float = typer.Option(DEFAULT_TEMP, help="Sampling temperature (0: greedy)."),
    top_p: float = typer.Option(DEFAULT_TOP_P, help="Nucleus sampling threshold."),
    max_tokens: int = typer.Option(
        None,
        min=1,
        help="Longest reply in tokens (default and limit: the model's response reserve).",
    ),
    seed: int = typer.Option(
        # MLX seeds are unsigned 64-bit; checked here, before the message is logged.
        DEFAULT_SEED,
        min=0,
        max=2**64 - 1,
        help="Random seed for sampling.",
    ),
    context_tokens: int = CONTEXT_TOKENS,
    engine_name: str | None = ENGINE,
    threads: int | None = THREADS,
    facts: bool = FACTS,
    replace_facts: bool = REPLACE_FACTS,
    summary: SummaryKind = SUMMARY,
    recall: bool = RECALL,
    max_message_chars: int = MAX_MESSAGE_CHARS,
    private: bool = typer.Option(
        False,
        "--private",
        help="Keep this conversation out of recall in every other one (it still recalls its "
        "own older turns, and the others'). It stays so: `mlxmem history private NAME --off` "
        "lets it back in.",
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

    -m is the message, not the model as in `llm`: it was the message before PROMPT existed, and
    scripts rely on it. The model is -M/--model. `-m NAME` where NAME is a model's alias is
    refused as a likely mix-up; send that word as PROMPT instead.
    """
    one_line_warnings()
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
        message = _with_piped_text(message, max_message_chars)
    if message is not None and not message.strip():
        raise InputError("empty message")
    model = model_or_default(model, engine_name, fetch=True)
    Store().check_name(conversation)  # before the model loads: a bad name fails at once
    if private:
        Store().set_private(conversation, create=True)
    settings = ChatSettings(
        temp=temp,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
        extract_facts=facts,
        replace_facts=replace_facts,
        summary=summary.value,
        recall=recall,
        max_message_chars=max_message_chars,
        context_tokens=context_tokens,
    )
    if system is not None:
        if not system.strip():
            raise InputError("empty --system instructions")
        settings.instructions = system
    if message is not None:
        term = Terminal()
        companion = open_companion(model, conversation, settings, engine_name=engine_name)
        companion.engine.on_prefill = PrefillProgress(model, terminal=term)
        _one_shot(companion, message, json_output, model, term)
    else:
        term = Terminal()
        Session(_opener(settings, term, engine_name), model, conversation, term).run()


def _opener(settings: ChatSettings, term: Terminal, engine: str | None = None) -> Opener:
    """Opens a conversation on a model; a new conversation on the same model reuses the model
    already loaded (and its KV caches in memory). Every one shares the first one's store (the
    session holds it)."""
    last: list[tuple[str, Companion]] = []

    def open_chat(model: str, conversation: str) -> Companion:
        if last and last[0][0] == model:
            prev = last[0][1]
            budget, reserve = prev.budget.budget, prev.response_reserve
            companion = Companion(prev.engine, prev.store, conversation, budget, reserve, settings)
        else:
            store = last[0][1].store if last else None
            if last:  # /model: the first model's cost was named when the chat began
                say_cost(model, engine)
            last.clear()  # one model in memory at a time
            companion = open_companion(model, conversation, settings, store, engine)
            companion.engine.on_prefill = PrefillProgress(model, terminal=term)
        last[:] = [(model, companion)]
        return companion

    return open_chat


def _one_shot(
    companion: Companion, message: str, json_output: bool, model: str, term: Terminal
) -> None:
    if json_output:
        result = companion.send(message)
        print_json({"conversation": companion.conversation, "model": model, **result.to_dict()})
        return
    # The reply's last line is ended (and flushed) once the reply is logged, before the memory
    # work after it (folding ahead, noting a fact): a script reading it does not wait for that.
    result = companion.reply(
        companion.begin(message), on_text=term.write, on_written=lambda _: term.end_line()
    )
    report_after(result)


def _aliases() -> set[str]:
    from mlxmem.models import load_registry

    return set(load_registry())


def _with_piped_text(message: str | None, max_chars: int) -> str | None:
    """The message with any text piped into stdin joined after it (a blank line between), or
    the piped text alone; never drops what was piped (more than `max_chars` is refused)."""
    if sys.stdin is None or sys.stdin.isatty():
        return message
    piped = _read_stdin(max_chars)
    if message is None:
        return piped
    return f"{message}\n\n{piped}" if piped.strip() else message


def _read_stdin(max_chars: int) -> str:
    """Standard input, read no further than a message of `max_chars` characters can take (4
    bytes each at most in UTF-8): 300 MB piped in is refused without being read whole into
    memory. (The message's own limit is checked when it is sent.)"""
    data = sys.stdin.buffer.read(4 * max_chars + 1)
    if len(data) > 4 * max_chars:
        raise InputError(
            f"standard input has more than {max_chars:,} characters, over the limit for a message"
            " (--max-message-chars); nothing was logged"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"standard input is not valid UTF-8 (byte {exc.start})") from None
