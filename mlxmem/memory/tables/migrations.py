"""The database schema, grown by numbered migrations that are never edited once landed, and
that call no code naming a later schema (m018 took such calls out of m008 and m017).

Each migration is a function `mNNN_name(con)`; `migrate()` applies the ones not yet recorded in
the `migrations` table, each in its own transaction, in order.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from mlxmem.memory.tables.rows import one_row
from mlxmem.memory.tables.terms import index_missing

Migration = Callable[[duckdb.DuckDBPyConnection], None]
MIGRATIONS: list[Migration] = []


def migration(func: Migration) -> Migration:
    MIGRATIONS.append(func)
    return func


def migrate(
    con: duckdb.DuckDBPyConnection, migrations: Sequence[Migration] | None = None
) -> list[str]:
    """Apply the migrations missing from `con`'s database; return the names applied."""
    migrations = MIGRATIONS if migrations is None else migrations
    if migrations and _applied_summary(con) == (len(migrations), migrations[-1].__name__):
        return []  # up to date: one cheap read on every open, which is nearly every time
    con.execute(
        "CREATE TABLE IF NOT EXISTS migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMP)"
    )
    done = {row[0] for row in con.execute("SELECT name FROM migrations").fetchall()}
    applied = []
    for func in migrations:
        if func.__name__ in done:
            continue
        con.begin()
        try:
            func(con)
            now = datetime.now(timezone.utc).replace(tzinfo=None)
            con.execute("INSERT INTO migrations VALUES (?, ?)", [func.__name__, now])
            con.commit()
        except BaseException:
            con.rollback()
            raise
        applied.append(func.__name__)
    return applied


def _applied_summary(con: duckdb.DuckDBPyConnection) -> tuple[int, str | None] | None:
    """How many migrations are recorded, and the newest name (names sort in order: m001,
    m002, ...): both must match the list to skip it, so a migration recorded out of order
    (two branches each adding one) is still applied. Checked on every open rather than
    remembered per process: another process may have replaced the file (an erase rewrites
    it) or made it anew."""
    try:
        count, newest = one_row(con.execute("SELECT count(*), max(name) FROM migrations"))
        return (count, newest)
    except duckdb.CatalogException:
        return None  # a new database


# No foreign keys: DuckDB checks them eagerly and refuses some deletes inside one transaction;
# the store keeps the references consistent itself.
@migration
def m001_initial(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE state (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL)")
    con.execute("CREATE SEQUENCE conversations_id_seq START 1")
    con.execute(
        """CREATE TABLE conversations (
            id BIGINT PRIMARY KEY DEFAULT nextval('conversations_id_seq'),
            name VARCHAR NOT NULL UNIQUE,
            created_at TIMESTAMP NOT NULL
        )"""
    )
    con.execute("CREATE SEQUENCE messages_id_seq START 1")
    con.execute(
        """CREATE TABLE messages (
            id BIGINT PRIMARY KEY DEFAULT nextval('messages_id_seq'),
            conversation_id BIGINT NOT NULL,
            seq INTEGER NOT NULL,
            role VARCHAR NOT NULL CHECK (role IN ('user', 'assistant')),
            text VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL,
            token_count INTEGER,
            interrupted BOOLEAN NOT NULL DEFAULT false,
            UNIQUE (conversation_id, seq)
        )"""
    )
    con.execute("CREATE SEQUENCE summaries_id_seq START 1")
    con.execute(
        """CREATE TABLE summaries (
            id BIGINT PRIMARY KEY DEFAULT nextval('summaries_id_seq'),
            conversation_id BIGINT NOT NULL,
            text VARCHAR NOT NULL,
            first_seq INTEGER NOT NULL,
            last_seq INTEGER NOT NULL,
            token_count INTEGER,
            created_at TIMESTAMP NOT NULL
        )"""
    )
    con.execute("CREATE SEQUENCE facts_id_seq START 1")
    con.execute(
        """CREATE TABLE facts (
            id BIGINT PRIMARY KEY DEFAULT nextval('facts_id_seq'),
            text VARCHAR NOT NULL,
            source VARCHAR NOT NULL CHECK (source IN ('manual', 'automatic')),
            created_at TIMESTAMP NOT NULL,
            updated_at TIMESTAMP NOT NULL,
            message_id BIGINT
        )"""
    )


# Benchmark runs, so that `mlxmem bench history` can compare them. The JSON columns hold JSON
# text in VARCHAR: the json extension is not needed to open the database.
@migration
def m002_bench_runs(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE SEQUENCE bench_runs_id_seq START 1")
    con.execute(
        """CREATE TABLE bench_runs (
            id BIGINT PRIMARY KEY DEFAULT nextval('bench_runs_id_seq'),
            kind VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL,
            model VARCHAR NOT NULL,
            machine VARCHAR NOT NULL,
            versions VARCHAR NOT NULL,
            settings VARCHAR NOT NULL,
            results VARCHAR NOT NULL
        )"""
    )


# The token ids a reply was sampled as, and the model that sampled them: re-tokenizing a reply
# from its text often gives other ids, and the next prompt should carry the ones the model saw
# (which its KV cache holds). Kept with the turn, so they are deleted with it.
@migration
def m003_sampled_ids(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE messages ADD COLUMN sampled_ids INTEGER[]")
    con.execute("ALTER TABLE messages ADD COLUMN sampled_by VARCHAR")


# Benchmark runs are not the person's chat data: they move to their own file beside the
# database (`bench.duckdb`, owned by mlxmem.bench). Runs recorded here before are copied there.
@migration
def m004_bench_runs_to_own_file(con: duckdb.DuckDBPyConnection) -> None:
    (count,) = one_row(con.execute("SELECT count(*) FROM bench_runs"))
    if count:
        (path,) = one_row(
            con.execute(
                "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
            )
        )
        target = str(Path(path).with_name("bench.duckdb")).replace("'", "''")
        con.execute(f"ATTACH '{target}' AS bench_file")
        con.execute("CREATE SEQUENCE IF NOT EXISTS bench_file.bench_runs_id_seq START 1")
        con.execute(
            """CREATE TABLE IF NOT EXISTS bench_file.bench_runs (
                id BIGINT PRIMARY KEY DEFAULT nextval('bench_file.bench_runs_id_seq'),
                kind VARCHAR NOT NULL,
                created_at TIMESTAMP NOT NULL,
                model VARCHAR NOT NULL,
                machine VARCHAR NOT NULL,
                versions VARCHAR NOT NULL,
                settings VARCHAR NOT NULL,
                results VARCHAR NOT NULL
            )"""
        )
        # A transaction writes to one database: copy and commit, then drop. A crash between
        # the two reruns this migration; NOT EXISTS keeps the copy from doubling.
        con.execute(
            "INSERT INTO bench_file.bench_runs (kind, created_at, model, machine, versions,"
            " settings, results) SELECT kind, created_at, model, machine, versions, settings,"
            " results FROM bench_runs b WHERE NOT EXISTS (SELECT 1 FROM bench_file.bench_runs"
            " t WHERE t.kind = b.kind AND t.created_at = b.created_at) ORDER BY id"
        )
        con.commit()
        con.execute("DETACH bench_file")
        os.chmod(Path(path).with_name("bench.duckdb"), 0o600)
        con.begin()
    con.execute("DROP TABLE bench_runs")
    con.execute("DROP SEQUENCE bench_runs_id_seq")


# Provenance and seq numbers that are never reused. `conversations.last_seq` counts the turns
# ever appended, so a deleted newest turn's number is not handed out again (a summary may still
# name it). `summaries.fact_ids` are the facts that were in the summary's prompt: deleting one
# of them invalidates the summary (and the rolling summaries built on it).
@migration
def m005_provenance(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE conversations ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0")
    con.execute(
        "UPDATE conversations c SET last_seq = coalesce((SELECT max(s) FROM (SELECT max(seq) s"
        " FROM messages m WHERE m.conversation_id = c.id UNION ALL SELECT max(last_seq) s FROM"
        " summaries u WHERE u.conversation_id = c.id)), 0)"
    )
    con.execute("ALTER TABLE summaries ADD COLUMN fact_ids BIGINT[]")


# Facts move to their own small file beside the database (`<name>.facts.duckdb`, attached to
# every connection as `facts_db`), so that erasing one rewrites the facts, not the whole log
# (DuckDB keeps deleted rows' bytes until a file is rewritten). Ids come from a counter in that
# file (a sequence default would name the attached catalog). A transaction writes to one
# database: the copy is committed first, then the old table dropped; a crash between reruns
# this, and NOT EXISTS keeps the copy from doubling. The dropped table's bytes stay in the main
# file until it is rewritten: an erase is marked pending, which the store finishes on open.
@migration
def m006_facts_own_file(con: duckdb.DuckDBPyConnection) -> None:
    attach_facts(con)
    con.execute(
        f"""CREATE TABLE IF NOT EXISTS {FACTS_DB}.facts (
            id BIGINT PRIMARY KEY,
            text VARCHAR NOT NULL,
            source VARCHAR NOT NULL CHECK (source IN ('manual', 'automatic')),
            created_at TIMESTAMP NOT NULL,
            updated_at TIMESTAMP NOT NULL,
            message_id BIGINT
        )"""
    )
    con.execute(f"CREATE TABLE IF NOT EXISTS {FACTS_DB}.fact_counter (last_id BIGINT NOT NULL)")
    con.execute(
        f"INSERT INTO {FACTS_DB}.facts SELECT id, text, source, created_at, updated_at,"
        f" message_id FROM main_facts() f WHERE NOT EXISTS (SELECT 1 FROM {FACTS_DB}.facts t"
        " WHERE t.id = f.id)".replace("main_facts()", _main_table(con, "facts"))
    )
    # The counter starts past every id the old sequence handed out, deleted ones included.
    con.execute(f"DELETE FROM {FACTS_DB}.fact_counter")
    con.execute(
        f"INSERT INTO {FACTS_DB}.fact_counter SELECT greatest(?, coalesce(max(id), 0))"
        f" FROM {FACTS_DB}.facts",
        [_sequence_value(con, "facts_id_seq")],
    )
    con.commit()
    con.begin()
    con.execute(f"DROP TABLE {_main_table(con, 'facts')}")
    con.execute("DROP SEQUENCE facts_id_seq")
    con.execute(
        "INSERT OR REPLACE INTO state VALUES ('compaction_pending', ?)",
        ['{"fact_ids": [], "main": true}'],
    )


# Sync: messages and facts get globally unique ids (random UUIDs, also the default
# for rows inserted later) beside the local integer ids the CLI shows, and the device that wrote
# them (NULL: this device). A conversation's uid is derived from its name (uuid5, see
# mlxmem.memory.sync.records), so it needs no column. The data directory gets a device id and name.
# Deletions leave tombstones: ids and a time, never text. A transaction writes to one file, so
# the facts file is changed and committed first; IF NOT EXISTS makes a rerun after a crash safe.
@migration
def m007_sync_ids(con: duckdb.DuckDBPyConnection) -> None:
    attach_facts(con)
    for table in (f"{FACTS_DB}.facts", _main_table(con, "messages")):
        con.execute(
            f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS uid VARCHAR"
            " DEFAULT (gen_random_uuid()::VARCHAR)"
        )
        con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS device_uid VARCHAR")
        if table.startswith(FACTS_DB):
            con.commit()
            con.begin()
    con.execute(
        "INSERT OR IGNORE INTO state VALUES ('device_uid', ?), ('device_name', ?)",
        [str(uuid.uuid4()), socket.gethostname() or "unknown"],
    )
    con.execute(
        """CREATE TABLE tombstones (
            uid VARCHAR PRIMARY KEY,
            kind VARCHAR NOT NULL CHECK (kind IN ('message', 'fact', 'conversation')),
            deleted_at TIMESTAMP NOT NULL,
            device_uid VARCHAR
        )"""
    )


# Recall's index: each turn's stemmed terms and length, written at insert by the store
# (mlxmem.memory.tables.terms) and deleted with the turn in the same erase. Turns already in the log
# are indexed by m018, in its transaction.
@migration
def m008_recall_index(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("CREATE TABLE recall_docs (message_id BIGINT NOT NULL, length INTEGER NOT NULL)")
    con.execute(
        "CREATE TABLE recall_terms (message_id BIGINT NOT NULL, term VARCHAR NOT NULL,"
        " tf INTEGER NOT NULL)"
    )


# Fact versions: each device increments a fact's version when it edits it,
# and sync orders a fact's edits by version, the time only breaking ties, so a device whose
# clock is slow cannot lose a later edit. Facts written before have version 0. The facts file
# is its own transaction, committed first; IF NOT EXISTS makes a rerun after a crash safe.
@migration
def m009_fact_versions(con: duckdb.DuckDBPyConnection) -> None:
    attach_facts(con)
    con.execute(f"ALTER TABLE {FACTS_DB}.facts ADD COLUMN IF NOT EXISTS version BIGINT DEFAULT 0")
    con.commit()
    con.begin()


# Facts edited before version counters existed count as version 1, as sync reads a record
# without a version (mlxmem.memory.sync.records.fact_version): an edit made before the upgrade must
# still win over the text it replaced, not look like a concurrent edit of it.
@migration
def m010_edited_facts_version_1(con: duckdb.DuckDBPyConnection) -> None:
    attach_facts(con)
    con.execute(
        f"UPDATE {FACTS_DB}.facts SET version = 1"
        " WHERE coalesce(version, 0) = 0 AND updated_at <> created_at"
    )
    con.commit()
    con.begin()


# Provenance a deletion follows across devices: the uid of the turn a fact was taken from (a
# fact may arrive before its turn, or with its turn skipped once), and the fact a conflict's
# losing text was forked from (deleting that fact deletes the fork, on every device).
@migration
def m011_fact_provenance(con: duckdb.DuckDBPyConnection) -> None:
    attach_facts(con)
    con.execute(f"ALTER TABLE {FACTS_DB}.facts ADD COLUMN IF NOT EXISTS message_uid VARCHAR")
    con.execute(f"ALTER TABLE {FACTS_DB}.facts ADD COLUMN IF NOT EXISTS fork_of VARCHAR")
    con.execute(
        f"UPDATE {FACTS_DB}.facts SET message_uid = m.uid FROM messages m"
        f" WHERE {FACTS_DB}.facts.message_id = m.id"
    )
    con.commit()
    con.begin()


# Who wrote each summary: "model" ("model+extractive" once the specifics it left out
# follow it, a later value of the same column), or "extractive" when the model's failed the check
# of mlxmem.memory.context.summary_check and a summary was extracted from the folded turns instead.
# Summaries written before stay NULL, "unknown": the fallback of that time cannot be told from a
# model's summary after the fact, and a guess would be a claim the store cannot back.
@migration
def m012_summary_source(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE summaries ADD COLUMN source VARCHAR")


@migration
def m013_private_conversations(con: duckdb.DuckDBPyConnection) -> None:
    """A private conversation's turns are never recalled into another conversation."""
    con.execute("ALTER TABLE conversations ADD COLUMN private BOOLEAN NOT NULL DEFAULT false")


# A fact's version vector (JSON: device id -> how many of its edits that device made), so that a
# sync tells an edit that descends from the version held here from one made beside it: a
# version counter alone took an edit made over a newer version than this device had seen for a
# later one, and the text edited here was lost without a fork. Facts edited before stay NULL,
# unknown: between two such versions the counters decide, as they did.
@migration
def m014_fact_clocks(con: duckdb.DuckDBPyConnection) -> None:
    attach_facts(con)
    con.execute(f"ALTER TABLE {FACTS_DB}.facts ADD COLUMN IF NOT EXISTS clock VARCHAR")
    con.commit()
    con.begin()


# A fact another replaced ("I moved to Porto" over "I live in Lisbon"): the uid of the fact that
# replaced it and when. It leaves the prompt and stays listed (`memory list --all`) until the
# person deletes it; if the replacing fact is deleted, it is current again.
@migration
def m015_fact_replacements(con: duckdb.DuckDBPyConnection) -> None:
    attach_facts(con)
    con.execute(f"ALTER TABLE {FACTS_DB}.facts ADD COLUMN IF NOT EXISTS replaced_by VARCHAR")
    con.execute(f"ALTER TABLE {FACTS_DB}.facts ADD COLUMN IF NOT EXISTS replaced_at TIMESTAMP")
    con.commit()
    con.begin()


# The private flag travels by sync as a record of its own (kind "conversation"): each change
# adds one to its version (the higher version wins on every device, whatever the clocks say;
# between two changes made beside each other, private wins), and says when and on which device
# (NULL: this one). A conversation made private before this counts as changed once, at its
# creation, so that it travels too.
@migration
def m016_private_versions(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE conversations ADD COLUMN private_version INTEGER NOT NULL DEFAULT 0")
    con.execute("ALTER TABLE conversations ADD COLUMN private_at TIMESTAMP")
    con.execute("ALTER TABLE conversations ADD COLUMN private_device VARCHAR")
    con.execute(
        "UPDATE conversations SET private_version = 1, private_at = created_at WHERE private"
    )


# Recall's vocabulary: each term's count of index rows and bounds on their turn ids, kept with
# the index at every insert and delete (memory.tables.terms), so that a search reads a few rows
# per term instead of counting the whole index (ten million rows at a million turns). The key
# makes a turn's upsert a lookup per term, not a read of every term. Counted by m018.
@migration
def m017_recall_vocabulary(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(
        "CREATE TABLE recall_vocab (term VARCHAR PRIMARY KEY, df BIGINT NOT NULL,"
        " first_id BIGINT NOT NULL, last_id BIGINT NOT NULL)"
    )


# One word for a logged message, the person's or the model's: a turn. The table and the columns
# that point at one take that name (the sync format keeps "message", which other devices read).
# A rename moves no row, so no text is left behind. DuckDB cannot rename a sequence: a new one
# starts past every id the old one handed out, deleted ones included. The facts file is its own
# transaction, committed first; the column checks make a rerun after a crash safe.
# The index of recall (m008, m017) is filled here, after the rename, by the live indexing code,
# which names the tables as they are now: a migration calls no code that names the schema of a
# later one. On a log indexed before, only the vocabulary is counted again.
@migration
def m018_turns(con: duckdb.DuckDBPyConnection) -> None:
    attach_facts(con)
    for old, new in (("message_id", "turn_id"), ("message_uid", "turn_uid")):
        if _has_column(con, FACTS_DB, "facts", old):
            con.execute(f"ALTER TABLE {FACTS_DB}.facts RENAME COLUMN {old} TO {new}")
    con.commit()
    con.begin()
    con.execute(f"ALTER TABLE {_main_table(con, 'messages')} RENAME TO turns")
    for table in ("recall_docs", "recall_terms"):
        con.execute(f"ALTER TABLE {_main_table(con, table)} RENAME COLUMN message_id TO turn_id")
    turns = _main_table(con, "turns")
    (last,) = one_row(con.execute(f"SELECT coalesce(max(id), 0) FROM {turns}"))
    start = max(last, _sequence_value(con, "messages_id_seq")) + 1
    con.execute(f"CREATE SEQUENCE turns_id_seq START {int(start)}")
    con.execute(f"ALTER TABLE {turns} ALTER COLUMN id SET DEFAULT nextval('turns_id_seq')")
    con.execute("DROP SEQUENCE messages_id_seq")
    index_missing(con)


# When this device's sync first wrote its deletion of a conversation to the sync folder: no
# other device could know of the deletion before, so the turns it wrote to that conversation
# until then were written in the conversation as it was (mlxmem.memory.sync.merge). NULL: not yet,
# or a deletion made on another device. A deletion made before this column is taken as
# published when made (the rule before it): NULL would make private every conversation of that
# name another device starts after it.
@migration
def m019_tombstones_published(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE tombstones ADD COLUMN published_at TIMESTAMP")
    con.execute(
        "UPDATE tombstones SET published_at = deleted_at"
        " WHERE kind = 'conversation' AND device_uid IS NULL"
    )


# A person's message whose look for a fact is still to come (made when the message is logged,
# cleared when the look is done): a look postponed past a Ctrl-C, a server's stop, a session
# evicted or a kill is done when the conversation is next opened, not lost. Local to this
# device: the sync format does not carry it. A deleted turn takes its mark along.
@migration
def m020_looks_due(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("ALTER TABLE turns ADD COLUMN look_due BOOLEAN DEFAULT false")


# Turns carry their conversation's private flag in the sync folder (`sharing`, records.py), but
# files an older mlxmem wrote hold turns without it, and a sync skips rewriting its own files
# while the store's digest and the files are unchanged (the sync cursor's `own` entry), which
# an upgrade leaves so. Dropping the cursor makes the next sync compare every file with the
# store and rewrite those whose turns lack the flag (it also reads the others' files again
# once: a cursor that is missing reads as empty, never a skipped change).
@migration
def m021_turn_flags_rewritten(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("DELETE FROM state WHERE key = 'sync_cursor'")


FACTS_DB = "facts_db"


def facts_path(db_path: str | Path) -> Path:
    """The facts file beside the database file: mlxmem.duckdb -> mlxmem.facts.duckdb."""
    path = Path(db_path)
    return path.with_name(f"{path.stem}.facts{path.suffix or '.duckdb'}")


def attach_facts(con: duckdb.DuckDBPyConnection) -> None:
    """Attach the facts file as FACTS_DB (once), and let unqualified names reach it after the
    main database's own."""
    names = con.execute("SELECT database_name FROM duckdb_databases()").fetchall()
    if (FACTS_DB,) in names:
        return
    (main, path) = one_row(
        con.execute(
            "SELECT database_name, path FROM duckdb_databases() WHERE database_name ="
            " current_database()"
        )
    )
    target = str(facts_path(path)).replace("'", "''")
    con.execute(f"ATTACH '{target}' AS {FACTS_DB}")
    con.execute(f"SET search_path = '{main}.main,{FACTS_DB}.main'")


def _main_table(con: duckdb.DuckDBPyConnection, name: str) -> str:
    (main,) = one_row(con.execute("SELECT current_database()"))
    return f'"{main}".main.{name}'


def _sequence_value(con: duckdb.DuckDBPyConnection, name: str) -> int:
    """The last value a sequence of the main database handed out (0 if none)."""
    row = con.execute(
        "SELECT last_value FROM duckdb_sequences() WHERE sequence_name = ? AND database_name ="
        " current_database()",
        [name],
    ).fetchone()
    return int(row[0] or 0) if row else 0


def _has_column(con: duckdb.DuckDBPyConnection, database: str, table: str, column: str) -> bool:
    row = con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE database_name = ? AND table_name = ?"
        " AND column_name = ?",
        [database, table, column],
    ).fetchone()
    return bool(row and row[0])
