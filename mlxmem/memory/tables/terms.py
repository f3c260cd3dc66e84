"""Recall's index: the terms of every turn, written when the turn is, in the same file.

A turn's words are lowercased, stopwords dropped, and stemmed by Snowball's English stemmer
(PyStemmer): a well-kept stemmer, where a hand-written suffix rule met "paintings" and "paint"
but not "adopted" and "adoption", and left "stories" apart from "story". The index holds one
row per (turn, term) with the term's count, and one row per turn with its length in
indexed words, so BM25 (mlxmem.memory.recall) reads counts instead of splitting every turn's
text in SQL on every query.

A third table, the vocabulary, holds one row per term: how many index rows it has (its
document frequency) and the ids of the first and last turns that hold it. A search reads
its terms' counts there instead of counting them over every index row, and reads a term's
rows between its bounds, which DuckDB's zone maps turn into a read of a few row groups for a
rare word or a recent one (mlxmem.memory.recall). In `mlxmem bench scale`'s log of
1,000,000 turns the index has 10.3 million rows and the vocabulary 167,000.

The index is derived data, like a summary: it holds stems of a turn's words, so deleting a
turn deletes its rows in the same transaction (`unindex`, called by the store's delete),
down to a term's vocabulary row when no turn holds it any more, and the erase that follows
compacts them out of the file with the turn (invariant 5). Every path that inserts turns
indexes them (`index_turns`); a change to how terms are made needs a migration that
rebuilds the index (`reindex`).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence

import duckdb
import Stemmer

TERMS_TABLE = "recall_terms"  # turn_id, term, tf
DOCS_TABLE = "recall_docs"  # turn_id, length (indexed words)
VOCAB_TABLE = "recall_vocab"  # term, df (index rows), first_id, last_id (bounds on their ids)

_WORD_RE = re.compile(r"[^\W_]+")  # letters and digits, any script
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

# PyStemmer's objects are not thread-safe (the server answers on threads): one per thread.
_local = threading.local()


def stemmer(algorithm: str = "english") -> Stemmer.Stemmer:
    """This thread's PyStemmer of `algorithm` (recall's index: Snowball's "english")."""
    found = getattr(_local, algorithm, None)
    if found is None:
        found = Stemmer.Stemmer(algorithm)
        setattr(_local, algorithm, found)
    return found


def stem(word: str) -> str:
    return stemmer().stemWord(word)


_STOP_STEMS = frozenset(stem(w) for w in STOPWORDS)


def terms(text: str) -> list[str]:
    """The stems of `text`'s words worth searching by, in order, repeats kept."""
    words = [w for w in _WORD_RE.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS]
    return [s for s in stemmer().stemWords(words) if s not in _STOP_STEMS]


def index_turns(con: duckdb.DuckDBPyConnection, rows: Iterable[tuple[int, str]]) -> None:
    """Index turns (id, text) inside the caller's transaction, vocabulary included: one
    or two statements per table, whatever the number of turns."""
    ids, words = _index(con, rows)
    if ids:
        _count_in(con, ids, words)


def _index(
    con: duckdb.DuckDBPyConnection, rows: Iterable[tuple[int, str]]
) -> tuple[list[int], list[str]]:
    """Write turns' rows in the index and their lengths; return the index rows written
    (turn id, term), for the vocabulary."""
    term_rows: list[tuple[int, str, int]] = []
    doc_ids: list[int] = []
    lengths: list[int] = []
    for turn_id, text in rows:
        found = terms(text)
        doc_ids.append(turn_id)
        lengths.append(len(found))
        term_rows += [(turn_id, term, n) for term, n in Counter(found).items()]
    if not doc_ids:
        return [], []
    con.execute(
        f"INSERT INTO {DOCS_TABLE} SELECT unnest(?::BIGINT[]), unnest(?::INTEGER[])",
        [doc_ids, lengths],
    )
    if not term_rows:
        return [], []
    ids, words, counts = (list(column) for column in zip(*term_rows, strict=True))
    con.execute(
        f"INSERT INTO {TERMS_TABLE} SELECT unnest(?::BIGINT[]), unnest(?::VARCHAR[]),"
        " unnest(?::INTEGER[])",
        [ids, words, counts],
    )
    return ids, words


def _count_in(con: duckdb.DuckDBPyConnection, ids: list[int], words: list[str]) -> None:
    """Add new index rows (turn id, term) to the vocabulary: one upsert, which finds a
    term's row by the table's key instead of reading every term."""
    con.execute(
        f"INSERT INTO {VOCAB_TABLE} SELECT term, count(*), min(id), max(id)"
        " FROM (SELECT unnest(?::BIGINT[]) AS id, unnest(?::VARCHAR[]) AS term) GROUP BY term"
        " ON CONFLICT (term) DO UPDATE SET df = df + excluded.df,"
        " first_id = least(first_id, excluded.first_id),"
        " last_id = greatest(last_id, excluded.last_id)",
        [ids, words],
    )


def unindex(con: duckdb.DuckDBPyConnection, turn_ids: Sequence[int]) -> None:
    """Delete turns' index rows, in the transaction that deletes the turns, and count
    their terms' vocabulary rows again from the rows left: a term no turn holds any more
    leaves, and no bound keeps a deleted turn's id (which would tell that it held the
    term)."""
    ids = list(turn_ids)
    held = [
        term
        for (term,) in con.execute(
            f"SELECT DISTINCT term FROM {TERMS_TABLE} WHERE list_contains(?, turn_id)", [ids]
        ).fetchall()
    ]
    for table in (TERMS_TABLE, DOCS_TABLE):
        con.execute(f"DELETE FROM {table} WHERE list_contains(?, turn_id)", [ids])
    if held:
        count_vocabulary(con, held)


def index_missing(con: duckdb.DuckDBPyConnection) -> int:
    """Index the turns that have no index rows yet (those written before the index, or by
    a bulk load), and count the vocabulary afresh; return how many. (The migration that made
    the index ran before there was a vocabulary: the one that made it counts it.)"""
    rows = con.execute(
        f"SELECT id, text FROM turns WHERE id NOT IN (SELECT turn_id FROM {DOCS_TABLE})"
    ).fetchall()
    _index(con, rows)
    has_vocabulary = con.execute(
        "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() AND table_name = ?",
        [VOCAB_TABLE],
    ).fetchone()
    if has_vocabulary:
        count_vocabulary(con)
    return len(rows)


def count_vocabulary(con: duckdb.DuckDBPyConnection, only: list[str] | None = None) -> None:
    """Count the vocabulary's rows afresh from the index (those of the terms `only`, or all):
    exact counts and bounds."""
    which = "" if only is None else " WHERE term IN (SELECT unnest($only::VARCHAR[]))"
    params = {} if only is None else {"only": only}
    con.execute(f"DELETE FROM {VOCAB_TABLE}{which}", params)
    con.execute(
        f"INSERT INTO {VOCAB_TABLE} SELECT term, count(*), min(turn_id), max(turn_id)"
        f" FROM {TERMS_TABLE}{which} GROUP BY term",
        params,
    )


def reindex(con: duckdb.DuckDBPyConnection) -> int:
    """Rebuild the whole index (after a change to how terms are made)."""
    for table in (TERMS_TABLE, DOCS_TABLE):
        con.execute(f"DELETE FROM {table}")
    return index_missing(con)
