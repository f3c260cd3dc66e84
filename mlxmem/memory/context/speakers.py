"""Who is speaking: the names of the user and of the assistant where a conversation or the
facts say them ("my name is ...", the name the other side greets them by), and the greetings
and addresses ("Hey Mel!", "Thanks, Caroline.") that a summary leaves out."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from mlxmem.memory.context.summary_words import looks_like_name
from mlxmem.text import GREETING_WORDS, INTERJECTION_WORDS, THANKS_WORDS

ROLE_LABELS = {"user": "User", "assistant": "Assistant"}
# The words around a name in any case, the name itself capitalized: "The user is grateful for
# ..." names no one (an adjective after "is" is no name: read as one, it would name the user
# in every summary), nor does "The user is Melanie's friend".
_NAMED_RE = re.compile(
    r"\b(?:the )?(user|assistant)(?:'s name)? is (?:called |named )?(?-i:([A-Z][a-z]+))\b"
    r"(?!['’]s)|\bmy name is (?-i:([A-Z][a-z]+))\b(?!['’]s)",
    re.IGNORECASE,
)
_GREETING_RE = re.compile(
    rf"^(?:\[[^\]]*\]\s*)?(?:{GREETING_WORDS}|{THANKS_WORDS}|"
    r"good (?:morning|afternoon|evening)|wow|aw+|oh)\b[\s,!]*(?:so much[\s,]*)?([A-Z][a-z]+)\b",
    re.IGNORECASE,
)
_VOCATIVE_RE = re.compile(r",\s+([A-Z][a-z]+)\s*[!?.]")
_LEAD_RE = re.compile(r"^(\[[^\]]*\]\s*)?(.*)$", re.DOTALL)
# Words a greeting opens with: "Hey Mel!", "Thanks, Caroline!" say nothing worth keeping.
_OPENER_RE = re.compile(
    rf"^(?:(?:{GREETING_WORDS}|{THANKS_WORDS}|good (?:morning|"
    rf"afternoon|evening)|{INTERJECTION_WORDS})(?: so much)?\s*[,!.]+\s*)+",
    re.IGNORECASE,
)


def speaker_names(said: Sequence[tuple[str, str]], facts: Sequence[str] = ()) -> dict[str, str]:
    """The names of the user and of the assistant where `said` ((role, text) of turns) or the
    `facts` say them: a fact that names
    one ("The user is called Ana."), "my name is ...", or the name the other side greets or
    addresses them by ("Hey Mel!", "Thanks, Caroline."), at least twice and more than any
    other. Roles not named are left out."""
    named: dict[str, str] = {}
    votes: dict[str, Counter[str]] = {"user": Counter(), "assistant": Counter()}
    for fact in facts:
        for role, name, _ in _NAMED_RE.findall(fact):
            if role and looks_like_name(name):
                named.setdefault(role.lower(), name)
    for role, text in said:
        other = "assistant" if role == "user" else "user"
        for _, _, mine in _NAMED_RE.findall(text):
            if mine and looks_like_name(mine):
                votes[role][mine] += 2
        votes[other].update(_addresses(text))
    for role, counts in votes.items():
        ranked = counts.most_common(2)
        if role in named or not ranked or ranked[0][1] < 2:
            continue
        if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
            named[role] = ranked[0][0]
    if named.get("user") is not None and named.get("user") == named.get("assistant"):
        return {}
    return named


def addressed_names(texts: Sequence[str]) -> set[str]:
    """Names the speakers greet or address each other by ("Hey Mel!", "Thanks, Caroline.")."""
    return {name for text in texts for name in _addresses(text)}


def _addresses(text: str) -> list[str]:
    """Each name `text` greets at the start of a line or calls out (", Mel!"), once per time."""
    greeted = [_GREETING_RE.match(line.strip()) for line in text.splitlines()]
    names = [m.group(1) for m in greeted if m] + _VOCATIVE_RE.findall(text)
    return [name for name in names if looks_like_name(name)]


def without_address(sentence: str, names: set[str]) -> str:
    """`sentence` without its greeting ("Hey Mel!") or the name it addresses ("..., Mel!");
    a leading "[...]" (a date the text itself gives) stays."""
    lead_match = _LEAD_RE.match(sentence)
    assert lead_match is not None  # the pattern matches every string
    lead, sentence = lead_match.groups()
    for name in sorted(names, key=lambda n: (-len(n), n)):  # one order: same input, same output
        name = re.escape(name)
        sentence = re.sub(rf",\s*{name}(?=\s*[!?.]|$)", "", sentence)
        sentence = re.sub(rf"^((?:{GREETING_WORDS})\s+){name}\b[\s,!.]*", "", sentence, flags=re.I)
    return ((lead or "") + _OPENER_RE.sub("", sentence)).strip()
