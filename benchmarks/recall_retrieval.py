"""Does recall find the turn a question is about? Retrieval alone, no model: each development
conversation of LoCoMo is logged into a scratch store as the eval replays it (each turn at its
session's time), and for each
question (categories 1-4) whose evidence lies before the window, recall's search ranks the
turns before the window against the question as the eval asks it.

    python benchmarks/recall_retrieval.py [--window 60] [--data DIR] [--json] [--scale N]
        [--conversation-per-session]

The window's edge is `--window` messages before the end (the eval's runs with a 4,096-token
budget left 40 to 70 messages verbatim). A question counts as found at k when one of its
evidence turns is among the first k results, and all found at k when every one of its evidence
turns before the window is (what a multi-hop question needs); found at 4 is the figure tracked
across versions; recall puts up to RECALL_TURNS (6) in the prompt, as many as fit its share.
With `--conversation-per-session`, each session is logged as a conversation of its own (as a
companion app opens a new chat each day), and each question is searched across all of them
from a new conversation, as a person asks it in a new chat the next day: every evidence turn
counts, none is in a window.
Figures are the same for any model: they bound what recall can give a 3B model. `--scale N`
also times the search over one conversation of N messages (the first conversation's turns
repeated): the median over its first 20 questions, connection open included, as a turn pays it.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from mlxmem.eval.locomo import (
    CATEGORIES,
    NEW_CHAT,
    SCORED,
    default_data_dir,
    exchange_times,
    exchanges,
    load_conversation,
    probe_text,
    sessions_apart,
)
from mlxmem.memory.recall import RECALL_TURNS, recall_query, search_before
from mlxmem.memory.store import Store
from mlxmem.memory.tables.terms import index_missing
from mlxmem.memory.tables.turns import insert_turn
from mlxmem.text import OLD_COUNT_NAMES, with_old_names

DEPTHS = tuple(sorted({1, 4, RECALL_TURNS, 10}))
SCALE_QUESTIONS = 20  # timed at --scale


def conversation_ids(data: Path) -> list[str]:
    return sorted(p.name.removesuffix(".qa.json") for p in (data / "qa").glob("*.qa.json"))


def measure(data: Path, cid: str, window: int, store_dir: Path) -> list[dict]:
    conv = load_conversation(data, cid)
    pairs, seq_of = exchanges(conv)
    store = Store(store_dir / f"{cid}.duckdb")
    with store.connect() as con:  # one transaction: as append_turn would, without N opens
        for (user, reply), (asked, answered) in zip(pairs, exchange_times(conv), strict=True):
            insert_turn(con, cid, "user", user, at=asked)  # at its session's time, as the eval
            insert_turn(con, cid, "assistant", reply, at=answered)
    edge = 2 * len(pairs) - window
    rows = []
    with store.connect() as con:
        for q in conv.questions:
            evidence = {seq_of[e] for e in q.evidence if e in seq_of}
            if q.category not in SCORED or not evidence or min(evidence) > edge:
                continue
            searched = {e for e in evidence if e <= edge}
            hit = lambda t, e=searched: t.seq in e  # noqa: E731
            rows.append(search(con, conv, q, cid, edge, hit, len(searched)))
    return rows


def measure_per_session(data: Path, cid: str, store_dir: Path) -> list[dict]:
    conv = load_conversation(data, cid)
    store = Store(store_dir / f"{cid}-sessions.duckdb")
    where: dict[str, tuple[str, int]] = {}  # dialogue id -> (conversation, seq)
    with store.connect() as con:
        for name, session in sessions_apart(conv):
            pairs, seq_of = exchanges(session)
            where |= {dia: (name, seq) for dia, seq in seq_of.items()}
            for (user, reply), (asked, answered) in zip(
                pairs, exchange_times(session), strict=True
            ):
                insert_turn(con, name, "user", user, at=asked)
                insert_turn(con, name, "assistant", reply, at=answered)
    rows = []
    with store.connect() as con:
        for q in conv.questions:
            evidence = {where[e] for e in q.evidence if e in where}
            if q.category not in SCORED or not evidence:
                continue
            hit = lambda t, e=evidence: (t.conversation, t.seq) in e  # noqa: E731
            rows.append(search(con, conv, q, NEW_CHAT, 0, hit, len(evidence)))
    return rows


def search(con, conv, question, conversation: str, last_seq: int, hit, needed: int) -> dict:
    """Recall's search for `question` as the eval asks it, from `conversation` (its turns up to
    `last_seq` searched): the rank of the first turn found for which `hit` holds, the rank by
    which all `needed` such turns were (the evidence turns searched), and the time."""
    query = recall_query(probe_text(conv, question))
    start = time.perf_counter()
    found = search_before(con, conversation, last_seq, query, max(DEPTHS))
    seconds = time.perf_counter() - start
    ranks = [r for r, t in enumerate(found, 1) if hit(t)]
    return {
        "conversation": conv.id,
        "category": CATEGORIES[question.category],
        "rank": ranks[0] if ranks else None,
        # The rank by which every evidence turn searched was found (a multi-hop question needs
        # them all), None if one was not among the first max(DEPTHS).
        "all_rank": ranks[-1] if len(ranks) == needed else None,
        "seconds": seconds,
    }


def time_at_scale(data: Path, cid: str, messages: int, store_dir: Path) -> float:
    conv = load_conversation(data, cid)
    pairs, _ = exchanges(conv)
    texts = [text for pair in pairs for text in pair]
    store = Store(store_dir / "scale.duckdb")
    store.append_turn("big", "user", texts[0])  # creates the conversation
    with store.connect() as con:
        con.execute(
            "INSERT INTO turns (conversation_id, seq, role, text, created_at) "
            "SELECT m.conversation_id, i, CASE WHEN i % 2 = 1 THEN 'user' ELSE 'assistant' END, "
            "list_extract(?, ((i - 1) % ?) + 1), now() FROM range(2, ? + 1) t(i), "
            "(SELECT conversation_id FROM turns LIMIT 1) m",
            [texts, len(texts), messages],
        )
        index_missing(con)  # a bulk load bypasses the store's insert, which indexes each turn
    times = []
    for q in conv.questions[:SCALE_QUESTIONS]:
        start = time.perf_counter()
        with store.connect() as con:
            search_before(con, "big", messages, recall_query(probe_text(conv, q)))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def summarize(rows: list[dict]) -> dict:
    groups = {"overall": rows} | {
        name: [r for r in rows if r["category"] == name] for name in CATEGORIES.values()
    }
    out = {}
    for name, group in groups.items():
        if not group:
            continue
        out[name] = (
            {"questions": len(group)}
            | {
                f"found_at_{k}": sum(r["rank"] is not None and r["rank"] <= k for r in group)
                / len(group)
                for k in DEPTHS
            }
            | {
                f"all_found_at_{k}": sum(
                    r["all_rank"] is not None and r["all_rank"] <= k for r in group
                )
                / len(group)
                for k in DEPTHS
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=60, help="Messages left verbatim.")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--scale", type=int, default=0, help="Also time a log of N turns.")
    parser.add_argument(
        "--conversation-per-session",
        action="store_true",
        help="Log each session as its own conversation; search all of them from a new one.",
    )
    args = parser.parse_args()
    data = args.data or default_data_dir()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mlxmem-recall-") as tmp:
        for cid in conversation_ids(data):
            if args.conversation_per_session:
                rows += measure_per_session(data, cid, Path(tmp))
            else:
                rows += measure(data, cid, args.window, Path(tmp))
        first = conversation_ids(data)[0]
        at_scale = time_at_scale(data, first, args.scale, Path(tmp)) if args.scale else 0.0
    result = {
        "mode": "conversation_per_session" if args.conversation_per_session else "one_conversation",
        "window": None if args.conversation_per_session else args.window,
        "conversations": conversation_ids(data),
        "by_category": summarize(rows),
        "search_ms_mean": 1000 * sum(r["seconds"] for r in rows) / max(len(rows), 1),
        "scale": with_old_names(
            {"turns": args.scale, "search_ms_median": 1000 * at_scale}, OLD_COUNT_NAMES
        )
        if args.scale
        else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if args.conversation_per_session:
        print(f"{len(rows)} questions, each session its own conversation, asked in a new one")
    else:
        print(f"{len(rows)} questions with evidence before the window ({args.window} messages)")
    for name, s in result["by_category"].items():
        cells = "  ".join(f"@{k} {s[f'found_at_{k}']:.0%}" for k in DEPTHS)
        cells += "   all: " + "  ".join(f"@{k} {s[f'all_found_at_{k}']:.0%}" for k in DEPTHS)
        print(f"{name:>12} n={s['questions']:<4} {cells}")
    print(f"search: {result['search_ms_mean']:.1f} ms per question")
    if args.scale:
        print(f"at {args.scale:,} messages: {1000 * at_scale:.0f} ms (median, open included)")


if __name__ == "__main__":
    main()
