"""`mlxmem eval locomo`: LoCoMo's scoring, the replay and the probes, on a small conversation in
LoCoMo's format written by the test (the real data is never copied into the repository), with
the fake engine for the logic and the tiny model end to end."""

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from conftest import cli

from mlxmem.bench import history
from mlxmem.cli import eval as eval_cli
from mlxmem.errors import InputError
from mlxmem.eval import locomo as ev
from mlxmem.memory import window
from mlxmem.memory.companion import ChatSettings
from mlxmem.testing import FakeEngine

LOCOMO = Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / "locomo"
PLACES = ["Lisbon", "Oslo", "Kyoto", "Quito", "Hanoi", "Dakar"]
FRIENDS = ["Ana", "Bruno", "Chiara", "Dmitri", "Esther", "Farid"]


def write_dataset(root: Path, sessions: int = 6, chatter: int = 8, coda: str = "") -> Path:
    """A LoCoMo-shaped conversation: in session k the user went to PLACES[k] with FRIENDS[k]
    (`coda` after it); questions ask where the user went with each friend, plus one
    adversarial question."""
    turns, qa = [], []
    for s in range(1, sessions + 1):
        time = f"10:00 am on {s} May, 2023"
        place, friend = PLACES[(s - 1) % len(PLACES)], FRIENDS[(s - 1) % len(FRIENDS)]
        lines = [("user", f"Last weekend I went to {place} with my friend {friend}.{coda}")]
        lines += [("assistant", f"How lovely! What did you like most about {place}?")]
        for i in range(chatter):
            lines.append(("user", f"We ate noodles and walked a lot, day {i} was sunny."))
            lines.append(("assistant", f"Sounds fun, tell me more about day {i}."))
        for n, (role, text) in enumerate(lines, 1):
            turns.append(
                {"role": role, "text": text, "session": s, "session_time": time, "id": f"D{s}:{n}"}
            )
        qa.append(
            {
                "question": f"Where did Jon go with {friend}?",
                "answer": place,
                "evidence": [f"D{s}:1"],
                "category": 4,
            }
        )
    qa.append({"question": "What is Jon's dog called?", "evidence": [], "category": 5,
               "adversarial_answer": "Rex"})  # fmt: skip
    (root / "qa").mkdir(parents=True)
    (root / "conv-1.jsonl").write_text("\n".join(json.dumps(t) for t in turns))
    data = {"user": "Jon", "assistant": "Gina", "qa": qa, "observation": {}}
    (root / "qa" / "conv-1.qa.json").write_text(json.dumps(data))
    return root


# A summary that passes mlxmem's check (it keeps the days' numbers) yet loses every trip: what
# the window folds is then only found again by recall.
NOODLES = "They ate noodles and walked a lot; days 0, 1, 2, 3, 4, 5, 6 and 7 were sunny."


def reader(prompt: str, summary: str = NOODLES) -> str:
    """A fake model that answers from what its prompt shows: where the user went with the
    friend the question names, if the prompt says so."""
    if "updated summary" in prompt:
        return summary
    asked = re.search(r"Question: Where did Jon go with (\w+)\?", prompt)
    if asked is None:
        return "I don't know." if "Question:" in prompt else "Nice."
    places = re.findall(rf"went to (\w+) with my friend {asked.group(1)}", prompt)
    return places[-1] if places else "I don't know."


def test_locomo_normalization_and_f1():
    assert ev.normalize_answer("The Eiffel, Tower!") == "eiffel tower"
    assert ev.token_f1("in Paris", "Paris") == pytest.approx(2 / 3)
    assert ev.token_f1("", "Paris") == 0.0
    multi = ev.Question("q", "Rome, Paris", 1, ())
    assert ev.score("Paris", multi)[0] == pytest.approx(0.5)
    adversarial = ev.Question("q", "Rex", 5, ())
    assert ev.score("That was not mentioned.", adversarial) == (1.0, 1.0)
    assert ev.score("Rex", adversarial) == (0.0, 0.0)
    assert ev.score("19 January, 2023", ev.Question("q", "19 January 2023", 2, ())) == (1.0, 1.0)


def test_questions_are_spread_over_the_file():
    qs = [ev.Question(str(i), "", 4, ()) for i in range(10)]
    assert [q.question for q in ev.pick_questions(qs, 3)] == ["0", "3", "6"]
    assert len(ev.pick_questions(qs, None)) == 10


def test_sessions_are_logged_at_their_dates_and_dialogue_ids_map_to_log_seqs(tmp_path):
    conv = ev.load_conversation(write_dataset(tmp_path, sessions=2, chatter=1), "conv-1")
    pairs, seq_of = ev.exchanges(conv)
    assert pairs[0][0] == "Last weekend I went to Lisbon with my friend Ana."  # no date in it
    assert pairs[2][0] == "Last weekend I went to Oslo with my friend Bruno."
    assert seq_of["D1:1"] == 1 and seq_of["D2:1"] == 5
    may = [datetime(2023, 5, d, 10).astimezone() for d in (1, 2)]
    assert ev.exchange_times(conv) == [(may[0], may[0])] * 2 + [(may[1], may[1])] * 2
    assert (
        ev.session_time(" 7:30  pm on 21 June, 2023") == datetime(2023, 6, 21, 19, 30).astimezone()
    )
    with pytest.raises(InputError, match="session time"):
        ev.session_time("yesterday")


def test_one_speaker_across_two_sessions_is_two_messages_with_a_placeholder_between():
    said = [("user", 1), ("user", 1), ("user", 2), ("assistant", 2), ("assistant", 3)]
    turns = [
        {"role": r, "text": f"t{i}", "session": s, "session_time": f"9:00 am on {s} May, 2023",
         "id": f"D{s}:{i}"}
        for i, (r, s) in enumerate(said)
    ]  # fmt: skip
    conv = ev.LocomoConversation("c", "Jon", "Gina", turns, [])
    pairs, seq_of = ev.exchanges(conv)
    assert pairs == [("t0\nt1", ev.NO_REPLY), ("t2", "t3"), (ev.NEW_CONVERSATION, "t4")]
    days = [(at.day, reply_at.day) for at, reply_at in ev.exchange_times(conv)]
    assert days == [(1, 1), (2, 2), (3, 3)]  # no message spans two days
    assert seq_of == {"D1:0": 1, "D1:1": 1, "D2:2": 3, "D2:3": 4, "D3:4": 6}


def test_the_replay_logs_each_session_at_its_date_and_the_prompts_show_them(tmp_path):
    engine = FakeEngine(reader)
    ev.run_locomo(engine, write_dataset(tmp_path), ["conv-1"], 1000, 120)
    replay = [c.prompt for c in engine.calls if c.slot == "locomo/chat"]
    # Each session's first message shows its day, once; the first session's shows none.
    assert not any("[1 May 2023]\n" in p for p in replay)
    for d in range(2, 7):
        assert any(f"[{d} May 2023]\nLast weekend" in p for p in replay)
        assert not any(f"[{d} May 2023]\nSounds fun" in p for p in replay)
    # Probes are asked after the last session: the question itself carries no date.
    probes = [c.prompt for c in engine.calls if c.slot == "probe/mlxmem"]
    assert probes and all("]\n(You are Gina" not in p for p in probes)
    assert any("Summary of the earlier conversation (1 May 2023 to " in p for p in probes)
    said = "- [1 May 2023] user: Last weekend (the weekend before 1 May 2023) I went to Lisbon"
    assert any(said in p for p in probes)


def test_first_sessions_keep_only_the_questions_they_hold(tmp_path):
    data = write_dataset(tmp_path, sessions=6, chatter=1)
    conv = ev.first_sessions(ev.load_conversation(data, "conv-1"), 2)
    assert {t["session"] for t in conv.turns} == {1, 2}
    # Sessions 3-6's questions and the adversarial one (no evidence turns) are left out.
    assert [q.answer for q in conv.questions] == ["Lisbon", "Oslo"]
    assert ev.first_sessions(conv, None) is conv
    with pytest.raises(InputError):
        ev.first_sessions(conv, 0)
    result = ev.run_locomo(FakeEngine(reader), data, ["conv-1"], 1000, 120, sessions=2)
    report = result.to_dict()
    assert report["settings"]["sessions"] == 2
    assert [i["answer"] for i in report["conversations"][0]["items"]] == ["Lisbon", "Oslo"]
    assert report["conversations"][0]["exchanges"] == 4  # two sessions of two exchanges
    assert report["recall_vs_window"]["n"] == 2


def test_replay_and_probes_with_the_fake_engine(tmp_path):
    data = write_dataset(tmp_path)
    engine = FakeEngine(reader)
    result = ev.run_locomo(engine, data, ["conv-1"], 1000, 120, summary="model").to_dict()
    assert set(ev.CONFIGS) <= set(result)
    for config in ev.CONFIGS:
        assert set(result[config]) == set(ev.METRICS)
        for metric in ev.METRICS:
            assert set(result[config][metric]) == {*ev.CATEGORIES.values(), "overall"}
    f1 = {c: result[c]["f1"]["overall"]["mean"] for c in ev.CONFIGS}
    assert f1["oracle"] == 1.0 and f1["no_memory"] == 0.0
    # The first sessions are folded into the summary: only recall finds them again.
    assert f1["recall"] > f1["mlxmem"]
    assert f1["oracle"] >= f1["recall"] >= f1["window"] >= f1["no_memory"]
    assert result["no_memory"]["f1"]["adversarial"]["mean"] == 1.0
    assert result["oracle_vs_no_memory"]["beats"] and result["recall_vs_mlxmem"]["mean"] > 0
    layers = result["layers"]["conv-1"]
    assert layers["summaries"]["count"] >= 1 and layers["facts"]["extraction"].startswith("off")
    # The fake's summary names what it folds, so the check keeps every one as the model's,
    # some followed by the specifics they left out.
    sources = layers["summaries"]["sources"]
    assert set(sources) <= {"model", "model+extractive"} and sources.get("model+extractive")
    assert sum(sources.values()) == layers["summaries"]["count"]
    # Probes never touch the chat slot: after the replay it got no further call.
    chat_calls = [i for i, c in enumerate(engine.calls) if c.slot == "locomo/chat"]
    probe_calls = [i for i, c in enumerate(engine.calls) if c.slot.startswith("probe/")]
    assert len(probe_calls) == 5 * 7 and max(chat_calls) < min(probe_calls)
    # Probes on one slot reuse its cached prefix.
    memory = [c for c in engine.calls if c.slot == "probe/mlxmem"]
    assert all(c.cached_tokens > 0 for c in memory[1:])


def test_a_result_holds_every_answer_and_its_three_f1s(tmp_path, capsys):
    data = write_dataset(tmp_path)
    run = ev.run_locomo(FakeEngine(reader), data, ["conv-1"], 1000, 120)
    result = json.loads(json.dumps(run.to_dict()))  # as `--json` writes it
    item = result["conversations"][0]["items"][0]  # where Jon went with Ana: Lisbon
    assert item["oracle"]["answer"] == "Lisbon"  # kept, so any scoring can be redone
    scores = {k: item["oracle"][k] for k in (*ev.SCORERS, "exact")}
    assert scores == {"f1": 1.0, "f1_locomo": 1.0, "f1_amem": 1.0, "exact": 1.0}
    for metric in ("f1_locomo", "f1_amem"):
        assert result["oracle"][metric]["overall"]["mean"] == 1.0
        assert result["oracle"][metric]["single_hop"]["n"] == 6
    # The adversarial question: no_memory says it does not know, which LoCoMo scores 1 and
    # A-Mem 0 (it scores against the answer the conversation does not hold).
    assert result["no_memory"]["f1_locomo"]["adversarial"]["mean"] == 1.0
    assert result["no_memory"]["f1_amem"]["adversarial"]["mean"] == 0.0
    assert set(result["settings"]) >= {"f1", "f1_locomo", "f1_amem"}
    figures = ev.headline(result)
    assert figures["f1_oracle"] == figures["f1_locomo_oracle"] == figures["f1_amem_oracle"] == 1.0
    assert ev.beside_amem(result)["oracle"] == {1: None, 2: None, 3: None, 4: 100.0}
    eval_cli._tables(result, "conv-1")  # the report `mlxmem eval locomo` prints
    printed = capsys.readouterr().out
    assert "f1_locomo: LoCoMo F1" in printed and "f1_amem: A-Mem's set F1" in printed
    assert ev.AMEM_ROW_LABEL in printed and "18.2" in printed and "100.0" in printed
    # A run stored before the new scores: its report has the unstemmed F1 alone, and the old
    # key names still read as before.
    for config in ev.CONFIGS:
        del result[config]["f1_locomo"], result[config]["f1_amem"]
    eval_cli._tables(result, "conv-1")
    printed = capsys.readouterr().out
    assert "LoCoMo F1 unstemmed" in printed and "f1_locomo" not in printed
    assert ev.headline(result)["f1_amem_oracle"] is None


def test_evidence_out_of_the_window_is_what_recall_is_scored_on(tmp_path, monkeypatch):
    # The summary keeps the model's text alone (no specifics added after it), so what left the
    # window is in the prompt only where recall puts it.
    monkeypatch.setattr(window, "MIN_SPECIFICS_ROOM", 10**6)
    data = write_dataset(tmp_path)
    args = (data, ["conv-1"], 2200, 120)
    result = ev.run_locomo(FakeEngine(reader), *args, summary="model").to_dict()
    items = result["conversations"][0]["items"]
    upto = items[0]["evicted_upto"]
    assert [i["evidence_seqs"] for i in items] == [[1], [19], [37], [55], [73], [91], []]
    assert 55 < upto < 73  # the first four sessions were folded; the last two are verbatim
    # Out of the window: only recall finds them, and it does. In it: nothing to recall.
    assert [i["recall"]["evidence_recalled"] for i in items] == [1, 1, 1, 1, 0, 0, 0]
    assert [i["mlxmem"]["f1"] for i in items[:6]] == [0.0] * 4 + [1.0] * 2
    out = result["evicted_evidence"]
    assert out["overall"]["questions"] == out["single_hop"]["questions"] == 4
    assert out["overall"]["evidence_recalled"] == 4 and out["overall"]["share"] == 1.0
    assert out["single_hop"]["recall_vs_mlxmem"]["mean"] == 1.0


def test_a_summary_that_fails_the_check_is_replaced_and_keeps_the_trips(tmp_path):
    def thin(prompt: str) -> str:
        return reader(prompt, "They talked about a trip and noodles.")  # no names: it fails

    data = write_dataset(tmp_path)
    result = ev.run_locomo(FakeEngine(thin), data, ["conv-1"], 2200, 120, summary="model")
    result = result.to_dict()
    items = result["conversations"][0]["items"]
    assert [i["evidence_seqs"] for i in items][:4] == [[1], [19], [37], [55]]
    assert 55 < items[0]["evicted_upto"] < 73  # the same four sessions were folded...
    # ...into an extractive summary that keeps each trip, so mlxmem answers without recall.
    assert [i["mlxmem"]["f1"] for i in items[:6]] == [1.0] * 6
    assert result["mlxmem"]["evidence_in_prompt"]["overall"]["mean"] == 1.0
    layers = result["layers"]["conv-1"]
    assert "Lisbon" in layers["summaries"]["final"] and "Quito" in layers["summaries"]["final"]
    assert layers["entity_survival"]["share"] == 1.0
    assert layers["summaries"]["sources"] == {"extractive": layers["summaries"]["count"]}


def test_what_reached_the_prompt():
    turns = [{"id": "D1:1", "text": "I went to  Lisbon\nwith Ana.", "role": "user"}]
    conv = ev.LocomoConversation("c", "Jon", "Gina", turns, [])
    q = ev.Question("Where did Jon go with Ana?", "The city of Lisbon", 4, ("D1:1",))
    shown = "- user: I went to Lisbon with Ana. (and more)"
    assert ev.evidence_in_prompt(conv, q, shown) == 1.0  # whitespace folded
    assert ev.evidence_in_prompt(conv, q, "I went to Lisbon") == 0.0  # the whole turn, or not
    assert ev.evidence_in_prompt(conv, ev.Question("q", "a", 5, ()), shown) is None
    assert ev.answer_words(q) == ["city", "lisbon"]  # normalized, articles and "of" out
    assert ev.answer_in_prompt(q, "Lisbon is a City!") == 1.0
    assert ev.answer_in_prompt(q, "Lisbon") == 0.0
    assert ev.answer_words(ev.Question("q", "Yes; he likes it", 3, ())) == ["yes"]


def test_no_answers_measures_the_prompts_and_generates_nothing(tmp_path):
    data = write_dataset(tmp_path)
    engine = FakeEngine(reader)
    with_answers = ev.run_locomo(FakeEngine(reader), data, ["conv-1"], 2200, 120).to_dict()
    result = ev.run_locomo(engine, data, ["conv-1"], 2200, 120, answers=False).to_dict()
    assert not [c for c in engine.calls if c.slot.startswith("probe/")]
    assert result["settings"]["answers"] is False
    for config in ev.CONFIGS:
        assert result[config]["f1"]["overall"] == {"mean": None, "ci": None, "n": 0}
        for metric in ("evidence_in_prompt", "answer_in_prompt"):
            # The same prompts as with answers, so the same figures.
            assert result[config][metric] == with_answers[config][metric]
    reached = {c: result[c]["evidence_in_prompt"]["overall"]["mean"] for c in ev.CONFIGS}
    answer = {c: result[c]["answer_in_prompt"]["overall"]["mean"] for c in ev.CONFIGS}
    assert reached["oracle"] == answer["oracle"] == 1.0
    assert reached["no_memory"] == answer["no_memory"] == 0.0  # the question does not count
    # Four of six sessions were folded: mlxmem shows the last two verbatim and the four folded
    # trips in the specifics that follow the model's summary (each fold keeps the earlier
    # folds' while they fit); recall brings them back too.
    assert reached["mlxmem"] == reached["recall"] == 1.0
    assert result["recall_vs_mlxmem"]["n"] == 0
    item = result["conversations"][0]["items"][0]
    assert item["recall"]["answer"] is None and item["recall"]["evidence_in_prompt"] == 1.0


def test_answer_configs_answers_those_only_and_measures_every_prompt(tmp_path):
    data = write_dataset(tmp_path)
    whole = ev.run_locomo(FakeEngine(reader), data, ["conv-1"], 2200, 120).to_dict()
    engine = FakeEngine(reader)
    args = (data, ["conv-1"], 2200, 120)
    result = ev.run_locomo(engine, *args, answer_configs=["window", "mlxmem"]).to_dict()
    asked = [c.slot for c in engine.calls if c.slot.startswith("probe/")]
    items = result["conversations"][0]["items"]
    assert sorted(asked) == sorted(["probe/window", "probe/mlxmem"] * len(items))
    assert result["settings"]["answer_configs"] == ["window", "mlxmem"]
    for config in ev.CONFIGS:
        answered = config in ("window", "mlxmem")
        assert (result[config]["f1"] == whole[config]["f1"]) is answered
        assert (result[config]["f1"]["overall"]["n"] == 0) is not answered
        assert result[config]["evidence_in_prompt"] == whole[config]["evidence_in_prompt"]
    # Where each question's evidence was is read as before (recall's prompt is assembled).
    assert [i["place"] for i in items] == [i["place"] for i in whole["conversations"][0]["items"]]
    engine = FakeEngine(reader)
    per_session = ev.run_locomo(engine, *args, per_session=True, answer_configs=["facts"])
    asked = [c.slot for c in engine.calls if c.slot == ev.NEW_CHAT_SLOTS["facts"]]
    assert len(asked) == len(per_session.to_dict()["conversations"][0]["items"])
    assert per_session.to_dict()["recall"]["f1"]["overall"]["n"] == 0
    with pytest.raises(InputError, match="no configuration facts in this mode"):
        ev.run_locomo(FakeEngine(reader), *args, answer_configs=["facts"])
    with pytest.raises(InputError, match="not both"):
        ev.run_locomo(FakeEngine(reader), *args, answers=False, answer_configs=["window"])
    # Every configuration named is the plain run: its folder goes on with or without them.
    ev.run_locomo(FakeEngine(reader), *args, answer_configs=ev.CONFIGS, run_dir=tmp_path / "a")
    ev.run_locomo(FakeEngine(reader), *args, run_dir=tmp_path / "a")
    # A run folder remembers them: a rerun that answers others is refused.
    ev.run_locomo(FakeEngine(reader), *args, answer_configs=["window"], run_dir=tmp_path / "r")
    with pytest.raises(InputError, match="answer_configs"):
        ev.run_locomo(FakeEngine(reader), *args, run_dir=tmp_path / "r")


def test_categories_ask_only_their_questions_before_the_limit_picks(tmp_path):
    data = write_dataset(tmp_path, sessions=3, chatter=1)  # small: only the choice is tested
    args = (data, ["conv-1"], 2200, 120)

    def asked(**kw):
        result = ev.run_locomo(FakeEngine(reader), *args, answers=False, **kw).to_dict()
        return [i["category"] for i in result["conversations"][0]["items"]], result["settings"]

    categories, settings = asked(categories=[5])
    assert categories == [5] and settings["categories"] == [5]
    assert asked(categories=[4], limit=2)[0] == [4, 4]
    engine = FakeEngine(reader)
    with pytest.raises(InputError, match="categories are 1 to 5"):
        ev.run_locomo(engine, *args, categories=[6])
    with pytest.raises(InputError, match="use --limit for category 5"):
        ev.run_locomo(engine, *args, categories=[5], sample=10)
    assert engine.calls == []
    # A run folder remembers them: a rerun that asks other questions is refused.
    asked(categories=[5], run_dir=tmp_path / "r")
    with pytest.raises(InputError, match="categories"):
        asked(run_dir=tmp_path / "r")
    # A folder made before the option asked every category: it goes on without it, and
    # refuses it.
    asked(run_dir=tmp_path / "old")
    kept = tmp_path / "old" / "settings.json"
    kept.write_text(json.dumps({k: v for k, v in json.loads(kept.read_text()).items()
                                if k != "categories"}))  # fmt: skip
    assert asked(run_dir=tmp_path / "old")[0] == [4, 4, 4, 5]
    with pytest.raises(InputError, match="categories None there"):
        asked(categories=[4], run_dir=tmp_path / "old")


def test_a_summary_kind_it_does_not_know_is_refused_before_any_work(tmp_path):
    engine = FakeEngine(reader)
    with pytest.raises(InputError, match="summary is one of model, extractive, not 'modle'"):
        ev.run_locomo(engine, write_dataset(tmp_path), ["conv-1"], 2200, 120, summary="modle")
    assert engine.calls == []
    # A chat's own settings refuse it too: any word but "model" would have read as extractive.
    with pytest.raises(InputError, match="summary is one of"):
        ChatSettings(summary="modle")


@pytest.mark.skipif(not (LOCOMO / "qa").is_dir(), reason="LoCoMo data not present")
def test_categories_in_the_real_files_are_what_the_eval_says():
    evidence: dict[int, list[int]] = {}
    for path in (LOCOMO / "qa").glob("*.qa.json"):
        for q in json.loads(path.read_text())["qa"]:
            evidence.setdefault(q["category"], []).append(len(q["evidence"]))
            assert ("adversarial_answer" in q) == (q["category"] == 5) or "answer" in q
    multi = {c: sum(n > 1 for n in v) / len(v) for c, v in evidence.items()}
    assert set(evidence) == set(ev.CATEGORIES)
    assert multi[1] > 0.9 and multi[4] < 0.1  # multi-hop vs single-hop


@pytest.mark.e2e
def test_cli_eval_locomo_on_the_tiny_model(tmp_path):
    data = write_dataset(tmp_path / "locomo", sessions=2, chatter=2)
    out = cli(
        "eval", "locomo", "--data", str(data), "--limit", "2", "--context-tokens", "1024",
        "-M", "tiny",
        "--json",
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert list(report["per_conversation"]) == ["conv-1"]
    assert all(report[c]["f1"]["overall"]["n"] == 2 for c in ev.CONFIGS)
    (run,) = history(kind="eval")
    assert set(run.results) >= set(ev.CONFIGS)
    out = cli(
        "eval", "locomo", "--data", str(data), "--limit", "2", "--context-tokens", "1024",
        "-M", "tiny",
        "--no-answers",
    )  # fmt: skip
    assert "What reached the prompt" in out.stdout and "evidence" in out.stdout
    assert "LoCoMo F1" not in out.stdout
    newest = history(kind="eval")[0]
    assert newest.results["settings"]["answers"] is False
    assert newest.results["oracle"]["evidence_in_prompt"]["overall"]["mean"] == 1.0
    out = cli(
        "eval", "locomo", "--data", str(data), "--limit", "2", "--context-tokens", "1024",
        "-M", "tiny", "--conversation-per-session", "--no-answers",
    )  # fmt: skip
    assert "facts" in out.stdout and "window" not in out.stdout  # its own configurations
    assert "2 conversations" in out.stderr
    newest = history(kind="eval")[0]
    assert newest.results["configs"] == list(ev.PER_SESSION_CONFIGS)
    assert newest.results["recall"]["evidence_in_prompt"]["overall"]["mean"] == 1.0


def extracting_reader(prompt: str) -> str:
    """`reader` that also reads the trips in facts, and as the fact extractor, the trip of a
    message that tells one."""
    if "durable facts about the user" in prompt:
        trip = re.search(r"went to (\w+) with my friend (\w+)", prompt)
        return f"The user went to {trip.group(1)} with {trip.group(2)}." if trip else "NONE"
    asked = re.search(r"Question: Where did Jon go with (\w+)\?", prompt)
    told = asked and re.findall(rf"went to (\w+) with (?:my friend )?{asked.group(1)}", prompt)
    return told[-1] if told else reader(prompt)


def test_each_session_its_own_conversation_and_the_questions_in_a_new_one(tmp_path, capsys):
    data = write_dataset(tmp_path, sessions=4, chatter=3, coda=" It was the best trip all year.")
    engine = FakeEngine(extracting_reader)
    result = ev.run_locomo(engine, data, ["conv-1"], 2200, 120, per_session=True).to_dict()
    assert result["configs"] == list(ev.PER_SESSION_CONFIGS)
    assert result["settings"]["mode"] == "conversation_per_session"
    assert result["settings"]["facts"] is True  # extraction is on, as in a chat
    layers = result["layers"]["conv-1"]
    assert layers["conversations"] == 4 and layers["facts"]["kept"] == 4, layers
    # Scripts written before "turns" read "messages": still there, with the same figures.
    assert layers["messages"] == layers["turns"] == 32
    assert layers["facts"]["per_100_messages"] == layers["facts"]["per_100_turns"]
    reached = {c: result[c]["evidence_in_prompt"]["overall"]["mean"] for c in result["configs"]}
    # A new chat: no turn of the log is in it, unless recall brings it from the sessions.
    assert reached == {"no_memory": 0.0, "facts": 0.0, "recall": 1.0, "oracle": 1.0}
    answered = {c: result[c]["answer_in_prompt"]["overall"]["mean"] for c in result["configs"]}
    assert answered["facts"] == 1.0 and answered["no_memory"] == 0.0  # the facts tell the trips
    assert result["facts_in_prompt_mean"] == 4 and result["facts_with_answer_word_mean"] == 1
    f1 = {c: result[c]["f1"]["overall"]["mean"] for c in result["configs"]}
    assert f1["no_memory"] == 0.0 and f1["recall"] == 1.0 and f1["oracle"] == 1.0
    assert result["recall_vs_facts"]["n"] == 4 and result["facts_vs_no_memory"]["mean"] > 0
    # Every question asks about Jon, the person: the facts' figure about them is the whole one.
    assert result["by_subject"] == {
        "user": {"questions": 4}
        | {k: result[k] for k in ("facts_vs_no_memory", "recall_vs_facts", "oracle_vs_no_memory")}
    }
    eval_cli._tables(result, "conv-1")  # the report `mlxmem eval locomo` prints
    gain = result["facts_vs_no_memory"]["mean"]
    assert (
        f"questions about the person (4): F1 facts - no_memory {gain:+.3f}"
        in capsys.readouterr().err
    )
    items = result["conversations"][0]["items"]
    assert all(i["recall"]["evidence_recalled"] == 1 for i in items if i["category"] == 4)
    # The questions were asked in a conversation that was never logged, and every session
    # was replayed on its own slot.
    slots = {c.slot for c in engine.calls}
    assert {f"session {n:02d}/chat" for n in range(1, 5)} <= slots
    assert "questions/chat" not in slots


def test_a_question_is_about_the_speakers_it_names_as_whole_words():
    conv = ev.LocomoConversation("conv-1", "Jon", "Gina", [], [])
    assert ev.subject(conv, "Where did Jon go with Ana?") == "user"
    assert ev.subject(conv, "What is Gina's dog called?") == "other"
    assert ev.subject(conv, "When did Jon and Gina meet?") == "both"
    assert ev.subject(conv, "Where did Jonathan go?") == "neither"  # a name inside another


def test_per_session_without_answers_measures_the_prompts_only(tmp_path):
    data = write_dataset(tmp_path, sessions=2, chatter=2)
    engine = FakeEngine(extracting_reader)
    result = ev.run_locomo(
        engine, data, ["conv-1"], 2200, 120, per_session=True, answers=False
    ).to_dict()
    assert result["recall"]["evidence_in_prompt"]["overall"]["mean"] == 1.0
    assert result["recall"]["f1"]["overall"]["n"] == 0
    assert not [c for c in engine.calls if c.slot.startswith("probe/")]


def test_default_data_dir_is_the_corpus_beside_the_repository(tmp_path, monkeypatch):
    """With no $MLXMEM_LOCOMO and a working directory elsewhere, LoCoMo is found in
    shared/corpora/locomo beside the clone that holds the package."""
    from mlxmem.eval.locomo import data

    clone = tmp_path / "work" / "mlxmem"
    module = clone / "mlxmem" / "eval" / "locomo" / "data.py"
    corpus = tmp_path / "work" / "shared" / "corpora" / "locomo"
    corpus.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere" / "cwd"
    elsewhere.mkdir(parents=True)
    monkeypatch.delenv(data.DATA_ENV, raising=False)
    monkeypatch.setattr(data, "__file__", str(module))
    monkeypatch.chdir(elsewhere)
    assert data.default_data_dir() == corpus
