"""The extractive summary, written without a model, which replaces a model's summary that
fails the check (mlxmem.memory.context.summary_check), and the specifics a model's summary left out.

The sentences of the earlier summary and of the folded turns that carry the most names, numbers
and dates not yet kept, each under its speaker and its day, within the cap. A sentence that
was folded before keeps only its clauses with a name, number or date, so older folds fade to
their specifics instead of dropping out whole. Same input, same output.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from mlxmem.engine import Engine
from mlxmem.memory.context.speakers import ROLE_LABELS, addressed_names, without_address
from mlxmem.memory.context.summary_check import DAY_LINE_RE
from mlxmem.memory.context.summary_words import (
    CALENDAR_WORDS,
    SENTENCE_RE,
    TOKEN_RE,
    key_items,
    looks_like_name,
    lowercase_words,
    norm_word,
    text_words,
)
from mlxmem.memory.tables.dates import day_label
from mlxmem.memory.tables.terms import STOPWORDS
from mlxmem.memory.tables.turns import Turn

FRESH_SHARE = 0.2  # of the cap, kept for the folded turns before the earlier summary competes
# What an extracted sentence is worth: the names, numbers and dates it adds first, its other
# words as a tie-break (measure a change with benchmarks/summary_entities.py).
ITEM_GAIN = 5.0
MAX_WORD_GAIN = 4
MAX_UNIT_WORDS = 40  # a longer sentence is cut: one sentence must not take the whole cap
# A sentence read back from the earlier summary keeps, when longer than this many words, only
# its clauses with a name, number or date: the newest fold keeps whole sentences, older ones
# their specifics with a few words around them (with SmolLM2's tokenizer the development
# conversations' final summaries kept 102 of 167 named entities of the folded evidence turns
# instead of 92 on the same folds; docs/notebook/benchmarks.md, "Summaries that keep more of
# what they fold").
AGED_WORDS = 6
_SPEAKER_LABEL_RE = re.compile(r"^([A-Z][\w'’-]*(?: [A-Z][\w'’-]*)?): (.+)$", re.DOTALL)
# Where a sentence splits into clauses: a comma, semicolon or dash. A clause that opens with a
# relative word ("..., which cost 3,000 dollars") stays with the one before it, and a kept
# clause loses the "and" or "but" it opened with.
_CLAUSE_RE = re.compile(r"\s*[,;–—]\s+|\s+-\s+")
_RELATIVE_RE = re.compile(r"^(?:which|who|whom|whose|where|that)\b", re.IGNORECASE)
_CONJUNCTION_RE = re.compile(r"^(?:and|but|so|then)\s+", re.IGNORECASE)
_END_RE = re.compile(r"\s*[.!?…]+$")
# Words about when, worth keeping in an extracted sentence (a quarter of questions ask when).
_WHEN = frozenset("yesterday today tomorrow tonight weekend week month year ago".split())


@dataclass(frozen=True)
class _Unit:
    order: int
    day: str | None
    speaker: str | None
    text: str
    fresh: bool  # from the folded turns, not the earlier summary


def extractive_summary(
    engine: Engine,
    cap: int,
    earlier: str | None,
    folded: Sequence[Turn],
    names: dict[str, str] | None = None,
    earlier_is_extractive: bool = False,
) -> str:
    """A summary of the `earlier` summary plus the `folded` turns without a model, within
    `cap` tokens (counted by `engine`): whole sentences chosen for the names, numbers and dates
    they add (a fifth of the cap first from the folded turns, so the summary moves on), shown
    in order under their day ("[8 May 2023]", then "[21 May]" within the year) and their
    speaker (a name from `names`, else User / Assistant). An earlier extractive summary is read
    back into its sentences, days and speakers; an earlier sentence keeps only its specific
    clauses (see specific_clauses)."""
    names = names or {}
    addressed = addressed_names([t.text for t in folded]) | set(names.values())
    lowercase = lowercase_words([earlier or "", *(t.text for t in folded)])
    units = _earlier_units(earlier, earlier_is_extractive, lowercase) if earlier else []
    units += _folded_units(folded, names, addressed, len(units))
    if not units:
        return "(nothing was said)"
    entities = _entity_words([u.text for u in units]) - {norm_word(n) for n in addressed}
    value = {u.order: _unit_items(u.text, entities) for u in units}
    cost = {u.order: engine.count_text(_segment(u, None)) for u in units}
    chosen: list[_Unit] = []
    fresh = [u for u in units if u.fresh]
    _pick(chosen, fresh, value, cost, int(cap * FRESH_SHARE))
    if fresh and not chosen:
        # Nothing folded scored (no name, number or date, few content words): keep its richest
        # sentence anyway, first in line to stay, so that no fold leaves no trace.
        chosen.append(max(fresh, key=lambda u: (len(value[u.order]), -cost[u.order], -u.order)))
    _pick(chosen, units, value, cost, cap)
    keep = chosen[0] if chosen else min(units, key=lambda u: u.order)
    return _fit(engine, chosen, cap) or shorten_to(engine, render([keep]), cap)


def specifics_left_out(
    engine: Engine,
    room: int,
    summary: str,
    folded: Sequence[Turn],
    names: dict[str, str] | None = None,
    earlier: str | None = None,
) -> str:
    """The sentences that hold the names, numbers and dates `summary` (a model's, which passed
    the check) left out, within `room` tokens, under their day and speaker as the extractive
    summary shows them; "" when it left none out or none fits. They come from the `folded`
    turns (a fifth of the room first) and from the `earlier` summary's own such lines, so the
    specifics of older folds stay while they are worth their room. A model that summarizes well
    still keeps the gist and drops the specifics: Qwen2.5-Coder-1.5B's summaries of LoCoMo used
    about 75 of their 400 tokens and kept 2 of 7 to 7 of 16 of the folded evidence turns'
    names, and no dates."""
    names = names or {}
    addressed = addressed_names([t.text for t in folded]) | set(names.values())
    lines = [line for line in (earlier or "").splitlines() if DAY_LINE_RE.match(line.strip())]
    lowercase = lowercase_words([*lines, *(t.text for t in folded)])
    units = _earlier_units("\n".join(lines), True, lowercase)
    units += _folded_units(folded, names, addressed, len(units))
    entities = _entity_words([u.text for u in units]) - {norm_word(n) for n in addressed}
    known = _unit_items(summary, entities)
    value = {u.order: _specifics(u.text, entities) - known for u in units}
    pool = [u for u in units if value[u.order]]
    cost = {u.order: engine.count_text(_segment(u, None)) for u in pool}
    chosen: list[_Unit] = []
    fresh = [u for u in pool if u.fresh]
    # A fifth of the room for the newest fold first, and room for one of its sentences at least.
    first = max(int(room * FRESH_SHARE), min((cost[u.order] for u in fresh), default=0))
    _pick(chosen, fresh, value, cost, min(first, room))
    _pick(chosen, pool, value, cost, room)
    return _fit(engine, chosen, room)


def _fit(engine: Engine, chosen: list[_Unit], room: int) -> str:
    """The `chosen` units rendered within `room` tokens (a day's label costs tokens their own
    counts left out): the last picked, which added the least for its cost, go first; "" if
    none fits."""
    while chosen:
        text = render(sorted(chosen, key=lambda u: u.order))
        if engine.count_text(text) <= room:
            return text
        chosen.pop()
    return ""


def _specifics(text: str, entities: set[str]) -> set[str]:
    """A sentence's names, numbers and dates, strictly: no content words, no "week" or
    "today", and a month only where it is written as one ("May", not "may")."""
    return {
        w
        for w in _unit_items(text, entities)
        if not w.startswith("~")
        and w not in _WHEN
        and (w not in CALENDAR_WORDS or re.search(rf"\b{w.capitalize()}\b", text))
    }


def _folded_units(
    folded: Sequence[Turn], names: dict[str, str], addressed: set[str], start: int
) -> list[_Unit]:
    """The folded turns' sentences, without greetings, each with its day and speaker."""
    units: list[_Unit] = []
    for turn in folded:
        speaker = names.get(turn.role) or ROLE_LABELS.get(turn.role, turn.role)
        day = day_label(turn.created_at)
        for sentence in _sentences(turn.text):
            sentence = without_address(sentence, addressed)
            if len(sentence.split()) >= 2:
                units.append(_Unit(start + len(units), day, speaker, sentence, True))
    return units


def render(units: Sequence[_Unit]) -> str:
    """Units in order: a line per day ("[8 May 2023] ...", "[21 May] ..." within the year), a
    speaker's label where the speaker changes. What `_earlier_units` reads back."""
    lines: list[str] = []
    day: str | None = None
    year: str | None = None
    speaker: str | None = None
    parts: list[str] = []
    for i, unit in enumerate(units):
        if i == 0 or unit.day != day:
            if parts:
                lines.append(" ".join(parts))
            label, year = _short_day(unit.day, year) if unit.day else (None, year)
            parts = [f"[{label}]"] if label else []
            day, speaker = unit.day, None
        parts.append(_segment(unit, speaker))
        speaker = unit.speaker
    if parts:
        lines.append(" ".join(parts))
    return "\n".join(lines)


def _short_day(day: str, year: str | None) -> tuple[str, str | None]:
    """ "8 May 2023" as a line shows it, "8 May" after a line of the same `year`, and the year
    the next line follows: with a tokenizer that splits digits (SmolLM2's, Qwen's) a year
    costs 5 tokens, and a line per day is the summary's shape."""
    head, _, this_year = day.rpartition(" ")
    if not this_year.isdigit():  # a day read back without its year
        return day, year
    return (head if this_year == year else day), this_year


def _segment(unit: _Unit, speaker: str | None) -> str:
    if unit.speaker and unit.speaker != speaker:
        return f"{unit.speaker}: {unit.text}"
    return unit.text


def _pick(chosen: list[_Unit], pool, value, cost, budget: int) -> None:
    """Greedily add the unit of `pool` with the most new value per token that still fits."""
    kept = set().union(*(value[u.order] for u in chosen))
    used = sum(cost[u.order] for u in chosen)
    taken = {u.order for u in chosen}
    while True:
        best, best_rate = None, 0.0
        for unit in pool:
            if unit.order in taken or used + cost[unit.order] > budget:
                continue
            gain = _gain(value[unit.order] - kept, unit.text)
            rate = gain / max(1, cost[unit.order])
            if rate > best_rate:
                best, best_rate = unit, rate
        if best is None:
            return
        chosen.append(best)
        taken.add(best.order)
        used += cost[best.order]
        kept |= value[best.order]


def _gain(new: set[str], text: str) -> float:
    """A sentence's worth: ITEM_GAIN per name, number or date it adds, 1 per content word (up
    to MAX_WORD_GAIN), half for a question; nothing for one that adds neither an item nor 3
    content words."""
    items = sum(1 for w in new if not w.startswith("~"))
    words = sum(1 for w in new if w.startswith("~"))
    if items == 0 and words < 3:
        return 0.0
    gain = ITEM_GAIN * items + min(words, MAX_WORD_GAIN)
    return gain / 2 if text.rstrip().endswith("?") else gain


def _unit_items(text: str, entities: set[str]) -> set[str]:
    """What a sentence holds: its names, numbers and dates, and (marked "~") its content
    words, which count for less."""
    found = set()
    for word in text_words(text):
        if word[0].isdigit() or word in CALENDAR_WORDS or word in _WHEN or word in entities:
            found.add(word)
        elif len(word) > 3 and word not in STOPWORDS and "'" not in word:
            found.add("~" + word)
    return found


def _entity_words(texts: Sequence[str]) -> set[str]:
    return {w for w in key_items(texts) if not w[0].isdigit() and w not in CALENDAR_WORDS}


def _sentences(text: str) -> list[str]:
    out = []
    for sentence in SENTENCE_RE.split(text):
        words = sentence.split()
        if not words:
            continue
        if len(words) > MAX_UNIT_WORDS:
            words = [*words[:MAX_UNIT_WORDS], "…"]
        out.append(" ".join(words))
    return out


def _earlier_units(text: str, structured: bool, lowercase: Collection[str]) -> list[_Unit]:
    """An earlier summary as units: an extractive one read back into its days and speakers
    (what `render` wrote), its longer sentences cut to their specific clauses; a model's as
    plain sentences (its clauses are not cut: a model's sentence often names its subject once,
    "Caroline felt proud, and she ran 5 miles")."""
    units: list[_Unit] = []
    year = None
    for line in text.splitlines():
        day, rest = None, line.strip()
        match = DAY_LINE_RE.match(rest)
        # A day's line is the extractive form wherever it is: after a model's paragraph
        # (source model+extractive) its days and speakers are read back too.
        line_structured = structured or match is not None
        if match:
            day, line_year, rest = match.groups()
            year = line_year or year
            day = f"{day} {year}" if year else day
        speaker = None
        for sentence in _sentences(rest):
            labelled = _SPEAKER_LABEL_RE.match(sentence) if line_structured else None
            if labelled:
                speaker, sentence = labelled.groups()
            if line_structured and len(sentence.split()) > AGED_WORDS:
                sentence = specific_clauses(sentence, lowercase)
            units.append(_Unit(len(units), day, speaker, sentence, False))
    return units


def specific_clauses(sentence: str, lowercase: Collection[str] = ()) -> str:
    """The clauses of `sentence` that hold a name, number or date, joined; `sentence` itself
    when all or none do, when what is left is under 3 words, or when it quotes (a title is
    not cut in half). "I love it, and I started around 3 years ago." -> "I started around 3
    years ago." A capitalized word that opens a clause is a name unless it is a stopword or
    is in `lowercase` (the words the conversation writes in lower case): so reading the
    result back keeps it as it is."""
    if not sentence.strip() or any(q in sentence for q in '"“”'):
        return sentence
    end = _END_RE.search(sentence)
    clauses: list[str] = []
    for clause in _CLAUSE_RE.split(_END_RE.sub("", sentence)):
        if clauses and _RELATIVE_RE.match(clause):
            clauses[-1] += ", " + clause
        elif clause:
            clauses.append(clause)
    kept = [c for c in clauses if _holds_item(c, lowercase)]
    if not kept or len(kept) == len(clauses):
        return sentence
    text = _CONJUNCTION_RE.sub("", ", ".join(kept))
    words = text.split()
    if len(words) < 3:
        return sentence
    if words[0].islower():
        text = text[0].upper() + text[1:]
    return text + (end.group().strip() if end else ".")


def _holds_item(clause: str, lowercase: Collection[str]) -> bool:
    """A number, a month or weekday, or a name: a capitalized word (no acronym, which is as
    often an interjection: "OMG"), not the clause's first unless it is never written in lower
    case and no stopword."""
    for i, word in enumerate(TOKEN_RE.findall(clause)):
        low = norm_word(word)
        if word[0].isdigit() or (word[0].isupper() and low in CALENDAR_WORDS):
            return True
        if looks_like_name(word) and not word.isupper():
            if i > 0 or (low not in lowercase and low not in STOPWORDS):
                return True
    return False


def shorten_to(engine: Engine, text: str, max_tokens: int) -> str:
    """Cut `text` to at most `max_tokens` tokens (the head is what a summary leads with)."""
    tokens = engine.encode_text(text)
    keep = max_tokens
    while len(tokens) > max_tokens and keep > 0:
        text = engine.decode(engine.encode_text(text)[:keep]).strip()
        tokens = engine.encode_text(text)
        keep -= 1
    return text
