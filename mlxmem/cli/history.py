"""`mlxmem history`: the chat log (layer 2); read, search and delete turns."""

import typer
from rich.table import Table
from rich.text import Text

from mlxmem.defaults import DEFAULT_CONVERSATION
from mlxmem.errors import InputError
from mlxmem.memory.store import LAST_SEQ, Store, Summary, Turn
from mlxmem.memory.tables.summaries import describe_source
from mlxmem.memory.tables.turns import SEARCH_LIMIT

from .common import JSON, confirm, listed_plainly, out, plain_typer, plural, say, shown
from .memory import local_time

app = plain_typer(
    help="The chat log (layer 2): every turn, whole and unchanged. List conversations, "
    "read, search and delete turns.",
    no_args_is_help=True,
)

# More turns than any log holds, and inside DuckDB's 64-bit LIMIT.
MAX_SEARCH_LIMIT = 10**9

TURN_IDS = typer.Argument(
    None, metavar="ID", help="Ids of the turns to delete (see `history show`)."
)


@app.command("list")
def list_conversations(as_json: bool = JSON) -> None:
    """List the conversations with their number of turns, and whether each is recalled in the
    others ("shared") or kept out of recall ("private", see `history private`)."""
    conversations = Store().conversations()
    if listed_plainly(conversations, as_json, "No conversations yet."):
        return
    table = Table("name", "turns", "started", "recall")
    for c in conversations:
        recall = "private" if c.private else "shared"
        table.add_row(shown(c.name), str(c.turn_count), local_time(c.created_at), recall)
    out().print(table)


@app.command("private")
def private(
    name: str = typer.Argument(..., help="The conversation."),
    off: bool = typer.Option(False, "--off", help="Let it back into recall."),
) -> None:
    """Keep a conversation out of recall: its turns are never recalled into another
    conversation (it still recalls its own older turns, and the others'). `--off` lets it
    back in. `history list` shows which are private; `chat --private` starts one so."""
    conversation = Store().set_private(name, not off)
    state = "private: never recalled in" if conversation.private else "shared: recalled in"
    say(f"Conversation {name!r} is {state} other conversations.")


@app.command("show")
def show(
    conversation: str = typer.Argument(DEFAULT_CONVERSATION, help="The conversation's name."),
    last: int = typer.Option(None, "--last", "-n", min=1, help="Only the newest N turns."),
    summaries: bool = typer.Option(
        False,
        "--summaries",
        help="The rolling summaries instead of the turns: the turns each covers, who wrote it "
        "(the model; model+extractive: the model's, then the names, numbers and dates it left "
        "out; or extractive: picked from the turns when the model's failed the check) "
        "and its text.",
    ),
    as_json: bool = JSON,
) -> None:
    """Show the turns of a conversation, oldest first, with their ids; or, with --summaries,
    its rolling summaries and who wrote each."""
    store = Store()
    turns = store.turns(conversation)
    if not turns and conversation != DEFAULT_CONVERSATION:
        store.conversation(conversation)  # an unknown name is an error, not an empty list
    if summaries:
        print_summaries(store.summaries(conversation), as_json, last)
        return
    if last is not None:
        turns = turns[-last:]
    print_turns(turns, as_json, show_conversation=False)
    folded = store.latest_summary(conversation) if turns and not as_json else None
    if folded is not None:
        say(
            f"Turns #{folded.first_seq}-#{folded.last_seq} are folded into a summary "
            f"({describe_source(folded.source)}); `history show --summaries` shows it."
        )


@app.command("search")
def search(
    query: str = typer.Argument(..., help="Text to look for (case-insensitive)."),
    conversation: str = typer.Option(None, "--conversation", "-c", help="Only this conversation."),
    limit: int = typer.Option(
        SEARCH_LIMIT, "--limit", min=1, max=MAX_SEARCH_LIMIT, help="At most this many turns."
    ),
    as_json: bool = JSON,
) -> None:
    """Find turns containing QUERY, newest first."""
    turns = Store().search(query, conversation=conversation, limit=limit)
    print_turns(turns, as_json, show_conversation=True)


@app.command("rm")
def remove(
    turn_ids: list[int] = TURN_IDS,
    conversation: str = typer.Option(None, "--conversation", "-c", help="The conversation."),
    from_seq: int = typer.Option(
        None, "--from", min=1, help="First turn number (#) of a range (default: the first)."
    ),
    to_seq: int = typer.Option(
        None, "--to", min=1, help="Last turn number (#) of a range (default: the last)."
    ),
    everything: bool = typer.Option(False, "--all", help="The whole conversation."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask; needed off a terminal."),
    with_mentions: bool = typer.Option(
        False,
        "--with-mentions",
        help="With IDs: also delete the turns that may repeat a deleted turn (its reply, "
        "a turn quoting it whole).",
    ),
) -> None:
    """Delete turns for good, and the summaries built from them.

    One or more turns: `rm ID...`; a range of turn numbers: `rm -c NAME --from 3 --to 8`;
    a whole conversation: `rm -c NAME --all`. A range or a whole conversation is asked about
    first on a terminal, and needs --yes elsewhere (as `memory clear` does).

    The reply to a deleted message may repeat it, as may a later turn: they are listed, and
    --with-mentions deletes them too (as `memory rm` does for a fact).
    """
    store = Store()
    ranged = from_seq is not None or to_seq is not None
    if with_mentions and not turn_ids:
        raise InputError("--with-mentions goes with turn IDs: `history rm ID... --with-mentions`")
    if turn_ids and conversation is None and not ranged and not everything:
        deletion = store.delete_turns(turn_ids, with_mentions)
    elif conversation is not None and not turn_ids and everything and not ranged:
        turns = store.conversation(conversation).turn_count  # an unknown name fails here
        confirm(f"Delete conversation {conversation!r} ({plural(turns, 'turn')}) for good?", yes)
        deletion = store.delete_conversation(conversation)
    elif conversation is not None and not turn_ids and ranged and not everything:
        first = 1 if from_seq is None else from_seq
        span = f"{first}..{'' if to_seq is None else to_seq}"
        confirm(f"Delete turns {span} of conversation {conversation!r} for good?", yes)
        last = LAST_SEQ if to_seq is None else to_seq
        deletion = store.delete_turn_range(conversation, first, last)
    else:
        raise InputError(
            "say what to delete: ID..., or --conversation NAME with --from/--to or --all"
        )
    say(deletion.describe())
    if deletion.mentions:
        say(f"{plural(len(deletion.mentions), 'turn')} of the log may still repeat it:")
        for turn in deletion.mentions:
            say(f"  [{turn.id}] {turn.conversation} #{turn.seq} {turn.role}: {turn.text}")
        say("Delete them with `mlxmem history rm ID...`, or rerun with --with-mentions.")


def print_summaries(summaries: list[Summary], as_json: bool, last: int | None) -> None:
    if last is not None:
        summaries = summaries[-last:]
    if listed_plainly(summaries, as_json, "No summaries."):
        return
    table = Table("id", "turns", "source", "tokens", "written", "text")
    for s in summaries:
        table.add_row(
            str(s.id),
            f"{s.first_seq}-{s.last_seq}",
            s.source or "unknown",
            str(s.token_count or ""),
            local_time(s.created_at),
            shown(s.text),
        )
    out().print(table)


def print_turns(turns: list[Turn], as_json: bool, show_conversation: bool) -> None:
    if listed_plainly(turns, as_json, "No turns."):
        return
    columns = ["id", "conversation", "#", "role", "text"]
    table = Table(*(columns if show_conversation else columns[:1] + columns[2:]))
    for i, m in enumerate(turns):
        text = shown(m.text)
        if m.interrupted:
            text.append(" [interrupted]", style="dim")
        after = turns[i + 1] if i + 1 < len(turns) else None
        if m.role == "user" and after and after.role == "user" and not show_conversation:
            text.append(" [unanswered]", style="dim")
        cells: list[str | Text] = [str(m.id), shown(m.conversation), str(m.seq), m.role, text]
        table.add_row(*(cells if show_conversation else cells[:1] + cells[2:]))
    out().print(table)
