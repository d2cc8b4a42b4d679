"""``worker.core`` is the scoring core: it must import without the streaming stack.

The offline CLI, the benches and anything embedding the scorer use ``worker.core`` alone, so
no module under it, nor under ``worker.embedding`` which it loads the model with, may import
faust or aiokafka (nor faust's runtime, ``mode``), even indirectly. A fresh interpreter, where
importing those raises ImportError, imports every module under both.
"""

from __future__ import annotations

import json
import subprocess
import sys

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
    "worker.embedding.build.int8",
    "worker.embedding.build.model_file",
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

import worker.core
import worker.embedding

modules = sorted(
    info.name
    for package in (worker.core, worker.embedding)
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
