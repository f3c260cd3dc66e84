"""`/v1/memory/...`: the facts, the chat log and the context, as JSON. Each endpoint makes the
same store call as the `mlxmem memory` / `mlxmem history` command of the same purpose, so a
deletion here is the same durable erase, with the same guarantees, answered with
`Deletion.to_json()`. (A deletion bumps the store's forget epoch; the model's thread sees it at
the next turn and drops the KV slots it holds in memory.)"""

from __future__ import annotations

from mlxmem.memory.store import LAST_SEQ, Store
from mlxmem.memory.tables.turns import SEARCH_LIMIT
from mlxmem.text import json_ready

from .request import Request
from .schema import ApiError


def list_facts(req: Request) -> tuple[int, dict]:
    """`?all=true` lists the replaced facts too (as `memory list --all`)."""
    return 200, listing(_store(req).facts(replaced=req.flag("all")))


def add_fact(req: Request) -> tuple[int, dict]:
    """`{"text": ..., "replaces": ID}` marks fact ID replaced by the new one (as `memory add
    --replaces`)."""
    replaces = req.json().get("replaces")
    if replaces is not None and (type(replaces) is not int or replaces < 1):
        raise ApiError(400, "replaces is a fact's id", "invalid_value", "replaces")
    fact = _store(req).add_fact(req.text_field("text"), source="manual", replaces=replaces)
    return 201, json_ready(fact)


def edit_fact(req: Request, fact_id: str) -> tuple[int, dict]:
    fact = _store(req).edit_fact(int(fact_id), req.text_field("text"))
    return 200, json_ready(fact)


def restore_fact(req: Request, fact_id: str) -> tuple[int, dict]:
    """Make a replaced fact current again (as `memory restore`). The body is `{}`: asking for
    a JSON body keeps other sites' pages out, which may POST text/plain without asking."""
    req.json()
    return 200, json_ready(_store(req).restore_fact(int(fact_id)))


def delete_fact(req: Request, fact_id: str) -> tuple[int, dict]:
    """`?with_mentions=true` also deletes the turns that quote the fact (as `memory rm
    --with-mentions`); without it they are listed under `mentions`."""
    return 200, _store(req).delete_facts([int(fact_id)], req.flag("with_mentions")).to_json()


def list_conversations(req: Request) -> tuple[int, dict]:
    """The conversations, and which one a request that names none goes to (`--conversation`)."""
    return 200, {**listing(_store(req).conversations()), "default": req.app.default_conversation}


def set_conversation(req: Request, name: str) -> tuple[int, dict]:
    """`{"private": true}` keeps the conversation out of recall in the others (as `history
    private`); false lets it back in."""
    private = req.json().get("private")
    if not isinstance(private, bool):
        raise ApiError(400, "give private as true or false", "invalid_value", "private")
    return 200, json_ready(_store(req).set_private(name, private))


def show_conversation(req: Request, name: str) -> tuple[int, dict]:
    store = _store(req)
    store.conversation(name)  # an unknown name is a 404, not an empty list
    turns = store.turns(name)
    last = req.number("last")
    return 200, listing(turns[-last:] if last else turns)


def delete_conversation(req: Request, name: str) -> tuple[int, dict]:
    """The whole conversation, or with `?from=A&to=B` the turns numbered A to B."""
    first, last = req.number("from"), req.number("to")
    if first is None and last is None:
        return 200, _store(req).delete_conversation(name).to_json()
    return 200, _store(req).delete_turn_range(name, first or 1, last or LAST_SEQ).to_json()


def delete_turn(req: Request, turn_id: str) -> tuple[int, dict]:
    """`?with_mentions=true` also deletes the turns that may repeat a deleted message (its
    reply, a turn quoting it whole), as `history rm --with-mentions`; without it they are
    listed under `mentions`."""
    return 200, _store(req).delete_turns([int(turn_id)], req.flag("with_mentions")).to_json()


def search(req: Request) -> tuple[int, dict]:
    query = req.query.get("q")
    if not query:
        raise ApiError(400, "search needs ?q=TEXT", "missing_parameter", "q")
    turns = _store(req).search(
        query, conversation=req.query.get("conversation"), limit=req.number("limit") or SEARCH_LIMIT
    )
    return 200, listing(turns)


def context(req: Request) -> tuple[int, dict]:
    """The next prompt by layer, for `?draft=TEXT` with what recall would add (chat's
    `/context`); it waits its turn for the model, which counts the tokens."""
    name = req.query.get("conversation", req.app.default_conversation)
    return 200, req.app.service.context(name, req.query.get("draft") or None)


def listing(items: list) -> dict:
    return {"object": "list", "data": [json_ready(item) for item in items]}


def _store(req: Request) -> Store:
    """The server's store, held for its life (ChatService): one connection for every request."""
    return req.app.service.store
