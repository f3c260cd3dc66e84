"""A fact is short (issue 23, Low): a manual fact, an edit, a fact sent to the API and a
synced or imported fact record are refused over MAX_FACT_CHARS, with a clear error."""

import json

import pytest
from conftest import cli
from serve_helpers import assert_error, fake_server, request

from mlxmem.errors import InputError
from mlxmem.memory.store import Store
from mlxmem.memory.sync.records import check_record
from mlxmem.memory.tables.facts import MAX_FACT_CHARS

LONG = "x" * (MAX_FACT_CHARS + 1)


def test_a_manual_fact_over_the_limit_is_refused_and_one_at_it_is_kept(mlxmem_home):
    result = cli("memory", "add", LONG, code=1)
    assert result.output.startswith("Error: a fact is at most 1,000 characters")
    assert Store().facts() == []
    cli("memory", "add", "y" * MAX_FACT_CHARS)
    assert len(Store().facts()[0].text) == MAX_FACT_CHARS


def test_an_edit_over_the_limit_is_refused_and_the_fact_kept(mlxmem_home):
    cli("memory", "add", "Likes tea")
    assert "at most 1,000" in cli("memory", "edit", "1", LONG, code=1).output
    assert [f.text for f in Store().facts()] == ["Likes tea"]


def test_the_api_refuses_a_fact_over_the_limit():
    with fake_server() as server:
        error = assert_error(request(server, "POST", "/v1/memory/facts", {"text": LONG}), 400)
        assert "at most 1,000" in error["message"]
    assert Store().facts() == []


def test_an_imported_fact_record_over_the_limit_is_refused_whole(mlxmem_home, tmp_path):
    cli("memory", "add", "Likes tea")
    path = tmp_path / "export.json"
    cli("export", str(path))
    document = json.loads(path.read_text())
    fact = next(r for r in document["records"] if r["kind"] == "fact")
    fact["text"] = LONG
    path.write_text(json.dumps(document))
    Store().delete_facts([1])
    result = cli("import", str(path), code=1)
    assert "over the limit of 1,000" in result.output and "nothing was imported" in result.output
    assert Store().facts() == []


def test_a_fact_record_over_the_limit_is_not_a_well_formed_change():
    record = {
        "kind": "fact",
        "uid": "0b5c0a52-8e7b-4a39-9d3c-6f4a0f3f8f11",
        "text": LONG,
        "source": "manual",
        "created_at": "2026-01-01T00:00:00+00:00",
        "updated_at": "2026-01-01T00:00:00+00:00",
        "device": "6c1d3b0e-9a3f-4f43-8b8e-2f1c4d5e6a7b",
        "message_uid": None,
    }
    with pytest.raises(InputError, match="over the limit"):
        check_record(record)
    check_record({**record, "text": "Likes tea"})
