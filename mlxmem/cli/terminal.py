"""Where a chat's reply goes: streamed to stdout, with what happened after it on stderr."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.markup import escape

from mlxmem.memory.companion import TurnResult

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


def report_after(result: TurnResult) -> None:
    """What happened besides the reply: an interruption, a fact noted."""
    if result.interrupted:
        err.print("[dim](reply interrupted; kept in the log as interrupted)[/dim]")
    if result.fact_added is not None:
        fact = result.fact_added
        err.print(f"[dim]remembered \\[{fact.id}] {escape(fact.text)}[/dim]")
