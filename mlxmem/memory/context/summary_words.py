"""The words a summary is judged and built by: sentences, word tokens of any script, and the
names, numbers and dates of a text (its key items), shared by the summary check (summary_check),
speaker detection (speakers) and the extractive summary (extractive), all in this folder."""

from __future__ import annotations

import re
from collections.abc import Sequence

from mlxmem.memory.tables.dates import MONTHS, WEEKDAYS

SENTENCE_RE = re.compile(r"(?<=[.!?…])\s+|\n+")
# Words of any script (a Russian or Greek summary is no "empty" one), and numbers.
TOKEN_RE = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?|\d+(?:[.,:]\d+)*")
CALENDAR_WORDS = frozenset(name.lower() for name in (*MONTHS, *WEEKDAYS))
# Capitalized words that are no names (openers, interjections, pronouns).
_NOT_NAMES = frozenset(
    "i i'm i've i'd i'll ok okay oh hey hi hello wow yes no yeah thanks thank the a an and but "
    "so my you your we it that this".split()
)


def key_items(texts: Sequence[str]) -> set[str]:
    """The names, numbers and dates of `texts`, lowercased: capitalized words that do not open
    a sentence and are never written in lower case there ("Sounds" after a smiley is no name),
    acronyms, numbers, months and weekdays."""
    names: set[str] = set()
    others: set[str] = set()
    for text in texts:
        for sentence in SENTENCE_RE.split(text):
            for i, word in enumerate(TOKEN_RE.findall(sentence)):
                low = norm_word(word)
                if word[0].isdigit() or low in CALENDAR_WORDS:
                    others.add(low)
                elif i > 0 and looks_like_name(word):
                    names.add(low)
    return (names - lowercase_words(texts)) | others


def lowercase_words(texts: Sequence[str]) -> set[str]:
    """The words `texts` write in lower case (normalized): a capitalized one of them is no
    name ("Sounds" after a smiley)."""
    return {norm_word(w) for text in texts for w in TOKEN_RE.findall(text) if w.islower()}


def text_words(text: str) -> list[str]:
    return [norm_word(w) for w in TOKEN_RE.findall(text)]


def norm_word(word: str) -> str:
    return word.lower().replace("’", "'").replace(",", "")


def looks_like_name(word: str) -> bool:
    if norm_word(word) in _NOT_NAMES:
        return False
    return (word[0].isupper() and word[1:].islower()) or (len(word) > 1 and word.isupper())
