"""`mlxmem bench`: speed, turns, restart and history; a thin layer over mlxmem.bench."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mlxmem import bench
from mlxmem.bench.common import DEFAULT_BENCH_SEED, gpu_available, machine_text
from mlxmem.bench.restart import DEFAULT_RESTART_TRIALS
from mlxmem.bench.scale import (
    DEFAULT_SCALE_CONVERSATIONS,
    DEFAULT_SCALE_TRIALS,
    DEFAULT_SIZES,
    MAX_SCALE_TRIALS,
    MIN_SCALE_SIZE,
)
from mlxmem.bench.speed import DEFAULT_GEN_TOKENS, DEFAULT_LENGTHS, DEFAULT_TRIALS
from mlxmem.bench.turns import DEFAULT_SYNTHETIC_TURNS
from mlxmem.errors import InputError
from mlxmem.measure import Progress as OnProgress
from mlxmem.memory.context.budget import context_budget

from .common import ENGINE, JSON, THREADS, err, out, plain_typer, print_json, say

app = plain_typer(
    help="Measure mlxmem against the baselines a user would otherwise use, and keep the "
    "results: `speed` (engine vs bare mlx-lm), `turns` (a conversation replayed through the "
    "memory system), `restart` (the first turn after a restart), `scale` (a ten-year log), "
    "`history` (stored runs).",
    no_args_is_help=True,
)

MODEL = typer.Option(
    None, "--model", help="A registry alias or a model directory: real weights (on a Mac)."
)
ARCH = typer.Option(
    None,
    "--arch",
    help="Random weights of this shape: tiny, small, a registry arch (llama-3.2-3b, ...) or a "
    "config.json path. Default: llama-3.2-3b on a GPU, tiny on a CPU.",
)
QUANTIZE = typer.Option(
    None, "--quantize", help="Bits per weight for --arch (default: the arch's own, else fp32)."
)
SEED = typer.Option(DEFAULT_BENCH_SEED, "--seed", help="Seed for weights, prompts and sampling.")
DB = typer.Option(
    None,
    "--db",
    help="Store the run in this DuckDB file (default: bench.duckdb in the data directory).",
)
CONTEXT = typer.Option(None, "--context-tokens", help="Context budget (default: the model's).")
TRANSCRIPT = typer.Option(
    None, "--transcript", help="JSON lines with role and text (default: a synthetic chat)."
)
PLOT = typer.Option(
    None, "--plot", help="Write a PNG of context fill per turn and time to first token."
)

SCALE_PLOT = typer.Option(None, "--plot", help="Write a PNG of latency against log size.")


@app.command("speed")
def speed(
    model: str = MODEL,
    arch: str = ARCH,
    quantize: int = QUANTIZE,
    lengths: str = typer.Option(
        ",".join(map(str, DEFAULT_LENGTHS)), "--lengths", help="Prompt lengths, comma-separated."
    ),
    trials: int = typer.Option(DEFAULT_TRIALS, "--trials", min=1, help="Timed trials each."),
    gen_tokens: int = typer.Option(
        DEFAULT_GEN_TOKENS, "--gen-tokens", min=2, help="Tokens decoded per trial."
    ),
    seed: int = SEED,
    engine_name: str | None = ENGINE,
    threads: int | None = THREADS,
    vs_mlx: bool = typer.Option(
        True,
        "--vs-mlx/--no-vs-mlx",
        help="On llama.cpp, also time the MLX engine on the same weights (one trial a length).",
    ),
    db: Path = DB,
    as_json: bool = JSON,
) -> None:
    """Prefill and decode tokens/s, time to first token and peak memory: mlxmem's engine next
    to the bare library on the same model and prompts (mlx_lm.stream_generate, or on llama.cpp
    llama-cpp-python's Llama on the same file and threads, then the MLX engine on the same
    weights and the decode limit of the machine's memory bandwidth), and a cached turn's time to
    first token against a fresh prefill of the same prompt and against its limit (bare mlx-lm
    prefilling only the new tokens onto a warm cache), and the time a turn spends outside the
    engine before its first token (store, assembly, slot lookup; a window of each length).
    A warm-up, then N trials: medians, with their range (lowest to highest)."""
    sizes = _lengths(lengths)
    chosen = _model(model, arch, quantize, seed, as_json, engine_name)
    with bench.bench_engine(chosen) as engine, _progress("speed") as progress:
        result = bench.run_speed(
            engine, sizes, trials, gen_tokens, seed, progress, library=chosen.engine
        )
    if chosen.engine == "llamacpp" and vs_mlx and chosen.alias is not None:
        from mlxmem.bench.speed import decode_limit, versus_mlx
        from mlxmem.engine import MLXEngine
        from mlxmem.models import ensure_local, resolve
        from mlxmem.models.choice import runs_on

        spec = resolve(chosen.alias)
        if runs_on(spec, "mlx"):  # the same weights converted for MLX (once, on first use)
            mlx = MLXEngine(ensure_local(spec))
            result.vs_mlx = versus_mlx(mlx, result, gen_tokens, seed) | decode_limit(chosen.path)
    run = bench.record_run(bench.BenchRun.of(result, chosen), db)
    if as_json:
        return _print_json(run)
    title = (
        f"bench speed: {chosen.label}, median of {trials} trials (± half their range), "
        f"{gen_tokens} tokens decoded"
    )
    table = Table(title=title)
    for column in (
        "prompt",
        "TTFT mlxmem",
        "TTFT mlx-lm",
        "cached-turn TTFT",
        "speed-up",
        "limit TTFT",
        "vs limit",
        "overhead ms",
        "decode tok/s mlxmem",
        "decode tok/s mlx-lm",
        "decode ratio",
        "peak MB mlxmem / mlx-lm",
    ):
        table.add_column(column, justify="right")
    for row in result.to_dict()["lengths"]:
        spread = row["spread"]
        table.add_row(
            str(row["prompt_tokens"]),
            _plusminus(row["ttft_s"], spread["ttft_s"], "s"),
            _plusminus(row["bare_ttft_s"], spread["bare_ttft_s"], "s"),
            _plusminus(row["cached_ttft_s"], spread["cached_ttft_s"], "s"),
            _times(row["cached_ttft_ratio"]),
            _plusminus(row["limit_ttft_s"], spread["limit_ttft_s"], "s"),
            _number(row["cached_vs_limit_ratio"], 2),
            _number(row["overhead_ms"], 1),
            _plusminus(row["decode_tps"], spread["decode_tps"]),
            _plusminus(row["bare_decode_tps"], spread["bare_decode_tps"]),
            _plusminus(row["decode_tps_ratio"], spread["decode_tps_ratio"]),
            f"{row['peak_memory_gb'] * 1e3:.0f} / {row['bare_peak_memory_gb'] * 1e3:.0f}",
        )
    out().print(table)
    if result.vs_mlx is not None:
        for row in result.vs_mlx["lengths"]:
            say(
                f"{row['prompt_tokens']} tokens: llama.cpp decodes {_times(row['decode_ratio'])} "
                f"and prefills {_times(row['prefill_ratio'])} as fast as MLX on the same weights"
            )
        limit = result.vs_mlx.get("limit_decode_tps")
        if limit:
            say(f"decode limit of this machine's memory bandwidth: {limit:.1f} tokens/s")
    _footer(run)


@app.command("turns")
def turns(
    transcript: Path = TRANSCRIPT,
    model: str = MODEL,
    arch: str = ARCH,
    quantize: int = QUANTIZE,
    context_tokens: int = CONTEXT,
    max_turns: int = typer.Option(None, "--max-turns", min=1, help="Replay only N exchanges."),
    synthetic_turns: int = typer.Option(
        DEFAULT_SYNTHETIC_TURNS,
        "--synthetic-turns",
        min=1,
        help="Exchanges of the synthetic chat, without --transcript.",
    ),
    generate: bool = typer.Option(
        False, "--generate", help="Let the model write the replies instead of replaying them."
    ),
    max_tokens: int = typer.Option(None, "--max-tokens", min=1, help="Longest reply (--generate)."),
    facts: bool = typer.Option(
        None,
        "--facts/--no-facts",
        help="Extract facts, as a chat does (default: off in a replay, on with --one-shot).",
    ),
    rebuild_every: int = typer.Option(
        1,
        "--rebuild-every",
        min=0,
        help="Measure baseline (a), rebuilding the prompt from scratch, every N turns (0: never).",
    ),
    fresh_summaries: bool = typer.Option(
        True,
        "--fresh-summaries/--no-fresh-summaries",
        help="Measure baseline (b), each summary written in a fresh context.",
    ),
    reply_in_cache: bool = typer.Option(
        True,
        "--reply-in-cache/--no-reply-in-cache",
        help="Replay: put each replayed reply into the KV cache after its turn, where "
        "generating it would have left it (counted apart, as decoding).",
    ),
    recall: bool = typer.Option(
        False,
        "--recall/--no-recall",
        help="Recall old turns into messages about the past, as a chat does by default (off "
        "here: the recorded figures measure the window and summary).",
    ),
    background: bool = typer.Option(
        True,
        "--background/--no-background",
        help="Do each turn's memory work (folding ahead, warming the cache, noting a fact) "
        "after the reply is logged, while the person reads and types, as the interactive chat "
        "does; --no-background does it before the next message is accepted.",
    ),
    think: str = typer.Option(
        "0",
        "--think",
        metavar="SECONDS[,SECONDS...]",
        help="How long the person reads and types between a reply and the next message "
        "(slept): background memory work runs meanwhile. 0 sends the next message at once; "
        "several, such as 0,10, are taken in turn (a quick follow-up, then a pause).",
    ),
    foreground: bool = typer.Option(
        True,
        "--foreground-pass/--no-foreground-pass",
        help="Replay the turns a second time with the memory work done before the next "
        "message (no baselines), and report its waits beside (foreground_*).",
    ),
    one_shot: bool = typer.Option(
        False,
        "--one-shot",
        help="Send each message with `mlxmem chat -m TEXT --json` in a new process (as "
        "scripts and serve restarts do), the model writing the replies, and report per turn "
        "the prompt and cached tokens and whether the previous prompt and reply were reused "
        "in full. Facts are extracted unless --no-facts is given; no baselines.",
    ),
    plot: Path = PLOT,
    seed: int = SEED,
    engine_name: str | None = ENGINE,
    threads: int | None = THREADS,
    db: Path = DB,
    as_json: bool = JSON,
) -> None:
    """Replay a conversation through the full memory system and record, per turn, the tokens
    of each layer, prompt / cached / prefilled tokens, time to first token and folds, next
    to (a) rebuilding every prompt from scratch and (b) summarizing in a fresh context."""
    if one_shot:
        return _one_shot_turns(
            transcript, model, arch, quantize, context_tokens, max_turns, synthetic_turns,
            max_tokens, facts, seed, db, as_json, engine_name,
        )  # fmt: skip
    exchanges, source = _exchanges(transcript, not generate, synthetic_turns, seed, max_turns)
    chosen = _model(model, arch, quantize, seed, as_json, engine_name)
    with bench.bench_engine(chosen) as engine, _progress("turns") as progress:
        result = bench.run_turns(
            engine,
            exchanges,
            context_budget(context_tokens, chosen.context_tokens),
            chosen.response_reserve,
            generate=generate,
            facts=bool(facts),
            max_tokens=max_tokens,
            rebuild_every=rebuild_every,
            fresh_summaries=fresh_summaries,
            reply_in_cache=reply_in_cache,
            recall=recall,
            seed=seed,
            progress=progress,
            background=background,
            think_s=_seconds_list(think, "--think"),
            compare_foreground=foreground and background,
        )
    result.settings["transcript"] = source
    run = bench.record_run(bench.BenchRun.of(result, chosen), db)
    if plot is not None:
        from mlxmem.bench.plot import plot_turns

        title = f"{Path(source).name if transcript else source}: {chosen.label}"
        plot_turns(result, plot, title)
    if as_json:
        return _print_json(run)
    budget = result.settings["context_tokens"]
    title = f"bench turns: {source}, {chosen.label}, {budget} tokens"
    table = Table("figure", "value", title=title)
    for name, value in _turns_rows(result):
        table.add_row(name, value)
    out().print(table)
    _footer(run, plot)


def _turns_rows(result: bench.TurnsResult) -> list[tuple[str, str]]:
    """The figures `bench turns` prints, named, from a run's summary."""
    s = result.summary()
    rows = [
        ("turns (exchanges)", str(s["turns"])),
        ("prompt tokens from cache, all calls", _share(s["cache_share"])),
        ("  replies only", _share(s["cache_share_replies"])),
        (
            "  non-fold turns",
            f"{_share(s['cache_share_non_fold'])} ({s['non_fold_turns']} turns)",
        ),
        ("turns kept verbatim, mean", _number(s["verbatim_turns_mean"], 1)),
        (
            "prompt tokens, mean / max",
            f"{_number(s['prompt_tokens_mean'], 0)} / {s['prompt_tokens_max']}",
        ),
        ("prefilled tokens per turn, mean", _number(s["prefilled_tokens_mean"], 0)),
        ("folds (before a reply)", f"{s['folds']} ({s['folds_before_reply']})"),
        (
            "summary tokens, mean / max",
            f"{_number(s['summary_tokens_mean'], 0)} / {s['summary_tokens_max']}",
        ),
        ("budget violations", str(s["budget_violations"])),
        ("accounting errors", str(s["accounting_errors"])),
        (
            "TTFT median: mlxmem / rebuild",
            f"{_number(s['wait_s_median'], 3)} s / {_number(s['rebuild_ttft_s_median'], 3)} s",
        ),
        (
            "(a) TTFT ratio vs rebuild, all / non-fold",
            f"{_times(s['ttft_ratio_vs_rebuild'])} / {_times(s['ttft_ratio_vs_rebuild_non_fold'])}",
        ),
        ("(a) prefilled tokens vs rebuild", _number(s["prefill_ratio_vs_rebuild"], 3)),
        ("(b) fold prefill vs fresh-context summary", _number(s["fold_prefill_ratio"], 3)),
        ("(b) fold time vs fresh-context summary", _number(s["fold_seconds_ratio"], 3)),
        (
            "KV cache written per turn / new KV",
            f"{_number((s['kv_bytes_written_per_turn'] or 0) / 1e6, 2)} MB / "
            f"{_number((s['kv_bytes_new_per_turn'] or 0) / 1e6, 2)} MB",
        ),
        ("tokens per word (tokenizer)", _number(result.settings["tokens_per_word"], 2)),
        (
            "wait reply logged -> next message, median / p95",
            f"{_number(s.get('wait_after_reply_ms_median'), 1)} / "
            f"{_number(s.get('wait_after_reply_ms_p95'), 1)} ms",
        ),
        (
            "wait Enter -> model starts, median / p95",
            f"{_number(s.get('wait_before_reply_ms_median'), 1)} / "
            f"{_number(s.get('wait_before_reply_ms_p95'), 1)} ms",
        ),
    ]
    if "foreground_wait_after_reply_ms_p95" in s:
        rows += [
            (
                "  memory work before the next message: logged -> next, p95",
                f"{_number(s['foreground_wait_after_reply_ms_p95'], 1)} ms",
            ),
            (
                "  memory work before the next message: Enter -> model, p95",
                f"{_number(s['foreground_wait_before_reply_ms_p95'], 1)} ms",
            ),
        ]
    return rows


def _exchanges(transcript, replay: bool, synthetic_turns: int, seed: int, max_turns):
    """The exchanges to run, from `transcript` or a synthetic chat, and how to name them."""
    if transcript is not None:
        exchanges = bench.read_transcript(transcript, replay=replay)
        source = str(transcript)
    else:
        exchanges = bench.synthetic_transcript(synthetic_turns, seed)
        source = f"synthetic ({synthetic_turns} exchanges, seed {seed})"
    return (exchanges[:max_turns] if max_turns else exchanges), source


def _one_shot_turns(
    transcript, model, arch, quantize, context_tokens, max_turns, synthetic_turns, max_tokens,
    facts, seed, db, as_json, engine_name,
) -> None:  # fmt: skip
    exchanges, source = _exchanges(transcript, False, synthetic_turns, seed, max_turns)
    chosen = _model(model, arch, quantize, seed, as_json, engine_name)
    with _progress("turns --one-shot") as progress:
        result = bench.run_one_shot_turns(
            chosen.path,
            [user for user, _ in exchanges],
            context_budget(context_tokens, chosen.context_tokens),
            chosen.response_reserve,
            facts=facts is not False,  # on unless --no-facts, as in `mlxmem chat`
            max_tokens=max_tokens,
            seed=seed,
            progress=progress,
        )
    result.settings["transcript"] = source
    run = bench.record_run(bench.BenchRun.of(result, chosen), db)
    if as_json:
        return _print_json(run)
    s = result.summary()
    budget = result.settings["context_tokens"]
    title = f"bench turns --one-shot: {source}, {chosen.label}, {budget} tokens"
    table = Table(
        "turn", "prompt tokens", "cached tokens", "fact noted", "previous reused", title=title
    )
    for r in result.records:
        reused = {None: "fold" if r.fold_turn else "-", True: "yes", False: "NO"}
        table.add_row(
            str(r.turn), str(r.prompt_tokens), str(r.cached_tokens),
            "yes" if r.fact_added else "", reused[r.reused_previous],
        )  # fmt: skip
    out().print(table)
    err.print(
        f"{s['turns_reusing_previous']} of {s['turns_judged']} turns reused the previous prompt "
        f"and reply in full; facts noted: {s['facts_added']}"
    )
    _footer(run)


@app.command("restart")
def restart(
    model: str = MODEL,
    arch: str = ARCH,
    quantize: int = QUANTIZE,
    context_tokens: int = CONTEXT,
    trials: int = typer.Option(DEFAULT_RESTART_TRIALS, "--trials", min=1, help="Trials each."),
    seed: int = SEED,
    engine_name: str | None = ENGINE,
    threads: int | None = THREADS,
    db: Path = DB,
    as_json: bool = JSON,
) -> None:
    """Time to first token of the first turn after a restart at a full context: the chat's KV
    cache loaded from disk, against rebuilding it from the chat log."""
    chosen = _model(model, arch, quantize, seed, as_json, engine_name)
    if chosen.engine != "mlx":
        raise InputError("bench restart measures the MLX engine's slot files; give --engine mlx")
    with _progress("restart") as progress:
        result = bench.run_restart(
            chosen.path,
            context_budget(context_tokens, chosen.context_tokens),
            chosen.response_reserve,
            trials,
            seed,
            progress,
        )
    run = bench.record_run(bench.BenchRun.of(result, chosen), db)
    if as_json:
        return _print_json(run)
    r = result.to_dict()
    table = Table("", "cache restored", "cache rebuilt", title=f"bench restart: {chosen.label}")
    spread = r["spread"]
    table.add_row("prompt tokens", str(r["prompt_tokens"]), str(r["prompt_tokens"]))
    table.add_row(
        "prefilled tokens", str(r["restored_prefilled_tokens"]), str(r["rebuilt_prefilled_tokens"])
    )
    table.add_row(
        "time to first token",
        _plusminus(r["restored_ttft_s"], spread["restored_ttft_s"], "s"),
        _plusminus(r["rebuilt_ttft_s"], spread["rebuilt_ttft_s"], "s"),
    )
    out().print(table)
    err.print(
        f"restored cache: {_times(r['ttft_ratio'])} faster; cache file "
        f"{r['cache_file_bytes'] / 1e6:.1f} MB; model load {r['model_load_s']:.2f} s (not counted)"
    )
    auto = r["auto_policy"]
    if auto["decision"] is not None:
        agrees = "agrees with" if auto["agrees_with_race"] else "DISAGREES with"
        err.print(
            f"the engine's own rule: {auto['decision']} (loading runs at "
            f"{_times(auto['load_over_recompute'])} the speed of recomputing); "
            f"it {agrees} the race"
        )
    _footer(run)


@app.command("scale")
def scale(
    sizes: str = typer.Option(
        ",".join(map(str, DEFAULT_SIZES)), "--sizes", help="Log sizes in turns, comma-separated."
    ),
    trials: int = typer.Option(
        DEFAULT_SCALE_TRIALS, "--trials", min=1, max=MAX_SCALE_TRIALS, help="Trials each."
    ),
    conversations: int = typer.Option(
        DEFAULT_SCALE_CONVERSATIONS,
        "--conversations",
        min=1,
        help="Conversations the messages are spread over (the one chatted in keeps a summary "
        "and a full window; 1: the whole log in it, the layout of runs before this option).",
    ),
    plot: Path = SCALE_PLOT,
    seed: int = SEED,
    db: Path = DB,
    as_json: bool = JSON,
) -> None:
    """What a ten-year log costs: for each size, a scratch data directory with that many
    turns in --conversations conversations and 300 facts, and the time of a turn without the
    model, a turn's read of the store with recall (open included; recall searches every
    conversation), history search, memory list, memory rm (one fact, erased for good) and
    history rm (one turn). No model runs."""
    counts = _sizes(sizes)
    with _progress("scale") as progress:
        result = bench.run_scale(counts, trials, seed, progress, conversations)
    run = bench.record_run(bench.BenchRun.of(result, None), db)
    if plot is not None:
        from mlxmem.bench.plot import plot_scale

        plot_scale(result, plot)
    if as_json:
        return _print_json(run)
    table = Table(title=f"bench scale: median of {trials} trials")
    for column in ("turns", "conversations", "file MB", "turn ms", "recall ms", "search s"):
        table.add_column(column, justify="right")
    for column in ("memory list s", "memory rm s", "history rm s"):
        table.add_column(column, justify="right")
    for row in result.to_dict()["sizes"]:
        table.add_row(
            f"{row['turns']:,}",
            f"{row['conversations']:,}",
            f"{row['db_bytes'] / 1e6:.1f}",
            _number(row["turn_overhead_ms"], 1),
            _number(row["recall_ms"], 1),
            _number(row["search_s"], 3),
            _number(row["memory_list_s"], 3),
            _number(row["memory_rm_s"], 3),
            _number(row["history_rm_s"], 3),
        )
    out().print(table)
    _footer(run, plot)


@app.command("history")
def history(
    kind: str = typer.Option(
        None, "--kind", help="Only runs of this kind: speed, turns, restart, scale, eval."
    ),
    limit: int = typer.Option(bench.DEFAULT_HISTORY_LIMIT, "--limit", min=1, help="Newest N."),
    run_id: int = typer.Option(None, "--id", help="One run, with all its results (use --json)."),
    db: Path = DB,
    as_json: bool = JSON,
) -> None:
    """List stored benchmark runs, newest first, with their headline figures."""
    runs = bench.history(db, kind, limit, run_id)
    if run_id is not None and not runs:
        raise InputError(f"no benchmark run with id {run_id}")
    if as_json:
        print_json([r.to_dict(full=run_id is not None) for r in runs])
        return
    if not runs:
        typer.echo("No benchmark runs yet: try `mlxmem bench speed`.")
        return
    # Runs of one kind line up figure by figure; mixed kinds get one column of figures.
    one_kind = len({r.kind for r in runs}) == 1
    keys = list(dict.fromkeys(k for r in runs for k in bench.headline(r))) if one_kind else []
    table = Table("id", "when (UTC)", "kind", "model", "machine", *(keys or ["figures"]))
    for r in runs:
        figures = bench.headline(r)
        cells = [_figure(figures.get(k)) for k in keys] or [
            ", ".join(f"{k} {_figure(v)}" for k, v in figures.items())
        ]
        machine = f"{r.machine.get('cores')} cores, {r.machine.get('device')}"
        when = f"{r.created_at:%Y-%m-%d %H:%M}"
        table.add_row(str(r.id), when, r.kind, r.model.get("label", ""), machine, *cells)
    out().print(table)


# -- helpers ----------------------------------------------------------------------------------


def _model(
    model: str | None,
    arch: str | None,
    quantize: int | None,
    seed: int,
    quiet: bool,
    engine: str | None = None,
):
    chosen = bench.prepare_model(model, arch, quantize, seed, engine)
    if not quiet:
        err.print(f"model: {chosen.label}: {chosen.description}")
        err.print(f"machine: {machine_text(bench.machine_info())}")
        if chosen.random_weights and not gpu_available():
            err.print(
                "[yellow]CPU only: random weights of a small shape; times are this CPU's, "
                "ratios are what carries over. For the real figures run on a Mac (Apple "
                "silicon): --model llama-3.2-3b.[/yellow]"
            )
    return chosen


PLAIN_PROGRESS_SECONDS = 30.0


@contextlib.contextmanager
def _progress(name: str) -> Iterator[OnProgress]:
    """A live bar on a terminal; elsewhere (a log file, CI) a plain line every half minute."""
    if not err.is_terminal:
        yield _plain_progress(name, PLAIN_PROGRESS_SECONDS)
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(name, total=None)

        def update(description: str, done: int, total: int) -> None:
            bar.update(task, description=f"{name}: {description}", completed=done, total=total)

        yield update


def _plain_progress(name: str, every: float) -> OnProgress:
    start = time.monotonic()
    last = -every

    def update(description: str, done: int, total: int) -> None:
        nonlocal last
        now = time.monotonic() - start
        if now - last < every:
            return
        last = now
        of = f"/{total}" if total else ""
        err.print(f"{name}: {description} ({done}{of} done, {now / 60:.1f} min)")

    return update


def _print_json(run: bench.BenchRun) -> None:
    print_json(
        {
            "run_id": run.id,
            "model": run.model,
            "machine": run.machine,
            "versions": run.versions,
            **run.results,
            "goals": [asdict(g) for g in bench.goals(run)],
        }
    )


def _footer(run: bench.BenchRun, plot: Path | None = None) -> None:
    for goal in bench.goals(run):
        mark = {True: "[green]met[/green]", False: "[red]NOT met[/red]", None: "not measured"}
        err.print(f"goal {goal.name} {goal.target}: {_figure(goal.value)} {mark[goal.met]}")
    if plot is not None:
        err.print(f"plot written to {plot}")
    err.print(f"[dim]stored as run {run.id}; `mlxmem bench history` compares runs[/dim]")


def _lengths(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--lengths takes numbers separated by commas, not {text!r}") from None
    if not sizes or min(sizes) < 8:
        raise InputError("--lengths needs prompt lengths of at least 8 tokens")
    return sizes


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--sizes takes numbers separated by commas, not {text!r}") from None
    if not sizes or min(sizes) < MIN_SCALE_SIZE:
        raise InputError(f"--sizes needs logs of at least {MIN_SCALE_SIZE} messages")
    return sizes


def _plusminus(median: float, spread: list[float], unit: str = "") -> str:
    """`0.045 s ±3%`: the median and half the trials' range, relative."""
    digits = 3 if median < 10 else 0
    half = (spread[1] - spread[0]) / 2 / median if median else 0.0
    return f"{median:.{digits}f}{' ' + unit if unit else ''} ±{half:.0%}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _figure(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else str(value)


def _seconds_list(text: str, option: str) -> tuple[float, ...]:
    """ "0,10" -> (0.0, 10.0); a clear error for anything that is not seconds >= 0."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not v >= 0 for v in values):
        raise typer.BadParameter(f"{option} takes seconds >= 0, such as 1 or 0,10; not {text!r}")
    return values
