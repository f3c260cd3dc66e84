"""The picture of a `bench turns` run: how each turn's context budget is spent (stacked layers)
with the time to first token on top, against rebuilding the prompt from scratch."""

from __future__ import annotations

from pathlib import Path

from mlxmem.bench.scale import ScaleResult
from mlxmem.bench.turns import TurnsResult
from mlxmem.measure import pyplot

# Bottom to top: the prompt's layers, the room left, and the reserve for the reply on top.
LAYERS = ("instructions", "facts", "summary", "turns", "recall", "free", "reserve")
COLORS = ("#4c72b0", "#dd8452", "#55a868", "#8172b3", "#937860", "#eeeeee", "#f2c1c1")


def plot_turns(result: TurnsResult, path: str | Path, title: str = "") -> Path:
    """Write a PNG of context fill per turn and time to first token; return its path."""
    plt = pyplot()
    records = result.records
    x = [r.turn for r in records]
    fig, ax = plt.subplots(figsize=(12, 5), dpi=110)
    bottom = [0] * len(records)
    for layer, color in zip(LAYERS, COLORS, strict=True):
        values = [r.layers[layer] for r in records]
        ax.bar(x, values, bottom=bottom, width=1.0, color=color, label=layer, linewidth=0)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for r in records:
        for c in r.folds:
            style = ":" if c.before_reply else "-"
            ax.axvline(r.turn, color="black", linewidth=0.6, linestyle=style)
    ax.set_xlabel("turn (vertical lines: folds; dotted: before the reply)")
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


def plot_scale(result: ScaleResult, path: str | Path, title: str = "") -> Path:
    """Write a PNG of each operation's latency against the log's size (log-log)."""
    plt = pyplot()
    rows = result.to_dict()["sizes"]
    x = [r["turns"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for key, label in SCALE_SERIES:
        factor = 1e-3 if key.endswith("_ms") else 1.0
        ax.plot(x, [r[key] * factor for r in rows], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("turns in the log")
    ax.set_ylabel("seconds (median)")
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title(title or "bench scale: latency against the log's size")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


SCALE_SERIES = (
    ("turn_overhead_ms", "a turn without the model"),
    ("recall_ms", "a turn's recall (store read, open included)"),
    ("search_s", "history search"),
    ("memory_list_s", "memory list"),
    ("memory_rm_s", "memory rm (one fact)"),
    ("history_rm_s", "history rm (one turn)"),
)
