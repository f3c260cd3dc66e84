import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mlxmem.cli.main import app

os.environ.setdefault("HF_HUB_OFFLINE", "1")

runner = CliRunner()


@pytest.fixture(autouse=True)
def mlxmem_home(tmp_path, monkeypatch):
    """Every test gets its own data directory."""
    home = tmp_path / "mlxmem-home"
    monkeypatch.setenv("MLXMEM_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def cli(*args: str, code: int = 0):
    """Run `mlxmem ARGS...` in this process and check its exit code."""
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def on(home: Path, *args: str, code: int = 0):
    """Run `mlxmem ARGS...` with `home` as the data directory (one device of a sync test)."""
    os.environ["MLXMEM_HOME"] = str(home)
    return cli(*args, code=code)


@pytest.fixture
def devices(tmp_path):
    """Two data directories and the folder they share."""
    folder = tmp_path / "shared"
    folder.mkdir()
    return tmp_path / "A", tmp_path / "B", folder


def files_containing(root: Path, marker: str) -> list[Path]:
    """Every file under `root` whose bytes contain `marker`."""
    needle = marker.encode()
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]
