"""An eval run's result: the scores aggregated per configuration, category, subject and
evidence place, and what the questions cost."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlxmem.eval.locomo.data import (
    CATEGORIES,
    NEW_CHAT_MODES,
    PER_SESSION_CONFIGS,
    PER_SESSION_PAIRS,
    PLACE_PAIRS,
    SCORED,
)
from mlxmem.eval.locomo.evidence import by_evidence_place, by_subject, evicted_evidence
from mlxmem.eval.locomo.scoring import aggregate, paired_difference
from mlxmem.measure import CONFIGS, pyplot


@dataclass
class EvalResult:
    settings: dict
    conversations: list[dict] = field(default_factory=list)

    @property
    def items(self) -> list[dict]:
        return [i for c in self.conversations for i in c["items"]]

    def to_dict(self) -> dict:
        if self.settings.get("mode") in NEW_CHAT_MODES:
            return self._per_session_dict()
        seed = self.settings.get("seed", 0)
        scores = aggregate(self.items, seed)
        return {
            "configs": list(CONFIGS),
            "kind": "eval",
            "settings": self.settings,
            **scores,
            "recall_vs_mlxmem": paired_difference(self.items, "recall", "mlxmem", seed),
            "recall_vs_window": paired_difference(self.items, "recall", "window", seed),
            "oracle_vs_no_memory": paired_difference(self.items, "oracle", "no_memory", seed),
            "evicted_evidence": evicted_evidence(self.items, seed),
            "by_evidence_place": by_evidence_place(self.items, CONFIGS, PLACE_PAIRS, seed),
            "cost": question_cost(self.items, CONFIGS),
            "per_conversation": {
                c["id"]: {
                    config: aggregate(c["items"], seed)[config]["f1"]["overall"]
                    for config in CONFIGS
                }
                for c in self.conversations
            },
            "layers": {c["id"]: c["layers"] for c in self.conversations},
            "conversations": self.conversations,
        }

    def _per_session_dict(self) -> dict:
        seed, items = self.settings.get("seed", 0), self.items
        scores = aggregate(items, seed, PER_SESSION_CONFIGS)
        facts = [i["facts"] for i in items if i["category"] in SCORED]
        return {
            "kind": "eval",
            "configs": list(PER_SESSION_CONFIGS),
            "settings": self.settings,
            **scores,
            **{f"{a}_vs_{b}": paired_difference(items, a, b, seed) for a, b in PER_SESSION_PAIRS},
            # The facts are about the person: what they carry shows on questions about them.
            "by_subject": by_subject(items, PER_SESSION_PAIRS, seed),
            "by_evidence_place": by_evidence_place(
                items, PER_SESSION_CONFIGS, PER_SESSION_PAIRS, seed
            ),
            "cost": question_cost(items, PER_SESSION_CONFIGS),
            "facts_in_prompt_mean": _mean([f["facts_in_prompt"] for f in facts]),
            "facts_with_answer_word_mean": _mean([f["facts_with_answer_word"] for f in facts]),
            "per_conversation": {
                c["id"]: {
                    config: aggregate(c["items"], seed, PER_SESSION_CONFIGS)[config]["f1"][
                        "overall"
                    ]
                    for config in PER_SESSION_CONFIGS
                }
                for c in self.conversations
            },
            "layers": {c["id"]: c["layers"] for c in self.conversations},
            "conversations": self.conversations,
        }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def question_cost(items: Sequence[dict], configs: Sequence[str]) -> dict:
    """What a question cost, per configuration: median seconds (the answer's whole call) and
    mean tokens of the prompt, of it read from the slot's cache, and prefilled; and the
    median seconds of a question over all configurations (assembly included). Items from
    before these were recorded are left out."""
    out: dict = {"questions": len(items)}
    for config in configs:
        answered = [i[config] for i in items if i[config].get("seconds") is not None]
        out[config] = {
            "seconds_median": _median([a["seconds"] for a in answered]),
            **{
                f"{k}_mean": _mean([a[k] for a in answered])
                for k in ("prompt_tokens", "cached_tokens", "prefilled_tokens")
            },
        }
    out["question_seconds_median"] = _median([i["seconds"] for i in items if "seconds" in i])
    return out


def plot_eval(results: dict, path: str | Path, title: str = "") -> Path:
    """Write a PNG of F1 per category for each configuration of an eval run, with 95% bars."""
    plt = pyplot()
    groups = [*CATEGORIES.values(), "overall"]
    fig, ax = plt.subplots(figsize=(11, 4.5), dpi=110)
    width = 0.8 / len(CONFIGS)
    for k, config in enumerate(CONFIGS):
        cells = [results[config]["f1"][g] for g in groups]
        means = [c["mean"] or 0 for c in cells]
        low = [m - c["ci"][0] if c["ci"] else 0 for m, c in zip(means, cells, strict=True)]
        high = [c["ci"][1] - m if c["ci"] else 0 for m, c in zip(means, cells, strict=True)]
        x = [i + (k - (len(CONFIGS) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(x, means, width, yerr=[low, high], capsize=2, label=config)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("F1 (adversarial: said 'not mentioned')")
    ax.set_ylim(0, 1)
    ax.legend(ncol=len(CONFIGS), fontsize=8)
    ax.set_title(title or "mlxmem eval locomo")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
