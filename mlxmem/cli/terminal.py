"""Where a chat's reply goes: streamed to stdout, with what happened after it on stderr."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from rich.markup import escape

from mlxmem.memory.companion import TurnResult
from mlxmem.memory.tables.facts import Fact

from .common import err, visible_controls


class Terminal:
    """Where the reply streams: stdout, remembering whether the reply's line is still open,
    and going quiet if the reader goes away (`| head`): the turn is logged all the same."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        # On a terminal a reply's control characters are shown, not acted on (a model can
        # write ESC sequences); a pipe gets the text exact, as the log keeps it.
        self.visible = self.stream.isatty()
        self.line_open = False
        self.gone = False

    def write(self, text: str) -> None:
        if not text or self.gone:
            return
        self.line_open = not text.endswith("\n")
        try:
            self.stream.write(visible_controls(text) if self.visible else text)
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


class PrefillProgress:
    """Engine.on_prefill for a terminal: once reading a prompt in has taken more than
    `after_s` (a conversation read into a model that has not cached it: minutes on a CPU),
    a line on stderr says how far it is, rewritten in place and cleared at the end. Silent
    off a terminal, and for the quick prefills of ordinary turns. A prefill after a reply
    (the cache warmed for the next turn) starts below the reply's last line, if `terminal`
    left it open, instead of overwriting it."""

    def __init__(
        self,
        model: str,
        after_s: float = 2.0,
        stream: TextIO | None = None,
        terminal: Terminal | None = None,
    ):
        self.model = model
        self.after_s = after_s
        self.stream = stream or sys.stderr
        self.terminal = terminal
        self.started: float | None = None
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self.started is None or done == 0:
            self.started = now
        if done >= total:
            if self.shown:
                self.stream.write("\r\x1b[K")  # clear the line for the reply
                self.stream.flush()
            self.started, self.shown = None, False
            return
        if now - self.started < self.after_s or not self.stream.isatty():
            return
        if not self.shown and self.terminal is not None:
            self.terminal.end_line()
        self.stream.write(
            f"\rreading the conversation into {visible_controls(self.model)}..."
            f" {done:,}/{total:,} tokens"
        )
        self.stream.flush()
        self.shown = True


def report_after(result: TurnResult) -> None:
    """What happened besides the reply: an interruption, a fact noted."""
    if result.interrupted:
        err.print("[dim](reply interrupted; kept in the log as interrupted)[/dim]")
    for fact, replaced in result.noted:
        report_noted(fact, replaced)


def report_noted(fact: Fact, replaced: int | None) -> None:
    """A fact noted automatically, and the one it replaced."""
    replaces = "" if replaced is None else f" (replaces {replaced})"
    err.print(f"[dim]remembered \\[{fact.id}] {escape(fact.text)}{replaces}[/dim]")
