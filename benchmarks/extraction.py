"""What fact extraction does with real messages: LoCoMo's, through the same extractor a chat
turn uses, with the facts kept so far as the known ones.

    python benchmarks/extraction.py MODEL_DIR [--conversation conv-30] [--messages 40]

Prints one JSON object: the outcome of each message sent (kept, duplicate, or the filter that
rejected the model's answer; see mlxmem.memory.extraction), facts per 100 messages, each kept
fact beside its message (to be read by a person: is it true, durable, about the user?) and
every answer the model gave with its outcome. On stderr, one JSON line per message as it goes.
"""

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from mlxmem.engine import MLXEngine
from mlxmem.eval.locomo import default_data_dir, exchanges, load_conversation
from mlxmem.memory.extraction import FactExtractor, should_extract


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--conversation", default="conv-30")
    parser.add_argument("--messages", type=int, default=40, help="Long messages to send.")
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--data", type=Path, default=None)
    args = parser.parse_args()
    engine = MLXEngine(args.model)
    extractor = FactExtractor(engine, args.budget)
    pairs, _ = exchanges(load_conversation(args.data or default_data_dir(), args.conversation))
    messages = [user for user, _ in pairs]
    kept: list[dict] = []
    answers: list[dict] = []
    outcomes: Counter[str] = Counter()
    seen = considered = 0
    start = time.perf_counter()
    for text in messages:
        if seen == args.messages:
            break
        considered += 1
        if not should_extract(text):
            continue
        seen += 1
        look = extractor.extract(text, [k["fact"] for k in kept])
        outcomes[look.outcome] += 1
        answers.append({"outcome": look.outcome, "answer": look.answer})
        if look.fact is not None:
            kept.append({"message": text, "fact": look.fact})
        # One line per message on stderr, so that a run stopped early still says what it did.
        line = {"n": seen, "considered": considered, "s": round(time.perf_counter() - start, 1)}
        line |= {"outcome": look.outcome, "answer": look.answer}
        print(json.dumps(line | {"message": text}), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "model": args.model.name,
                "conversation": args.conversation,
                "messages_considered": considered,
                "sent_to_extractor": seen,
                "outcomes": dict(outcomes),
                "facts_per_100_messages": 100 * len(kept) / max(considered, 1),
                "kept": kept,
                "answers": answers,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
