"""Which summary request does a real model follow best? Prompt tuning for issue 10.

    python benchmarks/summary_prompts.py MODEL_DIR [--conversation conv-30] [--exchanges 12]
        [--windows 0 40]

For each window (`--exchanges` exchanges of a LoCoMo conversation starting at each of
`--windows`) and each candidate request, the model writes a summary greedily from the chat
prompt a collapse builds (mlxmem's instructions, the turns, then the request), capped at
SUMMARY_MAX_TOKENS. Scored without a judge: the share of the window's named entities
(capitalized words not opening a sentence) the summary keeps, the share of its sentences that
are distinct, and whether it ended by itself. Prints one JSON line per (window, request).
"""

import argparse
import json
import re
from pathlib import Path

from mlxmem.engine import Message, MLXEngine
from mlxmem.eval.locomo import (
    default_data_dir,
    exchanges,
    load_conversation,
    named_entities,
)
from mlxmem.memory.companion import INSTRUCTIONS
from mlxmem.memory.window import SUMMARY_MAX_TOKENS, SUMMARY_REQUEST

CANDIDATES = {
    "current": SUMMARY_REQUEST,
    "notes": (
        "Pause the conversation. Write down what is worth remembering from the messages above "
        "(and the earlier summary, if there is one) as short notes: who, what, where, when. "
        "Keep names, places, dates and plans. No greetings. Answer with the notes only."
    ),
    "facts": (
        "Pause the conversation. In 2-3 sentences, state the facts from the messages above "
        "that are needed to continue this conversation later: names, places, dates, plans "
        "and decisions, merged with the earlier summary if there is one. Do not repeat a "
        "sentence. Answer with the summary only."
    ),
}


def distinct_share(text: str) -> float:
    sentences = [s.strip().lower() for s in re.split(r"(?<=[.!?])\s+|\n", text) if s.strip()]
    return len(set(sentences)) / len(sentences) if sentences else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--conversation", default="conv-30")
    parser.add_argument("--exchanges", type=int, default=12)
    parser.add_argument("--windows", type=int, nargs="+", default=[0, 40])
    parser.add_argument("--data", type=Path, default=None)
    args = parser.parse_args()
    engine = MLXEngine(args.model)
    pairs, _ = exchanges(load_conversation(args.data or default_data_dir(), args.conversation))
    for start in args.windows:
        window = pairs[start : start + args.exchanges]
        turns = [
            m
            for user, reply in window
            for m in (Message("user", user), Message("assistant", reply))
        ]
        entities = named_entities(" ".join(m.content for m in turns))
        for name, request in CANDIDATES.items():
            messages = [Message("system", INSTRUCTIONS), *turns, Message("user", request)]
            result = engine.generate(
                engine.encode_chat(messages),
                slot="summary",
                max_tokens=SUMMARY_MAX_TOKENS,
                temp=0.0,
            )
            text = result.text.strip()
            kept = {e for e in entities if e in text}
            print(
                json.dumps(
                    {
                        "window": start,
                        "request": name,
                        "entities": len(entities),
                        "entities_kept": len(kept),
                        "entity_share": len(kept) / len(entities) if entities else None,
                        "distinct_sentences": distinct_share(text),
                        "tokens": result.stats.generated_tokens,
                        "ended": result.stats.finish_reason == "stop",
                        "summary": text,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
