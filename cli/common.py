"""What every command shares: turning library errors into `Error: ...` and printing JSON."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from mlxmem.errors import MlxmemError

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str) -> typer.Exit:
    """Print `Error: message` on stderr and return the Exit to raise."""
    typer.echo(f"Error: {message}", err=True)
    return typer.Exit(code=1)


def handle_errors(func: F) -> F:
    """Map expected failures to `Error: ...` on stderr and exit code 1, with no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except MlxmemError as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            typer.echo("", err=True)
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]


def print_json(value: Any) -> None:
    json.dump(value, sys.stdout, ensure_ascii=False, indent=2, default=str)
    sys.stdout.write("\n")
