"""Fact edits across devices are ordered by version vectors and counters, not by clocks: a
device whose clock is a year slow still wins with its later edit, and two edits made on two
devices before they met are both kept, and reported."""

import json
from datetime import timedelta

import duckdb
import pytest
from conftest import files_containing, on

from mlxmem.errors import InputError
from mlxmem.memory import forget
from mlxmem.memory.store import Store
from mlxmem.memory.sync.records import (
    check_record,
    clock_order,
    fact_clock,
    fact_key,
    fact_version,
)
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.memory.tables.facts import edited_clock
from mlxmem.memory.tables.migrations import MIGRATIONS, attach_facts, migrate

MARKER = "MARKER-CONFLICT-5150"


def facts(home):
    return sorted(f["text"] for f in json.loads(on(home, "memory", "list", "--json").stdout))


def test_a_device_with_a_clock_a_year_slow_still_wins_with_its_later_edit(devices, monkeypatch):
    a, b, folder = devices
    on(a, "memory", "add", f"Lives in Lisbon {MARKER}")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(b, "memory", "edit", "1", f"Lives in Porto {MARKER}")
    on(b, "sync")
    on(a, "sync")
    assert facts(a) == [f"Lives in Porto {MARKER}"]
    # A's clock is a year slow: its edit, made after it saw B's, carries an older time.
    real = forget.utc_now
    monkeypatch.setattr(forget, "utc_now", lambda: real() - timedelta(days=365))
    on(a, "memory", "edit", "1", "Lives in Braga")
    monkeypatch.setattr(forget, "utc_now", real)
    for home in (a, b, a, b):
        on(home, "sync")
    assert facts(a) == facts(b) == ["Lives in Braga"]
    # The edit it replaced is erased everywhere, as any superseded version is.
    assert files_containing(folder.parent, MARKER) == []


def test_two_devices_editing_a_fact_before_they_meet_keep_both_texts_and_say_so(devices):
    a, b, folder = devices
    on(a, "memory", "add", "Lives in Lisbon")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(a, "memory", "edit", "1", "Lives in Porto")
    on(b, "memory", "edit", "1", "Lives in Faro")
    said = [on(home, "sync").stdout for home in (a, b, a, b)]
    both = ["Lives in Faro", "Lives in Porto"]
    assert facts(a) == facts(b) == both
    # Each device says so where it keeps both: B, which merges A's edit and lets it lose, and
    # A, whose own text lost.
    reports = [i for i, s in enumerate(said) if "edited on two devices" in s]
    assert reports == [1, 2], said
    assert "both texts kept" in said[1]
    # Settled: more syncs change nothing and duplicate nothing.
    for home in (a, b, a):
        assert "edited on two devices" not in on(home, "sync").stdout
    assert facts(a) == facts(b) == both
    assert "Lives in Lisbon" not in str(facts(a))


def test_removing_one_side_of_a_conflict_keeps_the_other_on_every_device(devices):
    a, b, folder = devices
    on(a, "memory", "add", "Lives in Lisbon")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(a, "memory", "edit", "1", "Lives in Porto")
    on(b, "memory", "edit", "1", "Lives in Faro")
    for home in (a, b, a, b):
        on(home, "sync")
    both = json.loads(on(a, "memory", "list", "--json").stdout)
    (faro,) = [f for f in both if f["text"] == "Lives in Faro"]
    (porto,) = [f for f in both if f["text"] == "Lives in Porto"]
    removed = on(a, "memory", "rm", str(faro["id"])).stdout
    assert "Deleted 1 fact" in removed, removed
    for home in (a, b, a, b):
        on(home, "sync")
    assert facts(a) == facts(b) == [porto["text"]]
    assert files_containing(folder.parent, "Faro") == []
    # And the other way round: removing the fact that kept its uid leaves the fork.
    on(a, "memory", "add", "Likes tea")
    for home in (a, b):
        on(home, "sync")
    fid = next(f["id"] for f in json.loads(on(a, "memory", "list", "--json").stdout)
               if f["text"] == "Likes tea")  # fmt: skip
    on(a, "memory", "edit", str(fid), "Likes green tea")
    on(b, "memory", "edit", str(fid), "Likes black tea")
    for home in (a, b, a, b):
        on(home, "sync")
    on(b, "memory", "rm", str(fid))
    for home in (a, b, a, b):
        on(home, "sync")
    assert facts(a) == facts(b) and len(facts(a)) == 2, facts(a)
    assert [t for t in facts(a) if "tea" in t] != []


def three_devices_sharing(tmp_path, fact: str):
    """Three data directories syncing through one folder, all holding `fact` (as fact 1)."""
    a, b, c = (tmp_path / name for name in "ABC")
    folder = tmp_path / "shared"
    folder.mkdir()
    on(a, "memory", "add", fact)
    for home in (a, b, c):
        on(home, "sync", str(folder))
    return a, b, c


def test_a_text_deleted_before_the_conflict_met_does_not_return_as_a_fork(tmp_path):
    a, b, c = three_devices_sharing(tmp_path, "Lives in Lisbon")
    on(a, "memory", "edit", "1", "Lives in GONE-PORTO")
    on(a, "sync")
    on(b, "memory", "edit", "1", "Lives in Faro")
    on(b, "sync")
    on(a, "memory", "rm", "1")  # A never saw B's edit: it deletes its own text
    # C saw both edits and forked the losing one before the deletion reached it, or after.
    for home in (c, a, c, b, a, b, c):
        on(home, "sync")
    assert facts(a) == facts(b) == facts(c)
    assert files_containing(tmp_path, "GONE-PORTO") == []


def test_the_losing_text_is_kept_once_even_when_a_third_device_saw_it_first(tmp_path):
    a, b, c = three_devices_sharing(tmp_path, "Lives in Lisbon")
    on(a, "memory", "edit", "1", "Lives in Porto")
    on(b, "memory", "edit", "1", "Lives in Faro")
    # C sees A's edit first, then B's: it forks the same fact A forks, by the same uid.
    for home in (a, c, b, c, a, b, c, a):
        on(home, "sync")
    assert facts(a) == facts(b) == facts(c) == ["Lives in Faro", "Lives in Porto"]


def test_an_edit_over_an_older_version_is_kept_beside_two_edits_made_elsewhere(devices):
    """A version counter alone took B's one edit, made beside A's two, for an older version of
    A's text, and dropped it without a fork (the store model found it: the edited text lost).
    The version vectors tell that neither saw the other: the higher counter keeps the fact,
    and the other text is a fact of its own."""
    a, b, folder = devices
    on(a, "memory", "add", "Tea")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(b, "memory", "edit", "1", "Coffee")
    on(a, "memory", "edit", "1", "Green tea")
    on(a, "memory", "edit", "1", "Jasmine tea")  # version 2 against B's 1
    said = [on(home, "sync").stdout for home in (a, b, a)]
    assert facts(a) == facts(b) == ["Coffee", "Jasmine tea"]
    assert sum("edited on two devices" in s for s in said) == 1, said
    # A later edit made after B saw A's versions is a plain successor: no fork.
    jasmine = next(f for f in json.loads(on(b, "memory", "list", "--json").stdout)
                   if f["text"] == "Jasmine tea")  # fmt: skip
    on(b, "memory", "edit", str(jasmine["id"]), "Oolong tea")
    for home in (b, a, b):
        on(home, "sync")
    assert facts(a) == facts(b) == ["Coffee", "Oolong tea"]
    assert files_containing(folder.parent, "Jasmine") == []


def test_a_replacement_travels_and_its_deletion_brings_the_old_fact_back_everywhere(devices):
    a, b, folder = devices
    on(a, "memory", "add", "I live in Lisbon")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(a, "memory", "add", "I moved to Porto", "--replaces", "1")
    for home in (a, b):
        on(home, "sync")
    assert facts(b) == ["I moved to Porto"]
    listed = json.loads(on(b, "memory", "list", "--all", "--json").stdout)
    by_text = {f["text"]: f for f in listed}
    assert by_text["I live in Lisbon"]["replaced_by"] == by_text["I moved to Porto"]["id"]
    on(b, "memory", "rm", str(by_text["I moved to Porto"]["id"]))
    for home in (b, a):
        on(home, "sync")
    assert facts(a) == facts(b) == ["I live in Lisbon"]
    assert files_containing(folder.parent, "Porto") == []


def test_a_restore_travels_as_a_newer_version(devices):
    a, b, folder = devices
    on(a, "memory", "add", "I live in Lisbon")
    on(a, "memory", "add", "I moved to Porto", "--replaces", "1")
    for home in (a, b):
        on(home, "sync", str(folder))
    assert facts(b) == ["I moved to Porto"]
    lisbon = next(f for f in json.loads(on(b, "memory", "list", "--all", "--json").stdout)
                  if f["text"] == "I live in Lisbon")  # fmt: skip
    on(b, "memory", "restore", str(lisbon["id"]))
    for home in (b, a):
        on(home, "sync")
    assert facts(a) == facts(b) == ["I live in Lisbon", "I moved to Porto"]


def test_version_vectors_order_edits_by_what_each_saw():
    a, b = "6c1d3b0e-9a3f-4f43-8b8e-2f1c4d5e6a7b", "0b5c0a52-8e7b-4a39-9d3c-6f4a0f3f8f11"
    assert clock_order({a: 1}, {a: 1}) == "same"
    assert clock_order({a: 2}, {a: 1}) == "older"
    assert clock_order({a: 1}, {a: 1, b: 1}) == "newer"
    assert clock_order({a: 2}, {a: 1, b: 1}) == "concurrent"
    assert clock_order({}, {b: 3}) == "newer"
    assert clock_order(None, {b: 1}) is None  # an edit from before vectors: counters decide
    # A record without one: never edited is the empty vector; edited is unknown.
    assert fact_clock(record()) == {}
    assert fact_clock(record(version=2)) is None
    assert fact_clock(record(version=1, clock={a: 1})) == {a: 1}
    assert json.loads(edited_clock({a: 1}, b)) == {a: 1, b: 1}
    assert json.loads(edited_clock(None, a)) == {a: 1}


@pytest.mark.parametrize(
    "bad", [[], {"not-a-uuid": 1}, {"0b5c0a52-8e7b-4a39-9d3c-6f4a0f3f8f11": 0}]
)
def test_a_record_with_a_bad_clock_is_refused(bad):
    with pytest.raises(InputError, match="bad 'clock'"):
        check_record(record(version=1, clock=bad))


@pytest.mark.parametrize("kind", [["fact"], {"fact": 1}, 7, None])
def test_a_record_whose_kind_is_no_string_is_refused_not_a_crash(kind):
    # A sync file skips a record that raises InputError; a TypeError would stop the sync.
    with pytest.raises(InputError, match="unknown record kind"):
        check_record(record(kind=kind))


def record(**changes):
    r = {
        "kind": "fact",
        "uid": "0b5c0a52-8e7b-4a39-9d3c-6f4a0f3f8f11",
        "text": "Likes tea",
        "source": "manual",
        "created_at": "2026-01-01T00:00:00+00:00",
        "updated_at": "2026-01-01T00:00:00+00:00",
        "device": "6c1d3b0e-9a3f-4f43-8b8e-2f1c4d5e6a7b",
        "message_uid": None,
    }
    r.update(changes)
    return r


def test_records_from_before_version_counters_read_as_version_0_or_1():
    assert fact_version(record()) == 0
    assert fact_version(record(updated_at="2026-02-01T00:00:00+00:00")) == 1
    assert fact_version(record(version=7)) == 7
    # The version decides before the time does.
    assert fact_key(record(version=2)) > fact_key(record(version=1, updated_at="2100-01-01"))


@pytest.mark.parametrize("bad", [-1, "1", True, 1.0, None, 2**63])
def test_a_record_with_a_bad_version_is_refused(bad):
    with pytest.raises(InputError, match="bad 'version'"):
        check_record(record(version=bad))


def test_the_migration_numbers_facts_edited_before_it_as_version_1(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    attach_facts(con)
    names = [m.__name__ for m in MIGRATIONS]
    migrate(con, MIGRATIONS[: names.index("m009_fact_versions")])
    con.execute(
        "INSERT INTO facts_db.facts (id, text, source, created_at, updated_at) VALUES"
        " (1, 'never edited', 'manual', '2026-01-01', '2026-01-01'),"
        " (2, 'edited', 'manual', '2026-01-01', '2026-03-01')"
    )
    con.close()
    store = Store(path)
    with store.connect() as con:
        rows = con.execute("SELECT text, version FROM facts ORDER BY id").fetchall()
    assert rows == [("never edited", 0), ("edited", 1)]
    log = SyncLog(path)
    assert {r["text"]: r["version"] for r in log.changes() if r["kind"] == "fact"} == dict(rows)
    store.edit_fact(2, "edited again")
    assert [r["version"] for r in log.changes() if r["kind"] == "fact"] == [0, 2]


def test_a_lagging_device_that_still_holds_the_losing_text_does_not_delete_its_fork(tmp_path):
    a, b, c = three_devices_sharing(tmp_path, "Lives in Lisbon")
    on(a, "memory", "edit", "1", "Lives in Porto")
    on(a, "sync")
    on(c, "sync")  # C holds Porto under the fact's own uid, then stays away
    on(b, "memory", "edit", "1", "Lives in Faro")
    on(b, "sync")
    on(a, "sync")  # Faro wins on A; Porto is kept as a fork
    assert facts(a) == ["Lives in Faro", "Lives in Porto"]
    faro = next(f for f in json.loads(on(b, "memory", "list", "--json").stdout)
                if f["text"] == "Lives in Faro")  # fmt: skip
    on(b, "memory", "rm", str(faro["id"]))
    # C comes back still holding Porto as the deleted uid's text: the deletion reaching it
    # removes that row, and must not name the fork the others keep Porto under.
    for home in (c, a, b, c, a, b, c):
        on(home, "sync")
    assert facts(a) == facts(b) == facts(c) == ["Lives in Porto"]
    assert files_containing(tmp_path, "Faro") == []


def test_the_side_kept_on_a_third_device_survives_when_its_writer_lags(tmp_path):
    """A merges B's concurrent edit and lets it lose: only B, the writer, used to publish the
    fork. C, which had B's text under the fact's uid, forks it, the person keeps it there and
    deletes the winner; B, still holding its text under that uid, then meets the deletion
    before it ever forked. The text kept must survive on every device."""
    a, b, c = three_devices_sharing(tmp_path, "Lives in Lisbon")
    on(b, "memory", "edit", "1", "Lives in Faro")
    on(a, "memory", "edit", "1", "Lives in Porto")  # later: Porto wins the tie-break
    on(b, "sync")  # B publishes Faro, then stays away
    on(c, "sync")  # C holds Faro under the fact's uid
    on(a, "sync")  # A publishes Porto (Faro lost to it)
    on(c, "sync")  # C sees the conflict: Porto keeps the uid, Faro becomes a fork
    assert facts(c) == ["Lives in Faro", "Lives in Porto"]
    porto = next(f for f in json.loads(on(c, "memory", "list", "--json").stdout)
                 if f["text"] == "Lives in Porto")  # fmt: skip
    on(c, "memory", "rm", str(porto["id"]))  # the person keeps Faro
    for home in (c, b, a, c, b, a, c):
        on(home, "sync")
    assert facts(c) == ["Lives in Faro"]
    assert facts(a) == facts(b) == facts(c)


def test_a_fact_deleted_on_a_device_that_saw_only_the_winner_keeps_the_losing_edit(tmp_path):
    """A merges B's concurrent edit and the person on A deletes the text A shows: B's text,
    which lost the tie-break, was never deleted by anyone and stays, on every device."""
    a, b, c = three_devices_sharing(tmp_path, "Lives in Lisbon")
    on(b, "memory", "edit", "1", "Lives in Faro")
    on(a, "memory", "edit", "1", "Lives in Porto")
    on(b, "sync")
    on(a, "sync")
    on(a, "memory", "rm", "1")
    for home in (a, b, c, a, b, c):
        on(home, "sync")
    assert facts(a) == facts(b) == facts(c) == ["Lives in Faro"]


def test_a_device_that_reads_both_edits_in_one_sync_keeps_both(tmp_path):
    """C reads A's and B's concurrent edits in one sync: the one that loses is kept as a fork
    there too (C compared only the newest with its own), and deleting the winner on C leaves
    it on every device, even if it reaches its writer before that one saw the conflict."""
    a, b, c = three_devices_sharing(tmp_path, "Lives in Lisbon")
    on(a, "memory", "edit", "1", "Lives in Porto")
    on(a, "sync")
    # The sync tool has not brought A's new file to B yet: B never sees A's edit.
    devices = tmp_path / "shared" / "mlxmem" / "devices"
    sent = max((devices / own_id(a)).glob("*.jsonl"))
    sent.rename(tmp_path / "in-transit")
    on(b, "memory", "edit", "1", "Lives in Faro")  # later: Faro wins the tie-break
    on(b, "sync")
    (tmp_path / "in-transit").rename(sent)
    on(c, "sync")
    assert facts(c) == ["Lives in Faro", "Lives in Porto"]
    faro = next(f for f in json.loads(on(c, "memory", "list", "--json").stdout)
                if f["text"] == "Lives in Faro")  # fmt: skip
    on(c, "memory", "rm", str(faro["id"]))
    for home in (c, a, b, c, a, b):
        on(home, "sync")
    assert facts(a) == facts(b) == facts(c) == ["Lives in Porto"]
    assert files_containing(tmp_path, "Faro") == []


def own_id(home):
    return json.loads(on(home, "sync", "--status", "--json").stdout)["device"]["device"]
