"""`mlxmem sync`: merge the other devices' changes from the sync folder, then write this
device's own. See mlxmem.sync.folder for the folder's layout and mlxmem.memory.sync.merge for
the rules; docs/sync.md for what it means for the person.

A sync, in order (each step can be cut short; the next sync finishes it):
1. read the other devices' streams: the files the read cursor has not seen merged (a file
   that cannot be read whole is skipped this time, and its device's other new files wait for
   it, all but their tombstones; one older than a version already read is refused, and
   nothing is merged);
2. merge them into the store: tombstones (through the erase path), messages, facts;
3. erase in the folder: rewrite this device's files without the records that are no longer
   live here (a deleted turn or fact, a fact's superseded version);
4. write what the folder lacks of this device's changes into one new file;
5. record the sync time in this device's device.json, and the cursor in the database.
Only step 4's file adds anything, and it holds only what no file held, so a second sync finds
nothing to merge and nothing to write. Steps 3 and 4 read the whole store and this device's
files, unless the cursor shows that neither changed since the last sync (mlxmem.sync.cursor).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlxmem.errors import InputError, StoreError
from mlxmem.memory.sync.merge import MergeResult
from mlxmem.memory.sync.records import Record, iso, timestamp, version
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.memory.tables.db import crash_point, open_lock_file
from mlxmem.paths import fsync_path
from mlxmem.sync.crypto import Cipher
from mlxmem.sync.cursor import (
    CURSOR_KEY,
    SEQUENCES_KEY,
    Cursor,
    Sequences,
    next_sequence,
    own_state,
)
from mlxmem.sync.folder import DEVICE_INFO, ChangeFile, DeviceFolder, device_folders
from mlxmem.text import OLD_COUNT_NAMES, plural, to_db, utc_now, with_old_names

# A file unreadable for longer than a sync tool takes to copy one is damaged or tampered with,
# not still arriving.
COPY_GRACE_S = 15 * 60
# Compaction: a stream of more than COMPACT_FILES files (each sync adds one) has its files
# under COMPACT_SMALL_BYTES merged into one new file; big files stay, so another device
# rereads only the small ones' records.
COMPACT_FILES = 32
COMPACT_SMALL_BYTES = 4 << 20

Progress = Callable[[str], None]


@dataclass
class SyncReport:
    folder: str
    device: str
    devices: int  # other devices read
    merged: MergeResult
    written: int  # records written to a new file
    rewritten: int  # own files rewritten to erase records
    skipped: list[str] = field(default_factory=list)  # files that could not be read whole
    damaged: list[str] = field(default_factory=list)  # of those, the ones unreadable for long
    read: int = 0  # other devices' files read (the rest were merged before, unchanged since)
    compacted: int = 0  # own files merged into one
    # Other devices whose device.json is damaged ("path: what is wrong"): none of their
    # changes were read; the next sync retries.
    bad_devices: list[str] = field(default_factory=list)
    # Files read whole but not merged (but for their tombstones), as another new file of their
    # device was not (skipped).
    held_back: int = 0
    # Other devices whose new changes wait (a file skipped, or device.json damaged): `devices`
    # less these is how many were synced with.
    held_devices: int = 0


@dataclass(frozen=True)
class Plan:
    """What this device would write: files to rewrite (with the records they keep) and the
    records that go into a new file."""

    rewrites: dict[Path, tuple[ChangeFile, list[Record]]]
    new: list[Record]
    sequence: int = 0  # the highest sequence among this device's files
    kept: list[tuple[ChangeFile, list[Record]]] = field(default_factory=list)  # every file


@dataclass
class Reading:
    """What read_streams found: the records to merge, the files skipped, and the cursor and
    sequences to save once they are merged."""

    records: list[Record]
    skipped: list[str]
    damaged: list[str]
    read: int
    streams: dict[str, dict[str, list[int]]]
    bad_devices: list[str] = field(default_factory=list)  # "path: what is wrong", skipped
    held_back: int = 0  # files read whole but not merged: another of their device's was not
    held_devices: int = 0  # devices with a file skipped, or a damaged device.json
    keys: dict[str, dict] = field(default_factory=dict)  # Cursor.keys, to save


def sync(
    log: SyncLog,
    root: Path | None = None,
    passphrase: str | None = None,
    progress: Progress = lambda _: None,
) -> SyncReport:
    """One sync of `store` with the folder `root` (default: the last one used)."""
    root = sync_root(log, root)
    device, name = log.device()
    with _sync_lock(log):
        mine = DeviceFolder(root, device)
        others = [f for f in device_folders(root) if f.device != device]
        names = {f.device for f in others}
        state, digest = log.sync_state(names)
        cursor = Cursor.load(state.get(CURSOR_KEY), str(root))
        sequences = Sequences.load(state.get(SEQUENCES_KEY))
        progress(f"Reading {plural(len(others), 'other device')} in {root}")
        # Reading the others first checks the passphrase against their keys before anything
        # is written: a mistyped one must not become this device's key. A device with no key
        # yet checks it against every sealed stream, read before or not.
        check = bool(passphrase) and not mine.info().get("encryption")
        reading = read_streams(others, passphrase, cursor, sequences, check_key=check)
        cipher = _own_cipher(mine, name, passphrase, cursor.keys.get(device))
        mine.remove_temp_files()
        mine.remove_superseded(encrypted=cipher is not None)
        crash_point("sync:read")
        merged = MergeResult()
        if reading.records:
            progress(f"Merging {plural(len(reading.records), 'record')}")
            merged = log.merge(reading.records)
            digest = log.changes_digest(names)  # before plan_writes reads the changes
        encrypted = cipher is not None
        if cursor.own_unchanged(digest, encrypted, _identities(mine)):
            plan = Plan({}, [])
        else:
            plan = plan_writes(log, mine, cipher, names)
        sequence = max(plan.sequence, sequences.written(device))
        for file, keep in plan.rewrites.values():
            sequence = next_sequence(sequence)
            mine.write(file.number, keep, cipher, sequence)
            sequences.note(device, file.number, sequence)
            if file.encrypted != encrypted:
                file.path.unlink(missing_ok=True)  # replaced by the other kind's name
        crash_point("sync:rewritten")
        if plan.new:
            progress(f"Writing {plural(len(plan.new), 'change')}")
            number, sequence = _next_number(mine), next_sequence(sequence)
            mine.write(number, plan.new, cipher, sequence)
            sequences.note(device, number, sequence)
        crash_point("sync:written")
        in_folder = [r for _, keep in plan.kept for r in keep] + plan.new
        log.published(
            [r["uid"] for r in in_folder if r["kind"] == "tombstone" and r["of"] == "conversation"]
        )
        compacted = _compact(mine, plan, cipher, sequence, sequences)
        _write_info(mine, name, cipher, last_sync=iso(to_db(utc_now())))
        cursor.streams, cursor.keys = reading.streams, reading.keys
        if cipher is not None:
            cursor.keys[device] = mine.info()["encryption"]
        cursor.own = own_state(digest, encrypted, _identities(mine))
        log.set_sync_state(
            str(root), {CURSOR_KEY: cursor.dumps(), SEQUENCES_KEY: sequences.dumps()}
        )
    return SyncReport(
        str(root),
        device,
        len(others),
        merged,
        len(plan.new),
        len(plan.rewrites),
        reading.skipped,
        reading.damaged,
        reading.read,
        compacted,
        reading.bad_devices,
        reading.held_back,
        reading.held_devices,
    )


def status(log: SyncLog, root: Path | None = None, passphrase: str | None = None) -> dict:
    """The devices seen in the folder, their last sync, and this device's pending changes."""
    root = sync_root(log, root, create=False)
    device, name = log.device()
    mine = DeviceFolder(root, device)
    folders = device_folders(root)
    if mine.path.is_dir() and device not in [f.device for f in folders]:
        folders.append(mine)
    plan = plan_writes(
        log, mine, mine.cipher(passphrase), {f.device for f in folders if f.device != device}
    )
    devices = []
    for folder in folders:
        info = folder.info()
        devices.append(
            {
                "device": folder.device,
                "name": _text(info.get("name")) or "?",
                "this_device": folder.device == device,
                "last_sync": _time(info.get("last_sync")),
                "files": len(folder.files()),
                "encrypted": bool(info.get("encryption")),
            }
        )
    kinds = [r["kind"] for r in plan.new]
    live = [r for _, keep in plan.kept for r in keep] + plan.new
    storage = {
        "folder_bytes": sum(p.stat().st_size for p in (root / "mlxmem").rglob("*") if p.is_file()),
        "own_files": len(plan.kept),
        "own_bytes": sum((f.identity() or [0])[0] for f, _ in plan.kept),
        "own_live_bytes": sum(len(json.dumps(r, ensure_ascii=False).encode()) + 1 for r in live),
    }
    return {
        "folder": str(root),
        "device": {"device": device, "name": name},
        "devices": devices,
        "pending": with_old_names(
            {
                "turns": kinds.count("message"),  # the sync format's name for a turn
                "facts": kinds.count("fact"),
                "tombstones": kinds.count("tombstone"),
                "conversations": kinds.count("conversation"),
                "files_to_rewrite": len(plan.rewrites),
            },
            OLD_COUNT_NAMES,
        ),
        "storage": storage,
    }


def read_streams(
    folders: list[DeviceFolder],
    passphrase: str | None,
    cursor: Cursor | None = None,
    sequences: Sequences | None = None,
    check_key: bool = False,
) -> Reading:
    """The records of these device streams that `cursor` has not seen merged (all, without
    one), the files skipped as unreadable, and the cursor's streams once they are merged.
    `sequences` (updated here) refuses a file older than one read before. `check_key`: derive
    every sealed stream's key, read or not (a wrong passphrase fails here)."""
    cursor = cursor or Cursor("")
    sequences = sequences if sequences is not None else Sequences()
    reading = Reading([], [], [], 0, {})
    for folder in folders:
        problem = folder.info_problem()
        if problem is not None:
            reading.bad_devices.append(f"{folder.path / DEVICE_INFO}: {problem}")
            reading.held_devices += 1
            # Its changes wait for the device to write its device.json again, but not its
            # deletions, where they can be read: plain files and no passphrase; with one,
            # every change must be sealed, and a sealed file needs the key of the encryption
            # entry remembered from its device.json when it was whole.
            reading.records += _held_device_tombstones(folder, cursor, passphrase)
            if folder.device in cursor.keys:
                reading.keys[folder.device] = cursor.keys[folder.device]
            continue
        if folder.info().get("encryption"):
            reading.keys[folder.device] = folder.info()["encryption"]
        files = folder.files()
        # With a passphrase every change must be sealed: anyone who can write to the folder
        # could otherwise slip in plain records, facts included.
        if passphrase and files:
            info = folder.info()
            if not (info.get("encryption") and all(f.encrypted for f in files)):
                name = info.get("name", folder.device)
                raise InputError(
                    f"device {name} has unencrypted changes in the sync folder; nothing was "
                    "merged. Sync that device with the passphrase first (it rewrites its files "
                    "sealed), or remove files you did not write."
                )
        known = cursor.streams.get(folder.device, {})
        merged = reading.streams[folder.device] = {}
        todo = []
        for file in files:
            identity = file.identity()  # before reading: a change after it is read next time
            if identity is not None and known.get(file.path.name) == identity:
                merged[file.path.name] = identity
            else:
                todo.append((file, identity))
        sealed = todo if not check_key else [(f, None) for f in files]
        cipher = folder.cipher(passphrase) if any(f.encrypted for f, _ in sealed) else None
        # A device's new files merge together, or wait together for one that cannot be read
        # whole yet (fewer turns arrive out of order, to be renumbered), but deletions never
        # wait: the tombstones of the files read go in at once, since a deletion the person
        # made must not stay undone here for as long as another file is damaged. Privacy does
        # not wait on this either: each turn carries its conversation's flag (records.py).
        records: list[Record] = []
        read: dict[str, list[int]] = {}
        whole = True
        for file, identity in todo:
            found = folder.read(file, cipher)
            reading.read += 1
            if found is None:
                whole = False
                reading.skipped.append(str(file.path))
                if _unchanged_for(file.path) > COPY_GRACE_S:
                    reading.damaged.append(str(file.path))
                continue
            last = sequences.last(folder.device, file.number)
            if found.sequence < last:
                raise InputError(
                    f"{file.path} is an older copy of a file already read (sequence "
                    f"{found.sequence}, already read {last}): someone put an old version back "
                    "in the sync folder; nothing was merged. Its device rewrites the file at "
                    "its next sync; or remove the file."
                )
            sequences.note(folder.device, file.number, found.sequence)
            records += found.records
            if identity is not None:
                read[file.path.name] = identity
        if whole:
            reading.records += records
            merged |= read
        else:  # not in the cursor: read again, whole, at the next sync
            reading.records += [r for r in records if r["kind"] == "tombstone"]
            reading.held_back += len(read)
            reading.held_devices += 1
    return reading


def _tombstones(folder: DeviceFolder, cipher: Cipher | None) -> list[Record]:
    """The tombstones in a device stream's change files that can be read whole: its plain
    files (`cipher` None), or its sealed ones (with `cipher`)."""
    found = (folder.read(f, cipher) for f in folder.files() if f.encrypted == (cipher is not None))
    return [r for c in found if c is not None for r in c.records if r["kind"] == "tombstone"]


def _held_device_tombstones(
    folder: DeviceFolder, cursor: Cursor, passphrase: str | None
) -> list[Record]:
    """The tombstones of a device whose device.json is damaged: in its plain files without a
    passphrase; with one, in its sealed files, by the key of the encryption entry remembered
    from its device.json (none if none is, or the passphrase does not open it)."""
    if not passphrase:
        return _tombstones(folder, None)
    described = cursor.keys.get(folder.device)
    if described is None:
        return []
    try:
        return _tombstones(folder, Cipher.from_description(passphrase, described, folder.device))
    except InputError:
        return []


def plan_writes(log: SyncLog, mine: DeviceFolder, cipher: Cipher | None, others: set[str]) -> Plan:
    """Compare this device's files with the database. A record stays in a file while it is live
    here (the turn is still in the log, the fact still has that version, or it is a
    tombstone); the store's records that no file holds yet, and that are this device's to
    write, are new. A device writes its own changes, those whose device has no stream in the
    folder (imported from an export, or from a device whose folder was removed), every
    tombstone and every fork (a text kept from two edits of a fact made beside each other)."""
    device, _ = log.device()
    local = log.changes()
    live = {version(r): r for r in local}
    held: set = set()
    rewrites = {}
    sequence = 0
    kept_by_file = []
    for file in mine.files():
        # Unchecked: a record is kept as the store has it, and a file holding anything else
        # (a record changed in the folder, or written by an older mlxmem) is rewritten.
        found = mine.read(file, cipher if file.encrypted else None, check=False)
        records = found.records if found else []
        sequence = max(sequence, found.sequence if found else 0)
        versions = [_version(r) for r in records]
        keep = [live[v] for v in dict.fromkeys(versions) if v in live and v not in held]
        held.update(version(r) for r in keep)
        kept_by_file.append((file, keep))
        if (
            found is None
            or found.sequence == 0  # format 1: rewritten framed
            or keep != records
            or file.encrypted != (cipher is not None)
        ):
            rewrites[file.path] = (file, keep)
    # Every tombstone applied here, whoever wrote it, stays in this device's stream: removing
    # a retired device's folder must not take its deletions with it. So does every text kept
    # from a conflict (a fork): its writer may never publish it (a deletion of the fact can
    # reach it first, and takes the text held under the fact's uid along).
    ours = [
        r
        for r in local
        if r["kind"] == "tombstone"
        or r["device"] == device
        or r["device"] not in others
        or r.get("fork_of") is not None
    ]
    new = [r for r in ours if version(r) not in held]
    return Plan(rewrites, new, sequence, kept_by_file)


def _version(record: object) -> tuple | None:
    """version() of a record read unchecked from this device's own file; None for one that is
    not a record."""
    try:
        return version(record)  # type: ignore[arg-type]
    except (KeyError, TypeError, AttributeError):
        return None


def sync_root(log: SyncLog, root: Path | None, create: bool = True) -> Path:
    """The sync folder given, else the one the last sync used. A new folder named for the
    first time is created if its parent exists; one used before is never created again (a
    drive not mounted would otherwise get an empty folder on the disk beneath it)."""
    used = log.sync_dir()
    if root is None:
        if used is None:
            raise InputError("no sync folder yet: name one, e.g. `mlxmem sync ~/Dropbox/mlxmem`")
        root = Path(used)
    root = Path(root).expanduser().resolve()
    if root.is_dir():
        return root
    if used is not None and Path(used).expanduser().resolve() == root:
        raise InputError(f"the sync folder {root} does not exist (is the drive mounted?)")
    if root.exists():
        raise InputError(f"{root} is not a folder")
    if not create:
        raise InputError(f"the sync folder {root} does not exist yet: `mlxmem sync` creates it")
    if not root.parent.is_dir():
        raise InputError(
            f"neither the sync folder {root} nor its parent exist: is the drive mounted? "
            f"(to start a new one: mkdir -p {root})"
        )
    try:
        root.mkdir(mode=0o700)
    except OSError as exc:
        raise InputError(f"cannot create the sync folder {root}: {exc.strerror}") from exc
    return root


def _own_cipher(
    mine: DeviceFolder, name: str, passphrase: str | None, remembered: dict | None = None
) -> Cipher | None:
    """This device's key: the one its device.json describes, or, that file damaged, the one
    `remembered` describes (Cursor.keys: its files stay readable by the others), a new one if
    a passphrase is given for a plaintext stream (its files are then rewritten sealed), or
    None."""
    try:
        cipher = mine.cipher(passphrase)
    except InputError:
        if mine.files() or not passphrase:
            raise
        # A key with nothing sealed under it: a first sync that failed once wrote it (before
        # the passphrase was checked against the others'); nothing is lost by a new one.
        cipher = None
    if cipher is None and passphrase and remembered and mine.info_problem() is not None:
        cipher = Cipher.from_description(passphrase, remembered, mine.device)
        _write_info(mine, name, cipher, last_sync=None)
    if cipher is None and passphrase:
        cipher = Cipher.new(passphrase)
        _write_info(mine, name, cipher, last_sync=mine.info().get("last_sync"))
    return cipher


def _write_info(mine: DeviceFolder, name: str, cipher: Cipher | None, last_sync) -> None:
    info = {"format": 1, "device": mine.device, "name": name, "last_sync": last_sync}
    if cipher is not None:
        info["encryption"] = cipher.describe(mine.device)
    mine.write_info(info)


def _compact(
    mine: DeviceFolder, plan: Plan, cipher: Cipher | None, sequence: int, sequences: Sequences
) -> int:
    """Merge this device's small files into one new file when it has many (see
    COMPACT_FILES); return how many were merged. Crash-safe: the new file is written whole
    (fsync, rename) before the old ones are removed; a crash between leaves records twice,
    and the next full sync keeps the first copy (the duplicate is rewritten out). Another
    device's cursor survives: it reads the new file and forgets the removed ones."""
    if len(plan.kept) <= COMPACT_FILES:
        return 0
    small = [(f, keep) for f, keep in plan.kept if (f.identity() or [0])[0] < COMPACT_SMALL_BYTES]
    if len(small) < 2:
        return 0
    # The files as written by this sync: the rewrites kept `keep`; the new file is not in it.
    records = [r for _, keep in small for r in keep]
    number, sequence = _next_number(mine), next_sequence(sequence)
    mine.write(number, records, cipher, sequence)
    sequences.note(mine.device, number, sequence)
    crash_point("sync:compacted")
    for file, _ in small:  # either kind: a rewrite may have sealed it under the other name
        for name in (f"{file.number:06d}.jsonl", f"{file.number:06d}.jsonl.enc"):
            (mine.path / name).unlink(missing_ok=True)
    fsync_path(mine.path)
    return len(small)


def _unchanged_for(path: Path) -> float:
    """Seconds since `path` last changed here: its mtime or its ctime, the later (a sync tool
    may give a file its source's mtime while still writing it; the ctime moves with every
    write)."""
    try:
        st = path.stat()
    except OSError:
        return 0.0
    return time.time() - max(st.st_mtime, st.st_ctime)


def _identities(mine: DeviceFolder) -> dict[str, list[int] | None]:
    return {f.path.name: f.identity() for f in mine.files()}


def _next_number(mine: DeviceFolder) -> int:
    return max((f.number for f in mine.files()), default=0) + 1


@contextmanager
def _sync_lock(log: SyncLog) -> Iterator[None]:
    """One sync at a time per data directory (its own-file numbering depends on it)."""
    fd = open_lock_file(Path(f"{log.path}.sync-lock"))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError("another mlxmem sync is running for this data directory") from None
        yield
    finally:
        os.close(fd)


def _text(value: object) -> str | None:
    """A string another device wrote into its device.json, or None (anyone with access to the
    folder can write anything there)."""
    return value if isinstance(value, str) else None


def _time(value: object) -> str | None:
    """An ISO 8601 time from another device's device.json, or None."""
    try:
        return iso(timestamp(value)) if isinstance(value, str) else None
    except InputError:
        return None
