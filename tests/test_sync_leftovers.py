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


def test_with_a_passphrase_a_damaged_device_json_still_lets_its_deletions_through(
    devices, monkeypatch
):
    """The key of a sealed stream is derived from the salt in its device.json: a device that
    read the stream before keeps that description, so a damaged device.json holds back the
    device's other changes but not its deletions."""
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "a passphrase")
    a, b, folder = devices
    on(b, "memory", "add", f"Allergic to {MARKER}")
    on(b, "sync", str(folder))
    on(a, "sync", str(folder))
    assert (f"Allergic to {MARKER}", "manual") in facts(a)
    on(b, "memory", "rm", "1")
    on(b, "memory", "add", "Reads at night")
    on(b, "sync")
    assert all(p.name.endswith(".enc") for p in stream_files(folder, b))
    info = folder / "mlxmem" / "devices" / device(b) / "device.json"
    info.write_text("{not json")
    said = " ".join(on(a, "sync").stderr.split())
    assert "Skipped a device" in said
    assert (f"Allergic to {MARKER}", "manual") not in facts(a)
    assert ("Reads at night", "manual") not in facts(a)  # held back with the device
    assert files_containing(a, MARKER) == []
    on(b, "sync")  # B writes its device.json again: the rest arrives
    on(a, "sync")
    assert ("Reads at night", "manual") in facts(a)


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
