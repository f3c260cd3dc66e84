"""Sync leftovers an adversary found: a 0-byte change file, and with a passphrase a damaged
device.json that held back that device's deletions."""

import pytest
from conftest import files_containing, on
from test_sync import MARKER, change_files, device, facts, stream_files, sync_json


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
