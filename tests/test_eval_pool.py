"""benchmarks/eval_pool.py: runs of one conversation each, pooled; figures only in --out."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from mlxmem.eval.locomo import CONFIGS, PER_SESSION_CONFIGS, paired_difference

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "eval_pool.py"


def run_file(path: Path, conv: str, scores: list[tuple[float, float]]) -> Path:
    """A run as `eval locomo --json` writes it, with (recall, window) F1 per question."""
    items = []
    for i, (recall, window) in enumerate(scores):
        item = {"question": f"SECRET question {i}?", "answer": "SECRET", "category": 4}
        for config in CONFIGS:
            f1 = {"recall": recall, "window": window}.get(config, 0.0)
            item[config] = {"answer": "SECRET", "f1": f1, "evidence_in_prompt": 1.0,
                            "answer_in_prompt": 0.0}  # fmt: skip
        # The evidence (seq 3) left the window of every other question; recall found it when
        # it scored.
        item |= {"evidence_seqs": [3], "evicted_upto": 5 if i % 2 == 0 else 1}
        item["recall"]["evidence_recalled"] = int(recall > 0.3)
        items.append(item)
    items.append({**items[0], "category": 5})  # adversarial: not in the overall figures
    run = {
        "model": {"label": "fake"},
        "settings": {"conversations": [conv], "sessions": 8, "limit": 20},
        "conversations": [{"id": conv, "items": items}],
    }
    path.write_text(json.dumps(run))
    return path


def test_pooled_figures_are_the_paired_difference_over_every_run(tmp_path):
    a = run_file(tmp_path / "a.json", "conv-1", [(0.5, 0.0), (0.4, 0.1), (0.3, 0.3)])
    b = run_file(tmp_path / "b.json", "conv-2", [(0.2, 0.4), (0.6, 0.0)])
    out = tmp_path / "pooled.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(a), str(b), "--out", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert [r["figures"]["questions"] for r in result["runs"]] == [3, 2]
    pooled = result["pooled"]
    assert pooled["questions"] == 5
    items = [i for p in (a, b) for i in json.loads(p.read_text())["conversations"][0]["items"]]
    expected = paired_difference([i for i in items if i["category"] != 5], "recall", "window")
    assert pooled["recall_vs_window"] == expected
    assert abs(pooled["recall"]["f1"]["mean"] - 2.0 / 5) < 1e-9
    # Evidence out of the window: questions 0 and 2 of the first run, 0 of the second; recall
    # found it for the first only (F1 0.5; 0.3 and 0.2 for the others).
    evicted = pooled["evicted_evidence"]
    assert (evicted["questions"], evicted["evidence_recalled"]) == (3, 1)
    assert "SECRET" not in out.read_text()  # the corpus's text stays out of the results
    assert "recall - window" in done.stdout


def test_runs_of_one_conversation_per_session_pool_their_own_configurations(tmp_path):
    paths = []
    for n, scores in enumerate([[(0.5, 0.1), (0.4, 0.4)], [(0.3, 0.0)]]):
        items = [
            {"question": "SECRET?", "answer": "SECRET", "category": 4}
            | {
                config: {"f1": {"recall": r, "facts": f}.get(config, 0.0)}
                for config in PER_SESSION_CONFIGS
            }
            for r, f in scores
        ]
        run = {
            "model": {"label": "fake"},
            "configs": list(PER_SESSION_CONFIGS),
            "settings": {"conversations": [f"conv-{n}"], "sessions": 8, "limit": 20},
            "conversations": [{"id": f"conv-{n}", "items": items}],
        }
        paths.append(tmp_path / f"{n}.json")
        paths[-1].write_text(json.dumps(run))
    out = tmp_path / "pooled.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, paths), "--out", str(out)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    pooled = json.loads(out.read_text())["pooled"]
    assert pooled["questions"] == 3 and "window" not in pooled
    assert abs(pooled["recall_vs_facts"]["mean"] - (0.4 + 0.0 + 0.3) / 3) < 1e-9
    assert abs(pooled["facts_vs_no_memory"]["mean"] - (0.1 + 0.4 + 0.0) / 3) < 1e-9
    assert "recall - facts" in done.stdout and "SECRET" not in out.read_text()
    one = run_file(tmp_path / "one.json", "conv-9", [(0.5, 0.0)])
    mixed = subprocess.run(
        [sys.executable, str(SCRIPT), str(paths[0]), str(one)], capture_output=True, text=True
    )
    assert mixed.returncode == 2 and "mix" in mixed.stderr


def test_versus_pairs_the_questions_two_sets_of_runs_share(tmp_path):
    """The same conversation in both modes: a config of one minus a config of the other, over
    the questions both asked (matched by text; a question only one run holds is left out)."""
    one = run_file(tmp_path / "one.json", "conv-1", [(0.5, 0.0), (0.4, 0.1), (0.9, 0.9)])
    run = json.loads(one.read_text())  # where each question's evidence was, as the eval says
    places = ["folded", "recalled", "folded", "folded"]  # the last: the adversarial copy
    for item, place in zip(run["conversations"][0]["items"], places, strict=True):
        item["place"] = place
    one.write_text(json.dumps(run))
    items = [
        {"question": f"SECRET question {i}?", "answer": "SECRET", "category": 4}
        | {config: {"f1": {"recall": r}.get(config, 0.0)} for config in PER_SESSION_CONFIGS}
        for i, r in [(0, 0.2), (1, 0.6), (7, 0.0)]
    ]
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"configs": list(PER_SESSION_CONFIGS), "conversations": [
        {"id": "conv-1", "items": items}]}))  # fmt: skip
    out = tmp_path / "versus.json"
    command = [sys.executable, str(SCRIPT), str(one), "--versus", str(new), "--out", str(out)]
    done = subprocess.run(
        [*command, "--pair", "recall:recall", "--pair", "window:facts"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    versus = json.loads(out.read_text())["versus"]
    assert versus["recall_vs_recall"]["n"] == 2  # questions 0 and 1
    assert abs(versus["recall_vs_recall"]["mean"] - ((0.5 - 0.2) + (0.4 - 0.6)) / 2) < 1e-9
    assert abs(versus["window_vs_facts"]["mean"] - (0.0 + 0.1) / 2) < 1e-9
    # Split by where the first runs found the evidence: question 0 folded, 1 recalled.
    by_place = versus["recall_vs_recall"]["by_place"]
    assert {k: v["n"] for k, v in by_place.items()} == {"recalled": 1, "folded": 1}
    assert abs(by_place["folded"]["mean"] - (0.5 - 0.2)) < 1e-9
    assert "recall - recall of --versus, 2 shared questions" in done.stdout
    assert "SECRET" not in out.read_text()
    wrong = subprocess.run([*command, "--pair", "facts:recall"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "no config 'facts'" in wrong.stderr
    empty = tmp_path / "empty.json"  # a run that asked nothing
    empty.write_text(json.dumps({"configs": list(PER_SESSION_CONFIGS), "conversations": []}))
    command = [sys.executable, str(SCRIPT), str(one), "--versus", str(empty)]
    nothing = subprocess.run(command, capture_output=True, text=True)
    assert nothing.returncode == 2 and "no questions to pair" in nothing.stderr, nothing.stderr


def test_per_session_runs_split_what_the_facts_carry_by_whom_a_question_names(tmp_path):
    """The facts are about the person: their gain is read on the questions about them. A run
    made before the eval recorded `about` has it derived from the corpus's speaker names."""

    def run(conv: str, scores: list[tuple[str, float]], recorded: bool) -> Path:
        items = []
        for question, facts in scores:
            item = {"question": question, "answer": "SECRET", "category": 4}
            item |= {c: {"f1": facts if c == "facts" else 0.0} for c in PER_SESSION_CONFIGS}
            if recorded:
                item["about"] = "user" if "Jon" in question else "other"
            items.append(item)
        path = tmp_path / f"{conv}.json"
        path.write_text(json.dumps({
            "model": {"label": "fake"}, "configs": list(PER_SESSION_CONFIGS),
            "settings": {"conversations": [conv]},
            "conversations": [{"id": conv, "items": items}],
        }))  # fmt: skip
        return path

    new = run("conv-1", [("Where did Jon go?", 0.5), ("Where did Gina go?", 0.0)], True)
    old = run("conv-2", [("What did Jon eat?", 0.3), ("Did Jonathan call Gina?", 0.0)], False)
    corpus = tmp_path / "locomo"
    (corpus / "qa").mkdir(parents=True)
    (corpus / "conv-2.jsonl").write_text("")
    (corpus / "qa" / "conv-2.qa.json").write_text(
        json.dumps({"user": "Jon", "assistant": "Gina", "qa": []})
    )
    out = tmp_path / "pooled.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(new), str(old), "--out", str(out)],
        capture_output=True, text=True, check=True, env=os.environ | {"MLXMEM_LOCOMO": str(corpus)},
    )  # fmt: skip
    split = json.loads(out.read_text())["pooled"]["by_subject"]
    assert {name: group["questions"] for name, group in split.items()} == {"user": 2, "other": 2}
    assert abs(split["user"]["facts_vs_no_memory"]["mean"] - (0.5 + 0.3) / 2) < 1e-9
    assert split["other"]["facts_vs_no_memory"]["mean"] == 0.0
    assert "about user (2): facts - no_memory +0.400" in done.stdout


def test_a_file_that_is_not_a_run_is_a_clear_error(tmp_path):
    empty = tmp_path / "running.json"  # a run still being written
    empty.write_text("")
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    for path in (empty, other, tmp_path / "missing.json"):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True
        )
        assert done.returncode == 2 and "eval locomo --json" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


def test_metric_pools_the_f1_named_and_says_when_a_run_lacks_it(tmp_path):
    """--metric pools f1, f1_locomo or f1_amem; a run scored before a metric existed is refused
    by name, and --rescore scores the answers it kept."""
    old = run_file(tmp_path / "old.json", "conv-1", [(0.5, 0.0), (0.4, 0.1)])  # f1 only
    command = [sys.executable, str(SCRIPT), str(old), "--out", str(tmp_path / "out.json")]
    refused = subprocess.run([*command, "--metric", "f1_amem"], capture_output=True, text=True)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"{old} has no f1_amem" in refused.stderr and "--rescore" in refused.stderr
    # Rescored: every answer is "SECRET" as the gold answer is, so every F1 is 1.
    done = subprocess.run(
        [*command, "--metric", "f1_amem", "--rescore"], capture_output=True, text=True, check=True
    )
    pooled = json.loads((tmp_path / "out.json").read_text())
    assert pooled["metric"] == "f1_amem" and pooled["pooled"]["recall"]["f1_amem"]["mean"] == 1.0
    assert pooled["pooled"]["recall_vs_window"]["mean"] == 0.0
    assert "recall f1_amem 1.000" in done.stdout
    # A run with the three F1s pools any of them as stored; the paired differences are of it.
    new = json.loads(old.read_text())
    for item in new["conversations"][0]["items"]:
        for config in CONFIGS:
            item[config] |= {"f1_locomo": 0.8 if config == "recall" else 0.2, "f1_amem": 0.0}
    (tmp_path / "new.json").write_text(json.dumps(new))
    command[2] = str(tmp_path / "new.json")
    subprocess.run([*command, "--metric", "f1_locomo"], capture_output=True, check=True)
    pooled = json.loads((tmp_path / "out.json").read_text())["pooled"]
    assert pooled["recall"]["f1_locomo"]["mean"] == 0.8
    assert abs(pooled["recall_vs_window"]["mean"] - 0.6) < 1e-9
    assert "f1" not in pooled["recall"]  # the figures of the metric pooled only


def test_a_run_folder_pools_and_its_per_question_file_pools_alike_without_text(tmp_path):
    from test_eval_locomo import reader, write_dataset

    from mlxmem.eval import locomo as ev
    from mlxmem.testing import FakeEngine

    data = write_dataset(tmp_path / "data")
    ev.run_locomo(FakeEngine(reader), data, ["conv-1"], 2200, 120, run_dir=tmp_path / "run")
    kept, first, second = (tmp_path / n for n in ("q.json", "first.json", "second.json"))

    def pool(source: Path, out: Path, *more: str) -> str:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), str(source), "--metric", "f1_amem", "--out", str(out),
             *more], capture_output=True, text=True, check=True,
        )  # fmt: skip
        return done.stdout

    printed = pool(tmp_path / "run", first, "--per-question", str(kept))
    # No text of the conversation, its questions, or the answers is kept.
    assert not re.search(r"Jon|Lisbon|noodles|Where did", kept.read_text())
    pool(kept, second)
    a, b = (json.loads(p.read_text())["pooled"] for p in (first, second))
    assert a == b and a["questions"] == 6
    # The category table beside A-Mem's published row, the evidence places, the cost.
    single_hop = a["by_category"]["4"]
    assert single_hop["questions"] == 6 and single_hop["amem_published_f1_amem"] == 23.6
    assert single_hop["oracle_f1_amem"]["mean"] == 100.0
    assert single_hop["no_memory_f1_locomo"]["mean"] == 0.0
    assert sum(g["questions"] for g in a["by_evidence_place"].values()) == 6
    assert a["cost"]["questions"] == 7 and "prefilled" in printed
    assert "A-Mem Qwen2.5-1.5B" in printed and "23.6" in printed
