"""`mlxmem serve`: an OpenAI-compatible HTTP API, a memory API and a small page, over the same
library calls as the command line. One thread owns the model and serves turns first come first
served; each conversation keeps its own KV slot."""

from mlxmem.defaults import DEFAULT_CONVERSATION

from .app import App
from .http import Server, check_binding
from .service import ChatService, ServeConfig
from .worker import ModelWorker

__all__ = [
    "App",
    "ChatService",
    "ModelWorker",
    "Server",
    "ServeConfig",
    "check_binding",
    "make_server",
]


def make_server(
    load_engine,
    config: ServeConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    default_conversation: str = DEFAULT_CONVERSATION,
    log_requests: bool = False,
    allow_remote: bool = False,
) -> Server:
    """Bind the server (port 0: any free one), then load the model on its own thread; call
    `serve_forever()` or `start()`, then `close()`."""
    server = Server((host, port), None)  # first: a port that is taken fails before the load
    try:
        worker = ModelWorker(load_engine)
    except BaseException:
        server.server_close()
        raise
    server.app = App(
        ChatService(worker, config), default_conversation, token, log_requests, allow_remote
    )
    return server
