"""Recall's ranking, term by term: each term's SQL evaluated alone in DuckDB, and its effect on
a search of a real DuckDB file, against the same search with that one term set to its neutral
value (Ranking). The logs are made up and short; matching turns are kept eight turns apart,
with plain filler between, where no passage or reply should hold two of them."""

import itertools
import math
import os
from datetime import date, datetime, timezone
from pathlib import Path

import pytest

from mlxmem.memory.recall import (
    ANSWER_BONUS,
    LENGTH_PRIOR,
    QUESTION_PENALTY,
    RANKING,
    RELATED_WEIGHT,
    SELF_BONUS,
    SPEAKER_BOOST,
    Ranking,
    RecallQuery,
    answer_bonus,
    bm25,
    current_factor,
    days_factor,
    idf,
    in_days,
    length_norm,
    length_prior,
    neighbour,
    passage_df,
    question_penalty,
    recall_query,
    related_word,
    rrf,
    search_before,
    self_bonus,
    speaker_factor,
)
from mlxmem.memory.store import Store

FILLER = [
    "Cold today.",
    "Lunch was soup.",
    "The bus was late.",
    "Quiet evening.",
    "Traffic jam.",
    "Tea time.",
    "Laundry day.",
]


def spaced(*texts: str) -> list[str]:
    """`texts`, each followed by the seven filler turns: the first at seq 1, the next at 9..."""
    return [line for text in texts for line in (text, *FILLER)]


_files = itertools.count()


def logged(texts, roles=None, times=None, conversation="c", store=None) -> Store:
    """A new store (or `store`) with `texts` logged in `conversation`."""
    store = store or Store(Path(os.environ["MLXMEM_HOME"]) / f"log{next(_files)}.duckdb")
    for i, text in enumerate(texts):
        role = roles[i] if roles else "user"
        store.append_turn(conversation, role, text, at=times[i] if times else None)
    return store


def ranked(store, query, ranking=RANKING, conversation="c", limit=12) -> list[int]:
    """The seq numbers recall finds for `query`, best first, in `conversation` to its end."""
    with store.connect() as con:
        return [t.seq for t in search_before(con, conversation, 10**6, query, limit, ranking)]


def values(sql: str, params=None) -> list:
    """The first column of `sql`, run on a real DuckDB file."""
    with Store().connect() as con:
        return [float(row[0]) for row in con.execute(sql, params or {}).fetchall()]


# -- BM25 over a turn ------------------------------------------------------------------------


def test_idf_weighs_a_rarer_word_more():
    found = values(
        f"SELECT {idf('t.df')} FROM (SELECT 100 AS n) stats, (VALUES (1), (10), (90)) t(df)"
        " ORDER BY t.df"
    )
    assert found[0] > found[1] > found[2] > 0


def test_bm25_saturates_a_repeated_word():
    one, two, four = values(
        f"SELECT {bm25('1', 't.f')} FROM (SELECT 100 AS n) stats, (VALUES (1), (2), (4)) t(f)"
        " ORDER BY t.f"
    )
    assert one < two < four
    assert two / one == pytest.approx(2 * 2.2 / 3.2)  # k1 1.2: twice the word, 1.375 the score
    assert four / two < two / one


def test_length_normalization_favours_the_shorter_turn():
    sql = "SELECT {} FROM (SELECT 10.0 AS avgdl) stats, (VALUES (10), (20)) hits(dl) ORDER BY dl"
    assert values(sql.format(length_norm())) == [1.0, 1.5]  # at half strength
    assert values(sql.format(length_norm(0))) == [1.0, 1.0]
    long = "The kayak drifted past the old lighthouse and along the harbour wall at dusk."
    store = logged(spaced("Kayak.", long))
    # Without the length prior (which favours the long turn), the short one first; without the
    # normalization either, a tie, and the later first.
    assert ranked(store, recall_query("The kayak?"), Ranking(length=0))[0] == 1
    assert ranked(store, recall_query("The kayak?"), Ranking(length=0, b=0))[0] == 9


# -- Related words, the reply, passages -----------------------------------------------------


def test_a_related_word_counts_for_a_fraction_of_the_word():
    found = values(f"SELECT {related_word()} FROM (VALUES (1), (0)) hits(asked) ORDER BY 1 DESC")
    assert found == [1, pytest.approx(RELATED_WEIGHT)]
    store = logged(["Her mentorship helped.", "Her mentor helped.", "Cold today.", "Tea time."])
    # The second also gets half the first's score, as its reply: with a related word worth
    # as much as the word, it would come first.
    assert ranked(store, recall_query("Any mentorship?"))[0] == 1
    assert ranked(store, recall_query("Any mentorship?"), Ranking(related=1.0))[0] == 2


def test_the_reply_to_a_matching_turn_gets_a_share_of_its_score():
    with Store().connect() as con:
        row = con.execute(
            f"WITH turn_score AS (SELECT 1 AS cid, 5 AS pos, 2.0 AS score) {neighbour()}"
        ).fetchone()
    assert row == (1, 6, 1.0)
    texts = ["So Mel signed with a new team.", "Yes, the Lakers, as a guard.", *FILLER]
    store = logged([*texts, "Team photos are up."])
    question = recall_query("Which team did you sign with?")
    # The answer, though it has no word asked, ranks above a turn with one of them; not so
    # without its share.
    found = ranked(store, question)
    assert found[:2] == [1, 2]
    without = ranked(store, question, Ranking(neighbour=0))
    assert without[0] == 1 and without.index(10) < without.index(2)


def test_a_passage_holds_the_words_of_a_short_exchange():
    close = ["Some rye.", "Cold today.", "Some bread.", *FILLER]
    store = logged([*close, *spaced("More rye.", "More bread.")])
    # One word in each turn, alike: the two close together make one passage; without passages,
    # a tie, and the latest first.
    assert set(ranked(store, recall_query("Rye bread?"))[:2]) == {1, 3}
    assert ranked(store, recall_query("Rye bread?"), Ranking(passage_turns=0))[0] == 19


def test_a_passage_frequency_is_counted_or_estimated():
    sql = (
        f"SELECT {passage_df(3)} FROM (SELECT 100 AS n) stats, (SELECT 5 AS df) p,"
        " (SELECT ? AS before, 10 AS df) d"
    )
    assert values(sql, [0]) == [5]  # every row of the term was read: the passages counted
    # Beyond the seed limit: as if the term's 10 turns of 100 fell at random, 7 to a passage.
    assert values(sql, [5000]) == [pytest.approx(100 * (1 - 0.9**7))]


# -- Boosts ------------------------------------------------------------------------------------


def test_the_speaker_a_message_names_counts_more():
    sql = f"SELECT {speaker_factor()} FROM (VALUES ('user'), ('assistant')) docs(role)"
    assert values(sql, {"role": "assistant"}) == [1, SPEAKER_BOOST]
    assert values(sql, {"role": None}) == [1, 1]  # no speaker asked about
    store = logged(
        spaced("The kayak is red.", "The kayak is red."), roles=["user"] + 15 * ["assistant"]
    )
    assert ranked(store, RecallQuery(("kayak",), ("user",)))[0] == 1
    assert ranked(store, RecallQuery(("kayak",), ("user",)), Ranking(speaker=1))[0] == 9
    assert ranked(store, RecallQuery(("kayak",)))[0] == 9  # a tie: the later first
    assert ranked(store, RecallQuery(("kayak",), ("user", "assistant")))[0] == 9  # both named


def noon(month: int, day: int) -> datetime:
    return datetime(2023, month, day, 12, tzinfo=timezone.utc)


def test_the_days_a_message_names_count_more():
    texts = spaced("We baked rye bread.", "We baked rye bread.")
    store = logged(texts, times=[noon(5, 2)] * 8 + [noon(5, 20)] * 8)
    with store.connect() as con:
        params = {"from0": noon(5, 1), "until0": noon(5, 3)}
        found = con.execute(f"SELECT seq FROM turns m WHERE {in_days(1)}", params).fetchall()
        assert [s for (s,) in found] == list(range(1, 9))
        assert con.execute(f"SELECT count(*) FROM turns m WHERE {in_days(0)}").fetchone() == (0,)
    flags = values(f"SELECT {days_factor()} FROM (VALUES (true), (false)) docs(named_day)")
    assert flags == [2.0, 1]
    may_2 = RecallQuery(("bread",), days=((date(2023, 5, 2), date(2023, 5, 3)),))
    assert ranked(store, may_2)[0] == 1
    assert ranked(store, may_2, Ranking(days=1))[0] == 9
    assert ranked(store, RecallQuery(("bread",)))[0] == 9


def test_the_current_conversation_is_not_preferred():
    sql = "SELECT {} FROM (VALUES (true), (false)) docs(current)"
    assert values(sql.format(current_factor())) == [1, 1]
    assert values(sql.format(current_factor(2))) == [2, 1]
    store = logged(["The kayak is red."], conversation="here")
    logged(["The kayak is red."], conversation="there", store=store)
    with store.connect() as con:

        def first(ranking):
            return search_before(con, "here", 1, ["kayak"], 2, ranking)[0].conversation

        assert first(RANKING) == "there"  # a tie: the conversation created later first
        assert first(Ranking(current=2.0)) == "here"


# -- Fusion -------------------------------------------------------------------------------------


def test_the_rankings_are_fused_by_reciprocal_rank():
    found = values(f"SELECT {rrf('x DESC')} FROM (VALUES (1.0), (3.0), (2.0)) t(x) ORDER BY 1 DESC")
    assert found == [pytest.approx(1 / 21), pytest.approx(1 / 22), pytest.approx(1 / 23)]
    # A match first in both rankings keeps its lead over its reply (which has more words, and
    # so the length prior) at k 20; at the usual 60 the ranks count so little that it does not.
    store = logged(["Some rye.", "The bus was late again today.", *FILLER])
    assert ranked(store, recall_query("Rye?"))[0] == 1
    assert ranked(store, recall_query("Rye?"), Ranking(rrf_k=60))[0] == 2


# -- The prior ----------------------------------------------------------------------------------


def prior_terms(texts: list[str], term: str, params=None) -> list:
    """`term` for each turn of a log of `texts`, by seq."""
    store = logged(texts)
    with store.connect() as con:
        rows = con.execute(
            f"SELECT {term} FROM turns m LEFT JOIN recall_docs d ON d.turn_id = m.id"
            " ORDER BY m.seq",
            params or {},
        ).fetchall()
    return [float(row[0]) for row in rows]


def test_a_longer_turn_ranks_higher():
    long = "The kayak drifted past the old lighthouse and along the harbour wall at dusk."
    found = prior_terms(["Kayak.", long], length_prior())
    # Per ln(1 + indexed words): 1 and 9 ("the", "and", "at" are not indexed).
    assert found == [
        pytest.approx(LENGTH_PRIOR * math.log(2)),
        pytest.approx(LENGTH_PRIOR * math.log(10)),
    ]
    # With BM25's length normalization off, a tie but for the prior.
    store = logged(spaced(long, "Kayak."))
    assert ranked(store, recall_query("The kayak?"), Ranking(b=0))[0] == 1
    assert ranked(store, recall_query("The kayak?"), Ranking(b=0, length=0))[0] == 9


def test_a_turn_that_asks_ranks_lower():
    texts = ["The kayak was red.", "Was the kayak red?", "Was it red?  ", "Red? No."]
    assert prior_terms(texts, question_penalty()) == [0, QUESTION_PENALTY, QUESTION_PENALTY, 0]
    store = logged(spaced("The kayak was red.", "Was the kayak red?"))
    assert ranked(store, recall_query("The red kayak?"))[0] == 1
    assert ranked(store, recall_query("The red kayak?"), Ranking(question=0))[0] == 9


def test_a_turn_that_holds_what_is_asked_for_ranks_higher():
    texts = ["We baked rye bread on Friday.", "We baked rye bread on purpose."]
    assert prior_terms(texts, answer_bonus(), {"holds": "(?i)friday"}) == [ANSWER_BONUS, 0]
    assert prior_terms(texts, answer_bonus(), {"holds": None}) == [0, 0]  # nothing asked
    store = logged(texts)
    when = recall_query("When did we bake rye bread?")
    assert when.asks == "when"
    assert ranked(store, when) == [1, 2]
    assert ranked(store, when, Ranking(answer=0)) == [2, 1]  # the reply gets a share: first
    assert ranked(store, recall_query("Why did we bake rye bread?")) == [2, 1]


def test_a_turn_that_tells_of_its_speaker_ranks_higher():
    texts = ["I love rye bread.", "You love rye bread.", "I know you love it, you do."]
    assert prior_terms(texts, self_bonus()) == [SELF_BONUS, 0, 0]
    # The prior moves a turn a place or two among close matches: four strong matches first,
    # then two alike but for who they speak of.
    strong = ["Rye bread with love, rye bread with love.", *FILLER[:4]] * 4
    store = logged([*strong, *spaced("I love rye bread.", "You love rye bread.")])
    question = recall_query("Who loves rye bread?")

    def alike(ranking):
        return [s for s in ranked(store, question, ranking) if s in (21, 29)]

    assert alike(RANKING) == [21, 29]
    assert alike(Ranking(speaks_of_self=0)) == [29, 21]
