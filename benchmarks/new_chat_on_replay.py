"""The facts and recall in a new chat, read on a conversation replayed in one piece.

    python benchmarks/new_chat_on_replay.py RUN_DIR --conversation conv-42 [--conversation ...]
        --model qwen2.5-coder-1.5b [--engine llamacpp] [--sample N]
        [--answer-config facts --answer-config no_memory] [--out RUN.json]

`mlxmem eval locomo --conversation-per-session` measures what the facts carry into a new chat
after a second replay of the conversation, one session a conversation: an hour or more per
conversation on the 1.5B. A run of `eval locomo --facts --run-dir RUN_DIR` has already noted
facts the same way (the same extraction, one exchange at a time, with the filters of its code),
over one conversation instead of one a session. This asks that run's questions in a new
conversation (NEW_CHAT, never logged) under the per-session mode's configurations (no_memory,
facts, recall across conversations, oracle) with the eval's own `probe_new_chat`, after the
replay's last session. Nothing is replayed: a copy of the run's store is read.

Every question of categories 1-4 is asked, or the eval's stratified `--sample`; with
`--answer-config`, only those configurations answer (the others' prompts are still measured):
facts - no_memory needs two short answers a question, where recall's takes several seconds.
Each question's item goes to RUN_DIR/CONV.new-chat.jsonl as it comes (the run folder is
private: it holds the corpus's text and the answers); a rerun asks only what is missing.
`--out` writes the items as a run that `benchmarks/eval_pool.py` pools with the per-session
runs' figures (facts - no_memory, recall - facts, by whom the question names); its
`--per-question` keeps them without text for the repository.
"""

import json
import time
from pathlib import Path

from recall_dates_ab import replay_arguments, replayed_companion

from mlxmem.engine import load_engine
from mlxmem.eval import locomo as ev
from mlxmem.eval.runlog import append_line, read_lines
from mlxmem.paths import write_whole

MODE = ev.NEW_CHAT_MODES[1]


def ask_conversation(
    engine, run_dir: Path, conv_id: str, sample: int | None, answers: tuple[str, ...], settings
) -> list[dict]:
    conv = ev.first_sessions(
        ev.load_conversation(ev.default_data_dir(), conv_id), settings.get("sessions")
    )
    log_file = run_dir / f"{conv_id}.new-chat.jsonl"
    done = {item["index"]: item for item in read_lines(log_file)}
    scored = [q for q in conv.questions if q.category in ev.SCORED]
    questions = ev.stratified_sample(conv.questions, sample) if sample else scored
    budget = (settings["context_tokens"], settings["response_reserve"])
    with replayed_companion(engine, run_dir, conv_id, settings) as companion:
        store = companion.store
        log = ev.log_view(companion, ev.exchanges(conv)[1])
        ids = {t.seq: t.id for t in store.turns(ev.CONVERSATION)}
        where = {dia: ids[seq] for dia, seq in log.seq_of.items() if seq in ids}
        for n, question in enumerate(questions, 1):
            if question.index in done:
                continue
            print(f"{conv_id} question {n}/{len(questions)}", flush=True)
            start = time.perf_counter()
            item = ev.probe_new_chat(
                engine, store, conv, question, budget, log.last_at, log.facts, answers, where
            )
            item["seconds"] = round(time.perf_counter() - start, 3)
            append_line(log_file, item)
            done[question.index] = item
    return [done[q.index] for q in questions if q.index in done]


def _difference(d: dict) -> str:
    ci = f" [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]" if d["ci"] else ""
    return f"{d['mean']:+.3f}{ci}"


def main() -> None:
    parser = replay_arguments(__doc__)
    parser.add_argument("--sample", type=int, default=None, help="as eval locomo --sample")
    parser.add_argument(
        "--answer-config", action="append", choices=ev.PER_SESSION_CONFIGS, default=None
    )
    parser.add_argument("--out", type=Path, default=None, help="the items as a run (with text)")
    args = parser.parse_args()
    settings = json.loads((args.run_dir / "settings.json").read_text())
    if settings.get("mode") != "one_conversation" or not settings.get("facts"):
        parser.error(f"{args.run_dir} is not a one-conversation replay with --facts")
    answers = tuple(
        c for c in ev.PER_SESSION_CONFIGS if c in (args.answer_config or ev.PER_SESSION_CONFIGS)
    )
    engine, _ = load_engine(args.model, engine=args.engine)
    if engine.model_id != settings["model_id"]:
        parser.error(
            f"{args.run_dir} was replayed by {settings['model_id']}, not {engine.model_id}"
        )
    # What this reading's items depend on: a rerun that differs would mix its answers in.
    mine = {"model_id": engine.model_id, "sample": args.sample, "answer_configs": list(answers)}
    kept = args.run_dir / "new-chat.settings.json"
    if kept.exists() and json.loads(kept.read_text()) != mine:
        parser.error(f"{kept} holds other settings ({kept.read_text().strip()}); rerun with them")
    kept.write_text(json.dumps(mine) + "\n")
    conversations = []
    for conv_id in args.conversation:
        if not (args.run_dir / f"{conv_id}.replay.json").exists():
            parser.error(f"{conv_id}'s replay is not whole in {args.run_dir}")
        items = ask_conversation(engine, args.run_dir, conv_id, args.sample, answers, settings)
        layers = json.loads((args.run_dir / f"{conv_id}.replay.json").read_text())
        conversations.append({"id": conv_id, "items": items, "layers": layers})
    run = ev.EvalResult(
        settings
        | {
            "mode": MODE,
            "conversations": args.conversation,
            "sample": args.sample,
            "categories": None,  # every category: the replay's own question filter is not read
            "answer_configs": None if answers == ev.PER_SESSION_CONFIGS else list(answers),
            "answers": True,
        }
    )
    run.conversations = conversations
    result = run.to_dict() | {"model": {"label": settings.get("model_id")}}
    for a, b in ev.PER_SESSION_PAIRS:
        d = result[f"{a}_vs_{b}"]
        if d["mean"] is not None:
            print(f"{a} - {b}: {_difference(d)} (n {d['n']})")
    for name, group in result["by_subject"].items():
        d = group["facts_vs_no_memory"]
        if d["mean"] is not None:
            n = group["questions"]
            print(f"about {name} ({n}): facts - no_memory {_difference(d)}")
    if args.out:
        write_whole(args.out, json.dumps(result, indent=1) + "\n")  # it holds text: 0600


if __name__ == "__main__":
    main()
