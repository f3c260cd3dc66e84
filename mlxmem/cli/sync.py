"""`mlxmem sync`, `mlxmem export`, `mlxmem import`: your chats and facts on several devices,
and in a file of your own."""

import os
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

import typer
from rich.table import Table

from mlxmem.memory.sync.merge import MergeResult
from mlxmem.memory.sync.synclog import SyncLog
from mlxmem.sync.archive import export_to, import_from
from mlxmem.sync.crypto import PASSPHRASE_ENV
from mlxmem.sync.run import status, sync
from mlxmem.text import name_problem

from .common import JSON, err, nonempty_path, out, plural, print_json, say, shown
from .memory import local_time

# Module-level, as ruff's B008 asks for defaults of a type it cannot tell is immutable.
SYNC_DIR = typer.Argument(
    None,
    metavar="DIR",
    parser=nonempty_path,
    help="A folder your devices share (iCloud Drive, Dropbox, Syncthing, a network share, "
    "a USB stick). Remembered: later syncs may leave it out.",
)
EXPORT_FILE = typer.Argument(
    ...,
    metavar="FILE",
    parser=nonempty_path,
    help="The JSON file to write (replaced if it exists).",
)
IMPORT_FILE = typer.Argument(
    ..., metavar="FILE", parser=nonempty_path, help="A file written by `mlxmem export`."
)


def sync_command(
    folder: Path = SYNC_DIR,
    show_status: bool = typer.Option(
        False, "--status", help="Show the devices seen, their last sync and what is pending."
    ),
    ask_passphrase: bool = typer.Option(
        False,
        "--passphrase",
        help=f"Ask for the passphrase that encrypts the folder (else ${PASSPHRASE_ENV}; "
        "without either the folder holds plaintext).",
    ),
    as_json: bool = JSON,
) -> None:
    """Sync your chats and facts with your other devices through a shared folder.

    Reads the other devices' changes from DIR and merges them (turns by id, the newest version
    of a fact, deletions), then writes this device's own changes into its own files in DIR.
    Deleted text is erased from DIR too. Run it again at any time: a sync that was cut short is
    finished, and a second sync changes nothing. See docs/sync.md."""
    log = SyncLog()
    passphrase = _passphrase(ask_passphrase)
    if show_status:
        _print_status(status(log, folder, passphrase), as_json)
        return
    report = sync(log, folder, passphrase, progress=lambda line: err.print(line, markup=False))
    if as_json:
        print_json(asdict(report))
        return
    for problem in report.bad_devices:
        say(
            f"Skipped a device: {problem}. Its changes wait for it but for their deletions,"
            " which apply now"
            # Sealed deletions open with the key remembered from that device's description as
            # this device last read it (mlxmem.sync.cursor); none is remembered before a first read.
            + (" if this device has read that device's files before" if passphrase else "")
            + "; the next sync retries (that device rewrites the file at its next sync).",
            err=True,
        )
    for name in report.merged.odd_names:
        say(
            f"Turns arrived in a conversation whose name a new one may not have here:"
            f" {name_problem(name)}. It is kept under that name, so that every device still"
            " agrees; `mlxmem history` lists it, and `mlxmem chat -c` opens it by that name.",
            err=True,
        )
    for path in report.skipped:
        if path in report.damaged:
            err.print(
                f"Skipped {path}: unreadable, and older than a copy takes: damaged, or changed "
                "by someone without the key. Nothing of it was merged, and its device's other "
                "new files wait for it but for their deletions, which apply now; the next sync "
                "retries (its device rewrites it at its next sync)",
                markup=False,
            )
        else:
            err.print(
                f"Skipped {path}: not readable whole yet (still copying?); its device's other"
                " new files wait for it but for their deletions, which apply now; the next sync"
                " retries",
                markup=False,
            )
    synced = report.devices - report.held_devices
    held = f" ({report.held_devices} held back: see above)" if report.held_devices else ""
    said = (
        f"{synced} of {plural(report.devices, 'other device')}"
        if held
        else (plural(report.devices, "other device"))
    )
    say(
        f"Synced with {said}{held} in {report.folder}: "
        f"{_merged(report.merged)}; wrote {plural(report.written, 'change')}"
        + (f", erased records from {plural(report.rewritten, 'file')}" if report.rewritten else "")
        + "."
    )


def export_command(
    file: Path = EXPORT_FILE,
) -> None:
    """Write your whole chat log, your facts and the deletions (ids and times, no text) to one
    JSON file, readable by you only: a backup, or your data to take elsewhere."""
    records = export_to(SyncLog(), file)
    kinds = [r["kind"] for r in records]
    say(
        f"Exported {plural(kinds.count('message'), 'turn')}, {plural(kinds.count('fact'), 'fact')}"
        f" and {plural(kinds.count('tombstone'), 'deletion')} to {file}."
    )


def import_command(
    file: Path = IMPORT_FILE,
) -> None:
    """Merge an export file into this data directory, by id, with the rules of a sync: turns
    missing here are added, a fact's newest version wins, and its deletions are applied. A file
    that is damaged or not an export is refused whole, with nothing imported."""
    merged = import_from(SyncLog(), file)
    say(f"Imported from {file}: {_merged(merged)}.")


def _passphrase(ask: bool) -> str | None:
    if ask:
        return typer.prompt("Sync passphrase", hide_input=True)
    return os.environ.get(PASSPHRASE_ENV) or None


def _merged(merged: MergeResult) -> str:
    parts = [f"{plural(merged.turns, 'turn')} added"]
    if merged.facts or merged.fact_edits:
        parts.append(f"{plural(merged.facts, 'fact')} added, {merged.fact_edits} updated")
    if merged.deleted_turns or merged.deleted_facts:
        deleted = (
            f"{plural(merged.deleted_turns, 'turn')} and {plural(merged.deleted_facts, 'fact')}"
        )
        parts.append(deleted + " deleted")
    if merged.private_changes:
        parts.append(f"{plural(merged.private_changes, 'conversation')} made private or shared")
    if merged.renumbered:
        parts.append("older turns merged in; summaries are rebuilt before the next reply")
    if merged.conflicts:
        pairs = ", ".join(f"{kept} and {added}" for kept, added, _ in merged.conflicts)
        parts.append(
            f"{plural(len(merged.conflicts), 'fact')} edited on two devices before they synced:"
            f" both texts kept, as facts {pairs} (see `mlxmem memory list`; edit or remove"
            " the one you do not want)"
        )
    return ", ".join(parts)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _print_status(found: dict, as_json: bool) -> None:
    if as_json:
        print_json(found)
        return
    me = found["device"]
    say(f"Sync folder: {found['folder']}")
    say(f"This device: {me['name']} ({me['device']})")
    table = Table("device", "name", "last sync", "files", "encrypted")
    table.columns[2].no_wrap = True  # a time is read whole (local time, to the minute)
    for d in found["devices"]:
        name = d["name"] + (" (this device)" if d["this_device"] else "")
        encrypted = "yes" if d["encrypted"] else "no"
        last = local_time(datetime.fromisoformat(d["last_sync"])) if d["last_sync"] else "never"
        table.add_row(d["device"][:8], shown(name), last, str(d["files"]), encrypted)
    out().print(table)
    s = found["storage"]
    say(
        f"Folder: {_size(s['folder_bytes'])}; this device's {plural(s['own_files'], 'file')}:"
        f" {_size(s['own_bytes'])} for {_size(s['own_live_bytes'])} of live records."
    )
    p = found["pending"]
    say(
        f"Pending here: {plural(p['turns'], 'turn')}, {plural(p['facts'], 'fact version')}, "
        f"{plural(p['tombstones'], 'deletion')}, "
        f"{plural(p['conversations'], 'private flag')} to write"
        + (f"; {plural(p['files_to_rewrite'], 'file')} to rewrite" if p["files_to_rewrite"] else "")
        + "."
    )
