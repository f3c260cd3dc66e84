"""What a sync remembers between runs, in the store's `state` (through the store's calls):

- a read cursor: per other device, the change files merged, by identity (size, mtime, inode).
  A file whose identity is unchanged is not read again; one written since (new, or rewritten by
  an erase) is. A cursor that is missing, damaged, or for another folder reads as empty: a full
  read, never a skipped change. It is saved only after what was read has been merged.
- the own stream: the store's changes_digest (under the other devices present) and this
  device's files (by identity) as the last sync left them. When both are unchanged, this
  device has nothing to write or erase, and the sync skips reading the store's records and
  its own files.
- keys: per other device, the encryption entry of its device.json as last read whole (a salt
  and a check value, no secret): with a passphrase, a device.json damaged since still lets
  that device's deletions be read (its sealed files need the salt).
- sequences: per device and file number, the highest sequence read (kept apart from the
  cursor, for any folder): a file older than one already read is refused, not merged. And the
  last sequence this device wrote.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

CURSOR_KEY = "sync_cursor"
SEQUENCES_KEY = "sync_sequences"
CURSOR_VERSION = 1


@dataclass
class Cursor:
    folder: str
    streams: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    own: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, dict] = field(default_factory=dict)  # device -> its encryption entry

    @classmethod
    def load(cls, text: str | None, folder: str) -> Cursor:
        """The cursor saved for `folder`; an empty one if there is none or it is damaged."""
        try:
            data = json.loads(text) if text else None
            if (
                isinstance(data, dict)
                and data.get("version") == CURSOR_VERSION
                and data.get("folder") == folder
                and isinstance(data.get("streams"), dict)
                and isinstance(data.get("own"), dict)
                and all(isinstance(v, dict) for v in data["streams"].values())
            ):
                keys = data.get("keys")
                return cls(folder, data["streams"], data["own"], _entries(keys))
        except (ValueError, RecursionError):
            pass
        return cls(folder)

    def dumps(self) -> str:
        data = {"version": CURSOR_VERSION, "folder": self.folder}
        return json.dumps(data | {"streams": self.streams, "own": self.own, "keys": self.keys})

    def own_unchanged(self, digest: str, encrypted: bool, files: dict) -> bool:
        """Whether this device's stream is as the last sync left it, for the same store. The
        digest (Store.changes_digest) already says which records are this device's to write
        among the other devices present, so a new device's stream alone changes nothing."""
        return bool(self.own) and self.own == own_state(digest, encrypted, files)


def own_state(digest: str, encrypted: bool, files: dict) -> dict:
    return {"digest": digest, "encrypted": encrypted, "files": files}


@dataclass
class Sequences:
    """Per device, per file number (as a string), the highest sequence read."""

    seen: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def load(cls, text: str | None) -> Sequences:
        try:
            data = json.loads(text) if text else {}
            if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()):
                return cls(data)
        except (ValueError, RecursionError):
            pass
        return cls()

    def dumps(self) -> str:
        return json.dumps(self.seen)

    def last(self, device: str, number: int) -> int:
        value = self.seen.get(device, {}).get(str(number), 0)
        return value if isinstance(value, int) else 0

    def note(self, device: str, number: int, sequence: int) -> None:
        stream = self.seen.setdefault(device, {})
        stream[str(number)] = max(sequence, self.last(device, number))

    def written(self, device: str) -> int:
        """The last sequence this device wrote (0: none remembered)."""
        return max((v for v in self.seen.get(device, {}).values() if isinstance(v, int)), default=0)


def next_sequence(last: int) -> int:
    """A sequence above `last`, and at least the clock in milliseconds: a device whose memory
    of its last write was lost (a restored data directory, a wiped folder) still writes higher
    sequences than the ones the other devices remember, unless its clock went back too."""
    return max(last + 1, time.time_ns() // 1_000_000)


def _entries(keys: object) -> dict[str, dict]:
    """The remembered encryption entries that are objects (a cursor from before has none)."""
    if not isinstance(keys, dict):
        return {}
    return {k: v for k, v in keys.items() if isinstance(v, dict)}
