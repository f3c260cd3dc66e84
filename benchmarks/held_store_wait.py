"""How long another process waits for the store while an interactive chat holds it
(`Store.holding`): the time a new process spends taking the lock file, when nobody holds the
store and when this process holds it (between operations, as a chat waiting for the person).

    python benchmarks/held_store_wait.py [--turns 240] [--trials 7] [--json]

Each trial starts a Python process that opens the store (`Store(path)`, which takes the lock,
opens, checks for a pending erase and closes) and lists the facts, as `mlxmem memory list`
does; it reports the first lock wait (asking the holder, which closes its connection and
releases the lock) and its whole time. Before each held trial the holder runs one operation, so
that it holds the file open again. Medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mlxmem.memory.store import Store
from mlxmem.memory.tables.turns import insert_turn

CHILD = """
import json, sys, time
from mlxmem.memory.tables import db
from mlxmem.memory.store import Store
waits = []
take = db.Database._take_lock
def timed(self):
    start = time.perf_counter()
    fd = take(self)
    waits.append(time.perf_counter() - start)
    return fd
db.Database._take_lock = timed
start = time.perf_counter()
Store(sys.argv[1]).facts()
print(json.dumps({"lock_wait_ms": 1e3 * waits[0], "total_ms": 1e3 * (time.perf_counter() - start)}))
"""


def trial(path: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in rows), 1) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=240, help="turns in the log")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlxmem-held-wait-") as tmp:
        store = Store(Path(tmp) / "mlxmem.duckdb")
        with store.connect() as con:
            for i in range(args.turns):
                role = "user" if i % 2 == 0 else "assistant"
                insert_turn(con, "default", role, f"turn {i}: " + "a message about things " * 6)
        free = medians([trial(store.path) for _ in range(args.trials)])
        held_rows = []
        with store.holding():
            for _ in range(args.trials):
                store.facts()  # the holder has the file open again
                held_rows.append(trial(store.path))
        held = medians(held_rows)
    result = {"turns": args.turns, "trials": args.trials, "nobody_holds": free, "chat_holds": held}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.turns} turns, {args.trials} trials, medians (ms)")
    print(f"{'':14} {'lock wait':>10} {'whole':>8}")
    for name, row in (("nobody holds", free), ("chat holds", held)):
        print(f"{name:14} {row['lock_wait_ms']:>10} {row['total_ms']:>8}")


if __name__ == "__main__":
    main()
