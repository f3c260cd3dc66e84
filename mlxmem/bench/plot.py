"""The picture of a `bench turns` run: how each turn's context budget is spent (stacked layers)
with the time to first token on top, against rebuilding the prompt from scratch."""

from __future__ import annotations

from pathlib import Path

from mlxmem.bench.turns import TurnsResult
from mlxmem.errors import MlxmemError

# Bottom to top: the prompt's layers, the room left, and the reserve for the reply on top.
LAYERS = ("instructions", "facts", "summary", "turns", "free", "reserve")
COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#eeeeee", "#f2c1c1")


def plot_turns(result: TurnsResult, path: str | Path, title: str = "") -> Path:
    """Write a PNG of context fill per turn and time to first token; return its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MlxmemError("--plot needs matplotlib: pip install 'mlxmem[plot]'") from None
    records = result.records
    x = [r.turn for r in records]
    fig, ax = plt.subplots(figsize=(12, 5), dpi=110)
    bottom = [0] * len(records)
    for layer, color in zip(LAYERS, COLORS, strict=True):
        values = [r.layers[layer] for r in records]
        ax.bar(x, values, bottom=bottom, width=1.0, color=color, label=layer, linewidth=0)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for r in records:
        for c in r.collapses:
            style = ":" if c.before_reply else "-"
            ax.axvline(r.turn, color="black", linewidth=0.6, linestyle=style)
    ax.set_xlabel("turn (vertical lines: collapses; dotted: before the reply)")
    ax.set_ylabel("tokens of the context budget")
    ax.set_xlim(0.5, len(records) + 0.5)
    ax.legend(loc="upper left", ncol=6, fontsize="small")

    ttft = ax.twinx()
    ttft.plot(x, [r.wait_s for r in records], color="black", linewidth=1.2, label="mlxmem TTFT")
    rebuilt = [(r.turn, r.rebuild_ttft_s) for r in records if r.rebuild_ttft_s is not None]
    if rebuilt:
        ttft.plot(
            *zip(*rebuilt, strict=True),
            color="#d62728",
            linewidth=1.2,
            linestyle="--",
            label="rebuild from scratch TTFT",
        )
    if all(r.wait_s > 0 for r in records):
        ttft.set_yscale("log")
    ttft.set_ylabel("time to first token (s)")
    ttft.legend(loc="upper right", fontsize="small")
    ax.set_title(title or "context fill per turn and time to first token")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
