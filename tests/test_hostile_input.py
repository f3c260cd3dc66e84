"""Hostile or mistaken input to sync, export and import gets a clear error and changes nothing:
crafted timestamps, an empty path (an unset "$DIR"), JSON nested too deep."""

import json
import os

import pytest
from conftest import cli

from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.store import Store
from mlxmem.testing import FakeEngine


def chat(engine: FakeEngine, text: str) -> None:
    Companion(engine, Store(), "default", 600, 120, ChatSettings()).send(text)


def export_with(tmp_path, edit, engine=None) -> str:
    """An export of a one-turn log, with `edit(records)` applied to its records."""
    chat(engine or FakeEngine(), "hello there")
    path = tmp_path / "export.json"
    cli("export", str(path))
    document = json.loads(path.read_text())
    edit(document["records"])
    path.write_text(json.dumps(document))
    return str(path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("created_at", "9999-12-31T00:00:00+00:00"),
        ("created_at", "9999-12-31T23:00:00-05:00"),  # overflows on the way to UTC
        ("created_at", "0001-01-01T00:00:00+00:00"),
        ("created_at", "yesterday"),
    ],
)
def test_a_record_with_a_time_out_of_range_is_refused_whole(tmp_path, mlxmem_home, field, value):
    def edit(records):
        message = next(r for r in records if r["kind"] == "message")
        records.append({**message, "uid": "00000000-0000-4000-8000-000000000001", field: value})

    engine = FakeEngine()
    path = export_with(tmp_path, edit, engine)
    result = cli("import", path, code=1)
    assert "Error:" in result.output and "nothing was imported" in result.output
    assert len(Store().turns("default")) == 2  # the log as it was
    chat(engine, "still fine")  # and the chat goes on


def test_a_tombstone_with_a_crafted_deletion_time_is_refused(tmp_path, mlxmem_home):
    def edit(records):
        message = next(r for r in records if r["kind"] == "message")
        records.append(
            {
                "kind": "tombstone",
                "uid": message["uid"],
                "of": "message",
                "deleted_at": "9999-12-31T23:00:00-05:00",
                "device": message["device"],
            }
        )

    result = cli("import", export_with(tmp_path, edit), code=1)
    assert "deleted_at" in result.output
    assert len(Store().turns("default")) == 2


def test_a_sync_folder_file_with_a_crafted_time_is_skipped_not_a_crash(tmp_path, mlxmem_home):
    folder = tmp_path / "shared"
    folder.mkdir()
    stranger = folder / "mlxmem" / "devices" / "0f6c6a0e-1f7e-4a43-9d0b-3b8f1f0a0c11"
    stranger.mkdir(parents=True)
    record = {
        "kind": "tombstone",
        "uid": "00000000-0000-4000-8000-000000000002",
        "of": "message",
        "deleted_at": "9999-12-31T23:00:00-05:00",
        "device": stranger.name,
    }
    (stranger / "000001.jsonl").write_text(json.dumps(record) + "\n")
    result = cli("sync", str(folder))  # the file cannot be read whole: skipped, no traceback
    assert "000001.jsonl" in result.output and len(Store().turns("default")) == 0


@pytest.mark.parametrize("command", [["sync", ""], ["export", ""], ["import", " "]])
def test_an_empty_path_is_refused_not_taken_for_the_current_directory(
    tmp_path, mlxmem_home, command
):
    os.chdir(tmp_path)
    result = cli(*command, code=2)
    assert "the path is empty" in result.output
    assert [p for p in tmp_path.iterdir() if p != mlxmem_home] == []  # nothing written here


def test_an_import_nested_too_deep_is_refused(tmp_path, mlxmem_home):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    result = cli("import", str(path), code=1)
    assert "nested too deep" in result.output


def test_a_folder_in_place_of_the_sync_lock_is_a_clear_error(tmp_path, mlxmem_home):
    folder = tmp_path / "shared"
    folder.mkdir()
    Store()  # the data directory and its database
    (mlxmem_home / "mlxmem.duckdb.sync-lock").mkdir()
    result = cli("sync", str(folder), code=1)
    assert "Error:" in result.output and "sync-lock" in result.output


def test_a_device_json_with_nonsense_fields_does_not_break_sync_status(tmp_path, mlxmem_home):
    folder = tmp_path / "shared"
    folder.mkdir()
    cli("sync", str(folder))
    stranger = folder / "mlxmem" / "devices" / "0f6c6a0e-1f7e-4a43-9d0b-3b8f1f0a0c11"
    stranger.mkdir(parents=True)
    (stranger / "device.json").write_text(json.dumps({"name": ["x"], "last_sync": "soon"}))
    record = {
        "kind": "tombstone",
        "uid": "00000000-0000-4000-8000-000000000003",
        "of": "message",
        "deleted_at": "2026-01-01T00:00:00+00:00",
        "device": stranger.name,
    }
    (stranger / "000001.jsonl").write_text(json.dumps(record) + "\n")
    listed = json.loads(cli("sync", "--status", "--json").stdout)["devices"]
    assert {(d["name"], d["last_sync"]) for d in listed if not d["this_device"]} == {("?", None)}
    assert "never" in cli("sync", "--status").output


def test_turns_after_a_record_at_the_time_limit_still_export_import_and_sync(tmp_path, devices):
    from conftest import on

    from mlxmem.memory.sync.records import latest_time

    a, b, folder = devices
    os.environ["MLXMEM_HOME"] = str(a)
    limit = f"{latest_time().isoformat()}+00:00"  # the latest time a record may carry now

    def edit(records):
        message = next(r for r in records if r["kind"] == "message")
        records.append({**message, "uid": "00000000-0000-4000-8000-000000000002",
                        "created_at": limit, "text": "AT-THE-LIMIT"})  # fmt: skip

    engine = FakeEngine()
    path = export_with(tmp_path, edit, engine)
    cli("import", path)
    chat(engine, "AFTER-THE-LIMIT")  # stamped after the record at the limit
    turns = Store().turns("default")
    assert turns[-2].text == "AFTER-THE-LIMIT" and turns[-2].created_at.isoformat() > limit
    backup = tmp_path / "backup.json"
    on(a, "export", str(backup))
    on(b, "import", str(backup))
    assert "AFTER-THE-LIMIT" in on(b, "history", "show", "--json").stdout
    on(a, "memory", "add", "Written after it")
    on(a, "sync", str(folder))
    c = tmp_path / "C"
    on(c, "sync", str(folder))
    assert "AFTER-THE-LIMIT" in on(c, "history", "show", "--json").stdout
    assert "Written after it" in on(c, "memory", "list", "--json").stdout


def test_import_bounds_a_message_as_chat_does_and_a_long_one_is_encoded_once(tmp_path):
    from mlxmem.defaults import MAX_MESSAGE_CHARS

    def edit(size):
        def add(records):
            message = next(r for r in records if r["kind"] == "message")
            records.append({**message, "uid": "00000000-0000-4000-8000-000000000003",
                            "text": "long " * (size // 5)})  # fmt: skip

        return add

    class Counting(FakeEngine):
        encoded = 0

        def encode_text(self, text):
            self.encoded += len(text) > 100_000
            return super().encode_text(text)

    result = cli("import", export_with(tmp_path, edit(MAX_MESSAGE_CHARS + 5)), code=1)
    assert "over the limit of 1,000,000" in result.output
    assert "nothing was imported" in result.output
    Store().delete_conversation("default")
    cli("import", export_with(tmp_path, edit(MAX_MESSAGE_CHARS - 5)))
    engine = Counting()
    companion = Companion(engine, Store(), "default", 600, 120, ChatSettings(extract_facts=False))
    for i in range(4):
        companion.send(f"and then {i}")
    assert engine.encoded <= 2  # shortened once for the window (not four times, or nine)
