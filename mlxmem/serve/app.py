"""What every request of `mlxmem serve` shares: the chat service, the served model's name, the
token, and the checks of where a request comes from."""

from __future__ import annotations

import base64
import hmac
import time

from .schema import ApiError
from .service import ChatService

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def _host_name(host: str) -> str:
    """The name in a Host header, without its port: "127.0.0.1:8080", "[::1]:8080"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


class App:
    """What every request shares: the chat service, the served model's name, the token."""

    def __init__(
        self,
        service: ChatService,
        default_conversation: str,
        token: str | None = None,
        log_requests: bool = False,
        allow_remote: bool = False,
    ):
        self.service = service
        self.model = service.config.model
        self.default_conversation = default_conversation
        self.token = token
        self.log_requests = log_requests
        self.allow_remote = allow_remote
        self.started = int(time.time())


def check_origin(host: str | None, origin: str | None, allow_remote: bool = False) -> None:
    """Keep other web sites out of a loopback server. A page elsewhere could send requests
    here from the person's browser, or rebind its own host name to 127.0.0.1 and read the
    answers: so the Host must name loopback (unless `allow_remote`, where the token guards),
    and a browser's Origin, when sent, must be this server's. (`serve` and `mcp --http`.)"""
    if not host:
        raise ApiError(400, "the request has no Host header", "invalid_header")
    if not allow_remote and _host_name(host) not in LOOPBACK_NAMES:
        raise ApiError(403, f"Host {host!r} is not this loopback server", "forbidden_host")
    if origin is not None and origin != f"http://{host}":
        raise ApiError(403, f"requests from {origin} are not allowed", "forbidden_origin")


def check_auth(header: str | None, token: str | None) -> None:
    """With a token, every request carries it: `Authorization: Bearer TOKEN`, or (for a
    browser opening the page) HTTP Basic with the token as the password."""
    if token is None:
        return
    scheme, _, value = (header or "").partition(" ")
    given = value.strip()
    if scheme.lower() == "basic":
        try:
            given = base64.b64decode(given, validate=True).decode().partition(":")[2]
        except ValueError:
            given = ""
    elif scheme.lower() != "bearer":
        given = ""
    if not (given and hmac.compare_digest(given.encode(), token.encode())):
        raise ApiError(401, "this server needs `Authorization: Bearer TOKEN`", "invalid_api_key")
