"""Layer 2 into the prompt: recall a few old turns from the chat log.

A rolling summary keeps the gist and loses specifics. When a new message may refer to the past,
the turns that have left the verbatim window (those in the newest summary's range) are ranked by
BM25 against the message, in SQL over DuckDB (the full-text extension cannot be installed
offline, and an index table would be one more copy of the text for a deletion to hunt down).
The best few go into a budgeted block placed inside the new message, after every stable block,
so the cached prefix stays put. A deleted turn is no longer in the log, so it is never recalled.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import duckdb

from mlxmem.memory.turns import SELECT_TURNS, Turn, turn_of

RECALL_TURNS = 4  # turns recalled at most per message
RECALL_SHARE = 0.125  # of the context budget, at most
RECALLED_TURN_TOKENS = 120  # a longer recalled turn shows its head and tail
RECALL_HEADER = "From earlier conversations (recalled from the log):"
RECALL_FOOTER = "(end of recalled turns)"
BM25_K1 = 1.2
# Length normalization at half strength: a long turn that tells a whole story is often the one
# asked about (measured: benchmarks/recall_retrieval.py).
BM25_B = 0.5
# A light stemmer, the same rule in Python and in DuckDB's SQL: a word loses the longest of
# these endings that leaves at least three letters, so "paintings", "painted", "painting" and
# "paints" all meet "paint". (The stem is a prefix of the word: the SQL's prefilter still
# finds it.)
STEM_SUFFIXES = ("ings", "ing", "ed", "s")  # longest first
STEM_MIN = 3
_STEM_SQL = (
    "CASE "
    + " ".join(
        f"WHEN length(w) >= {len(end) + STEM_MIN} AND ends_with(w, '{end}') "
        f"THEN substr(w, 1, length(w) - {len(end)})"
        for end in STEM_SUFFIXES
    )
    + " ELSE w END"
)

_WORD_RE = re.compile(r"[a-z0-9]+")
# Words that say nothing about which turn is meant, including those about the exchange itself
# ("answer in a few words"): rare in a log, they would outrank the words that matter.
STOPWORDS = frozenset(
    """a about above after again all also am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its
    itself just me more most my myself no nor not now of off on once only or other our ours
    out over own same she should so some such than that the their theirs them themselves then
    there these they this those through to too under until up very was we were what when where
    which while who whom why will with would you your yours yourself yourselves ll ve re s t d m
    don didn doesn isn wasn weren won wouldn couldn shouldn hey hi oh yeah yes ok okay really
    like just got get know think remember recall said say tell told mention mentioned earlier
    last time ago thing things something anything
    answer answers question questions word words few brief briefly short sentence reply
    please""".split()
)
# Cues that a message reaches back in time (besides being a question).
_PAST_RE = re.compile(
    r"\b(remember|recall|earlier|before|last (time|week|month|year|summer|winter)|ago|told you|"
    r"i (said|mentioned)|you said|again|back when|used to|what was|when did|did i|have i)\b",
    re.IGNORECASE,
)

# Document length is counted in characters (the same ratio to the mean as words, near enough),
# so that only the turns containing a query word are split into words at all, and only the
# words that are a query word plus a stem ending are stemmed.
_BM25_SQL = f"""
WITH scope AS (
    SELECT m.id, m.text FROM messages m JOIN conversations c ON c.id = m.conversation_id
    WHERE c.name = ? AND m.seq <= ?
),
stats AS (SELECT count(*) AS n, avg(length(text)) AS avgdl FROM scope),
docs AS (
    SELECT id, length(text) AS dl, regexp_split_to_array(lower(text), '[^a-z0-9]+') AS toks
    FROM scope WHERE regexp_matches(lower(text), ?)
),
words AS (
    SELECT id, dl, w FROM (SELECT id, dl, unnest(toks) AS w FROM docs)
    WHERE regexp_full_match(w, ?)
),
hits AS (
    SELECT id, term, dl FROM (SELECT id, dl, {_STEM_SQL} AS term FROM words)
    WHERE list_contains(?, term)
),
tf AS (SELECT id, term, dl, count(*) AS f FROM hits GROUP BY id, term, dl),
df AS (SELECT term, count(*) AS df FROM tf GROUP BY term)
SELECT tf.id, sum(
    ln(1 + (stats.n - df.df + 0.5) / (df.df + 0.5))
    * tf.f * {BM25_K1 + 1} / (tf.f + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * tf.dl / stats.avgdl))
) AS score
FROM tf JOIN df USING (term) CROSS JOIN stats
GROUP BY tf.id ORDER BY score DESC, tf.id DESC LIMIT ?
"""


def stem(word: str) -> str:
    for end in STEM_SUFFIXES:
        if word.endswith(end) and len(word) >= len(end) + STEM_MIN:
            return word[: -len(end)]
    return word


def query_terms(text: str) -> list[str]:
    """The words of `text` worth searching for: lowercased, no stopwords, stemmed, each once."""
    words = _WORD_RE.findall(text.lower())
    stems = (stem(w) for w in words if w not in STOPWORDS and len(w) > 1)
    return list(dict.fromkeys(s for s in stems if s not in STOPWORDS))


def refers_to_past(text: str) -> bool:
    """Might this message refer to something said before? A question, or a cue like
    'remember' or 'last week'. Cheap and generous: BM25 decides what, if anything, matches."""
    return "?" in text or bool(_PAST_RE.search(text))


def search_before(
    con: duckdb.DuckDBPyConnection,
    conversation: str,
    last_seq: int,
    terms: Sequence[str],
    limit: int = RECALL_TURNS,
) -> list[Turn]:
    """The turns of `conversation` up to `last_seq` that best match `terms` (BM25), best first."""
    terms = [t for t in terms if _WORD_RE.fullmatch(t)]
    if not terms or last_seq < 1 or limit < 1:
        return []
    pattern = "|".join(terms)  # words of [a-z0-9]: nothing to escape
    word = f"({pattern})({'|'.join(STEM_SUFFIXES)})?"  # a word that may stem to a term
    params = [conversation, last_seq, pattern, word, list(terms), limit]
    ranked = con.execute(_BM25_SQL, params).fetchall()
    if not ranked:
        return []
    ids = [row[0] for row in ranked]
    rows = con.execute(f"{SELECT_TURNS} WHERE list_contains(?, m.id)", [ids]).fetchall()
    by_id = {row[0]: turn_of(row) for row in rows}
    return [by_id[i] for i in ids if i in by_id]


def recall_line(turn: Turn) -> str:
    return f"- {turn.role}: {' '.join(turn.text.split())}"


def recall_block(lines: Sequence[str], message: str) -> str:
    """The new message with the recalled turns before it, clearly set apart."""
    if not lines:
        return message
    return "\n".join([RECALL_HEADER, *lines, RECALL_FOOTER, "", message.strip()])
