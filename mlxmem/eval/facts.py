"""`mlxmem eval facts`: the facts extraction keeps from a LoCoMo conversation's user messages,
scored against the conversation's own gold facts, its `observation`s (per session and speaker,
short statements with the turn each comes from), with no judge model.

Each kept fact is matched, deterministically, to the observations of the sessions sent: a fact
matches an observation when the observation holds at least MATCH_OVERLAP of the fact's content
words (Snowball stems, stopwords out, as recall's index reads them; "user" and the speakers'
names out, since a fact says "the user" where an observation says "Caroline"). A kept fact is
- precise: it matches an observation of the user (speaker_a), at least as closely as any of
  the other speaker's;
- an attribution error: it matches an observation of the other speaker more closely, or it
  makes the user the other speaker ("The user is called Melanie", "The user's sister is
  Melanie", or "Maria is doing kickboxing" where the user, John, is);
- unsupported: it matches nothing.
Coverage is the share of the user's observations on the messages sent that some kept fact
matches as its closest one.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from mlxmem.engine import Engine
from mlxmem.errors import InputError
from mlxmem.eval.locomo import LocomoConversation, load_conversation
from mlxmem.memory.extraction import FactExtractor
from mlxmem.memory.terms import terms

# A fact matches an observation when the observation holds this share of the fact's content
# words. Calibrated by hand on the 75 facts Qwen2.5-Coder-1.5B kept from conv-30's first 80
# and conv-26's first 60 user messages, each labeled precise, attribution error or unsupported
# by reading the observations: chosen on one conversation, 0.35 agrees best on the other too
# (conv-30: 35 of 44 labels, against 30 at 0.5; conv-26: 26 of 31, as at 0.4 to 0.5).
MATCH_OVERLAP = 0.35
LABELS = ("precise", "attribution_error", "unsupported")


@dataclass(frozen=True)
class Observation:
    speaker: str  # "user" (speaker_a) or "other" (speaker_b)
    text: str
    turn: str  # the turn it comes from, e.g. "D1:3"
    session: int


@dataclass(frozen=True)
class ScoredFact:
    fact: str
    turn: str  # the message it was extracted from
    label: str  # one of LABELS
    observation: str | None  # the best match: the observation that decided the label
    overlap: float


def load_observations(data: Path, conv_id: str) -> list[Observation]:
    """Every observation of the conversation, in session order."""
    qa = json.loads((data / "qa" / f"{conv_id}.qa.json").read_text())
    found = []
    for key, by_speaker in qa.get("observation", {}).items():
        session = int(re.sub(r"\D", "", key) or 0)
        for name, items in by_speaker.items():
            speaker = "user" if name == qa["user"] else "other"
            for item in items:
                text, turn = item[0], item[1]
                # A few observations cite several turns ("D8:6; D8:8"): the first places it.
                turn = str(turn).split(";")[0].strip() if not isinstance(turn, list) else turn[0]
                found.append(Observation(speaker, text, turn, session))
    return sorted(found, key=lambda o: o.session)


def content_words(text: str, names: Sequence[str]) -> set[str]:
    """A fact's or an observation's stems, less "user" and the speakers' names."""
    drop = {"user"} | {t for name in names for t in terms(name)}
    return set(terms(text)) - drop


def overlap(fact: set[str], observation: set[str]) -> float:
    """The share of the fact's content words that the observation holds."""
    return len(fact & observation) / len(fact) if fact else 0.0


def makes_user_the_other(fact: str, other: str) -> bool:
    """The fact gives the user the other speaker's name, or a relation to the user named as the
    other speaker ("The user's sister is called Melanie", or "Mel"; "Maria is the user's
    sister"): the person talked to, taken for someone in the user's life."""
    named = re.findall(
        r"\bthe user(?:'s [\w ]{1,30})? (?:is|was) (?:named |called )?(\w+)"
        r"|\bthe user(?:'s)? name is (\w+)"
        r"|^(\w+) is the user(?:'s [\w ]{1,30})?\W*$",
        fact.strip(),
        re.I,
    )
    return any(calls_by_name(n, other) for pair in named for n in pair)


def other_as_subject(fact: str, other: str) -> bool:
    """The fact's subject is the other speaker, by name or a short form of it ("Maria is
    doing kickboxing", "Mel's kids ...")."""
    match = re.match(r"(\w+)(?:'s)?\b", fact.strip())
    return match is not None and calls_by_name(match[1], other)


def calls_by_name(word: str, other: str) -> bool:
    """`word` is the other speaker's first name or a short form of it ("Mel" for Melanie), as
    the user calls them."""
    return len(word) >= 3 and other.split()[0].casefold().startswith(word.casefold())


def score_fact(
    fact: str, turn: str, observations: Sequence[Observation], names: tuple[str, str]
) -> ScoredFact:
    """Label one kept fact (see the module's docstring)."""
    words = content_words(fact, names)
    if makes_user_the_other(fact, names[1]):
        return ScoredFact(fact, turn, "attribution_error", None, 0.0)
    best: dict[str, tuple[float, str | None]] = {"user": (0.0, None), "other": (0.0, None)}
    for obs in observations:
        share = overlap(words, content_words(obs.text, names))
        if share > best[obs.speaker][0]:
            best[obs.speaker] = (share, obs.text)
    # The closer side decides: a fact about something both speakers did matches both, and is
    # the user's only if it reads more like the user's observation (a tie is the user's).
    if best["user"][0] >= MATCH_OVERLAP and best["user"][0] >= best["other"][0]:
        # The user's life under the other speaker's name is still given to the wrong person.
        label = "attribution_error" if other_as_subject(fact, names[1]) else "precise"
        return ScoredFact(fact, turn, label, best["user"][1], round(best["user"][0], 3))
    if best["other"][0] >= MATCH_OVERLAP:
        share, text = best["other"]
        return ScoredFact(fact, turn, "attribution_error", text, round(share, 3))
    share, text = max(best.values(), key=lambda b: b[0])
    return ScoredFact(fact, turn, "unsupported", text, round(share, 3))


def score_facts(
    kept: Sequence[tuple[str, str]],
    observations: Sequence[Observation],
    sent: Sequence[str],
    names: tuple[str, str],
) -> dict:
    """The figures for `kept` (fact, turn) facts extracted from the messages `sent` (turn ids):
    shares of each label, coverage of the user's observations on those messages, and each fact
    with its label and best match."""
    sessions = {_session(turn) for turn in sent}
    seen = [o for o in observations if o.session in sessions]
    scored = [score_fact(fact, turn, seen, names) for fact, turn in kept]
    sent_ids = set(sent)
    mine = [o for o in seen if o.speaker == "user" and o.turn in sent_ids]
    # Each fact covers one observation: its closest (the one from its own message on a tie,
    # else the first), so that a general fact ("likes Harry Potter") does not cover them all.
    covered = set()
    observed = [content_words(o.text, names) for o in mine]
    for fact, turn in kept:
        words = content_words(fact, names)
        ranked = [
            (overlap(words, w), o.turn == turn, -i)
            for i, (o, w) in enumerate(zip(mine, observed, strict=True))
        ]
        if ranked and (best := max(ranked))[0] >= MATCH_OVERLAP:
            covered.add(-best[2])
    counts = {label: sum(s.label == label for s in scored) for label in LABELS}
    n = len(scored)
    return {
        "kept": n,
        "precision": counts["precise"] / n if n else None,
        "attribution_errors": counts["attribution_error"] / n if n else None,
        "unsupported": counts["unsupported"] / n if n else None,
        "coverage": len(covered) / len(mine) if mine else None,
        "counts": counts,
        "user_observations": len(mine),
        "covered_observations": len(covered),
        "facts": [asdict(s) for s in scored],
    }


def _session(turn: str) -> int:
    """The session of a LoCoMo turn id: "D12:3" -> 12."""
    match = re.match(r"D(\d+):", turn)
    return int(match.group(1)) if match else 0


def run_fact_eval(
    engine: Engine,
    data: Path,
    conv_id: str,
    budget: int,
    messages: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Send the user's messages of a conversation (the first `messages`, or all) through
    extraction as a chat turn does, the facts kept so far as the known ones, and score what
    is kept. Per 100 messages: the facts kept and what each filter rejected."""
    conv: LocomoConversation = load_conversation(data, conv_id)
    observations = load_observations(data, conv_id)
    if not observations:
        raise InputError(f"{conv_id} has no observations in {data}/qa: nothing to score against")
    users = [t for t in conv.turns if t["role"] == "user"]
    if messages is not None:
        users = users[:messages]
    extractor = FactExtractor(engine, budget)
    kept: list[tuple[str, str]] = []
    rejected: list[dict[str, str]] = []  # the answers a filter refused, to check the filters
    outcomes: Counter[str] = Counter()
    for i, turn in enumerate(users, 1):
        look = extractor.extract(turn["text"], [f for f, _ in kept])
        outcomes[look.outcome] += 1
        if look.fact is not None:
            kept.append((look.fact, turn["id"]))
        elif look.answer is not None and look.outcome != "none":
            rejected.append(
                {"answer": look.answer.strip(), "turn": turn["id"], "outcome": look.outcome}
            )
        if progress is not None:
            progress(i, len(users))
    result = score_facts(
        kept, observations, [t["id"] for t in users], (conv.user_name, conv.assistant_name)
    )
    per_100 = 100 / len(users) if users else 0.0
    return {
        "conversation": conv_id,
        "messages": len(users),
        "match_overlap": MATCH_OVERLAP,
        **result,
        "per_100_messages": {
            "kept": round(result["kept"] * per_100, 2),
            "rejected": {
                k: round(v * per_100, 2) for k, v in sorted(outcomes.items()) if k != "kept"
            },
        },
        "outcomes": dict(outcomes),
        "rejected": rejected,
    }


def pooled(runs: Sequence[dict]) -> dict:
    """The figures over several conversations' runs: shares of all kept facts, and coverage
    of all user observations."""
    kept = sum(r["kept"] for r in runs)
    counts = {label: sum(r["counts"][label] for r in runs) for label in LABELS}
    mine = sum(r["user_observations"] for r in runs)
    messages = sum(r["messages"] for r in runs)
    return {
        "messages": messages,
        "kept": kept,
        "precision": counts["precise"] / kept if kept else None,
        "attribution_errors": counts["attribution_error"] / kept if kept else None,
        "unsupported": counts["unsupported"] / kept if kept else None,
        "coverage": sum(r["covered_observations"] for r in runs) / mine if mine else None,
        "kept_per_100_messages": round(100 * kept / messages, 2) if messages else None,
    }
