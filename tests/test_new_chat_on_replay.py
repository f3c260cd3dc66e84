"""benchmarks/new_chat_on_replay.py: a one-conversation replay's questions asked in a new chat,
read on a copy of the run's store. The fake engine, on the LoCoMo-shaped conversation the
tests write."""

import hashlib
import importlib
import json
from pathlib import Path

import pytest
from test_eval_locomo import extracting_reader, write_dataset

from mlxmem.eval import locomo as ev
from mlxmem.eval.runlog import read_lines
from mlxmem.memory.store import Store
from mlxmem.testing import FakeEngine

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.fixture
def script(monkeypatch):
    """benchmarks/new_chat_on_replay.py (a script, not a package: its folder on the path for
    this test only), with the paths of the stores it opens recorded."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module("new_chat_on_replay")
    helpers = importlib.import_module("recall_dates_ab")
    opened: list[Path] = []

    def recording(path, *args, **kwargs):
        opened.append(Path(path))
        return Store(path, *args, **kwargs)

    monkeypatch.setattr(helpers, "Store", recording)
    return module, opened


def digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file() and ".lock" not in p.name
    }


def test_the_replays_questions_in_a_new_chat_resume_and_leave_its_store_as_it_was(
    tmp_path, monkeypatch, script
):
    new_chat_on_replay, opened = script
    data = write_dataset(tmp_path, sessions=4, chatter=3, coda=" It was the best trip all year.")
    monkeypatch.setenv(ev.DATA_ENV, str(data))
    run_dir = tmp_path / "run"
    ev.run_locomo(
        FakeEngine(extracting_reader), data, ["conv-1"], 2200, 120, facts=True, run_dir=run_dir
    )
    settings = json.loads((run_dir / "settings.json").read_text())
    store_before = digest(run_dir / "conv-1")
    engine = FakeEngine(extracting_reader)
    answers = ("no_memory", "facts")
    items = new_chat_on_replay.ask_conversation(engine, run_dir, "conv-1", None, answers, settings)

    scored = [q for q in ev.load_conversation(data, "conv-1").questions if q.category in ev.SCORED]
    assert [i["index"] for i in items] == [q.index for q in scored] and len(items) == 4
    # Only the configurations asked for answered; recall's prompt was still assembled.
    asked = [c.slot for c in engine.calls if c.slot.startswith("probe/")]
    assert sorted(asked) == sorted(ev.NEW_CHAT_SLOTS[c] for c in answers for _ in items)
    for item in items:
        assert item["recall"]["answer"] is None and "evidence_in_prompt" in item["recall"]
    # The replay's facts told every trip; with no memory the new chat knows none of them.
    assert [i["facts"]["f1"] for i in items] == [1.0] * 4
    assert [i["no_memory"]["f1"] for i in items] == [0.0] * 4
    # Each question's evidence turn is found in the replay's log, and recall brings it back.
    assert all(i["evidence_seqs"] and i["recall"]["evidence_recalled"] == 1 for i in items)
    assert {i["place"] for i in items} == {"recalled"}
    # Each item was kept as it came; a rerun asks nothing and returns the same items.
    assert read_lines(run_dir / "conv-1.new-chat.jsonl") == items
    again = FakeEngine(extracting_reader)
    rerun = new_chat_on_replay.ask_conversation(again, run_dir, "conv-1", None, answers, settings)
    assert rerun == items
    assert not [c for c in again.calls if c.slot.startswith("probe/")]
    # The questions were asked on a copy: the run's own store is as the replay left it, and
    # was never opened.
    assert opened and not any(run_dir in p.parents for p in opened)
    assert digest(run_dir / "conv-1") == store_before
