"""The mlxmem command line: a thin Typer layer over the mlxmem library."""
