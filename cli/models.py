"""`mlxmem models`: the registry of models; list them, download one, write a tiny test model."""

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlxmem.models import ModelSpec, ensure_local, is_downloaded, load_registry, resolve

from .common import JSON, print_json

app = typer.Typer(
    help="The models mlxmem knows by name (mlxmem/models.toml, plus a models.toml in the data "
    "directory): list them, download one now, or write a tiny random-weight test model.",
    no_args_is_help=True,
)


def spec_record(spec: ModelSpec) -> dict[str, Any]:
    """A ModelSpec as a JSON-ready dict, plus whether it is on disk and is the default."""
    return {
        "alias": spec.alias,
        "repo": spec.repo,
        "path": str(spec.path) if spec.path else None,
        "context_tokens": spec.context_tokens,
        "response_reserve": spec.response_reserve,
        "arch": spec.arch,
        "generated": spec.generated,
        "description": spec.description,
        "downloaded": is_downloaded(spec),
        "default": spec.is_default,
    }


@app.command("list")
def list_models(as_json: bool = JSON) -> None:
    """List the model aliases, their token budgets and whether each is on disk."""
    records = [spec_record(spec) for spec in load_registry().values()]
    if as_json:
        print_json(records)
        return
    table = Table("alias", "repo / path", "context", "reserve", "downloaded", caption="* default")
    for r in records:
        alias = f"{r['alias']} *" if r["default"] else r["alias"]
        source = Text(r["repo"] or r["path"], overflow="fold")
        context, reserve = str(r["context_tokens"]), str(r["response_reserve"])
        table.add_row(alias, source, context, reserve, "yes" if r["downloaded"] else "no")
    Console().print(table)


@app.command("pull")
def pull(
    alias: str = typer.Argument(..., help="An alias (see `models list`) or a hub repo id."),
) -> None:
    """Download a model now (with progress bars), so that chats work offline later."""
    spec = resolve(alias)
    was_on_disk = is_downloaded(spec)
    path = ensure_local(spec, progress=True, pull=True)
    typer.echo(f"{'Already on disk' if was_on_disk else 'Ready'}: {path}")


# Module-level, as ruff's B008 asks for a default that is not a plain immutable value.
TINY_PATH = typer.Argument(..., metavar="PATH", help="Directory to write the model into.")


@app.command("make-tiny")
def make_tiny(
    path: Path = TINY_PATH,
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    quantize: int | None = typer.Option(
        None, "--quantize", metavar="BITS", help="Quantize the weights to BITS (e.g. 4)."
    ),
) -> None:
    """Write a tiny model with RANDOM WEIGHTS: its output is gibberish.

    It exists to test the machinery offline (token budgets, KV-cache reuse,
    speed), never to judge answers: Llama architecture, a small tokenizer
    trained on the spot, a Llama-3 style chat template. Use it with
    --model PATH, or load it with mlx_lm.load(PATH).
    """

    from mlxmem.tiny import make_tiny as write_tiny

    start = time.perf_counter()
    written = write_tiny(path, seed=seed, quantize=quantize)
    seconds = time.perf_counter() - start
    typer.echo(f"Wrote a random-weight tiny model to {written} in {seconds:.1f} s")
