"""Which summary request does a real model follow best, and do its summaries pass the check?
Prompt tuning for issues 10 and 19.

    python benchmarks/summary_prompts.py MODEL_DIR [--conversation conv-30] [--exchanges 12]
        [--windows 0 40] [--requests before third_person]

For each window (`--exchanges` exchanges of a LoCoMo conversation starting at each of
`--windows`) and each candidate request, the model writes a summary greedily from the chat
prompt a fold builds (mlxmem's instructions, the turns, then the request), capped at
SUMMARY_MAX_TOKENS. Scored without a judge: the share of the window's named entities
(capitalized words not opening a sentence) the summary keeps, the share of its sentences that
are distinct, whether it ended by itself, and the verdict of mlxmem's check
(mlxmem.memory.context.summary_check: what a fold does with it). Each window also gets the
extractive summary a failed check falls back to (no model; "request": "extractive"; its day
labels are a fixed day, the windows' own dates are in the text). Prints one JSON line per
(window, request), then one line per request with the means and the check's pass rate.

Candidates: `before` is the request of issue 10; `third_person` is mlxmem's request now
(summary_request, with the speakers' names found in the window as a fold finds them);
`third_person_anonymous` is the same without the names.
"""

import argparse
import json
import re
from datetime import datetime, timezone
from pathlib import Path

from mlxmem.engine import Message, MLXEngine, Sampling
from mlxmem.eval.locomo import (
    default_data_dir,
    exchanges,
    load_conversation,
    named_entities,
)
from mlxmem.memory.companion import INSTRUCTIONS
from mlxmem.memory.context.extractive import extractive_summary
from mlxmem.memory.context.speakers import speaker_names
from mlxmem.memory.context.summary_check import check_summary
from mlxmem.memory.tables.turns import Turn
from mlxmem.memory.window import SUMMARY_MAX_TOKENS, summary_request

BEFORE = (
    "Pause the conversation. Write an updated summary of everything so far: merge the earlier "
    "summary, if there is one, with the messages above. Use 2-3 sentences. Keep names, "
    "decisions and open questions. Answer with the summary only."
)
FIXED_DAY = datetime(2023, 1, 1, 12, tzinfo=timezone.utc)


def candidates(names: dict[str, str]) -> dict[str, str]:
    return {
        "before": BEFORE,
        "third_person": summary_request(names),
        "third_person_anonymous": summary_request({}),
    }


def distinct_share(text: str) -> float:
    sentences = [s.strip().lower() for s in re.split(r"(?<=[.!?])\s+|\n", text) if s.strip()]
    return len(set(sentences)) / len(sentences) if sentences else 0.0


def score(text: str, entities: set[str], folded: list[str]) -> dict:
    kept = {e for e in entities if e in text}
    check = check_summary(text, folded)
    return {
        "entities": len(entities),
        "entities_kept": len(kept),
        "entity_share": len(kept) / len(entities) if entities else None,
        "distinct_sentences": distinct_share(text),
        "passes": check.ok,
        "problems": list(check.problems),
        "coverage": check.coverage,
        "repeated": round(check.repeated, 3),
    }


def mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--conversation", default="conv-30")
    parser.add_argument("--exchanges", type=int, default=12)
    parser.add_argument("--windows", type=int, nargs="+", default=[0, 40])
    parser.add_argument("--requests", nargs="+", default=None, help="Candidates to run.")
    parser.add_argument("--data", type=Path, default=None)
    args = parser.parse_args()
    engine = MLXEngine(args.model)
    pairs, _ = exchanges(load_conversation(args.data or default_data_dir(), args.conversation))
    rows = []
    for start in args.windows:
        window = pairs[start : start + args.exchanges]
        turns = [
            m
            for user, reply in window
            for m in (Message("user", user), Message("assistant", reply))
        ]
        folded = [m.content for m in turns]
        entities = named_entities(" ".join(folded))
        names = speaker_names([(m.role, m.content) for m in turns])
        logged = [
            Turn(i, "bench", i + 1, m.role, m.content, FIXED_DAY, None, False)
            for i, m in enumerate(turns)
        ]
        text = extractive_summary(engine, SUMMARY_MAX_TOKENS, None, logged, names)
        rows.append(
            {"window": start, "request": "extractive", "names": names}
            | score(text, entities, folded)
            | {"passes": None, "problems": None}  # what a failed check falls back to
            | {"tokens": engine.count_text(text), "ended": True, "summary": text}
        )
        print(json.dumps(rows[-1]), flush=True)
        for name, request in candidates(names).items():
            if args.requests and name not in args.requests:
                continue
            messages = [Message("system", INSTRUCTIONS), *turns, Message("user", request)]
            result = engine.generate(
                engine.encode_chat(messages),
                Sampling(max_tokens=SUMMARY_MAX_TOKENS),
                slot="summary",
            )
            text = result.text.strip()
            rows.append(
                {"window": start, "request": name, "names": names}
                | score(text, entities, folded)
                | {
                    "tokens": result.stats.generated_tokens,
                    "ended": result.stats.finish_reason == "stop",
                    "summary": text,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    for name in dict.fromkeys(r["request"] for r in rows):
        mine = [r for r in rows if r["request"] == name]
        print(
            json.dumps(
                {
                    "request": name,
                    "windows": len(mine),
                    "entity_share": mean([r["entity_share"] for r in mine]),
                    "distinct_sentences": mean([r["distinct_sentences"] for r in mine]),
                    "pass_rate": mean([r["passes"] and float(r["passes"]) for r in mine]),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
