"""Where a question's evidence was when it was asked (the window, recalled, a fact, folded into
the summary, nowhere), the names a summary kept, and the scores read by those."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from mlxmem.eval.locomo.data import SCORED, SUBJECTS, LocomoConversation
from mlxmem.eval.locomo.scoring import bootstrap_ci, paired_difference
from mlxmem.measure import SCORERS
from mlxmem.memory.companion import Companion


def by_subject(
    items: Sequence[dict], pairs: Sequence[tuple[str, str]], seed: int = 0, metric: str = "f1"
) -> dict:
    """`pairs`' paired differences (of `metric`) over the questions about each subject
    (SUBJECTS) that has some; items from before `about` was recorded are left out."""
    out = {}
    for name in SUBJECTS:
        group = [i for i in items if i.get("about") == name]
        scored = sum(i["category"] in SCORED for i in group)
        if scored:
            out[name] = {"questions": scored} | {
                f"{a}_vs_{b}": paired_difference(group, a, b, seed, metric) for a, b in pairs
            }
    return out


_CAPITALIZED_RE = re.compile(r"^[A-Z][a-z]+$")


def named_entities(text: str) -> set[str]:
    """Capitalized words that do not open a sentence (a crude stand-in for named entities)."""
    found = set()
    for sentence in re.split(r"(?<=[.!?])\s+|\n", text):
        for word in sentence.split()[1:]:
            word = word.strip(string.punctuation + "’")
            if _CAPITALIZED_RE.match(word) and word != "I":
                found.add(word)
    return found


def entity_survival(
    conv: LocomoConversation, seq_of: dict[str, int], summary_text: str, last_seq: int
) -> dict:
    """Of the named entities in the evidence turns that were folded into the summary, the share
    the summary still names."""
    texts = {t["id"]: t["text"] for t in conv.turns}
    evidence = {e for q in conv.questions for e in q.evidence if seq_of.get(e, 10**9) <= last_seq}
    entities = set().union(*(named_entities(texts[e]) for e in evidence if e in texts))
    words = set(re.findall(r"[a-z]+", summary_text.lower()))
    kept = {e for e in entities if e.lower() in words}
    return {
        "evicted_evidence_turns": len(evidence),
        "entities": len(entities),
        "entities_in_summary": len(kept),
        "share": len(kept) / len(entities) if entities else None,
    }


# Where a question's evidence was when it was asked, most direct first (`evidence_place`).
PLACES = ("window", "recalled", "fact", "folded", "nowhere", "unplaced")


def evidence_place(item: dict) -> str:
    """Where the question's evidence was for the memory's own prompt (mlxmem's in one
    conversation, facts's in a new chat): an evidence turn in the verbatim window; else one
    recalled; else a fact in the prompt holding a word of the answer; else folded into the
    summary only (one conversation: the turns left the window through a fold); else nowhere
    in the prompt. `unplaced`: the question names no evidence turn found in the replay."""
    seqs = item.get("evidence_seqs")
    if not seqs:
        return "unplaced"
    if "evicted_upto" in item and any(s > item["evicted_upto"] for s in seqs):
        return "window"
    if item["recall"].get("evidence_recalled"):
        return "recalled"
    memory = item.get("mlxmem") or item.get("facts") or {}
    if memory.get("facts_with_answer_word"):
        return "fact"
    return "folded" if "mlxmem" in item else "nowhere"


def by_evidence_place(
    items: Sequence[dict], configs: Sequence[str], pairs: Sequence[tuple[str, str]], seed: int = 0
) -> dict:
    """Per evidence place (PLACES) that has questions of categories 1-4: their number, each
    configuration's F1 of every scorer, and the paired differences `pairs` of each scorer.
    The summary's worth shows on `folded` (mlxmem - window), a fact's on `fact`."""
    out: dict[str, dict] = {}
    for place in PLACES:
        group = [i for i in items if i["category"] in SCORED and i.get("place") == place]
        if not group:
            continue
        out[place] = {"questions": len(group)}
        for metric in SCORERS:
            means = {}
            for config in configs:
                values = [i[config][metric] for i in group if i[config].get(metric) is not None]
                means[config] = {
                    "mean": sum(values) / len(values) if values else None,
                    "ci": bootstrap_ci(values, seed),
                }
            out[place][metric] = means | {
                f"{a}_vs_{b}": paired_difference(group, a, b, seed, metric) for a, b in pairs
            }
    return out


@dataclass(frozen=True)
class LogView:
    seq_of: dict[str, int]  # LoCoMo dialogue id -> seq of the logged message holding it
    seq_of_id: dict[int, int]  # logged message id -> its seq
    evicted_upto: int  # the newest summary's last seq: turns up to it left the window
    last_at: datetime | None = None  # when the newest turn was written
    facts: tuple[str, ...] = ()  # the texts of the facts kept


def log_view(companion: Companion, seq_of: dict[str, int]) -> LogView:
    summaries = companion.store.summaries(companion.conversation)
    turns = companion.store.turns(companion.conversation)
    return LogView(
        seq_of,
        {t.id: t.seq for t in turns},
        summaries[-1].last_seq if summaries else 0,
        turns[-1].created_at if turns else None,
        tuple(f.text for f in companion.store.facts()),
    )


def evicted_evidence(items: Sequence[dict], seed: int = 0, metric: str = "f1") -> dict:
    """The questions recall is for: those (categories 1-4) with an evidence turn that had left
    the verbatim window. How often recall put one of their evidence turns in the prompt (a
    retrieval figure, the same for any model), and what that did to F1 (`metric`), recall minus
    mlxmem, overall and on single-hop questions. Items from before these fields existed are
    left out."""

    def left_window(item: dict) -> bool:
        return any(s <= item["evicted_upto"] for s in item["evidence_seqs"])

    chosen = [
        i for i in items if i["category"] in SCORED and "evidence_seqs" in i and left_window(i)
    ]

    def summary(group: list[dict]) -> dict:
        hits = [float(i["recall"]["evidence_recalled"] > 0) for i in group]
        return {
            "questions": len(group),
            "evidence_recalled": int(sum(hits)),
            "share": sum(hits) / len(hits) if hits else None,
            "share_ci": bootstrap_ci(hits, seed),
            "recall_vs_mlxmem": paired_difference(group, "recall", "mlxmem", seed, metric),
        }

    return {
        "overall": summary(chosen),
        "single_hop": summary([i for i in chosen if i["category"] == 4]),
    }
