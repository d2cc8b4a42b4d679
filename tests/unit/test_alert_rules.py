"""The alert rules, checked by Prometheus's own promtool: prometheus.yml and alerts.yml load,
and the rule tests in tests/unit/promtool/ (input series -> the alerts that fire at given
times, with their rendered annotations) pass. Without promtool: every alert has a test in
which it fires and one in which it does not, and the PrometheusRule for the Prometheus
Operator carries exactly the groups of alerts.yml.

Where promtool comes from, first found: the PROMTOOL environment variable (a path), the PATH,
a copy cached by an earlier run, or Debian's ``prometheus`` package, which ships it (Apache-2.0;
no PyPI package does): ``apt-get download`` fetches the package and promtool alone is
extracted into the tests' cache (tests/support/debian.py), nothing is installed. Where none
of these works, the promtool tests are skipped and say why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.debian import debian_program
from support.deploy_files import (
    ALERTS,
    PROMETHEUS,
    PROMETHEUS_RULE,
    PROMTOOL_TESTS,
    alert_rules,
    k8s,
    load_yaml,
)

RULE_TESTS = sorted(PROMTOOL_TESTS.glob("*_test.yml"))


# -- promtool -------------------------------------------------------------------------------
def obtain_promtool() -> Path:
    """promtool, or ``pytest.skip`` saying why none can be had."""
    on_path = shutil.which("promtool")
    if on_path and not os.environ.get("PROMTOOL"):
        return Path(on_path)
    return debian_program("prometheus", "promtool", "PROMTOOL")


@pytest.fixture(scope="module")
def promtool() -> Iterator[Path]:
    yield obtain_promtool()


def run_promtool(promtool: Path, *args: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{output}"
    return output


def test_promtool_loads_the_prometheus_config_and_rules(promtool: Path) -> None:
    output = run_promtool(promtool, "check", "config", PROMETHEUS.name, cwd=PROMETHEUS.parent)
    assert f"SUCCESS: {len(alert_rules())} rules found" in output, output


@pytest.mark.parametrize("rule_test", RULE_TESTS, ids=[p.stem for p in RULE_TESTS])
def test_promtool_rule_tests_pass(promtool: Path, rule_test: Path) -> None:
    # Rule files in a test file are relative to it; older promtools read them from the
    # working directory, so run there.
    output = run_promtool(promtool, "test", "rules", rule_test.name, cwd=rule_test.parent)
    assert "SUCCESS" in output, output


# -- the rule tests themselves ----------------------------------------------------------------
def rule_test_cases() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in RULE_TESTS:
        document = load_yaml(path)
        for test in document["tests"]:
            for case in test.get("alert_rule_test", []):
                yield path, case


def test_rule_tests_load_the_deployed_alerts() -> None:
    assert RULE_TESTS, f"no *_test.yml in {PROMTOOL_TESTS}"
    for path in RULE_TESTS:
        (rule_file,) = load_yaml(path)["rule_files"]
        assert (path.parent / rule_file).resolve() == ALERTS.resolve(), path.name


def test_every_alert_is_tested_firing_and_quiet() -> None:
    """Each alert has a case where it fires (labels and annotations as rendered) and one where
    it does not: before its ``for`` has passed, or in a situation that must not page."""
    names = {rule["alert"] for rule in alert_rules()}
    firing = {case["alertname"] for _, case in rule_test_cases() if case.get("exp_alerts")}
    quiet = {case["alertname"] for _, case in rule_test_cases() if not case.get("exp_alerts")}
    assert names - firing == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown quiet"
    tested = {case["alertname"] for _, case in rule_test_cases()}
    assert tested <= names, f"tests of alerts that do not exist: {sorted(tested - names)}"
    for path, case in rule_test_cases():
        for alert in case.get("exp_alerts") or ():
            assert alert.get("exp_annotations", {}).get("summary"), (path.name, case)


# -- Prometheus Operator ----------------------------------------------------------------------
def test_prometheus_rule_carries_the_groups_of_alerts_yml() -> None:
    rule = k8s("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == load_yaml(ALERTS)["groups"], (
        f"{PROMETHEUS_RULE.relative_to(PROMTOOL_TESTS.parents[2])} differs from "
        f"{ALERTS.name}; regenerate it: PYTHONPATH=tests python -m support.deploy_files "
        "> deploy/k8s/monitoring/prometheusrule.yaml"
    )
