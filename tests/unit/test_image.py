"""The container image's recipe (Dockerfile) and its lock file, read for what they mean.

No Docker here. The Dockerfile is parsed into instructions and replayed: the files it copies
exist, are not left out of the build context, and are there before a step reads them; its
base image is an exact release; its install steps are the locked, hash-checked install that
``.ci/production-install`` runs on every CI run (the same steps, taken from the same
parse), and nothing else is installed. The lock holds every base dependency at a version
the dependency's specifier allows, each with hashes, and says how it was made.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from support import production_install
from support.deploy_files import (
    Instruction,
    dockerfile_install_steps,
    dockerfile_instructions,
)
from support.paths import REPO

LOCK = REPO / "requirements.lock"
# The image's platform, for which the lock is resolved: CPython 3.11 on glibc Linux x86_64.
IMAGE_MARKERS = {
    "python_version": "3.11",
    "python_full_version": "3.11.16",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")


def instructions(keyword: str) -> list[Instruction]:
    return [i for i in dockerfile_instructions() if i.keyword == keyword]


def locked() -> dict[str, tuple[str, list[str]]]:
    """Package name -> (pinned version, hashes) of requirements.lock."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = LOCK.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        name, version = requirement.split("==")
        name = canonicalize_name(name)
        assert name not in entries, f"{name} locked twice"
        for option in options:
            assert HASH.match(option), f"{name}: not a sha256 hash option: {option}"
        entries[name] = (version, options)
    return entries


def base_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(line) for line in project["dependencies"]]


def lock_command() -> str:
    """The command that wrote the lock, as its header records it."""
    header = LOCK.read_text().splitlines()[:3]
    (command,) = [line.lstrip("# ").strip() for line in header if "compile" in line]
    return command


def dockerignored(path: str) -> bool:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = Path(path).parts
    return any(
        fnmatch.fnmatch(path, p)
        or fnmatch.fnmatch(parts[0], p)
        or any(fnmatch.fnmatch(part, p.removeprefix("**/")) for part in parts)
        for p in patterns
    )


# -- the Dockerfile -----------------------------------------------------------------------
def test_the_base_image_is_an_exact_release() -> None:
    (base,) = instructions("FROM")
    match = re.fullmatch(
        r"python:(3\.\d+\.\d+)-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", base.arguments
    )
    assert match, f"not an exact Python and Debian release: {base.arguments}"
    assert match[1] == IMAGE_MARKERS["python_full_version"]
    assert production_install.image_python() == IMAGE_MARKERS["python_version"]


def test_every_copied_path_exists_and_reaches_the_build() -> None:
    for copy in instructions("COPY"):
        *sources, _ = copy.words()
        assert sources, copy
        for source in sources:
            assert (REPO / source).exists(), f"the Dockerfile copies {source}, which is missing"
            assert not dockerignored(source), f".dockerignore leaves {source} out of the build"


def test_each_step_reads_only_what_was_copied_before_it() -> None:
    copied: set[str] = set()
    for instruction in dockerfile_instructions():
        if instruction.keyword == "COPY":
            *sources, _ = instruction.words()
            copied.update(sources)
        elif instruction.keyword == "RUN":
            words = shlex.split(instruction.arguments)
            for flag, value in itertools.pairwise(words):
                if flag in ("-r", "--requirement", "-c", "--constraint"):
                    assert value in copied, f"`{instruction.arguments}` reads {value} before COPY"
            if "wheel" in words and "." in words:  # the wheel holds every package found
                tools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
                found = tools["setuptools"]["packages"]["find"]["include"]
                assert {"pyproject.toml", *(p.rstrip("*") for p in found)} <= copied


def test_the_image_installs_only_the_locked_dependencies_and_the_package() -> None:
    """Every pip install either checks the lock's hashes or installs without dependencies;
    nothing names an extra, and the last step is `kp-scorer check`."""
    steps = dockerfile_install_steps()
    commands = [c.strip() for step in steps for c in step.split("&&")]
    installs = [shlex.split(c) for c in commands if c.startswith("pip install")]
    assert installs, steps
    lock_installs = [c for c in installs if "-r" in c]
    assert lock_installs == [
        ["pip", "install", "--require-hashes", "--no-deps", "-r", LOCK.name]
    ], "the dependencies come from the lock, every file checked against its hashes"
    for command in installs:
        assert "--no-deps" in command, f"`{' '.join(command)}` resolves dependencies itself"
        assert not any("[" in word for word in command), f"an extra in `{' '.join(command)}`"
    assert any(c.startswith("pip check") for c in commands)
    assert steps[-1] == "kp-scorer check"
    before = dockerfile_instructions()
    first_copy = next(i for i, ins in enumerate(before) if ins.keyword == "COPY")
    for setup in (i for i in before[:first_copy] if i.keyword == "RUN"):
        assert "pip" not in setup.arguments, f"installs before the install steps: {setup}"


def test_the_production_install_check_runs_exactly_the_image_steps(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What `.ci/production-install` executes, recorded: a venv, then each of the
    Dockerfile's install steps in a build folder holding what the Dockerfile copies."""
    ran: list[tuple[list[str], Path | None]] = []

    def record(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        ran.append((command, kwargs.get("cwd")))
        return subprocess.CompletedProcess(command, 0, b"", b"")

    monkeypatch.setattr(production_install.subprocess, "run", record)
    production_install.install(tmp_path)
    (venv_command, _), *steps = ran
    assert venv_command[1:3] == ["-m", "venv"]
    assert [command[-1] for command, _ in steps] == dockerfile_install_steps()
    assert all(command[:2] == ["bash", "-euo"] for command, _ in steps)
    build = tmp_path / "build"
    assert {cwd for _, cwd in steps} == {build}
    for copy in instructions("COPY"):
        *sources, destination = copy.words()
        for source in sources:
            target = build / destination / (Path(source).name if destination.endswith("/") else "")
            assert target.exists(), f"{source} is not where the Dockerfile puts it"


def test_the_image_runs_the_worker_as_a_non_root_user() -> None:
    users = instructions("USER")
    assert users and users[-1].arguments.split(":")[0] not in ("root", "0")
    (entrypoint,) = instructions("ENTRYPOINT")
    (command,) = instructions("CMD")
    assert json.loads(entrypoint.arguments) == ["kp-scorer"]
    assert json.loads(command.arguments) == ["worker"]


# -- the lock -----------------------------------------------------------------------------
def test_the_lock_holds_every_base_dependency_at_an_allowed_version() -> None:
    entries = locked()
    needed = [
        r for r in base_requirements() if r.marker is None or r.marker.evaluate(IMAGE_MARKERS)
    ]
    assert {"cramjam", "aiokafka", "onnxruntime"} <= {canonicalize_name(r.name) for r in needed}
    for requirement in needed:
        name = canonicalize_name(requirement.name)
        assert name in entries, f"{requirement} is not in {LOCK.name}"
        version = entries[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{LOCK.name} pins {name}=={version}, which {requirement} does not allow"
        )


def test_every_lock_entry_has_hashes_and_no_extra_is_locked() -> None:
    entries = locked()
    assert len(entries) > 20
    for name, (_, hashes) in entries.items():
        assert hashes, f"{name} has no hashes"
    tooling = set(production_install.NOT_INSTALLED) & set(entries)
    assert not tooling, f"test tooling in the production lock: {sorted(tooling)}"


def test_the_lock_says_how_to_regenerate_it_for_the_image() -> None:
    command = lock_command()
    words = shlex.split(command)
    assert words[:3] == ["uv", "pip", "compile"] and "pyproject.toml" in words
    assert "--generate-hashes" in words
    assert not any(w.startswith(("--extra", "--all-extras")) for w in words), "base deps only"
    assert words[words.index("--python-version") + 1] == IMAGE_MARKERS["python_version"]
    assert words[words.index("--python-platform") + 1] == "x86_64-unknown-linux-gnu"
    assert words[words.index("-o") + 1] == LOCK.name
    deployment = (REPO / "docs" / "deployment.md").read_text()
    assert command in deployment, "docs/deployment.md gives the lock's command"
