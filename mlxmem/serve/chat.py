"""`/v1/models` and `/v1/chat/completions`: each request is one turn of one conversation,
answered whole or streamed as server-sent events."""

from __future__ import annotations

import json

from mlxmem.memory.companion import TurnResult
from mlxmem.memory.tables.facts import Fact

from .request import Request
from .schema import (
    ChatRequest,
    api_error,
    chunk,
    completion,
    completion_id,
    conversation_of,
    finish_reason,
    log_failure,
    parse_chat_request,
    usage_chunk,
)

CONVERSATION_HEADER = "X-Mlxmem-Conversation"


def list_models(req: Request) -> tuple[int, dict]:
    model = {"id": req.app.model, "object": "model", "created": req.app.started}
    return 200, {"object": "list", "data": [{**model, "owned_by": "mlxmem"}]}


def chat_completions(req: Request) -> tuple[int, dict] | None:
    app = req.app
    body = req.json()
    header = req.headers.get(CONVERSATION_HEADER)
    conversation = conversation_of(body, header, app.default_conversation)
    request = parse_chat_request(body, app.model, conversation)
    events, job = app.service.start_turn(request)
    turn = events.follow(job, req.handler.client_gone)
    if request.stream:
        _stream(req, turn, events, request)
        return None
    for kind, value in turn:
        if kind == "error":
            raise value
        if kind == "logged":
            result, noted = value
            cid = completion_id()
            body = completion(cid, app.model, result.reply, result.stats)
            return 200, {**body, "mlxmem": extra(conversation, result, noted)}
    return None  # the client went away


def extra(conversation: str, result: TurnResult, noted: list[tuple[Fact, int | None]]) -> dict:
    """mlxmem's own fields beside OpenAI's: where the turn went and what it changed. The
    response ends once the reply is logged, before the memory work after it (a fold, a fact
    noted from the message): `facts_added` are the facts that work noted in this conversation
    since the previous response (from its message, and from earlier ones whose look a request
    postponed), still current now; `fact_added` the newest of them."""
    told = [{"id": f.id, "text": f.text, "replaces": replaced} for f, replaced in noted]
    return {
        "conversation": conversation,
        "interrupted": result.interrupted,
        "discarded": result.discarded,  # a deletion raced the reply: shown, but not logged
        "fact_added": told[-1] if told else None,
        "facts_added": told,
        # Where the turn's time went (as `chat --json` reports it), up to its reply logged.
        "timings": result.timings.to_dict(),
    }


def _stream(req: Request, turn, events, request: ChatRequest) -> None:
    """Server-sent events: `data: {chunk}` lines, then `data: [DONE]`. Errors before the
    message is logged are answered as plain JSON errors, before any event."""
    for kind, value in turn:
        if kind == "error":
            raise value
        if kind == "begun":
            break
    else:
        return  # the client went away while waiting for the model
    handler, model, cid = req.handler, req.app.model, completion_id()
    handler.close_connection = True  # the stream ends with the connection

    def send(data: dict | str) -> None:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        handler.wfile.write(f"data: {text}\n\n".encode())
        handler.wfile.flush()

    try:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        send(chunk(cid, model, {"role": "assistant", "content": ""}))
        for kind, value in turn:
            if kind == "text":
                send(chunk(cid, model, {"content": value}))
            elif kind == "logged":
                result, noted = value
                last = chunk(cid, model, {}, finish_reason(result.stats))
                send({**last, "mlxmem": extra(request.conversation, result, noted)})
                if request.include_usage:
                    send(usage_chunk(cid, model, result.stats))
                send("[DONE]")
            elif kind == "error":
                error = api_error(value)
                log_failure(value, error)
                send(error.body())
    except OSError:  # a broken pipe, a reset, a write timeout: the client is gone
        events.stop.set()  # the reply stops, and is logged as interrupted
