"""Layer 2 into the prompt: recall a few old turns from the chat log.

A rolling summary keeps the gist and loses specifics, and a new conversation starts with neither.
When a new message may refer to the past, the turns of the log it cannot see (those of this
conversation that have left the verbatim window, and those of every other conversation that
is not private) are ranked by BM25 against the message, in SQL over recall's index
(mlxmem.memory.terms: each message's stemmed terms, written at insert in the same DuckDB file
and erased with the message; DuckDB's full-text extension cannot be installed offline). The
best few go into a budgeted block placed inside the new message, after every stable block, so
the cached prefix stays put. A deleted turn is no longer in the log nor in the index, so it is
never recalled.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from datetime import date

import duckdb

from mlxmem.memory.dates import (
    MONTHS,
    WEEKDAYS,
    DayRange,
    day_label,
    day_marker,
    local_midnight_utc,
    named_days,
)
from mlxmem.memory.terms import DOCS_TABLE, TERMS_TABLE
from mlxmem.memory.terms import terms as words_of
from mlxmem.memory.turns import SELECT_TURNS, Turn, turn_of

# Turns recalled at most per message. Six fit the recall share (512 tokens of 4,096) about as
# often as four did with room to spare: with SmolLM2's tokenizer, an evidence turn reached
# the prompt for 0.80-0.84 of each development conversation's questions, 0.77-0.80 with four
# (benchmarks/summary_entities.py); what does not fit is dropped, weakest first.
RECALL_TURNS = 6
RECALL_SHARE = 0.125  # of the context budget, at most
RECALLED_TURN_TOKENS = 120  # a longer recalled turn shows its head and tail
RECALL_HEADER = "From earlier conversations (recalled from the log):"
RECALL_FOOTER = "(end of recalled turns)"
BM25_K1 = 1.2
# Length normalization at half strength: a long turn that tells a whole story is often the one
# asked about (measured: benchmarks/recall_retrieval.py).
BM25_B = 0.5
_WEEKDAY_NAMES = "|".join(WEEKDAYS).lower()
# Not "may": in any case it is a verb as often as a month.
_MONTHS_BUT_MAY = "|".join(m for m in MONTHS if m != "May").lower()
# Cues that a message reaches back in time (besides being a question).
_PAST_RE = re.compile(
    r"\b(remember|recall|earlier|before|yesterday|the other day|ago|told you|i (said|mentioned)|"
    rf"last (time|night|week|weekend|month|year|summer|winter|{_WEEKDAY_NAMES})|you said|again|"
    r"back when|used to|what was|when did|did i|have i)\b",
    re.IGNORECASE,
)

# Two rankings, fused by reciprocal rank (each turn scores 1 / (RRF_K + its rank) in each):
# - turns: a turn's BM25 score, plus NEIGHBOUR_SHARE of the previous turn's (a turn that
#   answers a matching turn is often the one asked about: "Which team did you sign with?" ->
#   "I'm a shooting guard");
# - passages: BM25 over the turns up to PASSAGE_TURNS seq numbers either side of a turn and
#   the turn itself, as one text (a question's words are often spread over a short exchange).
#   Passages are about equally long: no length normalization (measured: no difference).
# In both, when the message names one speaker, that speaker's turns count SPEAKER_BOOST times,
# and when it names a day or a month ("on 3 June 2023", "in July 2023"), the turns written then
# count DAYS_BOOST times (mlxmem.memory.dates.named_days): on the 79 development questions that
# name one, found at 4 went from 56 to 61, the same for a boost of 1.5 to 5 and for 3 to 14 days
# around a date.
# Measured on LoCoMo's development conversations: benchmarks/recall_retrieval.py.
# Then a prior on the fused score: a turn that tells something is long and no question
# (in the development conversations 14% of recalled turns of 20+ indexed words were evidence,
# 5% of those under 10; 4% of turns ending with "?", 12% of the others). The weights were fit
# by logistic regression on the top 20 of each question, left out one conversation at a time,
# and rounded: each is worth a few places among close matches, not a strong match's lead.
NEIGHBOUR_SHARE = 0.5
PASSAGE_TURNS = 3
RRF_K = 20
SPEAKER_BOOST = 2.0
DAYS_BOOST = 2.0
# A turn of the conversation the message is written in, against one of another conversation:
# no preference. Asked from the last session's conversation, 1.5 and 2 found no more at 4 or 6
# on any development conversation and fewer on most (benchmarks/README.md).
CURRENT_BOOST = 1.0
MAX_DAY_RANGES = 4  # a message naming more searches by its first four
LENGTH_PRIOR = 0.005  # per ln(1 + indexed words)
QUESTION_PENALTY = 0.007  # a turn whose text ends with "?"
# The prior reorders the best fused matches only (it reads their text): with the cut and
# without, benchmarks/recall_retrieval.py finds the same at 1, 4, 6 and 10.
PRIOR_POOL = 50
# Two more terms of the prior, and a wider match in the turn ranking (benchmarks/README.md has
# the measures; the weights were chosen with one development conversation left out at a time,
# and each left-out conversation gained):
# - a turn that holds what the question asks for: a time word for "when", a number for "how
#   many/much/long", a name for "who", "where" and "what is the name": ANSWER_BONUS;
# - a turn that speaks of its speaker ("I", "my", "we") more than of the other ("you"): the one
#   that tells, not the one that replies: SELF_BONUS;
# - a query term also matches the log's words it begins with or that begin it, at
#   RELATED_WEIGHT of a match ("mentorship" and "mentor", "painting" and "painter"), for
#   words of MIN_RELATED_CHARS to MAX_RELATED_CHARS (not a pasted blob: each of its prefixes
#   would be a term) and the first RELATED_TERMS of them (each costs a prefix test of the
#   index rows).
ANSWER_BONUS = 0.015
SELF_BONUS = 0.003
RELATED_WEIGHT = 0.3
MIN_RELATED_CHARS = 4
MAX_RELATED_CHARS = 24
RELATED_TERMS = 16
_ASKS_PREFIX = "?"  # "?when", "?number", "?name": what the question asks for
# What each kind of question asks for, and (RE2, as DuckDB's regexp reads it) what a turn
# that holds it contains.
_ASKS = {
    "when": (
        r"(?:^|[.!?;:(]\s*)(?:(?:and|but|so|then)\s+)?when\b|\bhow long ago\b"
        r"|\bwhat (?:date|day|year|month)\b"
        r"|\bwhich (?:year|month)\b",
        r"(?i)\b(?:yesterday|today|tonight|tomorrow|ago|since|weekend|last (?:week|weekend|month|"
        r"year|night|summer|winter|spring|fall)|next (?:week|month|year)|"
        rf"this (?:week|month|year|morning|summer)|{_WEEKDAY_NAMES}|{_MONTHS_BUT_MAY}|\d{{4}})\b",
    ),
    "number": (
        r"\bhow (?:many|much|long)\b",
        r"(?i)\b(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|twice|once|few|several)\b",
    ),
    "name": (
        r"(?:^|[.!?;:(]\s*)(?:(?:and|but|so|then)\s+)?(?:who|whom|where)\b"
        r"|\bwhich (?:city|country)\b|\bname of\b"
        r"|\bwhat (?:is|was) the name\b",
        r"[a-z,] [A-Z][a-z]+",  # a capitalized word inside a sentence
    ),
}
_QUESTION_RE = re.compile(r"[^.!?]*\?")
_WH_CLAUSE_RE = re.compile(
    r"\s*(?:(?:and|but|so|then)\s+)?(?:when|who|whom|whose|where|what|which|why|how)\b",
    re.IGNORECASE,
)
_FIRST_PERSON = r"(?i)\b(?:i|me|my|we|us|our)\b"
_SECOND_PERSON = r"(?i)\b(?:you|your|yours)\b"
# A message may say who is who ("You are Melanie; I am Caroline"): a speaker's name then means
# that speaker's turns, not the turns that contain the name (people name the one they talk to
# far more often than themselves). The statement itself is not searched for.
_WHO_IS_WHO_RE = re.compile(
    r"\b(?:((?i:you are|you're|your name is))|(?i:i am|i'm|my name is))\s+([A-Z][\w'-]*)"
)
_ROLE_PREFIX = "@"  # a query term "@user" or "@assistant" asks for that speaker's turns
_DAYS_PREFIX = "#"  # "#2023-05-27/2023-06-11": the turns of those local days (the last excluded)
# A message with more distinct terms (a pasted document with a "?" in it) searches for its first
# and last halves of this many: every term costs a scan of its index rows, and a thousand of
# them took 0.8 s at 100,000 messages. LoCoMo's questions have under 20.
MAX_QUERY_TERMS = 64


def _idf(df: str) -> str:
    return f"ln(1 + (stats.n - {df} + 0.5) / ({df} + 0.5))"


def _saturate(tf: str, norm: str = "1") -> str:
    return f"{tf} * {BM25_K1 + 1} / ({tf} + {BM25_K1} * {norm})"


_LENGTH_NORM = f"(1 - {BM25_B} + {BM25_B} * hits.dl / stats.avgdl)"
_BOOST = (
    f"CASE WHEN docs.role = $role THEN {SPEAKER_BOOST} ELSE 1 END"
    f" * CASE WHEN docs.named_day THEN {DAYS_BOOST} ELSE 1 END"
    f" * CASE WHEN docs.current THEN {CURRENT_BOOST} ELSE 1 END"
)
# How many index rows (postings) of the query's terms may seed the turns a search scores: an
# accumulator limit, as in Moffat and Zobel's "continue" strategy (Self-indexing inverted files
# for fast text retrieval, 1996). Terms seed rarest first; the term that crosses the limit
# seeds with the rows of its turns logged last (a companion's prior: the latest mention; and a
# third cheaper than its rows of highest count), and the commoner terms seed none. Every term
# still scores every seeded turn and its neighbours. A word in every seventh turn of a
# 1,000,000-message log has 140,000 rows: the limit bounds a search's work by what it can show.
# The development conversations' questions reach at most 631 rows: their results are unchanged.
SEED_POSTINGS = 1024
# A sum over a turn's terms is rounded to this many decimals: threads add in any order, and
# the last bits of a float sum would otherwise reorder equal scores from one run to the next.
_DIGITS = 9
_LAST_POS = 2**31 - 1  # seq is an INTEGER: a conversation searched to its end
# Neighbours are looked up in buckets of this many seq numbers: a turn's passage (PASSAGE_TURNS
# either side) spans at most two.
_BUCKET = 2 * PASSAGE_TURNS + 2
# The log searched is every conversation's turns but a private one's (kept out of the others),
# and of the current conversation only those up to $last_seq (those left in the verbatim
# window are in the prompt already): `searched`. A turn is (cid, pos): its conversation and its
# seq. Document length is counted in indexed words. The search reads what its terms reach,
# not the whole log: how many index rows each term has and which of them are newest (`df`),
# the turns they seed (`seeds`, see SEED_POSTINGS), the turns within a passage of a seed
# (`docs`: a few seq buckets around each), the index rows of the query's terms in those turns
# (`hits`), and for BM25's document count and mean length, the index's totals less those of
# the turns not searched (every message has one row in DOCS_TABLE, written and deleted with
# it). A passage's document frequency is counted over the turns read; for a term with more
# rows than seed, it is estimated as if the term fell on turns at random. A turn's neighbours
# are found by seq in its conversation; a deleted turn leaves a gap.
_SEARCH_SQL = f"""
WITH searched AS (
    SELECT id AS cid, name = $conversation AS current,
        CASE WHEN name = $conversation THEN $last_seq ELSE {_LAST_POS} END AS last_pos
    FROM conversations WHERE name = $conversation OR NOT private
),
unsearched AS (
    SELECT m.id FROM messages m JOIN conversations c ON c.id = m.conversation_id
    WHERE c.private AND c.name <> $conversation
    UNION ALL
    SELECT m.id FROM messages m JOIN conversations c ON c.id = m.conversation_id
    WHERE c.name = $conversation AND NOT coalesce(m.seq <= $last_seq, false)
),
stats AS (
    SELECT n, greatest(CAST(dl AS DOUBLE) / nullif(n, 0), 1) AS avgdl FROM (
        SELECT (SELECT count(*) FROM messages) - (SELECT count(*) FROM unsearched) AS n,
            (SELECT coalesce(sum(length), 0) FROM {DOCS_TABLE})
            - (SELECT coalesce(sum(length), 0) FROM {DOCS_TABLE}
               WHERE message_id IN (SELECT id FROM unsearched)) AS dl
    )
),
df AS MATERIALIZED (
    SELECT term, df, newest,
        sum(df) OVER (ORDER BY df, term ROWS UNBOUNDED PRECEDING) - df AS before
    FROM (
        SELECT t.term, count(*) AS df,
            max_by(t.message_id, t.message_id, {SEED_POSTINGS}) AS newest
        FROM {TERMS_TABLE} t
        WHERE ({{matches}}) AND t.message_id NOT IN (SELECT id FROM unsearched) GROUP BY t.term
    )
),
seeds AS MATERIALIZED (
    SELECT m.conversation_id AS cid, m.seq AS pos FROM messages m SEMI JOIN (
        SELECT unnest(newest[:{SEED_POSTINGS} - before]) AS message_id FROM df
        WHERE before < {SEED_POSTINGS}
    ) r ON r.message_id = m.id
),
docs AS MATERIALIZED (
    SELECT m.id, m.conversation_id AS cid, m.seq AS pos, m.role,
        {{named_day}} AS named_day, s.current
    FROM messages m JOIN searched s ON s.cid = m.conversation_id
    SEMI JOIN (
        SELECT DISTINCT cid, (pos + o) // {_BUCKET} AS bucket
        FROM seeds CROSS JOIN (VALUES (-{PASSAGE_TURNS}), ({PASSAGE_TURNS})) r(o)
    ) b ON b.cid = m.conversation_id AND b.bucket = m.seq // {_BUCKET}
    WHERE m.seq <= s.last_pos
),
hits AS MATERIALIZED (
    SELECT docs.cid, docs.pos, t.term, t.tf AS f,
        list_position($terms, t.term) AS asked, coalesce(d.length, 0) AS dl
    FROM {TERMS_TABLE} t JOIN docs ON docs.id = t.message_id
    LEFT JOIN {DOCS_TABLE} d ON d.message_id = t.message_id
    WHERE {{matches}}
),
turn_score AS MATERIALIZED (
    SELECT cid, pos, round(sum(
        {_idf("df.df")} * {_saturate("hits.f", _LENGTH_NORM)}
        * CASE WHEN hits.asked > 0 THEN 1 ELSE {RELATED_WEIGHT} END
    ), {_DIGITS}) AS score
    FROM hits JOIN df USING (term) CROSS JOIN stats GROUP BY cid, pos
),
turns AS MATERIALIZED (
    SELECT cid, pos, s.score * {_BOOST} AS score
    FROM (
        SELECT cid, pos, sum(score) AS score FROM (
            SELECT cid, pos, score FROM turn_score
            UNION ALL SELECT cid, pos + 1, {NEIGHBOUR_SHARE} * score FROM turn_score
        ) GROUP BY cid, pos
    ) s JOIN docs USING (cid, pos)
),
ptf AS MATERIALIZED (
    SELECT cid, pos, term, f FROM (
        SELECT hits.cid, hits.pos + o AS pos, hits.asked AS term, sum(hits.f) AS f
        FROM hits CROSS JOIN range(-{PASSAGE_TURNS}, {PASSAGE_TURNS} + 1) AS r(o)
        WHERE hits.asked > 0 GROUP BY ALL
    ) SEMI JOIN docs USING (cid, pos)
),
pdf AS (
    SELECT p.term, CASE WHEN d.before + d.df <= {SEED_POSTINGS} THEN p.df
        ELSE stats.n * (1 - pow(greatest(1 - d.df / stats.n, 0), {2 * PASSAGE_TURNS + 1})) END AS df
    FROM (SELECT term, count(*) AS df FROM ptf GROUP BY term) p
    JOIN df d ON list_position($terms, d.term) = p.term CROSS JOIN stats
),
passages AS MATERIALIZED (
    SELECT cid, pos, p.score * {_BOOST} AS score
    FROM (
        SELECT cid, pos, round(sum({_idf("pdf.df")} * {_saturate("ptf.f")}), {_DIGITS}) AS score
        FROM ptf JOIN pdf USING (term) CROSS JOIN stats GROUP BY cid, pos
    ) p JOIN docs USING (cid, pos)
),
fused AS (
    SELECT cid, pos, 1 / ({RRF_K} + row_number() OVER (ORDER BY score DESC, cid DESC, pos DESC))
        AS s
    FROM turns
    UNION ALL
    SELECT cid, pos, 1 / ({RRF_K} + row_number() OVER (
        ORDER BY passages.score DESC, coalesce(turns.score, 0) DESC, cid DESC, pos DESC
    )) AS s
    FROM passages LEFT JOIN turns USING (cid, pos)
),
ranked AS (
    SELECT fused.cid, fused.pos, sum(fused.s) AS s, any_value(coalesce(turns.score, 0)) AS own
    FROM fused LEFT JOIN turns USING (cid, pos) GROUP BY fused.cid, fused.pos
    ORDER BY s DESC, own DESC, fused.cid DESC, fused.pos DESC LIMIT {PRIOR_POOL}
)
SELECT docs.id, ranked.s, ranked.own FROM ranked JOIN docs USING (cid, pos)
"""
# Then the prior, on the best PRIOR_POOL, read by id ($ids: a filter on the scan, not a join
# over the log's texts), and their turns, best first.
_PRIOR_SQL = f"""
{SELECT_TURNS}
JOIN (SELECT unnest($ids) AS id, unnest($s) AS s, unnest($own) AS own) r ON r.id = m.id
LEFT JOIN (SELECT * FROM {DOCS_TABLE} WHERE list_contains($ids, message_id)) d
    ON d.message_id = m.id
WHERE list_contains($ids, m.id)
ORDER BY r.s + {LENGTH_PRIOR} * ln(1 + coalesce(d.length, 0))
        - CASE WHEN regexp_matches(m.text, '[?]\\s*$') THEN {QUESTION_PENALTY} ELSE 0 END
        + CASE WHEN regexp_matches(m.text, $holds) THEN {ANSWER_BONUS} ELSE 0 END
        + CASE WHEN len(regexp_extract_all(m.text, '{_FIRST_PERSON}'))
            > len(regexp_extract_all(m.text, '{_SECOND_PERSON}')) THEN {SELF_BONUS} ELSE 0 END
    DESC, r.own DESC, m.conversation_id DESC, m.seq DESC
LIMIT $limit
"""


@functools.cache
def _search_sql(day_ranges: int, longer: int) -> str:
    """_SEARCH_SQL with `named_day`, one test per range the message names (none: false, free),
    and `longer`, one prefix test per query term that the log's longer words may begin with."""
    tests = [f"(m.created_at >= $from{i} AND m.created_at < $until{i})" for i in range(day_ranges)]
    prefixes = "".join(f" OR starts_with(t.term, $longer{i})" for i in range(longer))
    matches = f"list_contains($terms, t.term) OR list_contains($shorter, t.term){prefixes}"
    return _SEARCH_SQL.replace("{named_day}", " OR ".join(tests) or "false").replace(
        "{matches}", matches
    )


def asks_for(text: str) -> str | None:
    """What a question asks for: "when", "number", "name", or None (what, how, why...). Read
    in each question (up to its "?"; the whole text if none), in its last clause that starts
    with a question word: "When I was a kid, what did I eat?" asks what."""
    for question in _QUESTION_RE.findall(text) or [text]:
        clauses = re.split(r"[,;]", question)
        asked = next((c for c in reversed(clauses) if _WH_CLAUSE_RE.match(c)), question)
        for kind, (pattern, _) in _ASKS.items():
            if re.search(pattern, asked.strip(), re.IGNORECASE):
                return kind
    return None


def query_terms(text: str, today: date | None = None) -> list[str]:
    """The terms of `text` worth searching for: lowercased, no stopwords, stemmed, each once.
    If the message says who is who and then names one of the speakers, the name becomes a
    request for that speaker's turns ("@user" or "@assistant"); the days it names become
    requests for the turns of those days ("#2023-05-27/2023-06-11"), and with `today` (the
    local day it is written) so do the days it names from there ("last week"); last, what
    the question asks for ("?when", see asks_for)."""
    speakers = {}
    for match in _WHO_IS_WHO_RE.finditer(text):
        for name in words_of(match.group(2)):
            speakers[name] = "assistant" if match.group(1) else "user"
    found = list(dict.fromkeys(words_of(_WHO_IS_WHO_RE.sub(" ", text))))
    named = {speakers[w] for w in found if w in speakers}
    found = [w for w in found if w not in speakers]
    if len(found) > MAX_QUERY_TERMS:  # a pasted text: what was typed comes first or last
        half = MAX_QUERY_TERMS // 2
        found = found[:half] + found[-half:]
    if len(named) == 1:
        found.append(_ROLE_PREFIX + named.pop())
    for first, until in named_days(text, today)[:MAX_DAY_RANGES]:
        found.append(f"{_DAYS_PREFIX}{first.isoformat()}/{until.isoformat()}")
    if (kind := asks_for(text)) is not None:
        found.append(_ASKS_PREFIX + kind)
    return found


def _day_range(term: str) -> DayRange | None:
    try:
        first, until = term.removeprefix(_DAYS_PREFIX).split("/")
        return date.fromisoformat(first), date.fromisoformat(until)
    except ValueError:
        return None  # not a range query_terms wrote: searched for nothing


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
    """The turns of the log that best match `terms`, best first: those of `conversation` up to
    `last_seq` (0: none of them) and those of every other conversation not kept private. BM25
    over turns and over passages, fused (see _SEARCH_SQL); the speaker asked for by a term
    "@user" or "@assistant", and the days asked for by terms "#first/until", are boosted."""
    roles = [t.removeprefix(_ROLE_PREFIX) for t in terms if t.startswith(_ROLE_PREFIX)]
    days = [_day_range(t) for t in terms if t.startswith(_DAYS_PREFIX)]
    days = [d for d in days if d is not None][:MAX_DAY_RANGES]
    asks = [t.removeprefix(_ASKS_PREFIX) for t in terms if t.startswith(_ASKS_PREFIX)]
    terms = [t for t in terms if t and t[0] not in (_ROLE_PREFIX, _DAYS_PREFIX, _ASKS_PREFIX)]
    if not terms or limit < 1:
        return []
    role = roles[0] if len(roles) == 1 else None
    related = [t for t in terms if MIN_RELATED_CHARS <= len(t) <= MAX_RELATED_CHARS]
    related = related[:RELATED_TERMS]
    params = {
        "conversation": conversation,
        "last_seq": last_seq,
        "terms": list(terms),
        # the words a query term begins with, and (below) those that begin with it
        "shorter": [t[:n] for t in related for n in range(MIN_RELATED_CHARS, len(t))],
        "role": role,
        "holds": _ASKS[asks[0]][1] if asks and asks[0] in _ASKS else None,  # None: no bonus
        "limit": limit,
    }
    for i, (first, until) in enumerate(days):
        params[f"from{i}"] = local_midnight_utc(first)
        params[f"until{i}"] = local_midnight_utc(until)
    for i, term in enumerate(related):
        params[f"longer{i}"] = term
    holds, limit = params.pop("holds"), params.pop("limit")
    ranked = con.execute(_search_sql(len(days), len(related)), params).fetchall()
    if not ranked:
        return []
    ids, s, own = (list(column) for column in zip(*ranked, strict=True))
    rows = con.execute(
        _PRIOR_SQL, {"ids": ids, "s": s, "own": own, "holds": holds, "limit": limit}
    ).fetchall()
    return [turn_of(row) for row in rows]


def recall_line(turn: Turn, conversation: str | None = None) -> str:
    """A recalled turn as one line, with its day, and the name of its conversation if that is
    not `conversation` (the one it is recalled into): "- [8 May 2023] user: ...",
    "- [8 May 2023, in "travel"] user: ..."."""
    day = day_marker(turn.created_at)
    if conversation is not None and turn.conversation != conversation:
        day = f'[{day_label(turn.created_at)}, in "{turn.conversation}"]'
    return f"- {day} {turn.role}: {' '.join(turn.text.split())}"


def recall_block(lines: Sequence[str], message: str) -> str:
    """The new message with the recalled turns before it, clearly set apart."""
    if not lines:
        return message
    return "\n".join([RECALL_HEADER, *lines, RECALL_FOOTER, "", message.strip()])
