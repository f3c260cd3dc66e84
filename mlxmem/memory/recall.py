"""Layer 2 into the prompt: recall a few old turns from the chat log.

A rolling summary keeps the gist and loses specifics, and a new conversation starts with neither.
When a new message may refer to the past, it is read into a RecallQuery (its terms, the speaker
and the days it names, what it asks for), and the turns of the log it cannot see (those of this
conversation that have left the verbatim window, and those of every other conversation that
is not private) are ranked against the query in SQL over recall's index
(mlxmem.memory.tables.terms: each message's stemmed terms, written at insert in the same DuckDB file
and erased with the message; DuckDB's full-text extension cannot be installed offline). The
ranking is BM25 over turns and over passages, fused by rank, with boosts and a prior: each
term an SQL function with its constant beside it, composed by _search_sql. The best few go
into a budgeted block placed inside the new message, after every stable block, so the cached
prefix stays put. A deleted turn is no longer in the log nor in the index, so it is
never recalled.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

import duckdb

from mlxmem.memory.tables.dates import (
    MONTHS,
    WEEKDAYS,
    DayRange,
    anchored,
    day_label,
    day_marker,
    local_midnight_utc,
    named_days,
)
from mlxmem.memory.tables.terms import DOCS_TABLE, TERMS_TABLE, VOCAB_TABLE
from mlxmem.memory.tables.terms import terms as words_of
from mlxmem.memory.tables.turns import SELECT_TURNS, Turn, turn_of

# Turns recalled at most per message. Six fit the recall share (512 tokens of 4,096) about as
# often as four did with room to spare: with SmolLM2's tokenizer, an evidence turn reached
# the prompt for 0.80-0.84 of each development conversation's questions, 0.77-0.80 with four
# (benchmarks/summary_entities.py); what does not fit is dropped, weakest first.
RECALL_TURNS = 6
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

# -- The query: what a message asks recall for -------------------------------------------------

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
# A message may say who is who ("You are Melanie; I am Caroline"): a speaker's name then means
# that speaker's turns, not the turns that contain the name (people name the one they talk to
# far more often than themselves). The statement itself is not searched for.
_WHO_IS_WHO_RE = re.compile(
    r"\b(?:((?i:you are|you're|your name is))|(?i:i am|i'm|my name is))\s+([A-Z][\w'-]*)"
)
# A message with more distinct terms (a pasted document with a "?" in it) searches for its first
# and last halves of this many: every term costs a scan of its index rows, and a thousand of
# them took 0.8 s at 100,000 turns. LoCoMo's questions have under 20.
MAX_QUERY_TERMS = 64
MAX_DAY_RANGES = 4  # a message naming more searches by its first four


@dataclass(frozen=True)
class RecallQuery:
    """What a message asks recall for (recall_query reads it): `terms`, the stems searched
    for, each once; `speakers`, those the message names after saying who is who ("user",
    "assistant"); `days`, the local days it names, each range's first day in and last day out;
    `asks`, what its question asks for ("when", "number", "name": see asks_for). A query
    without terms searches for nothing, and is false."""

    terms: tuple[str, ...] = ()
    speakers: tuple[str, ...] = ()
    days: tuple[DayRange, ...] = ()
    asks: str | None = None

    def __bool__(self) -> bool:
        return bool(self.terms)

    @property
    def speaker(self) -> str | None:
        """The speaker asked about: the one named, if only one is."""
        return self.speakers[0] if len(self.speakers) == 1 else None


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


def recall_query(text: str, today: date | None = None) -> RecallQuery:
    """What `text` asks recall for. Its terms: lowercased, no stopwords, stemmed, each once (of
    a pasted text, the first and last MAX_QUERY_TERMS / 2). If the message says who is who, a
    speaker's name it uses is a speaker asked about, not a term. Its days: those it names, and
    with `today` (the local day it is written) those it names from there ("last week"), the
    first MAX_DAY_RANGES. What it asks for: asks_for."""
    names = {}
    for match in _WHO_IS_WHO_RE.finditer(text):
        for name in words_of(match.group(2)):
            names[name] = "assistant" if match.group(1) else "user"
    found = list(dict.fromkeys(words_of(_WHO_IS_WHO_RE.sub(" ", text))))
    speakers = tuple(dict.fromkeys(names[w] for w in found if w in names))
    found = [w for w in found if w not in names]
    if len(found) > MAX_QUERY_TERMS:  # a pasted text: what was typed comes first or last
        half = MAX_QUERY_TERMS // 2
        found = found[:half] + found[-half:]
    return RecallQuery(
        terms=tuple(found),
        speakers=speakers,
        days=tuple(named_days(text, today)[:MAX_DAY_RANGES]),
        asks=asks_for(text),
    )


def refers_to_past(text: str) -> bool:
    """Might this message refer to something said before? A question, or a cue like
    'remember' or 'last week'. Cheap and generous: BM25 decides what, if anything, matches."""
    return "?" in text or bool(_PAST_RE.search(text))


# -- The ranking: named terms, each an SQL function of its constant ----------------------------
# Two rankings of the turns searched, fused by rank, then a prior on the best of them:
# - turns: each query term's BM25 score in a turn (bm25, related_word), plus a share of the
#   previous turn's score (neighbour), times the boosts (speaker_factor, days_factor,
#   current_factor);
# - passages: BM25 over a turn and the PASSAGE_TURNS either side of it as one text, times the
#   same boosts;
# - fused: each turn's reciprocal rank in the two (rrf);
# - then the prior, added to the fused score of the best PRIOR_POOL: length_prior,
#   question_penalty, answer_bonus, self_bonus.
# The constants were measured on LoCoMo's development conversations (found at 4,
# benchmarks/recall_retrieval.py; each term set to its neutral value in docs/notebook/benchmarks.md,
# "Recall at 1,000,000 messages, and the ranking methods tried"),
# the prior's fit by logistic regression on the top 20 of each question, one conversation left
# out at a time, and rounded: each is worth a few places among close matches, not a strong
# match's lead. Ranking holds them all, so that a test or a benchmark sets one apart.

BM25_K1 = 1.2  # a word said again in a turn adds less each time: BM25's usual saturation
# Length normalization at half strength: a long turn that tells a whole story is often the one
# asked about (at 0.75, the usual, 5 fewer found at 4 over the development conversations).
BM25_B = 0.5


def idf(df: str) -> str:
    """BM25's weight of a term held by `df` of the stats.n documents: the rarer, the more."""
    return f"ln(1 + (stats.n - {df} + 0.5) / ({df} + 0.5))"


def length_norm(b: float = BM25_B) -> str:
    """A turn's length (hits.dl, in indexed words) against the mean (stats.avgdl), at
    strength `b`: a divisor of its term counts."""
    return f"(1 - {b} + {b} * hits.dl / stats.avgdl)"


def bm25(df: str, tf: str, norm: str = "1", k1: float = BM25_K1) -> str:
    """A term's BM25 score in a document: its idf, times its count `tf` saturated by `k1`
    and divided by the length norm `norm`."""
    return f"{idf(df)} * {tf} * {k1 + 1} / ({tf} + {k1} * {norm})"


# A query term also matches the log's words it begins with or that begin it ("mentorship" and
# "mentor", "painting" and "painter"): a hint of the word, worth a third of it.
RELATED_WEIGHT = 0.3
MIN_RELATED_CHARS = 4  # a shorter word would meet too many: "so" is not "soup"
MAX_RELATED_CHARS = 24  # not a pasted blob: each of its prefixes would be a term
RELATED_TERMS = 16  # the first so many: each costs a prefix test of the index rows


def related_word(weight: float = RELATED_WEIGHT) -> str:
    """A factor on a term's score in a turn: 1 for a query term (hits.asked, its place in
    $terms, is positive), `weight` for a word related to one."""
    return f"CASE WHEN hits.asked > 0 THEN 1 ELSE {weight} END"


# A turn that answers a matching turn is often the one asked about ("Which team did you sign
# with?" -> "I'm a shooting guard"): without it, 3 to 11 fewer found at 4 per conversation.
NEIGHBOUR_SHARE = 0.5


def neighbour(share: float = NEIGHBOUR_SHARE) -> str:
    """What each turn of turn_score passes to the next turn of its conversation: `share` of its
    score."""
    return f"SELECT cid, pos + 1, {share} * score FROM turn_score"


# A question's words are often spread over a short exchange: a turn is also ranked by its
# passage, the turns up to this many seq numbers either side of it and itself, as one text.
# Passages are about equally long: no length normalization (measured: no difference).
PASSAGE_TURNS = 3


def passage_df(turns: int = PASSAGE_TURNS) -> str:
    """A term's passage frequency (pdf.df): counted over the passages read, or, for a term with
    more rows than seed (see SEED_POSTINGS), estimated as if it fell on turns at random."""
    return (
        f"CASE WHEN d.before + d.df <= {SEED_POSTINGS} THEN p.df"
        f" ELSE stats.n * (1 - pow(greatest(1 - d.df / stats.n, 0), {2 * turns + 1})) END"
    )


def _factor(when: str, boost: float) -> str:
    return f"CASE WHEN {when} THEN {boost} ELSE 1 END"


# The turns of the one speaker a message names count twice: asked "What did Mel bake?" after
# "You are Mel", Mel's turns hold the answer, and the turns that say "Mel" are mostly Jo's.
SPEAKER_BOOST = 2.0


def speaker_factor(boost: float = SPEAKER_BOOST) -> str:
    """A factor on a turn's score in both rankings: `boost` for a turn of $role (docs.role)."""
    return _factor("docs.role = $role", boost)


# The turns of the days a message names ("on 3 June 2023", "in July 2023") count twice: a
# question that names a day is most often about what was said on it; any boost from 1.5 to 5
# finds as many (benchmarks/recall_retrieval.py; the days: mlxmem.memory.tables.dates.named_days).
DAYS_BOOST = 2.0


def days_factor(boost: float = DAYS_BOOST) -> str:
    """A factor on a turn's score in both rankings: `boost` for a turn of a day asked for
    (docs.named_day: in_days)."""
    return _factor("docs.named_day", boost)


def in_days(ranges: int) -> str:
    """Whether turn m was written in one of `ranges` ranges of local days ($from0 to
    $until0, ...: UTC times of their midnights, the last excluded); false for none."""
    tests = [f"(m.created_at >= $from{i} AND m.created_at < $until{i})" for i in range(ranges)]
    return " OR ".join(tests) or "false"


# A turn of the conversation the message is written in, against one of another conversation:
# no preference. Asked from the last session's conversation, 1.5 and 2 found no more at 4 or 6
# on any development conversation and fewer on most (docs/notebook/benchmarks.md, "Recall across
# conversations").
CURRENT_BOOST = 1.0


def current_factor(boost: float = CURRENT_BOOST) -> str:
    """A factor on a turn's score in both rankings: `boost` for a turn of $conversation
    (docs.current)."""
    return _factor("docs.current", boost)


# The two rankings fused by reciprocal rank: the first places of either count most, more than
# with the usual k of 60 (benchmarks/recall_retrieval.py finds fewer at 4 with it).
RRF_K = 20


def rrf(order: str, k: int = RRF_K) -> str:
    """A turn's share of the fused score from one ranking, ordered by `order`:
    1 / (k + its rank)."""
    return f"1 / ({k} + row_number() OVER (ORDER BY {order}))"


# The prior reorders the best fused matches only (it reads their text): with the cut and
# without, benchmarks/recall_retrieval.py finds the same at 1, 4, 6 and 10.
PRIOR_POOL = 50
# A turn that tells something is long: in the development conversations 14% of recalled turns
# of 20+ indexed words were evidence, 5% of those under 10.
LENGTH_PRIOR = 0.005  # per ln(1 + indexed words)
# A turn that asks tells little: 4% of recalled turns ending with "?" were evidence, 12% of the
# others.
QUESTION_PENALTY = 0.007
# A turn that holds what the question asks for (a time word for "when", a number for "how
# many/much/long", a name for "who", "where" and "what is the name") is likely its answer.
ANSWER_BONUS = 0.015
# A turn that speaks of its speaker ("I", "my", "we") more than of the other ("you") is the one
# that tells, not the one that replies.
SELF_BONUS = 0.003
_FIRST_PERSON = r"(?i)\b(?:i|me|my|we|us|our)\b"
_SECOND_PERSON = r"(?i)\b(?:you|your|yours)\b"


def length_prior(weight: float = LENGTH_PRIOR) -> str:
    """Added to a turn's fused score: `weight` per ln(1 + its indexed words) (d.length)."""
    return f"{weight} * ln(1 + coalesce(d.length, 0))"


def question_penalty(weight: float = QUESTION_PENALTY) -> str:
    """Taken from a turn's fused score: `weight` if its text (m.text) ends with "?"."""
    return f"CASE WHEN regexp_matches(m.text, '[?]\\s*$') THEN {weight} ELSE 0 END"


def answer_bonus(weight: float = ANSWER_BONUS) -> str:
    """Added to a turn's fused score: `weight` if its text holds what the question asks for
    ($holds, a regular expression of _ASKS; NULL: nothing asked, no bonus)."""
    return f"CASE WHEN regexp_matches(m.text, $holds) THEN {weight} ELSE 0 END"


def self_bonus(weight: float = SELF_BONUS) -> str:
    """Added to a turn's fused score: `weight` if its text says "I" more often than "you"."""
    return (
        f"CASE WHEN len(regexp_extract_all(m.text, '{_FIRST_PERSON}'))"
        f" > len(regexp_extract_all(m.text, '{_SECOND_PERSON}')) THEN {weight} ELSE 0 END"
    )


@dataclass(frozen=True)
class Ranking:
    """The constants of recall's ranking terms, by term: Ranking(speaker=1.0) ranks without the
    speaker's boost, Ranking(answer=0) without the answer bonus."""

    k1: float = BM25_K1
    b: float = BM25_B
    related: float = RELATED_WEIGHT
    neighbour: float = NEIGHBOUR_SHARE
    passage_turns: int = PASSAGE_TURNS
    speaker: float = SPEAKER_BOOST
    days: float = DAYS_BOOST
    current: float = CURRENT_BOOST
    rrf_k: int = RRF_K
    length: float = LENGTH_PRIOR
    question: float = QUESTION_PENALTY
    answer: float = ANSWER_BONUS
    speaks_of_self: float = SELF_BONUS

    def boosts(self) -> str:
        """The factors on a turn's score in both rankings."""
        return " * ".join(
            [speaker_factor(self.speaker), days_factor(self.days), current_factor(self.current)]
        )

    def prior(self) -> str:
        """The terms added to (and the penalty taken from) a turn's fused score."""
        return (
            f"{length_prior(self.length)} - {question_penalty(self.question)}"
            f" + {answer_bonus(self.answer)} + {self_bonus(self.speaks_of_self)}"
        )


RANKING = Ranking()

# -- The search ----------------------------------------------------------------------------------

# How many index rows (postings) of the query's terms may seed the turns a search scores: an
# accumulator limit, as in Moffat and Zobel's "continue" strategy (Self-indexing inverted files
# for fast text retrieval, 1996). Terms seed rarest first; the term that crosses the limit
# seeds with the rows of its turns logged last (a companion's prior: the latest mention; and a
# third cheaper than its rows of highest count), and the commoner terms seed none. Every term
# still scores every seeded turn and its neighbours. A word in every seventh turn of a
# 1,000,000-turn log has 140,000 rows: the limit bounds a search's work by what it can show.
# The development conversations' questions reach at most 631 rows: their results are unchanged.
SEED_POSTINGS = 1024
# A sum over a turn's terms is rounded to this many decimals: threads add in any order, and
# the last bits of a float sum would otherwise reorder equal scores from one run to the next.
_DIGITS = 9
_LAST_POS = 2**31 - 1  # seq is an INTEGER: a conversation searched to its end
# A turn's seq bucket and its conversation packed into one join key (seq is an INTEGER, so a
# bucket takes less than 32 bits): one key joins several times faster than two.
_BUCKET_KEY = 2**32

# The turns a search does not read, by turn id: a private conversation's (kept out of the
# others) and the current conversation's after $last_seq (those left in the verbatim window are
# in the prompt already).
_UNSEARCHED = """unsearched AS (
    SELECT m.id FROM turns m JOIN conversations c ON c.id = m.conversation_id
    WHERE c.private AND c.name <> $conversation
    UNION ALL
    SELECT m.id FROM turns m JOIN conversations c ON c.id = m.conversation_id
    WHERE c.name = $conversation AND NOT coalesce(m.seq <= $last_seq, false)
)"""


def _matches(longer: int) -> str:
    """Whether index row `t` holds one of the query's terms ($terms), a word one of them
    begins with ($shorter), or one of `longer` longer words (a prefix test each)."""
    prefixes = "".join(f" OR starts_with(t.term, $longer{i})" for i in range(longer))
    return f"list_contains($terms, t.term) OR list_contains($shorter, t.term){prefixes}"


@functools.cache
def _terms_sql(longer: int) -> str:
    """The query's terms that the log holds, rarest first, read from the vocabulary: each with
    how many turns searched hold it (its count less the rows of the turns not searched) and
    bounds on their ids."""
    return f"""
WITH {_UNSEARCHED},
asked AS MATERIALIZED (
    SELECT t.term, t.df, t.first_id, t.last_id FROM {VOCAB_TABLE} t WHERE {_matches(longer)}
),
unsearched_rows AS (
    SELECT t.term, count(*) AS n FROM {TERMS_TABLE} t SEMI JOIN unsearched u ON u.id = t.turn_id
    WHERE t.term IN (SELECT term FROM asked) GROUP BY t.term
)
SELECT term, df - coalesce(n, 0) AS df, first_id, last_id
FROM asked LEFT JOIN unsearched_rows USING (term)
WHERE df > coalesce(n, 0) ORDER BY df, term
"""


@functools.cache
def _newest_sql(terms: int) -> str:
    """For each of `terms` terms (i), the ids of its $k{i} newest rows among the turns
    searched, read between ids $lo{i} and $hi{i}: the index is written in id order, so DuckDB's
    zone maps skip the row groups outside."""
    newest = "\nUNION ALL\n".join(
        f"(SELECT {i} AS i, turn_id FROM {TERMS_TABLE} WHERE term = $term{i}"
        f" AND turn_id BETWEEN $lo{i} AND $hi{i}"
        f" AND turn_id NOT IN (SELECT id FROM unsearched) ORDER BY turn_id DESC LIMIT $k{i})"
        for i in range(terms)
    )
    return f"WITH {_UNSEARCHED}\n{newest}"


# A term a search seeds from: the term, how many of its rows, how many it has, its bounds.
_Wanted = tuple[str, int, int, int, int]


def _seeds(
    con: duckdb.DuckDBPyConnection,
    conversation: str,
    last_seq: int,
    found: list[tuple],
    before: list[int],
) -> list[int]:
    """The ids of the turns that seed a search (SEED_POSTINGS), given the query's terms with
    their counts and bounds, rarest first (_terms_sql), and the rows of the terms rarer than
    each (`before`). A term that seeds all its rows reads
    them between its bounds; the term that crosses the limit reads first the newest stretch
    its rows would fill twice over at an even spread, and all of its bounds only if that
    stretch holds too few (a log that mentioned it mostly long ago)."""
    wanted: list[_Wanted] = [
        (term, min(df, SEED_POSTINGS - rarer), df, first, last)
        for (term, df, first, last), rarer in zip(found, before, strict=True)
        if rarer < SEED_POSTINGS
    ]
    stretch = [
        first if k == df else max(first, last - (last - first + 1) * 2 * k // df)
        for _, k, df, first, last in wanted
    ]
    rows = _newest(con, conversation, last_seq, wanted, stretch)
    short = [i for i, (_, k, _, _, _) in enumerate(wanted) if len(rows[i]) < k]
    if short:
        again = _newest(con, conversation, last_seq, [wanted[i] for i in short])
        rows.update(zip(short, again.values(), strict=True))
    return [id_ for ids in rows.values() for id_ in ids]


def _newest(
    con: duckdb.DuckDBPyConnection,
    conversation: str,
    last_seq: int,
    wanted: list[_Wanted],
    lows: list[int] | None = None,
) -> dict[int, list[int]]:
    """Each wanted term's newest ids (_newest_sql), from `lows` (default: its first id)."""
    params: dict[str, object] = {"conversation": conversation, "last_seq": last_seq}
    for i, (term, k, _, first, last) in enumerate(wanted):
        lo = first if lows is None else lows[i]
        params |= {f"term{i}": term, f"k{i}": k, f"lo{i}": lo, f"hi{i}": last}
    rows: dict[int, list[int]] = {i: [] for i in range(len(wanted))}
    for i, turn_id in con.execute(_newest_sql(len(wanted)), params).fetchall():
        rows[i].append(turn_id)
    return rows


@functools.cache
def _search_sql(ranking: Ranking, day_ranges: int, longer: int) -> str:
    """The search: the ranking terms composed, over the turns a query's terms reach. `day_ranges`
    is how many ranges of days the query names (in_days), `longer` how many of its terms the
    log's longer words may begin with (a prefix test each).

    The log searched is every conversation's turns but those `unsearched`: `searched`. A turn
    is (cid, pos): its conversation and its seq. Document length is counted in indexed words.
    The search reads what its terms reach, not the whole log: the query's terms with their
    counts in the log searched ($df_terms, $df, $df_before: the rows of the rarer terms, from
    the vocabulary by _terms_sql), the turns they seed ($seeds, by _seeds), the turns within
    a passage of a seed (`docs`: a few seq buckets around each), the index rows of the query's
    terms in those turns (`hits`), and for BM25's document count and mean length, the index's
    totals less those of the turns not searched (every turn has one row in DOCS_TABLE,
    written and deleted with it). A passage's document frequency is counted over the turns
    read (passage_df). A turn's neighbours are found by seq in its conversation; a deleted
    turn leaves a gap."""
    r = ranking
    span = r.passage_turns
    bucket = 2 * span + 2  # neighbours are looked up by seq buckets: a passage spans two at most
    reach = f"""
WITH searched AS (
    SELECT id AS cid, name = $conversation AS current,
        CASE WHEN name = $conversation THEN $last_seq ELSE {_LAST_POS} END AS last_pos
    FROM conversations WHERE name = $conversation OR NOT private
),
{_UNSEARCHED},
stats AS (
    SELECT n, greatest(CAST(dl AS DOUBLE) / nullif(n, 0), 1) AS avgdl FROM (
        SELECT (SELECT count(*) FROM turns) - (SELECT count(*) FROM unsearched) AS n,
            (SELECT coalesce(sum(length), 0) FROM {DOCS_TABLE})
            - (SELECT coalesce(sum(length), 0) FROM {DOCS_TABLE}
               WHERE turn_id IN (SELECT id FROM unsearched)) AS dl
    )
),
df AS MATERIALIZED (
    SELECT unnest($df_terms) AS term, unnest($df) AS df, unnest($df_before) AS before
),
seeds AS MATERIALIZED (
    SELECT m.conversation_id AS cid, m.seq AS pos FROM turns m
    SEMI JOIN (SELECT unnest($seeds) AS id) r ON r.id = m.id
),
docs AS MATERIALIZED (
    SELECT m.id, m.conversation_id AS cid, m.seq AS pos, m.role,
        {in_days(day_ranges)} AS named_day, s.current
    FROM turns m JOIN searched s ON s.cid = m.conversation_id
    SEMI JOIN (
        SELECT DISTINCT cid * {_BUCKET_KEY} + (pos + o) // {bucket} AS bucket
        FROM seeds CROSS JOIN (VALUES (-{span}), ({span})) r(o)
    ) b ON b.bucket = m.conversation_id * {_BUCKET_KEY} + m.seq // {bucket}
    WHERE m.seq <= s.last_pos
),
hits AS MATERIALIZED (
    SELECT docs.cid, docs.pos, t.term, t.tf AS f,
        list_position($terms, t.term) AS asked, coalesce(d.length, 0) AS dl
    FROM {TERMS_TABLE} t JOIN docs ON docs.id = t.turn_id
    LEFT JOIN {DOCS_TABLE} d ON d.turn_id = t.turn_id
    WHERE {_matches(longer)}
),
"""
    return reach + _score_sql(r, span)


def _score_sql(r: Ranking, span: int) -> str:
    """The search's second half (see _search_sql): each turn scored alone and as the middle
    of a passage, both rankings fused, the best PRIOR_POOL kept."""
    by_passage = rrf(
        "passages.score DESC, coalesce(turns.score, 0) DESC, cid DESC, pos DESC", r.rrf_k
    )
    return f"""turn_score AS MATERIALIZED (
    SELECT cid, pos, round(sum(
        {bm25("df.df", "hits.f", length_norm(r.b), r.k1)}
        * {related_word(r.related)}
    ), {_DIGITS}) AS score
    FROM hits JOIN df USING (term) CROSS JOIN stats GROUP BY cid, pos
),
turns AS MATERIALIZED (
    SELECT cid, pos, s.score * {r.boosts()} AS score
    FROM (
        SELECT cid, pos, sum(score) AS score FROM (
            SELECT cid, pos, score FROM turn_score
            UNION ALL {neighbour(r.neighbour)}
        ) GROUP BY cid, pos
    ) s JOIN docs USING (cid, pos)
),
ptf AS MATERIALIZED (
    SELECT cid, pos, term, f FROM (
        SELECT hits.cid, hits.pos + o AS pos, hits.asked AS term, sum(hits.f) AS f
        FROM hits CROSS JOIN range(-{span}, {span} + 1) AS r(o)
        WHERE hits.asked > 0 GROUP BY ALL
    ) SEMI JOIN docs USING (cid, pos)
),
pdf AS (
    SELECT p.term, {passage_df(span)} AS df
    FROM (SELECT term, count(*) AS df FROM ptf GROUP BY term) p
    JOIN df d ON list_position($terms, d.term) = p.term CROSS JOIN stats
),
passages AS MATERIALIZED (
    SELECT cid, pos, p.score * {r.boosts()} AS score
    FROM (
        SELECT cid, pos, round(sum({bm25("pdf.df", "ptf.f", k1=r.k1)}), {_DIGITS}) AS score
        FROM ptf JOIN pdf USING (term) CROSS JOIN stats GROUP BY cid, pos
    ) p JOIN docs USING (cid, pos)
),
fused AS (
    SELECT cid, pos, {rrf("score DESC, cid DESC, pos DESC", r.rrf_k)} AS s
    FROM turns
    UNION ALL
    SELECT cid, pos, {by_passage} AS s
    FROM passages LEFT JOIN turns USING (cid, pos)
),
ranked AS (
    SELECT fused.cid, fused.pos, sum(fused.s) AS s, any_value(coalesce(turns.score, 0)) AS own
    FROM fused LEFT JOIN turns USING (cid, pos) GROUP BY fused.cid, fused.pos
    ORDER BY s DESC, own DESC, fused.cid DESC, fused.pos DESC LIMIT {PRIOR_POOL}
)
SELECT docs.id, ranked.s, ranked.own FROM ranked JOIN docs USING (cid, pos)
"""


@functools.cache
def _prior_sql(ranking: Ranking) -> str:
    """The prior, on the best PRIOR_POOL, read by id ($ids: a filter on the scan, not a join
    over the log's texts), and their turns, best first."""
    return f"""
{SELECT_TURNS}
JOIN (SELECT unnest($ids) AS id, unnest($s) AS s, unnest($own) AS own) r ON r.id = m.id
LEFT JOIN (SELECT * FROM {DOCS_TABLE} WHERE list_contains($ids, turn_id)) d
    ON d.turn_id = m.id
WHERE list_contains($ids, m.id)
ORDER BY r.s + {ranking.prior()} DESC, r.own DESC, m.conversation_id DESC, m.seq DESC
LIMIT $limit
"""


def search_before(
    con: duckdb.DuckDBPyConnection,
    conversation: str,
    last_seq: int,
    query: RecallQuery | Sequence[str],
    limit: int = RECALL_TURNS,
    ranking: Ranking = RANKING,
) -> list[Turn]:
    """The turns of the log that best match `query`, best first: those of `conversation` up to
    `last_seq` (0: none of them) and those of every other conversation not kept private,
    ranked by `ranking`'s terms. A sequence of strings is a query of those stems alone."""
    if not isinstance(query, RecallQuery):
        query = RecallQuery(terms=tuple(t for t in query if t))
    if not query.terms or limit < 1:
        return []
    days = query.days[:MAX_DAY_RANGES]
    related = [t for t in query.terms if MIN_RELATED_CHARS <= len(t) <= MAX_RELATED_CHARS]
    related = related[:RELATED_TERMS]
    # The query's terms, the words they begin with, and (longer{i}) those that begin with them.
    asked: dict[str, object] = {
        "conversation": conversation,
        "last_seq": last_seq,
        "terms": list(query.terms),
        "shorter": [t[:n] for t in related for n in range(MIN_RELATED_CHARS, len(t))],
    }
    for i, term in enumerate(related):
        asked[f"longer{i}"] = term
    found = con.execute(_terms_sql(len(related)), asked).fetchall()
    if not found:
        return []
    counts = [df for _, df, _, _ in found]
    before = list(itertools.accumulate(counts, initial=0))[:-1]  # rows of the rarer terms
    params = asked | {
        "role": query.speaker,
        "df_terms": [term for term, _, _, _ in found],
        "df": counts,
        "df_before": before,
        "seeds": _seeds(con, conversation, last_seq, found, before),
    }
    for i, (first, until) in enumerate(days):
        params[f"from{i}"] = local_midnight_utc(first)
        params[f"until{i}"] = local_midnight_utc(until)
    ranked = con.execute(_search_sql(ranking, len(days), len(related)), params).fetchall()
    if not ranked:
        return []
    ids, s, own = (list(column) for column in zip(*ranked, strict=True))
    holds = _ASKS[query.asks][1] if query.asks in _ASKS else None  # None: no bonus
    rows = con.execute(
        _prior_sql(ranking), {"ids": ids, "s": s, "own": own, "holds": holds, "limit": limit}
    ).fetchall()
    return [turn_of(row) for row in rows]


def recall_line(turn: Turn, conversation: str | None = None) -> str:
    """A recalled turn as one line, with its day, and the name of its conversation if that is
    not `conversation` (the one it is recalled into): "- [8 May 2023] user: ...",
    "- [8 May 2023, in "travel"] user: ..."."""
    day = day_marker(turn.created_at)
    if conversation is not None and turn.conversation != conversation:
        day = f'[{day_label(turn.created_at)}, in "{turn.conversation}"]'
    return f"- {day} {turn.role}: {' '.join(anchored(turn.text, turn.created_at).split())}"
