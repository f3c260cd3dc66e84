"""Long `eval locomo` runs: a stratified sample, a run folder that a rerun goes on from (after a
stop between questions, or inside the replay), where each question's evidence was, and what a
question cost. The fake engine, on the LoCoMo-shaped conversation the tests write."""

import json

import pytest
from test_eval_locomo import extracting_reader, reader, write_dataset

from mlxmem.errors import InputError
from mlxmem.eval import locomo as ev
from mlxmem.eval.locomo import runner
from mlxmem.eval.runlog import RunDir, read_lines
from mlxmem.memory import window
from mlxmem.testing import FakeEngine


def questions(categories: list[int]) -> list[ev.Question]:
    return [ev.Question(f"q{i}", "a", c, (), i) for i, c in enumerate(categories)]


def test_a_stratified_sample_gives_each_category_its_share_and_leaves_adversarial_out():
    qs = questions([1] * 30 + [2] * 20 + [3] * 5 + [4] * 40 + [5] * 25)
    sample = ev.stratified_sample(qs, 19)
    counts = {c: sum(q.category == c for q in sample) for c in (1, 2, 3, 4, 5)}
    assert counts == {1: 6, 2: 4, 3: 1, 4: 8, 5: 0}
    # The categories interleaved, so that a run stopped part-way has asked each its share.
    assert sorted(q.category for q in sample[:4]) == [1, 2, 3, 4]
    assert {q.category for q in sample[4:8]} == {1, 2, 4}
    for c in (1, 2, 4):  # each in file order
        assert [q.index for q in sample if q.category == c] == sorted(
            q.index for q in sample if q.category == c
        )
    # Spread over each category, not its first questions.
    assert max(q.index for q in sample if q.category == 4) > 80
    # A rare category still gets one; asking for more than there are gives all of 1-4.
    assert sum(q.category == 3 for q in ev.stratified_sample(qs, 4)) == 1
    assert len(ev.stratified_sample(qs, 500)) == 95


class Stop(Exception):
    """Stands for a kill: raised from inside the model's call."""


def stopping(responder, after: int, when=lambda prompt: True):
    """`responder` that raises Stop at its `after`-th call for which `when(prompt)` holds."""
    seen = [0]

    def respond(prompt: str) -> str:
        if when(prompt):
            seen[0] += 1
            if seen[0] == after:
                raise Stop
        return responder(prompt)

    return respond


def comparable(result: dict) -> list[dict]:
    """A run's items without what a rerun may change (timings, the cache it found)."""
    cost = {"seconds", "cached_tokens", "prefilled_tokens"}
    items = result["conversations"][0]["items"]
    return [
        {k: ({kk: vv for kk, vv in v.items() if kk not in cost} if isinstance(v, dict) else v)
         for k, v in item.items() if k != "seconds"}
        for item in items
    ]  # fmt: skip


@pytest.mark.parametrize("per_session", [False, True])
def test_a_run_stopped_between_questions_goes_on_and_asks_none_twice(tmp_path, per_session):
    data = write_dataset(tmp_path / "data", sessions=4, chatter=3)
    whole = ev.run_locomo(
        FakeEngine(extracting_reader), data, ["conv-1"], 2200, 120, per_session=per_session
    ).to_dict()
    engine = FakeEngine(stopping(extracting_reader, 3, lambda p: "Question:" in p))
    run_dir = tmp_path / "run"
    args = (data, ["conv-1"], 2200, 120)
    with pytest.raises(Stop):
        ev.run_locomo(engine, *args, per_session=per_session, run_dir=run_dir)
    assert (run_dir / "conv-1.replay.json").exists()  # the replay was whole
    assert len(read_lines(run_dir / "conv-1.items.jsonl")) == 0  # stopped in the first question
    configs = len(ev.PER_SESSION_CONFIGS if per_session else ev.CONFIGS)
    engine.responder = stopping(extracting_reader, configs + 2, lambda p: "Question:" in p)
    with pytest.raises(Stop):
        ev.run_locomo(engine, *args, per_session=per_session, run_dir=run_dir)
    assert len(read_lines(run_dir / "conv-1.items.jsonl")) == 1
    engine.responder, engine.slots = extracting_reader, {}  # a new sitting: nothing cached
    calls = len(engine.calls)
    again = ev.run_locomo(engine, *args, per_session=per_session, run_dir=run_dir).to_dict()
    # Only the questions not done were asked; the replay was not run again.
    asked = [c for c in engine.calls[calls:] if c.slot.startswith("probe/")]
    assert len(asked) == len(engine.calls[calls:]) == len(again["configs"]) * 4  # 4 of 5 left
    assert comparable(again) == comparable(whole)
    lines = read_lines(run_dir / "conv-1.items.jsonl")
    assert sorted(i["index"] for i in lines) == list(range(5))  # each once
    # A third run has nothing left to do.
    calls = len(engine.calls)
    assert comparable(
        ev.run_locomo(engine, *args, per_session=per_session, run_dir=run_dir).to_dict()
    ) == comparable(whole)
    assert len(engine.calls) == calls


@pytest.mark.parametrize("per_session", [False, True])
@pytest.mark.parametrize("share", [0.3, 0.7, 0.95])
def test_a_replay_stopped_anywhere_gives_the_result_of_one_that_was_not(
    tmp_path, per_session, share
):
    data = write_dataset(tmp_path / "data", sessions=4, chatter=3)
    args = (data, ["conv-1"], 1000, 120)
    first = FakeEngine(extracting_reader)
    whole = ev.run_locomo(first, *args, per_session=per_session).to_dict()
    replay_calls = sum(not c.slot.startswith("probe/") for c in first.calls)
    # Stops at a call of the replay that far into it: inside an exchange's prompt, a fold, or
    # a look for facts, whichever it falls on.
    stop_at = int(share * replay_calls)
    engine = FakeEngine(stopping(extracting_reader, stop_at, lambda p: "Question:" not in p))
    run_dir = tmp_path / "run"
    with pytest.raises(Stop):
        ev.run_locomo(engine, *args, per_session=per_session, run_dir=run_dir)
    assert not (run_dir / "conv-1.replay.json").exists()
    engine.responder, engine.slots = extracting_reader, {}
    again = ev.run_locomo(engine, *args, per_session=per_session, run_dir=run_dir).to_dict()
    assert comparable(again) == comparable(whole)
    lines = read_lines(run_dir / "conv-1.replay.jsonl")
    assert len(lines) == again["layers"]["conv-1"]["turns"] // 2  # an exchange a line, once
    # Stopped between exchanges, the replay went on in a second sitting; inside one, it
    # started over (one sitting). Never more: one line per exchange, once.
    assert again["layers"]["conv-1"]["replay_sittings"] in (1, 2)
    layers = whole["layers"]["conv-1"]
    assert again["layers"]["conv-1"]["facts"]["added"] == layers["facts"]["added"]


@pytest.mark.parametrize("per_session", [False, True])
def test_a_replay_stopped_inside_an_exchange_goes_on_from_the_last_copy_of_its_store(
    tmp_path, monkeypatch, per_session
):
    monkeypatch.setattr(runner, "KEEP_EVERY", 2)
    data = write_dataset(tmp_path / "data", sessions=4, chatter=3)
    args = (data, ["conv-1"], 1000, 120)
    first = FakeEngine(extracting_reader)
    whole = ev.run_locomo(first, *args, per_session=per_session).to_dict()
    exchanges = whole["layers"]["conv-1"]["turns"] // 2
    # A kill while the model reads an exchange's prompt, most of the way through the replay.
    prompts = [c for c in first.calls if c.max_tokens == 1]
    assert len(prompts) == exchanges
    stop_at = exchanges - 2

    engine = FakeEngine(extracting_reader)
    real_generate = engine.generate
    seen = [0]

    def generate(tokens, sampling, **kw):
        if sampling.max_tokens == 1:
            seen[0] += 1
            if seen[0] == stop_at:
                raise Stop
        return real_generate(tokens, sampling, **kw)

    engine.generate = generate
    run_dir = tmp_path / "run"
    with pytest.raises(Stop):
        ev.run_locomo(engine, *args, per_session=per_session, run_dir=run_dir)
    kept = read_lines(run_dir / "conv-1.replay.jsonl")
    assert len(kept) == stop_at - 1 and (run_dir / "conv-1.kept").is_dir()
    engine.generate, engine.slots, calls = real_generate, {}, len(engine.calls)
    again = ev.run_locomo(engine, *args, per_session=per_session, run_dir=run_dir).to_dict()
    assert comparable(again) == comparable(whole)
    # Only the exchanges after the last copy were read again: not the whole replay.
    read_again = sum(c.max_tokens == 1 for c in engine.calls[calls:])
    assert 0 < read_again <= exchanges - (stop_at - 1) + 1
    assert len(read_lines(run_dir / "conv-1.replay.jsonl")) == exchanges  # a line each, once
    assert again["layers"]["conv-1"]["replay_sittings"] == 2
    assert (
        again["layers"]["conv-1"]["facts"]["added"] == whole["layers"]["conv-1"]["facts"]["added"]
    )
    assert not any(p.name.startswith("conv-1.kept") for p in run_dir.iterdir())


@pytest.mark.parametrize("per_session", [False, True])
def test_a_replay_stopped_between_an_exchange_and_its_line_goes_on_in_step(
    tmp_path, monkeypatch, per_session
):
    """A kill after an exchange was logged (its looks done) but before its line was written:
    the store holds one exchange more than the lines; the rerun goes back to the last copy."""
    monkeypatch.setattr(runner, "KEEP_EVERY", 2)
    data = write_dataset(tmp_path / "data", sessions=4, chatter=3)
    args = (data, ["conv-1"], 1000, 120)
    whole = ev.run_locomo(FakeEngine(extracting_reader), *args, per_session=per_session)
    whole = whole.to_dict()
    exchanges = whole["layers"]["conv-1"]["turns"] // 2
    real = RunDir.add_exchange
    written = [0]

    def add_exchange(self, conv_id, line):
        if written[0] == exchanges - 3:
            raise Stop
        written[0] += 1
        real(self, conv_id, line)

    monkeypatch.setattr(RunDir, "add_exchange", add_exchange)
    run_dir = tmp_path / "run"
    with pytest.raises(Stop):
        ev.run_locomo(
            FakeEngine(extracting_reader), *args, per_session=per_session, run_dir=run_dir
        )
    monkeypatch.setattr(RunDir, "add_exchange", real)
    again = ev.run_locomo(
        FakeEngine(extracting_reader), *args, per_session=per_session, run_dir=run_dir
    ).to_dict()
    assert comparable(again) == comparable(whole)
    lines = read_lines(run_dir / "conv-1.replay.jsonl")
    assert len(lines) == exchanges  # an exchange a line, none missing
    assert (
        again["layers"]["conv-1"]["facts"]["added"] == whole["layers"]["conv-1"]["facts"]["added"]
    )


def test_extractive_summaries_make_no_model_call_and_a_run_from_before_the_setting_goes_on(
    tmp_path,
):
    data = write_dataset(tmp_path / "data", sessions=4, chatter=3)
    args = (data, ["conv-1"], 1000, 120)
    model = FakeEngine(extracting_reader)
    with_model = ev.run_locomo(model, *args, summary="model").to_dict()
    with_model = with_model["layers"]["conv-1"]["summaries"]
    engine = FakeEngine(extracting_reader)
    run_dir = tmp_path / "run"
    result = ev.run_locomo(engine, *args, run_dir=run_dir, summary="extractive").to_dict()
    summaries = result["layers"]["conv-1"]["summaries"]
    assert summaries["count"] == with_model["count"] > 0  # the same folds
    assert summaries["sources"] == {"extractive": summaries["count"]}
    asked = [c for c in engine.calls if window.summary_request({}).split(".")[0] in c.prompt]
    assert asked == [] and any(
        window.summary_request({}).split(".")[0] in c.prompt for c in model.calls
    )
    assert result["settings"]["summary"] == "extractive"
    # A run folder written before the setting existed reads as the model's summaries.
    settings = json.loads((run_dir / "settings.json").read_text())
    del settings["summary"]
    (run_dir / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(InputError, match="summary 'model' there, 'extractive' now"):
        ev.run_locomo(engine, *args, run_dir=run_dir, summary="extractive")


@pytest.mark.parametrize("per_session", [False, True])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("facts", [False, True])
def test_the_replay_replaces_facts_only_when_asked(
    tmp_path, monkeypatch, per_session, replace, facts
):
    """The replay's Companion gets --replace-facts as given, and notes facts when asked to
    (always, per session)."""
    data = write_dataset(tmp_path / "data", sessions=2, chatter=1)
    seen = []
    for name in ("_run_one", "_run_per_session"):
        monkeypatch.setattr(runner, name, lambda job, *_: seen.append(job.settings))
    ev.run_locomo(
        FakeEngine(reader), data, ["conv-1"], 2200, 120, facts=facts, replace_facts=replace,
        per_session=per_session,
    )  # fmt: skip
    (replay,) = seen
    assert (replay.replace_facts, replay.extract_facts) == (replace, facts or per_session)


def test_a_run_folder_refuses_other_settings_and_drops_a_line_cut_short(tmp_path):
    settings = {"mode": "one_conversation", "sample": 60, "model_id": "m", "context_tokens": 4096}
    run = RunDir(tmp_path / "run", settings)
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700  # it holds the corpus's text
    run.add_item("conv-1", {"index": 3, "x": 1})
    RunDir(tmp_path / "run", settings | {"conversations": ["conv-2"], "seed": 1})  # the same run
    with pytest.raises(InputError, match="sample 60 there, 80 now"):
        RunDir(tmp_path / "run", settings | {"sample": 80})
    with pytest.raises(InputError, match="model_id"):
        RunDir(tmp_path / "run", settings | {"model_id": "other"})
    # Made before facts could be left unreplaced: with facts on, its replays replaced them, as
    # it goes on; with facts off there was nothing to replace.
    file = tmp_path / "run" / "settings.json"
    for facts, replaced in ((True, True), (False, False)):
        before = json.loads(file.read_text()) | {"facts": facts}
        before.pop("replace_facts", None)
        file.write_text(json.dumps(before))
        with pytest.raises(InputError, match=f"replace_facts {replaced} there"):
            RunDir(tmp_path / "run", settings | {"facts": facts, "replace_facts": not replaced})
        RunDir(tmp_path / "run", settings | {"facts": facts, "replace_facts": replaced})
    items = tmp_path / "run" / "conv-1.items.jsonl"
    with open(items, "a") as f:
        f.write('{"index": 4, "x"')  # a kill while writing
    assert run.items("conv-1") == {3: {"index": 3, "x": 1}}
    run.add_item("conv-1", {"index": 4, "x": 2})
    assert [json.loads(line)["index"] for line in items.read_text().splitlines()] == [3, 4]


def test_each_question_says_where_its_evidence_was_and_what_it_cost(tmp_path, monkeypatch):
    # As in test_evidence_out_of_the_window_is_what_recall_is_scored_on: the first four trips
    # are folded and only recall finds them; the last two are in the window.
    monkeypatch.setattr(window, "MIN_SPECIFICS_ROOM", 10**6)
    data = write_dataset(tmp_path)
    args = (data, ["conv-1"], 2200, 120)
    result = ev.run_locomo(FakeEngine(reader), *args, summary="model").to_dict()
    items = result["conversations"][0]["items"]
    assert [i["place"] for i in items] == ["recalled"] * 4 + ["window"] * 2 + ["unplaced"]
    places = result["by_evidence_place"]
    assert set(places) == {"recalled", "window"}  # adversarial questions are not counted
    assert places["recalled"]["questions"] == 4 and places["window"]["questions"] == 2
    recalled = places["recalled"]["f1_amem"]
    assert recalled["recall"]["mean"] == 1.0 and recalled["mlxmem"]["mean"] == 0.0
    assert recalled["recall_vs_mlxmem"]["mean"] == 1.0
    assert places["window"]["f1"]["mlxmem_vs_window"]["mean"] == 0.0
    cost = result["cost"]
    assert cost["questions"] == 7 and cost["question_seconds_median"] >= 0
    # The questions share the memory's prompt up to the question: after the first, each one
    # reads that prefix from the slot and prefills little.
    memory = [i["mlxmem"] for i in items]
    assert memory[0]["cached_tokens"] < memory[1]["cached_tokens"]
    assert all(m["prefilled_tokens"] < m["prompt_tokens"] / 4 for m in memory[1:])
    assert cost["mlxmem"]["prefilled_tokens_mean"] < cost["mlxmem"]["prompt_tokens_mean"]


def test_the_probes_use_no_more_slots_than_llamacpp_keeps_so_none_evicts_the_next_prefix():
    from mlxmem.engine.llamacpp import MAX_SLOTS

    assert len(set(ev.PROBE_SLOTS.values())) <= MAX_SLOTS
    assert len(set(ev.NEW_CHAT_SLOTS.values())) <= MAX_SLOTS
    assert set(ev.PROBE_SLOTS) == set(ev.CONFIGS)
    assert set(ev.NEW_CHAT_SLOTS) == set(ev.PER_SESSION_CONFIGS)
