"""`mlxmem export` and `mlxmem import`: the whole log, the facts and the tombstones in one JSON
file (for a backup, or for leaving), merged back by uid with the same rules as a sync."""

from __future__ import annotations

import json
import os
from pathlib import Path

from mlxmem.errors import InputError, MlxmemError
from mlxmem.memory.sync.merge import MergeResult
from mlxmem.memory.sync.records import Record, check_record, iso
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.sync.folder import write_private
from mlxmem.text import to_db, utc_now

EXPORT_FORMAT = "mlxmem-export"
EXPORT_VERSION = 1


def export_to(log: SyncLog, path: Path) -> list[Record]:
    """Write every turn, every fact and every tombstone (ids and times) to `path`, readable by
    its owner only; return the records written."""
    device, name = log.device()
    records = log.changes()
    document = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": iso(to_db(utc_now())),
        "device": device,
        "device_name": name,
        "records": records,
    }
    data = json.dumps(document, ensure_ascii=False, indent=1).encode("utf-8")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write_private(tmp, data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {exc}") from None
    return records


def read_export(path: Path) -> list[Record]:
    """The records of an export file, every one checked: InputError (naming the problem) for a
    file that is not a whole, well-formed export, before anything is applied."""
    try:
        document = json.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path} is not an mlxmem export (not JSON: {exc})") from None
    except RecursionError:  # json nests one Python call per level
        raise InputError(f"{path} is not an mlxmem export (JSON nested too deep)") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise InputError(f"{path} is not an mlxmem export (no 'format': '{EXPORT_FORMAT}')")
    if document.get("version") != EXPORT_VERSION:
        raise InputError(
            f"{path} is export version {document.get('version')!r}; this mlxmem reads version "
            f"{EXPORT_VERSION}"
        )
    records = document.get("records")
    if not isinstance(records, list):
        raise InputError(f"{path} has no list of records")
    for i, record in enumerate(records):
        try:
            check_record(record, entering=True)
        except MlxmemError as exc:
            raise InputError(f"{path}: record {i + 1}: {exc}; nothing was imported") from None
    return records


def import_from(log: SyncLog, path: Path) -> MergeResult:
    """Merge an export file into the store by uid, as a sync merges another device's changes."""
    return log.merge(read_export(path))
