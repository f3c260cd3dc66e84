"""`mlxmem bench`: the runs complete, their numbers add up, and every run is stored.

Bookkeeping is checked on the fake engine; the commands end to end on a tiny random model with
small windows. Nothing here asserts a time: benchmarks measure, tests check consistency.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import typer
from typer.testing import CliRunner

import mlxmem
from mlxmem import bench
from mlxmem.bench import synth
from mlxmem.bench.common import BenchModel, resolve_arch, source_commit, versions
from mlxmem.bench.turns import read_transcript, run_turns
from mlxmem.cli.bench import _seconds_list
from mlxmem.cli.main import app
from mlxmem.engine import Message, MLXEngine, Sampling
from mlxmem.errors import InputError
from mlxmem.memory.companion import Companion
from mlxmem.models.tiny import make_tiny
from mlxmem.restart import PROFILE_FILENAME
from mlxmem.testing import FakeEngine

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
runner = CliRunner()


@pytest.fixture(scope="module")
def transcript(tmp_path_factory):
    """A short synthetic chat: 30 exchanges of journal text."""
    return synth.write("journal", tmp_path_factory.mktemp("t") / "chat.jsonl", turns=30)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0, arch=SMALL)


def invoke(*args: str) -> dict | list:
    result = runner.invoke(app, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def check_turns(report: dict) -> None:
    """Every turn's numbers add up, and the summary agrees with them."""
    assert report["budget_violations"] == 0
    assert report["accounting_errors"] == 0
    for turn in report["per_turn"]:
        assert turn["cached_tokens"] + turn["prefilled_tokens"] == turn["prompt_tokens"]
        assert sum(turn["layers"].values()) == turn["budget"]
        assert turn["prompt_tokens"] + turn["layers"]["reserve"] <= turn["budget"]
        for c in turn["folds"]:
            assert c["cached_tokens"] + c["prefilled_tokens"] == c["prompt_tokens"]
    cached = sum(t["cached_tokens"] for t in report["per_turn"])
    prompt = sum(t["prompt_tokens"] for t in report["per_turn"])
    assert report["cache_share_replies"] == pytest.approx(cached / prompt)
    assert report["folds"] == sum(len(t["folds"]) for t in report["per_turn"])


# -- transcripts ----------------------------------------------------------------------------------


def test_transcript_pairs_turns(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [
        ("assistant", "an opening line without a question"),
        ("user", "first"),
        ("user", "second"),
        ("assistant", "reply"),
        ("user", "third"),
        ("assistant", "reply two"),
        ("assistant", "more"),
        ("user", "left without a reply"),
    ]
    path.write_text("\n".join(json.dumps({"role": r, "text": t, "id": 1}) for r, t in lines))
    assert read_transcript(path) == [("first\nsecond", "reply"), ("third", "reply two\nmore")]
    assert read_transcript(path, replay=False)[-1] == ("left without a reply", None)


def test_transcript_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"role": "user", "text": "hi"}\n{"speaker": "x"}\n')
    with pytest.raises(InputError, match="bad.jsonl:2"):
        read_transcript(path)
    path.write_text('{"role": "system", "text": "hi"}\n')
    with pytest.raises(InputError, match="role must be"):
        read_transcript(path)


def test_synthetic_scenarios_are_deterministic_jsonl(tmp_path):
    for name in synth.SCENARIOS:
        a = synth.write(name, tmp_path / f"{name}-a.jsonl", turns=12)
        b = synth.write(name, tmp_path / f"{name}-b.jsonl", turns=12)
        assert a.read_bytes() == b.read_bytes()
        items = [json.loads(line) for line in a.read_text().splitlines()]
        assert [i["role"] for i in items] == ["user", "assistant"] * 12
        assert len(read_transcript(a)) == 12


# -- bookkeeping on the fake engine -----------------------------------------------------------


def test_turns_bookkeeping_with_the_fake_engine(transcript):
    exchanges = read_transcript(transcript)
    result = run_turns(FakeEngine(), exchanges, context_tokens=512, response_reserve=64)
    report = result.to_dict()
    check_turns(report)
    assert report["turns"] == 30
    assert report["folds"] > 0
    assert report["summary_tokens_max"] <= report["settings"]["summary_cap"]
    # Baseline (a) on every turn prefills the whole prompt; (b) after every fold.
    for turn in report["per_turn"]:
        assert turn["rebuild_prefilled_tokens"] == turn["prompt_tokens"]
        for c in turn["folds"]:
            assert c["fresh_prefilled_tokens"] == c["fresh_prompt_tokens"] > 0
    assert 0 < report["fold_prefill_ratio"] < 1
    steady = [t for t in report["per_turn"] if not t["fold_turn"]]
    assert report["non_fold_turns"] == len(steady) > 0


def replayed(**option) -> dict:
    """bench turns over 20 synthetic exchanges at a 1,024-token budget, checked turn by turn."""
    result = run_turns(FakeEngine(), bench.synthetic_transcript(20), 1024, 64, **option)
    report = result.to_dict()
    check_turns(report)
    return report


def test_replayed_replies_go_into_the_cache_as_generated_ones_would():
    shares = {}
    for in_cache in (True, False):
        result = replayed(reply_in_cache=in_cache)
        shares[in_cache] = result["cache_share_non_fold"]
        forced = [t["reply_prefilled_tokens"] for t in result["per_turn"]]
        assert (sum(forced) > 0) is in_cache
    assert shares[True] > shares[False]


def test_bench_turns_with_recall_measures_its_cost():
    # Recall's block sits in one message only: the next turn prefills that message and its
    # reply again, so the cache covers less of each prompt than without recall.
    shares = {}
    for recall in (False, True):
        result = replayed(recall=recall)
        assert result["settings"]["recall"] is recall
        recalled = [t for t in result["per_turn"] if t["layers"]["recall"] > 0]
        assert bool(recalled) is recall
        shares[recall] = result["cache_share_non_fold"]
    assert shares[False] > shares[True] > 0


def test_baselines_can_be_skipped():
    exchanges = bench.synthetic_transcript(20)
    result = run_turns(
        FakeEngine(), exchanges, 512, 64, rebuild_every=0, fresh_summaries=False
    ).to_dict()
    check_turns(result)
    assert result["rebuild_turns"] == 0 and result["ttft_ratio_vs_rebuild"] is None
    assert result["fold_prefill_ratio"] is None


NOTING_S = 0.25  # how long the fake model takes to note a fact (wide margins: not a speed test)


def slow_facts(prompt: str) -> str:
    if "durable facts" in prompt:
        time.sleep(NOTING_S)
        return "NONE"
    return "A reply written by the model, word for word."


def test_memory_work_in_the_background_moves_the_wait_to_while_the_person_types():
    exchanges = bench.synthetic_transcript(6)
    common = dict(facts=True, rebuild_every=0, fresh_summaries=False)
    at_once = run_turns(
        FakeEngine(slow_facts), exchanges, 1024, 64, compare_foreground=True, **common
    ).to_dict()
    check_turns(at_once)
    # The person may type as soon as the reply is logged; done first, the memory work
    # (noting a fact, each turn) held the next message back.
    assert at_once["wait_after_reply_ms_p95"] < NOTING_S * 1e3 * 0.8
    assert at_once["foreground_wait_after_reply_ms_median"] >= NOTING_S * 1e3
    # Sent at once, the next message waits for that work instead...
    assert at_once["wait_before_reply_ms_median"] >= NOTING_S * 1e3
    # ...unless the person takes longer to read and type than the work takes.
    typing = run_turns(
        FakeEngine(slow_facts), exchanges, 1024, 64, think_s=2 * NOTING_S, **common
    ).to_dict()
    assert typing["settings"]["think_s"] == 2 * NOTING_S
    assert typing["wait_before_reply_ms_median"] < NOTING_S * 1e3 * 0.8
    assert len(typing["per_turn"]) == 6


def test_the_bench_sends_as_the_repl_does_with_the_store_held(monkeypatch):
    """The waits are the REPL's: the store held (a turn opens nothing after the first), and a
    message sent while the last turn's memory work runs is logged before it waits."""
    logged: list[str] = []
    log_message = Companion.log_message

    def spy(self: Companion, text: str):
        logged.append(text)
        return log_message(self, text)

    monkeypatch.setattr(Companion, "log_message", spy)
    exchanges = bench.synthetic_transcript(5)
    result = run_turns(
        FakeEngine(slow_facts), exchanges, 1024, 64, facts=True, rebuild_every=0,
        fresh_summaries=False,
    ).to_dict()  # fmt: skip
    check_turns(result)
    assert [t["store_opens"] for t in result["per_turn"]] == [1, 0, 0, 0, 0]
    # Each later message came while the last turn still looked for a fact (NOTING_S).
    assert logged == [user for user, _ in exchanges[1:]]


def test_think_times_are_taken_in_turn_and_checked():
    exchanges = bench.synthetic_transcript(4)
    pauses = (0.0, 2 * NOTING_S)  # a quick follow-up, then a pause
    result = run_turns(FakeEngine(slow_facts), exchanges, 1024, 64, think_s=pauses, facts=True)
    assert result.settings["think_s"] == list(pauses)
    started = time.perf_counter()
    run_turns(FakeEngine(), exchanges, 1024, 64, think_s=pauses, rebuild_every=0)
    assert time.perf_counter() - started >= 2 * pauses[1]  # two pauses in four turns
    assert _seconds_list("0,10", "--think") == (0.0, 10.0)
    for bad in ("", "x", "1,-2", "nan"):
        with pytest.raises(typer.BadParameter):
            _seconds_list(bad, "--think")


def test_generate_mode_lets_the_model_write_the_replies():
    exchanges = [(text, None) for text, _ in bench.synthetic_transcript(10)]
    engine = FakeEngine(lambda prompt: "A reply written by the model, word for word.")
    result = run_turns(engine, exchanges, 512, 64, generate=True, max_tokens=32).to_dict()
    check_turns(result)
    assert result["settings"]["mode"] == "generate" and result["turns"] == 10


def test_history_stores_and_compares_runs(tmp_path):
    exchanges = bench.synthetic_transcript(12)
    model = bench.BenchModel(tmp_path, "fake", "the fake engine", False)
    for _ in range(2):
        result = run_turns(FakeEngine(), exchanges, 512, 64)
        bench.record_run(bench.BenchRun.of(result, model))
    runs = bench.history()
    assert [r.id for r in runs] == [2, 1]
    assert runs[0].kind == "turns" and runs[0].model["label"] == "fake"
    assert runs[0].results["turns"] == 12
    assert bench.headline(runs[0])["budget_violations"] == 0
    assert {g.name for g in bench.goals(runs[0])} >= {"budget violations"}
    assert bench.history(kind="speed") == []
    with pytest.raises(InputError):
        bench.history(kind="nonsense")


def test_arch_names_and_config_files(tmp_path):
    assert resolve_arch("tiny") == ("tiny", {})
    label, shape = resolve_arch("llama-3.2-3b")
    assert shape["hidden_size"] == 3072 and shape["quantization"]["bits"] == 4
    config = tmp_path / "my-shape.json"
    config.write_text(json.dumps(SMALL))
    assert resolve_arch(str(config)) == ("my-shape", SMALL)
    with pytest.raises(InputError, match="unknown arch"):
        resolve_arch("no-such-shape")


# -- end to end on a tiny model -----------------------------------------------------------------


@pytest.mark.e2e
def test_bench_turns_end_to_end(tiny_model, transcript, tmp_path):
    db, png = tmp_path / "bench.duckdb", tmp_path / "fill.png"
    report = invoke(
        "turns",
        "--model",
        str(tiny_model),
        "--transcript",
        str(transcript),
        "--context-tokens",
        "768",
        "--db",
        str(db),
        "--plot",
        str(png),
    )
    for key in (
        "turns",
        "cache_share",
        "cache_share_non_fold",
        "folds",
        "budget_violations",
        "ttft_ratio_vs_rebuild",
        "fold_prefill_ratio",
    ):
        assert key in report
    assert report["turns"] == 30 and report["folds"] > 0
    check_turns(report)
    assert report["ttft_ratio_vs_rebuild"] > 0
    assert report["kv_bytes_written_per_turn"] > 0 and report["kv_bytes_new_per_turn"] > 0
    # The person's waits, with the memory work in the background and (second pass) done first.
    assert report["settings"]["background"] is True
    assert 0 <= report["wait_after_reply_ms_median"] <= report["wait_after_reply_ms_p95"]
    assert report["foreground_wait_after_reply_ms_p95"] is not None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    runs = invoke("history", "--db", str(db))
    assert [(r["id"], r["kind"]) for r in runs] == [(report["run_id"], "turns")]
    assert runs[0]["headline"]["budget_violations"] == 0
    assert "mlx" in runs[0]["versions"] and runs[0]["machine"]["cores"]
    with duckdb.connect(str(db), read_only=True) as con:
        stored = json.loads(con.execute("SELECT results FROM bench_runs").fetchone()[0])
    assert stored["per_turn"] == report["per_turn"]


@pytest.mark.e2e
def test_bench_turns_one_shot_runs_every_turn_in_a_new_process(tiny_model, transcript, tmp_path):
    """`--one-shot`: each message through `mlxmem chat -m` in its own process; every turn after
    the first finds the previous prompt and reply in the cache the last process saved."""
    db = tmp_path / "bench.duckdb"
    args = ["--model", str(tiny_model), "--transcript", str(transcript), "--max-turns", "3"]
    report = invoke("turns", "--one-shot", *args, "--max-tokens", "8", "--db", str(db))
    assert report["settings"]["mode"] == "one-shot" and report["settings"]["facts"] is True
    turns = report["per_turn"]
    assert [t["turn"] for t in turns] == [1, 2, 3] and turns[0]["cached_tokens"] == 0
    for before, after in zip(turns, turns[1:], strict=False):
        assert after["reused_previous"] is True and not after["fold_turn"]
        assert after["cached_tokens"] >= before["prompt_tokens"] + before["reply_tokens"]
        assert after["cached_tokens"] + after["prefilled_tokens"] == after["prompt_tokens"]
    assert report["turns_reusing_previous"] == report["turns_judged"] == 2
    assert report["prefix_broken_turns"] == [] and report["budget_violations"] == 0
    reuse = next(g for g in report["goals"] if g["name"].startswith("turns reusing"))
    assert reuse["met"] is True and reuse["value"] == 1
    assert invoke("history", "--db", str(db))[0]["settings"]["mode"] == "one-shot"


def test_a_bench_engine_keeps_its_restart_profile_in_its_own_scratch_folder(tiny_model):
    """Not beside its cache folder's parent when that is the system's temp folder, where every
    run would share (and sample) one profile."""
    with bench.bench_engine(BenchModel(tiny_model, "tiny", "tiny", True)) as engine:
        scratch = engine.slots.directory.parent
        assert engine.restart.path == scratch / PROFILE_FILENAME
        assert scratch.name.startswith("mlxmem-bench-kv-")


def test_a_one_shot_turn_that_misses_the_previous_reply_is_flagged():
    from mlxmem.bench.turns import _one_shot_record

    def out(prompt, cached, generated, finish="stop", folds=()):
        return {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "prefilled_tokens": prompt - cached,
            "generated_tokens": generated,
            "finish_reason": finish,
            "folds": list(folds),
            "fact_added": None,
            "layers": {"reserve": 64},
            "budget": 1024,
        }

    first = out(100, 0, 11)  # ten tokens and the end of turn
    assert _one_shot_record(0, first, None, 1.0).reused_previous is None
    assert _one_shot_record(1, out(130, 110, 5), first, 1.0).reused_previous is True
    assert _one_shot_record(1, out(130, 109, 5), first, 1.0).reused_previous is False
    assert _one_shot_record(1, out(130, 40, 5, folds=[{}]), first, 1.0).fold_turn
    cut = out(100, 0, 10, finish="length")  # no end of turn: all ten tokens are the reply's
    assert _one_shot_record(1, out(130, 109, 5), cut, 1.0).reused_previous is False
    assert _one_shot_record(1, out(130, 110, 5), cut, 1.0).reused_previous is True


@pytest.mark.e2e
def test_bench_speed_end_to_end(tiny_model):
    report = invoke(
        "speed",
        "--model",
        str(tiny_model),
        "--lengths",
        "64,160",
        "--trials",
        "2",
        "--gen-tokens",
        "8",
    )
    assert [row["prompt_tokens"] for row in report["lengths"]] == [64, 160]
    for row in report["lengths"]:
        assert row["decode_tps_ratio"] > 0 and row["ttft_s"] > 0 and row["cached_ttft_s"] > 0
        # per decoded token, both sides, and mlxmem's over mlx-lm's in each trial's pair
        assert row["decode_ms_per_token"] > 0 and row["bare_decode_ms_per_token"] > 0
        low, high = row["spread"]["decode_overhead_ratio"]
        assert 0 < low <= row["decode_overhead_ratio"] <= high
        assert row["generated_tokens"] == 8 and row["trials"] == 2
        assert row["cached_prefill_tokens"] < row["prompt_tokens"]
        assert row["limit_ttft_s"] > 0 and row["cached_vs_limit_ratio"] > 0
        for held in ("", "_unheld"):  # the store held between turns, or opened per operation
            phases = row[f"overhead{held}_phases_ms"]
            assert set(phases) == {"store", "assembly", "engine_entry", "other"}
            assert row[f"overhead{held}_ms"] == pytest.approx(sum(phases.values()), rel=0.5)
            assert phases["store"] > 0
        assert row["overhead_window_tokens"] >= row["prompt_tokens"] // 2
        # Held, as the interactive chat runs a turn: the store stays open, nothing is opened.
        assert row["store_opens_before_first_token"] == 0
        assert row["store_opens_per_turn"] == 0
        # Opened per operation: log the message and read the window; log the reply and save
        # the cache (no fold, no fact: one operation).
        assert row["store_opens_before_first_token_unheld"] == 1
        assert row["store_opens_per_turn_unheld"] == 2
        assert row["bare_open_ms"] > 0 and row["store_operation_unheld_ms"] > 0
        low, high = row["spread"]["ttft_s"]
        assert low <= row["ttft_s"] <= high
    # Stored in the benchmark database of this test's data directory by default.
    assert [r["kind"] for r in invoke("history")] == ["speed"]


@pytest.mark.e2e
def test_bench_speed_turns_end_of_text_off_on_both_sides_alike(tiny_model):
    from mlxmem.bench import speed

    engine = MLXEngine(tiny_model)
    prompt = engine.encode_chat([Message("user", "Tell me about rivers.")])
    first = engine.generate(prompt, Sampling(max_tokens=1), slot="probe").tokens[0]
    # Make the token the model greedily writes first its end of text: a run that honours EOS
    # stops after one token.
    engine.eos_token_ids = frozenset({first})
    engine.tokenizer.eos_token_ids = {first}
    assert (
        engine.generate(prompt, Sampling(max_tokens=8), slot="probe2").stats.generated_tokens == 1
    )
    mine, _, _ = speed._mlxmem(engine, prompt, 8, seed=0)
    bare = speed._bare_mlx(engine, prompt, 8, seed=0)
    assert mine.generated_tokens == bare.generated_tokens == 8
    assert engine.tokenizer.eos_token_ids == {first}  # the engine's tokenizer is left alone


@pytest.mark.e2e
def test_bench_restart_end_to_end(tiny_model):
    report = invoke(
        "restart", "--model", str(tiny_model), "--context-tokens", "768", "--trials", "1"
    )
    assert report["ttft_ratio"] > 0
    assert report["rebuilt_prefilled_tokens"] == report["prompt_tokens"]
    assert (
        report["restored_cached_tokens"] + report["restored_prefilled_tokens"]
        == (report["prompt_tokens"])
    )
    assert report["restored_cached_tokens"] > report["prompt_tokens"] // 2
    assert report["cache_file_bytes"] > 0
    auto = report["auto_policy"]  # the engine's rule, from speeds the trials measured
    assert auto["decision"] in ("load", "recompute") and auto["prefill_tokens_per_s"] > 0
    assert auto["decision"] == ("load" if auto["load_over_recompute"] >= 1 else "recompute")


@pytest.mark.e2e
def test_random_model_of_a_given_shape(tmp_path):
    config = tmp_path / "shape.json"
    config.write_text(json.dumps(SMALL))
    report = invoke(
        "speed", "--arch", str(config), "--lengths", "32", "--trials", "1", "--gen-tokens", "4"
    )
    assert report["model"]["random_weights"] is True
    assert "hidden 64 x 1 layers" in report["model"]["description"]


def test_errors_are_reported_without_a_traceback(tmp_path):
    result = runner.invoke(app, ["bench", "speed", "--arch", "no-such-shape"])
    assert result.exit_code == 1 and "Error: unknown arch" in result.output
    result = runner.invoke(app, ["bench", "history", "--id", "7"])
    assert result.exit_code == 1 and "no benchmark run with id 7" in result.output


def test_bench_scale_builds_logs_and_times_the_store(tmp_path):
    png = tmp_path / "scale.png"
    report = invoke("scale", "--sizes", "1000,2000", "--trials", "2", "--plot", str(png))
    assert [row["turns"] for row in report["sizes"]] == [1000, 2000]
    assert [row["messages"] for row in report["sizes"]] == [1000, 2000]  # the old name too
    for row in report["sizes"]:
        for key in ("turn_overhead_ms", "search_s", "memory_list_s", "memory_rm_s"):
            assert row[key] > 0
        assert row["history_rm_s"] > 0 and row["db_bytes"] > 0
    assert report["turn_overhead_ms_growth"] > 0
    assert {g["name"] for g in report["goals"]} >= {"memory rm growth, largest vs smallest log"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert [r["kind"] for r in invoke("history")] == ["scale"]


def test_scale_log_has_the_asked_size_and_one_needle(tmp_path):
    from mlxmem.bench.scale import NEEDLE, SCALE_FACTS, build_log

    store = build_log(tmp_path / "log.duckdb", 1000, conversations=1)
    assert store.conversation("default").turn_count == 1000
    assert len(store.facts()) == SCALE_FACTS
    assert [t.seq for t in store.search(NEEDLE)] == [3]
    # The window is the newest turns only: a turn reads what follows the summary.
    assert len(store.snapshot("default").turns) == 20
    # Spread over conversations, the newest being the one chatted in.
    spread = build_log(tmp_path / "spread.duckdb", 1000, conversations=10)
    conversations = spread.conversations()
    assert len(conversations) == 10 and conversations[-1].name == "default"
    assert sum(c.turn_count for c in conversations) == 1000
    assert len(spread.search(NEEDLE)) == 1
    assert len(spread.snapshot("default").turns) == 20


def test_a_run_records_the_commit_it_ran_from(tmp_path):
    # From a checkout, the commit (and "+dirty" if tracked files changed); from a copy of the
    # package outside any checkout (an installed wheel), nothing.
    root = Path(mlxmem.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        pytest.skip("mlxmem is not imported from a git checkout")
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"]).returncode == 1
    assert source_commit() == head.strip() + ("+dirty" if dirty else "")
    assert versions()["commit"] == source_commit()
    shutil.copytree(root / "mlxmem", tmp_path / "site" / "mlxmem")
    code = "from mlxmem.bench.common import versions; print('commit' in versions())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"
