"""OpenAI's chat-completions schema, as far as mlxmem speaks it: reading a request into one
turn, writing replies, chunks and usage, and errors in OpenAI's shape."""

from __future__ import annotations

import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field

from mlxmem.engine import GenerationStats
from mlxmem.errors import (
    DuplicateFactError,
    InputError,
    MlxmemError,
    NotFoundError,
    StaleError,
    StoreError,
)
from mlxmem.text import a_kind, kind_name

# Roles a client may send: a system (or developer) message is read and ignored (mlxmem's own
# instructions head the prompt); user and assistant messages are the conversation.
IGNORED_ROLES = ("system", "developer")
CONVERSATION_ROLES = ("user", "assistant")


class ApiError(Exception):
    """An error answered as `{"error": {"message", "type", "param", "code"}}` with `status`."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    @property
    def kind(self) -> str:
        if self.status == 401:
            return "authentication_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def api_error(exc: Exception) -> ApiError:
    """Any error as an HTTP error. mlxmem's typed errors: bad input 400, unknown id 404, a
    result a deletion made stale 409, a database held elsewhere 503; anything else is a 500
    (the caller logs it)."""
    if isinstance(exc, ApiError):
        return exc
    if not isinstance(exc, MlxmemError):
        return ApiError(500, "internal error (see the server's log)", "internal")
    if isinstance(exc, NotFoundError):
        return ApiError(404, str(exc), "not_found")
    if isinstance(exc, StaleError):
        return ApiError(409, str(exc), "conflict")
    if isinstance(exc, DuplicateFactError):
        return ApiError(409, str(exc), "duplicate_fact")
    if isinstance(exc, StoreError):
        return ApiError(503, str(exc), "store_unavailable")
    if isinstance(exc, InputError):
        return ApiError(400, str(exc), "invalid_input")
    return ApiError(422, str(exc), "unprocessable")


def log_failure(exc: BaseException, error: ApiError) -> None:
    """Log a request that failed on the server's side (5xx): one line for an expected
    refusal (too many requests waiting, the database held elsewhere), the traceback for a
    bug. A 4xx is the client's, and is answered, not logged."""
    if error.status < 500:
        return
    if isinstance(exc, ApiError | MlxmemError):
        print(f"mlxmem serve: {error.status} {error.code}: {error.message}", file=sys.stderr)
    else:
        traceback.print_exception(exc, file=sys.stderr)


@dataclass(frozen=True)
class ChatRequest:
    """One chat-completions request as one turn: the new message, the client's view of the
    conversation before it, and the sampling options it set (None: the server's)."""

    conversation: str
    text: str
    history: list[tuple[str, str]] = field(default_factory=list)  # (role, content), oldest first
    stream: bool = False
    include_usage: bool = False
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    seed: int | None = None


def parse_chat_request(body: dict, model: str, conversation: str) -> ChatRequest:
    """Check a request body against the served `model`; `conversation` is the one the request
    named (header or `user` field, see `conversation_of`)."""
    requested = _optional(body, "model", str)
    if requested is not None and requested != model:
        raise ApiError(
            404,
            f"the model {requested!r} is not served here; use {model!r}",
            "model_not_found",
            "model",
        )
    n = _optional(body, "n", int)
    if n not in (None, 1):
        raise ApiError(400, "only n=1 is supported", "unsupported", "n")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "invalid_messages", "messages")
    said = [m for m in (_message(m, i) for i, m in enumerate(messages)) if m is not None]
    if not said or said[-1][0] != "user":
        raise ApiError(
            400, "the last message must come from the user", "invalid_messages", "messages"
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "invalid_type", "stream_options")
    return ChatRequest(
        conversation=conversation,
        text=said[-1][1],
        history=said[:-1],
        stream=bool(_optional(body, "stream", bool)),
        include_usage=bool(options and _optional(options, "include_usage", bool)),
        temperature=_bounded(body, "temperature", 0.0, 2.0),
        top_p=_bounded(body, "top_p", 0.0, 1.0),
        max_tokens=_positive(body, "max_completion_tokens") or _positive(body, "max_tokens"),
        seed=_seed(body),
    )


def _seed(body: dict) -> int | None:
    """MLX seeds are unsigned 64-bit: anything else is refused before the message is logged."""
    seed = _optional(body, "seed", int)
    if seed is not None and not 0 <= seed < 2**64:
        raise ApiError(400, "seed must be from 0 to 2**64 - 1", "invalid_value", "seed")
    return seed


def conversation_of(body: dict, header: str | None, default: str) -> str:
    """The conversation a request continues: the `X-Mlxmem-Conversation` header, else the
    request's `user` field, else `default`; header and field must agree when both are given."""
    user = _optional(body, "user", str)
    if header is not None and user is not None and header != user:
        raise ApiError(
            400,
            f"the header names conversation {header!r} and the user field {user!r}; give one",
            "conversation_mismatch",
            "user",
        )
    name = header if header is not None else user
    if name is None:
        return default
    if not name.strip() or len(name) > 200:
        raise ApiError(400, "a conversation name is 1 to 200 characters", "invalid_value", "user")
    return name


def _message(message: object, i: int) -> tuple[str, str] | None:
    """(role, text) of a message, or None for a system message."""
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object", "invalid_type", where)
    role = message.get("role")
    if role in IGNORED_ROLES:
        return None
    if role not in CONVERSATION_ROLES:
        raise ApiError(
            400,
            f"{where}.role must be user, assistant or system, not {role!r}",
            "invalid_value",
            f"{where}.role",
        )
    return role, _content(message.get("content"), f"{where}.content")


def _content(content: object, where: str) -> str:
    """A message's text: a string, or a list of text parts (OpenAI's other form)."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else None
    if parts is not None and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in parts
    ):
        return "".join(p["text"] for p in parts)
    raise ApiError(400, f"{where} must be a string or a list of text parts", "invalid_type", where)


def _optional(body: dict, key: str, kind: type):
    value = body.get(key)
    # bool is an int to Python, not to JSON: true is no seed.
    if value is None or (isinstance(value, kind) and (kind is bool or not isinstance(value, bool))):
        return value
    raise ApiError(
        400, f"{key} must be {kind_name(kind)}, not {a_kind(value)}", "invalid_type", key
    )


def _bounded(body: dict, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ApiError(400, f"{key} must be a number from {low} to {high}", "invalid_value", key)
    return float(value)


def _positive(body: dict, key: str) -> int | None:
    value = _optional(body, key, int)
    if value is not None and value < 1:
        raise ApiError(400, f"{key} must be at least 1", "invalid_value", key)
    return value


# -- replies ---------------------------------------------------------------------------------


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def finish_reason(stats: GenerationStats) -> str:
    return "length" if stats.finish_reason == "length" else "stop"


def completion(cid: str, model: str, reply: str, stats: GenerationStats) -> dict:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply},
                "finish_reason": finish_reason(stats),
            }
        ],
        "usage": usage(stats),
    }


def chunk(cid: str, model: str, delta: dict, finish: str | None = None) -> dict:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(cid: str, model: str, stats: GenerationStats) -> dict:
    """The last chunk when the client asked for `stream_options.include_usage`."""
    return {**chunk(cid, model, {}), "choices": [], "usage": usage(stats)}
