"""The HTTP server: the standard library's ThreadingHTTPServer (one thread per connection,
as mlx_lm.server), a route table, bearer-token auth, OpenAI-shaped errors, and the page."""

from __future__ import annotations

import ipaddress
import json
import re
import select
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import unquote, urlsplit

from mlxmem import __version__
from mlxmem.errors import InputError

from . import memory_api
from .app import App, check_auth, check_origin
from .chat import chat_completions, list_models
from .request import Request
from .schema import ApiError, api_error, log_failure

# A connection idle this long (no request, or a client that stops sending) is closed.
IDLE_TIMEOUT_S = 60
# A request must arrive whole (its line, headers and body) this long after its first byte
# was awaited: the idle timeout applies per read, so a client trickling a byte every few
# seconds would otherwise hold its thread for ever (slowloris).
REQUEST_DEADLINE_S = 120.0
# After refusing a body unread (413), the rest of it is read and dropped for at most this long
# (and this many bytes), so that the client, still sending, gets to read the answer.
DRAIN_S, DRAIN_BYTES = 5.0, 64 * 1024 * 1024
PAGE_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

# The page has buttons that delete for good: no other site may frame it (clickjacking), and it
# loads nothing from elsewhere. Inline style attributes stay allowed (the context bar's widths).
PAGE_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline';"
    " frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
}


def page(req: Request, name: str = "index.html") -> None:
    if name not in PAGE_FILES:
        raise ApiError(404, f"no page file {name!r}", "not_found")
    data = resources.files("mlxmem.serve").joinpath("static").joinpath(name).read_bytes()
    req.handler.send_body(200, data, PAGE_FILES[name], PAGE_HEADERS)


Handler = Callable[..., "tuple[int, dict] | None"]
ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", r"/", page),
    ("GET", r"/static/([\w.]+)", page),
    ("GET", r"/v1/models", list_models),
    ("POST", r"/v1/chat/completions", chat_completions),
    ("GET", r"/v1/memory/facts", memory_api.list_facts),
    ("POST", r"/v1/memory/facts", memory_api.add_fact),
    ("PATCH", r"/v1/memory/facts/(\d{1,18})", memory_api.edit_fact),
    ("DELETE", r"/v1/memory/facts/(\d{1,18})", memory_api.delete_fact),
    ("POST", r"/v1/memory/facts/(\d{1,18})/restore", memory_api.restore_fact),
    ("GET", r"/v1/memory/conversations", memory_api.list_conversations),
    ("GET", r"/v1/memory/conversations/([^/]+)", memory_api.show_conversation),
    ("PATCH", r"/v1/memory/conversations/([^/]+)", memory_api.set_conversation),
    ("DELETE", r"/v1/memory/conversations/([^/]+)", memory_api.delete_conversation),
    ("DELETE", r"/v1/memory/turns/(\d{1,18})", memory_api.delete_turn),
    ("GET", r"/v1/memory/search", memory_api.search),
    ("GET", r"/v1/memory/context", memory_api.context),
]


def route(method: str, path: str) -> tuple[Handler, list[str]]:
    allowed = []
    for verb, pattern, handler in ROUTES:
        found = re.fullmatch(pattern, path)
        if found:
            if verb == method:
                return handler, [unquote(group) for group in found.groups()]
            allowed.append(verb)
    if allowed:
        raise ApiError(
            405,
            f"{method} is not allowed on {path}; use {', '.join(allowed)}",
            "method_not_allowed",
        )
    raise ApiError(404, f"no endpoint {path}", "not_found")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], app: App | None):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, RequestHandler)
        self.app = app  # set before serving

    @property
    def serving(self) -> App:
        """The app requests go to: make_server sets it before any request is served."""
        if self.app is None:
            raise RuntimeError("the server has no app yet")
        return self.app

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        assert isinstance(host, str)  # an AF_INET or AF_INET6 address names its host as text
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self) -> threading.Thread:
        """Serve on a background thread (tests, benchmarks); `close()` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="mlxmem-http", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.serving.service.close()


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"mlxmem/{__version__}"
    timeout = IDLE_TIMEOUT_S
    # Stream chunks are small writes: without TCP_NODELAY each can wait on a delayed ACK
    # (~40 ms on Linux loopback).
    disable_nagle_algorithm = True
    server: Server

    request_deadline = REQUEST_DEADLINE_S
    _deadline: threading.Timer | None = None

    def handle_one_request(self) -> None:
        # The watchdog shuts the socket down if the request has not arrived whole in time:
        # the blocked read then ends, and the connection with it. The reply is not timed.
        self._watch = threading.Lock()
        self._cut_off = False
        self._deadline = threading.Timer(self.request_deadline, self._too_slow)
        self._deadline.daemon = True
        self._deadline.start()
        try:
            super().handle_one_request()
        finally:
            self.request_read()

    def request_read(self) -> bool:
        """The request has arrived whole: stop the watchdog. False if it fired first (the
        request was cut off: nothing may be done for it)."""
        with self._watch:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            return not self._cut_off

    def _too_slow(self) -> None:
        with self._watch:
            if self._deadline is None:
                return  # arrived whole while the timer was firing
            self._cut_off = True
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def do_GET(self) -> None:
        self.dispatch()

    # Every method goes through dispatch(), so an unknown one gets an OpenAI-shaped 405.
    do_POST = do_PATCH = do_DELETE = do_PUT = do_HEAD = do_OPTIONS = do_GET

    def dispatch(self) -> None:
        req = None
        try:
            app = self.server.serving
            url = urlsplit(self.path)
            is_page = url.path == "/" or url.path.startswith("/static/")
            if self.command == "HEAD":
                self.close_connection = True  # its answer has a body the client will not read
            check_origin(self.headers.get("Host"), self.headers.get("Origin"), app.allow_remote)
            try:
                check_auth(self.headers.get("Authorization"), app.token)
            except ApiError as exc:
                challenge = 'Basic realm="mlxmem"' if is_page else "Bearer"
                self.fail(exc, None, {"WWW-Authenticate": challenge})
                return
            if self._cut_off:  # the headers "ended" because the watchdog closed the socket
                self.close_connection = True
                return
            req = Request(self, app, self.command, url.path, url.query)
            handler, args = route(self.command, url.path)
            if req.unread_body and self.command not in ("POST", "PATCH"):
                req.discard_body()  # read under the watchdog, so the answer is not timed
                self.close_connection = True  # a body nobody takes ends the connection
            if not req.unread_body and not self.request_read():
                self.close_connection = True
                return
            result = handler(req, *args)
            if req.unread_body:  # a body nobody read must not be parsed as the next request
                self.close_connection = True
            if result is not None:
                self.send_json(*result)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away; nothing to answer
        except Exception as exc:  # noqa: BLE001 - one failed request must not stop the server
            error = api_error(exc)
            log_failure(exc, error)
            self.fail(error, req)

    def send_json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, ensure_ascii=False, default=str).encode()
        self.send_body(status, data, "application/json", headers)

    def send_body(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def fail(self, exc: ApiError, req: Request | None, headers: dict | None = None) -> None:
        """Answer an error. A body left unread (too large, or never looked at) ends the
        connection: it is drained, not parsed, so the client can read the answer."""
        lengths = [v.strip() for v in self.headers.get_all("Content-Length") or []]
        if len(lengths) > 1:
            unread = True  # where its body ends is unknown: nothing after it is a request
        elif req is not None:
            unread = req.unread_body
        else:
            length = bool(lengths) and lengths[0] not in ("", "0")
            unread = length or "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        if unread:
            self.close_connection = True
        try:
            self.send_json(exc.status, exc.body(), headers)
            if unread:
                self.wfile.flush()
                self.drain()
        except OSError:
            self.close_connection = True

    def drain(self) -> None:
        self.connection.shutdown(socket.SHUT_WR)
        deadline, seen = time.monotonic() + DRAIN_S, 0
        while time.monotonic() < deadline and seen < DRAIN_BYTES:
            ready, _, _ = select.select([self.connection], [], [], 0.1)
            if ready:
                data = self.connection.recv(1 << 16)
                if not data:
                    return
                seen += len(data)

    def client_gone(self) -> bool:
        """Has the client closed the connection (read side at end of file)?"""
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None):
        """http.server's own refusals (a malformed request line, headers too long) as JSON."""
        self.close_connection = True
        try:
            error = ApiError(code, message or explain or "bad request", "bad_request")
            self.send_json(code, error.body())
        except OSError:
            pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # The path without its query: a query can carry the person's text (?q=, ?draft=).
        app = self.server.app
        if app is not None and app.log_requests:
            path = urlsplit(getattr(self, "path", "")).path
            self.log_message("%s %s %s", getattr(self, "command", "-"), path, code)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        if self.server.app is not None and self.server.app.log_requests:
            super().log_message(format, *args)


def check_binding(host: str, allow_remote: bool, token: str | None) -> None:
    """Loopback only, unless asked: another address needs `allow_remote` and a token."""
    if host == "localhost" or _is_loopback(host):
        return
    if not allow_remote:
        raise InputError(f"{host} is not a loopback address; pass --allow-remote to listen on it")
    if not token:
        raise InputError(
            "listening beyond this machine needs a token: --token or MLXMEM_SERVE_TOKEN"
        )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
