"""Small refusals and messages an adversary found: an empty --engine, a directory named like a
GGUF file, and a warning printed with Python's source line."""

import os
import subprocess
import sys

from conftest import cli


def test_an_empty_engine_name_is_refused_not_taken_as_the_default():
    result = cli("chat", "--model", "tiny", "--engine", "", "-m", "hi", code=1)
    assert "--engine: unknown engine ''; choose one of mlx, llamacpp" in result.output


def test_a_directory_named_like_a_gguf_file_is_said_to_be_a_directory(tmp_path):
    folder = tmp_path / "model.gguf"
    folder.mkdir()
    result = cli("chat", "--model", str(folder), "--engine", "llamacpp", "-m", "hi", code=1)
    assert f"{folder} is a directory, not a GGUF file" in result.output
    assert "does not exist" not in result.output


def test_a_warning_from_any_command_or_a_servers_thread_is_one_clean_line(tmp_path):
    """The root command prints warnings as `Warning: ...` (serve's StaleWarning comes from a
    worker thread after a deletion): no file name, line number or source line."""
    script = (
        "import threading, warnings; from mlxmem.cli.main import app;"
        " from mlxmem.memory.companion import StaleWarning;"
        " app(['memory', 'list'], standalone_mode=False);"
        " t = threading.Thread(target=lambda: warnings.warn('the reply was not kept',"
        " StaleWarning, stacklevel=2)); t.start(); t.join()"
    )
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True,
        env={**os.environ, "MLXMEM_HOME": str(home)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines() == ["Warning: the reply was not kept"]
