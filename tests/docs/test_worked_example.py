"""docs/scoring.md's worked example: the output the page shows is what ``kp-scorer score``
writes for docs/examples/worked-trace.jsonl, and every number of its arithmetic is right."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from worker.cli.main import main

from support.paths import REPO

PAGE = REPO / "docs" / "scoring.md"
EXAMPLE = "docs/examples/worked-trace.jsonl"


def section() -> str:
    return PAGE.read_text().split("\n## Worked example\n", 1)[1]


def block(language: str) -> str:
    found = re.search(rf"```{language}\n(.*?)```", section(), re.S)
    assert found, f"no {language} block in the worked example"
    return found.group(1)


@pytest.fixture
def scored(
    isolated_settings: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[dict[str, Any], str]:
    """The command as the page gives it, from the checkout."""
    monkeypatch.chdir(REPO)
    assert f"kp-scorer score --quiet {EXAMPLE}" in block("bash")
    assert main(["score", "--quiet", EXAMPLE]) == 0
    captured = capsys.readouterr()
    (line,) = captured.out.splitlines()
    return orjson.loads(line), captured.err.strip()


def test_the_page_shows_what_score_writes(scored: tuple[dict[str, Any], str]) -> None:
    output, summary = scored
    assert orjson.loads(block("json")) == output
    assert f"on stderr `{summary}`" in section().replace("\n", " ")


_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate(node: ast.AST) -> float:
    """The arithmetic of one line: numbers, + - * /, min and max; nothing else."""
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return float(_OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right)))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        functions = {"min": min, "max": max}
        if node.func.id in functions:
            return float(functions[node.func.id](evaluate(arg) for arg in node.args))
    raise ValueError(f"not arithmetic: {ast.dump(node)}")


def arithmetic() -> dict[str, tuple[str, float]]:
    lines = {}
    for line in block("text").strip().splitlines():
        name, expression, result = (part.strip() for part in line.split("="))
        lines[name] = (expression, float(result))
    return lines


def test_every_number_of_the_arithmetic_matches(scored: tuple[dict[str, Any], str]) -> None:
    score = scored[0]["score"]
    lines = arithmetic()
    assert list(lines) == [*score["dimensions"], "composite", "score"]
    for name, (expression, result) in lines.items():
        assert evaluate(ast.parse(expression, mode="eval")) == pytest.approx(result, abs=1e-12)
        real = score["dimensions"].get(name, score.get(name))
        assert result == pytest.approx(real, abs=1e-12), name
    # The composite is each dimension shown above times the profile's weight, in order.
    products = re.findall(r"([\d.]+)\*([\d.]+)", lines["composite"][0])
    assert [(float(d), float(w)) for d, w in products] == [
        (lines[name][1], score["weights"][name]) for name in score["dimensions"]
    ]
    assert score["profile"] == "finance" and score["overrides"] == ["low_tool_diversity"]
    assert lines["score"][0] == f"max(0, {lines['composite'][1]} - 0.1)"
    assert score["decision"] == "rejected" and score["composite"] >= score["threshold"]
