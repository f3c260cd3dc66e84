"""The chat log and facts store, on a real DuckDB file in each test's own data directory."""

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest
from conftest import files_containing

from mlxmem import paths
from mlxmem.errors import InputError, NotFoundError, StaleError, StoreError
from mlxmem.memory.store import Store
from mlxmem.memory.tables.db import Database, wipe_caches
from mlxmem.memory.tables.facts import insert_fact
from mlxmem.memory.tables.migrations import MIGRATIONS, attach_facts, migrate
from mlxmem.memory.tables.turns import conversation_id, insert_turn
from mlxmem.text import utc_now

SCHEMA = {
    "migrations": [("name", "VARCHAR"), ("applied_at", "TIMESTAMP")],
    "state": [("key", "VARCHAR"), ("value", "VARCHAR")],
    "conversations": [
        ("id", "BIGINT"),
        ("name", "VARCHAR"),
        ("created_at", "TIMESTAMP"),
        ("last_seq", "INTEGER"),
        ("private", "BOOLEAN"),
        ("private_version", "INTEGER"),
        ("private_at", "TIMESTAMP"),
        ("private_device", "VARCHAR"),
    ],
    "turns": [
        ("id", "BIGINT"),
        ("conversation_id", "BIGINT"),
        ("seq", "INTEGER"),
        ("role", "VARCHAR"),
        ("text", "VARCHAR"),
        ("created_at", "TIMESTAMP"),
        ("token_count", "INTEGER"),
        ("interrupted", "BOOLEAN"),
        ("sampled_ids", "INTEGER[]"),
        ("sampled_by", "VARCHAR"),
        ("uid", "VARCHAR"),
        ("device_uid", "VARCHAR"),
        ("look_due", "BOOLEAN"),
    ],
    "summaries": [
        ("id", "BIGINT"),
        ("conversation_id", "BIGINT"),
        ("text", "VARCHAR"),
        ("first_seq", "INTEGER"),
        ("last_seq", "INTEGER"),
        ("token_count", "INTEGER"),
        ("created_at", "TIMESTAMP"),
        ("fact_ids", "BIGINT[]"),
        ("source", "VARCHAR"),
    ],
    "recall_docs": [("turn_id", "BIGINT"), ("length", "INTEGER")],
    "recall_terms": [("turn_id", "BIGINT"), ("term", "VARCHAR"), ("tf", "INTEGER")],
    "recall_vocab": [
        ("term", "VARCHAR"),
        ("df", "BIGINT"),
        ("first_id", "BIGINT"),
        ("last_id", "BIGINT"),
    ],
    "tombstones": [
        ("uid", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("deleted_at", "TIMESTAMP"),
        ("device_uid", "VARCHAR"),
        ("published_at", "TIMESTAMP"),
    ],
}
# The facts file, attached to every connection as facts_db.
FACTS_SCHEMA = {
    "fact_counter": [("last_id", "BIGINT")],
    "facts": [
        ("id", "BIGINT"),
        ("text", "VARCHAR"),
        ("source", "VARCHAR"),
        ("created_at", "TIMESTAMP"),
        ("updated_at", "TIMESTAMP"),
        ("turn_id", "BIGINT"),
        ("uid", "VARCHAR"),
        ("device_uid", "VARCHAR"),
        ("version", "BIGINT"),
        ("turn_uid", "VARCHAR"),
        ("fork_of", "VARCHAR"),
        ("clock", "VARCHAR"),
        ("replaced_by", "VARCHAR"),
        ("replaced_at", "TIMESTAMP"),
    ],
}


# What a data directory holds after a deletion: the log, its lock, and the facts file.
FILES = ["mlxmem.duckdb", "mlxmem.duckdb.lock", "mlxmem.facts.duckdb"]


def schema(con, database: str | None = None) -> dict:
    where = "current_database()" if database is None else f"'{database}'"
    rows = con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        f"WHERE database_name = {where} ORDER BY table_name, column_index"
    ).fetchall()
    tables: dict = {}
    for table, column, kind in rows:
        tables.setdefault(table, []).append((column, kind))
    return tables


def run_python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True, **kwargs
    )


# -- schema and migrations ---------------------------------------------------------------------


def test_empty_database_migrates_to_exact_schema():
    store = Store()
    with store.connect() as con:
        assert schema(con) == SCHEMA
        assert schema(con, "facts_db") == FACTS_SCHEMA
        assert con.execute("SELECT name FROM migrations ORDER BY name").fetchall() == [
            ("m001_initial",),
            ("m002_bench_runs",),
            ("m003_sampled_ids",),
            ("m004_bench_runs_to_own_file",),
            ("m005_provenance",),
            ("m006_facts_own_file",),
            ("m007_sync_ids",),
            ("m008_recall_index",),
            ("m009_fact_versions",),
            ("m010_edited_facts_version_1",),
            ("m011_fact_provenance",),
            ("m012_summary_source",),
            ("m013_private_conversations",),
            ("m014_fact_clocks",),
            ("m015_fact_replacements",),
            ("m016_private_versions",),
            ("m017_recall_vocabulary",),
            ("m018_turns",),
            ("m019_tombstones_published",),
            ("m020_looks_due",),
            ("m021_turn_flags_rewritten",),
        ]
    assert store.path == paths.db_path()


def test_reopen_is_idempotent():
    Store().add_fact("likes tea")
    store = Store()
    with store.connect() as con:
        assert con.execute("SELECT count(*) FROM migrations").fetchone() == (len(MIGRATIONS),)
        assert schema(con) == SCHEMA
    assert [f.text for f in store.facts()] == ["likes tea"]


def test_old_database_upgrades_with_a_new_migration(tmp_path):
    def m002_add_mood(con):
        con.execute("ALTER TABLE turns ADD COLUMN mood VARCHAR")

    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    assert migrate(con, MIGRATIONS[:1]) == ["m001_initial"]
    newer = [m.__name__ for m in MIGRATIONS[1:]]
    assert migrate(con, [*MIGRATIONS, m002_add_mood]) == [*newer, "m002_add_mood"]
    assert migrate(con, [*MIGRATIONS, m002_add_mood]) == []
    assert schema(con)["turns"][-1] == ("mood", "VARCHAR")
    con.close()


def test_a_conversation_deleted_before_m019_counts_as_published_when_deleted(tmp_path):
    con = duckdb.connect(str(tmp_path / "old.duckdb"))
    before = [m for m in MIGRATIONS if m.__name__ < "m019"]
    migrate(con, before)
    con.execute(
        "INSERT INTO tombstones VALUES ('c-here', 'conversation', '2026-01-02 03:04:05', NULL),"
        " ('c-there', 'conversation', '2026-01-03 00:00:00', 'other-device'),"
        " ('t-here', 'message', '2026-01-04 00:00:00', NULL)"
    )
    assert migrate(con)[0] == "m019_tombstones_published"
    rows = con.execute("SELECT uid, published_at FROM tombstones ORDER BY uid").fetchall()
    assert [(uid, str(at) if at else None) for uid, at in rows] == [
        ("c-here", "2026-01-02 03:04:05"),
        ("c-there", None),  # made on another device: not this one's to publish
        ("t-here", None),
    ]
    con.close()


def test_a_migration_recorded_out_of_order_is_still_applied(tmp_path):
    def m900_table_a(con):
        con.execute("CREATE TABLE a (x INTEGER)")

    def m901_table_b(con):
        con.execute("CREATE TABLE b (x INTEGER)")

    con = duckdb.connect(str(tmp_path / "branch.duckdb"))
    migrate(con, [*MIGRATIONS, m901_table_b])  # a branch that had only the newer one
    assert migrate(con, [*MIGRATIONS, m900_table_a, m901_table_b]) == ["m900_table_a"]
    assert migrate(con, [*MIGRATIONS, m900_table_a, m901_table_b]) == []
    con.close()


def test_summaries_record_their_source_and_older_ones_say_unknown(mlxmem_home):
    old = duckdb.connect(str(paths.db_path()))
    names = [m.__name__ for m in MIGRATIONS]
    migrate(old, MIGRATIONS[: names.index("m012_summary_source")])
    old.execute("INSERT INTO conversations (name, created_at) VALUES ('default', now())")
    old.execute(
        "INSERT INTO summaries (conversation_id, text, first_seq, last_seq, token_count,"
        " created_at, fact_ids) VALUES (1, 'written before m012', 1, 2, 4, now(), [])"
    )
    old.close()
    store = Store()
    store.add_summary("default", "by the model", 1, 4, 3)
    store.add_summary("default", "extracted", 1, 6, 1, source="extractive")
    assert [(s.text, s.source) for s in store.summaries("default")] == [
        ("written before m012", None),
        ("by the model", "model"),
        ("extracted", "extractive"),
    ]
    assert store.latest_summary("default").source == "extractive"
    with pytest.raises(InputError, match="unknown summary source 'judge'"):
        store.add_summary("default", "who?", 1, 8, 1, source="judge")


def test_benchmark_runs_move_out_of_the_chat_database(mlxmem_home):
    from mlxmem import bench

    old = duckdb.connect(str(paths.db_path()))
    migrate(old, MIGRATIONS[:3])  # a database from before the split, with two runs in it
    for kind in ("speed", "turns"):
        old.execute(
            "INSERT INTO bench_runs (kind, created_at, model, machine, versions, settings,"
            " results) VALUES (?, now(), 'm', '{}', '{}', '{}', ?)",
            [kind, f'{{"kind": "{kind}"}}'],
        )
    old.close()
    with Store().connect() as con:
        assert schema(con) == SCHEMA  # no bench_runs left among the chats
    assert [r.kind for r in bench.history()] == ["turns", "speed"]
    assert (mlxmem_home / "bench.duckdb").is_file()


# -- the chat log ------------------------------------------------------------------------------


def test_append_list_and_conversations():
    store = Store()
    first = store.append_turn("default", "user", "Hello there")
    store.append_turn("default", "assistant", "Hi!", token_count=3)
    store.append_turn("work", "user", "Standup at nine")
    assert (first.id, first.seq, first.conversation) == (1, 1, "default")
    turns = store.turns("default")
    assert [(m.seq, m.role, m.text, m.token_count) for m in turns] == [
        (1, "user", "Hello there", None),
        (2, "assistant", "Hi!", 3),
    ]
    assert turns[0] == first
    assert [m.text for m in store.turns("default", after_seq=1)] == ["Hi!"]
    assert store.turns("work")[0].seq == 1
    assert store.turns("never") == []
    assert [(c.name, c.turn_count) for c in store.conversations()] == [
        ("default", 2),
        ("work", 1),
    ]
    assert store.get_turn(3).text == "Standup at nine"


def test_token_count_interrupted_and_sampled_ids_round_trip():
    store = Store()
    m = store.append_turn(
        "default", "assistant", "A long answer that", token_count=17, interrupted=True,
        sampled_ids=[5, 6, 7], sampled_by="model-x",
    )  # fmt: skip
    got = store.get_turn(m.id)
    assert (got.token_count, got.interrupted) == (17, True)
    assert (
        (got.sampled_ids, got.sampled_by) == ((5, 6, 7), "model-x") == (m.sampled_ids, m.sampled_by)
    )
    with pytest.raises(NotFoundError):
        store.get_turn(99)


def test_search_is_case_insensitive_and_escapes_wildcards():
    store = Store()
    store.append_turn("default", "user", "I met ÄNNA at the café")
    store.append_turn("default", "user", "battery at 50%")
    store.append_turn("default", "user", "battery at 500")
    store.append_turn("other", "user", "anna again")
    store.append_turn("default", "user", "snake_case and snakeXcase")
    assert [m.text for m in store.search("änna")] == ["I met ÄNNA at the café"]
    assert [m.text for m in store.search("NNA")] == ["anna again", "I met ÄNNA at the café"]
    assert [m.text for m in store.search("anna", conversation="other")] == ["anna again"]
    assert [m.text for m in store.search("50%")] == ["battery at 50%"]
    assert [m.text for m in store.search("e_c")] == ["snake_case and snakeXcase"]
    assert len(store.search("a", limit=2)) == 2
    with pytest.raises(InputError):
        store.search("  ")


def test_invalid_input_is_rejected():
    store = Store()
    with pytest.raises(InputError, match="surrogate"):
        store.append_turn("default", "user", "bad \ud800 text")
    with pytest.raises(InputError):
        store.append_turn("default", "system", "hi")
    with pytest.raises(InputError):
        store.append_turn("default", "user", b"bytes")
    with pytest.raises(InputError):
        store.add_fact("   ")
    with pytest.raises(InputError, match="surrogate"):
        store.add_fact("\udfff")
    with pytest.raises(InputError):
        store.add_fact("x", source="guess")
    assert store.turns("default") == [] and store.facts() == []


def test_a_new_conversation_name_has_no_outer_space_and_no_control_character():
    # "work " listed as a second "work", and a name with a newline as two rows.
    store = Store()
    for name in ("work ", " work", "new\nline", "tab\there", "esc\x1b[2J"):
        with pytest.raises(InputError, match="space|control character"):
            store.append_turn(name, "user", "hi")
        with pytest.raises(InputError, match="space|control character"):
            store.set_private(name, create=True)
    assert store.conversations() == []
    # One made before the check (or on another device, by sync) is still written to.
    with store.connect() as con:
        conversation_id(con, "old ", create=utc_now())
    store.append_turn("old ", "user", "hi")
    assert [t.text for t in store.turns("old ")] == ["hi"]
    store.append_turn("Cafe\u0301 notes", "user", "unicode is fine")


def test_text_round_trips_unchanged():
    store = Store()
    text = "line one\nline two\x00 <|eot_id|> 'quotes' \"double\" 🙂\t"
    store.append_turn("default", "user", text)
    assert store.turns("default")[0].text == text


# -- summaries and deleting turns ----------------------------------------------------------------


def seed_turns(store: Store, n: int, conversation: str = "default") -> list:
    return [
        store.append_turn(conversation, "user" if i % 2 == 0 else "assistant", f"turn {i + 1}")
        for i in range(n)
    ]


def test_latest_summary():
    store = Store()
    seed_turns(store, 6)
    assert store.latest_summary("default") is None
    store.add_summary("default", "first four", 1, 4, 10)
    latest = store.add_summary("default", "first six", 1, 6, 12)
    assert store.latest_summary("default") == latest
    with pytest.raises(NotFoundError):
        store.add_summary("nope", "x", 1, 2, 1)


def test_deleting_a_turn_deletes_summaries_that_cover_it():
    store = Store()
    turns = seed_turns(store, 8)
    early = store.add_summary("default", "turns 1-4", 1, 4, 5)
    rolling = store.add_summary("default", "turns 1-6", 1, 6, 5)
    late = store.add_summary("default", "turns 7-8", 7, 8, 5)
    deletion = store.delete_turns([turns[4].id])  # seq 5
    assert [m.seq for m in deletion.turns] == [5]
    # The rolling summary saw seq 5; the later one was built on it.
    assert [s.id for s in deletion.summaries] == [rolling.id, late.id]
    assert deletion.conversations == ["default"]
    assert [s.id for s in store.summaries("default")] == [early.id]
    assert [m.seq for m in store.turns("default")] == [1, 2, 3, 4, 6, 7, 8]
    # The window now reaches back to the newest summary left: nothing is silently forgotten.
    assert [t.seq for t in store.snapshot("default").turns] == [6, 7, 8]


def test_deleting_a_fact_deletes_the_summaries_that_saw_it():
    store = Store()
    seed_turns(store, 8)
    seed_turns(store, 4, "other")
    fact, other = store.add_fact("Has a dog called Rex."), store.add_fact("Likes tea.")
    before = store.add_summary("default", "turns 1-2", 1, 2, 5, fact_ids=[other.id])
    saw = store.add_summary("default", "turns 1-4, Rex", 1, 4, 5, fact_ids=[fact.id, other.id])
    after = store.add_summary("default", "turns 1-6", 1, 6, 5, fact_ids=[other.id])
    elsewhere = store.add_summary("other", "Rex again", 1, 2, 5, fact_ids=[fact.id])
    deletion = store.delete_facts([fact.id])
    assert [f.id for f in deletion.facts] == [fact.id]
    assert {s.id for s in deletion.summaries} == {saw.id, after.id, elsewhere.id}
    assert [s.id for s in store.summaries("default")] == [before.id]
    assert store.summaries("other") == []
    store.add_summary("default", "turns 1-4", 1, 4, 5, fact_ids=[other.id])
    store.edit_fact(other.id, "Likes coffee.")  # an edit removes the old text: the same
    assert store.summaries("default") == []


def test_seq_numbers_are_never_reused():
    store = Store()
    turns = seed_turns(store, 4)
    store.add_summary("default", "1-4", 1, 4, 5)
    store.delete_turns([turns[-1].id])  # the newest turn, seq 4
    again = store.append_turn("default", "user", "a new message")
    assert again.seq == 5  # seq 4 is not handed out again


def test_a_write_derived_from_deleted_data_is_refused(mlxmem_home):
    store = Store()
    seed_turns(store, 2)
    epoch = store.snapshot("default").forget_epoch
    store.delete_conversation("default")
    with pytest.raises(StaleError):
        store.append_turn("default", "assistant", "a late reply", epoch=epoch)
    with pytest.raises(StaleError):
        store.add_fact("late fact", source="automatic", epoch=epoch)
    assert store.conversations() == [] and store.facts() == []  # nothing was recreated
    store.append_turn("default", "user", "a new start")  # a fresh message starts anew
    assert [t.seq for t in store.turns("default")] == [1]


def test_delete_range_and_conversation():
    store = Store()
    seed_turns(store, 6)
    seed_turns(store, 2, "other")
    store.add_summary("default", "1-2", 1, 2, 1)
    deletion = store.delete_turn_range("default", 2, 4)
    assert [m.seq for m in deletion.turns] == [2, 3, 4]
    assert len(deletion.summaries) == 1
    assert [m.seq for m in store.turns("default")] == [1, 5, 6]
    with pytest.raises(NotFoundError):
        store.delete_turn_range("default", 2, 4)
    with pytest.raises(InputError):
        store.delete_turn_range("default", 5, 4)
    deletion = store.delete_conversation("default")
    assert [m.seq for m in deletion.turns] == [1, 5, 6]
    assert [c.name for c in store.conversations()] == ["other"]
    with pytest.raises(NotFoundError):
        store.delete_conversation("default")


def test_delete_unknown_message_deletes_nothing():
    store = Store()
    turns = seed_turns(store, 2)
    with pytest.raises(NotFoundError):
        store.delete_turns([turns[0].id, 999])
    assert len(store.turns("default")) == 2


def test_ids_are_not_reused_after_compaction():
    store = Store()
    turns = seed_turns(store, 3)
    facts = [store.add_fact(f"fact {i}") for i in range(3)]
    store.delete_turns([turns[-1].id])
    store.delete_facts([facts[-1].id])
    assert store.append_turn("default", "user", "again").id == turns[-1].id + 1
    assert store.add_fact("again").id == facts[-1].id + 1


# -- facts ------------------------------------------------------------------------------------


def test_facts_add_edit_delete_clear():
    store = Store()
    turn = store.append_turn("default", "user", "My sister Anna visits on Sundays.")
    manual = store.add_fact("  Likes green tea.  ")
    auto = store.add_fact("Sister: Anna", source="automatic", turn_id=turn.id)
    assert manual.text == "Likes green tea." and manual.source == "manual"
    assert store.facts() == [manual, auto]
    edited = store.edit_fact(manual.id, "Likes black tea.")
    assert edited.text == "Likes black tea." and edited.updated_at >= manual.updated_at
    assert edited.created_at == manual.created_at
    deletion = store.delete_turns([turn.id])
    assert deletion.facts == [auto]  # a fact taken from a turn goes with it
    with pytest.raises(NotFoundError):
        store.delete_facts([auto.id])
    with pytest.raises(NotFoundError):
        store.edit_fact(auto.id, "x")
    with pytest.raises(NotFoundError):
        store.add_fact("from nowhere", turn_id=12345)
    store.add_fact("auto one", source="automatic")
    assert len(store.clear_facts(source="automatic").facts) == 1
    assert [f.text for f in store.facts()] == ["Likes black tea."]
    assert len(store.clear_facts().facts) == 1 and store.facts() == []


# -- deleted means gone ---------------------------------------------------------------------


def test_deleted_text_is_in_no_file(mlxmem_home):
    store = Store()
    # Enough rows that the markers land in checkpointed blocks, not just the WAL.
    seed_turns(store, 40)
    turn = store.append_turn("default", "user", "my secret is MARKER-TURN-7f3a")
    seed_turns(store, 5)
    store.add_summary("default", "they said MARKER-SUMMARY-7f3a", 1, turn.seq, 9)
    fact = store.add_fact("MARKER-FACT-7f3a is the pin")
    edited = store.add_fact("old MARKER-EDIT-7f3a text")
    (paths.cache_dir() / "chat.safetensors").write_bytes(b"kv MARKER-TURN-7f3a")
    markers = ["MARKER-TURN-7f3a", "MARKER-SUMMARY-7f3a", "MARKER-FACT-7f3a", "MARKER-EDIT-7f3a"]
    assert files_containing(mlxmem_home, "MARKER-FACT-7f3a") == [store.facts_path]  # not vacuous

    store.delete_turns([turn.id])
    store.delete_facts([fact.id])
    store.edit_fact(edited.id, "new text")  # each deletion wipes the caches itself

    for marker in markers:
        assert files_containing(mlxmem_home, marker) == [], marker
    assert len(store.turns("default")) == 45
    assert store.get_fact(edited.id).text == "new text"


def test_whole_conversation_and_cleared_facts_leave_no_bytes(mlxmem_home):
    store = Store()
    store.append_turn("diary", "user", "MARKER-DIARY-91c2")
    store.add_fact("MARKER-CLEAR-91c2")
    store.delete_conversation("diary")
    store.clear_facts()
    assert files_containing(mlxmem_home, "MARKER-DIARY-91c2") == []
    assert files_containing(mlxmem_home, "MARKER-CLEAR-91c2") == []


def test_erasing_a_fact_rewrites_the_facts_file_not_the_log(mlxmem_home):
    """The facts live in their own small file: erasing one leaves no byte of it anywhere, and
    the log's file is rewritten only when a summary derived from the fact goes too."""
    store = Store()
    seed_turns(store, 40)
    fact = store.add_fact("MARKER-SPLIT-a1 is the pin")
    seen = store.add_fact("MARKER-SPLIT-b2 is the door code")
    store.add_summary("default", "a summary written with the facts", 1, 10, 5, [seen.id])
    assert files_containing(mlxmem_home, "MARKER-SPLIT-a1") == [store.facts_path]
    log = store.path.stat().st_ino

    store.delete_facts([fact.id])
    assert files_containing(mlxmem_home, "MARKER-SPLIT-a1") == []
    assert store.path.stat().st_ino == log  # the log was not copied
    assert store.facts_path.stat().st_ino != log

    deletion = store.delete_facts([seen.id])
    assert [s.fact_ids for s in deletion.summaries] == [(seen.id,)]
    assert files_containing(mlxmem_home, "MARKER-SPLIT-b2") == []
    assert store.path.stat().st_ino != log  # the summary's bytes went with a rewrite
    with store.connect() as con:
        assert con.execute(
            "SELECT count(*) FROM state WHERE key = 'compaction_pending'"
        ).fetchone() == (0,)
    assert [f.id for f in [store.add_fact("next")]] == [seen.id + 1]  # ids never come back


def test_facts_move_out_of_an_old_database(mlxmem_home):
    old = duckdb.connect(str(paths.db_path()))
    migrate(old, MIGRATIONS[:5])  # a database from before the facts file
    for text in ("MARKER-OLD-c3 likes tea", "likes walks"):
        old.execute(
            "INSERT INTO facts (text, source, created_at, updated_at) VALUES (?, 'manual',"
            " now(), now())",
            [text],
        )
    old.execute("DELETE FROM facts WHERE text = 'likes walks'")
    old.close()
    store = Store()
    assert [(f.id, f.text) for f in store.facts()] == [(1, "MARKER-OLD-c3 likes tea")]
    # The old table's bytes left the log's file: the fact is in the facts file only.
    assert files_containing(mlxmem_home, "MARKER-OLD-c3") == [store.facts_path]
    assert store.add_fact("new").id == 3  # past every id the old sequence handed out
    with store.connect() as con:
        assert schema(con) == SCHEMA


def test_an_old_log_of_messages_becomes_a_log_of_turns(mlxmem_home):
    mlxmem_home.mkdir(mode=0o700)
    old = duckdb.connect(str(paths.db_path()))
    attach_facts(old)
    names = [m.__name__ for m in MIGRATIONS]
    migrate(old, MIGRATIONS[: names.index("m018_turns")])
    old.execute("INSERT INTO conversations (name, created_at, last_seq) VALUES ('a', now(), 3)")
    for seq, text in enumerate(["I keep bees", "Bees are busy", "deleted later"], start=1):
        old.execute(
            "INSERT INTO messages (conversation_id, seq, role, text, created_at) VALUES"
            " (1, ?, ?, ?, now())",
            [seq, "user" if seq % 2 else "assistant", text],
        )
    old.execute("DELETE FROM messages WHERE seq = 3")  # id 3 was handed out: never again
    old.execute("INSERT INTO recall_docs SELECT id, 3 FROM messages")
    old.execute(
        "INSERT INTO facts VALUES (1, 'keeps bees', 'automatic', now(), now(), 1, 'f-1', NULL,"
        " 0, (SELECT uid FROM messages WHERE id = 1), NULL, NULL, NULL, NULL)"
    )
    old.close()
    store = Store()
    with store.connect() as con:
        assert schema(con) == SCHEMA and schema(con, "facts_db") == FACTS_SCHEMA
        (turn_uid,) = con.execute("SELECT uid FROM turns WHERE id = 1").fetchone()
        assert con.execute("SELECT turn_uid FROM facts").fetchone() == (turn_uid,)
        assert con.execute("SELECT turn_id FROM recall_docs ORDER BY 1").fetchall() == [(1,), (2,)]
    assert [t.text for t in store.turns("a")] == ["I keep bees", "Bees are busy"]
    assert store.facts()[0].turn_id == 1
    assert store.append_turn("a", "user", "new").id == 4


def test_interrupted_compaction_is_finished_at_next_open(mlxmem_home):
    store = Store()
    store.add_fact("MARKER-CRASH-55aa")
    with store.connect() as con:  # enough rows that the marker's block outlives the delete
        for i in range(300):
            insert_fact(con, f"filler fact {i} " * 5, "manual")
    # As if the process died after committing the delete, mid-way through writing the copy.
    # A transaction writes to one file: the facts file's delete, then the main file's record.
    with store.connect() as con:
        con.execute("DELETE FROM facts WHERE text LIKE 'MARKER%'")
    with store.connect() as con:
        con.execute("INSERT INTO state VALUES ('compaction_pending', '1')")
    Path(f"{store.path}.compact").write_bytes(b"half-written garbage")
    Path(f"{store.facts_path}.compact").write_bytes(b"half-written garbage")
    assert files_containing(mlxmem_home, "MARKER-CRASH-55aa") == [store.facts_path]

    reopened = Store()
    assert files_containing(mlxmem_home, "MARKER-CRASH-55aa") == []
    with reopened.connect() as con:
        assert con.execute("SELECT * FROM state WHERE key = 'compaction_pending'").fetchall() == []
    assert sorted(p.name for p in mlxmem_home.iterdir()) == FILES


def test_wipe_caches_empties_the_cache_dir():
    cache = paths.cache_dir()
    (cache / "chat.safetensors").write_bytes(b"x")
    (cache / "old").mkdir()
    (cache / "old" / "facts.safetensors").write_bytes(b"y")
    assert wipe_caches(cache) == 2
    assert list(cache.iterdir()) == []


def test_an_erase_cut_short_is_finished_by_the_next_open(mlxmem_home, monkeypatch):
    store = Store()
    seed_turns(store, 40)
    fact = store.add_fact("MARKER-CRASH-51c2 is the code")
    with monkeypatch.context() as m:
        # The process dies after the delete committed, before caches and old bytes are gone.
        die = lambda self, *args: (_ for _ in ()).throw(SystemExit(9))  # noqa: E731
        m.setattr(Database, "_erase_locked", die)
        with pytest.raises(SystemExit):
            store.delete_facts([fact.id])
        (paths.cache_dir() / "chat.safetensors").write_bytes(b"kv MARKER-CRASH-51c2")
        assert files_containing(mlxmem_home, "MARKER-CRASH-51c2") != []
    Store()  # any command's next open
    assert files_containing(mlxmem_home, "MARKER-CRASH-51c2") == []


# -- files, permissions, locking ---------------------------------------------------------------


def test_files_are_private_and_no_temp_file_remains(mlxmem_home):
    store = Store()
    store.add_fact("x")
    store.delete_facts([1])
    assert stat.S_IMODE(mlxmem_home.stat().st_mode) == 0o700
    names = sorted(p.name for p in mlxmem_home.iterdir())
    assert names == FILES
    for name in names:
        assert stat.S_IMODE((mlxmem_home / name).stat().st_mode) == 0o600, name


def test_corrupt_file_is_reported_and_left_alone():
    path = paths.db_path()
    garbage = os.urandom(4096)
    path.write_bytes(garbage)
    with pytest.raises(StoreError, match="not a DuckDB database") as info:
        Store()
    assert str(path) in str(info.value)
    assert path.read_bytes() == garbage


def test_a_missing_facts_file_is_reported_and_the_log_left_alone():
    store = Store()
    store.append_turn("default", "user", "hello")
    store.add_fact("Likes tea.")
    store.facts_path.unlink()
    log = store.path.read_bytes()
    for _ in range(2):  # no empty stand-in is left for the next open to take for the real one
        with pytest.raises(StoreError, match="facts file .* is missing"):
            store.facts()
        assert not store.facts_path.exists()
    assert store.path.read_bytes() == log


def test_a_log_cut_short_is_an_error_not_a_traceback():
    store = Store()
    with store.connect() as con:  # enough turns that a query reads blocks the open did not
        for i in range(1500):
            insert_turn(con, "default", "user", f"turn {i} " * 30)
    with open(store.path, "r+b") as f:
        f.truncate(store.path.stat().st_size // 2)
    with pytest.raises(StoreError, match="cannot read the database"):
        store.turns("default")


def test_two_processes_append_and_delete_at_the_same_time(mlxmem_home):
    Store()  # create the schema once, so both workers start on equal terms
    worker = """
        import json, os, sys, time
        from mlxmem.memory.store import Store
        name, go = sys.argv[1], sys.argv[2]
        store = Store(timeout=60)
        print("ready", flush=True)
        while not os.path.exists(go):  # start both loops at the same moment
            time.sleep(0.01)
        kept, facts = [], []
        for i in range(18):
            m = store.append_turn(name, "user", f"{name} {i}")
            f = store.add_fact(f"{name} fact {i}")
            if i % 3 == 2:
                store.delete_turns([m.id])
                store.delete_facts([f.id])
            else:
                kept.append(m.text)
                facts.append(f.text)
        print(json.dumps([kept, facts]))
    """
    go = mlxmem_home.parent / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(worker), name, str(go)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("alpha", "beta")
    ]
    assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
    go.touch()
    results = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    store = Store()
    for name, (kept, _) in zip(("alpha", "beta"), results, strict=True):
        assert len(kept) == 12
        assert [m.text for m in store.turns(name)] == kept
    all_facts = sorted(f.text for f in store.facts())
    assert all_facts == sorted(results[0][1] + results[1][1])


def test_lock_held_by_another_process_times_out_with_its_pid():
    Store()
    holder = run_python(
        """
        import sys, time
        from mlxmem.memory.store import Store
        with Store().connect():
            print("ready", flush=True)
            time.sleep(30)
        """
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match=f"in use by another process \\(pid {holder.pid}\\)"):
            Store(timeout=0.3)
    finally:
        holder.kill()
        holder.wait()
    assert Store().facts() == []  # usable again once the holder is gone


def test_database_held_open_by_another_program_times_out():
    Store()
    holder = run_python(
        f"""
        import duckdb, time
        con = duckdb.connect({str(paths.db_path())!r})
        print("ready", flush=True)
        time.sleep(30)
        """
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreError, match=f"pid {holder.pid}"):
            Store(timeout=0.3).facts()
    finally:
        holder.kill()
        holder.wait()


def test_nested_use_in_one_process_is_reported():
    store = Store(timeout=0.2)
    with store.connect():
        with pytest.raises(StoreError, match="already open in this process"):
            store.facts()


def test_an_existing_shared_data_directory_keeps_its_mode(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    monkeypatch.setenv("MLXMEM_HOME", str(shared))
    with pytest.warns(UserWarning, match="can be read by other users"):
        store = Store()
    store.add_fact("likes tea")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755  # not locked by mlxmem
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600  # what mlxmem made is private
