"""The package's import graph: no circles anywhere, the engine never imports Airflow, and the
engine's layers import only the layers below them.

Pure: the graph is read from the source with ``ast`` (module-level and function-level imports
alike; imports under ``if TYPE_CHECKING:`` are exempt, they never run), nothing is imported.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

import airflow_upsert_provider

PACKAGE = "airflow_upsert_provider"
ENGINE = f"{PACKAGE}.engine"

# The engine's layers, lowest first. A module of a layer may import its own layer and those
# listed before it, never one listed after it. Names are relative to the engine: a package
# (every module under it) or a single module.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("common",),
    ("spark", "blob"),
    ("sources",),
    ("config",),
    ("store",),
    ("table",),
    ("maintenance",),
    ("lifecycle",),
    ("frontier",),
    ("write",),
)

# A batch's data flow inside the write layer, lowest first: the record readers return records,
# the batch job (upsert) consumes them, the writer runs the batch job, and continuous runs and
# the Spark job drive the writer. A module imports only those listed before it, so that nothing
# calls back up the flow (function-level imports included).
WRITE_FLOW: tuple[str, ...] = ("records", "kafka_field_types", "kafka_records", "upsert", "writer", "continuous", "spark_job")

# Modules outside the engine that the engine may import: the sample data generator is pure
# (it imports nothing of the package) and the class archive replays a sample run with it.
ENGINE_MAY_IMPORT_OUTSIDE = frozenset({f"{PACKAGE}.sample_data"})


def package_modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Every module of the package under ``root`` (its parent directory): name -> (file, is a package)."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(path: Path, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """(dotted name, line) of every import that can run in ``path``, at any depth."""

    def visit(node: ast.AST) -> Iterator[tuple[str, int]]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            yield base, node.lineno
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(ast.parse(path.read_text(), filename=str(path)))


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {package module it imports: first line}; a ``from x import name`` counts as
    an import of ``x.name`` when that is a module, else of ``x``."""
    modules = package_modules(root)
    graph: dict[str, dict[str, int]] = {}
    for module, (path, is_package) in modules.items():
        edges: dict[str, int] = {}
        for name, line in imported_names(path, module, is_package):
            while name not in modules and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in modules and name != module:
                edges.setdefault(name, line)
        graph[module] = edges
    return graph


def import_circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a cycle
    through its modules where one can be named."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for node in sorted(graph):
            if node not in index:
                connect(node)
    finally:
        sys.setrecursionlimit(limit)
    return components


def layer_of(module: str) -> int | None:
    """The index in LAYERS of an engine module; None for the engine's own ``__init__``."""
    relative = module[len(ENGINE) + 1:] if module.startswith(ENGINE + ".") else None
    if relative is None:
        return None
    for rank, layer in enumerate(LAYERS):
        for name in layer:
            if relative == name or relative.startswith(name + "."):
                return rank
    raise AssertionError(f"engine module {module} is in no layer of LAYERS: add it to one")


def layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    problems = []
    for module, edges in sorted(graph.items()):
        if not module.startswith(ENGINE + ".") and module != ENGINE:
            continue
        rank = layer_of(module)
        for target, line in sorted(edges.items()):
            if not target.startswith(ENGINE + "."):
                if target not in ENGINE_MAY_IMPORT_OUTSIDE and target != ENGINE:
                    problems.append(f"{module}:{line} imports {target}, outside the engine")
                continue
            target_rank = layer_of(target)
            if rank is not None and target_rank is not None and target_rank > rank:
                problems.append(
                    f"{module}:{line} ({'/'.join(LAYERS[rank])}) imports {target} "
                    f"({'/'.join(LAYERS[target_rank])}), a layer above it"
                )
    return problems


def write_flow_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports inside the write layer that go back up :data:`WRITE_FLOW`."""
    prefix = f"{ENGINE}.write."
    problems = []
    for module, edges in sorted(graph.items()):
        if not module.startswith(prefix):
            continue
        name = module[len(prefix):]
        assert name in WRITE_FLOW, f"write module {module} is not in WRITE_FLOW: add it where the batch's data flow puts it"
        for target, line in sorted(edges.items()):
            if target.startswith(prefix) and WRITE_FLOW.index(target[len(prefix):]) > WRITE_FLOW.index(name):
                problems.append(f"{module}:{line} imports {target}, which comes after it in a batch's data flow")
    return problems


ROOT = Path(airflow_upsert_provider.__file__).resolve().parent.parent


def test_the_package_has_no_import_circle():
    circles = import_circles(import_graph(ROOT))
    assert circles == [], "import circles (module-level and function-level imports): " + "; ".join(
        " <-> ".join(m[len(PACKAGE) + 1:] for m in circle) for circle in circles
    )


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from airflow_upsert_provider import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from airflow_upsert_provider.c import C\n"
        "def f():\n    from airflow_upsert_provider.a import x\n"
    )
    (package / "c.py").write_text("from airflow_upsert_provider import b\n")
    assert import_circles(import_graph(tmp_path)) == [[f"{PACKAGE}.a", f"{PACKAGE}.b"]]


def test_the_engine_never_imports_airflow():
    modules = package_modules(ROOT)
    found = [
        f"{module}:{line} imports {name}"
        for module, (path, is_package) in sorted(modules.items())
        if module == ENGINE or module.startswith(ENGINE + ".")
        for name, line in imported_names(path, module, is_package)
        if name == "airflow" or name.startswith("airflow.")
    ]
    assert found == []


def test_every_engine_layer_imports_only_the_layers_below_it():
    graph = import_graph(ROOT)
    assert layer_violations(graph) == []
    # Every engine module is in a layer, so that none escapes the check.
    assert all(layer_of(m) is not None for m in graph if m.startswith(ENGINE + "."))


def test_an_import_of_a_higher_layer_is_reported():
    graph = {
        f"{ENGINE}.store.streams": {f"{ENGINE}.frontier.observations": 7, f"{ENGINE}.errors": 3},
        f"{ENGINE}.frontier.observations": {f"{ENGINE}.store.streams": 2},
    }
    assert layer_violations(graph) == [
        f"{ENGINE}.store.streams:7 (store) imports {ENGINE}.frontier.observations (frontier), a layer above it"
    ]


def test_the_write_path_imports_only_down_a_batchs_data_flow():
    # The record readers (records, kafka_records) never import the batch job or the writer.
    assert write_flow_violations(import_graph(ROOT)) == []


def test_a_record_reader_importing_the_batch_job_is_reported(tmp_path):
    write = tmp_path / PACKAGE / "engine" / "write"
    write.mkdir(parents=True)
    for package in (tmp_path / PACKAGE, tmp_path / PACKAGE / "engine", write):
        (package / "__init__.py").write_text("")
    (write / "upsert.py").write_text("from airflow_upsert_provider.engine.write.records import read\n")
    (write / "records.py").write_text("def read():\n    from airflow_upsert_provider.engine.write import upsert\n")
    assert write_flow_violations(import_graph(tmp_path)) == [
        f"{ENGINE}.write.records:2 imports {ENGINE}.write.upsert, which comes after it in a batch's data flow"
    ]


def test_opening_a_store_creates_and_enforces_what_the_registry_lists(tmp_path):
    from airflow_upsert_provider.engine.store.migrations import VERSION_TABLE
    from airflow_upsert_provider.engine.store.registry import STORE_SCHEMA, open_consensus

    store = open_consensus(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        # The registry's tables, and the version table that records their schema revision.
        assert set(sa.inspect(store.engine).get_table_names()) == {t.name for t in STORE_SCHEMA.tables} | {VERSION_TABLE}
        assert tuple(store.commit_hooks) == STORE_SCHEMA.commit_hooks
        assert tuple(store.restore_hooks) == STORE_SCHEMA.restore_hooks
    finally:
        store.dispose()


def test_importing_the_consensus_store_imports_no_module_that_adds_to_it():
    # A fresh interpreter: what importing consensus.py pulls in is what joins by side effect.
    code = (
        "import sys, airflow_upsert_provider.engine.store.consensus\n"
        "print(sorted(m for m in sys.modules if m.startswith('airflow_upsert_provider.engine.')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert ast.literal_eval(out) == [
        "airflow_upsert_provider.engine.errors",
        "airflow_upsert_provider.engine.store",
        "airflow_upsert_provider.engine.store.consensus",
        "airflow_upsert_provider.engine.store.records",
        "airflow_upsert_provider.engine.store.tables",
        "airflow_upsert_provider.engine.store.urls",
    ]
