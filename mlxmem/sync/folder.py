"""A sync folder (DIR) that the person's devices share through a file-sync tool, no server.

    DIR/mlxmem/devices/<device-uuid>/device.json     name, last sync, encryption (salt, check)
    DIR/mlxmem/devices/<device-uuid>/000001.jsonl    change records, one JSON object a line
    DIR/mlxmem/devices/<device-uuid>/000002.jsonl.enc   the same, AES-GCM sealed

A change file's first line is its frame: {"format": 2, "records": N, "sequence": S}. N is the
count of record lines after it, so a file cut anywhere (a sync tool still copying it, even at a
line's end) does not parse and is skipped whole, never applied in part. S grows with every
write of the device's stream (a rewrite too); sealed, the frame is inside the AEAD, so a reader
that remembers the S it read for a file can refuse an older copy put back in its place. Files
written before the frame (format 1: records only) are still read, as sequence 0.

Only the device itself writes into its folder, and every write is a whole file: a temporary
file, fsync, then an atomic rename. So a sync tool never sees two writers on one file, and a
reader sees a file whole or not at all. New changes go into a new file; a file is rewritten only
to take records out of it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mlxmem.errors import InputError, MlxmemError
from mlxmem.memory.sync.records import Record, check_record
from mlxmem.memory.tables.db import crash_point
from mlxmem.paths import fsync_path
from mlxmem.sync.crypto import PASSPHRASE_ENV, Cipher
from mlxmem.text import a_kind

DEVICE_INFO = "device.json"
_CHANGE_FILE = re.compile(r"^(\d{6,})\.jsonl(\.enc)?$")
_TEMP_PREFIX = ".tmp-"
FILE_FORMAT = 2
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class ChangeFile:
    path: Path
    number: int
    encrypted: bool

    def identity(self) -> list[int] | None:
        """(size, mtime in ns, inode): what a read cursor compares to tell a file it has read
        from one written (or put back) since; None if the file is gone. Every write renames a
        new file into place, so a rewrite changes the inode even within one mtime tick."""
        try:
            st = self.path.stat()
        except OSError:
            return None
        return [st.st_size, st.st_mtime_ns, st.st_ino]


@dataclass(frozen=True)
class Contents:
    records: list[Record]
    sequence: int  # 0: a file written before the frame (format 1)


class DeviceFolder:
    """One device's stream in the sync folder: its device.json and its change files."""

    def __init__(self, root: Path, device: str):
        self.device = device
        self.path = root / "mlxmem" / "devices" / device

    def info(self) -> dict:
        """This stream's device.json, or {} if it is missing or not a JSON object."""
        try:
            info = json.loads((self.path / DEVICE_INFO).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return info if isinstance(info, dict) else {}

    def info_problem(self) -> str | None:
        """What is wrong with this stream's device.json, or None. Anyone who can write to the
        folder can damage another device's file: a bad one is skipped, and the rest merged."""
        path = self.path / DEVICE_INFO
        if not path.exists():
            return None  # nothing written yet, or only change files: read them as plain
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return f"not readable as JSON ({exc})"
        if not isinstance(info, dict):
            return f"{a_kind(info)}, not an object"
        described = info.get("encryption")
        if described is not None and described is not False:
            return Cipher.description_problem(described)
        return None

    def files(self) -> list[ChangeFile]:
        found = []
        for path in self.path.iterdir() if self.path.is_dir() else ():
            match = _CHANGE_FILE.match(path.name)
            if match:
                found.append(ChangeFile(path, int(match.group(1)), bool(match.group(2))))
        return sorted(found, key=lambda f: (f.number, f.encrypted))

    def cipher(self, passphrase: str | None) -> Cipher | None:
        """The key this stream was sealed with, or None if it is plaintext (a damaged
        device.json over plain change files counts as plaintext: its device rewrites it)."""
        described = self.info().get("encryption")
        if not described:
            return None
        if self.info_problem() is not None and not any(f.encrypted for f in self.files()):
            return None
        if not passphrase:
            raise InputError(
                f"the sync folder is encrypted (device {self.info().get('name', self.device)});"
                f" set {PASSPHRASE_ENV} or pass --passphrase"
            )
        return Cipher.from_description(passphrase, described, self.device)

    def read(self, file: ChangeFile, cipher: Cipher | None, check: bool = True) -> Contents | None:
        """The records of a change file and its sequence, or None if it cannot be read whole
        (still being copied by the sync tool, damaged, or sealed without a key we have).
        `check=False`: the lines as parsed, unchecked (a device comparing its own files with
        its store's records, which it trusts instead)."""
        try:
            data = file.path.read_bytes()
        except OSError:
            return None
        if file.encrypted:
            opened = cipher.open(data, self._aad(file.number)) if cipher else None
            if opened is None:
                return None
            data = opened
        try:
            lines = [line for line in data.decode("utf-8").splitlines() if line.strip()]
            if not lines:  # mlxmem writes no empty file: one cut to nothing, or not copied yet
                return None
            first = json.loads(lines[0])
            if isinstance(first, dict) and "kind" not in first:
                frame, lines = first, lines[1:]
                sequence = frame.get("sequence")
                if frame.get("format") != FILE_FORMAT or frame.get("records") != len(lines):
                    return None
                if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
                    return None
            else:
                sequence = 0  # format 1: no frame
            parsed = [json.loads(line) for line in lines]
            return Contents([check_record(r) for r in parsed] if check else parsed, sequence)
        except (UnicodeDecodeError, ValueError, RecursionError, MlxmemError):
            return None

    def write(
        self, number: int, records: list[Record], cipher: Cipher | None, sequence: int
    ) -> Path:
        """Write change file `number` whole (replacing it if it exists), framed with its
        record count and `sequence`; return its path."""
        frame = {"format": FILE_FORMAT, "records": len(records), "sequence": sequence}
        lines = [frame, *records]
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines).encode()
        name = f"{number:06d}.jsonl"
        if cipher is not None:
            data, name = cipher.seal(data, self._aad(number)), name + ".enc"
        return self._write_atomic(name, data)

    def write_info(self, info: dict) -> None:
        self._write_atomic(DEVICE_INFO, json.dumps(info, indent=2).encode())

    def remove_temp_files(self) -> None:
        """Temporary files left by a sync that died before its rename (they may hold text that
        was deleted since)."""
        for path in self.path.glob(f"{_TEMP_PREFIX}*") if self.path.is_dir() else ():
            path.unlink(missing_ok=True)

    def remove_superseded(self, encrypted: bool) -> None:
        """A file rewritten as the other kind (sealed, or plain) is written first and its old
        twin removed after: a crash between the two leaves both. The twin that is not of the
        kind now written goes; the other holds the same records."""
        files = self.files()
        current = {f.number for f in files if f.encrypted == encrypted}
        for file in files:
            if file.encrypted != encrypted and file.number in current:
                file.path.unlink(missing_ok=True)

    def _write_atomic(self, name: str, data: bytes) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / name
        tmp = self.path / f"{_TEMP_PREFIX}{name}"
        write_private(tmp, data)
        crash_point("sync:temp-written")
        os.replace(tmp, target)
        fsync_path(self.path)
        return target

    def _aad(self, number: int) -> str:
        return f"{self.device}/{number}"


def device_folders(root: Path) -> list[DeviceFolder]:
    """Every device stream in the sync folder."""
    devices = root / "mlxmem" / "devices"
    if not devices.is_dir():
        return []
    return [
        DeviceFolder(root, p.name)
        for p in sorted(devices.iterdir())
        if p.is_dir() and _UUID.match(p.name)
    ]


def write_private(path: Path, data: bytes) -> None:
    """Write `path` readable by its owner only (0600 from its creation), and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    with open(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
