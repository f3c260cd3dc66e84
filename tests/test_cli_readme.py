"""README's "Use" commands, run as written: every one that needs no network, no terminal and
no long benchmark, in README's order, on a tiny random-weight model."""

import re
import shlex
from pathlib import Path

import pytest
from conftest import runner

from mlxmem.cli.main import app
from mlxmem.memory.store import Store
from mlxmem.models.tiny import make_tiny

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
pytestmark = pytest.mark.e2e

# Placeholders, as a person fills them in after the commands before.
FILL = {"ID": "1", "ID...": "1", "QUERY": "Porto", "PATH": "tiny-model"}
# What these tests cannot run: a network, a shared folder, an interactive terminal, minutes.
SKIP = re.compile(
    r"^mlxmem (serve|sync|bench|eval|models (pull|rm)\b)|^mlxmem chat( --[a-z-]+( \d+)?)?$"
)


def use_commands() -> list[str]:
    block = README.split("\n## Use", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith(("mlxmem ", "cat ", "echo "))]


def as_typed(command: str) -> tuple[list[str], str | None]:
    """The arguments after `mlxmem` (optional [parts] left out, placeholders filled) and what
    is piped in."""
    piped = None
    if " | " in command:
        source, command = command.split(" | ", 1)
        words = shlex.split(source)
        piped = Path(words[1]).read_text() if words[0] == "cat" else " ".join(words[1:]) + "\n"
    command = re.sub(r" \[[^\]]*\]", "", command)
    return [FILL.get(word, word) for word in shlex.split(command)[1:]], piped


def test_readme_use_commands_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLXMEM_MODEL", str(make_tiny(tmp_path / "model", seed=3)))
    Path("notes.txt").write_text("Bought bread. Called Rita about Sunday.\n")
    ran = []
    for command in use_commands():
        if SKIP.search(command):
            continue
        args, piped = as_typed(command)
        result = runner.invoke(app, args, input=piped)
        if args[:2] == ["memory", "clear"]:  # a bulk deletion, and no terminal to ask on
            assert result.exit_code == 1 and "--yes" in result.output, command
        else:
            assert result.exit_code == 0, f"{command}\n{result.output}"
        ran.append(command)
    assert len(ran) >= 15, ran
    assert 'mlxmem chat "I moved to Porto"' in ran and "mlxmem export backup.json" in ran
    texts = [t.text for t in Store().turns("default")]  # turn 1 went with `history rm 1`
    assert "summarize\n\nBought bread. Called Rita about Sunday." in texts
    assert Path("backup.json").is_file() and Path("tiny-model", "config.json").is_file()
