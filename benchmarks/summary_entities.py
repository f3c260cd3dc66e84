"""What reaches the prompt when every summary is the extractive one: LoCoMo's conversations
replayed with a real tokenizer and no model call, to measure the extractive summary and recall
in minutes instead of hours.

    python benchmarks/summary_entities.py MODEL_DIR [--conversation conv-26 ...] [--json]

MODEL_DIR's tokenizer and chat template count and encode every prompt, as in a chat (e.g.
SmolLM2's, `$MLXMEM_HOME/models/smollm2-135m`); the model itself never runs: each fold's summary
comes back empty, so the check fails and the extractive summary is stored, as it is for a model
too small to summarize (SmolLM2-135M's summaries mostly fail the check). Then `mlxmem eval
locomo --no-answers` measures each question's prompt. Per conversation: the entity survival of the
final summary (the eval's `layers.entity_survival`), and `evidence_in_prompt` and
`answer_in_prompt` of mlxmem, recall and the oracle. Tune on the development conversations
(the default); held-out ones are scored elsewhere.
"""

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from mlxmem.defaults import CHAT_SLOT
from mlxmem.engine import Chunk, GenerationStats, MLXEngine
from mlxmem.eval import locomo as ev

DEV = ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]


class TokenizerOnly(MLXEngine):
    """The model's tokenizer and chat template; every generation is empty and costs nothing."""

    def stream(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT, **_) -> Iterator[Chunk]:
        stats = GenerationStats(len(prompt), 0, len(prompt), 0, 0.0, 0.0, 0.0, 0.0, "stop")
        yield Chunk("", None, stats)

    def prefill(self, prompt: Sequence[int], *, slot: str = CHAT_SLOT) -> int:
        return len(prompt)

    def save_slots(self, names=None) -> None:
        pass

    def drop_slot(self, slot: str) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--conversation", action="append", default=None)
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--reserve", type=int, default=512)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    engine = TokenizerOnly(args.model)
    rows = []
    for cid in args.conversation or DEV:
        result = ev.run_locomo(
            engine, ev.default_data_dir(), [cid], args.budget, args.reserve,
            answers=False,
        ).to_dict()  # fmt: skip
        survival = result["layers"][cid]["entity_survival"]
        row = {"conversation": cid, **survival}
        for config in ("mlxmem", "recall", "oracle"):
            for metric in ("evidence_in_prompt", "answer_in_prompt"):
                row[f"{metric}_{config}"] = result[config][metric]["overall"]["mean"]
        rows.append(row)
    total = {k: sum(r[k] for r in rows) for k in ("entities", "entities_in_summary")}
    summary = {**total, "share": total["entities_in_summary"] / max(1, total["entities"])}
    if args.json:
        print(json.dumps({"conversations": rows, "overall": summary}, indent=1))
        return
    for r in rows:
        print(
            f"{r['conversation']}: entities {r['entities_in_summary']}/{r['entities']}"
            f" ({r['share'] or 0:.2f}); evidence in prompt mlxmem"
            f" {r['evidence_in_prompt_mlxmem']:.2f} recall {r['evidence_in_prompt_recall']:.2f};"
            f" answer words mlxmem {r['answer_in_prompt_mlxmem']:.2f}"
            f" recall {r['answer_in_prompt_recall']:.2f} oracle {r['answer_in_prompt_oracle']:.2f}"
        )
    print(f"overall: entities {summary['entities_in_summary']}/{summary['entities']}"
          f" ({summary['share']:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
