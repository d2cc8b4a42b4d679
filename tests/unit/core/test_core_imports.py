"""The package's layers: each module imports only its own layer and those below, never in a
circle; and ``worker.core`` is the scoring core, which imports without the streaming stack.

The offline CLI, the benches and anything embedding the scorer use ``worker.core`` alone, so
no module under it, nor under ``worker.embedding`` which it loads the model with, nor under
``kp_model_build`` (the offline model build), may import faust or aiokafka (nor faust's
runtime, ``mode``), even indirectly. A fresh interpreter, where importing those raises
ImportError, imports every module under the three.

The layers are read from the source (every ``import``, in a function or under TYPE_CHECKING
too): a circle, or a module that imports a layer above its own, fails with the imports named.
``kp_model_build`` sits just below the command line, so no module of the worker's runtime can
import it: only ``kp-scorer model build`` does.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from support.paths import REPO

# The packages the distribution installs, whose modules the layers place.
PACKAGES = ("worker", "kp_model_build")
# Lowest first; a module is in the layer of the longest prefix listed that names it.
LAYERS = (
    ("worker.version", "worker.cores", "worker.logs", "worker.memory", "worker.retry"),
    ("worker.settings",),
    ("worker.embedding",),
    ("worker.core",),
    ("worker.stream",),
    ("worker.io",),
    ("worker.api", "worker.dev"),
    ("worker",),  # the package: its names are worker.api's
    ("kp_model_build",),  # offline, beside the worker: `kp-scorer model build` alone imports it
    ("worker.cli",),
)
# Imports up a layer that wait on their module's owner: (importer, imported).

BLOCKED = ("faust", "aiokafka", "mode")
# The modules the layering is about; any module added under worker.core is imported too.
CORE_MODULES = {
    "worker.core.trace",
    "worker.core.schema",
    "worker.core.errors",
    "worker.core.scoring",
    "worker.core.cache",
    "worker.core.records",
    "worker.core.output",
    "worker.core.scorer",
    "worker.embedding.load",
    "worker.embedding.pool",
    "kp_model_build.int8",
    "kp_model_build.model_file",
}

IMPORT_CORE = """
import importlib, importlib.abc, json, pkgutil, sys

BLOCKED = {blocked!r}


class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: worker.core must not import it")
        return None


sys.meta_path.insert(0, Blocked())
for name in BLOCKED:  # nothing imported them before the finder went in, but be sure
    assert name not in sys.modules, name

import kp_model_build
import worker.core
import worker.embedding

modules = sorted(
    info.name
    for package in (worker.core, worker.embedding, kp_model_build)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
)
for name in modules:
    importlib.import_module(name)
leaked = sorted(n for n in sys.modules if n.partition(".")[0] in BLOCKED)
print(json.dumps({{"modules": modules, "leaked": leaked}}))
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_worker_core_imports_with_faust_and_aiokafka_blocked() -> None:
    result = run_python(IMPORT_CORE.format(blocked=BLOCKED))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report["modules"]) >= CORE_MODULES, "every core module was imported"
    assert report["leaked"] == []


def test_the_block_does_stop_faust_and_aiokafka() -> None:
    """The same finder makes the streaming side fail, so the test above is not vacuous."""
    for module in ("worker.io.app", "worker.io.kafka"):
        code = IMPORT_CORE.format(blocked=BLOCKED).replace(
            "import worker.core\n", f"import worker.core\nimport {module}\n"
        )
        result = run_python(code)
        assert result.returncode != 0, f"{module} imported with faust and aiokafka blocked"
        assert "is blocked: worker.core must not import it" in result.stderr, result.stderr


def import_graph() -> dict[str, set[str]]:
    """Each module of the packages -> the modules of the packages it imports: ``from a import
    b`` is module ``a.b`` where there is one, else ``a``."""
    paths = {}
    for path in (p for package in PACKAGES for p in (REPO / package).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{module}: a relative import"
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    imported.add(name if name in paths else str(node.module))
        graph[module] = (imported & paths.keys()) - {module}
    return graph


def circle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """The shortest import path from ``start`` back to it, if there is one."""
    paths = {start: [start]}
    queue = [start]
    for module in queue:
        for imported in sorted(graph[module]):
            if imported == start:
                return [*paths[module], start]
            if imported not in paths:
                paths[imported] = [*paths[module], imported]
                queue.append(imported)
    return None


def layer(module: str) -> int:
    prefixes = [
        (len(prefix), rank)
        for rank, names in enumerate(LAYERS)
        for prefix in names
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert prefixes, f"{module} is in no layer: add it to LAYERS"
    return max(prefixes)[1]


def test_no_module_imports_itself_through_others() -> None:
    assert circle_through({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "b") == ["b", "c", "a", "b"]
    graph = import_graph()
    assert "worker.io.kafka" in graph["worker.cli.ranges"]  # under TYPE_CHECKING
    circles = {frozenset(c): c for m in graph if (c := circle_through(graph, m)) is not None}
    assert [" -> ".join(circle) for circle in circles.values()] == []


def test_each_layer_imports_only_the_layers_below() -> None:
    graph = import_graph()
    assert "kp_model_build.model_file" in graph["worker.cli.model"]  # in a function
    upward = {
        (module, imported)
        for module, imports in graph.items()
        for imported in imports
        if layer(imported) > layer(module)
    }
    assert sorted(f"{a} imports {b}" for a, b in upward) == []
