"""Pool several `mlxmem eval locomo --json` runs into one table of figures, no text.

    python benchmarks/eval_pool.py RUN.json [RUN.json ...] [--out results/FILE.json]

A slow model on a CPU answers 20 questions of one conversation in about an hour, so its runs
are made one conversation at a time (`--conversation conv-NN --sessions N --limit 20`). This
reads their per-question scores and gives, per run and pooled over all of them: mean F1 per
configuration with its 95% bootstrap interval, the paired differences recall - window and
recall - mlxmem (the same questions, so their intervals are what decides), the shares of
questions whose prompt held an evidence turn and every content word of the answer, and how
often recall brought back evidence that had left the window. Runs of
`--conversation-per-session` pool alike, with their configurations and the paired
differences facts - no_memory and recall - facts. All of it is the eval's own
arithmetic (`aggregate`, `paired_difference`, `evicted_evidence`) over the pooled questions.
`--out` keeps those figures only: no question, answer or summary of the corpus (its licence
keeps its text out of this repository).

    python benchmarks/eval_pool.py RUN.json ... --metric f1|f1_locomo|f1_amem [--rescore]

pools the F1 named (default f1, LoCoMo's unstemmed; f1_locomo, as LoCoMo's script stems it;
f1_amem, A-Mem's set F1): its means and the paired differences are of it. A run written before
a metric existed lacks it, and is refused with its name; `--rescore` scores the answers the
runs kept with this version's scorers first (all three, the older f1 included).

    python benchmarks/eval_pool.py RUN.json ... --versus OTHER.json ... [--pair A:B ...]

compares two sets of runs on the questions they share (matched by conversation and index, or
by their text for runs made before the index was kept), e.g. the same conversation in the
one-conversation mode and with `--conversation-per-session`: the paired difference of config A
of the first runs minus config B of the others (default recall:recall).

A RUN may also be a `--run-dir` folder (its answers so far, read as they are: a run still going
pools what it has), or a file this script wrote with

    python benchmarks/eval_pool.py RUN ... --per-question results/FILE.json

which keeps every question's figures and nothing of its text: its conversation and index in
the question file, category, whom it names, where its evidence was, and per configuration the
three F1s, exact match, what reached the prompt, and its tokens and seconds. That file pools
again like a run, so the committed results reproduce every table.

Besides the overall figures it prints, per LoCoMo category 1-4, each configuration's A-Mem F1
and LoCoMo F1 (x100, as the papers print them) with their intervals beside A-Mem's published
Qwen2.5-1.5B row; the F1 by where the evidence was (`by_evidence_place`); and what a question
cost (median seconds, mean tokens of the prompt and of what was prefilled).
"""

import argparse
import json
from pathlib import Path

from mlxmem.errors import InputError
from mlxmem.eval.locomo import (
    AMEM_QWEN25_1_5B_F1,
    CATEGORIES,
    CONFIGS,
    PER_SESSION_CONFIGS,
    PER_SESSION_PAIRS,
    PLACE_PAIRS,
    PLACES,
    SCORED,
    SCORERS,
    aggregate,
    bootstrap_ci,
    by_evidence_place,
    by_subject,
    default_data_dir,
    evicted_evidence,
    load_conversation,
    paired_difference,
    question_cost,
    rescore,
    subject,
)
from mlxmem.eval.runlog import SETTINGS, read_lines

PAIRS = (("recall", "window"), ("recall", "mlxmem"), ("mlxmem", "window"), ("oracle", "no_memory"))
SHARES = ("evidence_in_prompt", "answer_in_prompt")


def mode(per_session: bool) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The configurations and the paired differences of a run's mode."""
    return (PER_SESSION_CONFIGS, PER_SESSION_PAIRS) if per_session else (CONFIGS, PAIRS)


def figures(items: list[dict], per_session: bool = False, metric: str = "f1") -> dict:
    """The eval's own aggregates of `items` (overall, categories 1-4), its paired differences
    (of `metric`, one of SCORERS), and (one conversation per run) its count of questions whose
    evidence had left the window."""
    configs, pairs = mode(per_session)
    scores = aggregate(items, configs=configs)
    out: dict = {"questions": sum(i["category"] in SCORED for i in items)}
    for config in configs:
        out[config] = {m: scores[config][m]["overall"] for m in (metric, *SHARES)}
    for a, b in pairs:
        out[f"{a}_vs_{b}"] = paired_difference(items, a, b, metric=metric)
    if per_session:
        out["by_subject"] = by_subject(items, pairs, metric=metric)
    else:
        out["evicted_evidence"] = evicted_evidence(items, metric=metric)["overall"]
    out["by_category"] = by_category(items, configs)
    if any("place" in i for i in items):
        out["by_evidence_place"] = by_evidence_place(
            items, configs, PER_SESSION_PAIRS if per_session else PLACE_PAIRS
        )
    if any("seconds" in i for i in items):
        out["cost"] = question_cost(items, configs)
    return out


TABLE_SCORERS = ("f1_amem", "f1_locomo")  # A-Mem's table is on its own F1; LoCoMo's beside it


def by_category(items: list[dict], configs: tuple[str, ...]) -> dict:
    """Per LoCoMo category 1-4 (by number, as A-Mem's columns): each configuration's mean of
    TABLE_SCORERS x100 with its 95% interval and n, and A-Mem's published Qwen2.5-1.5B F1."""
    out: dict = {}
    for category in SCORED:
        group = [i for i in items if i["category"] == category]
        cells: dict = {"name": CATEGORIES[category], "questions": len(group)}
        for config in configs:
            for metric in TABLE_SCORERS:
                values = [100 * i[config][metric] for i in group
                          if i[config].get(metric) is not None]  # fmt: skip
                cells[f"{config}_{metric}"] = {
                    "mean": sum(values) / len(values) if values else None,
                    "ci": bootstrap_ci(values),
                    "n": len(values),
                }
        cells["amem_published_f1_amem"] = AMEM_QWEN25_1_5B_F1[category]
        out[str(category)] = cells
    return out


# What of an item stays in --per-question: figures, ids and labels; never the corpus's text.
ITEM_KEYS = ("conversation", "index", "category", "about", "place", "evidence_seqs",
             "evicted_upto", "seconds")  # fmt: skip
CONFIG_KEYS = (*SCORERS, "exact", *SHARES, "prompt_tokens", "cached_tokens", "prefilled_tokens",
               "seconds", "recall_tokens", "evidence_recalled", "facts_in_prompt",
               "facts_with_answer_word")  # fmt: skip


def stripped(item: dict, configs: tuple[str, ...]) -> dict:
    """`item` with its figures only: no question, answer, or text the model wrote."""
    out = {k: item[k] for k in ITEM_KEYS if k in item}
    for config in configs:
        out[config] = {k: item[config][k] for k in CONFIG_KEYS if k in item[config]}
    return out


def read_run_dir(path: Path, parser: argparse.ArgumentParser) -> dict:
    """A `--run-dir` folder as a run: its settings and the questions answered so far."""
    try:
        settings = json.loads((path / SETTINGS).read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"{path} is not a run folder of `mlxmem eval locomo --run-dir`: {exc}")
    per_session = settings.get("mode") == "conversation_per_session"
    conversations = [
        {"id": f.name.removesuffix(".items.jsonl"), "items": read_lines(f)}
        for f in sorted(path.glob("*.items.jsonl"))
    ]
    return {
        "model": {"label": settings.get("model_id")},
        "configs": list(PER_SESSION_CONFIGS if per_session else CONFIGS),
        "settings": settings | {"conversations": [c["id"] for c in conversations]},
        "conversations": conversations,
    }


def lacks(items: list[dict], metric: str) -> bool:
    """Whether an answered question of `items` has no `metric`: the run was scored before the
    eval computed it (pooling it would leave its questions out of the figures unsaid)."""
    configs = (v for i in items for v in i.values() if isinstance(v, dict))
    return any(c.get("f1") is not None and metric not in c for c in configs)


def check_metric(
    path: Path, items: list[dict], args: argparse.Namespace, parser: argparse.ArgumentParser
) -> list[dict]:
    """`items`, rescored with --rescore; a clear error if they lack the --metric pooled."""
    if args.rescore:
        return [rescore(i) for i in items]
    if args.metric != "f1" and lacks(items, args.metric):
        parser.error(
            f"{path} has no {args.metric}: it was scored before `mlxmem eval locomo` computed "
            "it. --rescore scores the answers it kept anew, or pool --metric f1"
        )
    return items


def read_run(path: Path, parser: argparse.ArgumentParser) -> dict:
    """The run `eval locomo --json` wrote to `path` (or a `--run-dir` folder, or a
    --per-question file); a clear error for anything else (a run still being written is
    empty)."""
    if path.is_dir():
        return read_run_dir(path, parser)
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read {path} as a run of `mlxmem eval locomo --json`: {exc}")
    if not isinstance(run, dict) or not isinstance(run.get("conversations"), list):
        parser.error(f"{path} is not a run of `mlxmem eval locomo --json` (no conversations)")
    return run


def run_items(run: dict) -> list[dict]:
    """A run's items, each saying whom its question names (`about`): a run made before the
    eval recorded it has it derived from the corpus's speaker names, when the corpus is here."""
    items = []
    for conv in run["conversations"]:
        for item in conv["items"]:
            item.setdefault("conversation", conv["id"])
        items += conv["items"]
        missing = [i for i in conv["items"] if "about" not in i]
        if not missing:
            continue
        try:
            names = load_conversation(default_data_dir(), conv["id"])
        except InputError:
            continue  # the split leaves these questions out
        for i in missing:
            i["about"] = subject(names, i["question"])
    return items


def run_of(path: Path, args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[dict]:
    """The items of the run at `path`, checked for --metric (`check_metric`)."""
    return check_metric(path, run_items(read_run(path, parser)), args, parser)


def versus(
    items: list[dict], others: list[dict], pairs: list[tuple[str, str]], metric: str = "f1"
) -> dict:
    """Config a of `items` minus config b of `others` (`metric`), paired over the questions
    both hold; per category, and per place of the evidence as the first runs found it."""
    theirs = {question_key(i): i for i in others}
    shared = [(i, theirs[question_key(i)]) for i in items if question_key(i) in theirs]
    out = {}
    for a, b in pairs:  # one item per question, the two configs under names that cannot clash
        both = [
            {"category": i["category"], "place": i.get("place"), "a": i[a], "b": j[b]}
            for i, j in shared
        ]

        def of(keep, both=both) -> dict:
            return paired_difference([x for x in both if keep(x)], "a", "b", metric=metric)

        out[f"{a}_vs_{b}"] = of(lambda x: True) | {
            "by_category": {CATEGORIES[c]: of(lambda x, c=c: x["category"] == c) for c in SCORED},
            "by_place": {
                place: of(lambda x, place=place: x["place"] == place)
                for place in PLACES
                if any(x["place"] == place and x["category"] in SCORED for x in both)
            },
        }
    return out


def question_key(item: dict) -> tuple:
    """What names a question across runs: its conversation and index, or (a run made before
    the index was kept) its text."""
    if "index" in item:
        return (item["conversation"], item["index"])
    return (item["question"],)


def _pair(text: str) -> tuple[str, str]:
    a, sep, b = text.partition(":")
    if not (sep and a and b):
        raise argparse.ArgumentTypeError(f"expected CONFIG:CONFIG, not {text!r}")
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--versus", type=Path, nargs="+", default=[])
    parser.add_argument("--pair", type=_pair, action="append", default=None)
    parser.add_argument("--metric", choices=SCORERS, default="f1", help="the F1 to pool")
    parser.add_argument(
        "--rescore", action="store_true", help="score the answers the runs kept anew first"
    )
    parser.add_argument(
        "--per-question",
        type=Path,
        default=None,
        help="write every question's figures (no text) to this file, which pools like a run",
    )
    args = parser.parse_args()
    metric = args.metric
    runs, pooled, modes = [], [], set()
    for path in args.runs:
        run = read_run(path, parser)
        items = check_metric(path, run_items(run), args, parser)
        pooled += items
        settings = run["settings"]
        per_session = run.get("configs") == list(PER_SESSION_CONFIGS)
        modes.add(per_session)
        runs.append(
            {
                "model": run["model"]["label"],
                "conversations": settings["conversations"],
                "sessions": settings.get("sessions"),
                "limit": settings.get("limit"),
                "sample": settings.get("sample"),
                "categories": settings.get("categories"),
                "context_tokens": settings.get("context_tokens"),
                "versions": run.get("versions"),
                "figures": figures(items, per_session, metric),
            }
        )
    if len(modes) > 1:
        parser.error("these runs mix --conversation-per-session with the one-conversation mode")
    per_session = modes.pop()
    configs, pairs = mode(per_session)
    result = {"metric": metric, "runs": runs, "pooled": figures(pooled, per_session, metric)}
    compared_figures: dict = {}
    if args.versus:
        others = [i for p in args.versus for i in run_of(p, args, parser)]
        compared = args.pair or [("recall", "recall")]
        names = {*CONFIGS, *PER_SESSION_CONFIGS}
        if not (pooled and others):
            parser.error("no questions to pair: the runs or the --versus runs hold none")
        for a, b in compared:
            if not ({a, b} <= names and a in pooled[0] and b in others[0]):
                parser.error(f"no config {a!r} in the runs, or no {b!r} in the --versus runs")
        compared_figures = versus(pooled, others, compared, metric)
        result["versus"] = {"runs": [p.name for p in args.versus], **compared_figures}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.per_question:
        kept = {
            "kind": "eval-per-question",
            "model": {"label": runs[0]["model"]},
            "configs": list(configs),
            "settings": {k: v for k, v in settings.items() if k != "data"}
            | {"conversations": sorted({i["conversation"] for i in pooled})},
            "conversations": [
                {"id": cid, "items": [stripped(i, configs) for i in pooled
                                      if i["conversation"] == cid]}
                for cid in sorted({i["conversation"] for i in pooled})
            ],
        }  # fmt: skip
        args.per_question.write_text(json.dumps(kept, indent=1) + "\n")
    for label, fig in [*((",".join(r["conversations"]), r["figures"]) for r in runs),
                       ("pooled", result["pooled"])]:  # fmt: skip
        print(f"{label}: {fig['questions']} questions in categories 1-4")
        for config in configs:
            shares = "  ".join(f"{m} {_num(fig[config][m]['mean'], '.2f')}" for m in SHARES)
            print(f"  {config:>9} {metric} {_figure(fig[config][metric], '.3f')}  {shares}")
        for a, b in pairs:
            d = fig[f"{a}_vs_{b}"]
            clear = "  (clear of zero)" if d["beats"] else ""
            print(f"  {a} - {b}: {_figure(d, '+.3f')}{clear}")
        if per_session:
            for name, group in fig["by_subject"].items():
                d = group["facts_vs_no_memory"]
                print(f"  about {name} ({group['questions']}): facts - no_memory"
                      f" {_figure(d, '+.3f')}")  # fmt: skip
            continue
        evicted = fig["evicted_evidence"]
        print(f"  evidence left the window for {evicted['questions']}; recall brought it back"
              f" for {evicted['evidence_recalled']}")  # fmt: skip
    print_tables(result["pooled"], configs)
    for key, d in compared_figures.items():
        a, b = key.split("_vs_")
        clear = "  (clear of zero)" if d["beats"] else ""
        print(f"{a} - {b} of --versus, {d['n']} shared questions: {_figure(d, '+.3f')}{clear}")
        for name, dc in d["by_category"].items():
            print(f"  {name} ({dc['n']}): {_figure(dc, '+.3f')}")
        for name, dc in d["by_place"].items():
            print(f"  evidence {name} ({dc['n']}): {_figure(dc, '+.3f')}")


def print_tables(fig: dict, configs: tuple[str, ...]) -> None:
    """The pooled figures per category beside A-Mem's row, by evidence place, and the cost."""
    print("\nF1 x100 per LoCoMo category, pooled (A-Mem's set F1 / LoCoMo's stemmed F1):")
    cats = fig["by_category"]
    print(f"  {'config':>18} " + " ".join(f"{c + ' ' + cats[c]['name']:>27}" for c in cats))
    for config in configs:
        cells = []
        for c in cats:
            amem, locomo = (cats[c][f"{config}_{m}"] for m in TABLE_SCORERS)
            cells.append(f"{_figure(amem, '.1f'):>18} / {_num(locomo['mean'], '.1f'):>5}")
        print(f"  {config:>18} " + " ".join(f"{cell:>27}" for cell in cells))
    row = " ".join(f"{cats[c]['amem_published_f1_amem']:>27}" for c in cats)
    print(f"  {'A-Mem Qwen2.5-1.5B':>18} {row}")
    print("  n: " + ", ".join(f"category {c} {cats[c]['questions']}" for c in cats))
    for place, group in fig.get("by_evidence_place", {}).items():
        diffs = "  ".join(
            f"{k.replace('_vs_', ' - ')} {_figure(d, '+.3f')}"
            for k, d in group["f1"].items()
            if "_vs_" in k
        )
        print(f"evidence {place} ({group['questions']}): F1 {diffs}")
    cost = fig.get("cost")
    if cost:
        median = _num(cost["question_seconds_median"], ".1f")
        print(f"a question, median over {cost['questions']}: {median} s for every configuration")
        for config in configs:
            c = cost[config]
            print(f"  {config:>9}: {_num(c['seconds_median'], '.2f')} s, "
                  f"{_num(c['prompt_tokens_mean'], '.0f')} tokens of prompt, "
                  f"{_num(c['prefilled_tokens_mean'], '.0f')} prefilled")  # fmt: skip


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _figure(stat: dict, spec: str) -> str:
    """A mean and its interval; n/a where a run had nothing to score (--no-answers, say)."""
    ci = stat.get("ci") or (None, None)
    return f"{_num(stat['mean'], spec)} [{_num(ci[0], spec)}, {_num(ci[1], spec)}]"


if __name__ == "__main__":
    main()
