"""The interactive chat does a turn's memory work on the model's thread while the person
types: the prompt comes back once the reply is out, the next message waits for that work
(and says so), and nothing is lost. The fake engine, held inside the extraction, opens the
window."""

import io
import threading
import time

from conftest import FACT

from mlxmem.cli.repl import WAIT_SAID_S, Session
from mlxmem.cli.terminal import Terminal
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.testing import FakeEngine

LONG = "I have a cat called Miso and she is the most important one to me, truly."


def session_with_a_slow_extractor():
    release, extracting = threading.Event(), threading.Event()

    def responder(prompt: str) -> str:
        if "durable facts" in prompt:  # the memory work after the reply
            extracting.set()
            assert release.wait(30)
            return FACT
        return "Noted."

    store = Store()

    def open_chat(model: str, conversation: str) -> Companion:
        return Companion(FakeEngine(responder), store, conversation, 2000, 120, ChatSettings())

    out = io.StringIO()
    return Session(open_chat, "fake", "default", Terminal(out)), out, release, extracting


def release_once_waited_on(session: Session, release: threading.Event) -> None:
    """Let the held extraction go a while after the next message has begun to wait for it
    (once logged, the message sets `hurry`), however slowly a loaded machine gets there."""
    for _ in range(3000):
        if session.hurry.is_set():
            break
        time.sleep(0.01)
    time.sleep(3 * WAIT_SAID_S)
    release.set()


def test_the_prompt_comes_back_before_the_memory_work_and_the_next_message_waits_for_it(capsys):
    session, out, release, extracting = session_with_a_slow_extractor()
    with session.companion.store.holding():
        session.send(LONG)  # returns with the extraction still held open
        assert extracting.wait(30) and not session.pending.done()
        assert out.getvalue() == "Noted.\n"
        assert [t.role for t in Store().turns("default")] == ["user", "assistant"]
        threading.Thread(target=release_once_waited_on, args=(session, release)).start()
        session.send("And what else?")  # waits for the first turn's work, then replies
        session.settle()
    session.model_thread.close()
    said = capsys.readouterr().err
    assert "waited" in said and "for memory work" in said
    assert f"remembered [1] {FACT}" in said
    turns = Store().turns("default")
    assert [t.text for t in turns] == [LONG, "Noted.", "And what else?", "Noted."]
    assert [f.text for f in Store().facts()] == [FACT]


def test_a_message_sent_while_the_memory_work_runs_is_logged_at_once(capsys):
    session, _, release, extracting = session_with_a_slow_extractor()
    with session.companion.store.holding():
        session.send(LONG)
        assert extracting.wait(30) and not session.pending.done()
        sending = threading.Thread(target=session.send, args=("And what else?",))
        sending.start()  # waits for the extraction, which the test holds
        for _ in range(300):
            if len(Store().turns("default")) == 3:
                break
            sending.join(0.01)
        # In the log before the work it waits for is done: nothing to lose while it waits.
        assert [t.text for t in Store().turns("default")][-1] == "And what else?"
        assert sending.is_alive()  # still waiting for the work
        release.set()
        sending.join(30)
        session.settle()
    session.model_thread.close()
    # Logged once, answered once, in order.
    turns = Store().turns("default")
    assert [t.text for t in turns] == [LONG, "Noted.", "And what else?", "Noted."]


def test_quitting_with_memory_work_running_finishes_it(capsys):
    session, _, release, extracting = session_with_a_slow_extractor()
    with session.companion.store.holding():
        session.send(LONG)
        assert extracting.wait(30)
        threading.Timer(0.2, release.set).start()
        session._leave()
    assert "finishing memory work" in capsys.readouterr().err
    assert [f.text for f in Store().facts()] == [FACT]
