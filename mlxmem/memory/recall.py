"""Layer 2 into the prompt: recall a few old turns from the chat log.

A rolling summary keeps the gist and loses specifics. When a new message may refer to the past,
the turns that have left the verbatim window (those in the newest summary's range) are ranked by
BM25 against the message, in SQL over recall's index (mlxmem.memory.terms: each message's
stemmed terms, written at insert in the same DuckDB file and erased with the message; DuckDB's
full-text extension cannot be installed offline). The best few go into a budgeted block placed
inside the new message, after every stable block, so the cached prefix stays put. A deleted
turn is no longer in the log nor in the index, so it is never recalled.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import duckdb

from mlxmem.memory.terms import DOCS_TABLE, TERMS_TABLE
from mlxmem.memory.terms import terms as words_of
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
# Cues that a message reaches back in time (besides being a question).
_PAST_RE = re.compile(
    r"\b(remember|recall|earlier|before|last (time|week|month|year|summer|winter)|ago|told you|"
    r"i (said|mentioned)|you said|again|back when|used to|what was|when did|did i|have i)\b",
    re.IGNORECASE,
)

# A turn that answers a matching turn is often the one asked about ("Which team did you sign
# with?" -> "I'm a shooting guard"): each matched turn passes this share of its score on to
# the turn after it (measured: benchmarks/recall_retrieval.py).
NEIGHBOUR_SHARE = 0.5
# When the message names one speaker, that speaker's turns count this many times over.
SPEAKER_BOOST = 2.0
# A message may say who is who ("You are Melanie; I am Caroline"): a speaker's name then means
# that speaker's turns, not the turns that contain the name (people name the one they talk to
# far more often than themselves). The statement itself is not searched for.
_SPEAKER_RE = re.compile(
    r"\b(?:((?i:you are|you're|your name is))|(?i:i am|i'm|my name is))\s+([A-Z][\w'-]*)"
)
_ROLE_PREFIX = "@"  # a query term "@user" or "@assistant" asks for that speaker's turns

# Document length is counted in indexed words; the index is read only for the query's terms.
# Each matched turn's BM25 score is spread to the next turn of the scope, and the named
# speaker's turns are boosted, before the best are taken.
_BM25_SQL = f"""
WITH scope AS (
    SELECT m.id, m.role, lead(m.id) OVER (ORDER BY m.seq) AS next_id
    FROM messages m JOIN conversations c ON c.id = m.conversation_id
    WHERE c.name = ? AND m.seq <= ?
),
docs AS (
    SELECT d.message_id AS id, d.length AS dl FROM {DOCS_TABLE} d
    WHERE d.message_id IN (SELECT id FROM scope)
),
stats AS (SELECT count(*) AS n, greatest(avg(dl), 1) AS avgdl FROM docs),
tf AS (
    SELECT t.message_id AS id, t.term, t.tf AS f FROM {TERMS_TABLE} t
    WHERE list_contains(?, t.term) AND t.message_id IN (SELECT id FROM scope)
),
df AS (SELECT term, count(*) AS df FROM tf GROUP BY term),
matched AS (
    SELECT tf.id, sum(
        ln(1 + (stats.n - df.df + 0.5) / (df.df + 0.5))
        * tf.f * {BM25_K1 + 1}
        / (tf.f + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * docs.dl / stats.avgdl))
    ) AS score
    FROM tf JOIN df USING (term) JOIN docs USING (id) CROSS JOIN stats
    GROUP BY tf.id
),
spread AS (
    SELECT id, score FROM matched
    UNION ALL
    SELECT scope.next_id AS id, {NEIGHBOUR_SHARE} * matched.score AS score
    FROM matched JOIN scope USING (id) WHERE scope.next_id IS NOT NULL
)
SELECT spread.id, sum(spread.score) * CASE WHEN scope.role = ? THEN {SPEAKER_BOOST} ELSE 1 END
    AS score
FROM spread JOIN scope USING (id)
GROUP BY spread.id, scope.role ORDER BY score DESC, spread.id DESC LIMIT ?
"""


def query_terms(text: str) -> list[str]:
    """The terms of `text` worth searching for: lowercased, no stopwords, stemmed, each once.
    If the message says who is who and then names one of the speakers, the name becomes a
    request for that speaker's turns ("@user" or "@assistant", last)."""
    speakers = {}
    for match in _SPEAKER_RE.finditer(text):
        for name in words_of(match.group(2)):
            speakers[name] = "assistant" if match.group(1) else "user"
    found = list(dict.fromkeys(words_of(_SPEAKER_RE.sub(" ", text))))
    named = {speakers[w] for w in found if w in speakers}
    found = [w for w in found if w not in speakers]
    if len(named) == 1:
        found.append(_ROLE_PREFIX + named.pop())
    return found


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
    """The turns of `conversation` up to `last_seq` that best match `terms` (BM25, spread to
    the next turn, the speaker asked for by a term "@user" or "@assistant" boosted), best
    first."""
    roles = [t.removeprefix(_ROLE_PREFIX) for t in terms if t.startswith(_ROLE_PREFIX)]
    terms = [t for t in terms if t and not t.startswith(_ROLE_PREFIX)]
    if not terms or last_seq < 1 or limit < 1:
        return []
    role = roles[0] if len(roles) == 1 else None
    params = [conversation, last_seq, list(terms), role, limit]
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
