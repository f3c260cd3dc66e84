"""`mlxmem models`: the registry of models; list them, download one, import a GGUF file,
write a tiny test model."""

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
    help="The models mlxmem knows by name (mlxmem/models/models.toml, plus a models.toml in the "
    "data directory): list them, download one now, import a GGUF file, or write a tiny "
    "random-weight test model.",
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
        "source": spec.origin,
        "license": spec.license,
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
    table = Table(caption="* default")
    table.add_column("alias", no_wrap=True)
    for column in ("source", "license", "context", "reserve", "on disk"):
        table.add_column(column)
    for r in records:
        alias = f"{r['alias']} *" if r["default"] else r["alias"]
        source = Text(r["source"], overflow="fold")
        context, reserve = str(r["context_tokens"]), str(r["response_reserve"])
        downloaded = "yes" if r["downloaded"] else "no"
        table.add_row(alias, source, r["license"], context, reserve, downloaded)
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
GGUF_FILE = typer.Argument(..., metavar="FILE", help="A .gguf file (or an Ollama blob).")


@app.command("import-gguf")
def import_gguf(
    gguf: Path = GGUF_FILE,
    name: str | None = typer.Option(
        None, "--name", metavar="ALIAS", help="Alias to register (default: from the metadata)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace a model already imported."),
) -> None:
    """Convert a GGUF file into an MLX model and register an alias for it.

    Supported: llama and qwen2 architectures with F32/F16/BF16/Q4_0/Q4_1/Q8_0 tensors and a
    byte-level BPE tokenizer. Anything else is refused, and nothing is left half-written.
    """
    from mlxmem.models import import_gguf as convert

    result = convert(gguf, alias=name, progress=True, force=force)
    types = ", ".join(f"{n} x{c}" for n, c in sorted(result.tensor_types.items()))
    typer.echo(
        f"Imported {result.arch} model as {result.alias!r} ({types}) into {result.path} "
        f"in {result.seconds:.1f} s. Chat with: mlxmem chat --model {result.alias}"
    )


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

    from mlxmem.models.tiny import make_tiny as write_tiny

    start = time.perf_counter()
    written = write_tiny(path, seed=seed, quantize=quantize)
    seconds = time.perf_counter() - start
    typer.echo(f"Wrote a random-weight tiny model to {written} in {seconds:.1f} s")
