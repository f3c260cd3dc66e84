"""`mlxmem eval facts --updates`: labelled pairs of a LoCoMo conversation's observations of the
user (ids only) resolved to texts at run time and put through the replacement check a chat
runs, on a tiny LoCoMo-shaped conversation written by the test (the real data is never copied)
with the fake engine; and the shipped labels checked against the real development set where
../shared holds it."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import cli
from test_corpus_not_copied import quoting, spans, tracked_files

from mlxmem.errors import InputError
from mlxmem.eval import facts as fe
from mlxmem.testing import FakeEngine

LOCOMO = Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / "locomo"
S1, S2, S10 = "session_1_observation", "session_2_observation", "session_10_observation"
# Session 10 comes first in the file: the order of the sessions is their number's.
OBSERVATIONS = {
    S10: {
        "Ana": [
            ["Ana went on her trip to Chile and visited her brother Tomas.", "D10:1"],
            ["Ana's kitten Pepper sleeps in the garden all afternoon.", "D10:3"],
        ],
    },
    S1: {
        "Ana": [
            ["Ana works as a nurse at the city hospital.", "D1:1"],
            ["Ana has a grey kitten called Pepper.", "D1:3"],
            ["Ana is planning a trip to Chile in March.", "D1:5"],
        ],
        "Ben": [["Ben paints landscapes on weekends.", "D1:2"]],
    },
    S2: {
        "Ana": [
            ["Ana often calls her brother Tomas in Chile.", "D2:1"],
            ["Ana quit the hospital and now works as a teacher.", "D2:3"],
        ],
        "Ben": [["Ben quit his job at the bank.", "D2:2"]],
    },
}
LABELS = [
    {"conversation": "conv-1", "earlier": [S1, 0], "later": [S2, 1], "kind": "job",
     "update": True},
    {"conversation": "conv-1", "earlier": [S1, 2], "later": [S10, 0], "kind": "plan_done",
     "update": True},
    {"conversation": "conv-1", "earlier": [S1, 1], "later": [S10, 1], "kind": "pet",
     "update": False},
    {"conversation": "conv-1", "earlier": [S2, 0], "later": [S10, 0], "kind": "family",
     "update": False},
]  # fmt: skip


def write_dataset(root: Path) -> Path:
    """A LoCoMo-shaped folder: one conversation whose qa file holds the observations."""
    (root / "qa").mkdir(parents=True)
    turns = [{"role": "user", "text": "Hello there.", "session": 1, "id": "D1:1",
              "session_time": "10:00 am on 1 May, 2023"}]  # fmt: skip
    (root / "conv-1.jsonl").write_text(json.dumps(turns[0]) + "\n")
    qa = {"user": "Ana", "assistant": "Ben", "qa": [], "observation": OBSERVATIONS}
    (root / "qa" / "conv-1.qa.json").write_text(json.dumps(qa))
    return root


def write_labels(path: Path, pairs: list[dict] = LABELS) -> Path:
    path.write_text(json.dumps({"about": "made up for the test", "pairs": pairs}))
    return path


def judge(no: set[tuple[str, str]]):
    """A fake model for the replacement prompt: NO (out of date) where the old fact holds the
    first word and the new fact the second, else YES."""

    def responder(prompt: str) -> str:
        found = re.search(r"Old fact:\s*(.*?)\s*New fact:\s*(.*?)\s*Is the old fact", prompt, re.S)
        if found is None:
            return "NONE"
        old, new = found.groups()
        return "NO" if any(a in old and b in new for a, b in no) else "YES"

    return responder


def test_ids_resolve_to_the_users_observations_in_session_order(tmp_path):
    data = write_dataset(tmp_path / "locomo")
    name, texts = fe.user_observations(data, "conv-1")
    assert name == "Ana"
    assert list(texts) == [(S1, 0), (S1, 1), (S1, 2), (S2, 0), (S2, 1), (S10, 0), (S10, 1)]
    pairs = fe.load_update_pairs(write_labels(tmp_path / "labels.json"))
    assert pairs[0] == fe.UpdatePair("conv-1", (S1, 0), (S2, 1), "job", True)
    assert fe.resolve_pair(data, pairs[0]) == (
        "Ana works as a nurse at the city hospital.",
        "Ana quit the hospital and now works as a teacher.",
    )
    # The index counts the user's observations only: Ben's one in session 2 is not [S2, 1].
    missing = fe.UpdatePair("conv-1", (S1, 0), (S2, 2), "job", True)
    with pytest.raises(InputError, match="no observation session_2_observation"):
        fe.resolve_pair(data, missing)
    with pytest.raises(InputError, match="no qa file"):
        fe.resolve_pair(data, fe.UpdatePair("conv-9", (S1, 0), (S2, 1), "job", True))


def test_a_labels_file_of_another_shape_is_refused(tmp_path):
    with pytest.raises(InputError, match="no labelled pairs"):
        fe.load_update_pairs(tmp_path / "absent.json")
    bad = write_labels(tmp_path / "bad.json", [{"conversation": "conv-1", "earlier": [S1]}])
    with pytest.raises(InputError, match="not a list of labelled pairs"):
        fe.load_update_pairs(bad)


def test_an_observation_is_held_as_an_automatic_fact_about_the_user():
    assert fe.as_fact("Ana's brother Tomas lives in Chile.", "Ana") == (
        "The user's brother Tomas lives in Chile."
    )
    assert fe.as_fact("Ana quit the hospital.", "Ana Lopez") == "The user quit the hospital."
    assert fe.as_fact("Trips with Ana are fun.", "Ana") == "Trips with the user are fun."
    assert fe.as_fact("Banana bread is Ana’s thing.", "Ana") == "Banana bread is the user's thing."


def test_the_store_holds_the_earlier_fact_and_the_ones_just_before_the_new_one(
    tmp_path, monkeypatch
):
    _, texts = fe.user_observations(write_dataset(tmp_path / "locomo"), "conv-1")
    order = list(texts)
    pairs = fe.load_update_pairs(write_labels(tmp_path / "labels.json"))
    monkeypatch.setattr(fe, "UPDATE_NEIGHBOURS", 2)
    # The trip's fact and the two just before the trip's end, oldest first.
    assert fe.held_before(pairs[1], order, pairs) == [(S1, 2), (S2, 0), (S2, 1)]
    # The job's fact and the two just before the new job; nothing after it.
    assert fe.held_before(pairs[0], order, pairs) == [(S1, 0), (S1, 2), (S2, 0)]
    # Another update pair that the same new fact ends is not held beside this one: both would
    # be right answers.
    also = fe.UpdatePair("conv-1", (S2, 0), (S10, 0), "family", True)
    assert fe.held_before(pairs[1], order, [*pairs, also]) == [(S1, 1), (S1, 2), (S2, 1)]
    backwards = fe.UpdatePair("conv-1", (S2, 1), (S1, 0), "job", True)
    with pytest.raises(InputError, match="does not come first"):
        fe.held_before(backwards, order, pairs)


def test_updates_caught_and_wrong_replacements_are_scored(tmp_path):
    data = write_dataset(tmp_path / "locomo")
    pairs = fe.load_update_pairs(write_labels(tmp_path / "labels.json"))
    # The job's update is caught; the trip's end replaces the brother's fact instead of the
    # trip's plan (a wrong fact); the kitten's control is kept; the brother's control is
    # replaced by the trip (the same wrong answer, seen from the control's side).
    model = judge({("nurse", "teacher"), ("brother", "trip")})
    run = fe.run_update_eval(FakeEngine(model), data, pairs, budget=2048)
    outcomes = [(tuple(r["earlier"]), r["outcome"]) for r in run["pairs"]]
    assert outcomes == [
        ((S1, 0), "caught"),
        ((S1, 2), "wrong_fact"),
        ((S1, 1), "kept"),
        ((S2, 0), "replaced"),
    ]
    pooled = run["pooled"]
    counts = (pooled["updates"], pooled["controls"], pooled["caught"], pooled["wrong"])
    assert counts == (2, 2, 1, 2)
    assert pooled["caught_share"] == 0.5 and pooled["wrong_share"] == 0.5
    assert pooled["controls_replaced"] == 1 and pooled["controls_replaced_share"] == 0.5
    assert pooled["caught_ci"] == fe.wilson(1, 2) and pooled["wrong_ci"] == fe.wilson(2, 4)
    assert pooled["gate_recall"] == 1.0  # both old facts were asked about
    assert run["conversations"]["conv-1"] == pooled
    assert run["met"] == {"caught": False, "wrong": False}
    trip = run["pairs"][1]
    assert trip["replaced"] == [S2, 0] and [S1, 2] in trip["candidates"]
    # Every observation of the user before the trip's end, oldest first (five: the old fact
    # and UPDATE_NEIGHBOURS more).
    assert trip["held"] == [[S1, 0], [S1, 1], [S1, 2], [S2, 0], [S2, 1]]
    # Ids and outcomes only: no text of the data in what is reported.
    report = json.dumps(run)
    for by_speaker in OBSERVATIONS.values():
        for items in by_speaker.values():
            for text, _ in items:
                assert text not in report and fe.as_fact(text, "Ana") not in report


def test_a_model_that_never_says_no_misses_every_update_and_replaces_nothing(tmp_path):
    data = write_dataset(tmp_path / "locomo")
    pairs = fe.load_update_pairs(write_labels(tmp_path / "labels.json"))
    run = fe.run_update_eval(FakeEngine(judge(set())), data, pairs, budget=2048)
    assert Counter(r["outcome"] for r in run["pairs"]) == {"missed": 2, "kept": 2}
    assert run["pooled"]["caught_share"] == 0.0 and run["pooled"]["wrong_share"] == 0.0
    assert run["met"] == {"caught": False, "wrong": True}


def test_a_new_fact_the_store_already_holds_is_dropped_before_any_check(tmp_path):
    data = write_dataset(tmp_path / "locomo")
    same = {"conversation": "conv-1", "earlier": [S1, 1], "later": [S10, 1], "kind": "pet",
            "update": True}  # fmt: skip
    observations = json.loads((data / "qa" / "conv-1.qa.json").read_text())
    observations["observation"][S10]["Ana"][1][0] = "Ana has a grey kitten called Pepper!"
    (data / "qa" / "conv-1.qa.json").write_text(json.dumps(observations))
    pairs = fe.load_update_pairs(write_labels(tmp_path / "labels.json", [same]))
    engine = FakeEngine(judge({("kitten", "kitten")}))
    (row,) = fe.run_update_eval(engine, data, pairs, budget=2048)["pairs"]
    assert (row["duplicate"], row["outcome"], row["candidates"]) == (True, "missed", [])
    assert not engine.calls


def test_wilson_intervals():
    assert fe.wilson(0, 0) is None
    assert fe.wilson(8, 10) == pytest.approx([0.4902, 0.9433], abs=1e-4)
    assert fe.wilson(0, 10) == pytest.approx([0.0, 0.2775], abs=1e-4)
    assert fe.wilson(10, 10) == pytest.approx([0.7225, 1.0], abs=1e-4)


def test_cli_refuses_updates_with_messages_and_pairs_without_updates(tmp_path):
    data = write_dataset(tmp_path / "locomo")
    labels = str(write_labels(tmp_path / "labels.json"))
    out = cli("eval", "facts", "--updates", "--messages", "3", "--data", str(data), code=1)
    assert "--messages" in out.output and "--updates" in out.output
    out = cli("eval", "facts", "--pairs", labels, "--data", str(data), code=1)
    assert "add --updates" in out.output
    out = cli("eval", "facts", "--updates", "--pairs", labels, "--conversation", "conv-7",
              "--data", str(data), code=1)  # fmt: skip
    assert "no labelled pairs for conv-7" in out.output


@pytest.mark.e2e
def test_cli_eval_facts_updates_on_the_tiny_model(tmp_path):
    data = write_dataset(tmp_path / "locomo")
    labels = str(write_labels(tmp_path / "labels.json"))
    args = ("eval", "facts", "--updates", "--pairs", labels, "--data", str(data), "-M", "tiny")
    report = json.loads(cli(*args, "--json").stdout)
    assert report["pooled"]["pairs"] == 4 and len(report["pairs"]) == 4
    assert set(report["conversations"]) == {"conv-1"}
    assert "Fact updates" in cli(*args).stdout


# The labels shipped for the development set.


def test_the_shipped_labels_are_ids_of_the_development_set():
    pairs = fe.load_update_pairs(fe.UPDATES_FILE)
    dev = {"conv-26", "conv-30", "conv-41", "conv-42", "conv-43"}
    assert {p.conversation for p in pairs} == dev
    assert sum(p.update for p in pairs) >= 15 and sum(not p.update for p in pairs) >= 15
    keys = [(p.conversation, p.earlier, p.later) for p in pairs]
    assert len(keys) == len(set(keys))
    # At most one update pair per earlier observation.
    earlier = Counter((p.conversation, p.earlier) for p in pairs if p.update)
    assert max(earlier.values()) == 1
    text = fe.UPDATES_FILE.read_text()
    assert "observation" in text and len(text) < 20_000


@pytest.mark.skipif(not LOCOMO.is_dir(), reason="LoCoMo data not present")
def test_the_shipped_labels_resolve_on_the_real_data():
    pairs = fe.load_update_pairs(fe.UPDATES_FILE)
    users = {cid: fe.user_observations(LOCOMO, cid) for cid in {p.conversation for p in pairs}}
    for pair in pairs:
        earlier, later = fe.resolve_pair(LOCOMO, pair)
        assert earlier and later and earlier != later
        _, texts = users[pair.conversation]
        held = fe.held_before(pair, list(texts), pairs)
        assert pair.earlier in held and pair.later not in held


@pytest.mark.skipif(not LOCOMO.is_dir(), reason="LoCoMo data not present")
@pytest.mark.skipif(not (Path(__file__).parents[1] / ".git").exists(), reason="no git checkout")
def test_no_tracked_file_quotes_an_observation():
    """The observations are LoCoMo's text too (CC BY-NC): the labels and the results hold ids
    and outcomes only."""
    found: set[str] = set()
    for path in (LOCOMO / "qa").glob("*.qa.json"):
        for by_speaker in json.loads(path.read_text()).get("observation", {}).values():
            for items in by_speaker.values():
                for item in items:
                    found |= spans(item[0])
    assert len(found) > 5_000
    results = fe.UPDATES_FILE.parents[1] / "results"
    mine = [fe.UPDATES_FILE, *results.glob("eval-facts-updates-*.json")]
    assert set(mine) <= set(tracked_files()) | {fe.UPDATES_FILE}
    assert not quoting(mine, found)
