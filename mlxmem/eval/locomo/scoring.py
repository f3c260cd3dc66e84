"""An answer scored against LoCoMo's gold answer (SCORERS: LoCoMo's token F1, stemmed and not,
and A-Mem's set F1; exact match), and the scores aggregated with bootstrap intervals."""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Sequence

from mlxmem.eval.locomo.data import CATEGORIES, PER_SESSION_CONFIGS, SCORED, Question
from mlxmem.measure import CONFIGS, SCORERS
from mlxmem.memory.tables.terms import stemmer

# Per item and configuration; aggregated alike (None: not measured, e.g. no answer generated).
METRICS = (*SCORERS, "exact", "evidence_in_prompt", "answer_in_prompt")

# A-Mem's published row for Qwen2.5-1.5B (Xu et al. 2025, "A-Mem: Agentic Memory for LLM
# Agents", Table 1): its token F1 x100 per LoCoMo category. Its columns are LoCoMo's categories
# 1-4 by number, whatever their headers call them, so the row is keyed by number; set beside
# our `f1_amem`, the F1 its evaluation code computes (`amem_f1`).
AMEM_QWEN25_1_5B_F1 = {1: 18.2, 2: 24.3, 3: 16.5, 4: 23.6}

AMEM_ROW_LABEL = "A-Mem (published)"  # Qwen2.5-1.5B, as the report says

BOOTSTRAP_SAMPLES = 1000

NO_ANSWER_RE = re.compile(
    r"not mentioned|no information|don'?t know|do not know|not sure|unknown|cannot|can'?t tell|"
    r"no mention|not say|didn'?t say|never (said|mentioned)",
    re.IGNORECASE,
)


def normalize_answer(text: str) -> str:
    """LoCoMo's normalization: lowercase, no commas or punctuation, no a/an/the (nor 'and', as
    its script drops too), one space."""
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the|and)\b", " ", text)
    return " ".join(text.split())


# LoCoMo's script stems with NLTK's PorterStemmer; NLTK is not a dependency, PyStemmer is
# (recall's index). Its "porter" is the original Porter algorithm, which NLTK's default mode
# extends for a few rare words (e.g. "dying": "dy" here, "die" there): F1 can differ from the
# official figures on those words only.
PORTER = "porter"


def answer_tokens(text: str, stem: bool = False) -> list[str]:
    """The words LoCoMo's F1 counts: normalized, and Porter-stemmed with `stem`."""
    words = normalize_answer(text).split()
    return stemmer(PORTER).stemWords(words) if stem else words


def token_f1(prediction: str, truth: str, stem: bool = False) -> float:
    """LoCoMo's token F1 (a bag of words: a repeated word counts as often as both have it)."""
    pred, gold = answer_tokens(prediction, stem), answer_tokens(truth, stem)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def gold_answer(question: Question) -> str:
    """The answer LoCoMo scores against: an open-domain question's first (before ';')."""
    return question.answer.split(";")[0] if question.category == 3 else question.answer


def said_no_answer(prediction: str) -> float:
    """1.0 if an answer says the conversation does not tell (adversarial questions)."""
    return float(bool(NO_ANSWER_RE.search(prediction)))


def locomo_f1(prediction: str, question: Question, stem: bool = False) -> float:
    """F1 of one answer per LoCoMo's rules for its category: adversarial, said none; multi-hop,
    the gold answer's comma-separated parts each matched to the best part of the answer, and
    averaged; else the token F1 against the gold answer."""
    if question.category == 5:
        return said_no_answer(prediction)
    truth = gold_answer(question)
    if question.category != 1:
        return token_f1(prediction, truth, stem)
    parts = [p for p in prediction.split(",") if p.strip()] or [prediction]
    golds = [g for g in truth.split(",") if g.strip()] or [truth]
    return sum(max(token_f1(p, g, stem) for p in parts) for g in golds) / len(golds)


# What A-Mem's tokenizer splits at besides whitespace (its utils.py `simple_tokenize`).
_AMEM_SEPARATORS = str.maketrans(".,!?", "    ")


def amem_words(text: str) -> set[str]:
    """The set of words A-Mem's F1 compares: lowercase, split at whitespace and . , ! ?"""
    return set(text.lower().translate(_AMEM_SEPARATORS).split())


def amem_f1(prediction: str, reference: str) -> float:
    """A-Mem's token F1, as its evaluation code computes it (github.com/WujiangXu/AgenticMemory,
    utils.py, `calculate_metrics`, read for this): over SETS of words (a repeated word counts
    once), no stemming, articles kept; 0 if either is empty or they share no word. It takes
    the gold answer as it is, whatever the category: an adversarial question's is the answer
    the conversation does not hold, so saying "not mentioned" scores 0 here."""
    pred, ref = amem_words(prediction), amem_words(reference)
    common = len(pred & ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def score(prediction: str, question: Question) -> tuple[float, float]:
    """(F1 unstemmed, exact match) of one answer, per LoCoMo's rules for its category."""
    f1 = locomo_f1(prediction, question)
    if question.category == 5:
        return f1, f1
    exact = normalize_answer(prediction) == normalize_answer(gold_answer(question))
    return f1, float(exact)


def answer_scores(prediction: str, question: Question) -> dict[str, float]:
    """Every score of one answer: SCORERS and exact match."""
    f1, exact = score(prediction, question)
    return {
        "f1": f1,
        "f1_locomo": locomo_f1(prediction, question, stem=True),
        "f1_amem": amem_f1(prediction, question.answer),
        "exact": exact,
    }


def rescore(item: dict, configs: Sequence[str] = (*CONFIGS, *PER_SESSION_CONFIGS)) -> dict:
    """`item` (of a result file) with every configuration's stored answer scored anew by
    `answer_scores`: the scorers of this version on a run made before them. A configuration
    without an answer (--no-answers) is left as it is."""
    question = Question(item["question"], str(item["answer"]), item["category"], ())
    for config in configs:
        done = item.get(config)
        if isinstance(done, dict) and done.get("answer") is not None:
            done |= answer_scores(done["answer"], question)
    return item


def bootstrap_ci(values: Sequence[float], seed: int = 0) -> list[float] | None:
    """95% percentile bootstrap interval of the mean."""
    if not values:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(BOOTSTRAP_SAMPLES))
    return [means[int(0.025 * BOOTSTRAP_SAMPLES)], means[int(0.975 * BOOTSTRAP_SAMPLES) - 1]]


def aggregate(items: Sequence[dict], seed: int = 0, configs: Sequence[str] = CONFIGS) -> dict:
    """Per configuration: each of METRICS per category and overall (categories 1-4), each
    {mean, ci, n}; items that did not measure a metric (None, or from before it existed) are
    left out of it."""
    out: dict = {}
    for config in configs:
        table: dict = {}
        for metric in METRICS:

            def values(keep, metric=metric, config=config) -> list[float]:
                found = (i[config].get(metric) for i in items if keep(i["category"]))
                return [v for v in found if v is not None]

            groups = {CATEGORIES[c]: values(lambda k, c=c: k == c) for c in CATEGORIES}
            groups["overall"] = values(lambda k: k in SCORED)
            table[metric] = {
                name: {
                    "mean": sum(v) / len(v) if v else None,
                    "ci": bootstrap_ci(v, seed),
                    "n": len(v),
                }
                for name, v in groups.items()
            }
        out[config] = table
    return out


def paired_difference(
    items: Sequence[dict], a: str, b: str, seed: int = 0, metric: str = "f1"
) -> dict:
    """Overall F1 (`metric`, of SCORERS) of config `a` minus config `b` on the same questions
    (categories 1-4), with a 95% bootstrap interval over questions: what decides whether `a`
    beats `b`. Items without `metric` for both (not answered, or older) are left out."""
    diffs = [
        i[a][metric] - i[b][metric]
        for i in items
        if i["category"] in SCORED and i[a].get(metric) is not None and i[b].get(metric) is not None
    ]
    mean = sum(diffs) / len(diffs) if diffs else None
    ci = bootstrap_ci(diffs, seed)
    return {"mean": mean, "ci": ci, "n": len(diffs), "beats": bool(ci and ci[0] > 0)}


def beside_amem(results: dict) -> dict[str, dict[int, float | None]]:
    """Our `f1_amem` x100 per LoCoMo category 1-4 for each configuration of `results` (None
    where not measured), and A-Mem's published row (AMEM_ROW_LABEL) last, for the report."""
    rows = {}
    for config in results.get("configs", CONFIGS):
        cells = results.get(config, {}).get("f1_amem", {})
        means = {c: cells.get(CATEGORIES[c], {}).get("mean") for c in SCORED}
        rows[config] = {c: None if m is None else 100 * m for c, m in means.items()}
    return rows | {AMEM_ROW_LABEL: dict(AMEM_QWEN25_1_5B_F1)}
