"""A damaged file in an `eval locomo` run folder gives one clear line and the run goes on from
what can be read, the rest done again; a run folder that is another user's, or open to others,
is refused with the reason. The fake engine, on the LoCoMo-shaped conversation the tests
write."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_eval_locomo import extracting_reader, write_dataset
from test_eval_runs import Stop, comparable

from mlxmem.errors import InputError
from mlxmem.eval import locomo as ev
from mlxmem.eval.locomo import runner
from mlxmem.eval.runlog import RunDir, RunFileWarning, read_lines
from mlxmem.testing import FakeEngine


@pytest.fixture
def data(tmp_path):
    return write_dataset(tmp_path / "data", sessions=3, chatter=2)


def run(data: Path, run_dir: Path | None, engine: FakeEngine | None = None) -> dict:
    engine = engine or FakeEngine(extracting_reader)
    return ev.run_locomo(engine, data, ["conv-1"], 1000, 120, run_dir=run_dir).to_dict()


def warned(caught, text: str) -> None:
    """Each warning is one line, and one of them says `text`."""
    lines = [str(w.message) for w in caught if w.category is RunFileWarning]
    assert all("\n" not in line for line in lines), lines
    assert any(text in line for line in lines), lines


def garble(path: Path, line: int, how: str) -> None:
    """Damage line `line` of a JSON-lines file: cut it in the middle, or put a stray byte in."""
    lines = path.read_bytes().split(b"\n")
    if how == "cut":
        lines[line] = lines[line][: len(lines[line]) // 2]
    else:
        lines[line] = lines[line][:5] + b"\xff" + lines[line][5:]
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("how", ["cut", "stray byte"])
def test_a_damaged_answer_line_is_said_in_one_line_and_that_question_asked_again(
    tmp_path, data, how
):
    run_dir = tmp_path / "run"
    whole = run(data, run_dir)
    items = run_dir / "conv-1.items.jsonl"
    asked = len(read_lines(items))
    assert asked >= 2
    garble(items, 0, how)
    engine = FakeEngine(extracting_reader)
    with pytest.warns(RunFileWarning) as caught:
        again = run(data, run_dir, engine)
    warned(caught, "conv-1.items.jsonl is damaged (1 of its")
    # The damaged question was asked again (its answer depends on the engine's state), the
    # others read from the folder.
    assert [i["index"] for i in again["conversations"][0]["items"]] == list(range(asked))
    assert comparable(again)[1:] == comparable(whole)[1:]
    assert engine.calls
    assert len(read_lines(items)) == asked
    assert (run_dir / "conv-1.items.jsonl.damaged").exists()


@pytest.mark.parametrize("how", ["cut", "stray byte", "not an object"])
def test_a_damaged_replay_figures_file_is_said_and_the_figures_made_again(tmp_path, data, how):
    run_dir = tmp_path / "run"
    whole = run(data, run_dir)
    figures = run_dir / "conv-1.replay.json"
    text = figures.read_bytes()
    damaged = {"cut": text[: len(text) // 2], "stray byte": b"\xff" + text, "not an object": b"3"}
    figures.write_bytes(damaged[how])
    with pytest.warns(RunFileWarning) as caught:
        again = run(data, run_dir)
    warned(caught, "conv-1.replay.json is damaged")
    assert comparable(again) == comparable(whole)
    assert again["layers"]["conv-1"]["turns"] == whole["layers"]["conv-1"]["turns"]
    assert json.loads(figures.read_text())["turns"] == whole["layers"]["conv-1"]["turns"]


def stopped_inside_the_replay(data: Path, run_dir: Path, monkeypatch) -> None:
    """A run stopped while the model reads a prompt late in the replay, copies of its store
    kept every 2 exchanges."""
    monkeypatch.setattr(runner, "KEEP_EVERY", 2)
    engine = FakeEngine(extracting_reader)
    real_generate, seen = engine.generate, [0]

    def generate(tokens, sampling, **kw):
        if sampling.max_tokens == 1:
            seen[0] += 1
            if seen[0] == 5:
                raise Stop
        return real_generate(tokens, sampling, **kw)

    engine.generate = generate  # type: ignore[method-assign]
    with pytest.raises(Stop):
        run(data, run_dir, engine)
    assert (run_dir / "conv-1.kept" / "replay-lines").exists()


@pytest.mark.parametrize("count", [b"abc", b"-3", b"\xff", b"999"])
def test_a_bad_count_in_the_stores_copy_starts_the_replay_over(tmp_path, data, monkeypatch, count):
    whole = run(data, None)
    run_dir = tmp_path / "run"
    stopped_inside_the_replay(data, run_dir, monkeypatch)
    (run_dir / "conv-1.kept" / "replay-lines").write_bytes(count)
    with pytest.warns(RunFileWarning) as caught:
        again = run(data, run_dir)
    warned(caught, "replay-lines is damaged")
    assert comparable(again) == comparable(whole)
    lines = read_lines(run_dir / "conv-1.replay.jsonl")
    assert len(lines) == whole["layers"]["conv-1"]["turns"] // 2  # a line each, once


def test_a_replay_line_cut_in_the_middle_goes_on_from_a_copy_before_it(tmp_path, data, monkeypatch):
    whole = run(data, None)
    run_dir = tmp_path / "run"
    stopped_inside_the_replay(data, run_dir, monkeypatch)
    garble(run_dir / "conv-1.replay.jsonl", 1, "cut")
    with pytest.warns(RunFileWarning) as caught:
        again = run(data, run_dir)
    warned(caught, "conv-1.replay.jsonl is damaged")
    assert comparable(again) == comparable(whole)
    lines = read_lines(run_dir / "conv-1.replay.jsonl")
    assert [line["exchange"] for line in lines] == list(range(len(lines)))  # in step, once
    assert len(lines) == whole["layers"]["conv-1"]["turns"] // 2


def test_a_damaged_settings_file_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    RunDir(run_dir, {"mode": "window"})
    (run_dir / "settings.json").write_bytes(b'{"mode": "win\xff')
    with pytest.raises(InputError, match="is not a run's settings; give another --run-dir"):
        RunDir(run_dir, {"mode": "window"})


@pytest.mark.parametrize("mode", [0o777, 0o750, 0o704])
def test_a_run_folder_open_to_others_is_refused_not_taken_over(tmp_path, mode):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "conv-1.items.jsonl").write_text("{}\n")
    os.chmod(run_dir, mode)
    with pytest.raises(InputError, match=f"open to other users \\(mode {oct(mode)}\\)"):
        RunDir(run_dir, {"mode": "window"})
    assert run_dir.stat().st_mode & 0o777 == mode  # left as it was
    assert not (run_dir / "settings.json").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_run_folder_of_another_user_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    os.chown(run_dir, 65534, 65534)
    probe = subprocess.run(  # as that user, this process is "another user"
        [sys.executable, "-c", "import os; print(os.stat(os.sys.argv[1]).st_uid)", str(run_dir)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "65534"
    with pytest.raises(InputError, match="belongs to another user \\(uid 65534\\)"):
        RunDir(run_dir, {"mode": "window"})
    assert not (run_dir / "settings.json").exists()


def test_a_new_run_folder_is_private(tmp_path):
    RunDir(tmp_path / "a" / "run", {"mode": "window"})
    assert (tmp_path / "a" / "run").stat().st_mode & 0o777 == 0o700
