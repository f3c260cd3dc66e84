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

With --updates it measures replacement instead (issue 54): for each labelled pair of the user's
observations (benchmarks/scenarios/locomo-updates.json: ids only, the texts are read from the
data at run time), the earlier one is held as an automatic fact among the few observations of
the user just before the later one, the later one comes as the new fact, and the check a chat
runs (FactExtractor.replaces) says which fact, if any, it replaces: an update is caught when the
earlier fact is the one replaced; a replacement is wrong in a control pair, or of another fact.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from mlxmem.engine import Engine
from mlxmem.errors import InputError
from mlxmem.eval.locomo.data import LocomoConversation, load_conversation
from mlxmem.memory.extraction import FactExtractor, is_duplicate, replacement_candidates
from mlxmem.memory.tables.terms import terms

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
        # The turns of the user's observations no fact covers: where coverage is lost.
        "uncovered_turns": [o.turn for i, o in enumerate(mine) if i not in covered],
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


# Knowledge updates (issue 54). The labelled pairs live beside the other scenarios; a wheel
# without them is answered with a hint (--pairs).
UPDATES_FILE = (
    Path(__file__).resolve().parents[2] / "benchmarks" / "scenarios" / "locomo-updates.json"
)
# How many of the user's observations just before the new one the store holds beside the old
# fact: enough to give the lexical gate (REPLACE_CANDIDATES) other facts to choose among.
UPDATE_NEIGHBOURS = 4
# The goals: at least this share of updates caught, at most this share of pairs with a
# wrong replacement.
CAUGHT_GOAL = 0.8
WRONG_GOAL = 0.05
ObservationId = tuple[str, int]  # (session key, index in the user's list of that session)


@dataclass(frozen=True)
class UpdatePair:
    conversation: str
    earlier: ObservationId
    later: ObservationId
    kind: str
    update: bool  # True: the later makes the earlier out of date; False: a control


def load_update_pairs(path: Path) -> list[UpdatePair]:
    """The labelled pairs of a file shaped like benchmarks/scenarios/locomo-updates.json."""
    try:
        raw = json.loads(path.read_text())["pairs"]
        return [
            UpdatePair(
                str(p["conversation"]),
                (str(p["earlier"][0]), int(p["earlier"][1])),
                (str(p["later"][0]), int(p["later"][1])),
                str(p.get("kind", "")),
                bool(p["update"]),
            )
            for p in raw
        ]
    except FileNotFoundError:
        raise InputError(f"no labelled pairs at {path} (--pairs FILE names another)") from None
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise InputError(f"{path} is not a list of labelled pairs: {exc!r}") from None


def user_observations(data: Path, conv_id: str) -> tuple[str, dict[ObservationId, str]]:
    """The user's name (the qa file's "user") and their observations by id, in session order
    (session 2 before session 10) and, within a session, in the file's order."""
    path = data / "qa" / f"{conv_id}.qa.json"
    if not path.is_file():
        raise InputError(f"{conv_id} has no qa file in {data}: no observations to resolve")
    qa = json.loads(path.read_text())
    name = qa["user"]
    sessions = sorted(qa.get("observation", {}).items(), key=lambda kv: _session_number(kv[0]))
    found = {}
    for key, by_speaker in sessions:
        for i, item in enumerate(by_speaker.get(name, [])):
            found[(key, i)] = item[0]
    return name, found


def _session_number(key: str) -> int:
    """The number of a session key: session_12_observation is 12."""
    return int(re.sub(r"\D", "", key) or 0)


def resolve_pair(data: Path, pair: UpdatePair) -> tuple[str, str]:
    """The earlier and the later observation's texts, read from `data`."""
    _, texts = user_observations(data, pair.conversation)
    return _text(texts, pair, pair.earlier), _text(texts, pair, pair.later)


def _text(texts: dict[ObservationId, str], pair: UpdatePair, oid: ObservationId) -> str:
    if oid not in texts:
        raise InputError(
            f"{pair.conversation} has no observation {oid[0]}[{oid[1]}] of its user: "
            "the labels do not fit this data"
        )
    return texts[oid]


def as_fact(text: str, name: str) -> str:
    """An observation as the store holds an automatic fact: about "the user", not by name
    ("Jon's dance studio ..." -> "The user's dance studio ...")."""
    first = re.escape(name.split()[0])
    fact = re.sub(rf"\b{first}[’']s\b", "the user's", text)
    fact = re.sub(rf"\b{first}\b", "the user", fact)
    return fact[:1].upper() + fact[1:]


def held_before(
    pair: UpdatePair, order: Sequence[ObservationId], pairs: Sequence[UpdatePair]
) -> list[ObservationId]:
    """The facts the store holds when the later observation comes, oldest first: the earlier
    one and the UPDATE_NEIGHBOURS observations of the user just before the later one, less
    any that another update pair says the later one replaces (then two answers would be
    right)."""
    if order.index(pair.earlier) >= order.index(pair.later):
        raise InputError(f"{pair}: the earlier observation does not come first")
    also = {
        p.earlier
        for p in pairs
        if p.update and p.conversation == pair.conversation and p.later == pair.later
    }
    before = [o for o in order[: order.index(pair.later)] if o != pair.earlier and o not in also]
    held = {*before[len(before) - UPDATE_NEIGHBOURS :], pair.earlier}
    return [o for o in order if o in held]


def update_outcome(update: bool, replaced: ObservationId | None, earlier: ObservationId) -> str:
    """An update pair is "caught" (the earlier fact replaced), "missed" or "wrong_fact"
    (another replaced); a control is "kept", "replaced" (the earlier) or "replaced_other"."""
    if update:
        return "missed" if replaced is None else "caught" if replaced == earlier else "wrong_fact"
    return "kept" if replaced is None else "replaced" if replaced == earlier else "replaced_other"


WRONG_OUTCOMES = ("wrong_fact", "replaced", "replaced_other")


def check_pair(
    extractor: FactExtractor,
    pair: UpdatePair,
    name: str,
    texts: dict[ObservationId, str],
    pairs: Sequence[UpdatePair],
) -> dict:
    """Run the replacement check a chat runs on one pair; the row holds ids and outcomes only,
    never text. A new fact that the store already holds in other words (is_duplicate) is
    dropped before any check, as in a chat: nothing is replaced."""
    _text(texts, pair, pair.earlier)
    _text(texts, pair, pair.later)
    held = held_before(pair, list(texts), pairs)
    existing = [(i, as_fact(texts[o], name)) for i, o in enumerate(held, 1)]
    new = as_fact(texts[pair.later], name)
    duplicate = is_duplicate(new, [text for _, text in existing])
    candidates = [] if duplicate else replacement_candidates(new, existing)
    chosen = None if duplicate else extractor.replaces(new, existing)
    replaced = held[chosen - 1] if chosen is not None else None
    outcome = update_outcome(pair.update, replaced, pair.earlier)
    return {
        "conversation": pair.conversation,
        "earlier": list(pair.earlier),
        "later": list(pair.later),
        "kind": pair.kind,
        "update": pair.update,
        "held": [list(o) for o in held],
        "candidates": [list(held[i - 1]) for i, _ in candidates],
        "duplicate": duplicate,
        "replaced": list(replaced) if replaced is not None else None,
        "outcome": outcome,
    }


def wilson(k: int, n: int, z: float = 1.96) -> list[float] | None:
    """The 95% Wilson score interval of the share k/n (sound at small n and at 0 or n)."""
    if n == 0:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def score_updates(rows: Sequence[dict]) -> dict:
    """Caught: the share of update pairs whose earlier fact was the one replaced. Wrong: the
    share of all pairs with a wrong replacement (a control's fact, or another fact than the
    earlier one). Each with its Wilson interval; the gate's recall (update pairs whose earlier
    fact the lexical gate passed on to the model) says where a miss comes from."""
    updates = [r for r in rows if r["update"]]
    controls = [r for r in rows if not r["update"]]
    outcomes = Counter(r["outcome"] for r in rows)
    caught = outcomes["caught"]
    wrong = sum(outcomes[o] for o in WRONG_OUTCOMES)
    gated = sum(r["earlier"] in r["candidates"] for r in updates)
    return {
        "pairs": len(rows),
        "updates": len(updates),
        "controls": len(controls),
        "caught": caught,
        "caught_share": caught / len(updates) if updates else None,
        "caught_ci": wilson(caught, len(updates)),
        "wrong": wrong,
        "wrong_share": wrong / len(rows) if rows else None,
        "wrong_ci": wilson(wrong, len(rows)),
        "controls_replaced": outcomes["replaced"] + outcomes["replaced_other"],
        "controls_replaced_share": (
            (outcomes["replaced"] + outcomes["replaced_other"]) / len(controls)
            if controls
            else None
        ),
        "gate_recall": gated / len(updates) if updates else None,
        "duplicates": sum(r["duplicate"] for r in rows),
        "outcomes": dict(sorted(outcomes.items())),
    }


def run_update_eval(
    engine: Engine,
    data: Path,
    pairs: Sequence[UpdatePair],
    budget: int,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict:
    """Every pair through the replacement check, scored per conversation and pooled."""
    extractor = FactExtractor(engine, budget)
    users = {
        cid: user_observations(data, cid) for cid in dict.fromkeys(p.conversation for p in pairs)
    }
    rows = []
    for i, pair in enumerate(pairs, 1):
        name, texts = users[pair.conversation]
        rows.append(check_pair(extractor, pair, name, texts, pairs))
        if progress is not None:
            progress(pair.conversation, i, len(pairs))
    pooled_score = score_updates(rows)
    return {
        "neighbours": UPDATE_NEIGHBOURS,
        "goal": {"caught_at_least": CAUGHT_GOAL, "wrong_at_most": WRONG_GOAL},
        "met": {
            "caught": (pooled_score["caught_share"] or 0.0) >= CAUGHT_GOAL,
            "wrong": (pooled_score["wrong_share"] or 0.0) <= WRONG_GOAL,
        },
        "pooled": pooled_score,
        "conversations": {
            cid: score_updates([r for r in rows if r["conversation"] == cid]) for cid in users
        },
        "pairs": rows,
    }
