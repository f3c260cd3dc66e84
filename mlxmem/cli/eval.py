"""`mlxmem eval`: does the memory remember? A thin layer over mlxmem.eval.locomo."""

from __future__ import annotations

import contextlib
import functools
import tempfile
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.table import Table

from mlxmem import bench
from mlxmem.bench import BenchModel
from mlxmem.defaults import DEFAULT_REPLACE_FACTS, SummaryKind
from mlxmem.engine import Engine
from mlxmem.errors import InputError
from mlxmem.eval import facts as fe
from mlxmem.eval import locomo as ev
from mlxmem.eval.locomo.convert import convert_locomo
from mlxmem.measure import Progress as OnProgress
from mlxmem.memory.context.budget import context_budget

from .bench import DB, SEED, _model, _print_json, _progress
from .common import (
    ENGINE,
    JSON,
    SUMMARY,
    THREADS,
    err,
    model_or_default,
    out,
    plain_typer,
    print_json,
)

app = plain_typer(
    help="Measure what the memory remembers: `locomo` replays LoCoMo's long conversations and "
    "asks their questions under five configurations; `facts` scores fact extraction against "
    "their gold facts.",
    no_args_is_help=True,
)


CONVERSATIONS = typer.Option(
    None,
    "--conversation",
    help="A conversation id such as conv-30 (repeat it; default: all with questions in --data).",
)
DATA = typer.Option(
    None,
    "--data",
    help="LoCoMo's published locomo10.json, or a folder written by `eval convert-locomo` "
    "(default: $MLXMEM_LOCOMO or ../shared/corpora/locomo).",
)
PLOT = typer.Option(None, "--plot", help="Write a PNG of F1 per category and configuration.")


CATEGORY_OPTION = typer.Option(
    None,
    "--category",
    min=1,
    max=5,
    help="Ask only the questions of this LoCoMo category (repeat it; 1 multi-hop, 2 temporal, "
    "3 open-domain, 4 single-hop, 5 adversarial); --limit and --sample then choose among them "
    "(--sample covers 1-4 only). --category 3 asks every open-domain question, where a "
    "--sample of 60 holds only a few.",
)
ANSWER_CONFIGS = typer.Option(
    None,
    "--answer-config",
    help="Answer only this configuration (repeat it): no_memory, window, mlxmem, recall or "
    "oracle (with --conversation-per-session: no_memory, facts, recall or oracle). The "
    "others' prompts are still assembled and measured, as --no-answers does: mlxmem - window "
    "on the questions whose evidence was folded needs only those two answered, which reuse "
    "the prefix the questions share, where recall's prefill its recalled turns.",
)


RUN_DIR = typer.Option(
    None,
    "--run-dir",
    help="Keep the run in this folder as it goes (the replay, and each answer as it comes; "
    "private: it holds the conversations' text): run the same command again to go on where it "
    "stopped, skipping what is done. Default: a temporary folder.",
)


@app.command("locomo")
def locomo(
    conversation: list[str] = CONVERSATIONS,
    limit: int = typer.Option(
        None, "--limit", min=1, help="Ask at most N questions per conversation, spread evenly."
    ),
    sample: int = typer.Option(
        None,
        "--sample",
        min=4,
        help="Ask about N questions per conversation, of categories 1-4 only, each category "
        "its share (at least one), spread evenly over the conversation (instead of --limit).",
    ),
    category: list[int] = CATEGORY_OPTION,
    run_dir: Path = RUN_DIR,
    model: str = typer.Option(
        None,
        "--model",
        "-M",
        help="A registry alias or a model directory (default: your default model, as chat's; "
        "`tiny` is random weights: it measures the machinery, not the memory).",
    ),
    data: Path = DATA,
    context_tokens: int = typer.Option(
        None, "--context-tokens", help="Context budget (default: the model's)."
    ),
    facts: bool = typer.Option(
        False, "--facts/--no-facts", help="Extract facts during the replay (slow; off by default)."
    ),
    answers: bool = typer.Option(
        True,
        "--answers/--no-answers",
        help="Generate the probes' answers; --no-answers only assembles their prompts and "
        "measures what reached them (cheap: no answer is generated).",
    ),
    answer_configs: list[str] = ANSWER_CONFIGS,
    sessions: int = typer.Option(
        None,
        "--sessions",
        min=1,
        help="Replay only the first N sessions of each conversation and ask only the questions "
        "whose evidence lies in them (for slow models; the same replay up to there).",
    ),
    summary: SummaryKind = SUMMARY,
    replace_facts: bool = typer.Option(
        DEFAULT_REPLACE_FACTS,
        "--replace-facts/--no-replace-facts",
        help="Let a fact noted in the replay replace an older one it makes out of date, as "
        "`chat --replace-facts` does (off by default, as in a chat; a run folder made before "
        "the option ran with it on).",
    ),
    per_session: bool = typer.Option(
        False,
        "--conversation-per-session",
        help="Log each session as a conversation of its own (as a companion app opens a new "
        "chat each day), with fact extraction on, and ask the questions in a new "
        "conversation: configurations no_memory, facts, recall (across conversations), oracle.",
    ),
    plot: Path = PLOT,
    seed: int = SEED,
    engine_name: str | None = ENGINE,
    threads: int | None = THREADS,
    db: Path = DB,
    as_json: bool = JSON,
) -> None:
    """Replay LoCoMo conversations through the memory system session by session (each logged
    at its session's date, which the prompts show where the day changes), then ask their
    questions as probes that are not logged, under five configurations: no_memory, window,
    mlxmem (facts + summary + window), recall (mlxmem + turns recalled from the log) and
    oracle (the evidence turns). Scores per category, with 95% bootstrap intervals: LoCoMo's
    token F1 unstemmed (f1) with exact match, as LoCoMo's script stems it (f1_locomo), and
    A-Mem's set F1 (f1_amem, beside A-Mem's published Qwen2.5-1.5B row); and what reached each
    prompt: an evidence turn, and every content word of the gold answer."""
    if limit and sample:
        raise InputError("give --limit or --sample, not both")
    if run_dir is not None and run_dir.exists() and not run_dir.is_dir():
        raise InputError(f"--run-dir {run_dir} is a file, not a folder")
    with _locomo_folder(data or ev.default_data_dir()) as folder:
        ids = conversation or ev.available_conversations(folder)
        if not ids:
            raise InputError(ev.no_data_hint(folder))
        with _eval_engine(model, engine_name, seed, as_json, "eval") as (chosen, engine, progress):
            result = ev.run_locomo(
                engine,
                folder,
                ids,
                context_budget(context_tokens, chosen.context_tokens),
                chosen.response_reserve,
                limit=limit,
                sample=sample,
                facts=facts,
                seed=seed,
                progress=progress,
                answers=answers,
                answer_configs=answer_configs,
                sessions=sessions,
                per_session=per_session,
                run_dir=run_dir,
                summary=summary.value,
                replace_facts=replace_facts,
                categories=category or None,
            )
    run = bench.record_run(bench.BenchRun.of(result, chosen), db)
    if plot is not None:
        from mlxmem.eval.locomo.results import plot_eval

        plot_eval(run.results, plot, f"LoCoMo {', '.join(ids)}: {chosen.label}")
    if as_json:
        return _print_json(run)
    _tables(run.results, chosen.label)
    if plot is not None:
        err.print(f"plot written to {plot}")
    err.print(f"[dim]stored as run {run.id}; `mlxmem bench history --kind eval` lists runs[/dim]")


@contextlib.contextmanager
def _eval_engine(
    model: str | None, engine_name: str | None, seed: int, as_json: bool, label: str
) -> Iterator[tuple[BenchModel, Engine, OnProgress]]:
    """The model an eval asks (said on stderr unless --json), loaded with its slots in memory,
    and the progress line `label` of its run."""
    chosen = _model(model_or_default(model, engine_name), None, None, seed, as_json, engine_name)
    with bench.bench_engine(chosen, persist=False) as engine, _progress(label) as progress:
        yield chosen, engine, progress


@contextlib.contextmanager
def _locomo_folder(data: Path) -> Iterator[Path]:
    """The eval's folder for --data: as given, or LoCoMo's published file converted into a
    temporary one."""
    if not data.is_file():
        yield data
        return
    with tempfile.TemporaryDirectory(prefix="mlxmem-locomo-") as tmp:
        convert_locomo(data, Path(tmp))
        yield Path(tmp)


UPDATES = typer.Option(
    False,
    "--updates",
    help="Score fact replacement instead: for each labelled pair of the user's observations "
    "(--pairs), hold the earlier one as a fact, give the later one as a new fact, and run the "
    "replacement check a chat runs with --replace-facts: updates caught and wrong replacements.",
)
PAIRS = typer.Option(
    None,
    "--pairs",
    help="The labelled pairs for --updates (default: benchmarks/scenarios/locomo-updates.json).",
)


@app.command("facts")
def facts_command(
    conversation: list[str] = CONVERSATIONS,
    model: str = typer.Option(
        None,
        "--model",
        "-M",
        help="A registry alias or a model directory (default: your default model, as chat's).",
    ),
    data: Path = DATA,
    messages: int = typer.Option(
        None, "--messages", min=1, help="Send the first N user messages of each (default: all)."
    ),
    context_tokens: int = typer.Option(
        None, "--context-tokens", help="Context budget (default: the model's)."
    ),
    seed: int = SEED,
    engine_name: str | None = ENGINE,
    threads: int | None = THREADS,
    as_json: bool = JSON,
    updates: bool = UPDATES,
    pairs_file: Path = PAIRS,
) -> None:
    """Score fact extraction against LoCoMo's gold facts: send a conversation's user messages
    through extraction as a chat does, and match each kept fact to the conversation's
    observations (content words, stemmed): precision (a fact of the user's), attribution
    errors (the other speaker's, or the user made them), unsupported (matches nothing), and
    coverage (the user's observations on those messages that some fact matches). With
    --updates, score replacement on labelled pairs of observations instead."""
    if updates and messages is not None:
        raise InputError("--messages counts the user messages sent; --updates sends none")
    if pairs_file is not None and not updates:
        raise InputError("--pairs names the labelled pairs of --updates: add --updates")
    if updates:
        pairs = pairs_file or fe.UPDATES_FILE
        return _updates(
            conversation, model, data, context_tokens, seed, engine_name, as_json, pairs
        )
    with _locomo_folder(data or ev.default_data_dir()) as folder:
        ids = conversation or ev.available_conversations(folder)
        if not ids:
            raise InputError(ev.no_data_hint(folder))
        runs = []
        with _eval_engine(model, engine_name, seed, as_json, "facts") as (chosen, engine, progress):
            for cid in ids:
                runs.append(
                    fe.run_fact_eval(
                        engine,
                        folder,
                        cid,
                        context_budget(context_tokens, chosen.context_tokens),
                        messages,
                        functools.partial(progress, cid),
                    )
                )
    result = {"model": chosen.label, "pooled": fe.pooled(runs), "conversations": runs}
    if as_json:
        return print_json(result)
    table = Table(title=f"Facts against LoCoMo's observations, {chosen.label}")
    for column in ("conversation", "messages", "kept", "precision", "attribution", "unsupported"):
        table.add_column(column, justify="left" if column == "conversation" else "right")
    table.add_column("coverage", justify="right")
    for row in [*runs, {"conversation": "all", **result["pooled"]}]:
        table.add_row(
            row["conversation"],
            str(row["messages"]),
            str(row["kept"]),
            *(_share(row[k]) for k in ("precision", "attribution_errors", "unsupported")),
            _share(row["coverage"]),
        )
    out().print(table)
    for run in runs:
        for fact in run["facts"]:
            out().print(f"  {run['conversation']} {fact['turn']} {fact['label']}: {fact['fact']}")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _updates(
    conversation: list[str] | None,
    model: str | None,
    data: Path | None,
    context_tokens: int | None,
    seed: int,
    engine_name: str | None,
    as_json: bool,
    pairs_file: Path,
) -> None:
    """`eval facts --updates`: the labelled pairs through the replacement check."""
    pairs = fe.load_update_pairs(pairs_file)
    if conversation:
        pairs = [p for p in pairs if p.conversation in conversation]
    if not pairs:
        raise InputError(f"no labelled pairs for {', '.join(conversation or [])} in {pairs_file}")
    with (
        _locomo_folder(data or ev.default_data_dir()) as folder,
        _eval_engine(model, engine_name, seed, as_json, "updates") as (chosen, engine, progress),
    ):
        run = fe.run_update_eval(
            engine, folder, pairs, context_budget(context_tokens, chosen.context_tokens), progress
        )
    result = {"model": chosen.label, "pairs_file": pairs_file.name, **run}
    if as_json:
        return print_json(result)
    table = Table(title=f"Fact updates on LoCoMo's observations, {chosen.label}; 95% intervals")
    for column in ("conversation", "updates", "caught", "controls", "wrong", "gate recall"):
        table.add_column(column, justify="left" if column == "conversation" else "right")
    for cid, score in [*run["conversations"].items(), ("all", run["pooled"])]:
        table.add_row(
            cid,
            str(score["updates"]),
            _with_ci(score["caught"], score["caught_share"], score["caught_ci"]),
            str(score["controls"]),
            _with_ci(score["wrong"], score["wrong_share"], score["wrong_ci"]),
            _share(score["gate_recall"]),
        )
    out().print(table)
    out().print(
        f"goal: caught >= {fe.CAUGHT_GOAL:.0%} ({'met' if run['met']['caught'] else 'not met'}), "
        f"wrong <= {fe.WRONG_GOAL:.0%} ({'met' if run['met']['wrong'] else 'not met'})"
    )
    for row in run["pairs"]:
        if row["outcome"] not in ("caught", "kept"):
            out().print(
                f"  {row['conversation']} {_oid(row['earlier'])} -> {_oid(row['later'])} "
                f"({row['kind']}): {row['outcome']}"
            )


def _with_ci(count: int, share: float | None, ci: list[float] | None) -> str:
    if share is None or ci is None:
        return "-"
    return f"{count} ({share:.2f}, {ci[0]:.2f}-{ci[1]:.2f})"


def _oid(oid: list) -> str:
    """["session_7_observation", 0] -> "s7[0]"."""
    return f"s{oid[0].split('_')[1]}[{oid[1]}]"


SOURCE = typer.Argument(..., metavar="LOCOMO10_JSON", help="LoCoMo's data/locomo10.json.")
OUT = typer.Argument(..., metavar="DIR", help="The folder to write (for --data DIR).")


@app.command("convert-locomo")
def convert(source: Path = SOURCE, out: Path = OUT) -> None:
    """Convert LoCoMo's published file (github.com/snap-research/locomo, data/locomo10.json;
    CC BY-NC 4.0, non-commercial) into the folder `eval locomo --data DIR` reads: a conv-N.jsonl
    of turns per conversation and qa/conv-N.qa.json with its questions. `--data` also takes
    the file itself, converting it on the fly."""
    ids = convert_locomo(source, out)
    typer.echo(f"Wrote {len(ids)} conversations ({', '.join(ids)}) to {out}.")


def _tables(results: dict, label: str) -> None:
    groups = [*ev.CATEGORIES.values(), "overall"]
    reached = Table(title=f"What reached the prompt, {label}: share of questions; 95% interval")
    reached.add_column("config")
    for g in groups:
        reached.add_column(f"{g} (n={results['no_memory']['evidence_in_prompt'][g]['n']})")
    for config in _configs(results):
        for metric, name in (("evidence_in_prompt", "evidence"), ("answer_in_prompt", "answer")):
            reached.add_row(
                f"{config} {name}", *(_cell(results[config][metric][g]) for g in groups)
            )
    out().print(reached)
    if results["settings"].get("answers", True):
        _f1_tables(results, label, groups)
    _layer_lines(results)
    _facts_line(results)


# Each F1 of the report (mlxmem.eval.locomo.SCORERS): its table's title.
F1_TITLES = {
    "f1": "LoCoMo F1 unstemmed (exact match) by category",
    "f1_locomo": "f1_locomo: LoCoMo F1 as its script scores it (Porter-stemmed) by category",
    "f1_amem": "f1_amem: A-Mem's set F1 by category (adversarial: against an answer not held)",
}


def _f1_tables(results: dict, label: str, groups: list[str]) -> None:
    for metric in ev.SCORERS:
        if metric in results["no_memory"]:  # a run stored before the metric has none
            _f1_table(results, metric, f"{F1_TITLES[metric]}, {label}", groups)
    if "f1_amem" in results["no_memory"]:
        _amem_table(results)
    per = Table(title="overall F1 per conversation (categories 1-4)")
    per.add_column("conversation")
    for config in _configs(results):
        per.add_column(config, justify="right")
    for cid, row in results["per_conversation"].items():
        per.add_row(cid, *(_cell(row[c]) for c in _configs(results)))
    out().print(per)
    for key in DIFFERENCES:
        d = results.get(key)
        if d is None:  # a run stored before this difference was recorded
            continue
        if d["mean"] is not None:
            verdict = "beats" if d["beats"] else "does not beat (interval includes 0 or below)"
            err.print(f"{key}: F1 difference {_difference(d)}, n={d['n']}: {verdict}")
    for name, group in results.get("by_subject", {}).items():
        d = group["facts_vs_no_memory"]
        if d["mean"] is not None:
            err.print(
                f"questions about {_SUBJECT_LABELS[name]} ({group['questions']}): F1 facts - "
                f"no_memory {_difference(d)}"
            )
    for group, ev_ in results.get("evicted_evidence", {}).items():
        if ev_["questions"]:
            d = ev_["recall_vs_mlxmem"]
            err.print(
                f"evidence out of the window ({group.replace('_', '-')}): recall brought it back "
                f"for {ev_['evidence_recalled']}/{ev_['questions']} questions "
                f"({ev_['share']:.0%}); F1 recall - mlxmem {d['mean']:+.3f}"
            )


DIFFERENCES = (
    "recall_vs_mlxmem",
    "recall_vs_window",
    "facts_vs_no_memory",
    "recall_vs_facts",
    "oracle_vs_no_memory",
)


# The facts are about the person, so they can carry only what is asked about them.
_SUBJECT_LABELS = {
    "user": "the person",
    "other": "the other speaker",
    "both": "both speakers",
    "neither": "no speaker by name",
}


def _f1_table(results: dict, metric: str, title: str, groups: list[str]) -> None:
    table = Table(title=f"{title}; 95% bootstrap interval")
    table.add_column("config")
    for g in groups:
        table.add_column(f"{g} (n={results['no_memory'][metric][g]['n']})", justify="right")
    for config in _configs(results):
        exact = results[config]["exact"] if metric == "f1" else None
        table.add_row(
            config,
            *(_cell(results[config][metric][g], exact[g] if exact else None) for g in groups),
        )
    out().print(table)


def _amem_table(results: dict) -> None:
    table = Table(
        title="f1_amem x100 beside A-Mem's published Qwen2.5-1.5B row (Xu et al. 2025, Table "
        "1; its columns are LoCoMo's categories by number; its prompts and memory, not ours)"
    )
    table.add_column("config")
    for c in ev.SCORED:
        table.add_column(f"{c} {ev.CATEGORIES[c]}", justify="right")
    for name, row in ev.beside_amem(results).items():
        table.add_row(name, *("-" if row[c] is None else f"{row[c]:.1f}" for c in ev.SCORED))
    out().print(table)


def _facts_line(results: dict) -> None:
    if results.get("facts_in_prompt_mean") is not None:
        err.print(
            f"facts in a new chat's prompt: {results['facts_in_prompt_mean']:.1f} on average, "
            f"{results['facts_with_answer_word_mean']:.2f} of them holding a word of the answer",
            markup=False,
        )


def _configs(results: dict) -> list[str]:
    return results.get("configs", list(ev.CONFIGS))  # a run stored before configs were named


def _layer_lines(results: dict) -> None:
    for cid, layers in results["layers"].items():
        if "summaries" not in layers:  # each session its own conversation
            f = layers["facts"]
            err.print(
                f"{cid}: {layers['turns']} turns in {layers['conversations']} "
                f"conversations, {f['kept']} facts kept ({_num(f['per_100_turns'])} per 100 "
                "turns)",
                markup=False,
            )
            continue
        s, e = layers["summaries"], layers["entity_survival"]
        share = "-" if e["share"] is None else f"{e['share']:.0%}"
        err.print(
            f"{cid}: {layers['turns']} turns, facts {layers['facts']['extraction']} "
            f"({layers['facts']['added']} added), {s['count']} summaries "
            f"({s['sources'].get('extractive', 0)} extractive, "
            f"{s['sources'].get('model+extractive', 0)} the model's with specifics added, mean "
            f"{_num(s['tokens_mean'])} tokens, cap {s['cap']}), evidence entities kept in "
            f"the summary {e['entities_in_summary']}/{e['entities']} ({share}; capitalized words)"
        )


def _difference(d: dict) -> str:
    ci = f" [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]" if d["ci"] else ""
    return f"{d['mean']:+.3f}{ci}"


def _cell(f1: dict, exact: dict | None = None) -> str:
    if f1["mean"] is None:
        return "-"
    text = f"{f1['mean']:.3f}"
    if exact is not None:
        text += f" ({exact['mean']:.2f})"
    if f1["ci"]:
        text += f" [{f1['ci'][0]:.2f}-{f1['ci'][1]:.2f}]"
    return text


def _num(value) -> str:
    return "-" if value is None else f"{value:.0f}"
