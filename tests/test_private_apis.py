"""Private names of other packages (PySpark, Airflow and its providers, the standard library...)
are used only where no public API does the job, each with a comment saying so.

Pure: the source is read with ``ast``, nothing is imported. A private use is
- an imported name that starts with ``_``;
- an attribute starting with ``_`` reached from a name imported from another package
  (``SparkContext._jvm``, ``SparkSubmitHook(...)._connection``), or a ``getattr`` of such an
  attribute on anything but ``self``;
- an attribute starting with ``_`` reached from an instance of another package's class: a
  variable or ``self`` attribute bound to its constructor, to a call of a function annotated
  to return it, or annotated with it (``hook = SparkSubmitHook(...)``, then ``hook._env_vars``);
  and, in a subclass of it, ``super()._name``, ``self._name`` (or ``getattr(self, "_name")``)
  for a name the base class defines (read from its source on ``sys.path``) or, when the base
  cannot be read, one the subclass does not define itself, and a method overriding one of
  the base's private methods.
Python programs held in strings (run in a child process) are read too.
"""

from __future__ import annotations

import ast
import functools
import sys
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
    (f"{PACKAGE}.operators.upsert", "def _build_spark_submit_command"),
    (f"{PACKAGE}.operators.upsert", "super()._build_spark_submit_command"),
    (f"{PACKAGE}.operators.upsert", "self._env"),
    # Executors write a publish's data files with the codec and sizes the table's properties set.
    (f"{PACKAGE}.engine.maintenance.iceberg_spark", "pyiceberg.io.pyarrow._get_parquet_writer_kwargs"),
})

COMMENT = "no public API"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(source: str) -> Iterator[tuple[int, str]]:
    """(line, use) of every private name of another package in ``source``, and in the Python
    programs its strings hold (their lines counted from the string's first line)."""
    tree = ast.parse(source)
    foreign: set[str] = set()
    # name -> (module, name in it) of every name imported from another package by name
    origins: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            foreign.update(a.asname or a.name.split(".")[0] for a in node.names if not a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith(PACKAGE):
            for alias in node.names:
                if _is_private(alias.name):
                    yield node.lineno, f"{node.module}.{alias.name}"
                foreign.add(alias.asname or alias.name)
                origins[alias.asname or alias.name] = (node.module or "", alias.name)
    yield from _instance_private_uses(tree, foreign, origins)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in foreign:
                use = ast.unparse(node)
                if use not in PUBLIC_DESPITE_UNDERSCORE:
                    yield node.lineno, use
        elif _private_getattr(node) is not None and not _is_self(node.args[0]):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import " in node.value:
            try:
                program = ast.parse(node.value)
            except SyntaxError:
                continue
            if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(program)):
                for line, use in private_uses(node.value):
                    yield node.lineno + line - 1, use


def _private_getattr(node: ast.AST) -> str | None:
    """The private name of a ``getattr(x, "_name", ...)`` call, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)):
        return node.args[1].value
    return None


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _annotation(node: ast.expr | None) -> ast.expr | None:
    """An annotation as an expression (a string annotation parsed), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    return node


def _foreign_class(node: ast.expr | None, foreign: set[str]) -> bool:
    """Whether ``node`` names a class of another package: ``Name`` or ``module.Name`` rooted
    at a foreign import (a class by the convention of its capital letter), or ``X | None``."""
    node = _annotation(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _foreign_class(node.left, foreign) or _foreign_class(node.right, foreign)
    if isinstance(node, ast.Name):
        return node.id in foreign and node.id[:1].isupper()
    return isinstance(node, ast.Attribute) and node.attr[:1].isupper() and _root_name(node) in foreign


def _foreign_class_type(node: ast.expr | None, foreign: set[str]) -> bool:
    """Whether ``node`` is ``type[C]`` of a foreign class C."""
    node = _annotation(node)
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "type"
            and _foreign_class(node.slice, foreign))


def _called_name(func: ast.expr) -> str | None:
    """``f`` of a call ``f(...)`` or ``self.f(...)``."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return func.attr
    return None


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    return (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _own_walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` but those of the classes it holds (their ``self`` is another)."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.ClassDef):
            yield child
            yield from _own_walk(child)


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def class_defined_names(cls: ast.ClassDef) -> set[str]:
    """The names ``cls`` itself defines: methods, nested classes, class attributes and the
    ``self`` attributes its methods assign."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    for node in _own_walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            names.add(node.attr)
    return names


@functools.cache
def _module_tree(module: str) -> ast.Module | None:
    """The parsed source of ``module`` as found on ``sys.path`` (read, never imported)."""
    parts = module.split(".")
    for entry in sys.path:
        for path in (Path(entry or ".", *parts).with_suffix(".py"), Path(entry or ".", *parts, "__init__.py")):
            if path.is_file():
                try:
                    return ast.parse(path.read_text(encoding="utf-8"))
                except (SyntaxError, UnicodeDecodeError, OSError):
                    return None
    return None


@functools.cache
def foreign_class_private_names(module: str, name: str, depth: int = 0) -> frozenset[str] | None:
    """The private names class ``name`` of ``module`` and its bases define (methods, class
    attributes, ``self._x`` it assigns), read from their source; None when the class cannot
    be found. A name the module only imports (a re-export) is followed."""
    tree = _module_tree(module)
    if tree is None or depth > 8:
        return None
    imports: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module.split(".")
                if not _module_is_package(module):
                    here = here[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            for alias in node.names:
                imports[alias.asname or alias.name] = (base, alias.name)
    found = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if found is None:
        found = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)
    if found is None:
        return foreign_class_private_names(*imports[name], depth + 1) if name in imports else None
    names = class_defined_names(found)
    for base in found.bases:
        base_name = _root_name(base)
        if isinstance(base, ast.Name) and base.id in imports:
            inherited = foreign_class_private_names(*imports[base.id], depth + 1)
        elif isinstance(base, ast.Name):
            inherited = foreign_class_private_names(module, base.id, depth + 1)
        else:
            inherited = None if base_name is None else frozenset()
        names.update(inherited or ())
    return frozenset(n for n in names if _is_private(n))


def _module_is_package(module: str) -> bool:
    parts = module.split(".")
    return any(Path(entry or ".", *parts, "__init__.py").is_file() for entry in sys.path)


def _instance_private_uses(
    tree: ast.Module, foreign: set[str], origins: dict[str, tuple[str, str]]
) -> Iterator[tuple[int, str]]:
    """(line, use) of private attributes reached from instances of other packages' classes
    (module docstring)."""
    # Functions of this module whose result is an instance of a foreign class, or such a class.
    returns_instance = {f.name for f in _functions(tree) if _foreign_class(f.returns, foreign)}
    returns_class = {f.name for f in _functions(tree) if _foreign_class_type(f.returns, foreign)}

    def constructs(value: ast.expr | None) -> bool:
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        if _foreign_class(func, foreign) or _called_name(func) in returns_instance:
            return True
        return isinstance(func, ast.Call) and _called_name(func.func) in returns_class

    def bound(scope: ast.AST) -> tuple[set[str], set[str]]:
        """Names and ``self`` attributes bound to a foreign instance in ``scope``."""
        names: set[str] = set()
        attributes: set[str] = set()
        for node in ast.walk(scope):
            if isinstance(node, ast.arg) and _foreign_class(node.annotation, foreign):
                names.add(node.arg)
            pairs: list[tuple[ast.expr, bool]] = []
            if isinstance(node, ast.Assign):
                pairs = [(t, constructs(node.value)) for t in node.targets]
            elif isinstance(node, ast.AnnAssign):
                pairs = [(node.target, _foreign_class(node.annotation, foreign) or constructs(node.value))]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                pairs = [(node.optional_vars, constructs(node.context_expr))]
            for target, is_instance in pairs:
                if not is_instance:
                    continue
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute) and _is_self(target.value):
                    attributes.add(target.attr)
        return names, attributes

    def on_instance(node: ast.Attribute, names: set[str], attributes: set[str]) -> bool:
        value = node.value
        if isinstance(value, ast.Name):
            return value.id in names
        return isinstance(value, ast.Attribute) and _is_self(value.value) and value.attr in attributes

    seen: set[tuple[int, str]] = set()

    def report(node: ast.AST, use: str) -> Iterator[tuple[int, str]]:
        if (node.lineno, use) not in seen and use not in PUBLIC_DESPITE_UNDERSCORE:
            seen.add((node.lineno, use))
            yield node.lineno, use

    # Instances bound in a function: its own names, and the self attributes of its class.
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    self_attributes: dict[int, set[str]] = {}
    for cls in classes:
        attributes: set[str] = set()
        for method in _own_walk(cls):
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                attributes |= bound(method)[1]
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _foreign_class(
                    node.annotation, foreign):
                attributes.add(node.target.id)
        for node in _own_walk(cls):
            self_attributes[id(node)] = attributes
    for function in _functions(tree):
        names, _ = bound(function)
        attributes = self_attributes.get(id(function), set())
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and _is_private(node.attr) and on_instance(node, names, attributes):
                yield from report(node, ast.unparse(node))

    # Subclasses of foreign classes (directly, or through classes of this module).
    local = {cls.name: cls for cls in classes}

    def lineage(cls: ast.ClassDef, depth: int = 0) -> tuple[list[tuple[str, str]], set[str], bool]:
        """(the foreign bases, the names this module's classes on the way define, whether
        every base is foreign)."""
        own = class_defined_names(cls)
        bases: list[tuple[str, str]] = []
        all_foreign = bool(cls.bases)
        for base in cls.bases:
            if _foreign_class(base, foreign):
                root = _root_name(base) or ""
                if isinstance(base, ast.Name):
                    bases.append(origins.get(root, (root, root)))
                else:
                    bases.append((ast.unparse(base.value), base.attr))
            elif isinstance(base, ast.Name) and base.id in local and depth < 8:
                inherited, inherited_own, _ = lineage(local[base.id], depth + 1)
                bases += inherited
                own |= inherited_own
                all_foreign = False
            else:
                all_foreign = False
        return bases, own, all_foreign

    for cls in classes:
        bases, own, all_foreign = lineage(cls)
        if not bases:
            continue
        resolved = [foreign_class_private_names(module, name) for module, name in bases]
        base_names = frozenset().union(*(r for r in resolved if r is not None))
        readable = all(r is not None for r in resolved)

        def inherited(name: str) -> bool:
            return name in base_names or (not readable and name not in own)

        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(node.name) and (
                    node.name in base_names):
                yield from report(node, f"def {node.name}")
        for node in _own_walk(cls):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                if _is_self(node.value) and inherited(node.attr):
                    yield from report(node, ast.unparse(node))
                elif (all_foreign and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                      and node.value.func.id == "super"):
                    yield from report(node, ast.unparse(node))
            elif (name := _private_getattr(node)) is not None and _is_self(node.args[0]) and inherited(name):
                yield from report(node, ast.unparse(node))


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


# Each line a private use is on says so: "# found: <use>"; no other line holds one.
INSTANCE_SAMPLE = '''\
import threading
from concurrent.futures import ThreadPoolExecutor
from nowhere_installed import Unreadable
from pyspark import SparkContext
from airflow_upsert_provider.ours import Ours


class Worker(threading.Thread):
    def __init__(self):
        super().__init__()
        self._mine = 1
        self._target = None  # found: self._target
        getattr(self, "_mine", None)

    def run(self):
        self._mine += 1
        self._started.wait()  # found: self._started
        super()._bootstrap()  # found: super()._bootstrap
        getattr(self, "_ident", None)  # found: getattr(self, '_ident', None)

    def _bootstrap_inner(self):  # found: def _bootstrap_inner
        return self._helper()

    def _helper(self):
        return None


class Deeper(Worker):
    def more(self):
        return self._mine, self._tstate_lock  # found: self._tstate_lock


class Opaque(Unreadable):
    def __init__(self):
        self._own = 1

    def f(self):
        return self._own, self._theirs  # found: self._theirs


class Plain:
    def __init__(self):
        self._pool = make_pool()
        self._count = 0

    def f(self, other):
        self._count += 1
        other._anything
        self._pool._shutdown  # found: self._pool._shutdown
        return Ours()._private


def make_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor()


def make_class() -> type[ThreadPoolExecutor]:
    return ThreadPoolExecutor


def g(context: "SparkContext | None", name: str):
    pool = ThreadPoolExecutor(max_workers=1)
    built = make_class()()
    ours = Ours()
    with ThreadPoolExecutor() as held:
        held._work_queue  # found: held._work_queue
    name._not_an_instance
    ours._private
    built._threads  # found: built._threads
    context._jsc  # found: context._jsc
    return pool._max_workers  # found: pool._max_workers
'''


def test_a_private_name_reached_through_an_instance_of_another_packages_class_is_found(tmp_path):
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "b.py").write_text(INSTANCE_SAMPLE)
    expected: dict[tuple[str, str], list[int]] = {}
    for number, line in enumerate(INSTANCE_SAMPLE.splitlines(), start=1):
        if "# found: " in line:
            expected.setdefault((f"{PACKAGE}.b", line.split("# found: ", 1)[1]), []).append(number)
    assert len(expected) == 12
    assert package_private_uses(tmp_path) == expected


def test_a_base_class_is_read_from_its_source_following_re_exports():
    # Thread is defined in threading; airflow.sdk only re-exports BaseOperator.
    assert {"_target", "_started", "_bootstrap"} <= foreign_class_private_names("threading", "Thread")
    operator = foreign_class_private_names("airflow.sdk", "BaseOperator")
    assert operator is not None and "_spark" not in operator
    assert foreign_class_private_names("nowhere_installed", "Unreadable") is None
