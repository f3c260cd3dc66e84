import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def mlxmem_home(tmp_path, monkeypatch):
    """Every test gets its own data directory."""
    home = tmp_path / "mlxmem-home"
    monkeypatch.setenv("MLXMEM_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home
