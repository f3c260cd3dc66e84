"""`mlxmem eval facts`: kept facts scored against a LoCoMo conversation's observations, on a
small made-up conversation in LoCoMo's format (the real data is never copied), with the fake
engine for the logic and the tiny model end to end; and the matcher on the real development
set's observations where ../shared holds them."""

import json
from pathlib import Path

import pytest
from conftest import cli

from mlxmem.eval import facts as fe
from mlxmem.eval.locomo import load_conversation
from mlxmem.testing import FakeEngine

LOCOMO = Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / "locomo"
USER_LINES = [
    "I just adopted a grey kitten called Pepper from the animal shelter downtown yesterday!",
    "Work has been busy lately: since March I work as a nurse at the city hospital downtown.",
    "ok",
    "My brother Tomas lives in Chile and we only see each other at Christmas these days.",
    "A painting class on weekends sounds lovely, I should try one of those someday.",
]
OBSERVATIONS = {
    "session_1_observation": {
        "Ana": [
            ["Ana adopted a grey kitten called Pepper from an animal shelter.", "D1:1"],
            ["Ana started a new job as a nurse at the city hospital in March.", "D1:3"],
            ["Ana's brother Tomas lives in Chile.", "D1:7"],
        ],
        "Ben": [["Ben takes a painting class on weekends.", "D1:8"]],
    }
}


def write_conversation(root: Path) -> Path:
    turns = []
    for i, text in enumerate(USER_LINES):
        turns.append({"role": "user", "text": text, "id": f"D1:{2 * i + 1}"})
        turns.append({"role": "assistant", "text": "Tell me more, Ana!", "id": f"D1:{2 * i + 2}"})
    for turn in turns:
        turn |= {"session": 1, "session_time": "10:00 am on 1 May, 2023"}
    (root / "qa").mkdir(parents=True)
    (root / "conv-1.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
    qa = {"user": "Ana", "assistant": "Ben", "qa": [], "observation": OBSERVATIONS}
    (root / "qa" / "conv-1.qa.json").write_text(json.dumps(qa))
    return root


# What the fake model answers to each message (it sees the extraction prompt, message last).
ANSWERS = {
    "kitten": "The user adopted a grey kitten called Pepper.",
    "nurse": "The user is called Ben and works as a nurse.",  # the one talked to, as the user
    "Chile": "The user celebrates Christmas every year.",  # no observation says it
    "painting": "The user takes a painting class on weekends.",  # Ben's, not Ana's
}


def responder(prompt: str) -> str:
    message = prompt.rsplit("user", 1)[-1]
    return next((a for key, a in ANSWERS.items() if key in message), "NONE")


def test_each_kept_fact_is_labeled_against_the_observations(tmp_path):
    data = write_conversation(tmp_path / "locomo")
    report = fe.run_fact_eval(FakeEngine(responder), data, "conv-1", budget=2048)
    labels = {f["fact"]: f["label"] for f in report["facts"]}
    assert labels == {
        "The user adopted a grey kitten called Pepper.": "precise",
        "The user is called Ben and works as a nurse.": "attribution_error",
        "The user celebrates Christmas every year.": "unsupported",
        "The user takes a painting class on weekends.": "attribution_error",
    }
    assert (report["precision"], report["attribution_errors"], report["unsupported"]) == (
        0.25,
        0.5,
        0.25,
    )
    # Ana's three observations are on messages sent; the kitten fact covers one of them.
    assert (report["user_observations"], report["covered_observations"]) == (3, 1)
    assert report["coverage"] == pytest.approx(1 / 3)
    # The two left uncovered, by turn: not the kitten's.
    kitten = next(f["turn"] for f in report["facts"] if "kitten" in f["fact"])
    assert len(report["uncovered_turns"]) == 2 and kitten not in report["uncovered_turns"]
    # Five messages: four kept, one too short to ask ("ok").
    assert report["messages"] == 5 and report["kept"] == 4
    assert report["per_100_messages"] == {"kept": 80.0, "rejected": {"short": 20.0}}


def test_fewer_messages_score_only_the_observations_they_reach(tmp_path):
    data = write_conversation(tmp_path / "locomo")
    report = fe.run_fact_eval(FakeEngine(responder), data, "conv-1", budget=2048, messages=1)
    assert report["messages"] == 1 and report["kept"] == 1
    assert (report["user_observations"], report["coverage"]) == (1, 1.0)
    pooled = fe.pooled([report, report])
    assert (pooled["kept"], pooled["precision"], pooled["kept_per_100_messages"]) == (2, 1.0, 100.0)


def test_a_relation_named_as_the_other_speaker_is_an_attribution_error():
    assert fe.makes_user_the_other("The user's sister is called Melanie.", "Melanie")
    assert fe.makes_user_the_other("The user's name is Melanie.", "Melanie")
    assert not fe.makes_user_the_other("The user painted with Melanie.", "Melanie")
    assert fe.makes_user_the_other("Melanie is the user's sister.", "Melanie")
    assert fe.makes_user_the_other("Mel is the user.", "Melanie")
    assert not fe.makes_user_the_other("Melanie is a painter the user admires.", "Melanie")


@pytest.mark.e2e
def test_cli_eval_facts_on_the_tiny_model(tmp_path):
    data = write_conversation(tmp_path / "locomo")
    out = cli("eval", "facts", "--data", str(data), "-M", "tiny", "--json")
    report = json.loads(out.stdout)
    (run,) = report["conversations"]
    assert run["messages"] == 5 and sum(run["outcomes"].values()) == 5
    for key in ("precision", "attribution_errors", "unsupported", "coverage", "kept"):
        assert key in run and key in report["pooled"]


@pytest.mark.skipif(not LOCOMO.is_dir(), reason="LoCoMo data not present")
def test_the_matcher_gives_each_restated_observation_to_its_speaker():
    """Every development observation restated as a fact about "the user" goes to its speaker
    (measured: 632 of 632 of the user's, 572 of 578 of the other's; the others match a user's
    observation as closely)."""
    right = total = 0
    for cid in ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43"):
        conv = load_conversation(LOCOMO, cid)
        names = (conv.user_name, conv.assistant_name)
        observations = fe.load_observations(LOCOMO, cid)
        for obs in observations:
            own = names[0] if obs.speaker == "user" else names[1]
            fact = obs.text.replace(own, "The user")
            label = fe.score_fact(fact, obs.turn, observations, names).label
            right += label == ("precise" if obs.speaker == "user" else "attribution_error")
            total += 1
    assert total > 1000 and right / total >= 0.99


def test_a_short_form_of_the_other_speakers_name_counts_too():
    assert fe.makes_user_the_other("The user's sister is called Mel.", "Melanie")
    assert not fe.makes_user_the_other("The user is melancholic.", "Melanie")


def test_the_users_life_under_the_other_speakers_name_is_an_attribution_error():
    # John told Maria that he does kickboxing, and the fact names her.
    observations = [
        fe.Observation("user", "John does kickboxing to keep fit these days.", "D1:4", 1),
        fe.Observation("other", "Maria started doing aerial yoga.", "D1:3", 1),
    ]
    names = ("John", "Maria")
    assert fe.other_as_subject("Maria is doing kickboxing.", "Maria")
    assert fe.other_as_subject("Mar's kickboxing is going well.", "Maria")
    assert not fe.other_as_subject("The user is doing kickboxing with Maria.", "Maria")
    assert not fe.other_as_subject("Marathons are the user's passion.", "Maria")
    label = fe.score_fact("Maria is doing kickboxing.", "D1:4", observations, names).label
    assert label == "attribution_error"
    label = fe.score_fact("The user is doing kickboxing.", "D1:4", observations, names).label
    assert label == "precise"


def test_the_answers_a_filter_refused_are_reported_with_their_filter(tmp_path):
    data = write_conversation(tmp_path / "locomo")
    answers = ANSWERS | {"painting": "Ben takes a painting class."}  # not about the user

    def refusing(prompt: str) -> str:
        message = prompt.rsplit("user", 1)[-1]
        return next((a for key, a in answers.items() if key in message), "NONE")

    report = fe.run_fact_eval(FakeEngine(refusing), data, "conv-1", budget=2048)
    assert report["rejected"] == [
        {"answer": "Ben takes a painting class.", "turn": "D1:9", "outcome": "not_about_user"}
    ]
    assert report["kept"] == 3 and report["outcomes"]["not_about_user"] == 1
