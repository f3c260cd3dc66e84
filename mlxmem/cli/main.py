"""`mlxmem`: the root command. Each subcommand's module is imported only when that subcommand
runs (or shows its help), so `mlxmem memory list` or `mlxmem --version` never loads MLX, and only
the commands that run a model re-execute with OpenBLAS."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

import typer

from mlxmem import __version__

from .common import ErrorsAsMessages, one_line_warnings, plain_typer

if TYPE_CHECKING:
    # Typer (0.29) has its own copy of click: its groups take and give these types.
    from typer._click import Command, Context, HelpFormatter

# name -> (module under mlxmem.cli, its Typer app or command function, the one line shown by
# `mlxmem --help`; a test checks that line against the command's own help).
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "chat": ("chat", "chat", "Chat with a model that remembers."),
    "serve": ("serve", "serve", "Serve the model over HTTP: OpenAI's /v1/chat/completions, ..."),
    "mcp": ("mcp", "mcp", "Serve the memory over the Model Context Protocol: tools to list, ..."),
    "memory": ("memory", "app", "The facts about you that the model sees (layer 3)."),
    "history": ("history", "app", "The chat log (layer 2): every turn, whole and unchanged."),
    "models": ("models", "app", "The models mlxmem knows by name."),
    "sync": ("sync", "sync_command", "Sync your chats and facts with your other devices."),
    "export": ("sync", "export_command", "Write your whole chat log, your facts and the ..."),
    "import": ("sync", "import_command", "Merge an export file into this data directory."),
    "bench": ("bench", "app", "Measure mlxmem against the baselines a user would otherwise use."),
    "eval": ("eval", "app", "Measure what the memory remembers."),
}
# The commands that run a model, and so want OpenBLAS on a CPU (see mlxmem.cpu).
MODEL_COMMANDS = {"chat", "serve", "bench", "eval"}


class LazyGroup(ErrorsAsMessages):
    """The root group: finds a subcommand by importing its module when it is asked for."""

    def list_commands(self, ctx: Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: Context, name: str) -> Command | None:
        if name not in SUBCOMMANDS:
            return None
        module, attr, _ = SUBCOMMANDS[name]
        found = getattr(importlib.import_module(f"mlxmem.cli.{module}"), attr)
        command: Command
        if isinstance(found, typer.Typer):  # a group, even of one command (eval)
            command = typer.main.get_group(found)
        else:
            single = plain_typer(add_completion=False)
            single.command(name)(found)
            command = typer.main.get_command(single)
        _help_flags_off_by_default(command, ctx)
        return command

    def get_help_option(self, ctx: Context):
        return _off_by_default(super().get_help_option(ctx))

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        # From the table, not the modules: `mlxmem --help` imports none of them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, _, short) in SUBCOMMANDS.items()])


def _help_flags_off_by_default(command, ctx: Context) -> None:
    """Give every --help flag below `command` the default False. Typer (0.29) leaves it None,
    and a value that is not a bool goes through pydantic, which costs a third of a second of
    imports on every command."""
    _off_by_default(command.get_help_option(ctx))
    for name in getattr(command, "commands", {}):
        _help_flags_off_by_default(command.commands[name], ctx)


def _off_by_default(option):
    if option is not None and option.default is None:
        option.default = False
    return option


app = plain_typer(
    name="mlxmem",
    help="Long memory for small on-device language models on MLX.\n\n"
    "Your chats live in a DuckDB file in the data directory ($MLXMEM_HOME, else the platform's "
    "user data dir); the model sees a rolling summary, the newest turns and a few facts about "
    "you that you can list, edit and delete.",
    no_args_is_help=True,
    add_completion=False,
    cls=LazyGroup,
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
    one_line_warnings()  # every command's, serve's threads' included


def runs_a_model(args: list[str]) -> bool:
    """Whether `mlxmem ARGS` runs a model (help and `bench history` do not)."""
    words = [a for a in args if not a.startswith("-")]
    if not words or words[0] not in MODEL_COMMANDS or "--help" in args:
        return False
    return words[:2] != ["bench", "history"]


def run() -> None:
    """The `mlxmem` command: for a command that runs a model, on Linux with a system OpenBLAS,
    first re-run this process with it preloaded (prefill several times faster on the CPU, see
    mlxmem.cpu); then the app."""
    if runs_a_model(sys.argv[1:]):
        from mlxmem.cpu import reexec_with_openblas

        reexec_with_openblas()
    app(prog_name="mlxmem")
