"""A long `eval locomo` run's folder (`--run-dir`): what the run has done, written as it goes,
so that a run of whole conversations on a slow model can span several sittings. A rerun with
the same settings skips what is done: a conversation whose replay finished is not replayed
again, a replay that stopped between two exchanges goes on from there, one that stopped inside
an exchange (where a kill usually lands: the model reads the prompt) goes on from the last
copy of its store, and a question already answered is not asked again.

    settings.json           what the run is (a rerun with other settings is refused)
    CONV/                   the replay's store, its files (the conversation's text: the folder
                            is private)
    CONV.kept/              the store as a whole exchange left it, copied every
                            KEEP_EVERY exchanges, with the count of replay lines it matches
    CONV.replay.jsonl       a line per exchange replayed: facts noted, what the looks found
    CONV.replay.json        the replay's own figures, written once it is whole
    CONV.items.jsonl        a line per question: every configuration's answer and scores

Lines are appended and flushed to disk one at a time; a line cut short by a kill is dropped
when the file is next opened. A damaged file (a line cut or garbled, a stray byte, a count that
is not one) is said in one line (RunFileWarning), its bytes kept beside it as `NAME.damaged`,
and the run goes on from what can be read: what the damaged part held is done again.

The folder holds LoCoMo's text and the model's answers: it is made private (0700), a folder
that is another user's or open to others is refused, never taken over, and it belongs outside
any repository (its licence keeps the text out); `eval_pool.py --out` keeps only figures from
it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path

from mlxmem.errors import InputError
from mlxmem.paths import CACHE_DIRNAME, ensure_private_dir, fsync_path, make_private, write_whole

SETTINGS = "settings.json"
COUNT = "replay-lines"  # in a copy of the store: the replay lines it matches
KEEP_EVERY = 10  # exchanges between two copies of the store (a few MB, milliseconds)
# The settings a run's results depend on: a rerun must match them. The conversations may grow.
# A setting added later is read as its default in a run made before it.
RESUME_DEFAULTS = {"summary": "model", "answer_configs": None, "categories": None}
RESUME_KEYS = (
    "mode",
    "limit",
    "sample",
    "sessions",
    "context_tokens",
    "response_reserve",
    "facts",
    "summary",
    "replace_facts",
    "answers",
    "answer_configs",
    "answer_tokens",
    "categories",
    "model_id",
)


class RunDir:
    def __init__(self, path: Path, settings: dict):
        self.path = Path(path)
        self.sitting = time.time()  # marks the lines this run writes: a rerun is another sitting
        private_folder(self.path)
        wanted = {k: settings.get(k) for k in RESUME_KEYS}
        file = self.path / SETTINGS
        if file.exists():
            kept = _read_json(file)
            if kept is None:
                raise InputError(f"{file} is not a run's settings; give another --run-dir")
            # Facts were replaced where they were noted: in a run with facts off it changed
            # nothing.
            kept = RESUME_DEFAULTS | {"replace_facts": bool(kept.get("facts"))} | kept
            differ = sorted(k for k in RESUME_KEYS if kept.get(k) != wanted[k])
            if differ:
                shown = ", ".join(f"{k} {kept.get(k)!r} there, {wanted[k]!r} now" for k in differ)
                raise InputError(
                    f"{self.path} holds a run with other settings ({shown}); rerun it with "
                    "them, or give another --run-dir"
                )
        else:
            write_whole(file, json.dumps(wanted, indent=1))

    def store_path(self, conv_id: str) -> Path:
        return self.path / conv_id / "eval.duckdb"

    def fresh_store(self, conv_id: str) -> Path:
        """The store path of `conv_id` as its last copy left it, the replay's lines cut back to
        the same exchange; with no copy, with no replay in it. For a replay that cannot go on
        (it stopped inside an exchange)."""
        store, lines = self.path / conv_id, self.path / f"{conv_id}.replay.jsonl"
        shutil.rmtree(store, ignore_errors=True)
        kept = self._kept(conv_id)
        count = None if kept is None else _kept_count(kept / COUNT)
        written = self.exchanges(conv_id)
        if kept is not None and count is not None and count > len(written):
            _set_aside(kept / COUNT, f"{count} lines counted, {len(written)} written")
        if kept is None or count is None or count > len(written):  # no copy the lines match
            lines.unlink(missing_ok=True)
            return self.store_path(conv_id)
        write_whole(lines, "".join(json.dumps(x) + "\n" for x in written[:count]))
        shutil.copytree(kept, store, ignore=shutil.ignore_patterns(COUNT))
        os.chmod(store, 0o700)
        return self.store_path(conv_id)

    def keep_store(self, conv_id: str) -> None:
        """Copy `conv_id`'s store as it stands (call it between two exchanges, no operation
        open on it) with the count of replay lines written: a replay stopped inside a later
        exchange goes on from here. The copy replaces the last one whole: the new one is
        written aside first, and the old one moved away before the new one takes its name."""
        kept, new, old = (self.path / f"{conv_id}.kept{end}" for end in ("", ".new", ".old"))
        shutil.rmtree(new, ignore_errors=True)
        shutil.copytree(
            self.path / conv_id, new, ignore=shutil.ignore_patterns("*.lock*", CACHE_DIRNAME)
        )
        write_whole(new / COUNT, str(len(self.exchanges(conv_id))))
        for file in new.iterdir():
            fsync_path(file)
        if kept.exists():
            shutil.rmtree(old, ignore_errors=True)
            kept.rename(old)
        new.rename(kept)
        fsync_path(self.path)  # the renames, on the disk before the old copy goes
        shutil.rmtree(old, ignore_errors=True)

    def _kept(self, conv_id: str) -> Path | None:
        """The last whole copy of `conv_id`'s store: the current one, or the one it was about
        to replace when a kill came between the two renames."""
        for end in ("", ".old"):
            kept = self.path / f"{conv_id}.kept{end}"
            if (kept / COUNT).exists():
                return kept
        return None

    def replayed(self, conv_id: str) -> dict | None:
        """The figures of `conv_id`'s replay, once it is whole; else None."""
        file = self.path / f"{conv_id}.replay.json"
        if not file.exists():
            return None
        figures = _read_json(file)
        if figures is None:
            _set_aside(file, "not whole JSON")
        return figures

    def replay_done(self, conv_id: str, figures: dict) -> None:
        write_whole(self.path / f"{conv_id}.replay.json", json.dumps(figures, indent=1))
        for end in ("", ".new", ".old"):  # the copies of a replay under way are not needed now
            shutil.rmtree(self.path / f"{conv_id}.kept{end}", ignore_errors=True)

    def exchanges(self, conv_id: str) -> list[dict]:
        """The replay's lines up to the first damaged one: they count the exchanges done."""
        return read_lines(self.path / f"{conv_id}.replay.jsonl", prefix=True)

    def add_exchange(self, conv_id: str, line: dict) -> None:
        append_line(self.path / f"{conv_id}.replay.jsonl", line)

    def items(self, conv_id: str) -> dict[int, dict]:
        """The questions of `conv_id` answered so far, by their index in its file."""
        lines = read_lines(self.path / f"{conv_id}.items.jsonl")
        return {item["index"]: item for item in lines if isinstance(item.get("index"), int)}

    def add_item(self, conv_id: str, item: dict) -> None:
        append_line(self.path / f"{conv_id}.items.jsonl", item)


class RunFileWarning(UserWarning):
    """A damaged file in a run folder: set aside, and what it held done again."""


def private_folder(path: Path) -> None:
    """Make `path` (0700), or check that the one there is the user's and closed to others:
    a run folder holds LoCoMo's text and the model's answers. InputError, saying why, if not."""
    if not path.exists():
        ensure_private_dir(path)
        return
    info = path.stat()
    if info.st_uid != os.getuid():
        raise InputError(
            f"--run-dir {path} belongs to another user (uid {info.st_uid}); mlxmem keeps a run"
            " only in a folder of your own: give another --run-dir"
        )
    if info.st_mode & 0o077:
        raise InputError(
            f"--run-dir {path} is open to other users (mode {oct(info.st_mode & 0o777)}); a run"
            " holds LoCoMo's text and the model's answers: `chmod 700` it if what is in it may"
            " stay, or give another --run-dir"
        )


def read_lines(path: Path, prefix: bool = False) -> list[dict]:
    """The whole lines of a JSON-lines file; a last line cut short (a kill while writing it)
    is cut off the file, so that the next line appended starts clean. Damaged lines (cut or
    garbled inside the file, a stray byte) are left out, or with `prefix` every line from the
    first damaged one on; the file is then rewritten without them, its old bytes set aside."""
    if not path.exists():
        return []
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) != len(data):
        with open(path, "r+b") as f:
            f.truncate(len(whole))
    raw = [line for line in whole.split(b"\n") if line.strip()]
    values: list[dict] = []
    for line in raw:
        value = _json_line(line)
        if value is None and prefix:
            break
        if value is not None:
            values.append(value)
    if len(values) < len(raw):
        _set_aside(path, f"{len(raw) - len(values)} of its {len(raw)} lines damaged", copy=True)
        write_whole(path, "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in values))
    return values


def _json_line(line: bytes) -> dict | None:
    try:
        value = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError too
        return None
    return value if isinstance(value, dict) else None


def _read_json(path: Path) -> dict | None:
    """A JSON object file's value; None if it is not one (cut, a stray byte)."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _kept_count(path: Path) -> int | None:
    """The replay lines a copy of the store matches; None (said in one line) if unreadable."""
    try:
        count = int(path.read_bytes().decode("ascii").strip())
    except (OSError, ValueError):
        count = -1
    if count < 0:
        _set_aside(path, "not a count of lines")
        return None
    return count


def _set_aside(path: Path, what: str, copy: bool = False) -> None:
    """Keep a damaged file's bytes as NAME.damaged (moved, or with `copy` copied), and say so."""
    aside = path.with_name(f"{path.name}.damaged")
    if copy:
        shutil.copyfile(path, aside)
    else:
        os.replace(path, aside)
    make_private(aside)
    warnings.warn(
        f"{path} is damaged ({what}); the run goes on from what can be read and does the rest"
        f" again (the old bytes are in {aside.name})",
        RunFileWarning,
        stacklevel=3,
    )


def append_line(path: Path, value: dict) -> None:
    new = not path.exists()
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(value, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    if new:
        make_private(path)
