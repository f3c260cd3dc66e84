"""A model's rolling summary, checked.

A small model's summary is often no summary: SmolLM2-135M repeats one sentence up to the cap,
retells the conversation as "I", or answers the last message instead. `check_summary` catches a
refusal, repeated n-grams, a first- or second-person retelling, and too few of the names,
numbers and dates of what the summary folds. One that fails is replaced by the extractive
summary (mlxmem.memory.context.extractive).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from mlxmem.memory.context.summary_words import (
    SENTENCE_RE,
    key_items,
    text_words,
)
from mlxmem.memory.tables.dates import MONTHS

# Set against SmolLM2-135M's and Qwen2.5-Coder-1.5B's summaries of LoCoMo windows
# (benchmarks/summary_prompts.py) and a plain third-person one (tests/test_summary_check.py).
REPEAT_N = 4  # word n-grams
MAX_REPEATED = 0.2  # share of a summary's n-grams that repeat an earlier one
MIN_COVERAGE = 0.2  # share of the folded names, numbers and dates a summary must keep...
MIN_ITEMS = 4  # ...when they hold at least this many
MAX_PERSONAL = 0.03  # first- and second-person words outside quotes, per word (at least 2)
_QUOTED_RE = re.compile(r"\"[^\"]*\"|“[^”]*”")
_REFUSAL_RE = re.compile(
    r"\b(?:I'?m sorry|I am sorry|I apologi[sz]e|I (?:can ?not|can'?t|am unable|'m unable|won'?t)"
    r" (?:help|provide|summari[sz]e|do|create|write|assist)|as an (?:AI|assistant|language "
    r"model)|I don'?t have (?:access|enough|any)|there is nothing to summari[sz]e)",
    re.IGNORECASE,
)
_PERSONAL = frozenset(
    "i i'm i've i'd i'll me my mine myself we we're we've we'll we'd us our ours ourselves "
    "you you're you've you'll you'd your yours yourself yourselves".split()
)
# "[8 May 2023] ..." or, after a line of the same year, "[21 May] ...".
_MONTH_ALTERNATION = "|".join(MONTHS)
DAY_LINE_RE = re.compile(rf"^\[(\d{{1,2}} (?:{_MONTH_ALTERNATION}))(?: (\d{{4}}))?\] (.*)$")


@dataclass(frozen=True)
class SummaryCheck:
    """What is wrong with a summary (nothing: it passes), and the figures it was judged by."""

    problems: tuple[str, ...]  # "empty", "refusal", "repetition", "first-person", "coverage"
    coverage: float | None  # share of the source's names, numbers and dates kept; None: none
    repeated: float  # share of the summary's word 4-grams that repeat an earlier one
    personal: int  # first- and second-person words outside quotes

    @property
    def ok(self) -> bool:
        return not self.problems


def check_summary(text: str, folded: Sequence[str], earlier: str | None = None) -> SummaryCheck:
    """Judge a model's summary `text` of the turn texts `folded` merged with the `earlier`
    summary: a refusal, repetition, a first- or second-person retelling (the summary must be a
    note about the conversation, not a turn of it), or too few of the source's names, numbers
    and dates fail it."""
    sources = [*([earlier] if earlier else []), *folded]
    items = key_items(sources)
    kept = items & set(text_words(text))
    coverage = len(kept) / len(items) if items else None
    words = text_words(text)
    # Lines in the extractive form ("[8 May] Nadia: I ...") quote the turns, as they should.
    prose = prose_lines(text)
    personal = sum(w in _PERSONAL for w in text_words(_QUOTED_RE.sub(" ", prose)))
    repeated = repeated_share(words)
    problems = []
    if not words:
        problems.append("empty")
    if _REFUSAL_RE.search(text):
        problems.append("refusal")
    if repeated > MAX_REPEATED or _repeats_a_sentence(text):
        problems.append("repetition")
    if personal >= max(2, MAX_PERSONAL * len(words)):
        problems.append("first-person")
    if len(items) >= MIN_ITEMS and (coverage or 0.0) < MIN_COVERAGE:
        problems.append("coverage")
    return SummaryCheck(tuple(problems), coverage, repeated, personal)


def prose_lines(text: str) -> str:
    """`text` without its lines in the extractive form (a day, then who said what)."""
    return "\n".join(line for line in text.splitlines() if not DAY_LINE_RE.match(line.strip()))


def repeated_share(words: Sequence[str], n: int = REPEAT_N) -> float:
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def _repeats_a_sentence(text: str) -> bool:
    sentences = [" ".join(text_words(s)) for s in SENTENCE_RE.split(text)]
    long = [s for s in sentences if s.count(" ") >= 3]
    return len(set(long)) < len(long)
