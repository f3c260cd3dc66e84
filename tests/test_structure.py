"""Who owns what: the package's import graph has no cycle, the Store stays the chat's small
surface (sync and deletion have modules of their own), and SQL lives in mlxmem.memory."""

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
