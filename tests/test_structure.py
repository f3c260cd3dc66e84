"""Who owns what: the package's import graph has no cycle, mlxmem.memory is laid out in layers
that import only downward (the tables' owners, the model's context, the turn, sync), each
table is written by its owner only, the Store stays the chat's small surface (sync and
deletion have modules of their own), and SQL lives in mlxmem.memory."""

from __future__ import annotations

import ast
import inspect
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import mlxmem
from mlxmem.memory.store import Store

PACKAGE = Path(mlxmem.__file__).parent
# Front ends and tools reach the database through mlxmem.memory, never with SQL of their own.
NO_SQL = ("sync", "bench", "eval", "cli", "serve", "surfaces")
MEASUREMENT = ("bench", "eval", "measure")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The mlxmem modules `path` imports anywhere in it (in functions and TYPE_CHECKING blocks
    too: a cycle deferred to run time is still a cycle), relative imports resolved."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {f"{module}.{a.name}" for a in node.names} | {module}
    return {m for m in found if m in modules}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: imports(path, set(paths)) - {name} for name, path in paths.items()}
    # A package's __init__ runs before its submodules: a submodule importing its own package
    # (`from mlxmem.memory import forget`) does not depend on the package's other modules.
    for name, deps in graph.items():
        deps -= {d for d in deps if name.startswith(d + ".")}
    return graph


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert "mlxmem.memory.store" in graph["mlxmem.cli.chat"]  # the graph sees imports,
    assert "mlxmem.serve.request" in graph["mlxmem.serve.http"]  # relative ones too
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


# mlxmem.memory's folders, lowest first: a module imports only from its own layer or below.
# The top-level modules (recall, extraction, forget, store, window, the turn) are one layer.
MEMORY_LAYERS = (
    "mlxmem.memory.tables",
    "mlxmem.memory.context",
    "mlxmem.memory",
    "mlxmem.memory.sync",
)
# Each table and the one module that writes it (migrations, which makes the schema, aside).
TABLE_OWNERS = {
    "conversations": "mlxmem.memory.tables.turns",
    "turns": "mlxmem.memory.tables.turns",
    "recall_docs": "mlxmem.memory.tables.terms",
    "recall_terms": "mlxmem.memory.tables.terms",
    "recall_vocab": "mlxmem.memory.tables.terms",
    "facts": "mlxmem.memory.tables.facts",
    "fact_counter": "mlxmem.memory.tables.facts",
    "summaries": "mlxmem.memory.tables.summaries",
    "tombstones": "mlxmem.memory.tables.tombstones",
    "state": "mlxmem.memory.tables.db",
    "bench_runs": "mlxmem.memory.tables.runs",
}
WRITE_RE = re.compile(r"\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM)\s+(?:\w+\.)?(\w+)")


def memory_layer(module: str) -> int | None:
    """The index in MEMORY_LAYERS of the layer `module` belongs to (None: outside memory)."""
    if module == "mlxmem.memory" or not module.startswith("mlxmem.memory."):
        return None
    folder = ".".join(module.split(".")[:3])
    return (
        MEMORY_LAYERS.index(folder)
        if folder in MEMORY_LAYERS
        else MEMORY_LAYERS.index("mlxmem.memory")
    )


def test_memory_imports_only_from_its_own_layer_or_below():
    graph = import_graph()
    upward = [
        f"{name} -> {dep}"
        for name, deps in graph.items()
        for dep in deps
        if (mine := memory_layer(name)) is not None
        and (theirs := memory_layer(dep)) is not None
        and theirs > mine
    ]
    assert upward == []
    assert memory_layer("mlxmem.memory.tables.db") == 0
    assert memory_layer("mlxmem.memory.companion") == 2


def test_memory_keeps_at_most_twelve_files_at_its_top():
    top = sorted(p.name for p in (PACKAGE / "memory").glob("*.py"))
    assert len(top) <= 12, top
    for folder in MEMORY_LAYERS:
        init = PACKAGE.joinpath(*folder.split(".")[1:], "__init__.py")
        assert ast.get_docstring(ast.parse(init.read_text())), f"{folder} says what it holds"


def written_tables(path: Path) -> set[str]:
    """The tables the SQL strings in `path` write (INSERT, UPDATE, DELETE), reading an
    f-string's `{NAME}` as the module's string constant NAME."""
    tree = ast.parse(path.read_text())
    names = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name) and isinstance(node.value.value, str)
    }
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            texts.append(
                "".join(
                    part.value
                    if isinstance(part, ast.Constant)
                    else names.get(getattr(part.value, "id", ""), "{?}")
                    for part in node.values
                )
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings:
                texts.append(node.value)
    return {t for text in texts for t in WRITE_RE.findall(text)} - {"SET"}


def test_each_table_is_written_by_its_owner_only():
    writers: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "migrations.py":
            for table in written_tables(path):
                writers.setdefault(table, set()).add(module_name(path))
    assert {t: {TABLE_OWNERS.get(t)} for t in writers} == writers
    assert writers["conversations"] == {"mlxmem.memory.tables.turns"}  # the check sees SQL
    assert "recall_terms" in writers  # and f-strings' table names


def test_the_turn_writes_through_the_store_only():
    """The Companion and its parts write no row on a connection of their own: a turn's writes
    after its reply go through Store.turn_writes, each to its table's owner."""
    turn = [PACKAGE / "memory" / f"{name}.py" for name in ("companion", "looks", "prompt", "turn")]
    found = [
        f"{path.name}:{number}"
        for path in turn
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.steps\(|\btransaction\(\)|\bcon\.execute|insert_\w+\(", line)
    ]
    assert found == []


def test_measurement_stands_beside_the_core_and_bench_and_eval_apart():
    """bench/ and eval/ share mlxmem.measure, never each other; the core imports neither."""
    graph = import_graph()

    def part(module: str) -> str:
        return module.split(".")[1] if module.count(".") else ""

    crossing = [
        f"{name} -> {dep}"
        for name, deps in graph.items()
        for dep in deps
        if {part(name), part(dep)} == {"bench", "eval"}
        or (part(name) in ("memory", "engine", "sync", "models") and part(dep) in MEASUREMENT)
    ]
    assert crossing == []
    assert "mlxmem.measure" in graph["mlxmem.eval.locomo.runner"]


def test_a_cycle_is_found_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError:
        return
    raise AssertionError("no cycle found in a -> b -> c -> a")


def test_the_store_defines_at_most_twelve_public_methods():
    own = [
        name
        for name, value in vars(Store).items()
        if not name.startswith("_") and inspect.isfunction(value)
    ]
    assert 0 < len(own) <= 12, own


def test_front_ends_and_tools_run_no_sql_of_their_own():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}"
        for part in NO_SQL
        for path in sorted((PACKAGE / part).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bexecute(many)?\(", line)
    ]
    assert found == []
