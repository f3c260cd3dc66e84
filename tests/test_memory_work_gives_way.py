"""The memory work after a reply gives way to the person's next message: the look for a fact
stops where it is and is done after the next reply (the fold and the cache's warm-up, which
the next prompt is built on, do not stop). A fact is never lost to a fast typist: beyond
POSTPONE_LIMIT messages, the oldest is looked at without giving way. A deletion meanwhile
drops what was postponed. Nor is it lost to a Ctrl-C, a stop or a kill: the log marks each
message until its look is done, and the next Companion of the conversation reads the marks."""

import threading

from conftest import FACT
from serve_helpers import fake_server
from test_repl_background import session_with_a_slow_extractor
from test_serve import ask, log, wait_for

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.looks import POSTPONE_LIMIT
from mlxmem.memory.prompt import TurnPrompt
from mlxmem.memory.store import Store
from mlxmem.testing import FakeEngine

LONG = "I have a cat called Miso and she is the most important one to me, truly. {}"


def facts_of(answers):
    """A fake model whose extraction answers are `answers` in turn, "fine." otherwise."""
    it = iter(answers)
    return lambda prompt: next(it) if "durable facts" in prompt else "fine."


def make(responder, budget=2000):
    store = Store()
    engine = FakeEngine(responder)
    return engine, store, Companion(engine, store, "default", budget, 120, ChatSettings())


def turn(companion, text, should_yield=None):
    return companion.reply(companion.begin(text), should_yield=should_yield)


def test_a_look_stopped_by_a_waiting_message_is_done_after_the_next_reply():
    answers = facts_of([FACT, FACT, "The user drinks green tea every morning."])
    waiting = threading.Event()  # the next message comes while the model answers

    def responder(prompt: str) -> str:
        if "durable facts" in prompt:
            waiting.set()
        return answers(prompt)

    engine, store, companion = make(responder)
    first = turn(companion, LONG.format(1), should_yield=waiting.is_set)
    assert first.noted == [] and store.facts() == []
    assert companion.postponed == 1 and first.looks == ["postponed"]
    # The model was asked, and its answer stopped after one token.
    assert engine.slots["facts"][-1] == engine.encode_text(FACT)[0]
    second = turn(
        companion, "I drink a cup of green tea every morning before work, and another one at four."
    )
    # Both messages looked at after the second reply, the older first.
    assert [f.text for f, _ in second.noted] == [FACT, "The user drinks green tea every morning."]
    user_ids = [t.id for t in store.turns("default") if t.role == "user"]
    assert [f.turn_id for f in store.facts()] == user_ids
    assert companion.postponed == 0
    assert second.to_dict()["facts_added"][0]["text"] == FACT
    assert second.to_dict()["fact_added"]["text"] == "The user drinks green tea every morning."


def test_beyond_the_limit_the_oldest_look_does_not_give_way():
    _, store, companion = make(facts_of([FACT] * 10))
    for i in range(POSTPONE_LIMIT):
        assert turn(companion, LONG.format(i), should_yield=lambda: True).noted == []
    assert companion.postponed == POSTPONE_LIMIT
    # One more message than the limit: the oldest is looked at, the rest wait.
    result = turn(companion, LONG.format("again"), should_yield=lambda: True)
    assert [f.text for f, _ in result.noted] == [FACT]
    assert companion.postponed == POSTPONE_LIMIT
    first_user = store.turns("default")[0]
    assert store.facts()[0].turn_id == first_user.id


def test_a_deletion_drops_the_postponed_looks():
    _, store, companion = make(facts_of([FACT] * 5))
    turn(companion, LONG.format("secret"), should_yield=lambda: True)
    assert companion.postponed == 1
    store.delete_turns([store.turns("default")[0].id])
    result = turn(companion, "A short one, with no fact to look for.")
    assert result.noted == [] and store.facts() == []
    assert companion.postponed == 0


def test_catch_up_looks_at_what_was_postponed():
    _, store, companion = make(facts_of([FACT, FACT]))
    turn(companion, LONG.format(1), should_yield=lambda: True)
    noted = companion.catch_up()
    assert [f.text for f, _ in noted] == [FACT] and [f.text for f in store.facts()] == [FACT]
    assert companion.postponed == 0 and companion.catch_up() == []


def test_at_the_repl_a_message_sent_during_the_look_waits_not_for_it(capsys):
    session, _, release, extracting = session_with_a_slow_extractor()
    with session.companion.store.holding():
        session.send(LONG.format(1))
        assert extracting.wait(30)
        first = session.pending
        threading.Timer(0.2, release.set).start()
        session.send("And what else?")  # the look gives way: no fact from the first turn
        assert first.result().noted == [] and first.result().looks == ["postponed"]
        session.settle()  # the second turn's work looks at the first message again
    session.model_thread.close()
    assert [f.text for f in Store().facts()] == [FACT]
    assert f"remembered [1] {FACT}" in capsys.readouterr().err


def test_serve_logs_a_request_that_comes_during_memory_work_at_once():
    release, extracting = threading.Event(), threading.Event()

    def model(prompt: str) -> str:
        if "durable facts" in prompt:
            if not extracting.is_set():  # the first look is held
                extracting.set()
                assert release.wait(30)
            return FACT
        return "I hear you."

    with fake_server(FakeEngine(model), extract_facts=True) as server:
        ask(server, LONG.format(1))  # the response ends; the look for a fact is held
        assert extracting.wait(30)
        second = threading.Thread(target=lambda: ask(server, "And the dog?"))
        second.start()
        # In the log while the memory work it waits for still runs.
        wait_for(lambda: log()[-1:] == [("user", "And the dog?")])
        release.set()
        second.join(30)
        # The postponed look was done after the second reply.
        wait_for(lambda: [f.text for f in Store().facts()] == [FACT])
    assert log() == [
        ("user", LONG.format(1)),
        ("assistant", "I hear you."),
        ("user", "And the dog?"),
        ("assistant", "I hear you."),
    ]


def test_serve_logs_early_only_when_no_turn_is_queued_so_the_log_keeps_their_order(monkeypatch):
    """A request queued behind a reply is logged when its turn starts; one that comes during
    the memory work after that reply must not be logged before it."""
    reply_go, replying = threading.Event(), threading.Event()
    fold_go, folding = threading.Event(), threading.Event()
    prompts = []

    def model(prompt: str) -> str:
        prompts.append(prompt)
        if len(prompts) == 1:  # the first reply is held while a request queues behind it
            replying.set()
            assert reply_go.wait(30)
        return "I hear you."

    fold = TurnPrompt.fold_while_over_budget

    def held_fold(self, on_status, headroom, snap, events, prompt=None, should_yield=None):
        if headroom > 0 and not fold_go.is_set():  # the fold ahead after a reply, held
            folding.set()
            assert fold_go.wait(30)
        return fold(self, on_status, headroom, snap, events, prompt, should_yield)

    monkeypatch.setattr(TurnPrompt, "fold_while_over_budget", held_fold)
    with fake_server(FakeEngine(model), extract_facts=True) as server:
        worker = server.app.service.worker
        first = threading.Thread(target=lambda: ask(server, LONG.format(1)))
        first.start()
        assert replying.wait(30)
        zero = threading.Thread(target=lambda: ask(server, "zero"))
        zero.start()
        wait_for(worker.waiting)  # queued behind the reply
        reply_go.set()
        first.join(30)
        assert folding.wait(30)  # the first turn's memory work runs
        one = threading.Thread(target=lambda: ask(server, "one"))
        one.start()
        wait_for(lambda: worker._jobs.qsize() == 2)  # "one" waits behind "zero", unlogged
        assert ("user", "one") not in log()
        fold_go.set()
        zero.join(30)
        one.join(30)
    assert [text for role, text in log() if role == "user"] == [LONG.format(1), "zero", "one"]


def test_serve_does_not_tell_a_noted_fact_deleted_since():
    model = lambda prompt: FACT if "durable facts" in prompt else "ok"  # noqa: E731
    with fake_server(FakeEngine(model), extract_facts=True) as server:
        ask(server, LONG.format(1))
        fact = wait_for(lambda: Store().facts())[0]
        Store().delete_facts([fact.id])  # memory rm, between two requests
        told = ask(server, "hello").model_extra["mlxmem"]
    assert told["fact_added"] is None and told["facts_added"] == []


def test_a_postponed_look_outlives_its_companion_and_is_done_in_the_next_one():
    # A server stopped, a session evicted, a process killed: the Companion is gone with the
    # look it postponed. The log marks the message, and the next Companion looks at it.
    engine, store, companion = make(facts_of([FACT]))
    turn(companion, LONG.format(1), should_yield=lambda: True)
    assert companion.postponed == 1 and store.facts() == []
    del companion
    again = Companion(engine, Store(), "default", 2000, 120, ChatSettings())
    assert again.postponed == 1
    result = turn(again, "A short one, with no fact to look for.")
    assert [f.text for f, _ in result.noted] == [FACT]
    assert [f.turn_id for f in store.facts()] == [store.turns("default")[0].id]
    # Looked at: no Companion looks at it again.
    assert Companion(engine, Store(), "default", 2000, 120, ChatSettings()).postponed == 0
    assert store.looks_due("default") == []


def test_a_look_cut_by_ctrl_c_is_done_after_the_next_reply():
    stopped = []

    def responder(prompt: str) -> str:
        if "durable facts" in prompt and not stopped:
            stopped.append(prompt)
            raise KeyboardInterrupt  # Ctrl-C while the model looks for a fact
        return FACT if "durable facts" in prompt else "fine."

    engine, store, companion = make(responder)
    first = turn(companion, LONG.format(1))
    assert stopped and first.noted == [] and store.facts() == []
    assert companion.postponed == 1 and len(store.looks_due("default")) == 1
    second = turn(companion, "A short one, with no fact to look for.")
    assert [f.text for f, _ in second.noted] == [FACT]
    assert store.looks_due("default") == []


def test_a_deleted_message_is_never_looked_at_later():
    engine, store, companion = make(facts_of([FACT] * 3))
    turn(companion, LONG.format("secret"), should_yield=lambda: True)
    store.delete_turns([store.turns("default")[0].id])
    assert store.looks_due("default") == []
    again = Companion(engine, Store(), "default", 2000, 120, ChatSettings())
    assert again.postponed == 0
    assert turn(again, "A short one, with no fact to look for.").noted == []
    assert store.facts() == []


def test_an_interrupted_reply_leaves_its_message_to_be_looked_at():
    from mlxmem.engine import GenerationStats

    engine, store, companion = make(facts_of([FACT]))
    pending = companion.begin(LONG.format(1))
    stats = GenerationStats(10, 0, 10, 1, 0.0, 0.0, 0.0, 0.0, "interrupted")
    result = companion.finish(pending, "I was say", stats, None)
    assert result.noted == [] and companion.postponed == 1
    assert [f.text for f, _ in turn(companion, "Go on, please.").noted] == [FACT]


def test_a_message_longer_than_the_room_kept_is_answered_at_once_and_folded_after():
    from conftest import scripted, user_text

    engine, store = FakeEngine(scripted), Store()
    companion = Companion(engine, store, "default", 700, 60, ChatSettings(extract_facts=False))
    for i in range(6):
        companion.send(user_text(i))
    calls = len(engine.calls)
    long = "Now a long one: " + "my cat Miso likes sardines and naps in the sun " * 12
    pending = companion.begin(long)
    # No fold before the reply: the model was not called, and the prompt fits the budget,
    # the oldest turns left out of it (they are in the log).
    assert pending.folds == [] and len(engine.calls) == calls
    prompt = pending.prompt
    assert len(prompt.tokens) + prompt.layers.reserve <= prompt.budget
    shown = engine.decode(prompt.tokens)
    assert user_text(5) in shown and user_text(0) not in shown
    result = companion.reply(pending)
    # The fold came after the reply, and the turns left out are in its summary's range.
    assert result.folds and store.summaries("default")
    first = store.turns("default")[0]
    assert store.summaries("default")[-1].first_seq <= first.seq


def test_a_fold_gives_way_to_a_waiting_message_with_the_extractive_summary():
    from conftest import scripted, user_text

    def fill(companion, should_yield=None):
        results = [turn(companion, user_text(i), should_yield) for i in range(12)]
        return [e for r in results for e in r.folds]

    # A message waiting at once: every fold is the extractive one, and the model never
    # writes a summary; the window folds all the same and every prompt fits.
    engine = FakeEngine(scripted)
    settings = ChatSettings(extract_facts=False, summary="model")
    companion = Companion(engine, Store(), "hurried", 700, 60, settings)
    folds = fill(companion, should_yield=lambda: True)
    assert folds and all(e.summary.source == "extractive" for e in folds)
    assert all(e.fallback == "gave way" for e in folds)
    assert not any("updated summary" in c.prompt for c in engine.calls)
    assert all(e.prompt_tokens == 0 for e in folds)
    # Nobody waiting: the model writes them, as before.
    engine = FakeEngine(scripted)
    companion = Companion(engine, Store(), "calm", 700, 60, settings)
    assert {e.summary.source for e in fill(companion)} <= {"model", "model+extractive"}
    assert any("updated summary" in c.prompt for c in engine.calls)
