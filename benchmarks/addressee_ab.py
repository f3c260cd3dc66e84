"""Does reading a message without the names it greets give more facts about the writer, as
precise? Fact extraction with the message as written against the same message less its greeted
names (`mlxmem.memory.extraction.without_addressee`), paired: the first user messages of each
development conversation, as `mlxmem eval facts` sends them, scored by its matcher against
LoCoMo's observations (precision, attribution errors, coverage).

    python benchmarks/addressee_ab.py RUN.jsonl [--model qwen2.5-coder-1.5b] [--score]

The model's answer depends only on the message, so a message that greets nobody is asked once
and counts for both arms. RUN.jsonl keeps each message's answers as they come (the model's
text: keep it outside the repository); a rerun skips the messages done. The printed figures
hold no text.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from mlxmem.defaults import FACTS_SLOT
from mlxmem.engine import Sampling, load_engine
from mlxmem.eval import facts as fe
from mlxmem.eval.locomo import default_data_dir, load_conversation
from mlxmem.memory.context.budget import shorten
from mlxmem.memory.extraction import (
    MAX_FACT_TOKENS,
    FactExtractor,
    extraction_messages,
    is_duplicate,
    judge,
    should_extract,
    without_addressee,
)

# As the fact benchmark's runs in docs/memory-quality.md: 80 of conv-30's, 60 of the others'.
MESSAGES = {"conv-26": 60, "conv-30": 80, "conv-41": 60, "conv-42": 60, "conv-43": 60}


def answer(extractor: FactExtractor, message: str) -> tuple[str, str]:
    """The model's answer to `message` exactly as given, and how the run ended."""
    engine = extractor.engine
    room = extractor.budget - MAX_FACT_TOKENS - extractor.frame - 8
    tokens = engine.encode_chat(extraction_messages(shorten(engine, message, room)))
    result = engine.generate(tokens, Sampling(max_tokens=MAX_FACT_TOKENS), slot=FACTS_SLOT)
    return result.text, result.stats.finish_reason


def run(out: Path, model: str, data: Path) -> None:
    done = set()
    if out.exists():
        done = {(r["conversation"], r["turn"]) for r in map(json.loads, out.open())}
    extractor = None
    with out.open("a") as f:
        for cid, n in MESSAGES.items():
            users = [t for t in load_conversation(data, cid).turns if t["role"] == "user"][:n]
            for turn in users:
                if (cid, turn["id"]) in done:
                    continue
                row = {
                    "conversation": cid,
                    "turn": turn["id"],
                    "asked": should_extract(turn["text"]),
                }
                if row["asked"]:
                    if extractor is None:
                        engine, _ = load_engine(model, cache_dir=None)
                        extractor = FactExtractor(engine, 4096)
                    row["as_written"] = answer(extractor, turn["text"].strip())
                    stripped = without_addressee(turn["text"])
                    same = stripped == turn["text"].strip()
                    row["stripped"] = row["as_written"] if same else answer(extractor, stripped)
                    row["greeted"] = not same
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(cid, turn["id"], file=sys.stderr, flush=True)


def score(out: Path, data: Path) -> dict:
    rows = [json.loads(line) for line in out.open()]
    result: dict = {"conversations": {}, "pooled": {}}
    for arm in ("as_written", "stripped"):
        runs = []
        for cid in MESSAGES:
            conv = load_conversation(data, cid)
            text = {t["id"]: t["text"] for t in conv.turns}
            mine = [r for r in rows if r["conversation"] == cid]
            kept: list[tuple[str, str]] = []
            outcomes: dict[str, int] = {}
            said: dict[str, str] = {}  # each message's outcome, by turn
            for r in mine:
                if not r["asked"]:
                    continue
                raw, finish = r[arm]
                fact, outcome = (
                    (None, "ran_long") if finish == "length" else judge(raw, (), text[r["turn"]])
                )
                if fact is not None and is_duplicate(fact, [k for k, _ in kept]):
                    fact, outcome = None, "duplicate"
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                said[r["turn"]] = outcome
                if fact is not None:
                    kept.append((fact, r["turn"]))
            names = (conv.user_name, conv.assistant_name)
            scored = fe.score_facts(
                kept, fe.load_observations(data, cid), [r["turn"] for r in mine], names
            )
            scored.pop("facts")
            # What became of the message of each observation no fact covers: the model said
            # NONE, a filter refused its answer, or a fact was kept that covers another.
            lost = Counter(said.get(turn, "short") for turn in scored.pop("uncovered_turns"))
            one = {
                "conversation": cid,
                "messages": len(mine),
                "greeted": sum(r.get("greeted", False) for r in mine),
                **scored,
                "outcomes": outcomes,
                "uncovered_by_outcome": dict(lost),
            }
            result["conversations"].setdefault(cid, {})[arm] = one
            runs.append(one)
        lost = sum((Counter(r["uncovered_by_outcome"]) for r in runs), Counter())
        result["pooled"][arm] = fe.pooled(runs) | {"uncovered_by_outcome": dict(lost)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--score", action="store_true", help="only score the answers written")
    args = parser.parse_args()
    data = args.data or default_data_dir()
    if not args.score:
        run(args.out, args.model, data)
    print(json.dumps(score(args.out, data), indent=1))


if __name__ == "__main__":
    main()
