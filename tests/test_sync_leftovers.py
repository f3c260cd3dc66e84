"""Sync leftovers an adversary found: a 0-byte change file, and with a passphrase a damaged
device.json that held back that device's deletions."""

import json
import os
from pathlib import Path

import duckdb
import pytest
from conftest import on
from test_sync import MARKER, change_files, device, facts, stream_files, sync_json

from mlxmem.memory.store import Store


def test_a_zero_byte_change_file_is_skipped_not_read_as_empty_and_its_device_rewrites_it(devices):
    a, b, folder = devices
    on(b, "memory", "add", "first fact")
    on(b, "sync", str(folder))
    (change,) = change_files(folder)
    change.write_bytes(b"")
    report = sync_json(a, str(folder))
    assert report["skipped"] == [str(change)] and facts(a) == []
    on(b, "sync")  # its device finds its own file unreadable and writes it again
    assert change.stat().st_size > 0
    assert sync_json(a)["skipped"] == []
    assert facts(a) == [("first fact", "manual")]


@pytest.mark.parametrize("passphrase", ["a passphrase", "another one"])
def test_a_remembered_key_with_another_passphrase_reads_nothing(devices, monkeypatch, passphrase):
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "a passphrase")
    a, b, folder = devices
    on(b, "memory", "add", "Likes tea")
    on(b, "sync", str(folder))
    on(a, "sync", str(folder))
    on(b, "memory", "rm", "1")
    on(b, "sync")
    (folder / "mlxmem" / "devices" / device(b) / "device.json").write_text("[]")
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", passphrase)
    result = on(a, "sync")
    gone = ("Likes tea", "manual") not in facts(a)
    assert gone == (passphrase == "a passphrase"), result.output  # the key opens nothing else


def written_by_an_older_version(home, folder) -> Path:
    """`home`'s change file rewritten as an mlxmem from before turns carried their flag wrote
    it (no `sharing`), and the sync cursor left agreeing with it, as that version left it."""
    from mlxmem.memory.sync.synclog import SyncLog
    from mlxmem.sync.cursor import CURSOR_KEY, Cursor, own_state
    from mlxmem.sync.folder import DeviceFolder
    from mlxmem.sync.run import _identities

    (change,) = stream_files(folder, home)
    lines = [json.loads(line) for line in change.read_text().splitlines()]
    assert any("sharing" in r for r in lines[1:])
    old = [lines[0], *({k: v for k, v in r.items() if k != "sharing"} for r in lines[1:])]
    change.write_text("".join(json.dumps(r) + "\n" for r in old))
    os.environ["MLXMEM_HOME"] = str(home)
    log = SyncLog(Store().path)
    state, digest = log.sync_state(set())
    cursor = Cursor.load(state[CURSOR_KEY], str(folder))
    mine = DeviceFolder(folder, device(home))
    cursor.own = own_state(digest, False, _identities(mine))
    log.set_sync_state(str(folder), {CURSOR_KEY: cursor.dumps()})
    return change


def test_turns_written_by_an_older_version_get_their_flag_once_migrated(devices):
    a, b, folder = devices
    os.environ["MLXMEM_HOME"] = str(b)
    Store().append_turn("default", "user", f"My PIN is {MARKER}")
    on(b, "history", "private", "default")
    on(b, "sync", str(folder))
    change = written_by_an_older_version(b, folder)
    on(b, "sync")  # what the version before the migration did: nothing to write
    assert "sharing" not in change.read_text()
    with duckdb.connect(str(Store().path)) as con:  # as before the migration ran
        con.execute("DELETE FROM migrations WHERE name = 'm021_turn_flags_rewritten'")
    on(b, "sync")
    turns = [json.loads(line) for line in change.read_text().splitlines()[1:]]
    assert all(r["sharing"]["private"] for r in turns if r["kind"] == "message")
