"""A retired device's folder can be removed (docs/sync.md suggests it) without taking its
deletions with it (issue 23, Medium 5): every device keeps the tombstones it has applied in
its own stream, so a fresh device that imports an old export cannot write the deleted
records back."""

import json
import os
import shutil

from conftest import files_containing, on

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.testing import FakeEngine

MARKER = "MARKER-RETIRED-6021"


def facts(home):
    return [f["text"] for f in json.loads(on(home, "memory", "list", "--json").stdout)]


def turn_texts(home):
    os.environ["MLXMEM_HOME"] = str(home)
    return [t.text for t in Store().search(MARKER, limit=100)]


def test_removing_a_retired_devices_folder_keeps_its_deletions(tmp_path):
    a, b, c = (tmp_path / name for name in "ABC")
    folder = tmp_path / "shared"
    folder.mkdir()
    # B writes a fact and a turn; A gets them; a backup of A is taken then.
    on(b, "memory", "add", f"Secret plan {MARKER}")
    os.environ["MLXMEM_HOME"] = str(b)
    Companion(FakeEngine(), Store(), "default", 600, 120, ChatSettings()).send(f"my {MARKER}")
    on(b, "sync", str(folder))
    on(a, "sync", str(folder))
    assert facts(a) == [f"Secret plan {MARKER}"]
    backup = tmp_path / "old-backup.json"
    on(a, "export", str(backup))
    # B deletes both, A applies the deletions; then B is retired and its folder removed.
    on(b, "memory", "rm", "1")
    on(b, "history", "rm", "-c", "default", "--all", "--yes")
    on(b, "sync")
    on(a, "sync")
    assert facts(a) == [] and turn_texts(a) == []
    shutil.rmtree(folder / "mlxmem" / "devices" / device_id(b))
    # A fresh device restores the old backup and syncs: A's stream still carries B's
    # deletions, so the records are deleted again and never written back.
    on(c, "import", str(backup))
    on(c, "sync", str(folder))
    assert facts(c) == [] and turn_texts(c) == []
    assert files_containing(folder, MARKER) == []
    for home in (a, c, a):
        on(home, "sync")
        assert facts(home) == [] and turn_texts(home) == []
    assert files_containing(folder, MARKER) == []
    assert files_containing(c, MARKER) == []


def device_id(home):
    os.environ["MLXMEM_HOME"] = str(home)
    return SyncLog().device()[0]
