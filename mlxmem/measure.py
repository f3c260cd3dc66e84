"""What the bench (mlxmem.bench: speed, scale, restarts) and the eval (mlxmem.eval: what the
memory remembers) both need, so that neither imports the other: how a long run reports its
progress, the plotting backend, and the eval's headline figures in the run history the bench
keeps for both."""

from __future__ import annotations

from collections.abc import Callable

from mlxmem.errors import MlxmemError

# A long run's progress: (what it does, how many done, of how many).
Progress = Callable[[str, int, int], None]

# The eval's configurations and its three F1 scores of an answer (mlxmem.eval.locomo).
CONFIGS = ("no_memory", "window", "mlxmem", "recall", "oracle")
SCORERS = ("f1", "f1_locomo", "f1_amem")


def no_progress(description: str, done: int, total: int) -> None:
    pass


def pyplot():
    """matplotlib's pyplot on its file backend, or MlxmemError if it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MlxmemError("--plot needs matplotlib: pip install 'mlxmem[plot]'") from None
    return plt


def eval_headline(results: dict) -> dict:
    """Overall F1 per configuration (categories 1-4), each of SCORERS (None for a run stored
    before it), and what reached recall's prompt, for the bench history table."""

    def overall(config: str, metric: str):
        return results.get(config, {}).get(metric, {}).get("overall", {}).get("mean")

    f1s = {f"{metric}_{c}": overall(c, metric) for metric in SCORERS for c in CONFIGS}
    reached = {
        f"{metric}_recall": overall("recall", metric)
        for metric in ("evidence_in_prompt", "answer_in_prompt")
    }
    return f1s | reached
