"""What every layer checks about text, the one clock (timestamps are UTC), and records as
every front end shows them."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from mlxmem.errors import InputError

# The roles of logged turns; the system message is assembled, never logged.
ROLES = ("user", "assistant")
# What a chat message opens with when it speaks to someone ("Hey Mel!", "Thanks, Caroline!"),
# as regular-expression alternations: the summary's check and fact extraction read them alike.
GREETING_WORDS = r"hey|hi|hello|hiya|dear"
THANKS_WORDS = r"thanks|thank you|congrats|congratulations"
# Words a reply may open with before the name it speaks to ("Yeah, Mel, ...", "Wow, Caroline!").
INTERJECTION_WORDS = r"wow|aw+|oh|yeah|yes|ok|okay"


def check_text(text: object, what: str = "message", allow_empty: bool = True) -> str:
    """`text` if it is a str that encodes as UTF-8 (no lone surrogates from invalid input),
    else InputError; with `allow_empty=False` blank text is refused too."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be text, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what} is not valid UTF-8 text (it has a lone surrogate)") from None
    if not allow_empty and not text.strip():
        raise InputError(f"{what} is empty")
    return text


# Control characters a terminal acts on: C0 but tab and newline, DEL, and C1 (0x9b is CSI on
# some terminals). ESC alone starts OSC 52 (a clipboard write), a screen clear or a title.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def visible_controls(text: str) -> str:
    """`text` as a terminal may show it: each control character it would act on is written out
    as `\\x1b` and the like, so stored text (an import, a synced file, a model's reply) can never
    drive the terminal. JSON output keeps the text exact instead."""
    return text.translate(_CONTROLS)


def name_problem(name: str, what: str = "conversation name") -> str | None:
    """Why check_new_name refuses `name`, or None."""
    try:
        check_new_name(name, what)
    except InputError as exc:
        return str(exc)
    return None


def check_new_name(name: str, what: str = "conversation name") -> str:
    """`name` for something made new, such as a conversation: text (check_text), not blank,
    with no space at either end and no control character. "work " or "new\nline" would list
    as "work" or as two names; a name made before, or on another device, is still read."""
    check_text(name, what, allow_empty=False)
    if name != name.strip():
        raise InputError(f"{what} {visible_controls(repr(name))} starts or ends with a space")
    if visible_controls(name) != name or "\t" in name or "\n" in name:
        raise InputError(f"{what} {visible_controls(repr(name))} holds a control character")
    return name


_JSON_KINDS = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def a_kind(value: object) -> str:
    """What `value` is, as an error names it to a person who wrote JSON or TOML: "a whole
    number", "an object", "null" (Python's type names read "a int", "a dict")."""
    return kind_name(type(value))


def kind_name(kind: type) -> str:
    """The kind `kind` as a_kind names its values."""
    return _JSON_KINDS.get(kind) or f"a {kind.__name__}"


def utc_now() -> datetime:
    """Now, timezone-aware UTC."""
    return datetime.now(timezone.utc)


def as_utc(value: datetime) -> datetime:
    """A naive UTC timestamp as stored by DuckDB, made timezone-aware."""
    return value.replace(tzinfo=timezone.utc)


def to_db(value: datetime) -> datetime:
    """A timezone-aware timestamp as DuckDB's naive UTC TIMESTAMP."""
    return value.astimezone(timezone.utc).replace(tzinfo=None)


# Token ids kept for the model's KV cache: not for people or scripts reading the log.
INTERNAL_FIELDS = {"sampled_ids", "sampled_by"}
# Keys renamed since scripts first read them (new -> old): the JSON keeps the old key beside the
# new one. A record's fields, and the counts of a log's turns in reports.
OLD_FIELD_NAMES = {"turn_id": "message_id", "turn_count": "message_count"}
OLD_COUNT_NAMES = {"turns": "messages", "per_100_turns": "per_100_messages"}


def with_old_names(fields: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """`fields` with each key renamed in `renamed` (new -> old) also under its old name."""
    return fields | {old: fields[new] for new, old in renamed.items() if new in fields}


def json_ready(value: Any) -> dict[str, Any]:
    """A dataclass (a turn, a fact, ...) as a JSON-ready dict, with ISO 8601 timestamps and no
    internal fields: what every front end shows. A renamed field is also under its old name."""
    fields = {
        key: item.isoformat() if isinstance(item, datetime) else item
        for key, item in asdict(value).items()
        if key not in INTERNAL_FIELDS
    }
    return with_old_names(fields, OLD_FIELD_NAMES)


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"
