"""`mlxmem memory`: the facts about you that the model sees; list, add, edit, delete them."""

from datetime import datetime

import typer
from rich.table import Table
from rich.text import Text

from mlxmem.memory.store import Store
from mlxmem.memory.tables.facts import check_source

from .common import JSON, confirm, listed_plainly, out, plain_typer, plural, say, shown

app = plain_typer(
    help="The facts about you that the model sees (layer 3). Each is tagged manual (added by "
    "you) or automatic (extracted from a chat); list, add, edit, restore and delete them.",
    no_args_is_help=True,
)


def local_time(value: datetime) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M")


@app.command("list")
def list_facts(
    as_json: bool = JSON,
    show_all: bool = typer.Option(
        False, "--all", help="Also the facts that another replaced (out of the prompt)."
    ),
) -> None:
    """List the facts the model knows about you (--all: and those replaced by newer ones)."""
    facts = Store().facts(replaced=show_all)
    if listed_plainly(facts, as_json, "No facts yet. Add one with: mlxmem memory add TEXT"):
        return
    table = Table("id", "source", "text", "updated", *(["replaced"] if show_all else []))
    for fact in facts:
        # shown(), not a str: a fact may contain [brackets] that rich would read as markup.
        row: list[str | Text] = [
            str(fact.id),
            fact.source,
            shown(fact.text),
            local_time(fact.updated_at),
        ]
        if show_all:
            replaced = fact.replaced_at and local_time(fact.replaced_at)
            row.append(f"by {fact.replaced_by}, {replaced}" if fact.replaced_by else "")
        table.add_row(*row)
    out().print(table)


@app.command("add")
def add_fact(
    text: str = typer.Argument(..., help="The fact, e.g. 'My sister is Anna.'"),
    replaces: int = typer.Option(
        None,
        "--replaces",
        metavar="ID",
        help="A fact this one makes out of date ('I moved to Porto' over 'I live in Lisbon'):"
        " it leaves the prompt and stays in `memory list --all` until you delete it.",
    ),
) -> None:
    """Add a fact about you (tagged manual); the model sees it from its next reply."""
    fact = Store().add_fact(text, source="manual", replaces=replaces)
    said = f"Added fact {fact.id}."
    if replaces is not None:
        said += f" Fact {replaces} is replaced: out of the prompt, still in `memory list --all`."
    say(said)


@app.command("edit")
def edit_fact(
    fact_id: int = typer.Argument(..., metavar="ID", help="The fact's id (see `memory list`)."),
    text: str = typer.Argument(..., help="The new text."),
) -> None:
    """Replace a fact's text; the old text is erased from disk."""
    Store().edit_fact(fact_id, text)
    say(f"Updated fact {fact_id}.")


@app.command("restore")
def restore_fact(
    fact_id: int = typer.Argument(
        ..., metavar="ID", help="The replaced fact's id (see `memory list --all`)."
    ),
) -> None:
    """Make a replaced fact current again, when it was replaced in error (an automatic
    replacement can be wrong). It returns to the prompt; the fact that replaced it stays:
    delete it with `memory rm` if it is wrong."""
    fact = Store().restore_fact(fact_id)
    say(f"Fact {fact.id} is current again: '{fact.text}'.")


# Module-level, as ruff's B008 asks for a default typed as a (mutable) list.
FACT_IDS = typer.Argument(..., metavar="ID...", help="Ids of the facts to delete.")


@app.command("rm")
def remove_facts(
    fact_ids: list[int] = FACT_IDS,
    with_mentions: bool = typer.Option(
        False, "--with-mentions", help="Also delete the turns of the log that quote the fact."
    ),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Accepted for scripts: deleting facts by id never asks."
    ),
) -> None:
    """Delete facts by id; they are erased from disk and every cache, not just hidden, and
    the summaries that saw them are made again without them.

    Turns of the chat log may still quote a fact (a reply that repeated it): they are listed,
    and --with-mentions deletes them too."""
    deletion = Store().delete_facts(fact_ids, with_mentions)
    say(deletion.describe())
    if deletion.mentions:
        count = len(deletion.mentions)
        say(f"{plural(count, 'turn')} of the log still {'quotes' if count == 1 else 'quote'} it:")
        for turn in deletion.mentions:
            say(f"  [{turn.id}] {turn.conversation} #{turn.seq} {turn.role}: {turn.text}")
        say("Delete them with `mlxmem history rm ID...`, or rerun with --with-mentions.")


@app.command("clear")
def clear_facts(
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask; needed off a terminal."),
    source: str = typer.Option(
        None, "--source", help="Only the facts from this source: manual or automatic."
    ),
) -> None:
    """Delete every fact (or every fact from one source). Asks first on a terminal, and
    needs --yes elsewhere."""
    if source is not None:
        check_source(source)  # before asking whether to delete "every bogus fact"
    which = f"every {source} fact" if source else "every fact"
    confirm(f"Delete {which} for good?", yes)
    say(Store().clear_facts(source).describe())
