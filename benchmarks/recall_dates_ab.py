"""Recall's lines with the days they name said outright (`dates.anchored`: "last week (the
week before 16 June 2023)") against the same lines without, on the when-questions (LoCoMo's
category 2) of conversations an `mlxmem eval locomo --run-dir` run has replayed: the model's
answers to the `recall` configuration's prompt, paired question by question.

    python benchmarks/recall_dates_ab.py RUN_DIR --conversation conv-41 [--conversation ...]
        --model qwen2.5-coder-1.5b [--engine llamacpp] [--category 2] [--out results/FILE.json]

Nothing is replayed: the run's store is read (a copy of it), as the eval's probes read it,
and asked the eval's own question prompt after its last session. A question whose two prompts
are the same (no recalled line names a day relative to its own) is answered once. Each
question's answers go to RUN_DIR/CONV.dates-ab.jsonl as they come (the run folder is private:
it holds the corpus's text and the answers); a rerun asks only what is missing. --out keeps
figures and question ids, no text.
"""

import argparse
import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mlxmem.engine import load_engine
from mlxmem.eval import locomo as ev
from mlxmem.eval.runlog import append_line, read_lines
from mlxmem.memory import recall
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store

VARIANTS = ("anchored", "plain")


def recall_prompt(companion: Companion, text: str, at, anchored: bool):
    """The `recall` configuration's prompt, its lines anchored or not."""
    real = recall.anchored
    if not anchored:
        recall.anchored = lambda text, when: text
    try:
        return companion.context(text, at=at)
    finally:
        recall.anchored = real


@contextlib.contextmanager
def replayed_companion(engine, run_dir: Path, conv_id: str, settings: dict) -> Iterator[Companion]:
    """A chat session, recall on and no fact extraction, over a copy of the store the run
    replayed `conv_id` into (the run's own store stays as the run left it), removed after."""
    with tempfile.TemporaryDirectory(prefix="mlxmem-replayed-") as tmp:
        shutil.copytree(
            run_dir / conv_id, Path(tmp) / conv_id, ignore=shutil.ignore_patterns("*.lock*")
        )
        store = Store(Path(tmp) / conv_id / "eval.duckdb")
        chat = ChatSettings(temp=0.0, seed=0, extract_facts=False, recall=True)
        yield Companion(
            engine, store, ev.CONVERSATION, settings["context_tokens"],
            settings["response_reserve"], chat,
        )  # fmt: skip


def replay_arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments of a script that reads an eval run's replayed stores."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--conversation", action="append", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--engine", default=None)
    return parser


def ask_conversation(engine, run_dir: Path, conv_id: str, category: int, settings: dict) -> list:
    data = ev.default_data_dir()
    conv = ev.load_conversation(data, conv_id)
    log_file = run_dir / f"{conv_id}.dates-ab.jsonl"
    done = {item["index"]: item for item in read_lines(log_file)}
    questions = [q for q in conv.questions if q.category == category]
    with replayed_companion(engine, run_dir, conv_id, settings) as companion:
        log = ev.log_view(companion, ev.exchanges(conv)[1])
        for n, question in enumerate(questions, 1):
            if question.index in done:
                continue
            print(f"{conv_id} question {n}/{len(questions)}", flush=True)
            text = ev.probe_text(conv, question)
            item = {"conversation": conv_id, "index": question.index, "category": category}
            prompts = {
                v: recall_prompt(companion, text, log.last_at, v == "anchored") for v in VARIANTS
            }
            item["same_prompt"] = prompts["anchored"].tokens == prompts["plain"].tokens
            for variant in VARIANTS:
                prompt = prompts[variant]
                if variant == "plain" and item["same_prompt"]:
                    item["plain"] = item["anchored"]
                    continue
                answer, cost = ev.ask(engine, prompt.tokens, f"probe/dates-{variant}")
                item[variant] = {
                    "answer": answer,
                    **ev.answer_scores(answer, question),
                    "prompt_tokens": len(prompt.tokens),
                    "recall_tokens": prompt.layers.recall,
                    **cost,
                }
            append_line(log_file, item)
            done[question.index] = item
    return [done[q.index] for q in questions if q.index in done]


def main() -> None:
    parser = replay_arguments(__doc__)
    parser.add_argument("--category", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    settings = json.loads((args.run_dir / "settings.json").read_text())
    engine, _ = load_engine(args.model, engine=args.engine)
    items = []
    for conv_id in args.conversation:
        if not (args.run_dir / f"{conv_id}.replay.json").exists():
            parser.error(f"{conv_id}'s replay is not whole in {args.run_dir}")
        items += ask_conversation(engine, args.run_dir, conv_id, args.category, settings)
    figures = {"questions": len(items), "same_prompt": sum(i["same_prompt"] for i in items)}
    for metric in ev.SCORERS:
        figures[metric] = {
            "anchored": sum(i["anchored"][metric] for i in items) / len(items),
            "plain": sum(i["plain"][metric] for i in items) / len(items),
            "anchored_vs_plain": ev.paired_difference(items, "anchored", "plain", metric=metric),
            "where_they_differ": ev.paired_difference(
                [i for i in items if not i["same_prompt"]], "anchored", "plain", metric=metric
            ),
        }
        d = figures[metric]["anchored_vs_plain"]
        print(
            f"{metric}: anchored {figures[metric]['anchored']:.3f}, plain"
            f" {figures[metric]['plain']:.3f}, difference {d['mean']:+.3f} {d['ci']}"
            f" (n {d['n']}; {len(items) - figures['same_prompt']} with different prompts)"
        )
    if args.out:
        kept = {
            "kind": "recall-dates-ab",
            "model": args.model,
            "conversations": args.conversation,
            "category": args.category,
            "settings": {k: settings.get(k) for k in ("context_tokens", "response_reserve")},
            "figures": figures,
            "per_question": [
                {
                    "conversation": i["conversation"], "index": i["index"],
                    "same_prompt": i["same_prompt"],
                    **{v: {m: i[v][m] for m in (*ev.SCORERS, "prompt_tokens", "recall_tokens")}
                       for v in VARIANTS},
                }
                for i in items
            ],
        }  # fmt: skip
        args.out.write_text(json.dumps(kept, indent=1) + "\n")


if __name__ == "__main__":
    main()
