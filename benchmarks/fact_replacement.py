"""Does a new automatic fact replace the right old one? The replacement check a chat turn runs
(mlxmem.memory.extraction: the lexical gate, then a short fixed-prompt call per candidate) on the 40
made-up cases of scenarios/fact-updates.json: 20 updates ("moved to Porto" over "lives in
Lisbon") and 20 look-alikes that add or refine and replace nothing.

    python benchmarks/fact_replacement.py MODEL [--json]

MODEL is a registry alias (qwen2.5-coder-1.5b) or a model directory. Prints precision (of the
replacements made, the share that are right) and recall (of the 20 updates, the share whose
old fact was replaced), the gate's own recall, and each case's answer.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from mlxmem.engine import load_engine
from mlxmem.memory.extraction import FactExtractor, replacement_candidates

CASES = Path(__file__).parent / "scenarios" / "fact-updates.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    engine, _ = load_engine(args.model, cache_dir=None)
    extractor = FactExtractor(engine, args.budget)
    cases = json.loads(CASES.read_text())["cases"]
    rows = []
    start = time.perf_counter()
    for case in cases:
        existing = [(i, text) for i, text in enumerate(case["facts"], 1)]
        gated = [i for i, _ in replacement_candidates(case["new"], existing)]
        chosen = extractor.replaces(case["new"], existing)
        rows.append({**case, "candidates": gated, "chosen": chosen})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    updates = [r for r in rows if r["replaces"] is not None]
    made = [r for r in rows if r["chosen"] is not None]
    right = [r for r in made if r["chosen"] == r["replaces"]]
    report = {
        "model": args.model,
        "cases": len(rows),
        "updates": len(updates),
        "replacements_made": len(made),
        "precision": len(right) / len(made) if made else None,
        "recall": len(right) / len(updates) if updates else None,
        "gate_recall": sum(r["replaces"] in r["candidates"] for r in updates) / len(updates),
        "cases_asked": sum(bool(r["candidates"]) for r in rows),
        "seconds": round(time.perf_counter() - start, 1),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key in ("precision", "recall", "gate_recall", "replacements_made", "cases_asked"):
        print(f"{key}: {report[key]}")
    for r in rows:
        mark = "ok" if r["chosen"] == r["replaces"] else "WRONG"
        print(f"  {mark:5} gold {r['replaces']} chose {r['chosen']}: {r['new']}")


if __name__ == "__main__":
    main()
