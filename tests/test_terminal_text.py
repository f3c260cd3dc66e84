"""Stored text never drives the terminal: control characters in facts, turns, conversation
names and replies are printed visibly (`\\x1b`), while JSON keeps the text exact."""

import io
import json

import pytest
from conftest import cli

from mlxmem.cli.terminal import Terminal
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.memory.tables.turns import conversation_id
from mlxmem.testing import FakeEngine
from mlxmem.text import utc_now, visible_controls

# OSC 52 (write the clipboard), clear the screen, set the title, a C1 CSI, a carriage return.
HOSTILE = "pwn \x1b]52;c;aGk=\x07 \x1b[2J \x1b]0;title\x07 \u009b31m \rover"


def test_visible_controls_shows_every_control_but_tab_and_newline():
    shown = visible_controls(HOSTILE + "\tand\nmore")
    assert shown.isprintable() is False  # the tab and newline stay
    assert shown.replace("\t", "").replace("\n", "").isprintable()
    assert "\\x1b]52;c;aGk=\\x07" in shown and "\\x9b31m" in shown and "\\x0dover" in shown
    assert visible_controls(shown) == shown  # idempotent
    assert visible_controls("é ✓ 日本") == "é ✓ 日本"


def stored() -> None:
    Store().add_fact(HOSTILE)
    # A conversation name with controls is refused here, but one can come by sync, which
    # checks no more of another device's names than that they are text, not blank.
    with Store().connect() as con:
        conversation_id(con, HOSTILE, create=utc_now())
    Companion(FakeEngine(), Store(), HOSTILE, 600, 120, ChatSettings()).send(HOSTILE)


@pytest.mark.parametrize(
    "args",
    [
        ["memory", "list"],
        ["history", "list"],
        ["history", "show", HOSTILE],
        ["history", "search", "pwn"],
        ["memory", "rm", "1"],  # lists the turns that still quote it
    ],
)
def test_stored_text_reaches_the_terminal_as_text(args):
    stored()
    output = cli(*args).output
    assert "\x1b" not in output and "\x07" not in output and "\u009b" not in output
    assert "\\x1b" in output


def test_json_keeps_the_text_exact():
    stored()
    (fact,) = json.loads(cli("memory", "list", "--json").stdout)
    assert fact["text"] == HOSTILE
    turns = json.loads(cli("history", "show", HOSTILE, "--json").stdout)
    assert HOSTILE in [t["text"] for t in turns]


class Tty(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_a_reply_is_shown_visibly_on_a_terminal_and_exact_in_a_pipe():
    for tty, expected in ((True, visible_controls(HOSTILE)), (False, HOSTILE)):
        stream = Tty(tty)
        term = Terminal(stream)
        for piece in ("pwn \x1b", "]52;c;aGk=\x07 \x1b[2J \x1b]0;", "title\x07 \u009b31m \rover"):
            term.write(piece)  # an escape split across streamed pieces
        assert stream.getvalue() == expected


def test_prefill_progress_shows_on_a_terminal_only_once_reading_takes_long():
    from mlxmem.cli.terminal import PrefillProgress

    quick, slow, piped = Tty(True), Tty(True), Tty(False)
    for stream, after in ((quick, 60.0), (slow, 0.0), (piped, 0.0)):
        progress = PrefillProgress("smollm2-135m", after_s=after, stream=stream)
        for done in (0, 1200, 2400, 4000):
            progress(done, 4000)
    assert quick.getvalue() == "" and piped.getvalue() == ""
    shown = slow.getvalue()
    assert "reading the conversation into smollm2-135m... 1,200/4,000 tokens" in shown
    assert shown.endswith("\r\x1b[K")  # the line is cleared for the reply


def test_prefill_progress_after_a_reply_starts_below_the_reply_line():
    from mlxmem.cli.terminal import PrefillProgress

    # One stream for both, as stdout and stderr share a terminal's screen.
    screen = Tty(True)
    term = Terminal(screen)
    progress = PrefillProgress("tiny", after_s=0.0, stream=screen, terminal=term)
    term.write("Hello there")  # the reply's last line, no newline yet
    progress(0, 100)
    progress(50, 100)
    progress(100, 100)
    assert screen.getvalue().startswith("Hello there\n\rreading the conversation into tiny...")
    assert not term.line_open
