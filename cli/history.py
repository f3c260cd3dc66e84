"""`mlxmem history`."""

import typer

app = typer.Typer(help="history commands.", no_args_is_help=True)
