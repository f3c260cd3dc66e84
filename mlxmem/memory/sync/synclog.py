"""The database's side of a sync: `SyncLog` reads and writes what `mlxmem.sync` and the export
need, over the same DuckDB file a `Store` uses: this device's id, every row as sync records, the
merge of other devices' records (mlxmem.memory.sync.merge), and the sync's small state (the folder,
read cursors) with a digest that says whether this device's stream can have changed.
"""

from __future__ import annotations

from collections.abc import Collection

import duckdb

from mlxmem.memory.sync.merge import MergeResult, merge_records
from mlxmem.memory.sync.records import Record, local_records
from mlxmem.memory.tables import tombstones
from mlxmem.memory.tables.db import Database, set_state
from mlxmem.memory.tables.rows import device_of, one_row

SYNC_DIR_KEY = "sync_dir"  # the folder the last sync used, in `state`


class SyncLog(Database):
    """The sync's view of the DuckDB file at `path` (default: paths.db_path())."""

    _device: tuple[str, str] | None = None

    def device(self) -> tuple[str, str]:
        """This data directory's device id and name (fixed when the file was created)."""
        if self._device is None:
            with self.connect() as con:
                self._device = device_of(con)
        return self._device

    def changes(self) -> list[Record]:
        """Everything the file holds as sync records: every turn, every fact's current
        version, every tombstone and every private flag ever set, the rows written here named
        as this device's."""
        device, _ = self.device()
        with self.connect() as con:
            return local_records(con, device)

    def merge(self, records: list[Record]) -> MergeResult:
        """Merge another device's records (or an export's) by uid: see mlxmem.memory.sync.merge."""
        return merge_records(self, records, self.device()[0])

    def published(self, uids: Collection[str]) -> None:
        """This device's deletions of the conversations `uids` are in the sync folder (noted
        the first time only): from now on another device can know of them (m019). The
        column is this device's own, outside the records and the changes digest."""
        if not uids:
            return
        with self.connect() as con:
            tombstones.mark_published(con, uids)

    def sync_dir(self) -> str | None:
        """The sync folder the last sync used, if any."""
        with self.connect() as con:
            row = con.execute("SELECT value FROM state WHERE key = ?", [SYNC_DIR_KEY]).fetchone()
        return None if row is None else row[0]

    def sync_state(self, others: Collection[str]) -> tuple[dict[str, str], str]:
        """In one open: the sync's small values kept in `state` (keys starting with "sync_":
        the folder, read cursors), and changes_digest(others) as of now."""
        with self.connect() as con:
            rows = con.execute("SELECT key, value FROM state WHERE starts_with(key, 'sync_')")
            return dict(rows.fetchall()), _changes_digest(con, list(others))

    def set_sync_state(self, folder: str, values: dict[str, str]) -> None:
        """Keep the folder this sync used and the sync's small values (keys starting with
        "sync_") in one transaction."""
        if any(not key.startswith("sync_") for key in values):
            raise ValueError("sync state keys start with 'sync_'")
        with self.connect() as con:
            for key, value in {SYNC_DIR_KEY: folder, **values}.items():
                set_state(con, key, value)

    def changes_digest(self, others: Collection[str]) -> str:
        """A fingerprint of what decides this device's own sync stream: the turns it writes
        (its own, and those of devices not in `others`), every fact as stored, every tombstone
        and every private flag ever set. While it is unchanged, the stream has nothing to gain
        or lose: a turn of a device in `others` merged in leaves it as it was, and every
        deletion, fact edit or flag change changes it (a deletion adds a tombstone). Whether a
        record's device is in `others` is part of it, so the same digest under other `others`
        means the same stream."""
        with self.connect() as con:
            return _changes_digest(con, list(others))


def _changes_digest(con: duckdb.DuckDBPyConnection, others: list[str]) -> str:
    # list_contains(list, NULL) is NULL for a list with items and false for an empty one: a
    # row written here (device NULL) must hash alike under both.
    (digest,) = one_row(
        con.execute(
            "SELECT concat_ws(':',"
            " (SELECT count(*) || '/' || coalesce(bit_xor(hash(uid, device_uid)), 0) FROM turns"
            "  WHERE device_uid IS NULL OR NOT list_contains($1::VARCHAR[], device_uid)),"
            " (SELECT count(*) || '/' || coalesce(bit_xor(hash(f, coalesce(list_contains("
            "  $1::VARCHAR[], device_uid), false))), 0) FROM facts f),"
            " (SELECT count(*) || '/' || coalesce(bit_xor(hash(uid, kind, deleted_at, device_uid,"
            "  coalesce(list_contains($1::VARCHAR[], device_uid), false))), 0) FROM tombstones),"
            " (SELECT count(*) || '/' || coalesce(bit_xor(hash(name, private, private_version,"
            "  private_at, coalesce(list_contains($1::VARCHAR[], private_device), false))), 0)"
            "  FROM conversations WHERE private_version > 0))",
            [others],
        )
    )
    return digest
