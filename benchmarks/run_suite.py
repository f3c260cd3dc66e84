"""Run the benchmark suite; keep its JSON results and plots in benchmarks/results/.

    python benchmarks/run_suite.py                        # CPU: a random tiny model
    python benchmarks/run_suite.py --model llama-3.2-3b   # on a Mac: the real figures
    python benchmarks/run_suite.py --quick                # a few minutes, fewer turns

Every run is also stored in DuckDB (mlxmem's database, or --db): `mlxmem bench history`.
The LoCoMo steps read ../shared/corpora/locomo/ (or --locomo) and are skipped without it;
the transcripts are never copied here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCOMO = HERE.parent.parent / "shared" / "corpora" / "locomo"
SCENARIOS = HERE / "scenarios"
MAIN_LOCOMO = "conv-26"


def bench(args: list[str], model_args: list[str], out: Path | None = None) -> dict:
    """Run one `mlxmem bench ... --json`; save its JSON to `out`; return it."""
    cmd = [sys.executable, "-m", "mlxmem.cli", "bench", *args, *model_args, "--json"]
    print("$ mlxmem bench " + " ".join([*args, *model_args]), flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    result = json.loads(done.stdout)
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    if out is not None:
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a real model (alias or path), e.g. on a Mac")
    parser.add_argument("--arch", help="random weights of this shape (default: bench's)")
    parser.add_argument("--quantize", type=int)
    parser.add_argument("--db", help="DuckDB file for the runs (default: mlxmem's)")
    parser.add_argument("--locomo", type=Path, default=LOCOMO)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--quick", action="store_true", help="fewer trials and turns")
    parser.add_argument("--skip", nargs="*", default=[], help="steps to skip (speed, turns, ...)")
    args = parser.parse_args()

    model_args = []
    for flag in ("model", "arch", "quantize", "db"):
        if getattr(args, flag) is not None:
            model_args += [f"--{flag}", str(getattr(args, flag))]
    args.out.mkdir(parents=True, exist_ok=True)
    trials = "1" if args.quick else "5"
    limit = ["--max-turns", "60"] if args.quick else []
    summary: dict[str, dict] = {}
    steps = {
        "speed": lambda: summarize_speed(
            bench(
                ["speed", "--lengths", "256,1024,3000", "--trials", trials, "--gen-tokens", "256"],
                model_args,
                args.out / "speed.json",
            )
        ),
        "turns": lambda: turns_steps(args, model_args, limit),
        "budget": lambda: budget_over_locomo(args, model_args, limit),
        "restart": lambda: pick(
            bench(["restart", "--trials", trials], model_args, args.out / "restart.json"),
            "prompt_tokens",
            "restored_ttft_s",
            "rebuilt_ttft_s",
            "ttft_ratio",
        ),
    }
    # Skipped steps keep the figures of their last run.
    summary_file = args.out / "summary.json"
    if summary_file.exists():
        summary = json.loads(summary_file.read_text())
    for name, step in steps.items():
        if name not in args.skip:
            summary[name] = step()
            summary_file.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def turns_steps(args, model_args: list[str], limit: list[str]) -> dict:
    found = {}
    transcripts = [SCENARIOS / "journal.jsonl", SCENARIOS / "long-messages.jsonl"]
    if (args.locomo / f"{MAIN_LOCOMO}.jsonl").exists():
        transcripts.insert(0, args.locomo / f"{MAIN_LOCOMO}.jsonl")
    for path in transcripts:
        name = f"turns-{path.stem}"
        result = bench(
            ["turns", "--transcript", str(path), "--plot", str(args.out / f"{name}.png"), *limit],
            model_args,
            args.out / f"{name}.json",
        )
        found[path.stem] = pick(
            result,
            "turns",
            "cache_share",
            "cache_share_non_fold",
            "cache_share_replies",
            "folds",
            "budget_violations",
            "ttft_ratio_vs_rebuild",
            "ttft_ratio_vs_rebuild_non_fold",
            "fold_prefill_ratio",
            "verbatim_turns_mean",
            "summary_tokens_mean",
        )
        found[path.stem]["tokens_per_word"] = result["settings"]["tokens_per_word"]
    return found


def budget_over_locomo(args, model_args: list[str], limit: list[str]) -> dict:
    """Every LoCoMo transcript through the memory system, no baselines: budget violations."""
    found = {}
    for path in sorted(args.locomo.glob("conv-*.jsonl")):
        result = bench(
            [
                "turns",
                "--transcript",
                str(path),
                "--rebuild-every",
                "0",
                "--no-fresh-summaries",
                *limit,
            ],
            model_args,
        )
        found[path.stem] = pick(
            result,
            "turns",
            "budget_violations",
            "accounting_errors",
            "folds",
            "cache_share",
            "cache_share_non_fold",
        )
    if found:
        found["total_budget_violations"] = sum(r["budget_violations"] for r in found.values())
    return found


def summarize_speed(result: dict) -> dict:
    return {
        str(row["prompt_tokens"]): pick(
            row,
            "ttft_s",
            "bare_ttft_s",
            "cached_ttft_s",
            "cached_ttft_ratio",
            "decode_tps",
            "bare_decode_tps",
            "decode_tps_ratio",
        )
        for row in result["lengths"]
    }


def pick(data: dict, *keys: str) -> dict:
    return {key: data.get(key) for key in keys}


if __name__ == "__main__":
    main()
