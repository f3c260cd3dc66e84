"""mlxmem sync, export and import: two data directories A and B (two devices) share one sync
folder; real DuckDB files, through the CLI where practical."""

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest
from conftest import cli, files_containing, on

from mlxmem import paths
from mlxmem.errors import InputError
from mlxmem.memory.companion import ChatSettings, Companion
from mlxmem.memory.recall import recall_query
from mlxmem.memory.store import Store
from mlxmem.memory.sync import records
from mlxmem.memory.sync.records import check_record
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.memory.tables.migrations import MIGRATIONS, attach_facts, migrate
from mlxmem.memory.tables.turns import conversation_uid
from mlxmem.testing import FakeEngine

MARKER = "MARKER-SYNC-4711"


ENGINES: dict = {}


def chat(home, conversation, *messages):
    """A few turns through the companion, on a deterministic fake model (one per device: its
    word-level vocabulary must know the token ids its earlier replies were logged with)."""
    os.environ["MLXMEM_HOME"] = str(home)
    engine = ENGINES.setdefault(str(home), FakeEngine())
    companion = Companion(engine, Store(), conversation, 600, 120, ChatSettings())
    for text in messages:
        companion.send(text)


def log(home, conversation="default"):
    turns = json.loads(on(home, "history", "show", conversation, "--json").stdout)
    return [(t["role"], t["text"]) for t in turns]


def facts(home):
    return sorted(
        (f["text"], f["source"]) for f in json.loads(on(home, "memory", "list", "--json").stdout)
    )


def conversations(home):
    return sorted(
        (c["name"], c["turn_count"])
        for c in json.loads(on(home, "history", "list", "--json").stdout)
    )


def folder_bytes(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def change_files(folder):
    return {p: b for p, b in folder_bytes(folder).items() if p.name != "device.json"}


def kv_file():
    """A KV cache file of this data directory (its folder is made when a cache is first
    saved)."""
    paths.cache_dir().mkdir(parents=True, exist_ok=True)
    return paths.cache_dir() / "default-chat.safetensors"


def uids(home):
    os.environ["MLXMEM_HOME"] = str(home)
    with Store().connect() as con:
        return [u for (u,) in con.execute("SELECT uid FROM turns ORDER BY uid").fetchall()]


# -- ids ---------------------------------------------------------------------------------------


def test_the_migration_gives_ids_to_existing_data_and_keeps_the_local_ones(mlxmem_home):
    mlxmem_home.mkdir(mode=0o700)
    old = duckdb.connect(str(paths.db_path()))
    attach_facts(old)
    migrate(old, MIGRATIONS[:6])  # a database from before sync
    old.execute("INSERT INTO conversations (name, created_at) VALUES ('default', now())")
    for seq in (1, 2):
        old.execute(
            "INSERT INTO messages (conversation_id, seq, role, text, created_at) VALUES"
            " (1, ?, 'user', 'hi', now())",
            [seq],
        )
    old.execute("INSERT INTO facts VALUES (7, 'likes tea', 'manual', now(), now(), NULL)")
    old.close()
    store = Store()
    with store.connect() as con:
        rows = con.execute("SELECT id, uid, device_uid FROM turns ORDER BY id").fetchall()
        fact = con.execute("SELECT id, uid FROM facts").fetchone()
        device = con.execute("SELECT value FROM state WHERE key = 'device_uid'").fetchone()[0]
    assert [r[0] for r in rows] == [1, 2] and fact[0] == 7  # the ids the CLI shows stay
    assert len({r[1] for r in rows} | {fact[1]}) == 3  # three distinct uids
    assert all(len(u) == 36 for u in [rows[0][1], fact[1], device])
    assert rows[0][2] is None  # written on this device
    assert store.get_fact(7).text == "likes tea"


def test_deletions_leave_tombstones_with_ids_and_no_text():
    store = Store()
    turn = store.append_turn("default", "user", f"secret {MARKER}")
    fact = store.add_fact(f"code {MARKER}")
    store.delete_turns([turn.id])
    store.delete_facts([fact.id])
    with store.connect() as con:
        rows = con.execute("SELECT kind, uid FROM tombstones ORDER BY kind").fetchall()
    assert [r[0] for r in rows] == ["fact", "message"]
    assert all(len(r[1]) == 36 and MARKER not in r[1] for r in rows)
    # The files were rewritten by the erase: rows written afterwards still get uids.
    store.append_turn("default", "user", "after")
    store.add_fact("after")
    with store.connect() as con:
        assert con.execute("SELECT count(uid) FROM turns").fetchone() == (1,)
        assert con.execute("SELECT count(uid) FROM facts").fetchone() == (1,)


# -- merging -----------------------------------------------------------------------------------


def test_chats_on_both_devices_end_equal_after_syncing_a_b_a(devices):
    a, b, folder = devices
    chat(a, "default", "Good morning from the laptop")
    on(a, "memory", "add", "I am vegetarian")
    chat(b, "default", "Hello from the phone")
    chat(b, "travel", "Planning a trip to Porto")
    on(b, "memory", "add", "My sister is Anna")
    chat(a, "default", "Back on the laptop")
    chat(a, "work", "A meeting at ten")

    for home in (a, b, a):
        on(home, "sync", str(folder))

    assert log(a) == log(b)
    assert [text for _, text in log(a) if _ == "user"] == [
        "Good morning from the laptop",
        "Hello from the phone",
        "Back on the laptop",
    ]  # ordered by time across devices
    for name in ("travel", "work"):
        assert log(a, name) == log(b, name) != []
    assert conversations(a) == conversations(b) == [("default", 6), ("travel", 2), ("work", 2)]
    assert facts(a) == facts(b) == [("I am vegetarian", "manual"), ("My sister is Anna", "manual")]
    assert sorted(uids(a)) == sorted(uids(b)) and len(set(uids(a))) == 10

    # A second sync changes nothing.
    before = change_files(folder)
    for home in (a, b):
        result = json.loads(on(home, "sync", "--json").stdout)  # the folder is remembered
        assert result["written"] == 0 and result["rewritten"] == 0
        assert not any(v for k, v in result["merged"].items() if k != "renumbered")
    assert change_files(folder) == before
    assert log(a) == log(b) and facts(a) == facts(b)


def test_each_device_writes_only_into_its_own_folder(devices):
    a, b, folder = devices
    on(a, "memory", "add", "fact from A")
    on(a, "sync", str(folder))
    before = change_files(folder)
    on(b, "memory", "add", "fact from B")
    on(b, "sync", str(folder))
    after = change_files(folder)
    assert all(after[p] == data for p, data in before.items())  # A's files untouched by B
    (new,) = set(after) - set(before)
    assert (
        new.parent.name
        == json.loads(on(b, "sync", "--status", "--json").stdout)["device"]["device"]
    )
    assert new.name == "000001.jsonl" and stat.S_IMODE(new.stat().st_mode) == 0o600


@pytest.mark.parametrize("origin", ["A", "B"])
@pytest.mark.parametrize("kind", ["fact", "turn"])
def test_a_deletion_reaches_a_stale_device_and_leaves_no_bytes_anywhere(devices, kind, origin):
    a, b, folder = devices
    writer = a if origin == "A" else b
    if kind == "fact":
        on(writer, "memory", "add", f"My code is {MARKER}")
    else:
        chat(writer, "default", f"My code is {MARKER}")
    on(writer, "memory", "add", "Likes tea")
    for home in (writer, a, b):
        on(home, "sync", str(folder))
    # B holds the text (and a KV cache file that mirrors it).
    assert files_containing(b, MARKER)
    os.environ["MLXMEM_HOME"] = str(b)
    kv_file().write_bytes(f"kv {MARKER}".encode())

    if kind == "fact":
        (fact,) = [
            f for f in json.loads(on(a, "memory", "list", "--json").stdout) if MARKER in f["text"]
        ]
        on(a, "memory", "rm", str(fact["id"]))
    else:
        (turn,) = [
            t for t in json.loads(on(a, "history", "show", "--json").stdout) if MARKER in t["text"]
        ]
        on(a, "history", "rm", str(turn["id"]))
    on(a, "sync", str(folder))
    on(b, "sync", str(folder))  # B was stale: it still held the text

    assert facts(b) == facts(a) == [("Likes tea", "manual")]
    assert log(a) == log(b) and all(MARKER not in text for _, text in log(b))
    assert files_containing(folder.parent, MARKER) == []  # DIR, A and B, every file
    # Nothing comes back, whichever device syncs next.
    on(a, "sync")
    on(b, "sync")
    assert facts(a) == facts(b) == [("Likes tea", "manual")]
    assert files_containing(folder.parent, MARKER) == []


def test_an_offline_device_cannot_bring_a_deleted_fact_back(devices):
    a, b, folder = devices
    on(b, "memory", "add", f"Old plan {MARKER}")
    on(b, "sync", str(folder))
    on(a, "sync", str(folder))
    on(a, "memory", "rm", "1")
    on(a, "sync")
    # B, offline meanwhile, still has the fact, and even edits it before it syncs again.
    on(b, "memory", "edit", "1", f"New plan {MARKER}")
    on(b, "sync")
    on(a, "sync")
    assert facts(a) == facts(b) == []
    assert files_containing(folder.parent, MARKER) == []


def test_a_later_fact_edit_wins_and_the_old_text_leaves_the_folder(devices):
    a, b, folder = devices
    on(a, "memory", "add", f"Lives in Lisbon {MARKER}")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(a, "memory", "edit", "1", "Lives in Porto (first edit)")
    for home in (a, b):
        on(home, "sync")
    # Made after B saw A's edit: a higher version, which wins (edits made before the devices
    # met are both kept: tests/test_sync_conflicts.py).
    on(b, "memory", "edit", "1", "Lives in Porto")
    for home in (a, b, a):
        on(home, "sync")
    assert facts(a) == facts(b) == [("Lives in Porto", "manual")]
    assert files_containing(folder.parent, MARKER) == []
    assert files_containing(folder.parent, "first edit") == []


def test_a_merged_in_older_turn_rebuilds_the_summary_and_drops_the_cache(devices):
    a, b, folder = devices
    os.environ["MLXMEM_HOME"] = str(b)
    Store().append_turn("default", "user", "written on B first")
    os.environ["MLXMEM_HOME"] = str(a)
    store = Store()
    for i in range(6):
        store.append_turn("default", "user" if i % 2 == 0 else "assistant", f"A turn {i}")
    store.add_summary("default", "A's summary of its turns 1-4", 1, 4, 10)
    kv_file().write_bytes(b"kv")
    on(b, "sync", str(folder))
    on(a, "sync", str(folder))
    os.environ["MLXMEM_HOME"] = str(a)
    store = Store()
    assert store.latest_summary("default") is None  # the next reply folds the log again
    assert not kv_file().exists()
    turns = store.turns("default")
    assert [t.text for t in turns] == ["written on B first"] + [f"A turn {i}" for i in range(6)]
    assert [t.seq for t in turns] == sorted(t.seq for t in turns)
    on(b, "sync")
    assert log(a) == log(b)


def test_a_turn_merged_after_the_summary_keeps_it(devices):
    a, b, folder = devices
    os.environ["MLXMEM_HOME"] = str(a)
    store = Store()
    for i in range(4):
        store.append_turn("default", "user" if i % 2 == 0 else "assistant", f"A turn {i}")
    store.add_summary("default", "summary", 1, 2, 10)
    os.environ["MLXMEM_HOME"] = str(b)
    Store().append_turn("default", "user", "later, on B")
    on(b, "sync", str(folder))
    on(a, "sync", str(folder))
    os.environ["MLXMEM_HOME"] = str(a)
    assert Store().latest_summary("default").text == "summary"
    assert log(a)[-1] == ("user", "later, on B")


# -- crash safety ------------------------------------------------------------------------------

SYNC_STEPS = (
    "sync:read",
    "erase:committed",
    "sync:tombstones-merged",
    "sync:turns-merged",
    "sync:facts-merged",
    "sync:temp-written",
    "sync:rewritten",
    "sync:written",
)
# A sync in a process of its own, without the CLI's start-up (the kill should land in the sync).
SYNC_SCRIPT = (
    "import os, sys; from pathlib import Path; from mlxmem.memory.tables import db; "
    "step = os.environ.get('MLXMEM_CRASH_AT'); "  # die there, as kill -9 would
    "db.fault_hook = lambda name: os._exit(137) if name == step else None; "
    "from mlxmem.memory.sync.synclog import SyncLog; "
    "from mlxmem.sync.run import sync; print('started', flush=True); "
    "sync(SyncLog(), Path(sys.argv[1]))"
)


def sync_process(home, folder, crash_at=None):
    env = {**os.environ, "MLXMEM_HOME": str(home)}
    if crash_at:
        env["MLXMEM_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, "-c", SYNC_SCRIPT, str(folder)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def diverge(a, b, folder, i):
    """Changes on both sides that the next sync of A must carry both ways: new turns and
    facts, a fact B deletes (a tombstone for A), a fact B edits, and a turn A deletes that is
    already in A's files in the folder (which must be rewritten). The deleted text holds
    MARKER-i."""
    on(a, "memory", "add", f"doomed {MARKER}-{i}")
    chat(a, "default", f"A regrets {MARKER}-{i}")
    on(a, "sync", str(folder))
    on(b, "sync", str(folder))
    chat(a, "default", f"A says {i}")
    on(a, "memory", "add", f"A fact {i}")
    regret = [t for t in listed(a, "history", "show") if f"{MARKER}-{i}" in t["text"]]
    on(a, "history", "rm", *[str(t["id"]) for t in regret])
    chat(b, "default", f"B says {i}")
    chat(b, f"b-topic-{i % 3}", f"B topic {i}")
    on(b, "memory", "add", f"B fact {i}")
    (doomed,) = [f for f in listed(b, "memory", "list") if f"{MARKER}-{i}" in f["text"]]
    on(b, "memory", "rm", str(doomed["id"]))
    edit = [f for f in listed(b, "memory", "list") if f["text"].startswith("B fact")][0]
    on(b, "memory", "edit", str(edit["id"]), f"B fact edited {i}")
    on(b, "sync", str(folder))


def listed(home, *args):
    return json.loads(on(home, *args, "--json").stdout)


def contents(home):
    """A device's log (every conversation, in order, with uids) and facts, in one read."""
    os.environ["MLXMEM_HOME"] = str(home)
    with Store().connect() as con:
        turns = con.execute(
            "SELECT c.name, m.role, m.text, m.uid FROM turns m JOIN conversations c"
            " ON c.id = m.conversation_id ORDER BY c.name, m.seq"
        ).fetchall()
        known = sorted(con.execute("SELECT text, source FROM facts").fetchall())
    return turns, known


def check_converged(a, b, folder):
    """After complete syncs of A, B, A: the same log, facts and uids, nothing twice; return
    the "A says" and "B says" turns."""
    for home in (a, b, a):
        on(home, "sync", str(folder))
    turns, known = contents(a)
    assert contents(b) == (turns, known)
    assert len({t[3] for t in turns}) == len(turns)
    assert len({text for text, _ in known}) == len(known)
    users = [t[2] for t in turns if t[2].startswith(("A says", "B says"))]
    assert len(set(users)) == len(users)
    return users


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """Devices A and B after diverge(), built once and copied for each test (the files are
    closed between operations, so a copy is a faithful one)."""
    root = tmp_path_factory.mktemp("diverged")
    a, b, folder = root / "A", root / "B", root / "shared"
    folder.mkdir()
    saved = os.environ.get("MLXMEM_HOME")
    diverge(a, b, folder, 1)
    if saved is None:
        os.environ.pop("MLXMEM_HOME")
    else:
        os.environ["MLXMEM_HOME"] = saved
    return root


@pytest.mark.parametrize("step", SYNC_STEPS)
def test_a_sync_killed_at_any_step_is_finished_by_the_next(diverged, tmp_path, step):
    root = tmp_path / "copy"
    shutil.copytree(diverged, root, symlinks=True)
    a, b, folder = root / "A", root / "B", root / "shared"
    killed = sync_process(a, folder, crash_at=step)
    assert killed.wait(timeout=120) == 137, killed.stderr.read().decode()
    on(a, "sync", str(folder))  # finishes what was cut short
    again = json.loads(on(a, "sync", "--json").stdout)
    assert again["written"] == again["rewritten"] == 0  # and then nothing more to do
    users = check_converged(a, b, folder)
    assert sorted(users) == ["A says 1", "B says 1"]
    _, known = contents(a)
    assert ("B fact edited 1", "manual") in known
    assert all("doomed" not in text for text, _ in known)
    assert files_containing(folder.parent, MARKER) == []


def test_syncs_killed_at_random_times_lose_and_duplicate_nothing(devices):
    a, b, folder = devices
    rng = random.Random(13)
    expected = []
    kills = 0
    duration = None  # of one whole sync on this machine, measured first
    for i in range(11):
        diverge(a, b, folder, i)
        expected += [f"A says {i}", f"B says {i}"]
        process = sync_process(a, folder)
        assert process.stdout.readline() == b"started\n"  # imports done: the sync begins
        start = time.monotonic()
        if duration is not None:
            time.sleep(rng.uniform(0.0, 0.9 * duration))
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                kills += 1
        process.wait(timeout=120)
        duration = duration or time.monotonic() - start
        on(a, "sync", str(folder))
        assert sorted(check_converged(a, b, folder)) == sorted(expected)
        assert files_containing(folder.parent, f"{MARKER}-{i}") == []
    assert kills >= 5  # most of the ten kills landed inside a sync


# -- status, export, import, encryption --------------------------------------------------------


def test_status_shows_devices_last_sync_and_pending_changes(devices):
    a, b, folder = devices
    on(a, "sync", str(folder))
    on(b, "sync", str(folder))
    on(a, "memory", "add", "pending fact")
    chat(a, "default", "pending turn")
    found = json.loads(on(a, "sync", "--status", "--json").stdout)
    assert found["pending"] == {
        "turns": 2,
        "messages": 2,
        "facts": 1,
        "tombstones": 0,
        "conversations": 0,
        "files_to_rewrite": 0,
    }
    assert sorted(d["this_device"] for d in found["devices"]) == [False, True]
    assert all(d["last_sync"] and d["name"] for d in found["devices"])
    on(a, "sync")
    found = json.loads(on(a, "sync", "--status", "--json").stdout)
    assert set(found["pending"].values()) == {0}
    text = on(a, "sync", "--status").output
    assert "this device" in text and "Pending here: 0 turns" in text


def test_sync_without_a_folder_says_how_to_name_one_and_creates_a_new_one(mlxmem_home, tmp_path):
    assert "no sync folder yet" in cli("sync", code=1).output
    deeper = tmp_path / "nowhere" / "deeper"
    assert "nor its parent exist" in cli("sync", str(deeper), code=1).output
    assert "does not exist yet" in cli("sync", "--status", str(tmp_path / "new"), code=1).output
    assert not (tmp_path / "new").exists()
    cli("sync", str(tmp_path / "new"))  # a new folder whose parent exists: created
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    shutil.rmtree(tmp_path / "new")  # a folder used before is not created again (unmounted?)
    assert "is the drive mounted" in cli("sync", code=1).output
    assert "is the drive mounted" in cli("sync", str(tmp_path / "new"), code=1).output
    assert not (tmp_path / "new").exists()
    # A parent where no folder can be made: an error that says so, no traceback.
    if os.geteuid() == 0:  # root may write anywhere, but not into /proc
        parent = Path("/proc")
    else:
        parent = tmp_path / "locked"
        parent.mkdir(mode=0o500)
    refused = cli("sync", str(parent / "mlxmem-sync"), code=1).output
    assert "cannot create the sync folder" in refused and "Traceback" not in refused


def test_export_then_import_into_an_empty_data_directory_reproduces_log_and_facts(devices):
    a, b, folder = devices
    chat(a, "default", "first", "second")
    chat(a, "travel", "Porto")
    on(a, "memory", "add", "I am vegetarian")
    on(a, "memory", "add", f"to delete {MARKER}")
    on(a, "memory", "rm", "2")
    export = folder.parent / "backup.json"
    on(a, "export", str(export))
    assert stat.S_IMODE(export.stat().st_mode) == 0o600
    assert MARKER not in export.read_text()  # a tombstone holds ids and a time only
    document = json.loads(export.read_text())
    assert [r["of"] for r in document["records"] if r["kind"] == "tombstone"] == ["fact"]

    c = folder.parent / "C"
    on(c, "import", str(export))
    for name in ("default", "travel"):
        assert log(c, name) == log(a, name) != []
    assert facts(c) == facts(a) == [("I am vegetarian", "manual")]
    assert uids(c) == uids(a)
    on(c, "import", str(export))  # by uid: nothing twice
    assert log(c) == log(a) and facts(c) == facts(a)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"format": "something-else", "records": []}',
        b'{"format": "mlxmem-export", "version": 1, "records": [RECORD, {"kind": "message"}]}',
    ],
)
def test_importing_a_bad_file_fails_clearly_and_applies_nothing(mlxmem_home, tmp_path, content):
    Store().add_fact("already here")
    good = tmp_path / "good.json"
    other = tmp_path / "other"
    os.environ["MLXMEM_HOME"] = str(other)
    Store().add_fact(f"from the file {MARKER}")
    cli("export", str(good))
    record = json.dumps(json.loads(good.read_text())["records"][0]).encode()
    bad = tmp_path / "bad.json"
    bad.write_bytes(content.replace(b"RECORD", record))
    os.environ["MLXMEM_HOME"] = str(mlxmem_home)
    result = cli("import", str(bad), code=1)
    assert result.output.startswith("Error:") and "Traceback" not in result.output
    assert facts(mlxmem_home) == [("already here", "manual")]


def test_an_encrypted_folder_holds_no_plaintext_and_needs_the_passphrase(devices, monkeypatch):
    a, b, folder = devices
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "correct horse battery staple")
    chat(a, "default", f"Secret plans {MARKER}")
    on(a, "memory", "add", f"Code {MARKER}")
    on(a, "sync", str(folder))
    assert files_containing(folder, MARKER) == []
    assert all(p.name.endswith(".enc") for p in change_files(folder))
    on(b, "sync", str(folder))
    assert facts(b) == facts(a) and log(b) == log(a)

    c = folder.parent / "C"
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "wrong")
    assert "wrong sync passphrase" in on(c, "sync", str(folder), code=1).output
    monkeypatch.delenv("MLXMEM_SYNC_PASSPHRASE")
    assert "encrypted" in on(c, "sync", str(folder), code=1).output
    assert "encrypted" in on(a, "sync", "--status", code=1).output
    assert facts(c) == []


def test_a_mistyped_passphrase_on_a_new_device_writes_nothing_and_the_right_one_works(
    devices, monkeypatch
):
    a, b, folder = devices
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "correct horse battery staple")
    on(a, "memory", "add", f"Code {MARKER}")
    on(a, "sync", str(folder))
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "correct horse battery stapel")
    assert "wrong sync passphrase" in on(b, "sync", str(folder), code=1).output
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before  # nothing written
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "correct horse battery staple")
    on(b, "sync", str(folder))
    assert facts(b) == facts(a)


def test_a_plaintext_stream_is_rewritten_sealed_once_a_passphrase_is_given(devices, monkeypatch):
    a, b, folder = devices
    on(a, "memory", "add", f"Code {MARKER}")
    on(a, "sync", str(folder))
    assert files_containing(folder, MARKER)
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "passphrase")
    on(a, "sync")
    assert files_containing(folder, MARKER) == []
    on(b, "sync", str(folder))
    assert facts(b) == [(f"Code {MARKER}", "manual")]


def test_a_deleted_conversation_goes_on_the_other_device_too(devices):
    a, b, folder = devices
    chat(a, "travel", f"Flight code {MARKER}")
    chat(a, "default", "hello")
    for home in (a, b):
        on(home, "sync", str(folder))
    assert ("travel", 2) in conversations(b)
    on(b, "history", "rm", "-c", "travel", "--all", "--yes")
    for home in (b, a):
        on(home, "sync")
    assert conversations(a) == conversations(b) == [("default", 2)]
    assert files_containing(folder.parent, MARKER) == []


def private(home):
    return {
        c["name"]: c["private"] for c in json.loads(on(home, "history", "list", "--json").stdout)
    }


def test_a_private_flag_travels_and_keeps_the_turns_out_of_recall_on_every_device(devices):
    a, b, folder = devices
    chat(a, "diary", f"Kohlrabi stew recipe {MARKER}")
    on(a, "history", "private", "diary")
    for home in (a, b):
        on(home, "sync", str(folder))
    assert private(b) == {"diary": True}
    os.environ["MLXMEM_HOME"] = str(b)
    query = recall_query("What about the kohlrabi stew?")
    assert Store().snapshot("default", query).recalled == []
    # Let back in on B: A follows, and the turn is recalled there.
    on(b, "history", "private", "diary", "--off")
    for home in (b, a):
        on(home, "sync")
    assert private(a) == {"diary": False}
    os.environ["MLXMEM_HOME"] = str(a)
    assert MARKER in " ".join(t.text for t in Store().snapshot("other", query).recalled)
    # Deleted: the flag's record goes with the conversation, and no file names it.
    on(a, "history", "rm", "-c", "diary", "--all", "--yes")
    for home in (a, b):
        on(home, "sync")
    assert private(a) == private(b) == {}
    assert files_containing(folder.parent, "diary") == []


def test_a_conversation_made_private_before_its_turns_arrive_is_private_from_the_first(devices):
    a, b, folder = devices
    os.environ["MLXMEM_HOME"] = str(a)
    Store().set_private("default", create=True)  # as `chat --private` does, before a turn
    chat(a, "default", f"Kohlrabi stew recipe {MARKER}")
    for home in (a, b):
        on(home, "sync", str(folder))
    assert private(b) == {"default": True}
    os.environ["MLXMEM_HOME"] = str(b)
    query = recall_query("What about the kohlrabi stew?")
    assert Store().snapshot("elsewhere", query).recalled == []


def recalled(home, question):
    os.environ["MLXMEM_HOME"] = str(home)
    return [t.text for t in Store().snapshot("elsewhere", recall_query(question)).recalled]


@pytest.mark.parametrize("first", ["deleting", "writing"])
def test_a_conversation_deleted_while_another_device_writes_to_it_stays_out_of_recall(
    devices, first
):
    a, b, folder = devices
    chat(a, "diary", f"Kohlrabi stew recipe {MARKER}")
    on(a, "history", "private", "diary")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(a, "history", "rm", "-c", "diary", "--all", "--yes")
    chat(b, "diary", "Kohlrabi soup with my therapist")  # B has not seen the deletion
    # Whichever syncs first: when B does, its turns reach the folder before A's deletion, and
    # they once came to A as a conversation made anew, shared, until two more syncs.
    for home in (a, b, a, b) if first == "deleting" else (b, a, b, a):
        on(home, "sync")
        assert recalled(a, "What about the kohlrabi soup?") == []
    # B's turn keeps the conversation alive on both devices, private on both (the device
    # that deleted no longer knows the flag): recalled in no other conversation.
    assert private(a) == private(b) == {"diary": True}
    assert recalled(b, "What about the kohlrabi soup?") == []
    assert files_containing(folder.parent, MARKER) == []


def test_a_conversation_made_anew_after_a_deletion_takes_its_own_flag(devices):
    a, b, folder = devices
    chat(a, "work", "first")
    on(a, "history", "private", "work")
    on(a, "history", "private", "work", "--off")  # its flag at version 2, shared
    for home in (a, b):
        on(home, "sync", str(folder))
    on(a, "history", "rm", "-c", "work", "--all", "--yes")
    chat(b, "work", "B keeps writing")  # before the deletion reaches B
    on(a, "sync")
    on(b, "sync")
    os.environ["MLXMEM_HOME"] = str(a)
    Store().set_private("work", create=True)  # a new private "work", flag at version 1
    chat(a, "work", "Kohlrabi salary negotiation details")
    for home in (a, b, a):
        on(home, "sync")
    assert private(a) == private(b) == {"work": True}
    assert recalled(b, "What about the kohlrabi salary?") == []


def test_a_flag_set_before_a_deletion_was_seen_does_not_bring_the_conversation_back(devices):
    a, b, folder = devices
    chat(a, "diary", f"Kohlrabi stew recipe {MARKER}")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(a, "history", "rm", "-c", "diary", "--all", "--yes")
    on(b, "history", "private", "diary")  # after A's deletion, before B saw it
    for home in (b, a, b, a):
        on(home, "sync")
    assert private(a) == private(b) == {}
    assert files_containing(folder.parent, "diary") == []


def test_a_new_conversation_after_a_deletion_is_not_made_private(devices):
    a, b, folder = devices
    chat(a, "default", "Hello there, first chat")
    for home in (a, b):
        on(home, "sync", str(folder))
    on(a, "history", "rm", "-c", "default", "--all", "--yes")
    for home in (a, b):
        on(home, "sync")
    chat(b, "default", "A new start after the deletion")
    for home in (b, a):
        on(home, "sync")
    assert private(a) == private(b) == {"default": False}


def flag(version, private_, at="2026-01-02T03:04:05", name="diary"):
    return {
        "kind": "conversation",
        "uid": conversation_uid(name),
        "name": name,
        "private": private_,
        "version": version,
        "updated_at": at,
        "device": "0b5c0a52-8e7b-4a39-9d3c-6f4a0f3f8f11",
    }


def test_the_higher_flag_version_wins_and_private_wins_a_tie(mlxmem_home):
    log = SyncLog()
    log.merge([flag(2, True)])
    assert Store().conversation("diary").private
    log.merge([flag(1, False)])  # older: ignored
    assert Store().conversation("diary").private
    log.merge([flag(2, False)])  # made beside the other: private wins
    assert Store().conversation("diary").private
    assert log.merge([flag(3, False)]).private_changes == 1
    assert not Store().conversation("diary").private
    # A conversation deleted after the change is not made again by it.
    Store().delete_conversation("diary")
    assert log.merge([flag(9, True)]).private_changes == 0
    assert [c.name for c in Store().conversations()] == []
    with pytest.raises(InputError, match="does not match its name"):
        check_record({**flag(1, True), "name": "other"})
    with pytest.raises(InputError, match="bad 'private'"):
        check_record(flag(1, "yes"))
    with pytest.raises(InputError, match="bad 'version'"):  # the column holds 32 bits
        check_record(flag(2**40, True))


def test_a_half_copied_file_is_skipped_whole_and_read_at_the_next_sync(devices):
    a, b, folder = devices
    on(b, "memory", "add", "first fact")
    on(b, "memory", "add", "second fact")
    on(b, "sync", str(folder))
    (change,) = change_files(folder)
    whole = change.read_bytes()
    change.write_bytes(whole[: len(whole) // 2 + 5])  # the sync tool is still copying it
    report = json.loads(on(a, "sync", str(folder), "--json").stdout)
    assert report["skipped"] == [str(change)]
    assert facts(a) == []  # nothing of it applied, not even its first, whole line
    change.write_bytes(whole)
    on(a, "sync")
    assert facts(a) == [("first fact", "manual"), ("second fact", "manual")]


def test_a_half_copied_file_holds_back_its_devices_other_new_files(devices):
    # The file holding a conversation's private flag is still being copied when a later file,
    # with turns written in it, is whole: the later file waits, and its turns, which carry
    # the flag themselves, are private here when they come.
    a, b, folder = devices
    os.environ["MLXMEM_HOME"] = str(b)
    Store().set_private("diary", create=True)
    chat(b, "diary", f"Kohlrabi stew recipe {MARKER}")
    on(b, "sync", str(folder))  # its first file: the flag and two turns
    chat(b, "diary", "Kohlrabi soup with my therapist")
    on(b, "sync")  # its second: two turns
    first, second = sorted(change_files(folder))
    whole = first.read_bytes()
    first.write_bytes(whole[: len(whole) // 2])
    report = sync_json(a, str(folder))
    assert report["skipped"] == [str(first)] and report["held_back"] == 1
    assert conversations(a) == [] and recalled(a, "What about the kohlrabi soup?") == []
    first.write_bytes(whole)
    assert sync_json(a)["held_back"] == 0
    assert private(a) == {"diary": True} and conversations(a) == [("diary", 4)]
    assert recalled(a, "What about the kohlrabi soup?") == []


def stream_files(folder, home):
    """`home`'s change files in the folder, oldest first."""
    return sorted((folder / "mlxmem" / "devices" / device(home)).glob("0*.jsonl*"))


@pytest.mark.parametrize("known", [False, True])
@pytest.mark.parametrize("delivery", ["half-copied", "missing"])
def test_turns_a_third_device_wrote_in_a_private_conversation_stay_private_whatever_arrives(
    tmp_path, delivery, known
):
    # B makes a conversation private; C reads that, writes in it, and does not send B's flag
    # on. A reads C's file while B's is half-copied, or not there at all: C's turns must not
    # be recallable in A's other conversations. `known`: A already held the conversation,
    # shared, so no conversation made anew can stand in for the flag.
    a, b, c = (tmp_path / name for name in "ABC")
    folder = tmp_path / "shared"
    folder.mkdir()
    if known:
        chat(b, "diary", "Hello diary")
        for home in (b, a):
            on(home, "sync", str(folder))
        assert private(a) == {"diary": False}
    os.environ["MLXMEM_HOME"] = str(b)
    Store().set_private("diary", create=True)
    on(b, "sync", str(folder))
    on(c, "sync", str(folder))
    assert private(c) == {"diary": True}
    chat(c, "diary", f"Kohlrabi soup with my therapist {MARKER}")
    on(c, "sync")
    flag_file = stream_files(folder, b)[-1]
    whole = flag_file.read_bytes()
    if delivery == "half-copied":
        flag_file.write_bytes(whole[: len(whole) // 2])
    else:
        flag_file.unlink()
    on(a, "sync", str(folder))
    assert recalled(a, "What about the kohlrabi soup?") == []
    assert private(a) == {"diary": True}
    flag_file.write_bytes(whole)  # B's file arrives: nothing changes
    on(a, "sync")
    assert recalled(a, "What about the kohlrabi soup?") == []
    assert private(a) == private(b) == private(c) == {"diary": True}


def test_a_deletion_reaches_the_next_sync_past_a_damaged_file_of_its_device(devices, monkeypatch):
    # B removes a fact; another of B's files is damaged for good. The tombstone, in a file A
    # can read, deletes the fact on A at A's next sync: deletions never wait.
    from types import SimpleNamespace

    from mlxmem.sync import run

    a, b, folder = devices
    on(b, "memory", "add", f"Allergic to {MARKER}")
    on(b, "memory", "add", "Likes tea")
    on(b, "sync", str(folder))
    on(a, "sync", str(folder))
    assert (f"Allergic to {MARKER}", "manual") in facts(a)
    on(b, "memory", "add", "Reads at night")
    on(b, "sync")  # a second file, damaged below
    on(b, "memory", "rm", "1")
    on(b, "sync")  # rewrites the first file without the fact; the tombstone in a third
    first, second, third = stream_files(folder, b)
    second.write_bytes(second.read_bytes()[:-7])
    later = time.time() + 3600
    monkeypatch.setattr(run, "time", SimpleNamespace(time=lambda: later))
    report = sync_json(a)
    assert report["damaged"] == [str(second)]
    assert report["devices"] == report["held_devices"] == 1  # B's other changes wait
    assert (f"Allergic to {MARKER}", "manual") not in facts(a)
    assert files_containing(a, MARKER) == []
    assert files_containing(folder / "mlxmem" / "devices" / device(a), MARKER) == []
    # What the person reads counts what happened: B's changes wait, but for the deletion.
    said = " ".join(on(a, "sync").output.split())
    assert "Synced with 0 of 1 other device (1 held back: see above)" in said
    assert "wait for it but for their deletions, which apply now" in said
    assert "Reading 1 other device in" in said


@pytest.mark.parametrize("passphrase", [None, "a passphrase"])
def test_a_deletion_reaches_the_next_sync_past_a_damaged_device_json(
    devices, monkeypatch, passphrase
):
    # B removes a fact; then B's device.json is damaged. B's other changes wait for B to
    # write it again, but the tombstone applies now: read whole from a plain file, or, with a
    # passphrase, unsealed with the key A remembers from B's device.json as it read it before.
    if passphrase:
        monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", passphrase)
    a, b, folder = devices
    on(b, "memory", "add", f"Allergic to {MARKER}")
    on(b, "sync", str(folder))
    on(a, "sync", str(folder))
    assert (f"Allergic to {MARKER}", "manual") in facts(a)
    on(b, "memory", "rm", "1")
    on(b, "memory", "add", "Reads at night")
    on(b, "sync")
    if passphrase:
        assert all(p.name.endswith(".enc") for p in stream_files(folder, b))
    info = folder / "mlxmem" / "devices" / device(b) / "device.json"
    info.write_text("{not json")
    said = " ".join(on(a, "sync").stderr.split())
    assert "Skipped a device" in said and "but for their deletions, which apply now" in said
    assert (f"Allergic to {MARKER}", "manual") not in facts(a)
    assert ("Reads at night", "manual") not in facts(a)  # held back with the device
    assert files_containing(a, MARKER) == []
    assert files_containing(folder / "mlxmem" / "devices" / device(a), MARKER) == []
    on(b, "sync")  # B writes its device.json again: the rest arrives
    on(a, "sync")
    assert ("Reads at night", "manual") in facts(a)


def test_one_sync_at_a_time_per_data_directory(devices):
    from mlxmem.sync.run import _sync_lock

    a, _, folder = devices
    os.environ["MLXMEM_HOME"] = str(a)
    with _sync_lock(Store()):
        assert "another mlxmem sync is running" in on(a, "sync", str(folder), code=1).output


# -- from a review: injection, clock skew, a fact of a deleted turn, a crash while sealing -------


def test_with_a_passphrase_unsealed_changes_are_refused_not_merged(devices, monkeypatch):
    a, b, folder = devices
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "passphrase")
    on(a, "memory", "add", "I keep bees")
    on(a, "sync", str(folder))
    # Someone who can write to the folder drops a plain file into A's stream.
    stream = next(p.parent for p in change_files(folder))
    planted = json.loads(json.dumps(export_fact_record(a)))
    planted.update(uid="00000000-0000-4000-8000-000000000001", text=f"Obey {MARKER}")
    (stream / "000099.jsonl").write_text(json.dumps(planted) + "\n")
    assert "unencrypted" in on(b, "sync", str(folder), code=1).output
    assert facts(b) == []


def export_fact_record(home):
    """One fact record as this device writes it (from an export)."""
    path = home.parent / f"{home.name}-export.json"
    on(home, "export", str(path))
    return next(r for r in json.loads(path.read_text())["records"] if r["kind"] == "fact")


def test_a_device_with_a_fast_clock_still_sees_the_same_order(devices, monkeypatch):
    a, b, folder = devices
    chat(a, "default", "a1")
    on(a, "sync", str(folder))
    on(b, "sync", str(folder))
    import mlxmem.memory.tables.turns as turns

    real = turns.utc_now
    monkeypatch.setattr(turns, "utc_now", lambda: real() + timedelta(hours=1))
    chat(b, "default", "b1")  # B's clock is an hour fast
    monkeypatch.setattr(turns, "utc_now", real)
    chat(a, "default", "a2")  # later in real time, earlier by the clocks
    chat(b, "default", "b2")  # after b1 on B, whatever its clock
    for home in (a, b, a):
        on(home, "sync")
    assert log(a) == log(b)
    users = [text for role, text in log(a) if role == "user"]
    assert users.index("b1") < users.index("b2") and users.index("a1") < users.index("a2")


def test_a_fact_arriving_after_its_turn_was_deleted_stays_deleted(devices):
    a, b, folder = devices
    chat(a, "default", f"My PIN is {MARKER}")
    on(a, "sync", str(folder))
    on(b, "sync", str(folder))
    turn_on_b = json.loads(on(b, "history", "show", "--json").stdout)[0]["id"]
    on(b, "history", "rm", str(turn_on_b))
    # Meanwhile A, which has not seen the deletion, notes a fact taken from that turn.
    os.environ["MLXMEM_HOME"] = str(a)
    turn = Store().turns("default")[0]
    Store().add_fact(f"The user's PIN is {MARKER}.", source="automatic", turn_id=turn.id)
    on(a, "sync")
    on(b, "sync")
    assert facts(b) == []  # deleting a turn deletes the facts taken from it, late ones too
    on(a, "sync")
    on(b, "sync")
    assert facts(a) == [] and log(a) == log(b)
    assert files_containing(folder.parent, MARKER) == []


def test_a_crash_while_sealing_leaves_twins_and_the_next_sync_keeps_the_sealed_one(
    devices, monkeypatch
):
    a, b, folder = devices
    on(a, "memory", "add", f"Code {MARKER}")
    on(a, "sync", str(folder))
    plain = next(iter(change_files(folder)))
    saved = plain.read_bytes()
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "passphrase")
    on(a, "sync")
    plain.write_bytes(saved)  # as if killed between writing the sealed file and the unlink
    before = None
    for _ in range(2):
        on(a, "sync")
        files = change_files(folder)
        assert (
            all(p.name.endswith(".enc") for p in files) and files_containing(folder, MARKER) == []
        )
        assert before is None or files == before  # the second run changes nothing
        before = files
    on(b, "sync", str(folder))
    assert facts(b) == [(f"Code {MARKER}", "manual")]


def sync_json(home, *args):
    return json.loads(on(home, "sync", *args, "--json").stdout)


def test_a_sync_reads_only_files_it_has_not_merged_and_a_lost_cursor_reads_all(devices):
    a, b, folder = devices
    on(b, "memory", "add", "first fact")
    on(b, "sync", str(folder))
    on(b, "memory", "add", "second fact")
    on(b, "sync")
    assert sync_json(a, str(folder))["read"] == 2
    again = sync_json(a)
    assert (again["read"], again["written"], again["rewritten"]) == (0, 0, 0)
    on(b, "memory", "add", "third fact")
    on(b, "sync")
    assert sync_json(a)["read"] == 1
    # An erase on B rewrites its first file: A reads it again (and the new file).
    on(b, "memory", "rm", "1")
    on(b, "sync")
    assert sync_json(a)["read"] == 2
    assert facts(a) == [("second fact", "manual"), ("third fact", "manual")]
    # A damaged cursor, or a lost one, reads everything again, and merges nothing twice.
    os.environ["MLXMEM_HOME"] = str(a)
    for damaged in ("{not json", json.dumps({"version": 1, "folder": str(folder)}), "[]"):
        SyncLog().set_sync_state(str(folder), {"sync_cursor": damaged})
        assert sync_json(a)["read"] == len(change_files(folder)) - 1  # all of B's
    assert facts(a) == [("second fact", "manual"), ("third fact", "manual")]


def test_a_deletion_once_in_the_folder_does_not_make_the_next_sync_compare_again(
    devices, monkeypatch
):
    from mlxmem.sync import run

    a, b, folder = devices
    chat(a, "travel", "Flight code")
    on(a, "sync", str(folder))
    on(a, "history", "rm", "-c", "travel", "--all", "--yes")
    planned = []
    plan_writes = run.plan_writes
    monkeypatch.setattr(run, "plan_writes", lambda *a: planned.append(1) or plan_writes(*a))
    on(a, "sync")  # writes the tombstone and notes it as in the folder
    on(a, "sync")  # nothing changed: its own files are not compared with the store again
    assert len(planned) == 1
    os.environ["MLXMEM_HOME"] = str(a)
    with Store().connect() as con:
        (published,) = con.execute(
            "SELECT published_at FROM tombstones WHERE uid = ?", [conversation_uid("travel")]
        ).fetchone()
    assert published is not None


def test_after_a_sync_with_nothing_new_local_changes_are_still_written_and_erased(devices):
    a, b, folder = devices
    on(a, "memory", "add", f"Code {MARKER}")
    on(a, "sync", str(folder))
    on(b, "memory", "add", "from b")
    on(b, "sync", str(folder))
    on(a, "sync")  # merges B's fact
    assert sync_json(a)["written"] == 0  # nothing new: the store and own files are not read
    on(a, "memory", "add", "another")
    assert sync_json(a)["written"] == 1
    on(a, "memory", "rm", "1")
    report = sync_json(a)
    assert report["rewritten"] == 1 and report["written"] == 1  # the erase and its tombstone
    assert files_containing(folder, MARKER) == []
    on(b, "sync")
    assert sorted(facts(b)) == sorted(facts(a)) == [("another", "manual"), ("from b", "manual")]


def test_an_older_sealed_file_put_back_over_a_newer_one_is_refused(devices, monkeypatch):
    a, b, folder = devices
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", "correct horse battery staple")
    on(b, "memory", "add", f"Code {MARKER}")
    on(b, "memory", "add", "kept")
    on(b, "sync", str(folder))
    (change,) = change_files(folder)
    old = change.read_bytes()
    on(a, "sync", str(folder))
    on(b, "memory", "rm", "1")
    on(b, "sync")  # rewrites the file without the fact: a higher sequence
    on(a, "sync")
    assert facts(a) == [("kept", "manual")]
    change.write_bytes(old)  # someone puts the older, validly sealed copy back
    output = on(a, "sync", code=1).output
    assert "older copy" in output and change.name in output
    assert facts(a) == [("kept", "manual")]
    on(b, "sync")  # its device rewrites it
    on(a, "sync")
    assert facts(a) == [("kept", "manual")]


def test_a_framed_file_cut_at_a_line_end_is_skipped_and_old_unframed_files_are_read(devices):
    a, b, folder = devices
    on(b, "memory", "add", "first fact")
    on(b, "memory", "add", "second fact")
    on(b, "sync", str(folder))
    (change,) = change_files(folder)
    whole = change.read_bytes()
    lines = whole.splitlines(keepends=True)
    assert json.loads(lines[0])["records"] == len(lines) - 1
    change.write_bytes(b"".join(lines[:2]))  # the frame and one whole record
    report = sync_json(a, str(folder))
    assert report["skipped"] == [str(change)] and facts(a) == []
    # A file written before the frame (format 1) is read.
    change.write_bytes(b"".join(lines[1:]))
    assert sync_json(a)["skipped"] == []
    assert facts(a) == [("first fact", "manual"), ("second fact", "manual")]
    # Its device rewrites its own old files framed.
    assert sync_json(b)["rewritten"] == 1
    assert json.loads(change.read_bytes().splitlines()[0])["records"] == len(lines) - 1


def test_a_file_unreadable_for_longer_than_a_copy_takes_is_called_damaged(devices, monkeypatch):
    from types import SimpleNamespace

    from mlxmem.sync import run

    a, b, folder = devices
    on(b, "memory", "add", "first fact")
    on(b, "sync", str(folder))
    (change,) = change_files(folder)
    change.write_bytes(change.read_bytes()[:-10])
    assert "still copying?" in on(a, "sync", str(folder)).output
    old = time.time() - 3600
    os.utime(change, (old, old))  # a sync tool may keep the source's mtime while copying
    assert "still copying?" in on(a, "sync").output
    later = time.time() + 3600
    monkeypatch.setattr(run, "time", SimpleNamespace(time=lambda: later))
    report = sync_json(a)
    assert report["damaged"] == [str(change)] == report["skipped"]
    assert "damaged" in on(a, "sync").output


def own_records(folder, home):
    """Every record in `home`'s device stream, read as the next sync would."""
    from mlxmem.sync.folder import DeviceFolder

    os.environ["MLXMEM_HOME"] = str(home)
    mine = DeviceFolder(folder, SyncLog().device()[0])
    return [r for f in mine.files() for r in mine.read(f, None).records]


def test_many_small_files_are_compacted_and_another_devices_cursor_survives(devices, monkeypatch):
    from mlxmem.sync import run

    monkeypatch.setattr(run, "COMPACT_FILES", 3)
    a, b, folder = devices
    for i in range(4):
        on(a, "memory", "add", f"fact {i}")
        on(a, "sync", str(folder))
    assert sync_json(b, str(folder))["read"] == 4
    on(a, "memory", "add", "fact 4")
    assert sync_json(a)["compacted"] == 4  # files 1-4 into one; the new change is file 5
    assert len(change_files(folder)) == 2  # 5 and 6 (B has nothing to write)
    assert sync_json(b)["read"] == 2
    assert sync_json(b)["read"] == 0
    assert facts(b) == facts(a)
    storage = json.loads(on(a, "sync", "--status", "--json").stdout)["storage"]
    assert storage["own_files"] == 2
    assert storage["own_live_bytes"] <= storage["own_bytes"] < storage["folder_bytes"]


def test_a_compaction_cut_short_is_finished_and_duplicates_nothing(devices, monkeypatch):
    from mlxmem.memory.tables import db
    from mlxmem.sync import run

    monkeypatch.setattr(run, "COMPACT_FILES", 3)
    a, b, folder = devices
    for i in range(4):
        on(a, "memory", "add", f"fact {i}")
        on(a, "sync", str(folder))

    def crash(name):
        if name == "sync:compacted":
            raise KeyboardInterrupt  # as a kill there would: the new file whole, the old ones left

    monkeypatch.setattr(db, "fault_hook", crash)
    on(a, "memory", "add", "fact 4")
    os.environ["MLXMEM_HOME"] = str(a)
    with pytest.raises(KeyboardInterrupt):
        run.sync(SyncLog(), folder)
    monkeypatch.setattr(db, "fault_hook", None)
    assert len(own_records(folder, a)) > 5  # the records twice, for now
    on(a, "sync")
    records = own_records(folder, a)
    assert sorted(r["text"] for r in records) == [f"fact {i}" for i in range(5)]
    again = sync_json(a)
    assert again["written"] == again["rewritten"] == again["compacted"] == 0
    on(b, "sync", str(folder))
    assert facts(b) == facts(a)


def test_a_record_changed_in_a_devices_own_file_is_rewritten_as_its_store_has_it(devices):
    a, _, folder = devices
    on(a, "memory", "add", "the honest fact")
    on(a, "sync", str(folder))
    (change,) = change_files(folder)
    change.write_bytes(change.read_bytes().replace(b"honest", b"forged"))
    assert sync_json(a)["rewritten"] == 1  # its files changed: compared with the store
    assert b"honest" in change.read_bytes() and b"forged" not in change.read_bytes()
    assert sync_json(a)["rewritten"] == 0


def test_a_sealed_file_written_before_the_frame_is_read_and_rewritten_framed(devices, monkeypatch):
    from mlxmem.sync.folder import DeviceFolder

    passphrase = "correct horse battery staple"
    monkeypatch.setenv("MLXMEM_SYNC_PASSPHRASE", passphrase)
    a, b, folder = devices
    on(b, "memory", "add", "sealed fact")
    on(b, "sync", str(folder))
    os.environ["MLXMEM_HOME"] = str(b)
    stream = DeviceFolder(folder, SyncLog().device()[0])
    cipher = stream.cipher(passphrase)
    (change,) = stream.files()
    aad = f"{stream.device}/{change.number}"  # what format 1 sealed under, as now
    framed = cipher.open(change.path.read_bytes(), aad)
    change.path.write_bytes(cipher.seal(framed.split(b"\n", 1)[1], aad))  # format 1: no frame
    assert sync_json(a, str(folder))["skipped"] == []
    assert facts(a) == [("sealed fact", "manual")]
    assert sync_json(b)["rewritten"] == 1
    assert cipher.open(change.path.read_bytes(), aad).startswith(b'{"format": 2')


@pytest.mark.parametrize(
    "damage",
    [
        {"name": "X", "encryption": 5},
        "just a string",
        {"name": "X", "encryption": {"cipher": "AES-256-GCM", "kdf": "scrypt", "check": "AA=="}},
        {"name": "X", "encryption": {"salt": "not base64!", "check": "AA=="}},
        "{not json",
    ],
)
def test_a_damaged_device_json_is_reported_and_the_other_devices_still_merge(tmp_path, damage):
    a, b, c = (tmp_path / name for name in "ABC")
    folder = tmp_path / "shared"
    folder.mkdir()
    on(a, "memory", "add", "From A")
    on(b, "memory", "add", "From B")
    for home in (a, b, c):
        on(home, "sync", str(folder))
    bad = folder / "mlxmem" / "devices" / device(a) / "device.json"
    bad.write_text(damage if isinstance(damage, str) else json.dumps(damage))
    result = on(c, "sync")
    assert str(bad) in result.stderr and "Skipped a device" in result.stderr
    assert "From B" in on(c, "memory", "list").stdout
    report = json.loads(on(c, "sync", "--json").stdout)
    assert [p.split(": ")[0] for p in report["bad_devices"]] == [str(bad)]
    assert "device" in json.loads(on(c, "sync", "--status", "--json").stdout)
    on(a, "sync")  # A rewrites its device.json: C reads it again
    on(c, "sync")
    assert "From A" in on(c, "memory", "list").stdout


def device(home) -> str:
    return json.loads(on(home, "sync", "--status", "--json").stdout)["device"]["device"]


def test_a_deletion_reaches_a_device_whose_clock_is_an_hour_behind(tmp_path, devices, monkeypatch):
    """A record at the writer's time limit (100 years ahead of ITS clock) made the writer's
    whole new file unreadable on a device whose clock is behind: the deletion in that file
    waited with it, and the deleted text stayed on the slow device's disk meanwhile."""
    a, b, folder = devices
    on(a, "memory", "add", "SECRET-FACT lives here")
    on(a, "sync", str(folder))
    on(b, "sync", str(folder))
    assert "SECRET-FACT" in on(b, "memory", "list", "--json").stdout

    # A imports a record at its limit (crafted, or from a device whose clock was that far on).
    path = tmp_path / "export.json"
    on(a, "export", str(path))
    document = json.loads(path.read_text())
    fact = next(r for r in document["records"] if r["kind"] == "fact")
    limit = f"{records.latest_time().isoformat()}+00:00"
    at_limit = {"text": "At the limit", "created_at": limit, "updated_at": limit}
    document["records"].append({**fact, "uid": "00000000-0000-4000-8000-000000000003", **at_limit})
    path.write_text(json.dumps(document))
    on(a, "import", str(path))
    fid = next(f["id"] for f in json.loads(on(a, "memory", "list", "--json").stdout)
               if f["text"].startswith("SECRET-FACT"))  # fmt: skip
    on(a, "memory", "rm", str(fid))
    on(a, "sync")

    real = records.latest_time
    monkeypatch.setattr(records, "latest_time", lambda: real() - timedelta(hours=1))  # B's clock
    said = on(b, "sync").output
    assert "Skipped" not in said, said
    listed = on(b, "memory", "list", "--json").stdout
    assert "SECRET-FACT" not in listed and "At the limit" in listed
    assert files_containing(b, "SECRET-FACT") == []


def test_an_import_takes_a_time_up_to_100_years_ahead_and_a_sync_reads_100_more():
    ahead = (records.latest_time() + timedelta(days=1)).isoformat() + "+00:00"
    fact = {
        "kind": "fact", "uid": "00000000-0000-4000-8000-000000000004", "text": "Ahead",
        "source": "manual", "created_at": ahead, "updated_at": ahead,
        "device": "00000000-0000-4000-8000-000000000005", "message_uid": None,
    }  # fmt: skip
    assert check_record(fact) == fact  # read from a device whose clock is a day ahead
    with pytest.raises(InputError, match="bad 'created_at'.*100 years from now"):
        check_record(fact, entering=True)
    too_far = (records.latest_time() + records.SKEW + timedelta(days=1)).isoformat()
    with pytest.raises(InputError, match="bad 'updated_at'"):
        check_record({**fact, "updated_at": too_far + "+00:00"})


@pytest.mark.parametrize(
    "info, problem",
    [
        (["a", "list"], "a list, not an object"),
        ("a string", "a string, not an object"),
        (7, "a whole number, not an object"),
        ({"encryption": 5}, "its encryption entry is a whole number, not an object"),
        ({"encryption": ["salt"]}, "its encryption entry is a list, not an object"),
    ],
)
def test_a_damaged_device_json_is_named_in_json_words(tmp_path, info, problem):
    from mlxmem.sync.folder import DeviceFolder

    folder = DeviceFolder(tmp_path, "00000000-0000-4000-8000-000000000001")
    folder.path.mkdir(parents=True)
    (folder.path / "device.json").write_text(json.dumps(info))
    assert folder.info_problem() == problem
