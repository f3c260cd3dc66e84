"""`mlxmem`: the root command, joining one sub-app per group."""

import os

import typer

from mlxmem import __version__
from mlxmem.cpu import reexec_with_openblas

from . import bench, chat, eval, history, memory, models, serve, sync
from .common import ErrorsAsMessages

app = typer.Typer(
    name="mlxmem",
    help="Long memory for small on-device language models on MLX.\n\n"
    "Your chats live in a DuckDB file in the data directory ($MLXMEM_HOME, else the platform's "
    "user data dir); the model sees a rolling summary, the newest turns and a few facts about "
    "you that you can list, edit and delete.",
    no_args_is_help=True,
    add_completion=False,
    cls=ErrorsAsMessages,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlxmem {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Long memory for small on-device language models on MLX."""
    # Every file mlxmem creates (the database, its WAL and compaction copies, caches, models)
    # is born readable by the person only, with no window before a chmod.
    os.umask(0o077)


chat.register(app)
serve.register(app)
app.add_typer(memory.app, name="memory")
app.add_typer(history.app, name="history")
app.add_typer(bench.app, name="bench")
app.add_typer(eval.app, name="eval")
app.add_typer(models.app, name="models")
sync.register(app)


def run() -> None:
    """The `mlxmem` command: on Linux with a system OpenBLAS, first re-run this process with
    it preloaded (prefill several times faster on the CPU, see mlxmem.cpu), then the app."""
    reexec_with_openblas()
    app(prog_name="mlxmem")
