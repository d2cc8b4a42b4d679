"""The tests' layout: tests/unit mirrors the package, and tests observe the worker through its
public names.

- A test file directly in tests/unit/ tests the package as a whole (public API, deployment
  files, settings, logs): one whose worker imports all lie in one of worker.core,
  worker.embedding, worker.stream, worker.io or worker.cli belongs in that subfolder.
- Private reads of worker code stay few. What is counted, in every test file but
  ``io/test_unreadable.py`` (whose purpose includes checking the aiokafka private members the
  worker overrides): each ``from worker... import _x``; each attribute ``obj._x`` whose name is a
  private name the worker defines for itself (a module-level function, class or constant, or a
  method or ``self._x`` attribute of a worker class), read or written; each such name handed
  to ``getattr``/``setattr``/``hasattr``/``delattr``/``monkeypatch.setattr`` as a string.
  Not counted: ``self._x``/``cls._x`` inside a test's own class that defines ``_x`` itself,
  and the library hooks a worker class overrides (aiokafka's ``PartitionRecords`` members: the
  library's names, which ``io/test_unreadable.py`` guards). The scan cannot tell
  receivers apart, so a library member that shares a worker name (``_thread``) counts too.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path

from support.fixtures import LONGEST_FILES
from support.paths import REPO, TESTS

MAX_PRIVATE_READS = 5
SUBPACKAGES = ("core", "embedding", "stream", "io", "cli")
UNIT = TESTS / "unit"
EXEMPT = UNIT / "io" / "test_unreadable.py"
ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}


def private(name: str) -> bool:
    return name.startswith("_") and name != "_" and not name.endswith("__")


def worker_modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted((REPO / "worker").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, ast.parse(path.read_text())


def library_hook(module: str, class_name: str, name: str) -> bool:
    """Whether ``name`` in the worker class overrides a member of a library base class."""
    cls = getattr(importlib.import_module(module), class_name, None)
    if not isinstance(cls, type):
        return False
    for base in cls.__mro__[1:]:
        if base.__module__.startswith("worker") or base is object:
            continue
        if hasattr(base, name) or name in getattr(base, "__annotations__", {}):
            return True
        try:
            if f"self.{name} " in inspect.getsource(base):
                return True
        except (OSError, TypeError):
            pass
    return False


def worker_private_names() -> set[str]:
    """Private names the worker defines for itself, less the library hooks it overrides."""
    names: set[str] = set()
    for module, tree in worker_modules():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                targets = [node.name]
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                assigned = node.targets if isinstance(node, ast.Assign) else [node.target]
                targets = [t.id for t in assigned if isinstance(t, ast.Name)]
            else:
                targets = []
            names.update(name for name in targets if private(name))
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            members: set[str] = set()
            for node in ast.walk(cls):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    members.add(node.name)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    members.add(node.target.id)
                elif (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in ("self", "cls")
                ):
                    members.add(node.attr)
            names.update(
                name
                for name in members
                if private(name) and not library_hook(module, cls.name, name)
            )
    return names


def own_members(tree: ast.Module) -> dict[ast.AST, set[str]]:
    """Each ``self._x``/``cls._x`` node in a test's own class -> the names that class defines."""
    owned: dict[ast.AST, set[str]] = {}
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        defined = {
            node.name if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else node.attr
            for node in ast.walk(cls)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            or (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store))
        }
        owned.update(
            (node, defined)
            for node in ast.walk(cls)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        )
    return owned


def private_reads(path: Path, worker_names: set[str]) -> list[str]:
    """``path:line what`` for each private read of worker code in the file, in line order."""
    tree = ast.parse(path.read_text())
    owned = own_members(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "worker":
            found += [(node.lineno, f"imports {a.name}") for a in node.names if private(a.name)]
        elif isinstance(node, ast.Attribute) and node.attr in worker_names:
            if node.attr not in owned.get(node, set()):
                found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Call) and node.args:
            func, first, second = node.func, node.args[0], node.args[1:2]
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            name = getattr(second[0], "value", None) if second else None
            if called in ATTRIBUTE_CALLS and name in worker_names:
                found.append((node.lineno, f"{called}(..., {name!r})"))
            dotted = getattr(first, "value", None)
            if (  # monkeypatch.setattr("worker.io.app._credentials", ...), mock.patch(...)
                isinstance(dotted, str)
                and dotted.startswith("worker.")
                and private(dotted.rsplit(".", 1)[-1])
            ):
                found.append((node.lineno, f"{called}({dotted!r})"))
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    return [f"{where}:{line} {what}" for line, what in sorted(found)]


def test_private_reads_of_worker_code_stay_few() -> None:
    """Each read over the bound is listed: observe it through a public name instead."""
    worker_names = worker_private_names()
    assert len(worker_names) > 100  # the worker's own private names are found
    assert "_create_worker_consumer" not in worker_names  # faust's hook, overridden
    reads = [
        read
        for path in sorted(TESTS.rglob("*.py"))
        if path != EXEMPT
        for read in private_reads(path, worker_names)
    ]
    assert len(reads) <= MAX_PRIVATE_READS, "\n".join(reads)


def test_the_scan_finds_each_kind_of_private_read(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from worker.io.app import _credentials\n"
        "reader._consumer.start()\n"
        "monkeypatch.setattr(demo, '_publish', None)\n"
        "monkeypatch.setattr('worker.cli.demo._scrape', None)\n"
        "class Fake:\n"
        "    def __init__(self):\n"
        "        self._consumer = None\n"
        "    def read(self):\n"
        "        return self._consumer\n"
        "consumer._fetch_max_bytes\n"
    )
    reads = private_reads(sample, {"_credentials", "_consumer", "_publish"})
    assert [read.split(" ", 1)[1] for read in reads] == [
        "imports _credentials",
        "._consumer",
        "setattr(..., '_publish')",
        "setattr('worker.cli.demo._scrape')",
    ]


def worker_imports(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return {module for module in modules if module.split(".")[0] == "worker"}


def test_a_test_of_one_subpackage_sits_in_its_folder() -> None:
    """A file at the top of tests/unit whose worker imports are all of one subpackage is
    named with the folder it belongs in (worker.dev, the tests' launchers, is no subject)."""
    misplaced = []
    for path in sorted(UNIT.glob("test_*.py")):
        packages = {
            module.split(".")[1] if module.count(".") else ""
            for module in worker_imports(path)
            if not module.startswith("worker.dev")
        }
        if len(packages) == 1 and packages <= set(SUBPACKAGES):
            misplaced.append(f"{path.name} -> tests/unit/{packages.pop()}/")
    assert misplaced == []
    assert all((UNIT / package).is_dir() for package in SUBPACKAGES)


def test_the_longest_files_first_are_files_of_the_suite() -> None:
    """The test files run first (support/fixtures.py) each exist, once: a renamed file would
    only lose its early start, silently."""
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    assert [name for name in LONGEST_FILES if not (TESTS / name).is_file()] == []
