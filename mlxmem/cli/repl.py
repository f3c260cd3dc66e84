"""The interactive chat: a line editor, `\"\"\"` for several lines, and slash commands.

Line editing and history come from the standard library's `readline` (GNU readline on Linux,
libedit on macOS): no new dependency, and `input()` gains Emacs keys and the Up arrow as soon as
it is imported. prompt_toolkit would add multi-line editing, but it is not a dependency of
mlxmem and `\"\"\"` covers several lines. The history is never written to a file of its own: it
is seeded from the conversation's own messages in the log, so it lasts across sessions and
is as private as the log: a turn deleted from the log is not in the next session's history, nor
after /new, /clear or /model (within a session, the lines typed stay in memory, never on disk).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime
from typing import TypeVar

from rich.markup import escape
from rich.table import Table

from mlxmem.errors import InputError, MlxmemError
from mlxmem.memory.companion import Companion, TurnResult
from mlxmem.memory.tables.summaries import describe_source
from mlxmem.memory.tables.turns import Turn
from mlxmem.model_thread import ModelThread
from mlxmem.text import plural

from .common import err
from .terminal import Terminal, report_after, report_noted

HELP = """\
Commands:
  /memory          what mlxmem remembers about you (id, source, text)
  /remember TEXT   add a fact yourself
  /forget ID...    delete facts for good
  /context [TEXT]  how the context budget is spent right now (for TEXT, with what recall adds)
  /history [N]     the newest N turns of this conversation (default 10)
  /new [NAME]      start a new conversation, or continue the one called NAME
  /clear           start a new conversation (the old one stays in the log)
  /model [NAME]    the model in use, or switch to NAME
  /help            this list
  /quit            leave (Ctrl-D works too; Ctrl-C stops a reply)
Several lines: start with \"\"\" and end with \"\"\"."""

QUOTES = '"""'
HISTORY_TURNS = 500  # the newest messages of the conversation offered by the Up arrow

# Opens a conversation: (model, conversation name) -> Companion.
Opener = Callable[[str, str], Companion]
T = TypeVar("T")
# A wait for the memory work shorter than this is not worth a line.
WAIT_SAID_S = 0.1


class LineReader:
    """Reads what the person types: one line, or several between \"\"\" marks. On a terminal,
    with readline's editing and a history of the conversation's messages."""

    def __init__(self, terminal: bool):
        self.readline = _readline() if terminal else None

    def seed(self, texts: list[str]) -> None:
        if self.readline is None:
            return
        self.readline.clear_history()
        for text in texts[-HISTORY_TURNS:]:
            self.readline.add_history(text)

    def read(self) -> str:
        line = input(">>> ")
        if line.lstrip().startswith(QUOTES):
            line = self._several_lines(line.lstrip()[len(QUOTES) :])
        if line.strip() and self.readline is not None:
            self.readline.add_history(line)
        return line

    def _several_lines(self, first: str) -> str:
        lines = [first]
        while not lines[-1].rstrip().endswith(QUOTES):
            lines.append(input("... "))
        lines[-1] = lines[-1].rstrip()[: -len(QUOTES)]
        return "\n".join(lines).strip("\n")


class Session:
    """One interactive chat: the conversation and model in use, which /new, /clear and /model
    replace."""

    def __init__(self, open_chat: Opener, model: str, conversation: str, term: Terminal):
        self.open_chat = open_chat
        self.model = model
        self.model_thread = ModelThread()
        self.companion = self.model_thread.call(lambda: open_chat(model, conversation))
        self.term = term
        self.reader = LineReader(sys.stdin.isatty())
        self.pending: Future[TurnResult] | None = None  # the last turn, its memory work running
        # Set while a message waits for that work: its look for a fact gives way (postponed
        # to the next turn), the fold and the cache's warm-up, which the next prompt needs, not.
        self.hurry = threading.Event()

    def run(self) -> None:
        # The store stays open while the person types (Store.holding): a turn opens nothing,
        # and another process that asks for the store (mlxmem memory, history) gets it within
        # milliseconds. Every conversation and model of the session shares this one store.
        with self.companion.store.holding():
            try:
                self._loop()
            finally:
                self._leave()

    def _loop(self) -> None:
        self._started()
        while True:
            try:
                line = self.reader.read()
            except (EOFError, KeyboardInterrupt):
                self.term.write("\n")
                return
            if not line.strip():
                continue
            if line.startswith("/"):
                if not self.command(line.strip()):
                    return
                continue
            self.send(line)

    def send(self, text: str) -> None:
        """Write the reply on the model's thread and come back to the prompt as soon as it
        is out; the turn's memory work goes on there while the person types, and the next
        message (or command) waits for it, saying so if that takes a while. A message sent
        while that work runs is logged at once, before the wait, and waits only for the fold
        and the cache's warm-up: the look for a fact stops and is done after its reply."""
        logged = None
        if self.pending is not None and not self.pending.done():
            try:
                logged = self.companion.log_message(text)
            except MlxmemError as exc:
                err.print(f"Error: {exc}", markup=False)
                return
            self.hurry.set()
        self.settle()
        self.hurry.clear()
        written, stop = threading.Event(), threading.Event()
        future = self.model_thread.submit(lambda: self._turn(text, written, stop, logged))
        try:
            while not written.wait(0.05) and not future.done():
                pass
        except KeyboardInterrupt:
            stop.set()  # the reply stops where it is, and is logged as interrupted
            while not written.wait(0.05) and not future.done():
                pass
            self.term.end_line()
            err.print("(interrupted)")
        self.term.end_line()
        self.pending = future
        if future.done():
            self.settle()

    def _turn(
        self,
        text: str,
        written: threading.Event,
        stop: threading.Event,
        logged: Turn | None = None,
    ) -> TurnResult:
        """One turn, on the model's thread: `written` is set once the reply is out."""
        engine = self.companion.engine
        progress = engine.on_prefill

        def reply_out(_: TurnResult) -> None:
            engine.on_prefill = None  # the work after the reply is silent: the person types
            written.set()

        try:
            turn = self.companion.begin(text, logged=logged)
            return self.companion.reply(
                turn,
                on_text=self.term.write,
                should_stop=stop.is_set,
                on_written=reply_out,
                should_yield=self.hurry.is_set,
            )
        finally:
            engine.on_prefill = progress

    def settle(self) -> None:
        """Wait for the last turn's memory work, if it still runs (saying how long, if long),
        and report what the turn did: a fact noted, an error."""
        future, self.pending = self.pending, None
        if future is None:
            return
        start = time.monotonic()
        try:
            result = future.result()
        except MlxmemError as exc:
            err.print(f"Error: {exc}", markup=False)
            return
        waited = time.monotonic() - start
        if waited >= WAIT_SAID_S:
            err.print(f"[dim](waited {waited:.1f} s for memory work)[/dim]")
        report_after(result)

    def _leave(self) -> None:
        """Quitting: the memory work still running is finished, with the looks for a fact
        postponed so far (Ctrl-C leaves them; the log already holds the turns, and the next
        session folds what it needs)."""
        if self.pending is not None and not self.pending.done():
            err.print("[dim]finishing memory work (Ctrl-C to leave it)...[/dim]")
        try:
            self.settle()
            self._catch_up()
        except KeyboardInterrupt:
            pass
        self.model_thread.close()

    def _catch_up(self) -> None:
        """Look for facts in the messages whose look was postponed (a conversation or the
        session being left), and say what was noted."""
        companion = self.companion
        for fact, replaced in self.model_thread.call(companion.catch_up):
            report_noted(fact, replaced)

    def command(self, line: str) -> bool:
        """Run a slash command (once the last turn's memory work is done); False means quit."""
        self.settle()
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        try:
            if name in ("/quit", "/exit"):
                return False
            handler = self.handlers().get(name)
            if handler is None:
                err.print(f"unknown command {name}; /help lists them", markup=False)
            else:
                handler(arg)
        except ValueError:  # int() of an id (or of /history's count)
            err.print("Error: IDs are numbers (see /memory)")
        except MlxmemError as exc:
            err.print(f"Error: {exc}", markup=False)
        return True

    def handlers(self) -> dict[str, Callable[[str], None]]:
        return {
            "/help": lambda arg: err.print(HELP, markup=False),
            "/memory": lambda arg: self.print_facts(),
            "/remember": self.remember,
            "/forget": self.forget,
            "/context": lambda arg: self.print_context(arg or None),
            "/history": lambda arg: self.print_history(int(arg) if arg else 10),
            "/new": lambda arg: self.switch(self.model, arg or self.new_name()),
            "/clear": lambda arg: self.switch(self.model, self.new_name()),
            "/model": self.use_model,
        }

    def remember(self, text: str) -> None:
        fact = self.companion.remember(text)
        err.print(f"remembered [{fact.id}] {fact.text}", markup=False)

    def forget(self, arg: str) -> None:
        ids = [int(x) for x in arg.split()]
        if not ids:
            raise InputError("usage: /forget ID...")
        err.print(self.companion.forget(ids).describe())

    def print_facts(self) -> None:
        facts = self.companion.store.facts()
        if not facts:
            err.print("nothing remembered yet; /remember TEXT adds a fact")
        for f in facts:
            err.print(f"[{f.id}] ({f.source}) {f.text}", markup=False)

    def print_context(self, draft: str | None) -> None:
        prompt = self.companion.context(draft)
        table = Table(title=f"context budget: {prompt.budget} tokens")
        table.add_column("layer")
        table.add_column("tokens", justify="right")
        table.add_column("share", justify="right")
        for layer, tokens in prompt.layers.to_dict().items():
            table.add_row(layer, str(tokens), f"{100 * tokens / prompt.budget:.0f}%")
        err.print(table)
        summary = self.companion.store.latest_summary(self.companion.conversation)
        if summary is not None:
            err.print(
                f"summary of turns #{summary.first_seq}-#{summary.last_seq}: "
                f"{describe_source(summary.source)}",
                markup=False,
            )
        if prompt.recalled:
            ids = ", ".join(map(str, prompt.recalled))
            err.print(f"recalled from the log: {plural(len(prompt.recalled), 'turn id')} {ids}")
        if prompt.facts_left_out:
            left = plural(prompt.facts_left_out, "fact")
            err.print(f"{left} left out: the facts share is full")

    def print_history(self, count: int) -> None:
        turns = self.companion.store.turns(self.companion.conversation)[-count:]
        if not turns:
            err.print("no turns yet in this conversation")
        for t in turns:
            mark = " [interrupted]" if t.interrupted else ""  # as `history show` marks it
            err.print(f"#{t.seq} [{t.id}] {t.role}: {t.text}{mark}", markup=False)

    def use_model(self, name: str) -> None:
        if name:
            self.switch(name, self.companion.conversation)
        else:
            err.print(f"model: {self.model}", markup=False)

    def switch(self, model: str, conversation: str) -> None:
        self.companion.store.check_name(conversation)  # before a model loads or a turn waits
        self._catch_up()
        self.companion = self.model_thread.call(lambda: self.open_chat(model, conversation))
        self.model = model
        self._started()

    def new_name(self) -> str:
        """A conversation name not taken yet: chat-YYYYMMDD-HHMMSS, local time."""
        taken = {c.name for c in self.companion.store.conversations()}
        base = datetime.now().strftime("chat-%Y%m%d-%H%M%S")
        name, n = base, 1
        while name in taken or name == self.companion.conversation:
            n += 1
            name = f"{base}-{n}"
        return name

    def _started(self) -> None:
        store, conversation = self.companion.store, self.companion.conversation
        turns = store.turns(conversation)
        self.reader.seed([t.text for t in turns if t.role == "user"])
        state = f"{len(turns)} turns" if turns else "new"
        err.print(
            f"[dim]conversation {escape(repr(conversation))} ({state}), model "
            f"{escape(self.model)} - /help for commands[/dim]"
        )


def _readline():
    """The readline module with its own history (no file), or None where Python has none."""
    try:
        import readline
    except ImportError:  # a Python built without it (some Windows builds)
        return None
    readline.set_auto_history(False)  # only whole entries, never each line of a \"\"\" block
    return readline
