"""Private names of other packages (PySpark, Airflow and its providers, the standard library...)
are used only where no public API does the job, each with a comment saying so.

Pure: the source is read with ``ast``, nothing is imported. A private use is an imported name
that starts with ``_``, an attribute starting with ``_`` reached from a name imported from
another package (``SparkContext._jvm``, ``SparkSubmitHook(...)._connection``), or a
``getattr`` of such an attribute on anything but ``self``. Python programs held in strings (run
in a child process) are read too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.test_imports import PACKAGE, ROOT, package_modules

# Documented as public despite the leading underscore.
PUBLIC_DESPITE_UNDERSCORE = frozenset({
    "os._exit",  # the os module's documented exit without cleanup
    "KafkaError._PARTITION_EOF",  # confluent-kafka's documented librdkafka error code
})

# (module, use): each kept because no public API exists; the line above it says so.
KEPT: frozenset[tuple[str, str]] = frozenset({
    (f"{PACKAGE}.cli", "atexit._run_exitfuncs"),
    (f"{PACKAGE}.engine.spark.session", "SparkContext._jvm"),
    (f"{PACKAGE}.engine.spark.session", "SparkContext._gateway"),
    (f"{PACKAGE}.engine.spark.session", "SparkContext._ensure_initialized"),
    (f"{PACKAGE}.engine.spark.session", "getattr(spark.client, '_builder', None)"),
    (f"{PACKAGE}.engine.spark.class_archive", "SparkContext._gateway"),
    (f"{PACKAGE}.hooks.upsert", "SparkSubmitHook(conn_id=self.settings.spark_conn_id)._connection"),
})

COMMENT = "no public API"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(source: str) -> Iterator[tuple[int, str]]:
    """(line, use) of every private name of another package in ``source``, and in the Python
    programs its strings hold (their lines counted from the string's first line)."""
    tree = ast.parse(source)
    foreign: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            foreign.update(a.asname or a.name.split(".")[0] for a in node.names if not a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith(PACKAGE):
            for alias in node.names:
                if _is_private(alias.name):
                    yield node.lineno, f"{node.module}.{alias.name}"
                foreign.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in foreign:
                use = ast.unparse(node)
                if use not in PUBLIC_DESPITE_UNDERSCORE:
                    yield node.lineno, use
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)
            and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
        ):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                program = ast.parse(node.value)
            except SyntaxError:
                continue
            if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(program)):
                for line, use in private_uses(node.value):
                    yield node.lineno + line - 1, use


def package_private_uses(root: Path) -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for module, (path, _) in sorted(package_modules(root).items()):
        for line, use in private_uses(path.read_text()):
            found.setdefault((module, use), []).append(line)
    return found


def test_private_names_of_other_packages_are_used_only_where_no_public_api_exists():
    found = package_private_uses(ROOT)
    assert sorted(set(found) - KEPT) == []  # a new use: use the public API, or keep it here saying why
    assert sorted(KEPT - set(found)) == []  # gone: drop it from KEPT
    modules = package_modules(ROOT)
    uncommented = []
    for (module, use), lines in sorted(found.items()):
        text = modules[module][0].read_text().splitlines()
        for line in lines:
            # The use's line or the line above it, in the file's own numbering.
            here = [text[line - 1]] + ([text[line - 2]] if line >= 2 else [])
            if not any(COMMENT in t for t in here):
                uncommented.append(f"{module}:{line} {use}")
    assert uncommented == []


def test_a_private_name_of_another_package_is_found(tmp_path):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "import os\n"
        "from pyspark import SparkContext\n"
        "from pyspark.sql.types import _parse_datatype_string\n"
        "from airflow_upsert_provider import _ours\n"
        "def f(spark, self):\n"
        "    SparkContext._jvm.x\n"
        "    getattr(spark.client, '_builder', None)\n"
        "    getattr(self, '_process', None)\n"
        "    os._exit(0)\n"
        "CHILD = '''\nimport atexit\natexit._run_exitfuncs()\n'''\n"
    )
    assert package_private_uses(tmp_path) == {
        (f"{PACKAGE}.a", "pyspark.sql.types._parse_datatype_string"): [3],
        (f"{PACKAGE}.a", "SparkContext._jvm"): [6],
        (f"{PACKAGE}.a", "getattr(spark.client, '_builder', None)"): [7],
        (f"{PACKAGE}.a", "atexit._run_exitfuncs"): [12],
    }
