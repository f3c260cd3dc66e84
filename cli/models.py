"""`mlxmem models`."""

import typer

app = typer.Typer(help="models commands.", no_args_is_help=True)
