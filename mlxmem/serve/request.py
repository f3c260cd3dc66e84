"""One HTTP request as the endpoints see it: path, query, headers, and a JSON body read only
after its declared size was checked."""

from __future__ import annotations

import json
import re
from email.message import Message
from io import BufferedIOBase
from typing import Protocol
from urllib.parse import parse_qsl

from .app import App
from .schema import ApiError

# The largest request body read. A message is at most 100,000 characters (400 KB of UTF-8);
# this leaves room for a client that sends a long conversation's history with it.
MAX_BODY_BYTES = 4 * 1024 * 1024
_DIGITS = re.compile(r"[0-9]+")  # not str.isdigit(), which takes "²"


class Connection(Protocol):
    """What an endpoint may do with the connection a request came on (serve.http's
    RequestHandler): read the body, answer, stream, and see whether the client left."""

    headers: Message
    rfile: BufferedIOBase
    wfile: BufferedIOBase
    close_connection: bool

    def request_read(self) -> bool: ...
    def client_gone(self) -> bool: ...
    def send_response(self, code: int, message: str | None = None) -> None: ...
    def send_header(self, keyword: str, value: str) -> None: ...
    def end_headers(self) -> None: ...
    def send_body(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None: ...


class Request:
    def __init__(self, handler: Connection, app: App, method: str, path: str, query: str):
        self.handler = handler
        self.app = app  # what every request shares
        self.method = method
        self.path = path
        self.query = dict(parse_qsl(query))
        self.headers = handler.headers
        self.unread_body = self._declared_length() > 0 or self.chunked
        self._body: dict | None = None

    def json(self) -> dict:
        """The body as a JSON object; too large (413) is refused by its Content-Length before
        a byte of it is read."""
        if self._body is not None:
            return self._body
        kind = self.headers.get("Content-Type", "").partition(";")[0].strip().lower()
        if kind != "application/json":
            # A browser page of another site can send a text/plain POST without asking first;
            # application/json it cannot, so this also keeps such pages out.
            raise ApiError(415, "send the body as Content-Type: application/json", "invalid_type")
        data = self._read_body()
        try:
            body = json.loads(data)
        except ValueError as exc:  # bad UTF-8 or JSON, or an integer over Python's 4,300 digits
            raise ApiError(400, f"the body is not valid JSON ({exc})", "invalid_json") from None
        except RecursionError:
            raise ApiError(400, "the body is nested too deeply", "invalid_json") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object", "invalid_json")
        self._body = body
        return body

    def text_field(self, key: str) -> str:
        value = self.json().get(key)
        if not isinstance(value, str):
            raise ApiError(400, f"{key} must be a string", "invalid_type", key)
        return value

    def number(self, name: str) -> int | None:
        """A positive whole-number query parameter, or None if absent."""
        text = self.query.get(name)
        if text is None:
            return None
        if not _DIGITS.fullmatch(text) or len(text) > 18 or int(text) < 1:
            raise ApiError(
                400, f"{name} must be a whole number from 1, not {text!r}", "invalid_value", name
            )
        return int(text)

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("1", "true", "yes")

    def discard_body(self) -> None:
        """Read and drop a body the endpoint does not take (a GET or DELETE may carry one),
        so that the request is whole before its answer, which may wait for the model."""
        self._read_body()

    def _read_body(self) -> bytes:
        """The body, whole, by its Content-Length; too large (413) is refused before a byte
        of it is read, and one the watchdog cut off (408) is not used."""
        if self.chunked:
            raise ApiError(411, "send the body with a Content-Length", "length_required")
        length = self._declared_length()
        if length > MAX_BODY_BYTES:
            raise ApiError(
                413,
                f"the request body has {length:,} bytes, over the limit of {MAX_BODY_BYTES:,}",
                "request_too_large",
            )
        try:
            data = self.handler.rfile.read(length)
        except TimeoutError:
            raise ApiError(408, "the request body stopped arriving", "timeout") from None
        if not self.handler.request_read():
            raise ApiError(408, "the request did not arrive in time", "timeout")
        self.unread_body = False
        if len(data) < length:
            raise ApiError(400, "the request body ended early", "incomplete_body")
        return data

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("Transfer-Encoding", "").lower()

    def _declared_length(self) -> int:
        declared = self.headers.get_all("Content-Length") or ["0"]
        if len(declared) > 1:  # which one frames the body? a proxy may pick the other
            raise ApiError(400, "the request has two Content-Length headers", "invalid_header")
        text = declared[0].strip()
        if not _DIGITS.fullmatch(text) or len(text) > 18:
            raise ApiError(400, f"Content-Length must be a number, not {text!r}", "invalid_header")
        return int(text)
